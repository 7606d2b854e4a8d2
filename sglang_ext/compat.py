"""The few places where SGLang 0.5.17 and 0.5.23 differ in what the plugin touches."""

from __future__ import annotations

import logging
import re
from importlib.metadata import PackageNotFoundError, version

logger = logging.getLogger(__name__)

# Features the plugin uses only from some SGLang version on: name -> first (major, minor,
# patch) that has it. The one table of version differences; ask `supports(name)`.
FEATURE_SINCE: dict[str, tuple[int, int, int]] = {
    # A per-layer sliding window on the EAGLE drafter, on every draft path of the triton
    # backend: TritonMultiStepDraftBackend builds a per-step window rail
    # (`window_rail`, `_fill_window_rail`, kernels/ops/speculative/cache_locs.py:
    # generate_draft_decode_window_kv_indices). 0.5.17-0.5.22 build none: the multi-step draft
    # decode hands a window layer `window_kv_indices=None` and the first draft step crashes.
    "draft_layer_window": (0, 5, 23),
}


def sglang_version() -> str | None:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def version_tuple(text: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a version string ("0.5.23", "0.5.23.post1", "0.5.23rc0")."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", text or "")
    return tuple(int(part) for part in match.groups()) if match else None


def supports(feature: str, sglang: str | None = None) -> bool:
    """Whether SGLang `sglang` (default: the installed one) has `feature` (FEATURE_SINCE).
    An unreadable version has none of them (the conservative side)."""
    if feature not in FEATURE_SINCE:
        raise KeyError(f"sglang_ext.compat: unknown feature {feature!r}; known: "
                       f"{sorted(FEATURE_SINCE)}")
    found = version_tuple(sglang if sglang is not None else sglang_version())
    return found is not None and found >= FEATURE_SINCE[feature]


def server_args():
    """The ServerArgs of this process, or None outside a server (unit tests, offline tools)."""
    try:
        from sglang.srt.runtime_context import get_server_args

        args = get_server_args()
        if args is not None:
            return args
    except Exception:  # noqa: BLE001 - 0.5.17/0.5.23 raise different errors when unpublished
        logger.debug("runtime_context has no server args", exc_info=True)
    try:
        from sglang.srt.server_args import get_global_server_args

        return get_global_server_args()
    except Exception:  # noqa: BLE001 - 0.5.23 removed it (raises NoReturn)
        return None

