"""A drafter's weight files on disk: safetensors headers read and validated, pickles read safely.

A directory without safetensors is read from its pickle files the way SGLang reads them
(``sglang_ext.drafter.pickle_weights``: torch.load with weights_only=True, which runs nothing
from the checkpoint; a file that loader refuses is refused with its reason). Safetensors
headers are read without loading a tensor and checked the way safetensors checks them (size
limit, well-formed entries, tensors tiling the data buffer, no truncation or trailing bytes), so
``sglang-ext doctor`` and the server's startup see the same tensor names, shapes and dtypes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from sglang_ext.drafter.pickle_weights import (
    OTHER_PICKLE_SUFFIXES,
    UnsafePickleError,
    load_state_dict,
    pickle_weight_files,
)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# safetensors refuses longer headers (its MAX_HEADER_SIZE); so do we, before reading one.
MAX_HEADER_BYTES = 100_000_000
# Bytes per element of the safetensors dtypes with whole-byte elements (sub-byte ones such as
# F4 are not size-checked here).
DTYPE_BYTES = {
    **dict.fromkeys(("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0"), 1),
    **dict.fromkeys(("I16", "U16", "F16", "BF16"), 2),
    **dict.fromkeys(("I32", "U32", "F32"), 4),
    **dict.fromkeys(("I64", "U64", "F64", "C64"), 8),
}
# Every dtype safetensors 0.8 reads; a header naming another cannot be opened at all, so it is
# reported on the tensor that names it (not on whichever tensor is read first).
SAFETENSORS_DTYPES = frozenset(DTYPE_BYTES) | {"F4", "F6_E2M3", "F6_E3M2", "F8_E4M3FNUZ",
                                              "F8_E5M2FNUZ"}  # fmt: skip
INDEX_FILE = "model.safetensors.index.json"
# Floating-point dtypes whose values are checked for NaN/Inf: numpy dtype, or the bits of the
# exponent for the ones numpy lacks (a value is NaN or Inf when they are all set).
_FINITE_CHECK = {"F64": "<f8", "F32": "<f4", "F16": "<f2"}
_EXPONENT_BITS = {"BF16": ("<u2", 0x7F80)}
_CHUNK = 1 << 24  # values per NaN/Inf check step


class DrafterLoadError(RuntimeError):
    """The drafter's weights cannot be loaded as they are; the message lists every problem."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    file: str
    start: int = -1  # the tensor's bytes in `file`: [start, end) (-1: not read from a file)
    end: int = -1


def weight_files(directory: str | Path) -> list[Path]:
    """The weight files SGLang loads from a drafter directory: with a
    model.safetensors.index.json, the shards it names (as SGLang's loader does:
    filter_duplicate_safetensors_files), each of which must be there; else its safetensors;
    else its pickles (pickle_weights.pickle_weight_files)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DrafterLoadError(f"{directory}: not a directory")
    index = shard_index(directory)
    if index is not None:
        return [directory / shard for shard in sorted(set(index.values()))]
    files = sorted(directory.glob("*.safetensors"))
    if files:
        return files
    files = pickle_weight_files(directory)
    if files:
        return files
    others = sorted(p.name for p in directory.iterdir() if p.suffix in OTHER_PICKLE_SUFFIXES)
    if others:
        raise DrafterLoadError(
            f"{directory}: no weight files SGLang loads (*.safetensors, *.bin, *.pt); found "
            f"{', '.join(others)}, which SGLang never reads as weights. Save the state_dict as "
            "model.safetensors"
        )
    raise DrafterLoadError(f"{directory}: no *.safetensors weight files")


def shard_index(directory: Path) -> dict[str, str] | None:
    """A sharded checkpoint's weight_map (tensor -> shard file), None when there is no
    model.safetensors.index.json; raises when it is unreadable or names a shard that is not in
    `directory` (an interrupted download: SGLang 0.5.23 refuses it at startup too)."""
    path = directory / INDEX_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DrafterLoadError(f"{path}: cannot read the shard index ({exc})") from exc
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(v, str) and v and "/" not in v for v in weight_map.values()
    ):
        raise DrafterLoadError(
            f"{path}: field 'weight_map' must map tensor names to shard file names, found "
            f"{str(weight_map)[:200]}"
        )
    absent: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if not (directory / shard).is_file():
            absent.setdefault(shard, []).append(name)
    if absent:
        lines = [
            f"shard {shard} is not in {directory} ({len(names)} tensor(s), e.g. {names[0]!r})"
            for shard, names in sorted(absent.items())
        ]
        raise DrafterLoadError(
            f"{path} names {len(absent)} shard(s) that are missing, so the checkpoint is "
            "incomplete (an interrupted download?); fetch them again: " + "; ".join(lines)
        )
    return weight_map


def refuse_unsafe_pickles(directory: Path) -> None:
    """For a pickle-only directory, read every pickle SGLang's loader will read with the same
    safe loader first, so a file it refuses fails here with its reason (before SGLang's loader
    gets to it, which would raise a traceback)."""
    if any(directory.glob("*.safetensors")):
        return
    for path in pickle_weight_files(directory):
        read_pickle(path)


def read_pickle(path: Path) -> dict:
    try:
        return load_state_dict(path)
    except UnsafePickleError as exc:
        raise DrafterLoadError(str(exc)) from exc
    except OSError as exc:
        raise DrafterLoadError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def read_pickle_tensors(path: Path) -> list[TensorInfo]:
    return [
        TensorInfo(name, tuple(tensor.shape), torch_dtype_name(tensor.dtype), path.name)
        for name, tensor in read_pickle(path).items()
    ]


def tensor_values(path: Path, name: str):
    """One tensor's values as a numpy array, from either kind of weight file."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), "np") as handle:
                return handle.get_tensor(name)
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise DrafterLoadError(f"{path}: cannot read tensor {name!r} ({exc})") from exc
    return read_pickle(path)[name].numpy()


def read_safetensors_header(path: Path) -> list[TensorInfo]:
    """Tensor names/shapes/dtypes from a safetensors header, checking the header is well formed
    and the file is complete."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            raw_len = handle.read(8)
            if len(raw_len) < 8:
                raise DrafterLoadError(
                    f"{path}: truncated safetensors file ({size} bytes, no header)"
                )
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > MAX_HEADER_BYTES:
                raise DrafterLoadError(
                    f"{path}: safetensors header of {header_len} bytes exceeds the "
                    f"{MAX_HEADER_BYTES} bytes safetensors accepts; not a valid safetensors file"
                )
            if header_len > size - 8:
                raise DrafterLoadError(
                    f"{path}: truncated safetensors file: header says {header_len} header "
                    f"bytes, file has {size - 8}"
                )
            raw_header = handle.read(header_len)
    except OSError as exc:
        raise DrafterLoadError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    try:
        header = json.loads(raw_header)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DrafterLoadError(f"{path}: corrupt safetensors header ({exc})") from exc
    if not isinstance(header, dict):
        raise DrafterLoadError(
            f"{path}: corrupt safetensors header: header is not a JSON object "
            f"(found {type(header).__name__})"
        )
    tensors, spans = [], []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, offsets = _header_entry(path, name, meta)
        spans.append((*offsets, name))
        start, end = (8 + header_len + o for o in offsets)
        tensors.append(TensorInfo(name, shape, dtype, path.name, start, end))
    # safetensors' own rule: the tensors tile the data buffer, no gap, no overlap, no tail.
    data_end = 0
    for start, end, name in sorted(spans):
        if start != data_end:
            raise DrafterLoadError(
                f"{path}: corrupt safetensors header: tensor {name!r} starts at data byte "
                f"{start}, expected {data_end} (tensors must follow each other without gap "
                "or overlap)"
            )
        data_end = end
    expected = 8 + header_len + data_end
    if size < expected:
        raise DrafterLoadError(
            f"{path}: truncated safetensors file: tensors need {expected} bytes, file has {size}"
        )
    if size > expected:
        raise DrafterLoadError(
            f"{path}: corrupt safetensors file: {size - expected} bytes after the last tensor "
            f"(tensors need {expected} bytes, file has {size})"
        )
    return tensors


def _header_entry(path: Path, name: str, meta) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    """One header entry, validated: (dtype, shape, data_offsets)."""
    where = f"{path}: corrupt safetensors header: tensor {name!r}"
    if not isinstance(meta, dict):
        raise DrafterLoadError(
            f"{where}: expected an object with dtype, shape and data_offsets, "
            f"found {type(meta).__name__}"
        )
    for key in ("dtype", "shape", "data_offsets"):
        if key not in meta:
            raise DrafterLoadError(f"{where}: field {key!r} is missing")
    dtype, shape, offsets = meta["dtype"], meta["shape"], meta["data_offsets"]

    def is_count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not isinstance(dtype, str):
        raise DrafterLoadError(f"{where}: field 'dtype' must be a string, found {dtype!r}")
    if dtype not in SAFETENSORS_DTYPES:
        raise DrafterLoadError(
            f"{where}: dtype {dtype!r} is not a safetensors dtype (expected one of "
            f"{', '.join(sorted(SAFETENSORS_DTYPES))}); safetensors cannot open this file"
        )
    if not isinstance(shape, list) or not all(is_count(d) for d in shape):
        raise DrafterLoadError(
            f"{where}: field 'shape' must be a list of non-negative integers, found {shape!r}"
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(is_count(o) for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise DrafterLoadError(
            f"{where}: field 'data_offsets' must be [start, end] with 0 <= start <= end, "
            f"found {offsets!r}"
        )
    start, end = offsets
    if dtype in DTYPE_BYTES:
        needed = DTYPE_BYTES[dtype]
        for dim in shape:
            needed *= dim
        if needed != end - start:
            raise DrafterLoadError(
                f"{where}: shape {shape} of {dtype} needs {needed} bytes, data_offsets span "
                f"{end - start}"
            )
    return dtype, tuple(shape), (start, end)


def read_checkpoint(directory: str | Path) -> list[TensorInfo]:
    """Every tensor of the checkpoint, from its headers. A tensor in two files, or one that the
    shard index places in a shard lacking it, is an error naming the files."""
    directory = Path(directory)
    files = weight_files(directory)
    index = shard_index(directory)
    tensors: list[TensorInfo] = []
    where: dict[str, list[str]] = {}
    for path in files:
        found = (
            read_safetensors_header(path)
            if path.suffix == ".safetensors"
            else read_pickle_tensors(path)
        )
        for tensor in found:
            tensors.append(tensor)
            where.setdefault(tensor.name, []).append(path.name)
    problems = [
        f"tensor {name!r} is in {len(shards)} files ({', '.join(shards)}); keep it in one"
        for name, shards in where.items()
        if len(shards) > 1
    ]
    for name, shard in (index or {}).items():
        if shard not in where.get(name, []):
            problems.append(
                f"{INDEX_FILE} places tensor {name!r} in {shard}, which does not hold it"
            )
    if problems:
        raise DrafterLoadError(
            f"{directory}: the checkpoint's files disagree ({len(problems)} problem(s)): "
            + "; ".join(problems[:20])
            + (f"; ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        )
    return tensors


def nonfinite_count(directory: str | Path, tensor: TensorInfo) -> int:
    """How many of a floating-point tensor's values are NaN or Inf (0 for other dtypes),
    read from the file without loading the checkpoint into memory."""
    import numpy as np

    if tensor.start < 0 or tensor.end <= tensor.start:
        return 0
    path = Path(directory) / tensor.file
    count = (tensor.end - tensor.start) // DTYPE_BYTES.get(tensor.dtype, 1)
    if tensor.dtype in _FINITE_CHECK:
        view, exponent = _FINITE_CHECK[tensor.dtype], None
    elif tensor.dtype in _EXPONENT_BITS:
        view, exponent = _EXPONENT_BITS[tensor.dtype]
    else:
        return 0
    try:
        values = np.memmap(path, view, "r", tensor.start, (count,))
        bad = 0
        for begin in range(0, count, _CHUNK):  # bounded memory on a multi-GB lm_head
            chunk = values[begin : begin + _CHUNK]
            if exponent is None:
                bad += chunk.size - int(np.count_nonzero(np.isfinite(chunk)))
            else:
                bad += int(np.count_nonzero((chunk & exponent) == exponent))
        return bad
    except (OSError, ValueError) as exc:
        raise DrafterLoadError(f"{path}: cannot read tensor {tensor.name!r} ({exc})") from exc


def torch_dtype_name(dtype) -> str:
    """safetensors' dtype name for a torch dtype (the loader sees tensors, doctor headers)."""
    name = str(dtype).removeprefix("torch.")
    return {
        "float64": "F64",
        "float32": "F32",
        "float16": "F16",
        "bfloat16": "BF16",
        "float8_e4m3fn": "F8_E4M3",
        "float8_e5m2": "F8_E5M2",
        "int64": "I64",
        "int32": "I32",
        "int16": "I16",
        "int8": "I8",
        "uint8": "U8",
        "bool": "BOOL",
    }.get(name, name.upper())
