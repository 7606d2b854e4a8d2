"""Pickle weight files (``pytorch_model.bin``), read the way SGLang reads them: safely.

Several published SGLang-format EAGLE-3 drafters (the original EAGLE-3 Llama-3.1 releases and
their mirrors) ship only ``pytorch_model.bin``. SGLang loads such a directory when it has no
``*.safetensors`` (``model_loader/loader.py:DefaultModelLoader._prepare_weights``: patterns
``*.safetensors``, then ``*.bin``, then ``*.pt``, the first that matches, less
``weight_utils.py:filter_files_not_needed_for_inference``) with
``weight_utils.py:_load_pt_file``: ``torch.load(path, map_location="cpu", weights_only=True)``.

The trust boundary is PyTorch's ``weights_only`` unpickler: it rebuilds tensors, dicts, lists
and primitive values and refuses every other global (a class, a function such as
``os.system``, a code object) before calling it, so nothing from the checkpoint is executed.
Doctor, convert and the server all read pickles through :func:`load_state_dict` only; a file
that unpickler refuses is refused with its reason, and the object must be a flat mapping of
tensor names to tensors (what SGLang iterates).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

# loader.py:_prepare_weights, in its order (the first pattern that matches wins).
SGLANG_PICKLE_PATTERNS = ("*.bin", "*.pt")
# weight_utils.py:filter_files_not_needed_for_inference.
NOT_FOR_INFERENCE = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt",
                     "scaler.pt")
# Pickle-like files SGLang never loads as weights.
OTHER_PICKLE_SUFFIXES = (".pth", ".ckpt", ".pkl")


class UnsafePickleError(ValueError):
    """A pickle weight file PyTorch's safe loader refuses, or that holds more than tensors."""


def pickle_weight_files(directory: Path) -> list[Path]:
    """The pickle files SGLang would load from a directory without safetensors."""
    for pattern in SGLANG_PICKLE_PATTERNS:
        files = sorted(directory.glob(pattern))
        if files:
            return [p for p in files if p.name not in NOT_FOR_INFERENCE]
    return []


def _loader_reason(exc: Exception) -> str:
    """The unpickler's own reason, without torch's advice to retry with weights_only=False
    (which would run the checkpoint's code) or its pointer to the documentation."""
    text = str(exc)
    match = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    if match:
        text = match.group(1)
    paragraphs = [
        " ".join(part.split())
        for part in text.split("\n\n")
        if part.strip()
        and not part.strip().startswith(("Weights only load failed", "Check the documentation"))
    ]
    return " ".join(paragraphs).rstrip(".") or type(exc).__name__


def load_state_dict(path: Path) -> dict:
    """{name: tensor} from a pickle file, through torch.load(weights_only=True) only (memory-
    mapped where the file is in torch's zip format, so reading the names stays cheap)."""
    import pickle

    import torch

    try:
        state = torch.load(
            str(path), map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path)
        )
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError,
            AttributeError, ImportError) as exc:
        raise UnsafePickleError(
            f"{path}: PyTorch's safe loader (torch.load with weights_only=True, as SGLang's "
            f"weight_utils.py loads .bin files) refuses this file: {_loader_reason(exc)}. "
            "Nothing in it was run. A weight file must hold tensors only: re-export it from "
            "its source as safetensors"
        ) from exc
    if not isinstance(state, dict):
        raise UnsafePickleError(
            f"{path}: expected a mapping of tensor names to tensors (what SGLang's loader "
            f"iterates), found {type(state).__name__}"
        )
    bad = [
        f"{name!r} ({type(value).__name__})"
        for name, value in state.items()
        if not (isinstance(name, str) and isinstance(value, torch.Tensor))
    ]
    if bad:
        raise UnsafePickleError(
            f"{path}: expected a mapping of tensor names to tensors, found non-tensor entries "
            f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} (a training checkpoint? "
            "save its state_dict only)"
        )
    return state
