"""The few places where SGLang 0.5.17 and 0.5.23 differ in what the plugin touches."""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

logger = logging.getLogger(__name__)


def sglang_version() -> str | None:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


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

