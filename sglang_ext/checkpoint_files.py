"""A drafter's weight files on disk: safetensors headers read and validated, pickles read safely.

A directory without safetensors is read from its pickle files the way SGLang reads them
(``sglang_ext.pickle_weights``: torch.load with weights_only=True, which runs nothing from the
checkpoint; a file that loader refuses is refused with its reason). Safetensors headers are read
without loading a tensor and checked the way safetensors checks them (size limit, well-formed
entries, tensors tiling the data buffer, no truncation or trailing bytes), so ``sglang-ext
doctor`` and the server's startup see the same tensor names, shapes and dtypes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from sglang_ext.pickle_weights import (
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


class DrafterLoadError(RuntimeError):
    """The drafter's weights cannot be loaded as they are; the message lists every problem."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    file: str


def weight_files(directory: str | Path) -> list[Path]:
    """The weight files SGLang loads from a drafter directory: its safetensors, else its
    pickles (pickle_weights.pickle_weight_files)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DrafterLoadError(f"{directory}: not a directory")
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
        tensors.append(TensorInfo(name, shape, dtype, path.name))
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
    tensors: list[TensorInfo] = []
    for path in weight_files(directory):
        if path.suffix == ".safetensors":
            tensors.extend(read_safetensors_header(path))
        else:
            tensors.extend(read_pickle_tensors(path))
    return tensors


def torch_dtype_name(dtype) -> str:
    """safetensors' dtype name for a torch dtype (the loader sees tensors, doctor headers)."""
    name = str(dtype).removeprefix("torch.")
    return {
        "float32": "F32",
        "float16": "F16",
        "bfloat16": "BF16",
        "int64": "I64",
        "int32": "I32",
        "bool": "BOOL",
    }.get(name, name.upper())
