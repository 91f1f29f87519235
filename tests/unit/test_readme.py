"""The README's config reference and quick start stay true to the code."""

from __future__ import annotations

import os
import re

from pydantic import BaseModel

from crewlet.config.model import NodeConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def _keys(model: type[BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _keys(ann, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


def test_every_config_key_is_in_the_reference_with_its_default():
    rows = {m.group(1): m.group(2) for m in
            re.finditer(r"^\| `([a-z_.]+)` \| `([^`]*)` \|", _readme(), re.M)}
    for key, field in _keys(NodeConfig):
        assert key in rows, f"README's config reference lacks {key}"
        if key == "data_dir":
            continue  # depends on the environment; the row says how
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list):
            shown = "[" + ", ".join(map(str, default)) + "]"
        else:
            shown = str(default)
        assert rows[key] == shown, f"{key}: README says {rows[key]!r}, the model {shown!r}"
    documented = set(rows)
    actual = {k for k, _ in _keys(NodeConfig)}
    assert documented <= actual, f"README documents keys that do not exist: {documented - actual}"


def test_quick_start_test_command_is_what_ci_runs():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert "python -m pytest -q" in _readme()
    assert re.search(r"^python -m pytest -q", ci, re.M)
