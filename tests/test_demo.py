"""`sglang-ext demo`, README's first command: the main job on an embedded default."""

from __future__ import annotations

import json
import sys

from sglang_ext.cli import main


def test_demo_builds_with_speculators_and_reports(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "format:  speculators" in out and "verdict: OK" in out
    assert "stock SGLang (predicted, no server run): fails at startup" in out
    assert "Should have a `model_type` key" in out
    assert out.startswith(
        f"built a speculators EAGLE-3 drafter with speculators' own Eagle3DraftModel, in "
        f"{tmp_path / 'drafter'}, and wrote a Llama target config in {tmp_path / 'target'} "
        "(config.json only, no weights"
    ), out[:300]
    assert f"Files: {tmp_path} (kept)" in out and "format:  speculators" in out
    assert "target captures [1, 3, 4] (SGLang ids [0, 2, 3]" in out
    config = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and "model_type" not in config


def test_demo_without_speculators_uses_the_bundled_fixture(tmp_path, capsys, monkeypatch):
    """On a machine without speculators, the few-KB fixture made by it is copied instead."""
    monkeypatch.setitem(sys.modules, "speculators", None)  # import speculators -> ImportError
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "verdict: OK" in out
    assert out.startswith("copied the bundled speculators EAGLE-3 drafter"), out[:300]
    assert "built a speculators" not in out
    bundled = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert bundled["speculators_config"]["verifier"]["name_or_path"] == "target"


def test_bundled_fixture_matches_what_speculators_writes(tmp_path):
    """The bundled fixture is what scripts/make_demo_fixture.py (speculators' own code) makes:
    same config (modulo the verifier path) and the same tensor names, shapes and dtypes."""
    from sglang_ext.demo import BUNDLED, make_demo
    from sglang_ext.drafter.checkpoint_files import read_checkpoint

    make_demo(tmp_path)
    fresh = json.loads((tmp_path / "drafter" / "config.json").read_text())
    bundled = json.loads((BUNDLED / "drafter" / "config.json").read_text())
    for config in (fresh, bundled):
        config["speculators_config"]["verifier"].pop("name_or_path")
        config.pop("transformers_version", None)
    assert fresh == bundled

    def layout(directory):
        return sorted((t.name, t.shape, t.dtype) for t in read_checkpoint(directory))

    assert layout(tmp_path / "drafter") == layout(BUNDLED / "drafter")
