"""A drafter shorter than its target's context: doctor and SGLang's real
startup check (``ModelConfig._derive_context_length``, built as the draft worker builds it, with
the target's context_len) agree, with the plugin's hook and without it (stock)."""

from __future__ import annotations

import json
import logging

import pytest
from builders import TINY_SGLANG_DRAFTER_CONFIG
from public_configs import write_sglang_drafter

from sglang_ext.cli import doctor
from sglang_ext.drafter import context_length as ctx


def _drafter(tmp_path, name, **fields):
    config = {
        **{k: v for k, v in TINY_SGLANG_DRAFTER_CONFIG.items() if k != "max_position_embeddings"},
        **fields,
    }
    return write_sglang_drafter(config, tmp_path / name)


def _target(tmp_path, **fields):
    directory = tmp_path / "target"
    directory.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 32,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 256,
        **fields,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def hooked(sglang_env):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_ext import plugin

    plugin.register()
    HookRegistry.apply_hooks()
    hooked = ModelConfig.__dict__["_derive_context_length"]
    assert hasattr(hooked, "__wrapped__"), "the plugin's context hook is not installed"
    return hooked


def _startup(directory, context_length, monkeypatch, *, stock: bool):
    """SGLang's draft ModelConfig as the draft worker builds it (eagle_worker_v2.py: the
    target's context_len); returns (outcome, context_len or error text)."""
    from sglang.srt.configs.model_config import ModelConfig

    if stock:
        raw = ModelConfig.__dict__["_derive_context_length"].__wrapped__
        monkeypatch.setattr(ModelConfig, "_derive_context_length", raw)
    try:
        config = ModelConfig(
            model_path=str(directory), context_length=context_length, is_draft_model=True
        )
    except ValueError as exc:
        return "fails", str(exc)
    finally:
        monkeypatch.undo()
    return "starts", config.context_len


@pytest.mark.parametrize(
    "fields",
    [
        {"max_position_embeddings": 2048},
        {"max_position_embeddings": 2048, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
         "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0}},
        {},  # no field: SGLang's (and LlamaConfig's) default 2048
    ],
    ids=["2048", "2048-llama3-rope", "no-field"],
)
def test_short_drafter_doctor_and_startup_agree(hooked, tmp_path, monkeypatch, caplog, fields):
    monkeypatch.delenv(ctx.OVERRIDE_ENV, raising=False)
    draft = _drafter(tmp_path, "draft", **fields)
    target = _target(tmp_path, max_position_embeddings=131072)
    diagnosis = doctor.diagnose(draft, target)
    warnings = [w for w in diagnosis.warnings if "drafter context length" in w]
    assert diagnosis.verdict == "OK" and len(warnings) == 1
    assert "2048" in warnings[0] and "131072" in warnings[0]
    assert str(draft / "config.json") in warnings[0]
    assert "--context-length 2048" in warnings[0] and ctx.OVERRIDE_ENV in warnings[0]
    assert diagnosis.stock_sglang["startup"] == "fails"
    assert "Target model's context_length (131072)" in diagnosis.stock_sglang["summary"]
    ctx_len = diagnosis.checks["context_length"]
    assert (ctx_len["drafter"], ctx_len["served_at"]) == (2048, 131072)

    stock, stock_error = _startup(draft, 131072, monkeypatch, stock=True)
    assert stock == "fails" and "(131072)" in stock_error and "(2048)" in stock_error
    with caplog.at_level(logging.WARNING, logger="sglang_ext.plugin"):
        outcome, served = _startup(draft, 131072, monkeypatch, stock=False)
    assert (outcome, served) == ("starts", 131072)
    logged = [r.getMessage() for r in caplog.records if "drafter context length" in r.getMessage()]
    assert logged == [f"sglang_ext: {warnings[0]}"]  # the same sentence, once


def test_drafter_within_the_context_starts_either_way_without_a_warning(
    hooked, tmp_path, monkeypatch
):
    draft = _drafter(tmp_path, "draft", max_position_embeddings=2048)
    target = _target(tmp_path, max_position_embeddings=131072)
    diagnosis = doctor.diagnose(draft, target, context_length=2048)
    assert not [w for w in diagnosis.warnings if "drafter context length" in w]
    assert diagnosis.stock_sglang["startup"] == "starts"
    assert _startup(draft, 2048, monkeypatch, stock=True) == ("starts", 2048)
    assert _startup(draft, 2048, monkeypatch, stock=False) == ("starts", 2048)


def test_context_length_above_the_target_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv(ctx.OVERRIDE_ENV, raising=False)
    draft = _drafter(tmp_path, "draft", max_position_embeddings=4096)
    target = _target(tmp_path, max_position_embeddings=4096)
    diagnosis = doctor.diagnose(draft, target, context_length=8192)
    assert diagnosis.verdict == "ERROR"
    assert "--context-length 8192 is above the target's derived context length 4096" in (
        diagnosis.errors[0]
    )


def test_doctor_cli_takes_context_length(tmp_path, capsys):
    from sglang_ext.cli import main

    draft = _drafter(tmp_path, "draft", max_position_embeddings=2048)
    main(["doctor", str(draft), "--context-length", "4096", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["checks"]["context_length"]["served_at"] == 4096
    assert any("drafter context length 2048" in w for w in report["warnings"])


@pytest.mark.parametrize(
    "config",
    [
        {"max_position_embeddings": 2048},
        {"max_position_embeddings": 4096, "rope_scaling": {"type": "yarn", "factor": 32.0}},
        {"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
         "original_max_position_embeddings": 4096}},
        {"seq_length": 8192, "max_position_embeddings": 2048},
        {},
    ],
)
def test_derived_length_is_sglangs(sglang_env, config):
    from types import SimpleNamespace

    from sglang.srt.configs.model_config import get_context_length

    want = get_context_length(SimpleNamespace(**{"rope_scaling": None, **config}))
    assert ctx.from_mapping(config)[0] == want
