"""scripts/make_mla_fixtures.py at tiny scale on CPU: the deepened MLA + MoE target computes
exactly what the trained one computes, the deep drafter is servable, and the seed's
configuration is what stock SGLang serves silently unfused and the plugin refuses, naming
both widths."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from sglang_ext import doctor

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(
        "make_mla_fixtures", ROOT / "scripts" / "make_mla_fixtures.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mla_script():
    return _load_script()


@pytest.fixture(scope="module")
def mla_fixtures(mla_script, tmp_path_factory):
    out = tmp_path_factory.mktemp("mla")
    argv = ["--stage", "all", "--scale", "tiny", "--device", "cpu", "--out", str(out)]
    assert mla_script.main(argv) == 0
    return out, json.loads((out / "mla-fixtures.json").read_text())["stages"]


def test_deepen_places_layers_and_zeroes_only_residual_writes(mla_script):
    small = {
        "model.embed_tokens.weight": torch.ones(4, 2),
        "model.layers.0.mlp.down_proj.weight": torch.ones(2, 2),
        "model.layers.1.self_attn.o_proj.weight": torch.full((2, 2), 2.0),
        "model.layers.1.self_attn.q_a_proj.weight": torch.full((2, 2), 3.0),
        "model.layers.1.mlp.experts.0.down_proj.weight": torch.full((2, 2), 4.0),
        "model.layers.1.mlp.shared_experts.down_proj.weight": torch.full((2, 2), 5.0),
        "model.layers.1.mlp.gate.weight": torch.full((2, 2), 6.0),
    }
    deep = mla_script.deepen_state_dict(small, 2, (0, 2), 4, template_layer=1)
    assert torch.equal(
        deep["model.layers.2.self_attn.o_proj.weight"],
        small["model.layers.1.self_attn.o_proj.weight"],
    )
    for j in (1, 3):  # identity blocks: residual writes zero, the rest copied
        assert not deep[f"model.layers.{j}.self_attn.o_proj.weight"].any()
        assert not deep[f"model.layers.{j}.mlp.experts.0.down_proj.weight"].any()
        assert not deep[f"model.layers.{j}.mlp.shared_experts.down_proj.weight"].any()
        assert torch.equal(deep[f"model.layers.{j}.mlp.gate.weight"], torch.full((2, 2), 6.0))
        assert torch.equal(
            deep[f"model.layers.{j}.self_attn.q_a_proj.weight"], torch.full((2, 2), 3.0)
        )
    assert (
        "model.layers.0.mlp.down_proj.weight" in deep
        and "model.layers.4.mlp.gate.weight" not in deep
    )
    with pytest.raises(ValueError, match="increasing"):
        mla_script.deepen_state_dict(small, 2, (0, 0), 4, template_layer=1)
    with pytest.raises(ValueError, match="below 4"):
        mla_script.deepen_state_dict(small, 2, (0, 4), 4, template_layer=1)


def test_deep_target_computes_what_the_trained_target_computes(mla_fixtures):
    out, stages = mla_fixtures
    check = stages["deepen"]["function_check"]
    assert check["dtype"] == "float32"
    assert check["max_abs_diff"] == 0.0 and check["top1_agreement"] == 1.0
    config = json.loads((out / "deep-target" / "config.json").read_text())
    assert config["num_hidden_layers"] == 9 and config["model_type"] == "deepseek_v3"
    assert config["q_lora_rank"] and config["kv_lora_rank"] and config["n_routed_experts"] == 4


def test_deep_drafter_is_servable_on_the_deep_target(mla_fixtures, mla_script):
    out, stages = mla_fixtures
    scale = mla_script.TINY
    ids = stages["deepen"]["deep_drafter"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == [scale.placement[k] for k in scale.aux_ids]
    report = doctor.diagnose(out / "deep-drafter", target=out / "deep-target").to_json()
    assert report["verdict"] == "OK", report["errors"]
    assert report["aux_layers"]["captured_layers"] == ids


def test_seed_configuration_stock_skips_fc_plugin_refuses_naming_both_widths(mla_fixtures):
    out, stages = mla_fixtures
    hidden = stages["base"]["small_target"]["hidden_size"]
    config = json.loads((out / "seed-drafter" / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [7]
    assert config["num_aux_hidden_states"] == 3
    report = doctor.diagnose(out / "seed-drafter", target=out / "deep-target").to_json()
    assert report["verdict"] == "ERROR"
    widths = [e for e in report["errors"] if e.startswith("widths:")]
    assert widths and f"{hidden} features" in widths[0] and f"= {3 * hidden}" in widths[0]
    assert "fusion silently skipped" in report["stock_sglang"]["summary"]


def test_served_geometry_fits_sglang_triton_mla_decode(mla_script):
    mla_script.check_served_geometry(mla_script.FULL.target)
    with pytest.raises(SystemExit, match="= 80"):  # the 2026-11-30 fixture's 64 + 16
        mla_script.check_served_geometry({"kv_lora_rank": 64, "qk_rope_head_dim": 16})
