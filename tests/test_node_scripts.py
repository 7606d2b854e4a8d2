"""The GPU-node procedure (gpu_node.sh) checked on CPU: the node cannot be reached from here,
so a path the script names that is not in the tree would only show there, one device call too
late. Here: the script parses, every repo path and module it names exists, the checkout copies
its pipelines run from hold every folder they use."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "node" / "gpu_node.sh"
TEXT = SCRIPT.read_text(encoding="utf-8")
# Top-level folders of this repo that the script may name by a relative path.
TOP = ("scripts", "node", "locks", "patches", "tests", "sglang_ext", "sglang_ext_tools")
PATH_RE = re.compile(rf"(?<![\w./-])(?:/tmp/repo[\w-]*/)?((?:{'|'.join(TOP)})/[\w.$/{{}}-]*[\w}}])")


def repo_paths() -> set[str]:
    """Every relative repo path in the script (comments included: the header's commands are
    run by hand); a component with a shell variable counts up to the folder before it."""
    out = set()
    for match in PATH_RE.finditer(TEXT):
        parts = match.group(1).split("/")
        kept = []
        for part in parts:
            if "$" in part or "*" in part:
                break
            kept.append(part)
        out.add("/".join(kept))
    return out


def fake_python(tmp_path: Path, script: str) -> dict[str, str]:
    """An env whose ``python3`` is ``script`` (sh), for steps checked without doing work."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(f"#!/bin/sh\n{script}\n")
    (fake / "python3").chmod(0o755)
    return {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HOME": str(tmp_path)}


def copied(function: str) -> list[str]:
    """What ``function`` (copy_repo, sync_latest) copies into its checkout copy."""
    body = TEXT.split(f"{function}() {{", 1)[1].split("\n}", 1)[0]
    (line,) = re.findall(r"cp -r (.+?) /tmp/repo[\w-]*/", body)
    return line.split()


def test_gpu_node_sh_parses():
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    proc = subprocess.run([bash, "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_path_gpu_node_sh_names_exists():
    paths = repo_paths()
    assert any(p.endswith("gpu_node.sh") for p in paths)  # the extraction sees the recursion
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{SCRIPT.relative_to(ROOT)} names paths not in the repo: {missing}"


def test_every_module_gpu_node_sh_runs_exists():
    modules = set(re.findall(r"python3? -m (sglang_ext\w*(?:\.\w+)+)", TEXT))
    missing = sorted(
        m for m in modules
        if not (ROOT.joinpath(*m.split(".")).with_suffix(".py").is_file()
                or (ROOT.joinpath(*m.split(".")) / "__main__.py").is_file())
    )  # fmt: skip
    assert not missing, missing


@pytest.mark.parametrize("function", ["copy_repo", "sync_latest"])
def test_the_checkout_copies_hold_folders_that_exist(function):
    names = copied(function)
    assert names, function
    missing = [n for n in names if not (ROOT / n).exists()]
    assert not missing, f"{function} copies {missing}, not in the repo"


def test_the_copies_hold_every_folder_the_script_uses():
    """The pipelines run from /tmp/repo (copy_repo) and /tmp/repo-suite (sync_latest's copy):
    each top-level folder the script names must travel with the newest checkout, and the
    pipeline copy must hold the code it runs."""
    latest, pipeline = set(copied("sync_latest")), set(copied("copy_repo"))
    assert pipeline <= latest
    used = {p.split("/")[0] for p in repo_paths()} | {"sglang_ext_tools", "pyproject.toml"}
    assert used <= pipeline, sorted(used - pipeline)


def case_steps() -> set[str]:
    """The subcommands: the labels of the script's top-level ``case "$step"``."""
    body = TEXT.split('case "$step" in\n', 1)[1].rsplit("\nesac", 1)[0]
    return set(re.findall(r"^([a-z0-9][a-z0-9-]*)\)$", body, flags=re.M))


def header_steps() -> set[str]:
    """The subcommands the header lists: ``#   bash node/gpu_node.sh STEP ...`` lines."""
    header = TEXT.split("\nset -euo pipefail", 1)[0]
    return set(re.findall(r"^#\s+bash \S*gpu_node\.sh ([a-z0-9-]+)", header, flags=re.M))


def test_the_header_lists_every_subcommand():
    assert len(case_steps()) > 20
    assert header_steps() == case_steps(), (
        f"only in the case: {sorted(case_steps() - header_steps())}; "
        f"only in the header: {sorted(header_steps() - case_steps())}"
    )


def test_every_step_the_script_calls_itself_with_is_a_subcommand():
    called = set(re.findall(r"bash \S*gpu_node\.sh ([a-z0-9-]+)", TEXT))
    assert called <= case_steps(), sorted(called - case_steps())


def test_the_bench_limit_comes_from_the_lease(tmp_path):
    """bench_limit: without a deadline the variable, else the default; with one (one-install's
    LEFT_S) what the lease has left less 90 s for the last poll and the reserve for what runs
    after, capped by the variable: a bench never outlives the machine it runs on."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    body = "bench_limit() {" + TEXT.split("bench_limit() {", 1)[1].split("\n}", 1)[0] + "\n}"
    script = (
        f"SUITE={tmp_path}\n{body}\n"
        'bench_limit "" 1000; bench_limit 700 1000\n'
        f"echo $(($(date +%s) + 500)) >{tmp_path}/DEADLINE\n"
        'bench_limit "" 1000; bench_limit 700 1000; bench_limit 300 1000; '
        'bench_limit "" 1000 200\n'
    )
    proc = subprocess.run([bash, "-c", script], capture_output=True, text=True, check=True)
    figures = list(map(int, proc.stdout.split()))
    assert figures[:2] == [1000, 700]  # no deadline
    lease, capped_by_lease, capped_by_var, reserved = figures[2:]
    assert 405 <= lease <= 410 and capped_by_lease == lease
    assert capped_by_var == 300
    assert 205 <= reserved <= 210


def _functions(*names: str) -> str:
    return "\n".join(
        f"{name}() {{" + TEXT.split(f"\n{name}() {{", 1)[1].split("\n}", 1)[0] + "\n}"
        for name in names
    )


def test_the_waits_bring_a_prepared_bundle_back_in_the_room_their_files_leave(tmp_path):
    """ship_once / ship_parts as the waits call them, over four polls into fresh $OUT folders
    (the device tool's NN/ folders): what is written once comes back once, each poll adds at
    most 3 parts and never more than 8 files, DONE (SHIP_ALL) resends the rest; then `ferry.py
    collect` gathers the bundle from the polls' folders, whole."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    packs = tmp_path / "packs"
    bundle = tmp_path / "mla-fixtures.tar"
    bundle.write_bytes(bytes(range(256)) * 28_000)  # 7.2 MB: 8 parts of 1 MB
    subprocess.run(
        [sys.executable, str(ROOT / "node" / "ferry.py"), "split", str(bundle), "--out",
         str(packs / "mla-pack" / "parts"), "--part-bytes", "1000000"],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    (packs / "mla-pack" / "READY").touch()
    static = tmp_path / "mla-fixtures.json"
    static.write_text("{}")
    results = [tmp_path / f"r{i}.json" for i in range(5)]
    for result in results:
        result.write_text("{}")
    device = tmp_path / "device"
    counts = []
    for poll in range(4):
        out = device / f"{poll:02d}"
        out.mkdir(parents=True)
        always = results if poll == 1 else results[:2]  # poll 1: five result files
        script = (
            f"PACKS={packs} OUT={out}\n"
            f"{_functions('ship_key', 'shipped', 'ship_once', 'ship_parts')}\n"
            f"{'export SHIP_ALL=1' if poll == 3 else ''}\n"
            f"cp {' '.join(map(str, always))} $OUT/\n"
            f"ship_once {static}\nship_parts mla mla-fixtures.tar\n"
        )
        subprocess.run([bash, "-c", script], check=True, capture_output=True, text=True)
        names = sorted(p.name for p in out.iterdir())
        counts.append(names)
        assert len(names) <= 8
        assert sum(name.startswith("part-") for name in names) <= 3
    first, second, third, last = counts
    assert "mla-fixtures.json" in first and "manifest.json" in first
    assert [n for n in first if n.startswith("part-")] == ["part-00", "part-01", "part-02"]
    assert "mla-fixtures.json" not in second and len(second) == 8  # 5 results, room for 3
    assert "mla-fixtures.json" not in third
    assert "mla-fixtures.json" in last  # DONE: all again
    spec = importlib.util.spec_from_file_location("ferry_mod", ROOT / "node" / "ferry.py")
    ferry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ferry)
    status = ferry.collect("mla-fixtures.tar", device, tmp_path / "ferry")
    assert status["missing"] == []
    joined = ferry.join(tmp_path / "ferry" / "mla-fixtures.tar" / "manifest.json",
                        tmp_path / "ferry" / "mla-fixtures.tar", tmp_path / "joined")  # fmt: skip
    assert joined.read_bytes() == bundle.read_bytes()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("pin", ["auto", None])
def test_speed_bench_hands_bench_pin_cpus_to_the_benchmark(tmp_path, pin):
    """BENCH_PIN_CPUS becomes bench_speed's --pin-cpus (cpu_pinning), before the step's own
    arguments; unset, the benchmark runs unpinned as before."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "args"}\n')
    (fake / "python3").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HOME": str(tmp_path)}
    if pin:
        env["BENCH_PIN_CPUS"] = pin
    subprocess.run(["bash", str(SCRIPT), "speed-bench", "--rounds", "1"], env=env, cwd=ROOT,
                   capture_output=True, check=False, timeout=60)  # fmt: skip
    args = (tmp_path / "args").read_text().split()
    assert args[:2] == ["-m", "sglang_ext_tools.bench_speed"] and args[-2:] == ["--rounds", "1"]
    assert ("--pin-cpus" in args) is bool(pin)
    if pin:
        assert args[args.index("--pin-cpus") + 1] == "auto"


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")
def test_a_speed_bench_stopped_at_its_limit_still_packs_the_server_logs(tmp_path):
    """The pipeline stops the bench with `timeout -s INT`: the benchmark ends, the step goes
    on to pack the server logs."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\nexec sleep 30\n")
    (fake / "python3").chmod(0o755)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "server-spec-3-1-4.log").write_text("ready\n")
    env = {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HOME": str(tmp_path),
           "SGLANG_EXT_LOG_DIR": str(logs)}  # fmt: skip
    subprocess.run(["timeout", "-s", "INT", "2", "bash", str(SCRIPT), "speed-bench"], env=env,
                   cwd=ROOT, capture_output=True, check=False, timeout=60)  # fmt: skip
    packed = tmp_path / "out" / "server-logs.tgz"
    assert packed.is_file()
    listing = subprocess.run(["tar", "-tzf", str(packed)], capture_output=True, text=True)
    assert "./server-spec-3-1-4.log" in listing.stdout.split()


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")
def test_a_seed_shape_bench_stopped_at_its_limit_skips_to_the_advisor_and_the_logs(tmp_path):
    """Stopped inside its probe, the seed-shape bench starts no trained matrix (the device
    time is spent), still runs the advisor on what there is (bench_speed writes its JSON
    after every measurement: the fake probe's first) and packs the server logs."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "python3").write_text(
        f'#!/bin/sh\necho "$2" >> {calls}\n'
        'case "$*" in *seed-shape-probe.json*) mkdir -p "$OUT"; '
        'echo {} > "$OUT/seed-shape-probe.json";; esac\n'
        'case "$2" in sglang_ext_tools.bench_speed) exec sleep 30;; esac\nexit 0\n'
    )
    (fake / "python3").chmod(0o755)
    mla, logs = tmp_path / "mla", tmp_path / "logs"
    (mla / "wide-target").mkdir(parents=True)
    (mla / "wide-target" / "config.json").write_text("{}")
    logs.mkdir()
    (logs / "server-nospec.log").write_text("ready\n")
    env = {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HOME": str(tmp_path),
           "SGLANG_EXT_LOG_DIR": str(logs), "SGLANG_EXT_MLA_DIR": str(mla),
           "SEED_MOE_TUNE": "0"}  # fmt: skip
    subprocess.run(["timeout", "-s", "INT", "3", "bash", str(SCRIPT), "seed-shape-bench"],
                   env=env, cwd=ROOT, capture_output=True, check=False, timeout=60)  # fmt: skip
    ran = calls.read_text().split()
    assert ran.count("sglang_ext_tools.bench_speed") == 1  # the probe; no matrix after it
    assert ran[-1] == "sglang_ext.cli"  # the advisor (tune) still ran
    assert (tmp_path / "out" / "server-logs.tgz").is_file()
    # SEED_PROBE=none: no probe, so no costs to advise from; said, and no empty advisor.json
    calls.unlink()
    shutil.rmtree(tmp_path / "out")
    subprocess.run(["timeout", "-s", "INT", "3", "bash", str(SCRIPT), "seed-shape-bench"],
                   env={**env, "SEED_PROBE": "none"}, cwd=ROOT, capture_output=True,
                   check=False, timeout=60)  # fmt: skip
    assert calls.read_text().split().count("sglang_ext.cli") == 1  # convert only, no tune
    assert not (tmp_path / "out" / "advisor.json").exists()
    assert "no zero-acceptance probe" in (tmp_path / "out" / "bench.log").read_text()


@pytest.mark.skipif(
    not all(shutil.which(t) for t in ("bash", "setsid", "timeout", "pgrep", "pkill")),
    reason="needs bash, setsid, coreutils timeout and procps",
)
def test_stop_session_stops_a_pipeline_and_lets_its_bench_finish_as_at_its_limit(tmp_path):
    """stop_session (speed-rebench): the pipeline goes first and starts nothing more; the
    step under `timeout` gets SIGINT, as at its limit, and the time to write what it has; a
    background trainer is terminated; nothing of the session is left."""
    pidfile, marker, after = tmp_path / "pipeline.pid", tmp_path / "int", tmp_path / "after"
    bench = tmp_path / "bench.py"  # counts the SIGINTs of its first second, then ends
    bench.write_text(
        "import signal, time\n"
        "got = []\n"
        "signal.signal(signal.SIGINT, lambda *a: got.append(1))\n"
        "while not got:\n    time.sleep(0.05)\n"
        "time.sleep(1.0)\n"
        f"open({str(marker)!r}, 'w').write('int ' * len(got))\n"
    )
    pipeline = (
        f"echo $$ > {pidfile}; sleep 300 & "
        f"timeout -s INT 120 {sys.executable} {bench}; echo continued > {after}"
    )
    proc = subprocess.Popen(["setsid", "bash", "-c", pipeline])
    try:
        deadline = time.time() + 10
        while not (pidfile.is_file() and pidfile.read_text().strip()):
            assert time.time() < deadline, "the pipeline never wrote its pid"
            time.sleep(0.05)
        sid = pidfile.read_text().strip()
        while not subprocess.run(["pgrep", "-s", sid, "-f", str(bench)]).returncode == 0:
            assert time.time() < deadline, "the bench never started"
            time.sleep(0.05)
        time.sleep(0.5)  # its handler installed
        started = time.time()
        script = f"{_functions('stop_session')}\nstop_session {pidfile} 20\n"
        subprocess.run(["bash", "-c", script], check=True, timeout=60)
        assert time.time() - started < 15
        assert marker.read_text().split() == ["int"]  # one SIGINT, then its second of cleanup
        assert not after.exists()
        assert not pidfile.exists()
        assert proc.wait(timeout=5) != 0  # the pipeline, killed (reaped: no zombie counts)
        left = subprocess.run(["pgrep", "-s", sid], capture_output=True, text=True).stdout
        assert left == ""
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], check=False)
        proc.wait(timeout=10)


@pytest.mark.skipif(
    not all(shutil.which(t) for t in ("bash", "ps", "pgrep")), reason="needs bash and procps"
)
def test_stop_session_leaves_a_reused_pid_alone(tmp_path):
    """An ended pipeline's pid file may name a process that took the number since: one that
    leads no session is left running, and the stale file goes."""
    other = subprocess.Popen(["sleep", "30"])  # this test's session, not its own
    pidfile = tmp_path / "pipeline.pid"
    pidfile.write_text(f"{other.pid}\n")
    try:
        script = f"{_functions('stop_session')}\nstop_session {pidfile} 5\n"
        subprocess.run(["bash", "-c", script], check=True, timeout=30)
        assert other.poll() is None and not pidfile.exists()
    finally:
        other.kill()
        other.wait()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_speed_rebench_refuses_a_folder_without_widened_fixtures(tmp_path):
    """speed-rebench only re-runs benches: with no widened fixtures it says so and starts
    nothing (no pipeline stopped, no result moved)."""
    speed = tmp_path / "speed"
    (speed / "result").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HOME": str(tmp_path),
           "SGLANG_EXT_SPEED_DIR": str(speed)}  # fmt: skip
    proc = subprocess.run(["bash", str(SCRIPT), "speed-rebench", "--rounds", "1"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2
    assert "stage-widen-drafters.json" in proc.stderr and "speed-one-start" in proc.stderr
    assert sorted(p.name for p in speed.iterdir()) == ["result"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_seed_probe_args_reach_the_probe_and_only_the_probe(tmp_path):
    """SEED_PROBE_ARGS (a --variant server for the zero-acceptance probe, e.g. the MoE config
    with 4 tokens on 6's entry) go to the probe's bench_speed call, not to the matrix's."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "python3").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 0\n')
    (fake / "python3").chmod(0o755)
    mla, logs = tmp_path / "mla", tmp_path / "logs"
    (mla / "wide-target").mkdir(parents=True)
    (mla / "wide-target" / "config.json").write_text("{}")
    logs.mkdir()
    variant = "--variant moe4as6@3,1,4:SGLANG_MOE_CONFIG_DIR=/tmp/seed/moe-configs-4as6"
    env = {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HOME": str(tmp_path),
           "SGLANG_EXT_LOG_DIR": str(logs), "SGLANG_EXT_MLA_DIR": str(mla),
           "SEED_MOE_TUNE": "0", "SEED_PROBE_ARGS": variant}  # fmt: skip
    subprocess.run(["bash", str(SCRIPT), "seed-shape-bench"], env=env, cwd=ROOT,
                   capture_output=True, check=False, timeout=60)  # fmt: skip
    benches = [c for c in calls.read_text().splitlines() if "sglang_ext_tools.bench_speed" in c]
    probes = [c for c in benches if "--log-dir " + str(logs / "probe-fa3") in c]
    assert len(probes) == 1 and variant in probes[0]
    others = [c for c in benches if c not in probes]
    assert others and not any("--variant" in c for c in others)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_tuned_moe_config_is_served_and_its_block_n_64_copy_written_beside_it(tmp_path):
    """seed-shape-bench tunes first; when the tuner succeeds every bench_speed call runs with
    its directory in SGLANG_MOE_CONFIG_DIR, and moe_config_alias writes the copy with block N
    64 at the verify sizes (4, 5, 6 tokens) for a variant server, after an earlier run's copy
    is removed. The tuner then times 4-6 tokens beside the shared expert (report only;
    SEED_MOE_SHARED_TUNE_S=0 skips it). SEED_SECOND_PAIR=0 drops the second plugin/stock
    pair; SEED_PREFILL_GRAPH reaches the probe's and the matrix's servers alike."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "python3").write_text(
        f'#!/bin/sh\necho "MOE=$SGLANG_MOE_CONFIG_DIR $*" >> {calls}\nexit 0\n'
    )
    (fake / "python3").chmod(0o755)
    mla, logs, seed = tmp_path / "mla", tmp_path / "logs", tmp_path / "seed"
    (mla / "wide-target").mkdir(parents=True)
    (mla / "wide-target" / "config.json").write_text("{}")
    # no logs folder: the shared-stream tuner's report is written before bench_speed makes it
    (seed / "moe-configs-bn64").mkdir(parents=True)  # an earlier run's copy
    env = {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HOME": str(tmp_path),
           "SGLANG_EXT_LOG_DIR": str(logs), "SGLANG_EXT_MLA_DIR": str(mla),
           "SGLANG_EXT_SEED_DIR": str(seed)}  # fmt: skip
    subprocess.run(["bash", str(SCRIPT), "seed-shape-bench"], env=env, cwd=ROOT,
                   capture_output=True, check=False, timeout=60)  # fmt: skip
    lines = calls.read_text().splitlines()
    tune = next(i for i, c in enumerate(lines) if "sglang_ext_tools.tune_moe" in c)
    alias = next(i for i, c in enumerate(lines) if "sglang_ext_tools.moe_config_alias" in c)
    assert tune < alias
    assert f"--out {seed}/moe-configs-bn64 --set 4,5,6:BLOCK_SIZE_N=64" in lines[alias]
    assert not (seed / "moe-configs-bn64").exists()  # removed before; the fake wrote nothing
    # the verify sizes timed again beside the shared expert, reported into the logs' archive
    shared = [c for c in lines if "tune_moe" in c and "--beside-shared" in c]
    assert len(shared) == 1 and "--tokens 4 5 6" in shared[0]
    assert f"--json {logs}/tune-moe-shared.json" in shared[0]
    assert (logs / "tune-moe-shared.log").is_file()  # its redirect found the folder
    benches = [c for c in lines if "sglang_ext_tools.bench_speed" in c]
    assert benches and all(c.startswith(f"MOE={seed}/moe-configs ") for c in benches)
    matrix = [c for c in benches if "--acceptance-dir" in c]
    assert len(matrix) == 1 and "--second-pair" in matrix[0]
    assert not any("--prefill-graph" in c for c in benches)  # eager unless asked
    calls.unlink()
    env |= {"SEED_MOE_SHARED_TUNE_S": "0", "SEED_SECOND_PAIR": "0",
            "SEED_PREFILL_GRAPH": "breakable"}  # fmt: skip
    subprocess.run(["bash", str(SCRIPT), "seed-shape-bench"], env=env, cwd=ROOT,
                   capture_output=True, check=False, timeout=60)  # fmt: skip
    lines = calls.read_text().splitlines()
    assert not any("--beside-shared" in c for c in lines)
    matrix = [c for c in lines if "bench_speed" in c and "--acceptance-dir" in c]
    assert len(matrix) == 1 and "--second-pair" not in matrix[0]
    benches = [c for c in lines if "sglang_ext_tools.bench_speed" in c]
    assert len(benches) == 2 and all("--prefill-graph breakable" in c for c in benches)
    # SEED_PROBE=none: the matrix alone; SEED_PAIR=0: no plugin/stock pair in it
    calls.unlink()
    env |= {"SEED_PROBE": "none", "SEED_PAIR": "0"}
    subprocess.run(["bash", str(SCRIPT), "seed-shape-bench"], env=env, cwd=ROOT,
                   capture_output=True, check=False, timeout=60)  # fmt: skip
    benches = [c for c in calls.read_text().splitlines() if "bench_speed" in c]
    assert len(benches) == 1 and "--acceptance-dir" in benches[0]
    assert "--drafter-nbr-false" not in benches[0] and "--compare-setting" not in benches[0]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_speed_rebench_refuses_a_running_pipeline_it_cannot_stop(tmp_path):
    """A pipeline that left no pipeline.pid (started before speed-rebench existed) and is
    neither DONE nor FAILED may still write its result: speed-rebench says so and moves
    nothing."""
    speed = tmp_path / "speed"
    (speed / "result").mkdir(parents=True)
    for name in ("stage-widen-drafters.json", "pipeline.log"):
        (speed / name).write_text("{}")
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HOME": str(tmp_path),
           "SGLANG_EXT_SPEED_DIR": str(speed)}  # fmt: skip
    proc = subprocess.run(["bash", str(SCRIPT), "speed-rebench"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "left no pipeline.pid" in proc.stderr
    assert sorted(p.name for p in speed.iterdir()) == [
        "pipeline.log", "result", "stage-widen-drafters.json"
    ]


@pytest.mark.skipif(
    not all(shutil.which(t) for t in ("bash", "ps", "awk")), reason="needs bash, ps and awk"
)
def test_gpu_idle_kills_what_still_holds_the_gpu_by_its_process_group(tmp_path):
    """gpu_idle (speed-rebench): a server left on the GPU after the wait is killed with its
    process group, and the step returns once the GPU is free; an empty GPU returns at once."""
    server = subprocess.Popen(["sleep", "60"], start_new_session=True)  # its own group
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(
        "#!/bin/sh\n"
        f"st=$(awk '{{print $3}}' /proc/{server.pid}/stat 2>/dev/null)\n"
        f'[ -n "$st" ] && [ "$st" != Z ] && echo {server.pid}\nexit 0\n'
    )
    (fake / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin"}
    script = f"{_functions('gpu_idle', 'gpu_free')}\ngpu_idle 1\n"
    try:
        started = time.time()
        subprocess.run(["bash", "-c", script], env=env, check=True, timeout=60)
        assert server.wait(timeout=5) == -9 and time.time() - started < 10
        started = time.time()
        subprocess.run(["bash", "-c", script], env=env, check=True, timeout=60)
        assert time.time() - started < 1  # nothing on the GPU: no wait
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


def test_speed_unpack_refuses_both_a_resumed_and_a_fresh_drafter(tmp_path):
    """SPEED_RESUME_STEPS_SCALE continues the carried nbr=true drafter, SPEED_FRESH_DRAFTER_ARGS
    trains a new one beside it: both at once is refused before the bundle is touched."""
    speed = tmp_path / "speed"
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HOME": str(tmp_path),
           "SGLANG_EXT_SPEED_DIR": str(speed), "SPEED_RESUME_STEPS_SCALE": "3",
           "SPEED_FRESH_DRAFTER_ARGS": "--drafter-mlp-scale 4"}  # fmt: skip
    proc = subprocess.run(["bash", str(SCRIPT), "speed-unpack"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2
    assert "SPEED_RESUME_STEPS_SCALE and SPEED_FRESH_DRAFTER_ARGS both set" in proc.stderr
    assert not speed.exists()


@pytest.mark.parametrize(
    "env, drafter",
    [({"SPEED_FRESH_DRAFTER_ARGS": "--drafter-mlp-scale 4 --drafter-steps-scale 3"},
      "--stage drafter --nbr true --drafter-mlp-scale 4 --drafter-steps-scale 3"),
     ({"SPEED_RESUME_STEPS_SCALE": "3", "SPEED_RESUME_LR_SCALE": "0.3"},
      "--stage drafter --nbr true --resume --drafter-steps-scale 3 --drafter-lr-scale 0.3")],
)  # fmt: skip
def test_speed_unpack_trains_the_drafter_each_way_between_the_same_stages(tmp_path, env, drafter):
    """A new drafter or the carried one continued: the same stages around it (its text
    again, the target widened beside it, then the drafters), only the drafter's flags
    differ. python3 is a stub that records each call."""
    stub = tmp_path / "bin"
    stub.mkdir()
    calls = tmp_path / "calls.log"
    (stub / "python3").write_text(f'#!/bin/bash\necho "$*" >> {calls}\n')
    (stub / "python3").chmod(0o755)
    speed = tmp_path / "speed"
    speed.mkdir()
    env = {"PATH": f"{stub}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HOME": str(tmp_path),
           "SGLANG_EXT_SPEED_DIR": str(speed), **env}  # fmt: skip
    proc = subprocess.run(["bash", str(SCRIPT), "speed-unpack"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for _ in range(50):  # the bundle is packed in the background
        lines = [x for x in calls.read_text().splitlines() if "make_speed_fixtures" in x]
        stages = [re.sub(r"--out \S+ ?", "", x.split("make_speed_fixtures ", 1)[1]) for x in lines]
        if len(stages) == 4:
            break
        time.sleep(0.1)
    assert stages[0] == "--stage drafter-data" and stages[-1] == "--stage widen-drafters"
    assert sorted(stages[1:3]) == sorted(["--stage widen-target", drafter])


PREPARE = ROOT / "node" / "prepare_session.sh"
# the set's wheels prepare_session.sh copies into the training chunk, by name prefix
TRAINING_FROM_SET = (
    "transformers-", "annotated_types", "dill", "distro", "jiter", "loguru", "openai-",
    "pydantic-", "pydantic_core", "sniffio", "typing_inspection",
)  # fmt: skip


def test_prepare_session_names_the_0523_lock_and_parses():
    text = PREPARE.read_text(encoding="utf-8")
    (lock,) = re.findall(r"lock=(\S+)", text)
    assert (ROOT / lock).is_file()
    assert subprocess.run(["bash", "-n", str(PREPARE)]).returncode == 0


def _fake_checkout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A checkout holding only the script, and a 'python' that logs its argv and makes what
    the real one would (the wheelhouse, the ferry parts, the chunk)."""
    root = tmp_path / "co"
    (root / "node").mkdir(parents=True)
    shutil.copy(PREPARE, root / "node" / PREPARE.name)
    calls = tmp_path / "calls.log"
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {calls}\n'
        'case "$*" in\n'
        "  *'wheelhouse.py build'*) mkdir -p .wh523/c1 .wh523/big\n"
        f"    for n in {' '.join(TRAINING_FROM_SET)}; do touch .wh523/c1/${{n}}x.whl; done;;\n"
        "  *'ferry.py split'*) mkdir -p .ferry/wheels523.tar; echo {} >"
        " .ferry/wheels523.tar/manifest.json;;\n"
        "  *'wheelhouse.py split .wh'*) mkdir -p .wh/s1;;\n"
        "esac\n",
        encoding="utf-8",
    )
    fake.chmod(0o755)
    return root, fake, calls


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_prepare_session_builds_what_is_missing_then_nothing(tmp_path):
    root, fake, calls = _fake_checkout(tmp_path)
    script = root / "node" / PREPARE.name
    proc = subprocess.run(["bash", str(script), str(fake)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    steps = calls.read_text().splitlines()
    assert steps[0].startswith("node/wheelhouse.py build --lock node/locks/sglang-0.5.23")
    assert steps[1].startswith("node/ferry.py split ") and steps[1].endswith("/wheels523.tar")
    assert steps[-1] == "node/wheelhouse.py split .wh"
    assert sum("pip download" in s for s in steps) == 7
    copied_in = sorted(p.name for p in (root / ".wh" / "c9").iterdir())
    assert len(copied_in) == len(TRAINING_FROM_SET)
    # a second run finds everything there and calls nothing
    calls.unlink()
    proc = subprocess.run(["bash", str(script), str(fake)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not calls.exists()


@pytest.mark.parametrize("from_report", [None, "tests/gpu/results/r-tune-moe.json"])
def test_seed_shape_bench_serves_a_reports_config_without_tuning(tmp_path, from_report):
    """SEED_MOE_CONFIG_FROM: tune_moe --from-report writes the servers' config and nothing is
    timed; unset, the tuner runs as before. Every python3 call is logged, none does work."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n')
    (fake / "python3").chmod(0o755)
    mla = tmp_path / "mla"
    (mla / "wide-target").mkdir(parents=True)
    (mla / "wide-target" / "config.json").write_text("{}")
    env = {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HOME": str(tmp_path),
           "SGLANG_EXT_MLA_DIR": str(mla), "SGLANG_EXT_SEED_DIR": str(tmp_path / "seed"),
           "SGLANG_EXT_LOG_DIR": str(tmp_path / "logs"), "SEED_PROBE": "none",
           "SEED_PAIR": "0"}  # fmt: skip
    if from_report:
        env["SEED_MOE_CONFIG_FROM"] = from_report
    subprocess.run(["bash", str(SCRIPT), "seed-shape-bench"], env=env, cwd=ROOT,
                   capture_output=True, check=False, timeout=60)  # fmt: skip
    tunes = [c for c in (tmp_path / "calls").read_text().splitlines() if "tune_moe" in c]
    if from_report:
        assert len(tunes) == 1 and f"--from-report {from_report} " in tunes[0]
    else:
        assert tunes and all("--from-report" not in c for c in tunes)
        assert "--time-limit" in tunes[0]


@pytest.mark.parametrize(
    "shape, maker, from_report",
    [
        (None, "make_dummy_8b", None),
        ("rank", "make_dummy_rank", "tests/gpu/results/r-tune-moe.json"),
    ],
)
def test_dummy_prepare_writes_the_shape_asked_for_and_serves_a_reports_config(
    tmp_path, shape, maker, from_report
):
    """DUMMY_SHAPE picks the config-only maker; DUMMY_MOE_CONFIG_FROM has tune_moe write the
    servers' config from a committed report (nothing timed) and points SGLang at it. Every
    python3 call is logged, none does work."""
    env = fake_python(tmp_path, f'echo "$@" >> {tmp_path / "calls"}')
    if shape:
        env["DUMMY_SHAPE"] = shape
    if from_report:
        env["DUMMY_MOE_CONFIG_FROM"] = from_report
    d = tmp_path / "dummyb"
    proc = subprocess.run(["bash", str(SCRIPT), "dummy-prepare", str(d)], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == f"-m sglang_ext_tools.fixtures.{maker} {d}"
    tunes = [c for c in calls if "tune_moe" in c]
    if from_report:
        assert tunes == [
            f"-m sglang_ext_tools.tune_moe --from-report {from_report} --out {d}/moe-configs "
            f"--json {d}/result/tune-moe.json"
        ]
        assert f"SGLANG_MOE_CONFIG_DIR={d}/moe-configs" in proc.stdout
    else:
        assert not tunes and "SGLANG_MOE_CONFIG_DIR=\n" in proc.stdout


def test_dummy_prepare_refuses_an_unknown_shape(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "DUMMY_SHAPE": "70b"}
    argv = ["bash", str(SCRIPT), "dummy-prepare", str(tmp_path / "d")]
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, check=False,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 2
    assert "DUMMY_SHAPE=70b: expected 8b or rank" in proc.stderr
    assert not (tmp_path / "d").exists()


def test_dummy_prepare_stops_when_the_asked_config_cannot_be_rebuilt(tmp_path):
    """No silent fallback to SGLang's default MoE config: the probe compares kernels of the
    report's config, so a failed rebuild stops the pipeline before any server starts."""
    env = fake_python(tmp_path, 'case "$*" in *tune_moe*) exit 2;; esac')
    env.update(DUMMY_SHAPE="rank", DUMMY_MOE_CONFIG_FROM="missing-tune-moe.json")
    argv = ["bash", str(SCRIPT), "dummy-prepare", str(tmp_path / "d")]
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, check=False,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 1
    assert "DUMMY_MOE_CONFIG_FROM=missing-tune-moe.json: no config rebuilt" in proc.stderr
    assert "SGLANG_MOE_CONFIG_DIR" not in proc.stdout


def test_seed_shape_bench_stops_when_the_asked_config_cannot_be_rebuilt(tmp_path):
    """SEED_MOE_CONFIG_FROM that tune_moe cannot rebuild: no server starts on SGLang's default
    config in its place; the bench log says why."""
    calls, out, mla = tmp_path / "calls", tmp_path / "out", tmp_path / "mla"
    env = fake_python(tmp_path, f'echo "$@" >> {calls}\ncase "$*" in *tune_moe*) exit 2;; esac')
    (mla / "wide-target").mkdir(parents=True)
    (mla / "wide-target" / "config.json").write_text("{}")
    env.update(SGLANG_EXT_MLA_DIR=str(mla), SGLANG_EXT_SEED_DIR=str(tmp_path / "seed"),
               SGLANG_EXT_LOG_DIR=str(tmp_path / "logs"), SEED_PROBE="none", SEED_PAIR="0",
               SEED_MOE_CONFIG_FROM="missing-tune-moe.json")  # fmt: skip
    proc = subprocess.run(["bash", str(SCRIPT), "seed-shape-bench"], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert proc.returncode == 1
    assert "SEED_MOE_CONFIG_FROM=missing-tune-moe.json: no config rebuilt" in proc.stderr
    assert "no config rebuilt" in (out / "bench.log").read_text()
    assert not [c for c in calls.read_text().splitlines() if "bench_speed" in c]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_step_started_before_the_site_exists_still_finds_the_cute_dsl(tmp_path):
    """A detached pipeline reads the script's PYTHONPATH when it starts, before one-install
    fills the site; the CuTe DSL's folder (whose .pth a --target site never runs) must be on
    it all the same, or every 0.5.23 llama drafter dies at DualGemm (2026-12-07: three
    dummy-bench servers, ModuleNotFoundError: cutlass)."""
    site = tmp_path / "site-not-yet"
    env = fake_python(tmp_path, f'echo "$PYTHONPATH" > {tmp_path / "pythonpath"}')
    env["SGLANG_EXT_SITE"] = str(site)
    subprocess.run(["bash", str(SCRIPT), "pyrun", "python3"], env=env, cwd=ROOT,
                   capture_output=True, check=True, timeout=60)  # fmt: skip
    entries = (tmp_path / "pythonpath").read_text().strip().split(":")
    assert not site.exists()
    assert entries[0] == str(site)
    assert str(site / "nvidia_cutlass_dsl" / "dsl_packages") in entries


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_install_523_names_the_training_wheel_it_lacks_before_pip_runs(tmp_path):
    """0.5.23's site takes speculators from the training subset (.wh/s1, staged into $WH); a
    lease that never staged it gets the missing wheel and the step that brings it, and pip is
    not called on a glob that matched nothing."""
    env = fake_python(tmp_path, f'echo "$@" >> {tmp_path / "calls"}')
    env["SGLANG_EXT_WH"] = str(tmp_path / "wh-empty")
    proc = subprocess.run(["bash", str(SCRIPT), "install-523"], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert proc.returncode == 2
    assert "no speculators wheel" in proc.stderr and "stage s1" in proc.stderr
    assert not (tmp_path / "calls").exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_slim_profiles_tars_every_servers_trace_as_kernels_only(tmp_path):
    """The dummy bench's profiles come back slimmed (three whole rank-shape traces would pass
    the 16 MiB a returned file may hold): one SERVER.trace.json.gz per server, host events and
    unread args dropped, a server whose trace has no one-token launch included."""
    import gzip
    import json
    import os
    import tarfile

    logs = tmp_path / "logs"
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2,
              "args": {"stream": 7, "grid": [544, 1, 1], "correlation": 9,
                       "queued": 0}}  # fmt: skip
    host = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}
    for server in ("nospec", "spec-5-1-6-serial"):
        (logs / "profiles" / server).mkdir(parents=True)
        with gzip.open(logs / "profiles" / server / f"{server}-1-TP-0.trace.json.gz", "wt") as fh:
            json.dump({"traceEvents": [host, kernel]}, fh)
    tgz = tmp_path / "result" / "slim-traces.tgz"
    tgz.parent.mkdir()
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(tmp_path / "out"),
           "HOME": str(tmp_path), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # fmt: skip
    subprocess.run(["bash", str(SCRIPT), "slim-profiles", str(logs), str(tgz)], env=env,
                   cwd=ROOT, check=True, capture_output=True, timeout=120)  # fmt: skip
    with tarfile.open(tgz) as tar:
        names = sorted(n for n in tar.getnames() if n.endswith(".gz"))
        assert names == ["./nospec.trace.json.gz", "./spec-5-1-6-serial.trace.json.gz"]
        with gzip.open(tar.extractfile(names[0]), "rt") as fh:
            events = json.load(fh)["traceEvents"]
    assert events == [{**kernel, "args": {"stream": 7, "grid": [544, 1, 1], "correlation": 9}}]
    # and cut around the MoE kernels (moe_overlap --around), what a session commits: the
    # kernel here is no MoE one, but each launch's first kernel stays
    with tarfile.open(tgz.parent / "moe-traces.tgz") as tar:
        names = sorted(n for n in tar.getnames() if n.endswith(".gz"))
        assert names == ["./nospec.trace.json.gz", "./spec-5-1-6-serial.trace.json.gz"]
        with gzip.open(tar.extractfile(names[0]), "rt") as fh:
            assert json.load(fh)["traceEvents"] == events
