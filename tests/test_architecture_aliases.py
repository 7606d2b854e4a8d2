"""Other projects' names for SGLang's EAGLE-3 layout: vLLM's
Eagle3LlamaForCausalLM (AngelSlim-trained drafters) is read as LlamaForCausalLMEagle3 by doctor
and by the server's get_config, with the key table deciding; unknown EAGLE names are refused
with the rename that would load them."""

from __future__ import annotations

import pytest
from builders import TINY_SGLANG_DRAFTER_CONFIG
from public_configs import write_sglang_drafter
from safetensors.torch import load_file, save_file

from sglang_ext.cli import doctor
from sglang_ext.drafter import architecture_aliases

CONFIG = {k: v for k, v in TINY_SGLANG_DRAFTER_CONFIG.items() if k != "architectures"}


def _drafter(tmp_path, arch):
    return write_sglang_drafter({**CONFIG, "architectures": [arch]}, tmp_path / arch)


@pytest.mark.parametrize("arch", sorted(architecture_aliases.ALIASES))
def test_alias_is_read_as_sglangs_name_by_doctor(tmp_path, arch):
    diagnosis = doctor.diagnose(_drafter(tmp_path, arch))
    assert diagnosis.verdict == "OK", diagnosis.errors
    assert diagnosis.config["architecture"] == "LlamaForCausalLMEagle3"
    assert any(arch in w and "LlamaForCausalLMEagle3" in w for w in diagnosis.warnings)
    assert diagnosis.stock_sglang["startup"] == "fails"
    assert "are not supported" in diagnosis.stock_sglang["summary"]


def test_alias_weights_outside_the_layout_are_named_by_the_key_table(tmp_path):
    directory = _drafter(tmp_path, "Eagle3LlamaForCausalLM")
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["midlayer.self_attn.qkv.weight"] = tensors.pop("midlayer.self_attn.q_proj.weight")
    save_file(tensors, str(directory / "model.safetensors"))
    errors = " ".join(doctor.diagnose(directory).errors)
    assert "midlayer.self_attn.qkv.weight" in errors


@pytest.mark.parametrize(
    "arch, hint",
    [
        ("Eagle3Qwen3vlForCausalLM", "rename it to 'LlamaForCausalLMEagle3'"),
        ("MyEagle3Drafter", "rename it to 'LlamaForCausalLMEagle3'"),
    ],
)
def test_unknown_eagle_names_are_refused_with_the_rename(tmp_path, arch, hint):
    diagnosis = doctor.diagnose(_drafter(tmp_path, arch))
    assert diagnosis.verdict == "ERROR"
    assert hint in diagnosis.errors[0] and arch in diagnosis.errors[0]


def test_server_reads_the_alias_and_builds_the_plugin_class(sglang_env, tmp_path):
    """SGLang's draft ModelConfig (which reads the config through get_config), as the draft
    worker builds it, with the plugin's hooks installed."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_ext import plugin

    plugin.register()
    HookRegistry.apply_hooks()
    directory = _drafter(tmp_path, "Eagle3LlamaForCausalLM")
    config = ModelConfig(model_path=str(directory), is_draft_model=True).hf_config
    assert config.architectures == ["LlamaForCausalLMEagle3"]
    cls, _ = ModelRegistry.resolve_model_cls(config.architectures)
    assert cls.__module__.startswith("sglang_ext.models.")
