"""MLA drafters (SGLang's kimi_k25_eagle3 / Eagle3DeepseekV2ForCausalLM): doctor and the server
drive one LoadPlan, so doctor's report is what load_weights does, on SGLang's real classes.

SGLang's own load_weights maps `layers.0.` to `midlayer.`, fuses q_a_proj + kv_a_proj_with_mqa,
logs and skips names it does not know and never checks for missing ones; then
post_load_weights splits kv_b_proj into MLA's w_kc / w_vc, which must still happen."""

from __future__ import annotations

import pytest
import torch
from mla_drafters import mla_checkpoint, mla_config, write_mla_drafter

from sglang_ext.cli.doctor import diagnose
from sglang_ext.drafter.checkpoint_files import DrafterLoadError

VARIANTS = {
    "default": {},
    "fc_norm": {"fc_norm": True, "norm_output": True},
    "no_draft_vocab": {"draft_vocab_size": None},
}


def config_for(name):
    fields = dict(VARIANTS[name])
    return mla_config(draft_vocab_size=fields.pop("draft_vocab_size", 128), **fields)


def served(directory):
    """The plugin's MLA drafter for `directory`, as SGLang builds it (config via transformers)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from sglang_ext.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM

    model = Eagle3DeepseekV2ForCausalLM(AutoConfig.from_pretrained(directory))
    return model, load_file(str(directory / "model.safetensors"))


def summary(report):
    return [(e.name, e.status, e.param) for e in report.entries]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_doctor_reads_a_well_formed_mla_drafter(tmp_path, variant):
    """Before: doctor applied the llama drafter's parameter table and reported a dozen
    missing and unexpected tensors on this checkpoint."""
    directory = write_mla_drafter(tmp_path / variant, config_for(variant))
    diagnosis = diagnose(directory)
    assert diagnosis.verdict == "OK", diagnosis.errors
    counts = diagnosis.to_json()["tensor_counts"]
    assert not {"missing", "unexpected", "shape_mismatch", "dtype_mismatch"} & set(counts)
    assert diagnosis.config["layer_type"] == "mla"
    ignored = {e.name for e in diagnosis.report.entries if e.status == "ignored"}
    assert ignored <= {"embed_tokens.weight", "t2d"}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_server_load_is_doctors_prediction_and_sglangs_weights(sglang_env, tmp_path, variant):
    """The plugin's load_weights on SGLang's real MLA classes reports exactly doctor's entries,
    and leaves every weight as SGLang's own loader does (fused q_a/kv_a, stacked gate/up,
    w_kc/w_vc from post_load_weights, hot token ids)."""
    from sglang.srt.models import kimi_k25_eagle3 as upstream

    directory = write_mla_drafter(tmp_path / variant, config_for(variant))
    model, tensors = served(directory)
    model.load_weights(tensors.items())
    assert summary(model.load_report) == summary(diagnose(directory).report)

    stock = upstream.Eagle3DeepseekV2ForCausalLM(model.config)
    stock.load_weights(tensors.items())
    ours, theirs = dict(model.named_parameters()), dict(stock.named_parameters())
    assert ours.keys() == theirs.keys()
    # embeddings (and lm_head without draft_vocab_size) are replaced by the target's at startup
    derived = {e.name for e in model.load_report.entries if e.status == "derived"}
    for name in ours.keys() - derived:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=0, msg=name)
    fused = ours["model.midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight"]
    q_a, kv_a = (
        tensors[f"layers.0.self_attn.{n}.weight"] for n in ("q_a_proj", "kv_a_proj_with_mqa")
    )
    assert torch.equal(fused, torch.cat([q_a, kv_a]))
    attn, stock_attn = model.model.midlayer.self_attn, stock.model.midlayer.self_attn
    assert attn.w_kc is not None and torch.equal(attn.w_kc, stock_attn.w_kc)
    assert torch.equal(attn.w_vc, stock_attn.w_vc)
    if "d2t" in tensors:
        assert torch.equal(model.hot_token_id, stock.hot_token_id.to(torch.int64))


def drop(name):
    return lambda t: t.pop(name)


def add(name, shape):
    return lambda t: t.update({name: torch.zeros(shape)})


def reshape(name, shape):
    return lambda t: t.update({name: torch.zeros(shape)})


BAD = {
    "missing_kv_a": (
        drop("layers.0.self_attn.kv_a_proj_with_mqa.weight"),
        "model.midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight[shard kv_a]: missing "
        "(expected [24, 128]",
    ),
    "missing_norm": (
        drop("layers.0.hidden_norm.weight"),
        "model.midlayer.hidden_norm.weight: missing (expected [64]",
    ),
    "rotary_buffer": (
        add("layers.0.self_attn.rotary_emb.inv_freq", (4,)),
        "layers.0.self_attn.rotary_emb.inv_freq: unexpected tensor",
    ),
    "second_layer": (
        add("layers.1.mlp.down_proj.weight", (64, 128)),
        "layers.1.mlp.down_proj.weight: unexpected tensor",
    ),
    "q_b_shape": (
        reshape("layers.0.self_attn.q_b_proj.weight", (96, 16)),
        "layers.0.self_attn.q_b_proj.weight: shape mismatch (expected [96, 32], found [96, 16]",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_mla_checkpoint_fails_doctor_and_server_alike(sglang_env, tmp_path, case):
    """Stock SGLang loads each of these without an error (a missing tensor stays at random
    init, an unknown one is skipped with a log line); here both doctor and the server name it."""
    from sglang.srt.models import kimi_k25_eagle3 as upstream

    change, message = BAD[case]
    config = mla_config()
    tensors = mla_checkpoint(config)
    change(tensors)
    directory = write_mla_drafter(tmp_path / case, config, tensors)
    diagnosis = diagnose(directory)
    assert diagnosis.verdict == "ERROR" and any(message in e for e in diagnosis.errors), (
        diagnosis.errors
    )
    model, loaded = served(directory)
    with pytest.raises(DrafterLoadError) as info:
        model.load_weights(loaded.items())
    assert message in str(info.value)
    if case != "q_b_shape":  # stock's loader asserts on the shape; the rest pass silently
        upstream.Eagle3DeepseekV2ForCausalLM(model.config).load_weights(loaded.items())


def test_mla_config_problems_name_the_field(tmp_path):
    directory = write_mla_drafter(tmp_path / "two", mla_config(num_hidden_layers=2))
    assert any("num_hidden_layers is 2" in e for e in diagnose(directory).errors)
    config = mla_config()
    del config.q_lora_rank
    directory = write_mla_drafter(tmp_path / "lora", config, mla_checkpoint(mla_config()))
    assert any("'q_lora_rank' is missing" in e for e in diagnose(directory).errors)


def test_doctor_predicts_what_stock_sglang_does_with_an_mla_drafter(tmp_path):
    config = mla_config()
    assert diagnose(write_mla_drafter(tmp_path / "ok", config)).stock_sglang["summary"] == (
        "serves as the plugin does"
    )
    tensors = mla_checkpoint(config)
    BAD["missing_kv_a"][0](tensors)
    BAD["rotary_buffer"][0](tensors)
    stock = diagnose(write_mla_drafter(tmp_path / "bad", config, tensors)).stock_sglang
    assert stock["startup"] == "starts"
    assert stock["silently_skipped_tensors"] == ["layers.0.self_attn.rotary_emb.inv_freq"]
    assert stock["left_at_random_init"] == [
        "model.midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight"
    ]
