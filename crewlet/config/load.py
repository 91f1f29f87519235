"""Reading a Tier A node config file: YAML, environment expansion, errors.

Which file
    ``load_node_config(path)`` reads ``path``; with ``None`` it reads
    ``$CREWLET_CONFIG`` if set, else the first of ``DEFAULT_CONFIG_PATHS``
    that exists, else uses the all-defaults config (``source == "<defaults>"``).
    A path that was asked for explicitly (argument or ``$CREWLET_CONFIG``)
    and does not exist is an error, never a silent fall-back to defaults.
    An empty file is the all-defaults config.

Expansion
    In every string scalar (values only, never keys), after YAML parsing:
    ``${VAR}`` is the environment variable (unset is an error naming the key
    and the variable; set-but-empty gives ""), ``${VAR:-default}`` is
    ``default`` when VAR is unset or empty, ``$$`` is a literal ``$``. Any
    other ``$`` is kept as is; a malformed ``${`` is an error. A string that
    is the whole value of a typed field is then coerced by pydantic, so
    ``max_concurrent: "${N:-32}"`` is the int 32.

node.id
    An absent ``node.id`` means ``${CREWLET_NODE_ID}``. When that variable is
    unset or empty the id falls back to the model default and a warning is
    added to ``NodeConfig.warnings``: every node of a fleet needs its own id.

YAML that costs more than it says
    A file over ``YAML_MAX_BYTES`` is refused unread. Anchors and aliases
    (``&base`` / ``*base``, ``<<: *base``) are allowed, since they are
    ordinary YAML and ``yaml.safe_dump`` writes them for shared objects; but
    the document is measured as a tree *with every alias expanded* before
    anything is built from it, and refused when aliases add more than
    ``ALIAS_NODES_MAX`` nodes (a "billion laughs" bomb of a few hundred
    bytes expands to millions: expansion, ``${VAR}`` and validation walk
    the tree, not the graph) or when an alias is inside its own anchor (a
    recursive document). Nesting deeper than ``NESTING_MAX`` (64) levels is
    refused too.

Errors
    Every config problem raises :class:`ConfigError`, whose ``str`` is one
    line, ``<file>: <key>: <problem>``, fit for a log or a terminal; a
    daemon exits with ``ConfigError.EXIT_CODE`` (78, EX_CONFIG).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import yaml
from pydantic import ValidationError

from .model import NodeConfig, NodeSection

CONFIG_ENV = "CREWLET_CONFIG"
DEFAULT_CONFIG_PATHS: tuple[str, ...] = ("/etc/crewlet/crewlet.yaml",)
NODE_ID_ENV = "CREWLET_NODE_ID"
RUNNER_CONCURRENCY_ENV = "SESSION_RUNNER_CONCURRENCY"
_NODE_ID_REF = "${" + NODE_ID_ENV + "}"


class ConfigError(Exception):
    """A config problem: ``file`` (a path, "<defaults>" or "<env>"), ``key``
    (dotted, e.g. ``node.roles[1]``; None for whole-file problems) and
    ``problem`` (one line)."""

    EXIT_CODE = 78  # EX_CONFIG in sysexits.h

    def __init__(self, file: str, key: str | None, problem: str):
        problem = " ".join(str(problem).split())  # one line, whatever the source text was
        super().__init__(file, key, problem)
        self.file, self.key, self.problem = file, key, problem

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.problem}" if self.key else f"{self.file}: {self.problem}"


# $$ | ${NAME} | ${NAME:-default} | any other "${" (malformed)
_REF = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}|(\{))")


def expand_env(value: str, env: Mapping[str, str], key: str, *, file: str = "<env>") -> str:
    """Expand ``${VAR}``, ``${VAR:-default}`` and ``$$`` in ``value``; ``key``
    and ``file`` only label the ConfigError raised for an unset variable."""

    def one(m: re.Match) -> str:
        dollar, name, has_default, default, malformed = m.groups()
        if dollar:
            return "$"
        if malformed:
            raise ConfigError(file, key, f"malformed variable reference in {value!r}: "
                              "write ${NAME}, ${NAME:-default}, or $$ for a literal $")
        got = env.get(name)
        if has_default:
            return got or default
        if got is None:
            raise ConfigError(file, key, f"environment variable {name} is not set "
                              f"(write ${{{name}:-default}} to give a default)")
        return got

    return _REF.sub(one, value)


def dotted(loc: tuple) -> str:
    """('node', 'roles', 1) -> 'node.roles[1]'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "[key]":  # pydantic's marker for "the dict key itself"
            out += f".{part}" if out else str(part)
    return out


def expand_tree(obj: object, env: Mapping[str, str], loc: tuple, file: str) -> object:
    """``expand_env`` over every string scalar of *obj* (keys untouched)."""
    if isinstance(obj, str):
        return expand_env(obj, env, dotted(loc), file=file)
    if isinstance(obj, dict):
        return {k: expand_tree(v, env, (*loc, k), file) for k, v in obj.items()}
    if isinstance(obj, list):
        return [expand_tree(v, env, (*loc, i), file) for i, v in enumerate(obj)]
    return obj


# Bytes of a Tier A config file (a node's: a few KB). A company file has its
# own limit (crewlet.company.load.FILE_MAX, from the company's REVISION_MAX).
YAML_MAX_BYTES = 2 * 1024 * 1024
# Nodes aliases may add to a document, every alias expanded: generous for shared
# providers, personas and placements (10,000 seats each aliasing a 10-node mapping),
# and walked, expanded and validated in well under a second.
ALIAS_NODES_MAX = 100_000
# Levels of nesting: a config is a handful deep. PyYAML composes recursively and its
# scanner's look-ahead is quadratic in the depth of a flow nest ("[[[[..."): ~1 s at
# a few hundred levels, ~1 ms at this.
NESTING_MAX = 64


class _Checks:
    """What both loaders below add to YAML: duplicate keys are refused
    (plain YAML silently resolves them to the last one, hiding an edit that
    seems to have no effect), and so is nesting deeper than ``nesting``
    (NESTING_MAX here; a subclass may bound it tighter)."""

    _depth = 0
    nesting = NESTING_MAX

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > self.nesting:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {self.nesting} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` may legitimately be overridden
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
                seen.add(key)
            except TypeError:
                continue  # unhashable key: the base class reports it
            if dup:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep)


class StrictLoader(_Checks, yaml.SafeLoader):
    """SafeLoader with the checks, in pure Python: nesting is also refused in
    flow style as the scanner meets it. Public: a SKILL.md's front matter is
    read with it too (crewlet.skills.format), deeper nesting refused there."""

    def fetch_flow_collection_start(self, TokenClass):
        if self.flow_level >= self.nesting:
            raise yaml.scanner.ScannerError(None, None, f"nested deeper than {self.nesting} levels",
                                            self.get_mark())
        super().fetch_flow_collection_start(TokenClass)


if getattr(yaml, "__with_libyaml__", False):
    class _FastLoader(_Checks, yaml.composer.Composer, yaml.cyaml.CParser, yaml.constructor.SafeConstructor,
                      yaml.resolver.Resolver):
        """The same document as :class:`StrictLoader`, scanned and parsed by libyaml
        (C) while composed — so nesting and aliases are checked and measured
        alike — and built in Python: ~10x faster than the pure-Python scanner,
        which a company of 10,000 seats (~25 MB) needs."""

        def __init__(self, stream):
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
else:  # PyYAML built without libyaml: the pure-Python loader does it all
    _FastLoader = None


def _too_big(limit: int, what: str = "a config file") -> str:
    """The refusal of a file over *limit*: the limit, and whose it is (Tier A's
    ``YAML_MAX_BYTES``, 2 MiB; a company file's own, crewlet.company.load.FILE_MAX)."""
    name = "YAML_MAX_BYTES" if limit == YAML_MAX_BYTES else "FILE_MAX, twice a company revision's REVISION_MAX"
    return f"too big: over the limit of {limit} bytes ({limit / 2**20:g} MiB: {name}) {what} may have"


def read_text(path: str, what: str = "a config file", limit: int = YAML_MAX_BYTES) -> str:
    """The UTF-8 text of the file at *path*, at most *limit* bytes
    (``YAML_MAX_BYTES``; a company file's is its own); ConfigError naming
    *path* otherwise. Shared by every config tier."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)  # never more than one byte past the limit
    except FileNotFoundError:
        raise ConfigError(path, None, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(path, None, f"is a directory, not {what}") from None
    except OSError as e:
        raise ConfigError(path, None, f"cannot read: {e.strerror or e}") from None
    if len(raw) > limit:
        raise ConfigError(path, None, _too_big(limit, what))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(path, None, f"not UTF-8 text: {e.reason} at byte {e.start}") from None


def _read_yaml(path: str) -> object:
    return parse_yaml(read_text(path), path)


def _at(node: yaml.Node) -> str:
    mark = node.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _measure(root: yaml.Node, source: str) -> None:
    """Refuse *root* if aliases expand it by more than ALIAS_NODES_MAX nodes or
    make it recursive. The composer gives an alias the very node object of its
    anchor, so a node met twice is an alias use: each node's expanded size is
    computed once (memoised), which keeps this linear in the file however big
    the expansion, and a node met again while still being measured is a cycle."""
    sizes: dict[int, int] = {}
    measuring: set[int] = set()
    added = 0

    def size(node: yaml.Node, key: str) -> int:
        nonlocal added
        known = sizes.get(id(node))
        if known is not None:
            added += known
            if added > ALIAS_NODES_MAX:
                raise ConfigError(source, key or None, f"aliases expand the document by more than "
                                  f"{ALIAS_NODES_MAX} nodes (an alias bomb?): this one repeats the anchor "
                                  f"at {_at(node)}")
            return known
        if id(node) in measuring:
            raise ConfigError(source, key or None, f"recursive alias: the anchor at {_at(node)} "
                              "contains an alias of itself")
        measuring.add(id(node))
        total = 1
        if isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                total += size(child, f"{key}[{i}]")
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                name = k.value if isinstance(k, yaml.ScalarNode) else "?"
                total += size(k, key) + size(v, f"{key}.{name}" if key else str(name))
        measuring.discard(id(node))
        sizes[id(node)] = total
        return total

    size(root, "")


def parse_yaml(text: str, source: str, limit: int = YAML_MAX_BYTES) -> object:
    """YAML *text* as data; duplicate keys and syntax errors are ConfigErrors
    naming *source*, the line and the column; so are a text over *limit*
    bytes (``YAML_MAX_BYTES``) and aliases past ``ALIAS_NODES_MAX`` (see
    above). Shared by every config tier.

    Parsed by libyaml when PyYAML has it (:class:`_FastLoader`). A document
    it refuses is parsed again by the pure-Python loader, whose words the
    error then has whichever parser found the problem — unless it is over
    ``YAML_MAX_BYTES`` (a big company), which that would take ~1 s a MB to
    parse again: libyaml's words are given."""
    if len(text) > limit:  # characters: at least as many bytes
        raise ConfigError(source, None, _too_big(limit, "a config file" if limit == YAML_MAX_BYTES
                                                 else "a company file"))
    # A character PyYAML's reader refuses (libyaml's may not): its words, as before.
    if _FastLoader is not None and not yaml.reader.Reader.NON_PRINTABLE.search(text):
        try:
            return _parse(_FastLoader, text, source)
        except ConfigError:
            if len(text) > YAML_MAX_BYTES:
                raise
            # said again below, in the pure-Python parser's words
    return _parse(StrictLoader, text, source)


def _parse(kind, text: str, source: str) -> object:
    loader = kind(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _measure(root, source)
        return loader.construct_document(root)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(source, None, f"invalid YAML{where}: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(source, None, f"invalid YAML: {e}") from None
    except RecursionError:  # not reached within NESTING_MAX; kept as the last guard
        raise ConfigError(source, None, "invalid YAML: nested too deeply") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise ConfigError(source, None, f"invalid YAML: {str(e).partition(';')[0]}") from None
    finally:
        loader.dispose()


def _show(value: object) -> str:
    """A value the way the operator wrote it in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _problem(err: dict) -> str:
    """One pydantic error as a phrase that follows ``<key>: ``."""
    kind, ctx, got = err["type"], err.get("ctx") or {}, f", got {_show(err.get('input'))}"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    if kind == "literal_error":
        return "must be one of " + ", ".join(re.findall(r"'([^']*)'", ctx["expected"])) + got
    if kind in ("too_short", "string_too_short"):
        return "must not be empty" if ctx.get("min_length") == 1 else f"must have at least {ctx.get('min_length')} items"
    if kind == "finite_number":
        return f"must be a finite number{got}"
    for op, sym in (("greater_than_equal", ">="), ("greater_than", ">"), ("less_than_equal", "<="), ("less_than", "<")):
        if kind == op:
            bound = next(iter(ctx.values()))
            if isinstance(bound, float) and bound.is_integer():
                bound = int(bound)  # 86400, not 86400.0
            return f"must be {sym} {bound}{got}"
    for prefix, want in (("int", "an integer"), ("float", "a number"), ("bool", "true or false"),
                         ("string", "a string"), ("list", "a list"), ("dict", "a mapping"), ("model", "a mapping")):
        if kind.startswith(prefix + "_") and kind.endswith(("_type", "_parsing", "_from_float")):
            return f"expected {want}{got}"
    return err["msg"][:1].lower() + err["msg"][1:] + got


def _from_validation(e: ValidationError, file: str) -> ConfigError:
    errors = e.errors(include_url=False)
    first = errors[0]
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return ConfigError(file, dotted(first["loc"]) or None, _problem(first) + more)


def _default_node_id(data: dict, env: Mapping[str, str], warnings: list[str]) -> None:
    """Absent node.id means ${CREWLET_NODE_ID}; unset, it means the model default, with a warning."""
    node = data.setdefault("node", {})
    if not isinstance(node, dict) or node.get("id", _NODE_ID_REF) != _NODE_ID_REF:
        return  # not a mapping (pydantic will say so) or an explicit id
    if env.get(NODE_ID_ENV):  # empty counts as unset: "" is never a valid id
        node["id"] = _NODE_ID_REF
        return
    node.pop("id", None)
    fallback = NodeSection.model_fields["id"].default
    warnings.append(f"node.id is unset; using {fallback} — set {NODE_ID_ENV} or node.id to a distinct, stable id per node")


def _runner_concurrency_from_env(data: dict, env: Mapping[str, str]) -> None:
    """${SESSION_RUNNER_CONCURRENCY}, when set (not empty), is
    sessions.runner_concurrency whatever the file says (the issue's name for
    it; a container sets it without a file). Checked as the key is: a bad
    value is refused naming sessions.runner_concurrency."""
    if env.get(RUNNER_CONCURRENCY_ENV):
        sessions = data.setdefault("sessions", {})
        if isinstance(sessions, dict):
            sessions["runner_concurrency"] = "${%s}" % RUNNER_CONCURRENCY_ENV


def _find(path: str | os.PathLike | None, env: Mapping[str, str]) -> tuple[str | None, str]:
    """(file to read or None, why) — why labels a missing explicit file."""
    if path is not None:
        return os.fspath(path), "no such file"
    if env.get(CONFIG_ENV):
        return env[CONFIG_ENV], f"no such file (named by ${CONFIG_ENV})"
    return next((p for p in DEFAULT_CONFIG_PATHS if os.path.exists(p)), None), ""


def load_node_config(path: str | os.PathLike | None = None) -> NodeConfig:
    """Load, expand and validate the node config; raises ConfigError."""
    env = os.environ
    file, missing = _find(path, env)
    if file is not None and not os.path.exists(file):
        raise ConfigError(file, None, missing)
    source = file if file is not None else "<defaults>"
    data = _read_yaml(file) if file is not None else None
    if data is None:  # no file, or an empty one
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, None, f"the top level must be a mapping of keys, got {_show(data)}")
    warnings: list[str] = []
    _default_node_id(data, env, warnings)
    _runner_concurrency_from_env(data, env)
    data = expand_tree(data, env, (), source)
    base_dir = os.path.dirname(os.path.abspath(file)) if file is not None else None
    try:
        cfg = NodeConfig.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as e:
        raise _from_validation(e, source) from None
    # warnings and source are not keys: set them past validation (see NodeConfig).
    return cfg.model_copy(update={"warnings": warnings, "source": source})
