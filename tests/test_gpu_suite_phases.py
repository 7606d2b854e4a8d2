"""The GPU suite's phases fold into one results file (tests/gpu/suite.py merge_earlier_phase)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

GPU = Path(__file__).resolve().parent / "gpu"
sys.path.insert(0, str(GPU))

import suite  # noqa: E402


def test_an_earlier_phase_is_folded_in_without_overwriting(tmp_path, monkeypatch):
    earlier = {
        "date": "d0",
        "command": "pytest tests/gpu/test_public_configs.py",
        "outcomes": {"test_public[a]": "passed", "test_x": "failed"},
        "durations_s": {"test_public[a]": 3.0},
        "public_configs": {"a": {"doctor": "starts", "server": "starts"}},
        "lossless": {"old": 1},
    }
    path = tmp_path / "integration-public.json"
    path.write_text(json.dumps(earlier))
    monkeypatch.setenv("SGLANG_EXT_EARLIER_RESULTS", str(path))
    data = {"outcomes": {"test_x": "passed"}, "durations_s": {}, "lossless": {"plugin": {}}}
    suite.merge_earlier_phase(data)
    assert data["outcomes"] == {"test_public[a]": "passed", "test_x": "passed"}
    assert data["public_configs"] == earlier["public_configs"]
    assert data["lossless"] == {"plugin": {}}  # this run's own keys win
    assert data["earlier_phases"][0]["file"] == path.name


def test_no_earlier_phase_changes_nothing(monkeypatch):
    monkeypatch.delenv("SGLANG_EXT_EARLIER_RESULTS", raising=False)
    data = {"outcomes": {}}
    suite.merge_earlier_phase(data)
    assert data == {"outcomes": {}}


class _FakeServer:
    def __init__(self, name):
        self.name, self.stopped = name, False

    def alive(self):
        return not self.stopped

    def terminate(self):
        self.terminated = True

    def stop(self):
        self.stopped = True


def test_background_servers_join_the_cluster_and_only_keeps_the_named(monkeypatch):
    """The MLA servers start in a thread (suite.Cluster.start_background) while the llama
    tests run; join_background adds what launch started, only() stops the rest."""
    import threading

    gate = threading.Event()

    def fake_launch(servers, key):
        gate.wait(5)  # still starting when the first tests run
        return [s for s in servers if s.name != "left_out"]  # as SGLANG_EXT_SERVERS filters

    monkeypatch.setattr(suite, "launch", fake_launch)
    cluster = suite.Cluster({"plugin": _FakeServer("plugin"), "nospec": _FakeServer("nospec")})
    built = [_FakeServer(n) for n in ("mla_nospec", "mla_tree", "left_out")]
    cluster.start_background(lambda: built, "startup_mla")
    assert "mla_tree" not in cluster.keys()  # not joined yet
    gate.set()
    assert cluster.join_background() is cluster
    assert sorted(cluster) == ["mla_nospec", "mla_tree", "nospec", "plugin"]
    assert cluster.background_servers == tuple(built)  # all of them stopped at teardown
    assert cluster.only({"plugin", "mla_tree"}) == ["mla_tree", "plugin"]
    assert cluster["nospec"].stopped and not cluster["plugin"].stopped


def test_a_background_failure_surfaces_in_the_test_that_joins(monkeypatch):
    import pytest

    def build():
        raise RuntimeError("fixtures broke")

    cluster = suite.Cluster()
    cluster.start_background(build, "startup_mla")
    with pytest.raises(RuntimeError, match="fixtures broke"):
        cluster.join_background()


def test_fixtures_ready_waits_for_the_marker(tmp_path, monkeypatch):
    import pytest

    (tmp_path / "prompts.jsonl").write_text("{}\n")
    monkeypatch.setattr(suite, "FIXTURES_WAIT_S", None)
    assert suite.fixtures_ready(tmp_path, "prompts.jsonl")  # no wait: what is there
    assert not suite.fixtures_ready(tmp_path, "absent")
    monkeypatch.setattr(suite, "FIXTURES_WAIT_S", "0.2")
    with pytest.raises(pytest.fail.Exception, match="no READY marker"):
        suite.fixtures_ready(tmp_path, "prompts.jsonl")
    (tmp_path / "READY").touch()
    assert suite.fixtures_ready(tmp_path, "prompts.jsonl")
    (tmp_path / "FAILED").touch()
    with pytest.raises(pytest.fail.Exception, match="failed"):
        suite.fixtures_ready(tmp_path, "prompts.jsonl")


def test_stop_signals_every_server_before_waiting_for_any():
    """suite.stop: SIGTERM to every process group first, then the waits, so N servers stop in
    about the time of one (Server.terminate on real processes)."""
    import subprocess
    import time

    from sglang_ext_tools.launch import Server

    servers = [Server(f"s{i}", "m", 0) for i in range(4)]
    for server in servers:
        server.process = subprocess.Popen(
            ["sh", "-c", "trap 'sleep 1; exit 0' TERM; while :; do sleep 0.1; done"],
            start_new_session=True,
        )
    time.sleep(0.3)  # the traps are set
    start = time.monotonic()
    suite.stop(servers)
    assert all(s.process.poll() is not None for s in servers)
    assert time.monotonic() - start < 3  # in series: >= 4 s (each takes 1 s to exit)


def test_the_timed_gpu_tests_run_alone_at_the_end():
    """conftest.py orders the `alone` tests after the others (only the timed servers up):
    every GPU test that times servers side by side carries the marker, and no helper does
    (a decorator left above a helper inserted before its test silently took it off)."""
    import ast

    gpu = Path(__file__).resolve().parent / "gpu"
    marked = set()
    for path in sorted(gpu.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                if ast.unparse(deco) == "pytest.mark.alone":
                    marked.add(node.name)
    assert marked == {
        "test_bench_client_against_baseline",
        "test_metrics_overhead_at_concurrency_32",
        "test_seed_case_stock_stalls_plugin_refuses_then_serves_faster",
    }
