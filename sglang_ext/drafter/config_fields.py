"""Reading a config.json as data: the JSON object, and typed fields whose errors name the file.

The drafter's config (speculators_format) and the target's (aux_capture.TargetInfo) are read
through these, so a wrong field is one sentence naming the file, the field, what was expected
and what was found. Nothing here imports SGLang or torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class DrafterConfigError(ValueError):
    """A drafter or target config that cannot be served; the message says where and why."""


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON file as data, with an error that names the file."""
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        if path.name == "config.json" and path.parent.is_dir():
            raise DrafterConfigError(
                f"{path.parent}: no config.json in this directory; expected a model directory "
                "(config.json and its weights) or a config.json"
            ) from exc
        raise DrafterConfigError(
            f"{path}: no such file or directory; expected a model directory or its config.json"
        ) from exc
    except OSError as exc:
        raise DrafterConfigError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise DrafterConfigError(
            f"{path}: not a JSON text file ({exc}); expected a model directory or its config.json"
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DrafterConfigError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise DrafterConfigError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def require_field(config: Mapping[str, Any], key: str, kind: type | tuple, where: str) -> Any:
    names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
    if key not in config:
        raise DrafterConfigError(f"{where}: required field '{key}' is missing")
    value = config[key]
    if value is None:  # present but null: a different mistake from leaving it out
        raise DrafterConfigError(f"{where}: required field '{key}' is null; expected {names}")
    if isinstance(value, bool) and kind in (int, float):
        raise DrafterConfigError(f"{where}: field '{key}' must be {kind.__name__}, found {value!r}")
    if not isinstance(value, kind):
        raise DrafterConfigError(
            f"{where}: field '{key}' must be {names}, found {type(value).__name__} {value!r}"
        )
    return value


def optional_field(config: Mapping[str, Any], key: str, kind: type | tuple, where: str) -> Any:
    """An optional field: None when absent or null, else type-checked like `require_field`."""
    return None if config.get(key) is None else require_field(config, key, kind, where)


def size_field(
    config: Mapping[str, Any], key: str, where: str, required: bool = True
) -> int | None:
    """A size or count: an int above 0 (`required`: present, else None when absent or null);
    0 or a negative one is refused by name rather than replaced by a default."""
    value = (require_field if required else optional_field)(config, key, int, where)
    if value is not None and value <= 0:
        raise DrafterConfigError(f"{where}: field '{key}' must be > 0, found {value}")
    return value


def architectures_field(config: Mapping[str, Any], where: str) -> list[str] | None:
    archs = config.get("architectures")
    if archs is None:
        return None
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise DrafterConfigError(
            f"{where}: field 'architectures' must be a list of class names, found {archs!r}"
        )
    return archs or None


def flag_field(config: Mapping[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = config.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise DrafterConfigError(f"{where}: field '{key}' must be true/false, found {value!r}")
    return value
