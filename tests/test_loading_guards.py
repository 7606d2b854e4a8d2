"""What sglang_ext.drafter.loading promises holds on the server's path, not only in doctor:
attention/MLP biases are refused by name, d2t is checked against t2d at startup, and no
drafter directory of either format is unpickled except by PyTorch's weights_only loader."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_ext import plugin
from sglang_ext.cli import doctor
from sglang_ext.drafter.checkpoint_files import DrafterLoadError
from sglang_ext.drafter.config_fields import DrafterConfigError
from sglang_ext.drafter.loading import LoadPlan
from sglang_ext.drafter.speculators_format import load_drafter_spec


def copy_of(directory: Path, tmp_path: Path, name: str = "drafter") -> Path:
    out = tmp_path / name
    shutil.copytree(directory, out)
    return out


def edit_config(directory: Path, edit) -> None:
    config = json.loads((directory / "config.json").read_text())
    edit(config)
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def edit_tensors(directory: Path, edit) -> None:
    tensors = load_file(str(directory / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"))


# -- attention_bias / mlp_bias -----------------------------------------------------------------


@pytest.mark.parametrize("field", ["attention_bias", "mlp_bias"])
def test_biased_speculators_drafter_is_refused_by_field(drafter, tmp_path, field):
    directory = copy_of(drafter("default")[0], tmp_path)
    edit_config(directory, lambda c: c["transformer_layer_config"].update({field: True}))
    projections = (
        ("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj"))
        if field == "attention_bias"
        else ("mlp", ("gate_proj", "up_proj", "down_proj"))
    )

    def add_biases(tensors):  # what speculators saves for a biased layer
        module, names = projections
        for name in names:
            weight = tensors[f"layers.0.{module}.{name}.weight"]
            tensors[f"layers.0.{module}.{name}.bias"] = torch.zeros(weight.shape[0])

    edit_tensors(directory, add_biases)
    errors = doctor.diagnose(directory).errors
    assert len(errors) == 1, errors
    assert f"transformer_layer_config: {field} is true" in errors[0]
    assert f"expected {field} false, found true" in errors[0]
    assert "unexpected tensor" not in errors[0]
    with pytest.raises(DrafterConfigError, match=f"{field} is true"):  # the server's startup
        plugin._translated(str(directory), 0.0)


def test_biased_sglang_format_drafter_is_refused_by_field(drafter, tmp_path, target_dir):
    from sglang_ext.cli.convert import convert

    directory = tmp_path / "sglang"
    convert(drafter("norms_off")[0], directory, target_dir)
    edit_config(directory, lambda c: c.update(attention_bias=True))
    with pytest.raises(DrafterConfigError, match=r"config.json: attention_bias is true"):
        load_drafter_spec(directory)


# -- d2t checked against t2d where the server starts ------------------------------------------


def _flip_one_t2d_entry(tensors):
    t2d = tensors["t2d"].clone()
    t2d[int((~t2d).nonzero()[0])] = True
    tensors["t2d"] = t2d


def test_server_startup_checks_d2t_against_t2d(drafter, tmp_path):
    directory = copy_of(drafter("default")[0], tmp_path)
    edit_tensors(directory, _flip_one_t2d_entry)
    with pytest.raises(DrafterLoadError, match="d2t and t2d disagree"):
        plugin._translated(str(directory), 0.0)
    errors = doctor.diagnose(directory).errors
    assert sum("d2t and t2d disagree" in e for e in errors) == 1, errors


def test_d2t_outside_the_target_vocabulary_fails_startup(drafter, tmp_path):
    directory = copy_of(drafter("default")[0], tmp_path)
    edit_tensors(directory, lambda t: t["d2t"].__setitem__(-1, 10_000))
    with pytest.raises(DrafterLoadError, match="d2t: .*outside the target vocabulary"):
        plugin._translated(str(directory), 0.0)


def test_agreeing_d2t_and_t2d_pass(drafter, target_dir):
    diagnosis = doctor.diagnose(drafter("default")[0], target_dir)
    assert diagnosis.verdict == "OK"
    assert diagnosis.checks["vocab_mapping"] == "d2t and t2d agree"


# -- pickles: read with the safe loader only, either format ----------------------------------


def _pickled_sglang_drafter(drafter, tmp_path, target_dir) -> Path:
    from sglang_ext.cli.convert import convert

    directory = tmp_path / "sglang"
    convert(drafter("norms_off")[0], directory, target_dir)
    tensors = load_file(str(directory / "model.safetensors"))
    (directory / "model.safetensors").unlink()
    torch.save(tensors, directory / "pytorch_model.bin")
    return directory


def test_pickle_only_sglang_format_drafter_is_only_read_with_the_safe_loader(
    sglang_env, drafter, tmp_path, target_dir, monkeypatch
):
    """SGLang's loader builds the model class, then feeds it .bin weights it torch.loads with
    weights_only=True; the plugin's class reads them first, the same way and only that way."""
    from transformers import AutoConfig

    from sglang_ext.models.llama_eagle3 import LlamaForCausalLMEagle3

    directory = _pickled_sglang_drafter(drafter, tmp_path, target_dir)
    config = AutoConfig.from_pretrained(str(directory))  # what SGLang's get_config returns
    calls = []
    real_load = torch.load

    def recording_load(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    LlamaForCausalLMEagle3(config)
    LoadPlan(load_drafter_spec(directory))
    assert calls and all(flag is True for flag in calls)
    assert doctor.diagnose(directory).verdict == "OK"


# -- quantized serving: what a quantization method adds is SGLang's, not the checkpoint's ------


def test_fp8_served_drafter_passes_the_parameter_table(sglang_env, drafter, tmp_path, target_dir):
    """`--speculative-draft-model-quantization fp8` builds the drafter with SGLang's online
    Fp8Config, whose attention adds k_scale / v_scale (defaults, `_skip_weight_check`). The
    H200 run of 2026-12-03 died at startup on them ("not accounted for ...k_scale")."""
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from transformers import AutoConfig

    from sglang_ext.cli.convert import convert
    from sglang_ext.models.llama_eagle3 import LlamaForCausalLMEagle3

    directory = tmp_path / "sglang"
    convert(drafter("norms_off")[0], directory, target_dir)
    config = AutoConfig.from_pretrained(str(directory))
    model = LlamaForCausalLMEagle3(config, quant_config=Fp8Config())
    scales = [n for n, p in model.named_parameters() if n.endswith(("k_scale", "v_scale"))]
    assert scales  # the fp8 method did add them, so the check above saw them and let them be

    tensors = load_file(str(directory / "model.safetensors"))
    model.load_weights(tensors.items())  # the checkpoint loads in full, scales aside
    assert not model.load_report.errors
    (fc_name,) = [n for n in tensors if n.endswith("fc.weight")]
    fc = dict(model.named_parameters())["model.fc.weight"]
    assert torch.equal(fc, tensors[fc_name].to(fc.dtype))

    plan = LoadPlan(load_drafter_spec(directory))
    names = [n for n, _ in model.named_parameters()]
    with pytest.raises(DrafterLoadError, match="k_scale"):
        plan.check_model_parameters(names)  # a parameter without the mark is still refused
