"""`sglang-ext probe-drafter`: the twin computes the drafter's logits negated (speculators' own
forward on both directories), so every draft is the drafter's least likely token; it differs
from the drafter in one tensor only; it never writes over data or touches the source."""

from __future__ import annotations

import json
import os
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


# --------------------------------------------------------------------------------------------
# Bad input: one line naming the source file/tensor/field, the exit code doctor gives, nothing
# written at DST (no twin, no staging directory left beside it).


def rewrite(src: Path, change) -> None:
    """Apply `change` to the source drafter's tensors and save them back as model.safetensors."""
    from safetensors.torch import save_file

    weights = tensors(src)
    change(weights)
    for path in src.glob("*.safetensors"):
        path.unlink()
    save_file(weights, str(src / "model.safetensors"))


def refused(capsys, src: Path, tmp_path: Path, code: int = 1) -> str:
    """Run probe-drafter on a bad source: exit `code`, one stderr line, nothing written; returns
    the message after 'sglang-ext probe-drafter: error: '."""
    before = snapshot(src) if src.is_dir() else None
    got, out, err = run(capsys, src, tmp_path / "probe")
    assert got == code, err
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "internal error" not in err and "bug in sglang-ext" not in err
    assert not (tmp_path / "probe").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no staging left either
    if before is not None:
        assert snapshot(src) == before
    prefix = "sglang-ext probe-drafter: error: "
    assert err.startswith(prefix), err
    return err[len(prefix) : -1]


def doctor_errors(capsys, src: Path) -> tuple[int, list[str]]:
    """What `sglang-ext doctor SRC` says: its exit code and its ERROR lines."""
    code = main(["doctor", str(src)])
    out, _ = capsys.readouterr()
    return code, [line[len("ERROR: ") :] for line in out.splitlines() if line.startswith("ERROR: ")]


def _header(data: bytes) -> tuple[int, dict]:
    import struct

    (length,) = struct.unpack("<Q", data[:8])
    return length, json.loads(data[8 : 8 + length])


def _with_header(data: bytes, header: dict) -> bytes:
    import struct

    length, _ = _header(data)
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data[8 + length :]


def _shape_mismatch(data: bytes) -> bytes:
    _, header = _header(data)
    header["norm.weight"]["shape"] = [header["norm.weight"]["shape"][0] - 1]
    return _with_header(data, header)


def _metadata(value):
    def corrupt(data: bytes) -> bytes:
        _, header = _header(data)
        header["__metadata__"] = value
        return _with_header(data, header)

    return corrupt


def _garbage_header(data: bytes) -> bytes:
    length, _ = _header(data)
    return data[:8] + b"\xff" * length + data[8 + length :]


# (case, corruption of model.safetensors's bytes, the message after "<file>: ")
CORRUPT_SAFETENSORS = [
    ("empty", lambda b: b"", lambda b: "truncated safetensors file (0 bytes, no header)"),
    ("7 bytes", lambda b: b[:7], lambda b: "truncated safetensors file (7 bytes, no header)"),
    (
        "truncated",
        lambda b: b[:-100],
        lambda b: (
            f"truncated safetensors file: tensors need {len(b)} bytes, file has {len(b) - 100}"
        ),
    ),
    (
        "truncated header",
        lambda b: b[:20],
        lambda b: (
            f"truncated safetensors file: header says {_header(b)[0]} header bytes, file has 12"
        ),
    ),
    (
        "trailing bytes",
        lambda b: b + b"\0" * 16,
        lambda b: (
            f"corrupt safetensors file: 16 bytes after the last tensor (tensors need "
            f"{len(b)} bytes, file has {len(b) + 16})"
        ),
    ),
    (
        "garbage header",
        _garbage_header,
        lambda b: (
            "corrupt safetensors header ('utf-8' codec can't decode byte 0xff in "
            "position 0: invalid start byte)"
        ),
    ),
    (
        "list header",
        lambda b: (2).to_bytes(8, "little") + b"[]",
        lambda b: "corrupt safetensors header: header is not a JSON object (found list)",
    ),
    (
        "huge header",
        lambda b: (2**63).to_bytes(8, "little") + b[8:],
        lambda b: (
            f"safetensors header of {2**63} bytes exceeds the 100000000 bytes "
            "safetensors accepts; not a valid safetensors file"
        ),
    ),
    (
        "shape/offset mismatch",
        _shape_mismatch,
        lambda b: (
            "corrupt safetensors header: tensor 'norm.weight': shape [63] of F32 needs "
            "252 bytes, data_offsets span 256"
        ),
    ),
    (
        "__metadata__ a list",
        _metadata([1, 2]),
        lambda b: (
            "cannot read tensor 'd2t' (Error while deserializing header: invalid JSON "
            "in header: invalid type: sequence, expected a map"
        ),
    ),
    (
        "__metadata__ value an int",
        _metadata({"format": 5}),
        lambda b: (
            "cannot read tensor 'd2t' (Error while deserializing header: invalid JSON "
            "in header: invalid type: integer `5`, expected a string"
        ),
    ),
]


@pytest.mark.parametrize(
    "corrupt,expected",
    [c[1:] for c in CORRUPT_SAFETENSORS],
    ids=[c[0] for c in CORRUPT_SAFETENSORS],
)
def test_a_corrupt_safetensors_file_is_named_as_doctor_names_it(
    src, tmp_path, capsys, corrupt, expected
):
    weights = src / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(corrupt(data))
    message = refused(capsys, src, tmp_path)
    assert message.startswith(f"{weights}: {expected(data)}"), message
    doctor_code, doctor = doctor_errors(capsys, src)
    assert (doctor_code, doctor) == (1, [message])  # doctor's own sentence, doctor's exit code


@pytest.mark.parametrize(
    "dtype,found", [(torch.bool, "BOOL"), (torch.uint8, "U8"), (torch.int32, "I32")]
)
def test_a_final_norm_that_cannot_be_negated_is_refused(src, tmp_path, capsys, dtype, found):
    norm = tensors(src)["norm.weight"]
    rewrite(src, lambda w: w.__setitem__("norm.weight", (norm * 10).to(dtype)))
    message = refused(capsys, src, tmp_path)
    integer = "integer" if found != "BOOL" else None
    reason = (
        f"found {found} (integer) weights; quantized or integer drafters are not supported"
        if integer
        else f"found {found} weights, which a drafter parameter cannot hold"
    )
    assert message == (
        f"{src / 'model.safetensors'}: norm.weight: dtype mismatch (expected [64] F32/F16/BF16, "
        f"found [64] {found}): {reason}"
    )
    assert doctor_errors(capsys, src) == (1, [message.split(": ", 1)[1]])


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_final_norm_is_refused(src, tmp_path, capsys, value):
    rewrite(src, lambda w: w["norm.weight"].__setitem__(3, value))
    message = refused(capsys, src, tmp_path)
    assert message.startswith(
        f"{src / 'model.safetensors'}: norm.weight: non-finite values (expected finite values, "
        "found 1 of 64 values NaN or Inf)"
    ), message
    assert doctor_errors(capsys, src) == (1, [message.split(": ", 1)[1]])


@pytest.mark.parametrize(
    "dtype,found,bad",
    [("BOOL", "BOOL", 0), ("U8", "U8", 0), ("I32", "I32", 0), ("F32", None, 64)],
)
def test_the_negation_itself_refuses_what_it_cannot_negate(tmp_path, dtype, found, bad):
    """Whatever doctor's rules become, the twin is never a wrapped-around or NaN norm."""
    import numpy as np
    from safetensors.numpy import save_file

    from sglang_ext.cli.probe_drafter import ProbeDrafterError, check_negatable
    from sglang_ext.drafter.checkpoint_files import read_safetensors_header

    numpy_dtype = {"BOOL": np.bool_, "U8": np.uint8, "I32": np.int32, "F32": np.float32}[dtype]
    values = np.ones(64, numpy_dtype) if bad == 0 else np.full(64, np.nan, np.float32)
    path = tmp_path / "model.safetensors"
    save_file({"norm.weight": values}, str(path))
    (norm,) = read_safetensors_header(path)
    with pytest.raises(ProbeDrafterError) as caught:
        check_negatable(path, norm)
    if found:
        assert str(caught.value) == (
            f"{path}: tensor 'norm.weight' is {found}; expected a final norm weight in "
            "BF16/F16/F32 to negate"
        )
    else:
        assert str(caught.value) == (
            f"{path}: tensor 'norm.weight' has 64 of 64 values NaN or Inf; expected finite "
            "values (its negation would propose no least likely token)"
        )


def _set(path: tuple[str, ...], value):
    def change(config: dict) -> None:
        node = config
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


# Drafters doctor marks ERROR: (case, config change, tensor change, the located message)
DOCTOR_ERRORS = [
    (
        "hidden_size 0",
        _set(("transformer_layer_config", "hidden_size"), 0),
        None,
        "{src}/config.json: transformer_layer_config: field 'hidden_size' must be > 0, found 0",
    ),
    (
        "hidden_size -32",
        _set(("transformer_layer_config", "hidden_size"), -32),
        None,
        "{src}/config.json: transformer_layer_config: field 'hidden_size' must be > 0, found -32",
    ),
    (
        "draft_vocab_size 0",
        _set(("draft_vocab_size",), 0),
        None,
        "{src}/config.json: field 'draft_vocab_size' must be > 0, found 0",
    ),
    (
        "d2t float",
        None,
        lambda w: w.__setitem__("d2t", w["d2t"].float()),
        "{src}/model.safetensors: d2t: dtype mismatch (expected [128] I64, found [128] F32): "
        "d2t holds integer offsets (draft id + d2t = target id)",
    ),
    (
        "d2t 2-D",
        None,
        lambda w: w.__setitem__("d2t", w["d2t"].reshape(8, 16)),
        "{src}/model.safetensors: d2t: shape mismatch (expected [128] I64, found [8, 16] I64)",
    ),
    (
        "d2t out of range",
        None,
        lambda w: w.__setitem__("d2t", w["d2t"] + 1000),
        "{src}/model.safetensors: d2t: value mismatch (expected ids in [0, 256), found 128 "
        "outside, e.g. {first}): d2t maps draft ids outside the target vocabulary",
    ),
    (
        "fc.weight wrong shape",
        None,
        lambda w: w.__setitem__("fc.weight", w["fc.weight"][:, :128].contiguous()),
        "{src}/model.safetensors: fc.weight: shape mismatch (expected [64, 192], found "
        "[64, 128] F32)",
    ),
    (
        "t2d disagrees with d2t",
        None,
        lambda w: w.__setitem__("t2d", torch.zeros_like(w["t2d"])),
        "{src}/model.safetensors: t2d: value mismatch (expected the 128 target ids d2t "
        "selects, found 0 marked, 128 differ): d2t and t2d disagree on the draft vocabulary",
    ),
    (
        "an unexpected tensor",
        None,
        lambda w: w.__setitem__("bogus.weight", torch.zeros(3)),
        "{src}/model.safetensors: bogus.weight: unexpected tensor (expected -, found [3] F32): "
        "no parameter of this drafter reads it",
    ),
    (
        "d2t missing",
        None,
        lambda w: w.pop("d2t"),
        "{src}: d2t: missing (expected [128] I64, found -): draft_vocab_size 128 < vocab_size "
        "256 needs the draft->target id map",
    ),
]


@pytest.mark.parametrize(
    "change_config,change_tensors,expected",
    [c[1:] for c in DOCTOR_ERRORS],
    ids=[c[0] for c in DOCTOR_ERRORS],
)
def test_a_drafter_doctor_marks_error_gets_no_twin(
    src, tmp_path, capsys, change_config, change_tensors, expected
):
    first = int(tensors(src)["d2t"][0]) + 1000  # the first draft id's target id, shifted
    if change_config is not None:
        config = json.loads((src / "config.json").read_text())
        change_config(config)
        (src / "config.json").write_text(json.dumps(config))
    if change_tensors is not None:
        rewrite(src, change_tensors)
    message = refused(capsys, src, tmp_path)
    expected = expected.format(src=src, first=first)
    if not expected.startswith(f"{src}/model.safetensors: fc.weight"):
        assert message == expected
    else:  # fc's sentence goes on to explain the width (doctor's wording, kept whole)
        assert message.startswith(expected + ": fc reads 128"), message
    doctor_code, doctor = doctor_errors(capsys, src)
    assert doctor_code == 1 and len(doctor) == 1
    assert message in (doctor[0], f"{src}/model.safetensors: {doctor[0]}", f"{src}: {doctor[0]}")


def test_doctors_many_errors_fit_one_line(src, tmp_path, capsys):
    rewrite(src, lambda w: w.update({n: t.double() for n, t in w.items() if n != "norm.weight"
                                     and t.is_floating_point()}))  # fmt: skip
    message = refused(capsys, src, tmp_path)
    _, doctor = doctor_errors(capsys, src)
    assert len(doctor) > 5
    shown = "; ".join(f"{src / 'model.safetensors'}: {e}" for e in doctor[:5])
    assert message == (
        f"{shown}; ... and {len(doctor) - 5} more (`sglang-ext doctor {src}` lists them)"
    )


def test_a_weights_file_that_is_a_directory_is_the_sources_problem(src, tmp_path, capsys):
    weights = src / "model.safetensors"
    weights.unlink()
    weights.mkdir()
    message = refused(capsys, src, tmp_path)
    assert message == f"{weights}: cannot read (Is a directory)"
    assert doctor_errors(capsys, src) == (1, [message])


def test_a_source_file_that_cannot_be_copied_is_the_sources_problem(src, tmp_path, capsys):
    os.mkfifo(src / "pipe")
    message = refused(capsys, src, tmp_path)
    assert message == f"{src / 'pipe'}: expected a regular file to copy into the twin, found a FIFO"
    (src / "pipe").unlink()
    (src / "README.md").symlink_to(tmp_path / "gone.md")
    message = refused(capsys, src, tmp_path)
    assert message == f"{src / 'README.md'}: cannot read (No such file or directory)"


def test_a_failed_write_blames_the_destination(src, tmp_path, capsys, monkeypatch):
    import safetensors.torch

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    dst = tmp_path / "probe"
    code, _, err = run(capsys, src, dst)
    assert code == 2
    assert err == (
        f"sglang-ext probe-drafter: error: cannot write {dst}: [Errno 28] No space left on device\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
