"""Reading a company file: YAML, environment expansion, one-line errors.

``load_company(path)`` reads a file; ``parse_company(text, source)`` parses
text that came from elsewhere (``source`` labels errors); ``from_revision(doc,
"revision 3")`` validates a stored revision's document again. Both return a
validated :class:`~crewlet.company.model.Company` or raise
:class:`~crewlet.config.ConfigError` — the same one-line
``<file>: <key>: <problem>`` as Tier A, exit code 78 — with ``file`` the
company file.

The rules are Tier A's (:mod:`crewlet.config.load`): YAML with duplicate
keys rejected, a file over ``FILE_MAX`` (128 MiB: twice what a stored
revision may measure, ``REVISION_MAX``) or aliases expanding past
``ALIAS_NODES_MAX`` nodes refused; in every string *value* (never a key) ``${VAR}`` is the
environment variable (unset is an error), ``${VAR:-default}`` falls back
when VAR is unset or empty, ``$$`` is a literal ``$``; an empty file is an
empty mapping (and so lacks the required keys).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import ValidationError

from crewlet.company.model import REVISION_MAX, At, Company
from crewlet.config import ConfigError
from crewlet.config.load import _problem, _show, dotted, expand_tree, parse_yaml, read_text  # Tier A's rules, shared on purpose


# Bytes of a company file: twice what its stored revision may measure
# (REVISION_MAX), for comments and YAML's own spelling. Read with libyaml
# (crewlet.config.load.parse_yaml), a 25 MB file of 10,000 seats takes
# seconds, not the ~25 s of the pure-Python parser.
FILE_MAX = 2 * REVISION_MAX


def load_company(path: str | os.PathLike) -> Company:
    """Read, expand and validate the company file at *path*."""
    file = os.fspath(path)
    text = read_text(file, "a company file", limit=FILE_MAX)
    return parse_company(text, file)


def parse_company(text: str, source: str = "<company>", env: Mapping[str, str] | None = None) -> Company:
    """Parse, expand (from *env*, default ``os.environ``) and validate *text*."""
    data = parse_yaml(text, source, limit=FILE_MAX)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, None, f"the top level must be a mapping of keys, got {_show(data)}")
    data = expand_tree(data, os.environ if env is None else env, (), source)
    try:
        return Company.model_validate(data)
    except ValidationError as e:
        raise _from_validation(e, source) from None


def from_revision(data: object, source: str) -> Company:
    """The company of a stored revision's ``company`` document, validated
    again (a node may know rules, time zones or cron forms the node that
    stored it did not); :class:`ConfigError` naming *source* (``revision 3``)
    and the key otherwise."""
    try:
        return Company.model_validate(data)
    except ValidationError as e:
        raise _from_validation(e, source) from None


def _key_and_problem(err: dict) -> tuple[str | None, str]:
    """One pydantic error as (dotted key, problem); an :class:`At` raised by a
    model validator names its key relative to the error's location."""
    key = dotted(err["loc"])
    at = (err.get("ctx") or {}).get("error")
    if err["type"] == "value_error" and isinstance(at, At):
        sep = "" if not key or at.key.startswith("[") else "."
        return key + sep + at.key, at.problem
    return key or None, _problem(err)


def _from_validation(e: ValidationError, file: str) -> ConfigError:
    errors = e.errors(include_url=False)
    key, problem = _key_and_problem(errors[0])
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return ConfigError(file, key, problem + more)
