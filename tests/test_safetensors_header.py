"""Malformed safetensors headers are errors that name the file, the tensor and the field, in
the loader, in doctor's report and in `doctor --json` (never a traceback)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from sglang_ext.cli import doctor, main
from sglang_ext.drafter.checkpoint_files import (
    MAX_HEADER_BYTES,
    DrafterLoadError,
    read_safetensors_header,
)


def write_raw(path: Path, header, data: bytes = b"") -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


GOOD = {"norm.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}

BAD_HEADERS = {
    "no_data_offsets": (
        {"norm.weight": {"dtype": "F32", "shape": [4]}},
        "tensor 'norm.weight': field 'data_offsets' is missing",
    ),
    "no_shape": (
        {"norm.weight": {"dtype": "F32", "data_offsets": [0, 16]}},
        "tensor 'norm.weight': field 'shape' is missing",
    ),
    "no_dtype": (
        {"norm.weight": {"shape": [4], "data_offsets": [0, 16]}},
        "tensor 'norm.weight': field 'dtype' is missing",
    ),
    "entry_not_object": ({"norm.weight": [0, 16]}, "tensor 'norm.weight': expected an object"),
    "offsets_not_pair": (
        {"norm.weight": {"dtype": "F32", "shape": [4], "data_offsets": [16]}},
        "field 'data_offsets' must be [start, end] with 0 <= start <= end, found [16]",
    ),
    "offsets_reversed": (
        {"norm.weight": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}},
        "found [16, 0]",
    ),
    "negative_dim": (
        {"norm.weight": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}},
        "field 'shape' must be a list of non-negative integers, found [-4]",
    ),
    "size_mismatch": (
        {"norm.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}},
        "tensor 'norm.weight': shape [4] of F32 needs 16 bytes, data_offsets span 8",
    ),
    "not_an_object": ([1, 2, 3], "header is not a JSON object (found list)"),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_malformed_header_entry_is_a_named_error(tmp_path, case):
    header, message = BAD_HEADERS[case]
    path = write_raw(tmp_path / "model.safetensors", header, bytes(16))
    with pytest.raises(DrafterLoadError) as info:
        read_safetensors_header(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_good_header_reads(tmp_path):
    path = write_raw(tmp_path / "model.safetensors", GOOD, bytes(16))
    [tensor] = read_safetensors_header(path)
    assert (tensor.name, tensor.shape, tensor.dtype) == ("norm.weight", (4,), "F32")


def _f32(start: int) -> dict:
    return {"dtype": "F32", "shape": [4], "data_offsets": [start, start + 16]}


@pytest.mark.parametrize(
    "header, data, message",
    [
        ({"a": _f32(0), "b": _f32(8)}, 24, "tensor 'b' starts at data byte 8, expected 16"),
        ({"a": _f32(0), "b": _f32(20)}, 36, "tensor 'b' starts at data byte 20, expected 16"),
        ({"a": _f32(0)}, 20, "4 bytes after the last tensor"),
    ],
    ids=["overlap", "gap", "tail"],
)
def test_tensors_must_tile_the_data_buffer_as_safetensors_requires(tmp_path, header, data, message):
    path = write_raw(tmp_path / "model.safetensors", header, bytes(data))
    with pytest.raises(DrafterLoadError, match=message):
        read_safetensors_header(path)


def test_header_larger_than_safetensors_allows_is_refused_unread(tmp_path):
    """safetensors refuses headers over 100 MB; so do we, before reading them."""
    assert MAX_HEADER_BYTES == 100_000_000
    path = tmp_path / "model.safetensors"
    declared = 150_000_000
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", declared))
        handle.truncate(8 + declared)  # sparse: the header length is all that matters
    with pytest.raises(DrafterLoadError, match=r"header of 150000000 bytes exceeds .*100000000"):
        read_safetensors_header(path)


def test_unreadable_weight_file_is_a_named_error(tmp_path):
    (tmp_path / "model.safetensors").mkdir()  # a directory where the file should be
    with pytest.raises(DrafterLoadError, match="model.safetensors: cannot read"):
        read_safetensors_header(tmp_path / "model.safetensors")


def test_doctor_json_reports_a_header_without_data_offsets(drafter, tmp_path, capsys):
    directory = tmp_path / "drafter"
    shutil.copytree(drafter("default")[0], directory)
    path = directory / "model.safetensors"
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    del header["fc.weight"]["data_offsets"]
    write_raw(path, header, raw[8 + length :])

    assert doctor.diagnose(directory).verdict == "ERROR"
    assert main(["doctor", str(directory), "--json"]) == 1
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["verdict"] == "ERROR"
    assert any("'fc.weight': field 'data_offsets' is missing" in e for e in report["errors"])
    assert "Traceback" not in err
