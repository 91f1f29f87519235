"""The systemd unit and the container image: run as crewlet's own user,
hardened, and built from a context without a developer's tree (issue 16).

Read as text (and by ``systemd-analyze verify`` where it is installed): no
systemd or container runtime is needed to run these.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(ROOT, "etc", "crewlet.service")
CONTAINERFILE = os.path.join(ROOT, "etc", "Containerfile")
DOCKERIGNORE = os.path.join(ROOT, ".dockerignore")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def service_section() -> dict[str, list[str]]:
    """The [Service] section's keys, each with its values in order."""
    keys: dict[str, list[str]] = {}
    section = None
    for line in _read(UNIT).splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def test_the_unit_runs_as_crewlet_hardened():
    svc = service_section()
    one = {k: v[-1] for k, v in svc.items()}
    assert (one["User"], one["Group"]) == ("crewlet", "crewlet")
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                       "PrivateTmp": "yes", "UMask": "0077", "StateDirectoryMode": "0700",
                       "LockPersonality": "yes", "RestrictSUIDSGID": "yes", "PrivateDevices": "yes",
                       "CapabilityBoundingSet": "", "AmbientCapabilities": ""}.items():
        assert one.get(key) == value, f"{key}={one.get(key)!r}, want {value!r}"
    # The data dir is writable, and it is the one crewletd is given.
    data_dir = dict(e.split("=", 1) for e in svc["Environment"])["CREWLET_DATA_DIR"]
    assert data_dir in one["ReadWritePaths"].split()
    assert data_dir == "/var/lib/" + one["StateDirectory"]
    # crewletd's own needs: unix sockets between its processes, TCP for the
    # broker and the API; what the unit had before stays.
    families = one["RestrictAddressFamilies"].split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)
    assert (one["Type"], one["RestartPreventExitStatus"], one["KillMode"]) == ("notify", "78", "mixed")
    # How to create the user is said where an operator reads it.
    assert "useradd --system" in _read(UNIT)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_reads_the_unit_without_a_complaint(tmp_path):
    # verify wants ExecStart's binary to exist: any will do.
    text = re.sub(r"^ExecStart=\S+", "ExecStart=/bin/true", _read(UNIT), flags=re.M)
    unit = tmp_path / "crewlet.service"
    unit.write_text(text)
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                         timeout=60)
    said = [line for line in (out.stdout + out.stderr).splitlines() if str(unit) in line]
    assert out.returncode == 0 and not said, out.stdout + out.stderr


def instructions() -> list[tuple[str, str]]:
    """The Containerfile's instructions, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", _read(CONTAINERFILE))
    return [(m.group(1).upper(), m.group(2).strip())
            for m in re.finditer(r"^([A-Za-z]+)\s+(.*)$", joined, re.M)
            if not m.group(0).lstrip().startswith("#")]


def test_the_container_runs_as_a_user_of_its_own():
    steps = instructions()
    names = [name for name, _ in steps]
    users = [arg for name, arg in steps if name == "USER"]
    assert users, "no USER: the container would run as root"
    assert users[-1].split(":")[0] not in ("root", "0")
    # Nothing runs as root after it, and the entrypoint runs as it.
    last_user = len(names) - 1 - names[::-1].index("USER")
    assert "RUN" not in names[last_user:] and "ENTRYPOINT" in names[last_user:]
    args = dict(arg.split("=", 1) for name, arg in steps if name == "ARG" and "=" in arg)
    assert users[-1] == "${CREWLET_UID}:${CREWLET_UID}" and args["CREWLET_UID"] != "0"
    # The data volume exists in the image as that user's, owner-only, so a
    # named volume starts out the same.
    (volume,) = [arg for name, arg in steps if name == "VOLUME"]
    data_dir = volume.strip('[]"')
    runs = " ".join(arg for name, arg in steps if name == "RUN")
    assert "useradd --system" in runs
    assert re.search(rf"install -d -o crewlet -g crewlet -m 0700 {re.escape(data_dir)}\b", runs), runs


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves *path* (relative, with /) out of the context:
    the last pattern matching it or a directory above it decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    out = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        forms = {pattern, pattern[3:]} if pattern.startswith("**/") else {pattern}
        if any(fnmatch.fnmatchcase(p, f) for p in prefixes for f in forms):
            out = not negate
    return out


def test_the_build_context_leaves_a_developers_tree_out():
    patterns = [line.strip() for line in _read(DOCKERIGNORE).splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    for path in (".git/HEAD", ".venv/bin/python", "venv-x/bin/python", "tests/conftest.py",
                 "crewlet/__pycache__/log.cpython-311.pyc", "bench/mailboxes.py",
                 ".pytest_cache/v/cache", "crewlet.egg-info/PKG-INFO", "build/lib/x.py",
                 "roles/.hypothesis/x", "websockets-17.4-cp311-cp311-manylinux1_x86_64.whl"):
        assert ignored(path, patterns), f"{path} would be in the build context"
    # ... and everything the build needs stays in: the package, its metadata, the config.
    needed = ["pyproject.toml", "README.md", "etc/container.yaml"]
    for package in ("crewlet", "supervisor", "roles"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, package)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            needed += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in filenames
                       if not f.endswith((".pyc", ".pyo"))]
    assert any(p.startswith("roles/ingress/dashboard/") for p in needed)
    left_out = [p for p in needed if ignored(p, patterns)]
    assert not left_out, left_out
