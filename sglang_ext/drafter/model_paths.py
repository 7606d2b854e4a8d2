"""Where a model's files are: a local directory, a bare config.json, or a Hugging Face Hub id.

A Hub id is resolved through the local HF cache, as transformers does for SGLang; only the
files SGLang loads anyway (*.json, *.safetensors) are fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

from sglang_ext.drafter.config_fields import DrafterConfigError

HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(path: str | Path) -> bool:
    return not Path(path).exists() and bool(HUB_REPO_ID.match(str(path)))


def config_path(path: str | Path) -> Path:
    """Accept a model directory, a bare config.json, or a Hugging Face Hub id (its config.json
    fetched through the local HF cache, as transformers does for SGLang)."""
    if is_hub_id(path):
        from huggingface_hub import hf_hub_download

        try:
            return Path(hf_hub_download(str(path), "config.json"))
        except Exception as exc:  # noqa: BLE001 - offline, missing repo, no access: say which
            raise DrafterConfigError(
                f"{path}: not a local path, and its config.json could not be fetched from the "
                f"Hugging Face Hub ({type(exc).__name__}: {exc})"
            ) from exc
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


def model_dir(path: str | Path) -> Path:
    """A local directory holding a drafter's config and safetensors (Hub ids are downloaded
    into the HF cache: only *.json and *.safetensors, the files SGLang loads anyway)."""
    if not is_hub_id(path):
        path = Path(path)
        return path if path.is_dir() else path.parent
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(path), allow_patterns=["*.json", "*.safetensors"]))
    except Exception as exc:  # noqa: BLE001 - see config_path
        raise DrafterConfigError(
            f"{path}: not a local path, and it could not be fetched from the Hugging Face Hub "
            f"({type(exc).__name__}: {exc})"
        ) from exc
