"""Errors a user can act on, most important first: a config-level cause is one
sentence before the per-tensor lines it explains, sharded checkpoints are read through their
index, NaN/Inf weights are refused, a dtype message says what it found on the tensor at fault,
and a null field is not called missing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from sglang_ext.cli import doctor
from sglang_ext.demo import BUNDLED
from sglang_ext.drafter.checkpoint_files import DrafterLoadError
from sglang_ext.drafter.config_fields import DrafterConfigError
from sglang_ext.drafter.loading import LoadPlan
from sglang_ext.drafter.speculators_format import load_drafter_spec

TARGET = BUNDLED / "target"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def bundled(tmp_path: Path, name: str = "drafter") -> Path:
    """The demo's bundled drafter (1 layer, hidden 32, F16), a copy to edit."""
    return Path(shutil.copytree(BUNDLED / "drafter", tmp_path / name))


def edit_layer_config(directory: Path, **fields) -> Path:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config["transformer_layer_config"].update(fields)
    path.write_text(json.dumps(config))
    return directory


def shard(directory: Path, duplicate: str | None = None) -> dict[str, str]:
    """Split model.safetensors into two shards and a model.safetensors.index.json, as
    save_pretrained does; `duplicate` is written into both shards."""
    tensors = load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    names = sorted(tensors)
    parts = {SHARDS[0]: names[:8], SHARDS[1]: names[8:]}
    weight_map = {}
    for file, keys in parts.items():
        keys = sorted(set(keys) | ({duplicate} if duplicate else set()))
        save_file({k: tensors[k] for k in keys}, directory / file)
        weight_map.update(dict.fromkeys(keys, file))
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return weight_map


def test_more_declared_layers_than_the_checkpoint_holds_is_one_sentence(tmp_path):
    directory = edit_layer_config(
        bundled(tmp_path), num_hidden_layers=36, layer_types=["sliding_attention"] * 36
    )
    diagnosis = doctor.diagnose(directory, TARGET)
    assert diagnosis.errors == [
        f"{directory}/config.json declares 36 draft layer(s) "
        "(transformer_layer_config.num_hidden_layers) but the checkpoint holds weights for 1 "
        "(layer 0): the 315 parameter(s) of layers 1-35 have no tensor; set "
        "num_hidden_layers to 1, or use the checkpoint trained with 36 layers"
    ]
    # the per-tensor entries stay in the report, for --json readers
    assert diagnosis.to_json()["tensor_counts"]["missing"] == 315


def test_an_absurd_hidden_size_names_the_root_cause_first(tmp_path):
    directory = edit_layer_config(bundled(tmp_path), hidden_size=100000)
    errors = doctor.diagnose(directory, TARGET).errors
    assert errors[0].startswith(
        f"{directory}/config.json says transformer_layer_config.hidden_size 100000, but the "
        "checkpoint's tensors are 32 wide (norm.weight [32] F16)"
    ), errors
    assert "the target's hidden_size is 32" in errors[1], errors
    assert len(errors) == 2, errors  # no 14 shape lines, no 14 "missing" twins of them


def test_a_refused_tensor_is_not_also_missing(tmp_path):
    directory = bundled(tmp_path)
    tensors = load_file(directory / "model.safetensors")
    tensors["fc.weight"] = tensors["fc.weight"].astype(np.float64)
    save_file(tensors, directory / "model.safetensors")
    errors = doctor.diagnose(directory, TARGET).errors
    assert errors == [
        "fc.weight: dtype mismatch (expected [32, 96] F32/F16/BF16, found [32, 96] F64): found "
        "F64 (double precision) weights; cast them to F32, F16 or BF16"
    ]


def test_an_unknown_dtype_is_reported_on_its_own_tensor(tmp_path):
    directory = bundled(tmp_path)
    path = directory / "model.safetensors"
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    header["fc.weight"]["dtype"] = "Q9"
    text = json.dumps(header, separators=(",", ":")).encode().ljust(size)
    assert len(text) == size
    path.write_bytes(raw[:8] + text + raw[8 + size :])
    (error,) = doctor.diagnose(directory, TARGET).errors
    assert "tensor 'fc.weight': dtype 'Q9' is not a safetensors dtype" in error, error
    assert "d2t" not in error


def test_nan_weights_are_refused_naming_tensor_and_count(tmp_path):
    directory = bundled(tmp_path)
    tensors = load_file(directory / "model.safetensors")
    tensors["fc.weight"][0, :3] = np.nan
    tensors["layers.0.mlp.down_proj.weight"][2, 7] = -np.inf
    save_file(tensors, directory / "model.safetensors")
    diagnosis = doctor.diagnose(directory, TARGET)
    assert diagnosis.verdict == "ERROR"
    assert diagnosis.errors == [
        "fc.weight: non-finite values (expected finite values, found 3 of 3072 values NaN or "
        "Inf): a drafter with NaN/Inf weights cannot propose tokens; retrain or re-export it",
        "layers.0.mlp.down_proj.weight: non-finite values (expected finite values, found 1 of "
        "2048 values NaN or Inf): a drafter with NaN/Inf weights cannot propose tokens; "
        "retrain or re-export it",
    ]


def test_a_sharded_checkpoint_is_read_through_its_index(tmp_path):
    directory = bundled(tmp_path)
    shard(directory)
    assert doctor.diagnose(directory, TARGET).verdict == "OK"


def test_a_missing_shard_is_named(tmp_path):
    directory = bundled(tmp_path)
    weight_map = shard(directory)
    (directory / SHARDS[1]).unlink()
    held = sorted(k for k, v in weight_map.items() if v == SHARDS[1])
    (error,) = doctor.diagnose(directory, TARGET).errors
    assert (
        "model.safetensors.index.json names 1 shard(s) that are missing" in error
        and f"shard {SHARDS[1]} is not in {directory} ({len(held)} tensor(s), e.g. {held[0]!r})"
        in error
    ), error
    # the server's drafter class builds the same plan before SGLang reads any weight
    with pytest.raises(DrafterLoadError, match=f"shard {SHARDS[1]} is not in"):
        LoadPlan(load_drafter_spec(directory))


def test_a_tensor_in_two_shards_names_both(tmp_path):
    directory = bundled(tmp_path)
    shard(directory, duplicate="norm.weight")
    (error,) = doctor.diagnose(directory, TARGET).errors
    assert f"tensor 'norm.weight' is in 2 files ({SHARDS[0]}, {SHARDS[1]})" in error, error


def test_null_is_not_missing(tmp_path):
    directory = bundled(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "transformer_layer_config": None}))
    (error,) = doctor.diagnose(directory).errors
    assert error.endswith("required field 'transformer_layer_config' is null; expected dict")
    del config["transformer_layer_config"]
    (directory / "config.json").write_text(json.dumps(config))
    (error,) = doctor.diagnose(directory).errors
    assert error.endswith("required field 'transformer_layer_config' is missing")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_nonfinite_values_are_counted_across_read_chunks(tmp_path, monkeypatch, dtype):
    import torch
    from safetensors.torch import save_file as save_torch

    from sglang_ext.drafter import checkpoint_files
    from sglang_ext.drafter.checkpoint_files import nonfinite_count, read_checkpoint

    monkeypatch.setattr(checkpoint_files, "_CHUNK", 5)
    values = torch.ones(23, dtype=getattr(torch, dtype))
    for index, value in ((0, "nan"), (4, "inf"), (5, "-inf"), (11, "nan")):  # chunks 0, 0, 1, 2
        values[index] = float(value)
    save_torch({"a": torch.zeros(3), "w": values}, str(tmp_path / "model.safetensors"))
    tensors = {t.name: t for t in read_checkpoint(tmp_path)}
    assert nonfinite_count(tmp_path, tensors["w"]) == 4
    assert nonfinite_count(tmp_path, tensors["a"]) == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("head_dim", 0, "field 'head_dim' must be > 0, found 0"),
        ("num_key_value_heads", 0, "field 'num_key_value_heads' must be > 0, found 0"),
        ("num_key_value_heads", 3, "field 'num_key_value_heads' must divide"),
        ("hidden_size", -32, "field 'hidden_size' must be > 0, found -32"),
        ("num_hidden_layers", 0, "field 'num_hidden_layers' must be > 0, found 0"),
        ("vocab_size", 0, "field 'vocab_size' must be > 0, found 0"),
    ],
)
def test_a_size_of_zero_is_refused_by_field_not_replaced(tmp_path, field, value, message):
    """A 0 where a size belongs used to fall back to a default through ``or`` (head_dim 0 became
    hidden/heads, and convert wrote that out): it is the field's mistake, named."""
    directory = edit_layer_config(bundled(tmp_path), **{field: value})
    with pytest.raises(DrafterConfigError, match=message):
        load_drafter_spec(directory)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"draft_vocab_size": 0}, "field 'draft_vocab_size' must be > 0, found 0"),
        ({"dtype": "banana"}, "field 'dtype' must be one of"),
        ({"torch_dtype": 16}, "field 'torch_dtype' must be one of"),
    ],
)
def test_a_speculators_config_value_that_cannot_be_is_named(tmp_path, fields, message):
    directory = bundled(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config.pop("dtype", None)
    (directory / "config.json").write_text(json.dumps(config | fields))
    with pytest.raises(DrafterConfigError, match=message):
        load_drafter_spec(directory)


def _sglang_config(tmp_path: Path, **fields) -> Path:
    """An SGLang-format EAGLE-3 config (no weights: the spec is read from the config alone)."""
    directory = tmp_path / "sgl"
    directory.mkdir()
    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128,
              "vocab_size": 256, "draft_vocab_size": 128}  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config | fields))
    return directory


@pytest.mark.parametrize(
    "fields",
    [{"norm_output": "false"}, {"tie_word_embeddings": "false"}, {"fc_norm": 0},
     {"norm_before_fc": "false"}, {"eagle_config": {"use_aux_hidden_state": "false"}},
     {"eagle_config": {"norm_before_fc": "no"}}],
)  # fmt: skip
def test_an_sglang_flag_that_is_not_true_or_false_is_refused(tmp_path, fields):
    """bool("false") is True: a quoted flag used to read as set, and doctor said OK."""
    directory = _sglang_config(tmp_path, **fields)
    with pytest.raises(DrafterConfigError, match="must be true/false, found"):
        load_drafter_spec(directory)


def test_sglang_flags_as_published_read_as_written(tmp_path):
    eagle = {"use_aux_hidden_state": False, "norm_before_fc": True}
    spec = load_drafter_spec(_sglang_config(
        tmp_path, norm_output=True, tie_word_embeddings=False, eagle_config=eagle,
        torch_dtype="bfloat16",
    ))  # fmt: skip
    assert spec.norm_output and not spec.tie_word_embeddings
    assert not spec.use_aux_hidden_state and spec.norm_before_fc and spec.dtype == "bfloat16"
    with pytest.raises(DrafterConfigError, match="num_aux_hidden_states' must be > 0"):
        (tmp_path / "zero").mkdir()
        load_drafter_spec(_sglang_config(tmp_path / "zero", num_aux_hidden_states=0))
