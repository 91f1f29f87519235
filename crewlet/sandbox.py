"""The sandbox: every process a seat starts runs confined (DESIGN §14).

A seat's MCP servers and its CLI agent are the least trusted code in a node:
third-party programs steered by whatever text a model read. They run under
**bubblewrap** (``bwrap``, Debian's ``bubblewrap``), which shows them:

* a read-only view of the system (``/usr`` and its ``/bin``, ``/lib``…
  links, the few files of ``/etc`` programs need: :data:`ETC`) and of the
  program's own install — its interpreter and packages (:func:`installs`);
* their seat's own **workspace**, read-write: ``<data_dir>/workspaces/<seat>``,
  mounted at :data:`WORKSPACE` (also the working directory and ``HOME``),
  kept across claims on this node;
* a private ``/tmp``, a fresh ``/dev`` and a ``/proc`` of their own pid
  namespace (no other process is visible, so no ``/proc/<pid>/environ`` of
  anyone else), new ipc and uts namespaces, a new session (no terminal
  injection), and with ``network: none`` an empty network namespace;
* an environment built from nothing but what the caller passes (an MCP
  server's spec ``env``; a CLI agent its own provider's key).

They never see the data dir, the run dir (broker passwords, the API token,
the node's sockets), other seats' workspaces or crewlet's own files: a bind
that would show any of them is refused, and when an install root holds the
data dir the data dir is covered by an empty tmpfs.

**A real unprivileged uid outside too.** A crewletd running as root runs
bwrap as root (it sets up the mounts as root, so it can bind what a 0700
data dir holds) and then drops the tool to a **uid of its seat's own**
before exec (``setpriv``: new uid and gid, no groups, no capabilities in any
set, ``no_new_privs``). A tool that escaped its namespaces is that uid: it
cannot read a 0600 file of crewlet's, ptrace or signal crewlet's processes,
nor another seat's tools. The uid is allocated once per seat and node
(:meth:`Sandbox.workspace`) and owns the workspace; per-seat uids also make
``RLIMIT_NPROC`` count one seat's processes. A crewletd running as a plain
user cannot change uid: its tools run as that user in a user namespace of
their own, and the mount namespace is what hides its files.

**Limits** (memory, processes, open files, CPU seconds) are rlimits set by
``prlimit`` before exec. Memory is ``RLIMIT_DATA`` (heap and private writable
mappings), not the address space: V8 and Go reserve far more address space
than they ever use, and would not start under an address-space limit.

**Modes** (Tier A ``sandbox.mode``): ``auto`` (the default) confines when
bubblewrap works here and otherwise runs tools unconfined and says so at
start, in ``crewletctl status``, ``/readyz``'s detail and the dashboard;
``required`` refuses to start an unconfined tool (the seat's servers fail
with the reason; the seat itself still works with crewlet's own tools);
``off`` is an operator's explicit choice, said the same way. Whether
bubblewrap works is probed once per process (:func:`probe`): a real run of
``true`` under the same wrap a tool gets.

The turn a tool runs for is carried by :data:`SEAT` (a ContextVar the seats
role sets around each turn's work with :func:`turn`, and resets as it ends),
so a provider shared by every seat of the process — a CLI agent — confines
each call as its own seat's and hands it that turn's tool-bridge grant (the
:class:`Seat`'s ``grant``); nothing of a turn is left set after it.

**What an install shows** (:func:`installs`): the program's install root —
``<prefix>`` of ``<prefix>/bin/<name>``, else its own directory — its
interpreter's, a virtual environment's base interpreter and the code its
editable installs point at. Narrower where a root is shared with a person's
other files: a prefix that is a home directory or a direct child of one
(``~/bin``, ``~/.local``, ``~/.cargo``, ``~/go``) shows only its code
directories (:data:`PREFIX_CODE`: ``bin``, ``lib``…; never ``~/.local/share``
or ``~/.cargo/credentials.toml``), unless it is an install of its own (a venv,
a conda environment); a checkout a ``.pth`` line names shows only what Python
imports from it (its packages, modules and metadata; never its ``.git`` or
``.env``). The walk is remembered per program and done again when a file it
read changed (an upgraded tool gets its new install bound), at most
:data:`INSTALLS_KEPT` programs.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import hashlib
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from crewlet import log

MODES = ("auto", "required", "off")
DEFAULT_MODE = "auto"

# Where the workspace appears inside the sandbox (also cwd and HOME there).
WORKSPACE = "/workspace"
# Where the tool bridge's unix socket and a turn's config for it appear inside
# a CLI agent's sandbox (crewlet.agent.bridge); no MCP server's sees either.
BRIDGE_SOCKET = "/run/crewlet/bridge.sock"
BRIDGE_CONFIG = "/run/crewlet/mcp.json"
# The part of <data_dir> that holds the workspaces, and where their uids are claimed.
WORKSPACES_DIR = "workspaces"
_UIDS_DIR = ".uids"
# The PATH a confined tool gets when its spec sets none: the system's (the
# program's own directory is put first).
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# /etc entries a program may need to run (names, certificates, time zone,
# the dynamic linker's cache, Debian's alternatives). Nothing else of /etc:
# an operator's config there is none of a tool's business.
ETC = ("/etc/alternatives", "/etc/ca-certificates", "/etc/ca-certificates.conf",
       "/etc/group", "/etc/host.conf", "/etc/hosts", "/etc/ld.so.cache", "/etc/ld.so.conf",
       "/etc/ld.so.conf.d", "/etc/localtime", "/etc/mime.types", "/etc/nsswitch.conf",
       "/etc/os-release", "/etc/passwd", "/etc/pki/tls/certs", "/etc/protocols", "/etc/resolv.conf",
       "/etc/services", "/etc/ssl/certs", "/etc/timezone", "/etc/gai.conf", "/etc/python3",
       "/etc/python3.11", "/etc/debian_version")
# Not /etc/ssl/private (keys), /etc/npmrc or /etc/gitconfig (tokens, credential helpers).
# Top-level names that are links into /usr on a merged-/usr system (or dirs of their own).
_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What every sandbox shows of the system already.
_SYSTEM = ("/usr", *_ROOT_LINKS)
# Seconds the probe's run of `true` may take before bubblewrap counts as not working.
PROBE_TIMEOUT = 10.0
# How far a program's launcher chain is followed (script -> interpreter -> …).
_INSTALL_DEPTH = 8
# Programs whose install walk is remembered (each checked against the files it read).
INSTALLS_KEPT = 256
# What a prefix shared with a person's other files (a home directory or a
# direct child of one: ~/.local, ~/.cargo) shows: where installs put code.
PREFIX_CODE = ("bin", "sbin", "lib", "lib32", "lib64", "libexec")
# A prefix that is an install of its own whatever its place: shown whole.
_OWN_INSTALL = ("pyvenv.cfg", "conda-meta")
# What of a checkout a .pth line names Python imports: its packages (a
# directory with Python in it), top-level modules and the metadata of what
# was installed from it (entry points, versions).
_IMPORTED = (".py", ".so")
_METADATA = (".egg-info", ".dist-info", ".egg-link")

# The defaults of a policy: generous enough that common MCP servers (Python,
# Node, a binary on PATH) and the sample company run unchanged, tight enough
# that a fork bomb or a runaway allocation ends in the tool, not the node.
DEFAULT_MEMORY = 4 << 30        # bytes of RLIMIT_DATA
DEFAULT_PROCESSES = 256         # RLIMIT_NPROC: the seat's processes (its own uid)
DEFAULT_OPEN_FILES = 1024       # RLIMIT_NOFILE
DEFAULT_CPU_SECONDS = None      # RLIMIT_CPU: none — a server lives as long as its lease

# The uids tools are dropped to (root only): a window of the uids this
# process may use (/proc/self/uid_map), high in it, clear of nobody (65534).
_UID_SPAN_MAX = 1 << 24


class SandboxError(Exception):
    """A tool cannot be started as its policy and the node's mode say: the
    reason is the message (a seat's server fails with it)."""


@dataclass(frozen=True)
class Policy:
    """What one tool process may see and use. The company's ``sandbox:`` of a
    seat, overridden key by key by the ``sandbox:`` of one of its MCP servers
    (:func:`crewlet.company.model.effective_sandbox`)."""

    network: str = "host"                      # host | none (an empty network namespace)
    read_only: tuple[str, ...] = ()            # absolute host paths, shown read-only at the same path
    read_write: tuple[str, ...] = ()           # absolute host paths, shown read-write at the same path
    memory: int | None = DEFAULT_MEMORY        # bytes (RLIMIT_DATA); None: no limit
    processes: int | None = DEFAULT_PROCESSES  # RLIMIT_NPROC
    open_files: int | None = DEFAULT_OPEN_FILES
    cpu_seconds: int | None = DEFAULT_CPU_SECONDS


DEFAULT_POLICY = Policy()


@dataclass(frozen=True)
class Seat:
    """The seat a turn's tools run for: what :data:`SEAT` carries."""

    sandbox: "Sandbox | None"  # None: unwrapped (a node without one: unit tests)
    seat: str
    policy: Policy = DEFAULT_POLICY
    # Extra binds for this turn: (host path, path inside).
    binds: tuple[tuple[str, str], ...] = ()
    # The turn's tool-bridge grant (crewlet.agent.bridge.Grant), for its CLI
    # agent; None when the turn has none.
    grant: Any = None


# The seat whose turn the current task runs (set by the seats role around a
# turn with turn(); read by the CLI provider, which every seat of the process shares).
SEAT: contextvars.ContextVar[Seat | None] = contextvars.ContextVar("crewlet_sandbox_seat", default=None)


@contextlib.contextmanager
def turn(seat: Seat) -> Iterator[Seat]:
    """*seat* is :data:`SEAT` inside the block, and what was before it after:
    a seat's task runs turn after turn, and none may find the last one's
    seat or grant (its token) still set."""
    token = SEAT.set(seat)
    try:
        yield seat
    finally:
        SEAT.reset(token)


@dataclass(frozen=True)
class Launch:
    """A process to start: argv, its whole environment, and the host directory
    it is started in (the workspace; a confined tool's own is --chdir's)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    confined: bool


@dataclass
class Sandbox:
    """This process's sandbox: the node's mode, whether bubblewrap works, and
    how to wrap a tool.

    Invariant: ``state`` is ``confined`` only if a probe ran ``true`` under
    the same wrap tools get; ``refused`` only under mode ``required``.
    """

    data_dir: str
    mode: str = DEFAULT_MODE
    state: str = "unknown"          # confined | unconfined | refused
    reason: str | None = None       # why not confined (None when confined)
    # Host paths no bind may show (the data dir; the broker's and the fleet's
    # credential files, wherever they are).
    hidden: tuple[str, ...] = ()
    root: bool = field(default_factory=lambda: os.geteuid() == 0)
    bwrap: str | None = None
    _uids: tuple[int, int] | None = None  # (first uid, span) tools are dropped to

    # ------------------------------------------------------------ making one

    @classmethod
    def of(cls, config: Any) -> "Sandbox":
        """The sandbox of a node config (its ``sandbox.mode`` and data dir),
        probed: a seats process makes one at start; crewletd one for its
        status."""
        box = cls(data_dir=config.data_dir, mode=config.sandbox.mode, hidden=hidden_of(config))
        box.probe()
        return box

    def probe(self) -> None:
        """Find out whether tools can be confined here, and set ``state``."""
        if self.mode == "off":
            self.state, self.reason = "unconfined", "sandbox.mode is off: the operator's choice"
            return
        why = self._why_not()
        if why is None:
            self.state, self.reason = "confined", None
        else:
            self.state = "refused" if self.mode == "required" else "unconfined"
            self.reason = why

    def _why_not(self) -> str | None:
        self.bwrap = shutil.which("bwrap")
        if self.bwrap is None:
            return "bubblewrap is not installed (bwrap not on PATH): install Debian's bubblewrap package"
        if self.root and (shutil.which("setpriv") is None or shutil.which("prlimit") is None):
            return "setpriv and prlimit (util-linux) are needed to drop a tool's uid and set its limits"
        try:
            true = shutil.which("true") or "/bin/true"
            argv = self._argv([true], workspace=None, policy=Policy(network="none"), uid=self._probe_uid(),
                              binds=(), installs_of=[])
            done = subprocess.run(argv, env={"PATH": SANDBOX_PATH}, stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=PROBE_TIMEOUT)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"bubblewrap could not be run: {type(exc).__name__}: {exc}"
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip()[-300:]
            return f"bubblewrap does not work here (exit {done.returncode}: {said or 'no message'})"
        return None

    def describe(self) -> dict[str, Any]:
        """What status surfaces show: mode, state, the reason, and the fix."""
        return {"mode": self.mode, "state": self.state, "confined": self.state == "confined",
                "reason": self.reason}

    # ------------------------------------------------------------ workspaces

    def workspace(self, seat: str) -> tuple[str, int | None]:
        """The seat's workspace on this node (made if missing) and the uid its
        tools run as (None: this process's own, when not root)."""
        base = os.path.join(self.data_dir, WORKSPACES_DIR)
        path = os.path.join(base, seat)
        if not self.root:
            os.makedirs(path, mode=0o700, exist_ok=True)
            return path, None
        os.makedirs(os.path.join(base, _UIDS_DIR), mode=0o700, exist_ok=True)
        os.chmod(base, 0o711)  # traversable by the seats' uids, listable by none
        uid = self._claim_uid(base, seat)
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        if (st.st_uid, st.st_gid) != (uid, uid):
            _chown_tree(path, uid)
        return path, uid

    def _claim_uid(self, base: str, seat: str) -> int:
        """The seat's uid, claimed once per node: a link ``.uids/<uid> -> <seat>``
        made with symlink(2), which fails if another seat has that uid."""
        first, span = self._uid_window()
        start = int.from_bytes(hashlib.sha256(seat.encode()).digest()[:8], "big") % span
        for step in range(span):
            uid = first + (start + step) % span
            link = os.path.join(base, _UIDS_DIR, str(uid))
            try:
                os.symlink(seat, link)
                return uid
            except FileExistsError:
                if os.readlink(link) == seat:
                    return uid
        raise SandboxError("no uid left for a seat's tools")

    def _uid_window(self) -> tuple[int, int]:
        if self._uids is None:
            self._uids = uid_window()
        return self._uids

    def _probe_uid(self) -> int | None:
        if not self.root:
            return None
        first, span = self._uid_window()
        return first + span - 1  # never a seat's (their links are claimed from the start)

    # ------------------------------------------------------------ wrapping

    def wrap(self, argv: Sequence[str], env: Mapping[str, str], seat: str, policy: Policy = DEFAULT_POLICY,
             binds: Sequence[tuple[str, str]] = (), place: tuple[str, int | None] | None = None) -> Launch:
        """How to start *argv* for *seat* under *policy*, with exactly *env*
        (plus HOME, PATH, TMPDIR where it sets none). *place* is the seat's
        :meth:`workspace` when the caller has it already (else it is made
        here). SandboxError when it must not start (mode required and no
        sandbox; a path the policy names is not allowed)."""
        if self.state == "refused":
            raise SandboxError(f"sandbox.mode is required and tools cannot be confined: {self.reason}")
        workspace, uid = place if place is not None else self.workspace(seat)
        env = dict(env)
        if self.state != "confined":
            program = _which(argv[0], env.get("PATH") or os.environ.get("PATH", SANDBOX_PATH))
            env.setdefault("HOME", workspace)
            env.setdefault("PATH", os.environ.get("PATH", SANDBOX_PATH))
            return Launch([program, *argv[1:]], env, workspace, confined=False)
        search = env.get("PATH") or os.pathsep.join(filter(None, [os.environ.get("PATH"), SANDBOX_PATH]))
        program = _which(argv[0], search)
        for path in (*policy.read_only, *policy.read_write):
            self._check_bind(path)
        env.setdefault("PATH", os.pathsep.join(dict.fromkeys([os.path.dirname(program), *SANDBOX_PATH.split(":")])))
        env.setdefault("HOME", WORKSPACE)
        env.setdefault("TMPDIR", "/tmp")
        for key in ("USER", "LOGNAME"):
            env[key] = "tool"
        full = self._argv([program, *argv[1:]], workspace=workspace, policy=policy, uid=uid,
                          binds=tuple(binds), installs_of=[program], shown=_named_paths(argv[1:]))
        return Launch(full, env, workspace, confined=True)  # cwd of bwrap; --chdir is the tool's

    def grants_dir(self) -> str:
        """Where a turn's tool-bridge config is written: the run dir, never
        the workspace (the seat's MCP servers share that, and must not hold
        the agent's token); bound read-only into the agent's sandbox alone."""
        folder = os.path.join(self.data_dir, "run", "grants")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        return folder

    def _check_bind(self, path: str) -> None:
        if not os.path.isabs(path):
            raise SandboxError(f"sandbox path {path!r} is not absolute")
        real = os.path.realpath(path)
        for hidden in self.hidden:
            if _within(real, hidden) or _within(hidden, real):
                raise SandboxError(f"sandbox path {path!r} would show {hidden}, which a tool must never see")

    def _argv(self, command: list[str], *, workspace: str | None, policy: Policy, uid: int | None,
              binds: tuple[tuple[str, str], ...], installs_of: list[str],
              shown: Sequence[str] = ()) -> list[str]:
        args = [self.bwrap or "bwrap", "--die-with-parent", "--new-session",
                "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not self.root:
            args += ["--unshare-user", "--cap-drop", "ALL"]
        if policy.network == "none":
            args.append("--unshare-net")
        args += ["--ro-bind", "/usr", "/usr"]
        for top in _ROOT_LINKS:
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        for path in ETC:
            args += ["--ro-bind-try", path, path]
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--tmpfs", "/run"]
        # Compared resolved: a hidden path is its target (hidden_of), so is a root.
        roots = [r for r in _outermost([*installs(installs_of), *shown])
                 if not _within(r, "/usr") and not any(_within(os.path.realpath(r), h) for h in self.hidden)]
        shown = [*roots, *policy.read_only, *policy.read_write]
        # The directories above a bind are made by bwrap, 0700 unless told:
        # traversable, so the tool's uid reaches what is bound below them.
        for parent in _parents([*shown, *(inside for _, inside in binds)]):
            args += ["--perms", "0755", "--dir", parent]
        for root in roots:
            args += ["--ro-bind", root, root]
        for path in policy.read_only:
            args += ["--ro-bind", path, path]
        for path in policy.read_write:
            args += ["--bind", path, path]
        # An install that holds crewlet's data (a data dir inside a checkout):
        # cover it where it shows inside — under the root as bound, which is
        # not where it is on the host when the root's path has a link in it.
        for hidden in self.hidden:
            for inside in _covers(hidden, shown):
                if os.path.isdir(hidden):
                    args += ["--tmpfs", inside]
                elif os.path.exists(hidden):
                    args += ["--ro-bind", "/dev/null", inside]
        for host, inside in binds:
            args += ["--ro-bind", host, inside]  # a socket connects through a read-only mount
        if workspace is not None:
            args += ["--bind", workspace, WORKSPACE, "--chdir", WORKSPACE]
        args.append("--")
        limits = _limits(policy)
        if limits:
            args += [shutil.which("prlimit") or "/usr/bin/prlimit", *limits, "--"]
        if self.root and uid is not None:
            args += [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}",
                     "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        return args + command


# ------------------------------------------------------------------ helpers

def hidden_of(config: Any) -> tuple[str, ...]:
    """What no tool may see, resolved (a symlinked data dir is its target):
    the data dir (the run dir in it), the config file, and every secret file
    the config names — wherever each is."""
    stream, tls = config.stream, getattr(config.stream, "tls", None)
    paths = [config.data_dir, getattr(config, "source", None), stream.credentials, stream.fleet_credentials,
             getattr(tls, "key", None), config.smtp.password_file, config.files.secret_key_file,
             config.ingress.tokens_file]
    return tuple(dict.fromkeys(os.path.realpath(p) for p in paths if p and not p.startswith("<")))


def uid_window() -> tuple[int, int]:
    """(first uid, span) for seats' tools: high in the largest extent this
    process's user namespace maps (a container may map only 65,536), below
    its top two (nobody and the overflow uid)."""
    best = (0, 65536)
    try:
        with open("/proc/self/uid_map", encoding="ascii") as f:
            for line in f:
                inside, _outside, length = (int(x) for x in line.split())
                if length > best[1]:
                    best = (inside, length)
    except (OSError, ValueError):
        pass
    first, length = best
    span = min(_UID_SPAN_MAX, length // 2)
    return first + length - span - 2, span


def _limits(policy: Policy) -> list[str]:
    out = []
    for flag, value in (("--data", policy.memory), ("--nproc", policy.processes),
                        ("--nofile", policy.open_files), ("--cpu", policy.cpu_seconds)):
        if value is not None:
            out.append(f"{flag}={value}:{value}")
    return out


def _which(program: str, path: str) -> str:
    found = shutil.which(program, path=path) if os.sep not in program else program
    if found is None or not os.access(found, os.X_OK):
        # Not a refusal: it may be installed yet (a server's start is retried).
        raise FileNotFoundError(f"{program}: not found on PATH ({path})")
    return os.path.abspath(found)


def _parents(paths: Sequence[str]) -> list[str]:
    """The directories above *paths* that no system bind provides, outermost first."""
    found: list[str] = []
    for path in paths:
        parent = os.path.dirname(os.path.normpath(path))
        chain = []
        while parent not in ("/", ""):
            chain.append(parent)
            parent = os.path.dirname(parent)
        for p in reversed(chain):
            if p not in found and p not in ("/tmp", "/run") and not any(_within(p, t) for t in _SYSTEM) \
                    and p not in paths:
                found.append(p)
    # Never one that is itself inside another bound path: it exists there already.
    return [p for p in found if not any(_within(p, q) and p != q for q in paths)]


def _covers(hidden: str, shown: Sequence[str]) -> list[str]:
    """Where *hidden* (resolved) shows inside a sandbox that binds each of
    *shown* at its own path: once under each that holds it."""
    found = []
    for root in shown:
        real = os.path.realpath(root)
        if _within(hidden, real):
            inside = os.path.normpath(os.path.join(root, os.path.relpath(hidden, real)))
            if inside not in found:
                found.append(inside)
    return found


def _within(path: str, root: str) -> bool:
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _chown_tree(path: str, uid: int) -> None:
    os.chown(path, uid, uid)
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                os.chown(os.path.join(top, name), uid, uid, follow_symlinks=False)
            except OSError:
                pass


# The install walks remembered: programs -> (what each file read looked
# like then, the roots found). Walks run in threads (wrap is called off the loop).
_walked: "collections.OrderedDict[tuple[str, ...], tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]]" = \
    collections.OrderedDict()
_walked_lock = threading.Lock()


def installs(programs: Sequence[str]) -> list[str]:
    """:func:`_installs`, remembered per program list while every file and
    directory the walk read is as it was then (an upgraded tool, a venv
    given another package, is walked again); the :data:`INSTALLS_KEPT` most
    recent are kept. Every claim of a seat wraps its servers, and the walk
    reads a venv's site-packages; a look costs a stat per file it read."""
    key = tuple(programs)
    with _walked_lock:
        hit = _walked.get(key)
        if hit is not None:
            _walked.move_to_end(key)
    if hit is not None and all(_signature(path) == was for path, was in hit[0]):
        return list(hit[1])
    read: list[tuple[str, Any]] = []
    roots = _installs(key, read)
    looks: dict[str, Any] = {}
    for path, was in read:
        looks.setdefault(path, was)  # as it was before it was first read
    with _walked_lock:
        _walked[key] = (tuple(looks.items()), tuple(roots))
        _walked.move_to_end(key)
        while len(_walked) > INSTALLS_KEPT:
            _walked.popitem(last=False)
    return roots


def _signature(path: str) -> Any:
    """What a changed file or directory would not share with its old self
    (None: not there). A directory's mtime moves when an entry is added,
    removed or renamed in it; a file replaced is another inode."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode


def _note(read: list[tuple[str, Any]], path: str) -> str:
    """Note *path* as read by the walk, before it is read: a change after
    this look makes the next look differ, so the walk is done again."""
    read.append((path, _signature(path)))
    return path


def _installs(programs: Sequence[str], read: list[tuple[str, Any]] | None = None) -> list[str]:
    """The paths a program needs to run, read-only: its install root
    (``<prefix>`` of ``<prefix>/bin/<name>``, else its own directory), its
    interpreter's (a script's shebang, ``env NAME`` resolved on the PATH), a
    virtual environment's base interpreter (``pyvenv.cfg``'s home), and the
    code of editable installs in it. Each link of a symlink chain counts (a
    venv's ``python`` links to the base install). A root shared with a
    person's other files shows only its code (:func:`_shown_of`); every file
    and directory looked at is noted in *read*."""
    read = [] if read is None else read
    roots: list[str] = []
    walked: set[str] = set()
    todo = [(p, 0) for p in programs]
    seen: set[str] = set()
    while todo:
        path, depth = todo.pop()
        if depth > _INSTALL_DEPTH or path in seen:
            continue
        seen.add(path)
        for hop in _link_chain(path, read):
            root = _root_of(hop)
            if root in walked or any(_within(root, system) for system in _SYSTEM):
                continue  # shown already, read-only: /usr and its links
            walked.add(root)
            roots += [r for r in [*_shown_of(root, hop, read), *_venv_extras(root, read)] if r not in roots]
        real = os.path.realpath(path)
        interpreter = _shebang(_note(read, real))
        if interpreter:
            todo.append((interpreter, depth + 1))
    return _outermost(roots)


def _shown_of(root: str, hop: str, read: list[tuple[str, Any]]) -> list[str]:
    """What of *root*, the install root of the program at *hop*, is shown.

    All of it, unless it is shared with a person's other files
    (:func:`_shared`): then a prefix (``~/.local`` of ``~/.local/bin/x``)
    shows its code directories (:data:`PREFIX_CODE`) — all of it still when
    it is an install of its own (a venv, a conda environment) — and a
    program's own directory (``~/x``, ``/opt/x``) shows the program alone."""
    if not _shared(root) or any(os.path.exists(_note(read, os.path.join(root, f))) for f in _OWN_INSTALL):
        return [root]
    if root != os.path.dirname(hop):  # a prefix: the program is in its bin
        return [d for d in (os.path.join(root, name) for name in PREFIX_CODE) if os.path.isdir(_note(read, d))]
    return [hop]


def _homes() -> set[str]:
    """Where people's files are: this process's home, root's, and every
    directory of /home. (Not the password database's every entry: a
    directory service may list thousands, and a service user's home is
    no person's.)"""
    homes = {os.path.expanduser("~"), "/root"}
    try:
        homes.update(e.path for e in os.scandir("/home") if e.is_dir())
    except OSError:
        pass
    return {os.path.normpath(h) for h in homes if h and os.path.isabs(h)}


def _shared(path: str) -> bool:
    """Is *path* a directory shared with files that are none of a tool's
    business: ``/`` or a top-level directory (``/opt``, ``/tmp``), a home
    directory, or a direct child of one (``~/.local``, ``~/.cargo``, ``~/src``)?"""
    path = os.path.normpath(path)
    if path.count(os.sep) <= 1:
        return True
    homes = _homes()
    return path in homes or os.path.dirname(path) in homes


def _outermost(paths: Sequence[str]) -> list[str]:
    """*paths* without those inside another of them."""
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not any(_within(path, k) for k in kept):
            kept.append(path)
    return kept


def _named_paths(args: Sequence[str]) -> list[str]:
    """What a tool's arguments name on the host, to be shown read-only: an
    absolute path that exists (``--opt=/path`` too) — its directory when it
    is a file, so ``python /srv/tools/server.py`` finds the modules beside
    its script; the file alone when that directory is shared with others'
    files (``/opt``, a home directory: :func:`_shared`). Never anything of
    ``/etc``, nor a shared directory whole. Never the data dir (the caller
    hides it)."""
    found = []
    for arg in args:
        value = arg.partition("=")[2] if arg.startswith("-") and "=" in arg else arg
        if os.path.isabs(value) and os.path.exists(value):
            real = os.path.realpath(value)
            shown = real if os.path.isdir(real) else os.path.dirname(real)
            # An operator's config and secrets live in /etc: name such paths in read_only.
            if _within(real, "/etc"):
                continue
            if not _shared(shown):
                found.append(shown)
            elif shown != real:
                found.append(real)
    return found


def _link_chain(path: str, read: list[tuple[str, Any]] | None = None) -> list[str]:
    chain = [os.path.abspath(path)]
    for _ in range(_INSTALL_DEPTH):
        try:
            target = os.readlink(chain[-1] if read is None else _note(read, chain[-1]))
        except OSError:
            break
        chain.append(os.path.normpath(os.path.join(os.path.dirname(chain[-1]), target)))
    return chain


def _root_of(path: str) -> str:
    parent = os.path.dirname(path)
    if os.path.basename(parent) in ("bin", "sbin") and os.path.dirname(parent) != "/":
        return os.path.dirname(parent)
    return parent


def _venv_extras(root: str, read: list[tuple[str, Any]]) -> list[str]:
    """A venv's base interpreter install and the code its editable installs
    point at (a checkout a .pth line names: what Python imports of it)."""
    cfg = os.path.join(root, "pyvenv.cfg")
    if not os.path.isfile(cfg):
        return []
    extras: list[str] = []
    try:
        with open(_note(read, cfg), encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    python = os.path.join(value.strip(), "python")
                    base = _root_of(python)
                    if not any(_within(base, system) for system in _SYSTEM):
                        extras += _shown_of(base, python, read)
    except OSError:
        pass
    lib = os.path.join(root, "lib")
    for site in _site_dirs(_note(read, lib)):
        for name in os.listdir(_note(read, site)):
            full = os.path.join(site, name)
            if name.endswith(".pth"):
                for checkout in _pth_dirs(_note(read, full)):
                    extras += _imported(checkout, read)
            elif name.startswith("__editable__") and name.endswith("_finder.py"):
                extras += _finder_dirs(_note(read, full))
    return [e for e in dict.fromkeys(extras) if os.path.exists(e)]


def _site_dirs(lib: str) -> list[str]:
    try:
        return [os.path.join(lib, d, "site-packages") for d in os.listdir(lib)
                if d.startswith("python") and os.path.isdir(os.path.join(lib, d, "site-packages"))]
    except OSError:
        return []


def _pth_dirs(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return [ln.strip() for ln in f if ln.strip().startswith("/") and not ln.startswith("import")]
    except OSError:
        return []


def _imported(folder: str, read: list[tuple[str, Any]]) -> list[str]:
    """What Python imports from *folder*, a directory on ``sys.path`` (a
    checkout a ``.pth`` line names): its packages (a directory with Python
    in it, or with packages in it: a namespace), its top-level modules and
    installed metadata — not the checkout around them (its ``.git``, an
    ``.env``, whatever else lies there)."""
    try:
        entries = list(os.scandir(_note(read, folder)))
    except OSError:
        return []
    found = []
    for entry in entries:
        if entry.name.startswith(".") or entry.name == "__pycache__":
            continue
        if entry.name.endswith(_METADATA) or (entry.is_file() and entry.name.endswith(_IMPORTED)):
            found.append(entry.path)
        elif entry.is_dir() and _python_in(_note(read, entry.path), read):
            found.append(entry.path)
    return found


def _python_in(folder: str, read: list[tuple[str, Any]], depth: int = 1) -> bool:
    """Does *folder* hold Python modules (or, *depth* levels down, packages)?"""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    if any(e.name.endswith(_IMPORTED) and e.is_file() for e in entries):
        return True
    return depth > 0 and any(e.is_dir() and not e.name.startswith(".") and
                             _python_in(_note(read, e.path), read, depth - 1) for e in entries)


def _finder_dirs(path: str) -> list[str]:
    """The package directories an editable install's finder maps to: the
    ``MAPPING`` literal setuptools writes (the packages alone, not the
    checkout around them)."""
    import ast

    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError):
        return []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
        if any(getattr(t, "id", None) == "MAPPING" for t in targets):
            try:
                mapping = ast.literal_eval(node.value)
            except ValueError:
                return []
            return [p for p in mapping.values() if isinstance(p, str)]
    return []


def _shebang(path: str) -> str | None:
    """A script's interpreter (``env X`` looked up on the PATH), or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        rest = [w for w in words[1:] if not w.startswith("-")]
        return shutil.which(rest[0]) if rest else None
    return words[0]


def log_state(box: Sandbox, role: str) -> None:
    """Say at start how tools will run: info when confined, a warning naming
    the fix when not."""
    if box.state == "confined":
        log.event("sandbox_confined", role=role, mode=box.mode, uid_per_seat=box.root)
    else:
        log.event("sandbox_unconfined" if box.state == "unconfined" else "sandbox_refused", "warning",
                  role=role, mode=box.mode, reason=box.reason)
