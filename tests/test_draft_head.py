"""sglang_ext.serving.draft_head: with SGLang's online fp8 config (unless
SGLANG_EXT_DRAFT_FP8_LM_HEAD=0), the drafter's lm_head is a linear layer carrying SGLang's fp8
method (which the logits processor applies), and the checkpoint's head loads into it;
otherwise SGLang's head stays, with a startup line saying why where fp8 was asked for. The
fp8 kernels themselves run on the GPU only."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import load_file

from sglang_ext.serving import draft_head


def _drafter(drafter, tmp_path, target_dir, quant):
    from transformers import AutoConfig

    from sglang_ext.cli.convert import convert
    from sglang_ext.models.llama_eagle3 import LlamaForCausalLMEagle3

    directory = tmp_path / "sglang"
    convert(drafter("norms_off")[0], directory, target_dir)
    config = AutoConfig.from_pretrained(str(directory))
    return directory, config, LlamaForCausalLMEagle3(config, quant_config=quant)


def test_the_fp8_head_is_built_and_loaded_with_sglangs_fp8_method(
    sglang_env, drafter, tmp_path, target_dir, monkeypatch
):
    from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method
    from sglang.srt.layers.quantization.fp8 import Fp8Config, Fp8LinearMethod

    monkeypatch.setenv(draft_head.ENV_VAR, "1")
    directory, config, model = _drafter(drafter, tmp_path, target_dir, Fp8Config())
    head = model.lm_head
    assert isinstance(head.quant_method, Fp8LinearMethod)
    assert should_apply_lm_head_quant_method(head, head.quant_method)  # what _compute_lm_head asks
    assert tuple(head.weight.shape) == (config.draft_vocab_size, config.hidden_size)

    tensors = load_file(str(directory / "model.safetensors"))
    model.load_weights(tensors.items())  # every tensor accounted for, the head's too
    assert not model.load_report.errors
    (name,) = [n for n in tensors if n.endswith("lm_head.weight")]
    assert torch.equal(head.weight, tensors[name].to(head.weight.dtype))


def test_the_fp8_head_is_the_default_under_online_fp8(
    sglang_env, drafter, tmp_path, target_dir, monkeypatch, caplog
):
    """2026-12-06: τ held within 2 % on a trained drafter, so no variable is needed."""
    from sglang.srt.layers.quantization.fp8 import Fp8Config, Fp8LinearMethod

    monkeypatch.delenv(draft_head.ENV_VAR, raising=False)
    with caplog.at_level(logging.INFO, logger=draft_head.logger.name):
        _, _, model = _drafter(drafter, tmp_path, target_dir, Fp8Config())
    assert isinstance(model.lm_head.quant_method, Fp8LinearMethod)
    (said,) = [r.getMessage() for r in caplog.records if r.name == draft_head.logger.name]
    assert "served in fp8" in said and f"{draft_head.ENV_VAR}=0 keeps it bf16" in said


@pytest.mark.parametrize("env, fp8", [("0", True), ("1", False), (None, False)])
def test_sglangs_head_stays_where_refused_or_not_fp8(
    sglang_env, drafter, tmp_path, target_dir, monkeypatch, caplog, env, fp8
):
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead

    if env is None:
        monkeypatch.delenv(draft_head.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(draft_head.ENV_VAR, env)
    with caplog.at_level(logging.INFO, logger=draft_head.logger.name):
        _, _, model = _drafter(drafter, tmp_path, target_dir, Fp8Config() if fp8 else None)
    assert isinstance(model.lm_head, ParallelLMHead)
    said = [r for r in caplog.records if r.name == draft_head.logger.name]
    if env == "1":  # asked for, not possible: the startup log says why, as a warning
        assert len(said) == 1 and said[0].levelno == logging.WARNING
        assert "--speculative-draft-model-quantization fp8" in said[0].getMessage()
    else:  # refused, or no fp8 asked for at all: nothing to say
        assert said == []


@pytest.mark.parametrize("value", ["true", "2", "off"])
def test_a_value_other_than_0_or_1_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(draft_head.ENV_VAR, value)
    with pytest.raises(ValueError, match=f"{draft_head.ENV_VAR}='{value}': expected 0"):
        draft_head.requested()


def test_why_not_names_each_case():
    from types import SimpleNamespace

    from sglang.srt.layers.quantization.fp8 import Fp8Config

    def drafter(tie=False, from_target=False, shards=1, fp32=False):
        return SimpleNamespace(
            config=SimpleNamespace(tie_word_embeddings=tie),
            load_lm_head_from_target=from_target,
            lm_head=SimpleNamespace(tp_size=shards),
            logits_processor=SimpleNamespace(use_fp32_lm_head=fp32),
        )

    fp8 = Fp8Config()
    assert draft_head.why_not(drafter(), fp8) is None
    assert "quantization fp8" in draft_head.why_not(drafter(), None)
    assert "quantization fp8" in draft_head.why_not(
        drafter(), Fp8Config(is_checkpoint_fp8_serialized=True)
    )
    assert "tie_word_embeddings" in draft_head.why_not(drafter(tie=True), fp8)
    assert "no lm_head of its own" in draft_head.why_not(drafter(from_target=True), fp8)
    assert "over 2 ranks" in draft_head.why_not(drafter(shards=2), fp8)
    assert "fp32" in draft_head.why_not(drafter(fp32=True), fp8)


@pytest.mark.parametrize("env", ["1", None])
def test_a_drafter_that_shares_the_targets_head_keeps_sglangs(
    sglang_env, tmp_path, monkeypatch, caplog, env
):
    """No draft_vocab_size: SGLang's constructor fills it with the target's vocabulary and
    swaps the target's bf16 head in at startup (load_lm_head_from_target). An fp8 head there
    would get a bf16 weight under an fp8 method: it stays SGLang's, and the log says why."""
    from mla_drafters import mla_config, write_mla_drafter
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
    from transformers import AutoConfig

    from sglang_ext.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM

    if env is None:  # the default: an info line, not a warning
        monkeypatch.delenv(draft_head.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(draft_head.ENV_VAR, env)
    directory = tmp_path / "mla"
    write_mla_drafter(directory, mla_config(draft_vocab_size=None))
    with caplog.at_level(logging.INFO, logger=draft_head.logger.name):
        model = Eagle3DeepseekV2ForCausalLM(
            AutoConfig.from_pretrained(directory), quant_config=Fp8Config()
        )
    assert model.load_lm_head_from_target and isinstance(model.lm_head, ParallelLMHead)
    (said,) = [r for r in caplog.records if r.name == draft_head.logger.name]
    assert "no lm_head of its own" in said.getMessage()
    assert said.levelno == (logging.WARNING if env else logging.INFO)


def test_the_mla_drafter_carries_it_too(sglang_env, tmp_path, monkeypatch):
    """SGLang's kimi_k25_eagle3 drafter builds its own head the same way: asked for, fp8."""
    from mla_drafters import mla_config, write_mla_drafter
    from safetensors.torch import load_file
    from sglang.srt.layers.quantization.fp8 import Fp8Config, Fp8LinearMethod
    from transformers import AutoConfig

    from sglang_ext.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM

    monkeypatch.setenv(draft_head.ENV_VAR, "1")
    directory = tmp_path / "mla"
    write_mla_drafter(directory, mla_config(draft_vocab_size=128))
    model = Eagle3DeepseekV2ForCausalLM(
        AutoConfig.from_pretrained(directory), quant_config=Fp8Config()
    )
    assert isinstance(model.lm_head.quant_method, Fp8LinearMethod)
    model.load_weights(load_file(str(directory / "model.safetensors")).items())
    assert not model.load_report.errors
