"""Strict loading and doctor on good and bad checkpoints: what doctor predicts is what the
server's load_weights does, because both drive sglang_ext.drafter.loading.LoadPlan."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_ext.cli import doctor
from sglang_ext.drafter.checkpoint_files import DrafterLoadError, read_checkpoint, weight_files
from sglang_ext.drafter.speculators_format import load_drafter_spec, to_sglang_config


def mutate(directory: Path, tmp_path: Path, edit) -> Path:
    out = tmp_path / "mutated"
    shutil.copytree(directory, out)
    tensors = load_file(str(out / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(out / "model.safetensors"))
    return out


def server_load(directory: Path):
    """The plugin drafter built by SGLang's classes and loaded the way SGLang's loader feeds
    it: (name, tensor) pairs from the safetensors files."""
    from sglang_ext.models.llama_eagle3 import Eagle3DraftModel

    model = Eagle3DraftModel(to_sglang_config(load_drafter_spec(directory)))
    weights = (item for path in weight_files(directory) for item in load_file(str(path)).items())
    model.load_weights(weights)
    return model


def test_good_drafter_doctor_ok_zero_missing_unexpected(drafter, target_dir):
    diagnosis = doctor.diagnose(drafter("default")[0], target_dir)
    report = diagnosis.to_json()
    assert report["verdict"] == "OK", report["errors"]
    statuses = {entry["status"] for entry in report["tensors"]}
    assert statuses <= {"loaded", "ignored", "derived"}
    assert report["tensor_counts"]["loaded"] == 15
    assert report["aux_layers"]["captured_layers"] == [1, 3, 4]
    assert report["aux_layers"]["sglang_ids"] == [0, 2, 3]
    assert report["stock_sglang"]["startup"] == "fails"
    for key in ("format", "verdict", "errors", "warnings", "tensors", "aux_layers", "stock_sglang"):
        assert key in report


@pytest.mark.parametrize(
    "name",
    ["three_layers", "qwen3", "no_d2t", "fc_norm", "own_embeddings", "small_window", "norms_off"],
)
def test_every_variant_loads_with_nothing_left_random(sglang_env, drafter, name):
    directory, reference = drafter(name)
    model = server_load(directory)
    report = model.load_report
    assert report.errors == []
    loaded = {e.param for e in report.entries if e.status == "loaded"}
    derived = {e.param for e in report.entries if e.status == "derived"}
    parameters = {n for n, _ in model.named_parameters()}
    assert (loaded - {"hot_token_id"}) | derived == parameters
    assert ("hot_token_id" in loaded) == (model.hot_token_id is not None)
    assert doctor.diagnose(directory).to_json()["tensor_counts"] == _counts(report)


def _counts(report):
    counts = {}
    for entry in report.entries:
        counts[entry.status] = counts.get(entry.status, 0) + 1
    return counts


BAD = {
    "missing": (
        lambda t: t.pop("layers.0.hidden_norm.weight"),
        "model.layers.0.hidden_norm.weight: missing",
    ),
    "missing_shard": (
        lambda t: t.pop("layers.0.self_attn.v_proj.weight"),
        "qkv_proj.weight[shard v]: missing",
    ),
    "extra": (
        lambda t: t.update({"layers.0.self_attn.rotary.inv_freq": torch.zeros(8)}),
        "layers.0.self_attn.rotary.inv_freq: unexpected tensor",
    ),
    "extra_layer": (
        lambda t: t.update({"layers.1.mlp.down_proj.weight": torch.zeros(64, 128)}),
        "config has 1 draft layer",
    ),
    "shape": (
        lambda t: t.update({"fc.weight": torch.zeros(64, 128)}),
        "fc.weight: shape mismatch (expected [64, 192], found [64, 128] F32)",
    ),
    "dtype": (
        lambda t: t.update({"d2t": t["d2t"].float()}),
        "d2t: dtype mismatch (expected [128] I64, found [128] F32)",
    ),
    "int_weight": (
        lambda t: t.update({"norm.weight": t["norm.weight"].to(torch.int32)}),
        "norm.weight: dtype mismatch",
    ),
    "no_d2t": (lambda t: t.pop("d2t"), "d2t: missing"),
    # NaN/Inf once passed with verdict OK; F64 was called "quantized or integer".
    "nan": (
        lambda t: t["fc.weight"][0, :3].fill_(float("nan")),
        "fc.weight: non-finite values (expected finite values, found 3 of 12288 values NaN or Inf)",
    ),
    "inf_bf16": (
        lambda t: t.update({"norm.weight": t["norm.weight"].bfloat16().index_fill(
            0, torch.tensor([1, 5]), float("inf"))}),
        "norm.weight: non-finite values (expected finite values, found 2 of 64 values",
    ),
    "f64": (
        lambda t: t.update({"fc.weight": t["fc.weight"].double()}),
        "fc.weight: dtype mismatch (expected [64, 192] F32/F16/BF16, found [64, 192] F64): "
        "found F64 (double precision) weights; cast them to F32, F16 or BF16",
    ),
}


def test_weights_for_more_layers_than_declared_name_the_cause_first(drafter, tmp_path):
    edit, _ = BAD["extra_layer"]
    directory = mutate(drafter("default")[0], tmp_path, edit)
    errors = doctor.diagnose(directory).errors
    assert errors[0] == (
        f"{directory}/config.json declares 1 draft layer(s) "
        "(transformer_layer_config.num_hidden_layers) but the checkpoint holds weights for 2 "
        "(layers 0-1): the 1 checkpoint tensor(s) of layer 1 have no parameter to load into; set "
        "num_hidden_layers to 2, or use the checkpoint trained with 1 layers"
    )
    assert "layers.1.mlp.down_proj.weight: unexpected tensor" in errors[1]


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoint_fails_server_load_and_doctor_alike(sglang_env, drafter, tmp_path, case):
    edit, message = BAD[case]
    directory = mutate(drafter("default")[0], tmp_path, edit)
    diagnosis = doctor.diagnose(directory)
    assert diagnosis.verdict == "ERROR"
    assert any(message in e for e in diagnosis.errors), diagnosis.errors
    with pytest.raises(DrafterLoadError) as info:
        server_load(directory)
    assert message in str(info.value)
    assert "refusing to serve a partly random drafter" in str(info.value)


def test_truncated_safetensors(drafter, tmp_path):
    directory = mutate(drafter("default")[0], tmp_path, lambda t: None)
    path = directory / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(DrafterLoadError, match=r"truncated safetensors file: tensors need \d+"):
        read_checkpoint(directory)
    assert "truncated" in " ".join(doctor.diagnose(directory).errors)
    path.write_bytes(data[:5])
    with pytest.raises(DrafterLoadError, match="no header"):
        read_checkpoint(directory)


def test_pickle_only_drafter_is_read_with_the_safe_loader(drafter, tmp_path):
    """As SGLang reads it (torch.load weights_only=True)."""
    directory = tmp_path / "pickled"
    shutil.copytree(drafter("default")[0], directory)
    tensors = load_file(str(directory / "model.safetensors"))
    (directory / "model.safetensors").unlink()
    torch.save(tensors, directory / "pytorch_model.bin")
    assert [p.name for p in weight_files(directory)] == ["pytorch_model.bin"]
    assert {t.name for t in read_checkpoint(directory)} == set(tensors)
    assert doctor.diagnose(directory).verdict == "OK"


def test_pickle_like_files_sglang_never_loads_are_named(drafter, tmp_path):
    directory = tmp_path / "pth"
    shutil.copytree(drafter("default")[0], directory)
    (directory / "model.safetensors").rename(directory / "model.pth")
    with pytest.raises(DrafterLoadError, match=r"no weight files SGLang loads .*model\.pth"):
        weight_files(directory)


def test_d2t_t2d_disagreement(drafter, tmp_path):
    def flip(t):
        t2d = t["t2d"].clone()
        first_false = int((~t2d).nonzero()[0])
        t2d[first_false] = True
        t["t2d"] = t2d

    directory = mutate(drafter("default")[0], tmp_path, flip)
    assert any("d2t and t2d disagree" in e for e in doctor.diagnose(directory).errors)


def test_parameter_table_must_match_sglangs_model(sglang_env, drafter):
    from sglang_ext.drafter.loading import LoadPlan

    plan = LoadPlan(load_drafter_spec(drafter("default")[0]))
    names = list(plan.params) + ["model.layers.0.self_attn.new_param"]
    with pytest.raises(DrafterLoadError, match="not accounted for"):
        plan.check_model_parameters(names)


def test_doctor_cli_json_exit_codes(drafter, target_dir, tmp_path, capsys):
    from sglang_ext.cli import main

    assert main(["doctor", str(drafter("default")[0]), "--target", str(target_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "OK"
    bad = mutate(drafter("default")[0], tmp_path, BAD["missing"][0])
    assert main(["doctor", str(bad), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "ERROR"


def test_one_plan_per_drafter_and_a_second_load_is_counted_afresh(sglang_env, drafter):
    """The plan the constructor checks the parameters with is the one every load runs
    through; a second load (SGLang reloads weights in place) starts a new account instead of
    finding every tensor "twice"."""
    from sglang_ext.models.llama_eagle3 import Eagle3DraftModel

    directory = drafter("default")[0]
    model = Eagle3DraftModel(to_sglang_config(load_drafter_spec(directory)))
    plan = model.load_plan
    for _ in range(2):
        model.load_weights(load_file(str(weight_files(directory)[0])).items())
        assert model.load_plan is plan
        assert model.load_report.count("loaded") == 15
        assert not [e for e in model.load_report.entries if e.status == "unexpected"]
