"""Build the tiny CPU fixtures with sglang_ext_tools.fixtures.make_fixtures and check their
structure."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("speculators")
from safetensors import safe_open  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODULE = "sglang_ext_tools.fixtures.make_fixtures"
VARIANTS = "llama,random,sglang4layer"
MAX_WALL_S = float(os.environ.get("SGLANG_EXT_FIXTURES_MAX_S", "180"))


def _load_fixtures_common():
    """sglang_ext_tools.fixtures.common (held-out split), as the builders import it."""
    return importlib.import_module("sglang_ext_tools.fixtures.common")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("fixtures")
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            MODULE,
            "--out",
            str(out),
            "--scale",
            "tiny",
            "--device",
            "cpu",
            "--variants",
            VARIANTS,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        pytest.fail(f"make_fixtures failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    manifest = json.loads((out / "fixtures.json").read_text())
    return out, manifest, wall


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as fh:
        return {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118


def test_runtime(built):
    _, manifest, wall = built
    print(f"make_fixtures tiny wall time: {wall:.1f}s (script reports {manifest['total_wall_s']}s)")
    assert wall < MAX_WALL_S


def test_directories(built):
    out, _, _ = built
    for name in (
        "tokenizer",
        "vocab",
        "reference",
        "llama-target",
        "llama-drafter",
        "random-drafter",
        "llama4layer-target",
        "llama4layer-sglang-drafter",
    ):
        assert (out / name).is_dir(), name
    for name in ("fixtures.json", "prompts.jsonl", "splits.json"):
        assert (out / name).is_file(), name
    for name in ("llama-drafter-3layer", "qwen3-target", "dsv3-target"):
        assert not (out / name).exists()  # not selected


def test_target_dir(built):
    from transformers import AutoTokenizer

    out, manifest, _ = built
    tdir = out / "llama-target"
    cfg = json.loads((tdir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_hidden_layers"] == 4 and cfg["hidden_size"] == 64
    assert cfg["vocab_size"] == 512 and cfg["tie_word_embeddings"] is False
    assert (tdir / "model.safetensors").is_file()
    assert (tdir / "tokenizer.json").is_file() and (tdir / "tokenizer_config.json").is_file()
    tok_cfg = json.loads((tdir / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    tok = AutoTokenizer.from_pretrained(str(tdir))
    assert (tok.bos_token, tok.eos_token) == ("<s>", "</s>")
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
    assert len(tok) == 512
    text = "def add(a, b):\n    return a + b\n"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    info = manifest["targets"]["llama-target"]
    assert info["params"] > 0 and info["heldout"]["loss"] > 0


def test_drafter_dirs(built):
    out, manifest, _ = built
    t2d_ref = torch.load(out / "vocab" / "t2d.pt")
    d2t_ref = torch.load(out / "vocab" / "d2t.pt")
    for name in ("llama-drafter", "random-drafter"):
        ddir = out / name
        cfg = json.loads((ddir / "config.json").read_text())
        assert cfg["speculators_model_type"] == "eagle3"
        assert "model_type" not in cfg
        assert cfg["architectures"] == ["Eagle3DraftModel"]
        assert (ddir / "config.py").is_file()
        assert "config.Eagle3SpeculatorConfig" in json.dumps(cfg.get("auto_map", {}))
        assert cfg["norm_before_residual"] and cfg["norm_before_fc"] and cfg["norm_output"]
        assert cfg["embed_requires_grad"] is False
        tl = cfg["transformer_layer_config"]
        assert tl["model_type"] == "llama" and tl["num_hidden_layers"] == 1
        assert tl["layer_types"] == ["sliding_attention"] and tl["sliding_window"] == 2048
        aux = cfg["eagle_aux_hidden_state_layer_ids"]
        assert aux == manifest["drafters"][name]["aux_layer_ids"] == [1, 2, 3]
        assert len(set(aux)) == len(aux) and max(aux) <= 4
        spec = cfg["speculators_config"]
        assert spec["proposal_methods"][0]["speculative_tokens"] == 3
        assert spec["verifier"]["architectures"] == ["LlamaForCausalLM"]
        assert Path(spec["verifier"]["name_or_path"]).name == "llama-target"

        tensors = _tensors(ddir / "model.safetensors")
        assert any(k.startswith("layers.0.") for k in tensors)
        assert "layers.0.hidden_norm.weight" in tensors
        assert not any(k.startswith("midlayer.") for k in tensors)
        assert not any(k.startswith("verifier_") for k in tensors)
        d2t, t2d = tensors["d2t"], tensors["t2d"]
        draft_vocab = cfg["draft_vocab_size"]
        assert d2t.dtype == torch.int64 and d2t.shape == (draft_vocab,)
        assert t2d.dtype == torch.bool and t2d.shape == (512,)
        assert int(t2d.sum()) == draft_vocab == 256
        assert torch.equal(d2t + torch.arange(draft_vocab), torch.nonzero(t2d).flatten())
        assert torch.equal(d2t, d2t_ref) and torch.equal(t2d, t2d_ref)
        assert tensors["lm_head.weight"].shape == (draft_vocab, 64)
        assert tensors["fc.weight"].shape == (64, 3 * 64)


def test_sglang_format_drafter(built):
    out, manifest, _ = built
    ddir = out / "llama4layer-sglang-drafter"
    cfg = json.loads((ddir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["model_type"] == "llama"
    assert "eagle_config" not in cfg and "speculators_model_type" not in cfg
    tensors = _tensors(ddir / "model.safetensors")
    assert any(k.startswith("midlayer.") for k in tensors)
    assert not any(k.startswith("layers.") for k in tensors)
    h = cfg["hidden_size"]
    assert tensors["fc.weight"].shape == (h, 3 * h)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * h
    target_cfg = json.loads((out / "llama4layer-target" / "config.json").read_text())
    n = target_cfg["num_hidden_layers"]
    assert n == 4 and target_cfg["hidden_size"] == h
    default_ids = [2, n // 2, n - 3]  # SGLang's default when eagle_config is absent
    assert len(set(default_ids)) < len(default_ids)  # collapses -> fc shape mismatch
    info = manifest["drafters"]["llama4layer-sglang-drafter"]
    assert info["expected_stock_sglang_error"].endswith(f"and {3 * h}x{h})")


def test_prompts_are_held_out(built):
    out, manifest, _ = built
    mod = _load_fixtures_common()
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) >= 64
    assert len({p["id"] for p in prompts}) == len(prompts)
    splits = json.loads((out / "splits.json").read_text())
    train = set(splits["train_all"]) | set(splits["train_used"])
    heldout = set(splits["heldout"])
    assert not train & heldout
    for p in prompts:
        assert 128 <= len(p["input_ids"]) <= 256
        assert p["source"] in heldout and p["source"] not in train
        assert mod.heldout_split(p["source"])
        assert isinstance(p["text"], str) and p["text"]
    assert manifest["prompts"]["count"] == len(prompts)


def test_manifest(built):
    _, m, _ = built
    for key in (
        "seed",
        "seeds",
        "versions",
        "device",
        "device_name",
        "stages",
        "data",
        "prompts",
        "targets",
        "drafters",
        "vocab_mapping",
        "total_wall_s",
        "determinism",
        "conventions",
    ):
        assert key in m, key
    for pkg in ("torch", "transformers", "tokenizers", "speculators"):
        assert m["versions"][pkg]
    for stage in (
        "data",
        "llama-target",
        "llama-drafter",
        "random-drafter",
        "llama4layer-target",
        "llama4layer-sglang-drafter",
        "reference",
    ):
        assert m["stages"][stage]["wall_s"] >= 0
    drafter = m["drafters"]["llama-drafter"]
    assert drafter["params"] > drafter["trainable_params"] > 0
    hist = drafter["train"]["history"]
    assert len(hist[0]["loss_per_step"]) == 3 and len(hist[0]["full_acc_per_step"]) == 3
    held = drafter["train"]["heldout"]
    assert len(held["full_acc_per_step"]) == 3
    assert all(0.0 <= a <= 1.0 for a in held["full_acc_per_step"])
    refres = drafter["reference"]
    assert 1.0 <= refres["tau"] <= 4.0
    assert refres["lossless_check"]["mismatches"] == 0
    assert refres["lossless_check"]["checked"] >= 1
    assert m["drafters"]["random-drafter"]["train"] is None
    assert 1.0 <= m["drafters"]["random-drafter"]["reference"]["tau"] <= 4.0


def test_tiny_training_reduces_loss(built):
    _, m, _ = built
    tgt = m["targets"]["llama-target"]["train"]
    assert tgt["last_loss"] < tgt["first_loss"]
    assert tgt["first_loss"] > 5.5  # ~ln(512) at init
    dr = m["drafters"]["llama-drafter"]["train"]
    assert dr["last_loss"] < dr["first_loss"]


def test_reference_outputs_reload(built):
    from sglang_ext_tools import reference as ref

    torch.set_num_threads(1)  # same summation order as the script's CPU run
    out, m, _ = built
    rows = [
        json.loads(line)
        for line in (out / "reference" / "llama-drafter.jsonl").read_text().splitlines()
    ]
    assert len(rows) == m["drafters"]["llama-drafter"]["reference"]["num_prompts"]
    prompts = {
        json.loads(line)["id"]: json.loads(line)["input_ids"]
        for line in (out / "prompts.jsonl").read_text().splitlines()
    }
    target = ref.load_target(out / "llama-target")
    drafter = ref.load_drafter(out / "llama-drafter")
    assert ref.drafter_aux_layer_ids(drafter) == [1, 2, 3]
    row = rows[0]
    res = ref.speculative_generate(target, drafter, prompts[row["id"]], 3, len(row["tokens"]))
    assert res.tokens == row["tokens"]
    assert res.accepted_per_cycle == row["accepted"]
