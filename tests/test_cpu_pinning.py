"""sglang_ext_tools.cpu_pinning: the plan's grammar, the roles found from SGLang's process
titles, and a real process group pinned through /proc on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from sglang_ext_tools import bench_speed as bs
from sglang_ext_tools import cpu_pinning as cp

EIGHT = frozenset(range(8))


def test_cpu_lists_and_explicit_plans():
    assert cp.parse_cpus("0-2,5") == {0, 1, 2, 5}
    plan = cp.parse_plan("client=0-1;scheduler=2-3;detokenizer=4;server=5-6", EIGHT)
    assert plan == {"client": {0, 1}, "scheduler": {2, 3}, "detokenizer": {4}, "server": {5, 6}}
    assert cp.describe(plan)["scheduler"] == [2, 3]


def test_auto_takes_the_first_cores_this_process_may_use_in_role_order():
    plan = cp.parse_plan("auto", frozenset({3, 4, 5, 6, 7, 8, 9, 10}), local=frozenset())
    assert plan == {"client": {3, 4}, "scheduler": {5, 6}, "detokenizer": {7}, "server": {8, 9}}
    with pytest.raises(ValueError, match="needs 7 cores"):
        cp.parse_plan("auto", frozenset({0, 1}), local=frozenset())


def test_auto_prefers_the_cores_on_the_gpus_numa_node(tmp_path):
    device = tmp_path / "bus" / "pci" / "devices" / "0000:19:00.0"
    device.mkdir(parents=True)
    (device / "local_cpulist").write_text("8-15\n")
    local = cp.gpu_local_cpus(0, tmp_path, query=lambda i: "00000000:19:00.0\n")
    assert local == frozenset(range(8, 16))
    plan = cp.parse_plan("auto", frozenset(range(16)), local=local)
    assert plan["client"] == {8, 9} and plan["server"] == {13, 14}
    # too few near cores: the first of all that may be used, as without the GPU's node
    assert cp.parse_plan("auto", frozenset(range(16)), local=frozenset({8}))["client"] == {0, 1}
    assert cp.gpu_local_cpus(0, tmp_path, query=lambda i: "00000000:aa:00.0") is None

    def no_smi(index):
        raise FileNotFoundError("nvidia-smi")

    assert cp.gpu_local_cpus(0, tmp_path, query=no_smi) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("client=0;scheduler=1;detokenizer=2", "no cores for \\['server'\\]"),
        ("client=0;scheduler=0;detokenizer=2;server=3", "scheduler shares cores \\[0\\]"),
        ("client=0;scheduler=1;detokenizer=2;server=9", "server asks for cores \\[9\\]"),
        ("client=0;sched=1;detokenizer=2;server=3", "'sched=1' is not ROLE=CPUS"),
        ("client=a;scheduler=1;detokenizer=2;server=3", "expected numbers and ranges"),
    ],
)
def test_bad_plans_name_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        cp.parse_plan(text, EIGHT)


def test_bench_speed_refuses_a_bad_plan_as_an_argument_error(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input_ids": [1, 2]}\n')
    argv = ["--target", "T", "--drafter", "D", "--prompts", str(prompts)]
    with pytest.raises(SystemExit):
        bs.parse_args([*argv, "--pin-cpus", "client=0;scheduler=0;detokenizer=1;server=2"])
    assert "scheduler shares cores [0]" in capsys.readouterr().err
    assert bs.parse_args(argv).pin_plan is None


def _fake_proc(root: Path, procs: dict[int, tuple[int, str, list[int]]]) -> Path:
    """/proc with pid -> (pgid, cmdline, thread ids)."""
    for pid, (pgid, cmdline, tids) in procs.items():
        d = root / str(pid)
        (d / "task").mkdir(parents=True)
        (d / "stat").write_text(f"{pid} (python3) S 1 {pgid} {pgid} 0 0")
        (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
        for tid in tids:
            (d / "task" / str(tid)).mkdir()
    return root


def test_roles_come_from_sglangs_process_titles_and_every_thread_is_pinned(tmp_path):
    proc = _fake_proc(tmp_path, {
        100: (100, "python -m sglang.launch_server --model-path T", [100, 101]),
        110: (100, "sglang::scheduler", [110, 111, 112]),
        120: (100, "sglang::detokenizer", [120]),
        200: (200, "sglang::scheduler", [200]),  # another server's: not this group
    })  # fmt: skip
    assert cp.group_processes(100, proc) == {100: "server", 110: "scheduler", 120: "detokenizer"}
    calls = {}
    plan = cp.parse_plan("auto", EIGHT)
    out = cp.pin_group(100, plan, proc, setaffinity=lambda tid, cpus: calls.__setitem__(tid, cpus))
    assert out == {"scheduler": 3, "detokenizer": 1, "server": 2}
    assert calls[111] == plan["scheduler"] and calls[120] == plan["detokenizer"]
    assert calls[101] == plan["server"] and 200 not in calls


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_real_process_group_is_pinned_thread_by_thread():
    allowed = sorted(os.sched_getaffinity(0))
    child = subprocess.Popen(
        [sys.executable, "-c", "import threading, time; "
         "threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); time.sleep(30)"],
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 10
        while len(list(Path(f"/proc/{child.pid}/task").glob("*"))) < 2:
            assert time.time() < deadline, "the child's second thread never started"
            time.sleep(0.05)
        one = frozenset(allowed[:1])
        plan = {"client": one, "scheduler": one, "detokenizer": one, "server": one}
        assert cp.pin_group(child.pid, plan)["server"] == 2
        for task in Path(f"/proc/{child.pid}/task").glob("*"):
            assert os.sched_getaffinity(int(task.name)) == one
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_servers_start_on_every_core_and_only_then_are_pinned(monkeypatch):
    """A started server inherits the benchmark's affinity: the benchmark pinned to the
    client's cores first made a whole group start on them (2026-12-03). bring_up starts each
    group on every core, then pins the servers' roles and itself to the client's."""
    every = frozenset(os.sched_getaffinity(0))
    client = frozenset({min(every)})
    rest = every - client
    plan = {"client": client, "scheduler": rest, "detokenizer": rest, "server": rest}
    at_start = {}

    def start_all(servers, timeout):
        for s in servers:
            s.process = subprocess.Popen(["sleep", "30"], start_new_session=True)
            at_start[s.name] = os.sched_getaffinity(s.process.pid)
            s.status, s.ready_after_s = "ready", 0.0

    monkeypatch.setattr(bs, "start_all", start_all)
    server = types.SimpleNamespace(name="spec", status="starting", process=None)
    os.sched_setaffinity(0, client)  # as after the previous group's measurements
    try:
        pinned = bs.bring_up([server], 5, plan, every)
        assert at_start == {"spec": every}
        assert pinned == {"spec": {"scheduler": 0, "detokenizer": 0, "server": 1}}
        assert os.sched_getaffinity(server.process.pid) == rest
        assert os.sched_getaffinity(0) == client
    finally:
        os.sched_setaffinity(0, every)
        if server.process:
            server.process.kill()
            server.process.wait()
