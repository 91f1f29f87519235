"""Issue 24 §3: the size limits of the two tiers, as the README words them.

Tier A (crewlet.yaml) is at most 2 MiB (``YAML_MAX_BYTES``); a company file
is at most ``FILE_MAX`` (128 MiB, twice the 64 MiB of compact JSON a stored
revision may measure, ``REVISION_MAX``), so a 6 MB company (issue 13's large
companies reach 25 MB) validates. Each refusal names the file, the limit
and whose limit it is.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crewlet.company import load as company_load
from crewlet.company.load import FILE_MAX, load_company
from crewlet.company.model import REVISION_MAX
from crewlet.config import ConfigError
from crewlet.config.load import YAML_MAX_BYTES, load_node_config

README = Path(__file__).resolve().parents[2] / "README.md"


def test_a_tier_a_file_over_2_mib_is_refused_naming_file_and_limit(tmp_path):
    path = tmp_path / "crewlet.yaml"
    path.write_text("#" * (YAML_MAX_BYTES + 1))
    with pytest.raises(ConfigError) as info:
        load_node_config(path)
    text = str(info.value)
    assert str(path) in text and f"over the limit of {YAML_MAX_BYTES} bytes (2 MiB: YAML_MAX_BYTES)" in text
    assert "a config file" in text


def test_a_6_mb_company_validates_and_one_past_its_limit_is_refused_naming_it(tmp_path, monkeypatch):
    seats = "".join(f"  - {{name: s{i}, persona: {'p' * 1500}, provider: scripted}}\n" for i in range(4000))
    text = "company: {name: Big}\nproviders:\n  scripted: {kind: scripted, rules: []}\nseats:\n" + seats
    path = tmp_path / "company.yaml"
    path.write_text(text)
    assert path.stat().st_size > 6_000_000 > YAML_MAX_BYTES
    assert len(load_company(path).seats) == 4000
    # The same file past a company file's limit (narrowed here: 128 MiB on disk is slow to write).
    monkeypatch.setattr(company_load, "FILE_MAX", 6_000_000)
    with pytest.raises(ConfigError) as info:
        load_company(path)
    said = str(info.value)
    assert str(path) in said and "over the limit of 6000000 bytes" in said and "a company file" in said
    assert "REVISION_MAX" in said


def test_the_readme_words_the_limits_the_code_has():
    words = " ".join(README.read_text().split())
    assert "Both tiers refuse a file over 2 MiB" not in words
    assert f"a Tier A file over {YAML_MAX_BYTES // 2**20} MiB" in words
    assert f"a company file over {FILE_MAX // 2**20} MiB" in words and FILE_MAX == 2 * REVISION_MAX
    assert re.search(r"POST /v1/company.{0,200}ingress\.max_body", words)
