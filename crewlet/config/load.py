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


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, which plain YAML silently resolves
    to the last one, hiding an edit that seems to have no effect."""

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


def _read_yaml(path: str) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(path, None, "no such file") from None
    except OSError as e:
        raise ConfigError(path, None, f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(path, None, f"not UTF-8 text: {e.reason} at byte {e.start}") from None
    return parse_yaml(text, path)


def parse_yaml(text: str, source: str) -> object:
    """YAML *text* as data; duplicate keys and syntax errors are ConfigErrors
    naming *source*, the line and the column. Shared by every config tier."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(source, None, f"invalid YAML{where}: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(source, None, f"invalid YAML: {e}") from None


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
    for op, sym in (("greater_than_equal", ">="), ("greater_than", ">"), ("less_than_equal", "<="), ("less_than", "<")):
        if kind == op:
            return f"must be {sym} {next(iter(ctx.values()))}{got}"
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
    data = expand_tree(data, env, (), source)
    base_dir = os.path.dirname(os.path.abspath(file)) if file is not None else None
    try:
        cfg = NodeConfig.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as e:
        raise _from_validation(e, source) from None
    # warnings and source are not keys: set them past validation (see NodeConfig).
    return cfg.model_copy(update={"warnings": warnings, "source": source})
