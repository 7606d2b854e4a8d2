"""pytorch_model.bin-only drafters: read as SGLang reads them, with
torch.load(weights_only=True), in doctor, convert and the server's startup checks; a pickle that
loader refuses is refused with its reason, and nothing in it runs."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from builders import TINY_SGLANG_DRAFTER_CONFIG
from public_configs import write_sglang_drafter
from safetensors.torch import load_file

from sglang_ext.cli import doctor
from sglang_ext.drafter.checkpoint_files import DrafterLoadError, read_checkpoint, weight_files
from sglang_ext.drafter.loading import LoadPlan
from sglang_ext.drafter.speculators_format import load_drafter_spec

CONFIG = dict(TINY_SGLANG_DRAFTER_CONFIG)


def _pickled(tmp_path, name="pickled", legacy=False):
    directory = write_sglang_drafter(dict(CONFIG), tmp_path / name)
    tensors = load_file(str(directory / "model.safetensors"))
    (directory / "model.safetensors").unlink()
    torch.save(tensors, directory / "pytorch_model.bin",
               _use_new_zipfile_serialization=not legacy)
    return directory, tensors


class _RunsCode:
    """A pickle payload that would create a file if unpickled by the unsafe loader."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _hostile(tmp_path):
    directory = write_sglang_drafter(dict(CONFIG), tmp_path / "hostile")
    tensors = load_file(str(directory / "model.safetensors"))
    (directory / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    tensors["fc.weight"] = _RunsCode(marker)
    torch.save(tensors, directory / "pytorch_model.bin")
    return directory, marker


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_pickle_only_sglang_drafter_reads_as_its_safetensors_twin(tmp_path, legacy):
    directory, tensors = _pickled(tmp_path, legacy=legacy)
    assert [p.name for p in weight_files(directory)] == ["pytorch_model.bin"]
    infos = {t.name: t for t in read_checkpoint(directory)}
    assert set(infos) == set(tensors)
    assert infos["fc.weight"].shape == tuple(tensors["fc.weight"].shape)
    diagnosis = doctor.diagnose(directory)
    assert diagnosis.verdict == "OK", diagnosis.errors
    assert diagnosis.checks["vocab_mapping"] == "d2t and t2d agree"  # values read from the .bin
    assert diagnosis.stock_sglang["startup"] == "starts"
    LoadPlan(load_drafter_spec(directory))  # the server's constructor-time check passes


def test_training_files_are_not_weights_as_in_sglang(tmp_path):
    directory, _ = _pickled(tmp_path)
    torch.save({"lr": 1e-4}, directory / "training_args.bin")
    assert [p.name for p in weight_files(directory)] == ["pytorch_model.bin"]


def test_hostile_pickle_is_refused_with_the_loaders_reason_and_runs_nothing(tmp_path):
    directory, marker = _hostile(tmp_path)
    with pytest.raises(DrafterLoadError) as info:
        read_checkpoint(directory)
    text = str(info.value)
    assert "pytorch_model.bin" in text and "weights_only=True" in text
    assert "system" in text  # the unpickler's reason names the refused global
    assert "weights_only=False" not in text  # never advise the unsafe loader
    diagnosis = doctor.diagnose(directory)
    assert diagnosis.verdict == "ERROR"
    assert diagnosis.stock_sglang["startup"] == "fails"  # agrees with the verdict
    with pytest.raises(DrafterLoadError, match="refuses this file"):
        LoadPlan(load_drafter_spec(directory))
    assert not marker.exists()


def test_non_tensor_pickle_is_refused_by_name(tmp_path):
    directory, tensors = _pickled(tmp_path)
    torch.save({"state_dict": tensors, "step": 3}, directory / "pytorch_model.bin")
    with pytest.raises(DrafterLoadError, match=r"non-tensor entries 'state_dict' \(dict\)"):
        read_checkpoint(directory)


def test_convert_reads_a_pickle_only_speculators_drafter(drafter, tmp_path, target_dir):
    from sglang_ext.cli.convert import convert

    source = tmp_path / "spec"
    shutil.copytree(drafter("norms_off")[0], source)
    tensors = load_file(str(source / "model.safetensors"))
    (source / "model.safetensors").unlink()
    torch.save(tensors, source / "pytorch_model.bin")
    assert doctor.diagnose(source, target_dir).verdict == "OK"
    out = tmp_path / "out"
    convert(source, out, target_dir)
    converted = load_file(str(out / "model.safetensors"))
    assert torch.equal(converted["fc.weight"], tensors["fc.weight"])
    assert json.loads((out / "config.json").read_text())["architectures"]


def test_hostile_pickle_fails_the_speculators_config_hook_and_runs_nothing(
    sglang_env, drafter, tmp_path
):
    from sglang_ext import plugin

    source = tmp_path / "spec"
    shutil.copytree(drafter("default")[0], source)
    tensors = load_file(str(source / "model.safetensors"))
    (source / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    tensors["fc.weight"] = _RunsCode(marker)
    torch.save(tensors, source / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(DrafterLoadError, match="refuses this file"):
        plugin.get_config_hook(lambda *a, **k: None, str(source))
    assert not marker.exists()
