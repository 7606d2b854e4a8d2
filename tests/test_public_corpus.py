"""The public-config corpus: doctor's verdict on each published drafter,
scaled by the one rule and built into a checkpoint, against its scaled target."""

from __future__ import annotations

import json

import pytest
from public_configs import CORPUS, build, manifest, scale_config, scaled_heads, scaled_width

from sglang_ext.cli import doctor

NAMES = sorted(manifest()["drafters"])


def test_every_file_is_in_the_manifest_with_a_source():
    data = manifest()
    listed = {e["config"] for e in data["drafters"].values()} | set(data["targets"])
    assert listed == {p.name for p in CORPUS.glob("*.json")} - {"manifest.json"}
    for entry in data["drafters"].values():
        assert entry["source"] and (entry["verbatim"] or entry["how"])


def test_the_rule_changes_only_sizes():
    config = json.loads((CORPUS / "specforge-llama3-70B-eagle3.json").read_text())
    scaled = scale_config(config)
    changed = {k for k in config if config[k] != scaled[k]}
    assert changed == {"hidden_size", "intermediate_size", "vocab_size", "draft_vocab_size",
                       "num_attention_heads", "num_key_value_heads", "head_dim"}
    assert scaled["rope_scaling"] == config["rope_scaling"]
    assert (scaled_width(4096), scaled_width(2880), scaled_heads(56)) == (64, 48, 2)


def test_the_scaled_mla_q_rank_keeps_the_kv_latent_aligned():
    """SGLang's fused q_a/kv_a output holds the q latent first; the kv latent slice after it
    must start 128 bytes in (bf16: a multiple of 64), or flashinfer's rmsnorm refuses it at
    the first forward (the H200 run of 2026-12-01: q rank 32 -> 'Misaligned Tensor data')."""
    for name in ("target-deepseek-v3.json", "target-kimi-k2.5-text.json",
                 "kimi-k2.5-eagle3-mla.json"):
        config = json.loads((CORPUS / name).read_text())
        scaled = scale_config(config, target=name.startswith("target-"))
        assert scaled["q_lora_rank"] % 64 == 0 and scaled["q_lora_rank"] < config["q_lora_rank"]
        assert scaled["kv_lora_rank"] == config["kv_lora_rank"]


@pytest.mark.parametrize("name", NAMES)
def test_doctor_verdict_on_the_corpus(tmp_path, name):
    drafter, target, entry = build(name, tmp_path)
    size = sum(p.stat().st_size for p in drafter.iterdir())
    assert size < 4_000_000, f"{name}: checkpoint of {size} bytes"
    diagnosis = doctor.diagnose(drafter, target)
    expected = entry["expected"]
    assert diagnosis.verdict == expected["doctor"], diagnosis.errors
    context = [w for w in diagnosis.warnings if "drafter context length" in w]
    assert bool(context) == expected["context_warning"], diagnosis.warnings
    assert diagnosis.stock_sglang["startup"] == expected["stock"]


def test_gpu_record_logic():
    from public_configs import record

    ok = {"output_ids": [1, 2], "meta_info": {}}
    assert record("OK", "ready", [ok, ok]) == {
        "doctor": "starts", "server": "starts", "status": "ready", "requests_ok": True
    }
    assert record("OK", "ready", [ok, {"error": "x"}])["requests_ok"] is False
    assert record("OK", "ready", [])["requests_ok"] is False
    refused = record("ERROR", "exited(1)", None)
    assert (refused["doctor"], refused["server"]) == ("fails", "fails")
    assert refused["requests_ok"] is None
    assert record("OK", "timeout", None)["server"] == "fails"


def test_gpu_module_collects_one_test_per_corpus_entry():
    import ast
    from pathlib import Path

    source = (Path(__file__).parent / "gpu" / "test_public_configs.py").read_text()
    tree = ast.parse(source)
    names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert {"public", "test_doctor_verdict_equals_startup_and_requests_succeed"} <= names
    assert 'RESULTS["public_configs"]' in source


def test_a_pickle_only_release_is_built_as_published(tmp_path):
    """The original EAGLE-3 Llama-3.1 release ships pytorch_model.bin only: the corpus entry
    is built that way, and doctor reads it as the server will (weights_only loader)."""
    drafter, target, entry = build("yuhuili_llama31_8b_bin", tmp_path)
    assert entry["weights"] == "pytorch_model.bin"
    assert sorted(p.name for p in drafter.iterdir()) == ["config.json", "pytorch_model.bin"]
    assert doctor.diagnose(drafter, target).verdict == "OK"
