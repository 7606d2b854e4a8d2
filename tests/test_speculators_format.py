"""The typed drafter config, its translation for SGLang, the key table, aux-id conventions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ext.drafter.aux_capture import (
    TargetInfo,
    captured_layers_from_sglang_ids,
    sglang_ids_for_capture,
)
from sglang_ext.drafter.config_fields import DrafterConfigError
from sglang_ext.drafter.key_table import route
from sglang_ext.drafter.speculators_format import (
    load_drafter_spec,
    sglang_config_dict,
    to_sglang_config,
)


def edit_config(directory: Path, tmp_path: Path, **changes) -> Path:
    """A copy of a drafter directory with config.json fields changed (None deletes)."""
    import shutil

    out = tmp_path / "edited"
    shutil.copytree(directory, out)
    config = json.loads((out / "config.json").read_text())
    for key, value in changes.items():
        node = config
        *parents, leaf = key.split(".")
        for parent in parents:
            node = node[parent]
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_speculators_config_is_read_with_its_own_defaults(drafter):
    directory, model = drafter("default")
    spec = load_drafter_spec(directory)
    assert spec.format == "speculators" and spec.architecture == "Eagle3DraftModel"
    assert (spec.hidden_size, spec.num_hidden_layers, spec.vocab_size) == (64, 1, 256)
    assert spec.draft_vocab_size == 128 and spec.has_vocab_mapping
    assert spec.aux_hidden_state_layer_ids == (1, 3, 4)
    assert spec.norm_before_residual and spec.norm_before_fc and spec.norm_output
    assert spec.layer_types == ("sliding_attention",) and spec.sliding_window == 2048
    assert spec.sglang_window_size() == 2047
    assert spec.expected_target_feature_width == 3 * 64


def test_qwen3_and_multilayer_variants(drafter):
    assert load_drafter_spec(drafter("qwen3")[0]).layer_type == "qwen3"
    three = load_drafter_spec(drafter("three_layers")[0])
    assert three.num_hidden_layers == 3 and three.sliding_layers == (0, 1, 2)
    assert load_drafter_spec(drafter("full_attention")[0]).sglang_window_size() is None


def test_translation_hides_swa_keys_and_keeps_aux_convention(drafter):
    spec = load_drafter_spec(drafter("default")[0])
    config = sglang_config_dict(spec)
    assert "model_type" in config and config["model_type"] == "llama"
    assert "layer_types" not in config and "sliding_window" not in config
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert config["eagle_config"]["aux_id_convention"] == "speculators"
    assert config["num_aux_hidden_states"] == 3 and config["draft_vocab_size"] == 128
    hf = to_sglang_config(spec)
    assert hf.architectures == ["Eagle3DraftModel"] and hf.model_type == "llama"
    assert hf.norm_before_fc is True and hf.sglang_ext_spec["norm_before_residual"] is True


@pytest.mark.parametrize(
    "change, message",
    [
        ({"transformer_layer_config": None}, "required field 'transformer_layer_config'"),
        ({"draft_vocab_size": None}, "required field 'draft_vocab_size'"),
        ({"transformer_layer_config.hidden_size": None}, "'hidden_size' is missing"),
        ({"speculators_model_type": "dflash"}, "only 'eagle3'"),
        ({"transformer_layer_config.model_type": "mistral"}, "not supported"),
        ({"norm_before_fc": True, "fc_norm": True}, "mutually exclusive"),
        ({"eagle_aux_hidden_state_layer_ids": "1,2,3"}, "list of integers"),
        ({"norm_before_residual": "yes"}, "must be true/false"),
        ({"draft_vocab_size": 4096}, "exceeds the vocab_size"),
        ({"transformer_layer_config.sliding_window": None}, "sliding_window is None"),
    ],
)
def test_bad_configs_name_the_field(drafter, tmp_path, change, message):
    directory = edit_config(drafter("default")[0], tmp_path, **change)
    with pytest.raises(DrafterConfigError, match=message) as info:
        load_drafter_spec(directory)
    assert "config.json" in str(info.value)


def test_config_py_is_never_imported(drafter, tmp_path):
    """speculators writes config.py (auto_map) next to config.json; reading the drafter must
    not execute it, whatever it contains."""
    directory = edit_config(drafter("default")[0], tmp_path)
    marker = tmp_path / "imported"
    (directory / "config.py").write_text(f"open({str(marker)!r}, 'w').write('side effect')\n")
    from sglang_ext.cli import doctor

    spec = load_drafter_spec(directory)
    to_sglang_config(spec)
    assert doctor.diagnose(directory).verdict == "OK"
    assert not marker.exists()


def test_key_table_routes_speculators_names():
    assert route("layers.0.self_attn.q_proj.weight", "speculators")[:2] == (
        "model.layers.0.self_attn.qkv_proj.weight",
        "q",
    )
    assert route("layers.0.mlp.up_proj.weight", "speculators")[:2] == (
        "model.layers.0.mlp.gate_up_proj.weight",
        1,
    )
    assert route("layers.0.input_layernorm.weight", "speculators")[0] == (
        "model.layers.0.input_layernorm.weight"
    )
    # layers >= 1: speculators' input_layernorm is SGLang's hidden_norm
    assert route("layers.2.input_layernorm.weight", "speculators")[0] == (
        "model.layers.2.hidden_norm.weight"
    )
    assert route("layers.2.hidden_norm.weight", "speculators") is None
    assert route("fc_norm.1.weight", "speculators")[0] == "model.fc_norm.1.weight"
    assert route("some.other.weight", "speculators") is None


def test_key_table_reads_sglang_dialects():
    assert route("midlayer.self_attn.k_proj.weight", "sglang")[:2] == (
        "model.layers.0.self_attn.qkv_proj.weight",
        "k",
    )
    assert route("model.layers.0.hidden_norm.weight", "sglang")[0] == (
        "model.layers.0.hidden_norm.weight"
    )
    assert route("aux_norm_mid.weight", "sglang")[0] == "model.fc_norm.1.weight"


def llama_target(tmp_path, layers=6, model_type="llama"):
    from sglang_ext.demo import write_target

    return TargetInfo.from_path(
        write_target(tmp_path / f"t{layers}{model_type}", layers=layers, model_type=model_type)
    )


def test_aux_ids_convert_per_target_class():
    # llama/qwen: layers_to_capture = id + 1, so id = k - 1
    assert sglang_ids_for_capture([1, 3, 4], "plus_one") == [0, 2, 3]
    assert captured_layers_from_sglang_ids([0, 2, 3], "plus_one", 6) == [1, 3, 4]
    # deepseek_v2: +1 only when the first id is 1
    for captured in ([2, 4, 5], [3, 5, 7], [0, 2, 3]):
        ids = sglang_ids_for_capture(captured, "plus_one_if_first_is_one")
        assert captured_layers_from_sglang_ids(ids, "plus_one_if_first_is_one", 8) == captured
    with pytest.raises(DrafterConfigError, match="not expressible"):
        sglang_ids_for_capture([1, 3, 5], "plus_one_if_first_is_one")


def test_capture_problems_against_a_target(drafter, tmp_path):
    spec = load_drafter_spec(drafter("default")[0])
    assert spec.target_problems(llama_target(tmp_path)) == []
    # a 4-layer target: aux id 4 is the final state, which SGLang cannot capture
    problems = " ".join(spec.target_problems(llama_target(tmp_path, layers=4)))
    assert "outside the target's 4 decoder layers" in problems
    assert "final hidden state" in problems


def test_default_ids_collapse_on_small_targets(tmp_path):
    """SGLang's default [2, L//2, L-3] on a 4-layer target captures 2 distinct layers."""
    from sglang_ext.drafter.aux_capture import check_capture, sglang_default_capture

    captured = sglang_default_capture(4)
    assert captured == [2, 2, 1]
    assert any("collapse to 2 distinct layers" in p for p in check_capture(captured, 3, 4, "x"))


def test_hidden_size_and_vocab_mismatch(drafter, tmp_path):
    from sglang_ext.demo import write_target

    spec = load_drafter_spec(drafter("default")[0])
    other = TargetInfo.from_path(write_target(tmp_path / "wide", hidden=128, vocab=300))
    text = " ".join(spec.target_problems(other))
    assert "hidden_size is 128" in text and "trained for another target" in text
    assert "vocab_size is 256 but the target's is 300" in text


def test_multimodal_target_reads_text_config(tmp_path):
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {
            "model_type": "deepseek_v3",
            "num_hidden_layers": 61,
            "hidden_size": 7168,
            "vocab_size": 163840,
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    info = TargetInfo.from_path(tmp_path)
    assert (info.num_hidden_layers, info.hidden_size, info.model_type) == (61, 7168, "deepseek_v3")


def test_hub_ids_resolve_through_the_local_hf_cache(drafter, tmp_path):
    """`--speculative-draft-model-path org/name`: config and safetensors come from the HF cache
    (here a pre-filled cache, offline), like SGLang's own loading of Hub ids."""
    import os
    import shutil
    import subprocess
    import sys

    repo = tmp_path / "hub" / "models--acme--eagle3-drafter"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(drafter("default")[0], snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    code = (
        "import json\n"
        "from sglang_ext.cli import doctor\n"
        "from sglang_ext.drafter.speculators_format import is_speculators_dir, load_drafter_spec\n"
        "spec = load_drafter_spec('acme/eagle3-drafter')\n"
        "print(json.dumps([is_speculators_dir('acme/eagle3-drafter'), spec.source,\n"
        "                  doctor.diagnose('acme/eagle3-drafter').verdict,\n"
        "                  is_speculators_dir('acme/not-cached')]))\n"
    )
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    is_ours, source, verdict, missing = json.loads(out.stdout.strip().splitlines()[-1])
    assert is_ours and source == str(snapshot) and verdict == "OK" and not missing
