"""`sglang-ext probe-drafter`: the twin computes the drafter's logits negated (speculators' own
forward on both directories), so every draft is the drafter's least likely token; it differs
from the drafter in one tensor only; it never writes over data or touches the source."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from builders import speculators_logits

from sglang_ext.cli import convert as convert_module
from sglang_ext.cli import main
from sglang_ext.cli.probe_drafter import NOTE
from sglang_ext_tools.reference import load_drafter


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


@pytest.fixture
def src(drafter, tmp_path) -> Path:
    directory = tmp_path / "src"
    shutil.copytree(drafter("default")[0], directory)
    return directory


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["probe-drafter", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_twin_computes_the_drafters_logits_negated(src, tmp_path, capsys):
    before = snapshot(src)
    dst = tmp_path / "probe"
    code, out, err = run(capsys, src, dst)
    assert code == 0, err
    assert "norm.weight negated" in out
    assert snapshot(src) == before  # the source is read, never modified
    original = load_drafter(src, attn_implementation="eager")
    twin = load_drafter(dst, attn_implementation="eager")
    hidden_size = original.config.transformer_layer_config.hidden_size
    width = original.fc.weight.shape[1]  # the aux states fc reads, concatenated
    torch.manual_seed(0)
    hidden = torch.randn(16, width)
    ids = torch.randint(0, original.config.transformer_layer_config.vocab_size, (16,))
    a = speculators_logits(original, hidden, ids)
    b = speculators_logits(twin, hidden, ids)
    assert a.shape[-1] == original.lm_head.weight.shape[0] and hidden_size > 0
    torch.testing.assert_close(b, -a)
    # every draft is the token the drafter ranks last, never the one it ranks first
    assert torch.equal(b.argmax(-1), a.argmin(-1))
    assert not torch.equal(b.argmax(-1), a.argmax(-1))


def test_the_twin_differs_in_the_final_norm_alone(src, tmp_path, capsys):
    dst = tmp_path / "probe"
    assert run(capsys, src, dst)[0] == 0
    a, b = tensors(src), tensors(dst)
    assert set(a) == set(b)
    changed = [name for name in a if not torch.equal(a[name], b[name])]
    assert changed == ["norm.weight"]
    assert torch.equal(b["norm.weight"], -a["norm.weight"])
    others = {p.name for p in src.iterdir()} - {p.name for p in src.glob("*.safetensors")}
    for name in others:  # config and the rest: byte for byte
        assert (dst / name).read_bytes() == (src / name).read_bytes()
    note = (dst / NOTE).read_text()
    assert "Do not serve it" in note and json.loads(note[note.index("{") :])["tensor"] == (
        "norm.weight"
    )


def test_an_sglang_format_drafter_gets_its_twin_too(src, tmp_path, target_dir, capsys):
    converted = tmp_path / "converted"
    convert_module.convert(src, converted, target_dir, force=True)
    dst = tmp_path / "probe"
    assert run(capsys, converted, dst)[0] == 0
    a, b = tensors(converted), tensors(dst)
    changed = [name for name in a if not torch.equal(a[name], b[name])]
    assert len(changed) == 1 and changed[0].endswith("norm.weight")
    assert torch.equal(b[changed[0]], -a[changed[0]])


def test_a_non_empty_destination_is_refused_and_kept(src, tmp_path, capsys):
    dst = tmp_path / "busy"
    dst.mkdir()
    (dst / "keep.txt").write_text("user data")
    code, _, err = run(capsys, src, dst)
    assert code == 2 and "not empty" in err
    assert (dst / "keep.txt").read_text() == "user data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "src"]  # no staging left
    code, _, err = run(capsys, src, src / "inside")
    assert code == 2 and "inside the source" in err


def test_a_drafter_without_a_final_norm_is_named(src, tmp_path, capsys):
    from safetensors.torch import save_file

    weights = tensors(src)
    del weights["norm.weight"]
    for path in src.glob("*.safetensors"):
        path.unlink()
    save_file(weights, str(src / "model.safetensors"))
    code, _, err = run(capsys, src, tmp_path / "probe")
    assert code == 1
    assert "exactly one final norm tensor" in err and "found none" in err
    assert not (tmp_path / "probe").exists()
