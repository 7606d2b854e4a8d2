"""The plugin in SGLang's tokenizer worker processes (``--tokenizer-worker-num N > 1``).

The acceptance metrics are hooks on the TokenizerManager (``sglang_ext.metrics.hook``). With N > 1
SGLang's launcher does not build a TokenizerManager itself: uvicorn or Granian start N worker
processes, fresh interpreters that import the HTTP app by its path, and each builds its own
(``http_server.py:_setup_and_run_http_server``, ``lifespan`` -> ``init_multi_tokenizer``).
SGLang calls ``load_plugins()`` in the launcher, schedulers, detokenizer and DP controller, never
there, so without this module every acceptance metric would silently disappear.

- SGLang 0.5.23 reads the worker app path from ``SGLANG_HTTP_SERVER_APP_PATH``
  (``environ.py``; used for uvicorn, SO_REUSEPORT workers and Granian). The plugin points it at
  ``sglang_ext.tokenizer_worker_app:app``: ``load_plugins()``, then SGLang's own app object.
- SGLang 0.5.17 passes the fixed path ``sglang.srt.entrypoints.http_server:app``; the launch
  fails instead, naming the flag (unless ``SGLANG_EXT_METRICS=0``).

Both are checked in the launcher, just before the workers start, by a hook on SGLang's
``write_data_for_multi_tokenizer`` (``managers/multi_tokenizer_mixin.py``), which the launcher
calls only when it is about to start tokenizer workers.
"""

from __future__ import annotations

import logging
import os

# The name it had before the move to serving/: logging configurations name it.
logger = logging.getLogger("sglang_ext.tokenizer_workers")

APP_PATH_ENV = "SGLANG_HTTP_SERVER_APP_PATH"
SGLANG_APP = "sglang.srt.entrypoints.http_server:app"
PLUGIN_APP = "sglang_ext.tokenizer_worker_app:app"
LAUNCH_TARGET = "sglang.srt.managers.multi_tokenizer_mixin.write_data_for_multi_tokenizer"


def sglang_reads_app_path() -> bool:
    """Whether this SGLang takes the tokenizer workers' app path from APP_PATH_ENV."""
    from sglang.srt.environ import envs

    return hasattr(envs, APP_PATH_ENV)


def install() -> list[str]:
    """Route the tokenizer workers through the plugin where SGLang allows it, and check at
    launch. Returns the hook targets registered."""
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if sglang_reads_app_path() and os.environ.get(APP_PATH_ENV, SGLANG_APP) == SGLANG_APP:
        # Inherited by the worker processes uvicorn/Granian spawn from the launcher.
        os.environ[APP_PATH_ENV] = PLUGIN_APP
    pkgutil.resolve_name(LAUNCH_TARGET)  # a moved target fails the launch here, not silently
    hooks = getattr(HookRegistry, "_hooks", {})
    if not any(h is before_starting_tokenizer_workers for _, h, *_ in hooks.get(LAUNCH_TARGET, ())):
        HookRegistry.register(LAUNCH_TARGET, before_starting_tokenizer_workers, HookType.AROUND)
    return [LAUNCH_TARGET]


def before_starting_tokenizer_workers(original, port_args, server_args, *args, **kwargs):
    workers = getattr(server_args, "tokenizer_worker_num", 1)
    metrics_on = os.environ.get("SGLANG_EXT_METRICS", "1") != "0"
    if workers > 1 and metrics_on:
        problem = _why_workers_lack_the_plugin()
        if problem:
            raise SystemExit(
                f"sglang_ext: --tokenizer-worker-num {workers}: {problem}, so the per-request "
                "acceptance metrics (log line, JSONL, Prometheus, meta_info, drafter-health "
                "alarm) would silently be missing. Serve with --tokenizer-worker-num 1, or set "
                "SGLANG_EXT_METRICS=0 to serve without acceptance metrics."
            )
        logger.info(
            "sglang_ext: %d tokenizer workers load the plugin through %s", workers, PLUGIN_APP
        )
    return original(port_args, server_args, *args, **kwargs)


def _why_workers_lack_the_plugin() -> str | None:
    if not sglang_reads_app_path():
        from sglang_ext import compat

        return (
            f"SGLang {compat.sglang_version()} starts its tokenizer workers from the fixed app "
            f"path {SGLANG_APP} and loads no plugins there (SGLang >= 0.5.23 reads "
            f"{APP_PATH_ENV}, which sglang_ext points at {PLUGIN_APP})"
        )
    path = os.environ.get(APP_PATH_ENV, SGLANG_APP)
    if path != PLUGIN_APP:
        return (
            f"{APP_PATH_ENV} is {path!r}, so the tokenizer workers import that app and do not "
            f"load sglang_ext (unset it, or set it to {PLUGIN_APP}, which loads SGLang's "
            "plugins and then serves SGLang's own app)"
        )
    return None
