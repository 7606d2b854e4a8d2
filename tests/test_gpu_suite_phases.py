"""The GPU suite's phases fold into one results file (tests/gpu/suite.py merge_earlier_phase)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

GPU = Path(__file__).resolve().parent / "gpu"
sys.path.insert(0, str(GPU))

import suite  # noqa: E402


def test_an_earlier_phase_is_folded_in_without_overwriting(tmp_path, monkeypatch):
    earlier = {
        "date": "d0",
        "command": "pytest tests/gpu/test_public_configs.py",
        "outcomes": {"test_public[a]": "passed", "test_x": "failed"},
        "durations_s": {"test_public[a]": 3.0},
        "public_configs": {"a": {"doctor": "starts", "server": "starts"}},
        "lossless": {"old": 1},
    }
    path = tmp_path / "integration-public.json"
    path.write_text(json.dumps(earlier))
    monkeypatch.setenv("SGLANG_EXT_EARLIER_RESULTS", str(path))
    data = {"outcomes": {"test_x": "passed"}, "durations_s": {}, "lossless": {"plugin": {}}}
    suite.merge_earlier_phase(data)
    assert data["outcomes"] == {"test_public[a]": "passed", "test_x": "passed"}
    assert data["public_configs"] == earlier["public_configs"]
    assert data["lossless"] == {"plugin": {}}  # this run's own keys win
    assert data["earlier_phases"][0]["file"] == path.name


def test_no_earlier_phase_changes_nothing(monkeypatch):
    monkeypatch.delenv("SGLANG_EXT_EARLIER_RESULTS", raising=False)
    data = {"outcomes": {}}
    suite.merge_earlier_phase(data)
    assert data == {"outcomes": {}}
