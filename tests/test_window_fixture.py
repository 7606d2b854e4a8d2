"""The `window` fixture variant (sglang_ext_tools/fixtures/window.py) built at tiny scale on CPU:
the drafter carries its trained window, the prompts are longer than it, and the manifest
holds both reference taus the GPU test (tests/gpu/test_window.py) reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("speculators")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("window-fixtures")
    cmd = [sys.executable, "-m", "sglang_ext_tools.fixtures.make_fixtures", "--out", str(out)]
    cmd += ["--scale", "tiny", "--device", "cpu", "--variants", "window", "--smoke"]
    cmd += ["--ref-dtype", "bfloat16", "--max-new-tokens", "8"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"make_fixtures failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return out, json.loads((out / "fixtures.json").read_text())


def test_window_drafter_carries_its_window(built):
    out, manifest = built
    cfg = json.loads((out / "window-drafter" / "config.json").read_text())
    layer = cfg["transformer_layer_config"]
    window = manifest["window"]["sliding_window"]
    assert layer["sliding_window"] == window == 16
    assert layer["layer_types"] == ["sliding_attention"]
    assert manifest["drafters"]["window-drafter"]["train"]["seq_len"] > window
    assert not (out / "llama-drafter").exists()  # only the selected variant


def test_window_prompts_and_references(built):
    out, manifest = built
    info = manifest["window"]
    rows = [json.loads(line) for line in (out / info["prompts"]["path"]).read_text().splitlines()]
    assert len(rows) == info["prompts"]["count"] == 1  # --smoke
    assert all(len(r["input_ids"]) > info["sliding_window"] for r in rows)
    assert rows[0]["id"] == "w000"
    assert info["chain"] == {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}
    assert info["reference_dtype"] == "bfloat16" and info["max_new_tokens"] == 8
    assert info["tau_reference_window"] >= 1 and info["tau_reference_full"] >= 1
    for name in ("window-drafter", "window-drafter-full"):
        ref = [json.loads(line) for line in (out / "reference" / f"{name}.jsonl").open()]
        assert [r["id"] for r in ref] == ["w000"]


def test_long_prompts_refuse_short_files():
    from sglang_ext_tools.fixtures.window import make_long_prompts

    class Tok:
        def __init__(self):
            self.backend_tokenizer = self

        def encode_batch(self, texts):
            return [type("E", (), {"ids": list(range(len(t)))})() for t in texts]

        def decode(self, ids):
            return "x" * len(ids)

    files = [("a.py", "x" * 50), ("b.py", "x" * 500), ("c.py", "x" * 300)]
    prompts = make_long_prompts(Tok(), files, 2, (200, 250), seed=0)
    assert [p["source"] for p in prompts] == ["b.py", "c.py"]
    assert all(200 <= len(p["input_ids"]) <= 250 for p in prompts)
    # more prompts than long files: further chunks of the longest files, never overlapping
    more = make_long_prompts(Tok(), files, 3, (200, 250), seed=0)
    spans = sorted(
        (p["offset"], p["offset"] + len(p["input_ids"])) for p in more if p["source"] == "b.py"
    )
    assert len(more) == 3 and len(spans) == 2 and spans[0][1] <= spans[1][0]
    with pytest.raises(RuntimeError, match="held-out files; 5 needed"):
        make_long_prompts(Tok(), files, 5, (200, 250), seed=0)
