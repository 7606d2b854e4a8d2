"""`--tokenizer-worker-num N > 1`: the acceptance metrics live in TokenizerManager hooks, and
SGLang starts its N tokenizer workers as fresh interpreters (uvicorn/Granian workers) that
import the HTTP app by path and never call `load_plugins()`. Without care every acceptance
metric silently disappears. SGLang 0.5.23 reads that path from SGLANG_HTTP_SERVER_APP_PATH, which
the plugin points at an app that loads the plugins first; where SGLang cannot be told (0.5.17)
the launch fails naming the flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def registered(sglang_env):
    """What plugin.register() does for tokenizer workers (the environment restored after)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_ext.serving import tokenizer_workers

    saved = os.environ.get(tokenizer_workers.APP_PATH_ENV)
    tokenizer_workers.install()
    HookRegistry.apply_hooks()
    yield
    if saved is None:
        os.environ.pop(tokenizer_workers.APP_PATH_ENV, None)
    else:
        os.environ[tokenizer_workers.APP_PATH_ENV] = saved


# What a uvicorn/Granian worker does: a fresh interpreter (inheriting the launcher's
# environment) imports the app by the path SGLang's launcher hands over.
WORKER = """
import json
from sglang.srt.environ import envs
from uvicorn.importer import import_from_string
app = import_from_string(envs.SGLANG_HTTP_SERVER_APP_PATH.get())
from sglang.srt.entrypoints import http_server
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_ext.metrics.hook import CALC_SPEC_METRICS_TARGET
print(json.dumps([app is http_server.app, CALC_SPEC_METRICS_TARGET in HookRegistry._patched]))
"""


def test_tokenizer_workers_load_the_plugin(registered):
    from sglang.srt.environ import envs

    if not hasattr(envs, "SGLANG_HTTP_SERVER_APP_PATH"):
        pytest.skip("this SGLang hard-codes the worker app path (0.5.17): see the tests below")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    same_app, hooked = json.loads(out.stdout.strip().splitlines()[-1])
    assert same_app, "the worker must serve SGLang's own FastAPI app"
    assert hooked, "the acceptance-metrics hook is missing in the tokenizer worker"


def launcher_check(**server_args):
    """The hook on SGLang's write_data_for_multi_tokenizer, which its launcher calls only when
    it is about to start tokenizer workers."""
    from sglang_ext.serving import tokenizer_workers

    calls = []
    args = SimpleNamespace(tokenizer_worker_num=2, **server_args)
    tokenizer_workers.before_starting_tokenizer_workers(
        lambda *a, **k: calls.append(a) or "shm", "port_args", args, {}
    )
    return calls


def test_workers_routed_through_the_plugin_start(registered):
    from sglang_ext.serving import tokenizer_workers

    if not tokenizer_workers.sglang_reads_app_path():
        pytest.skip("0.5.17")
    assert launcher_check() == [("port_args", SimpleNamespace(tokenizer_worker_num=2), {})]


def test_another_app_path_fails_the_launch_naming_flag_and_variable(registered, monkeypatch):
    from sglang_ext.serving import tokenizer_workers

    if not tokenizer_workers.sglang_reads_app_path():
        pytest.skip("0.5.17")
    monkeypatch.setenv("SGLANG_HTTP_SERVER_APP_PATH", "my_company.app:app")
    with pytest.raises(SystemExit) as info:
        launcher_check()
    message = str(info.value)
    assert "--tokenizer-worker-num 2" in message and "my_company.app:app" in message
    assert "SGLANG_HTTP_SERVER_APP_PATH" in message and "SGLANG_EXT_METRICS=0" in message


def test_sglang_without_an_app_path_fails_the_launch_naming_the_flag(registered, monkeypatch):
    """SGLang 0.5.17 (http_server.py) passes the fixed path 'sglang.srt.entrypoints.
    http_server:app' to uvicorn and Granian: the workers cannot be made to load plugins."""
    from sglang_ext.serving import tokenizer_workers

    monkeypatch.setattr(tokenizer_workers, "sglang_reads_app_path", lambda: False)
    with pytest.raises(SystemExit) as info:
        launcher_check()
    message = str(info.value)
    assert "--tokenizer-worker-num 2" in message and "--tokenizer-worker-num 1" in message
    assert "SGLANG_EXT_METRICS=0" in message
    monkeypatch.setenv("SGLANG_EXT_METRICS", "0")  # nothing of the plugin runs in the workers
    assert len(launcher_check()) == 1


def test_sglangs_launcher_calls_the_check(registered, monkeypatch):
    """http_server.py imported write_data_for_multi_tokenizer by name; the hook reaches it."""
    from sglang.srt.entrypoints import http_server

    from sglang_ext.serving import tokenizer_workers

    monkeypatch.setattr(tokenizer_workers, "sglang_reads_app_path", lambda: False)
    with pytest.raises(SystemExit, match="--tokenizer-worker-num 3"):
        http_server.write_data_for_multi_tokenizer(
            "port_args", SimpleNamespace(tokenizer_worker_num=3), {}
        )
