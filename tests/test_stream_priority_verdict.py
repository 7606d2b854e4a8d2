"""stream_priority_verdict: the registered high-priority run read from its bench (each server
over its own group's baseline) and each server's slim trace (regimes of whole steps)."""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path

import pytest

from sglang_ext_tools import bench_speed as bs
from sglang_ext_tools import stream_priority_verdict as pv

RESULTS = Path(__file__).resolve().parents[1] / "tests/gpu/results"
RUN = RESULTS / "seed-shape-2026-12-07-serial-nvidia-h100-sglang0.5.23"
HIGH_RUN = RESULTS / "seed-shape-2026-12-07-high-nvidia-h100-sglang0.5.23"
UP = "fused_moe_kernel"


def steps(ups, period_us, grid, layers=3):
    """Target graph launches ``period_us`` apart, each with ``layers`` up-projections (``ups``
    µs, one value per step) and down-projections (grid 1792, 14 µs)."""
    events = []
    for i, us in enumerate(ups):
        t0 = period_us * (i + 1)
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch",
                       "ts": t0 - 5, "dur": 4, "args": {"correlation": i + 1}})  # fmt: skip
        for j in range(layers):
            t = t0 + 100 * j
            for x, dur in ((grid, us), (1792, 14)):
                events.append({"ph": "X", "cat": "kernel", "name": UP, "ts": t, "dur": dur,
                               "args": {"grid": [x, 1, 1], "correlation": i + 1}})  # fmt: skip
                t += dur
    return {"traceEvents": events}


def timed(server, group, scale, tau=None):
    latencies = [scale * x for x in (1.0, 1.1, 0.9, 1.2)]
    tokens = 128 * len(latencies)
    return {"round": 0, "server": server, "batch": 1, "status": "ok", "tokens": tokens,
            "tok_s": tokens / sum(latencies), "latency_s": latencies, "group": group,
            "verify": tokens / tau if tau else None,
            "verify_tokens": tokens if tau else 0, "errors": 0}  # fmt: skip


def bench(speeds, label="high"):
    """A run of the registered servers, each beside the baseline (``speeds``: server -> its
    speed over the baseline; a variant not named there is not in the run); the baseline 5 %
    slower in each later group (drift)."""
    every = {f"spec-3-1-4-{label}": f"{label}@3,1,4:SGLANG_EXT_MOE_SHARED_STREAM={label}",
             f"nospec-{label}": f"{label}@nospec:SGLANG_EXT_MOE_SHARED_STREAM={label}",
             "nospec-serial": "serial@nospec:SGLANG_EXT_MOE_SHARED_STREAM=0",
             "spec-3-1-4-serial": "serial@3,1,4:SGLANG_EXT_MOE_SHARED_STREAM=0"}  # fmt: skip
    variants = [bs.parse_variant(v) for name, v in every.items() if name in speeds]
    specs = bs.server_specs([(3, 1, 4)], None, variants)
    groups = bs.plan_groups(specs, at_once=2)
    ms = []
    for g, (_, name) in enumerate(groups):
        drift = 1.05**g
        ms.append(timed("nospec", g, drift))
        tau = 1.0 if name.startswith("spec") else None
        ms.append(timed(name, g, drift / speeds[name], tau))
    servers = [{"name": s["name"], "status": "ready", "ready_after_s": 60.0} for s in specs]
    out = bs.build_result({"batches": [1]}, servers, ms, specs, None, None, groups)
    return out | {"gpu": "NVIDIA H100 80GB HBM3", "gpu_info": {"uuid": "GPU-x"}}


SPEEDS = {"spec-3-1-4": 0.78, "spec-3-1-4-high": 0.96, "nospec-high": 1.18,
          "nospec-serial": 1.08, "spec-3-1-4-serial": 0.89}  # fmt: skip


def write(folder, traces):
    for server, trace in traces.items():
        with gzip.open(folder / f"{server}.trace.json.gz", "wt") as fh:
            json.dump(trace, fh)


def test_the_priority_honored_reads_cheap_hidden_and_within(tmp_path):
    write(tmp_path, {
        "nospec": steps([26] * 4 + [56] * 6, 8000, 128),
        "nospec-high": steps([26] * 10, 6800, 128),
        "nospec-serial": steps([26] * 10, 7600, 128),
        "spec-3-1-4": steps([63] * 10, 10300, 544),
        "spec-3-1-4-high": steps([31] * 10, 8300, 544),
        "spec-3-1-4-serial": steps([31] * 10, 9000, 544),
    })  # fmt: skip
    v = pv.verdict(bench(SPEEDS), tmp_path, pv.ROLES, "speed.json")
    assert v["ready_within_150s"] is True
    assert v["checks"] == {"high_nospec_no_dear_step": True, "high_verify_no_dear_step": True,
                           "high_nospec_hides_the_shared_expert": True}  # fmt: skip
    assert v["regimes"]["baseline"]["flips"] == 1
    s = v["speed"]
    # each over its own group's baseline: the drift between groups cancels
    assert s["high_nospec_over_serial_nospec"]["ratio"] == pytest.approx(1.18 / 1.08, abs=1e-4)
    assert s["high_over_serial"]["ratio"] == pytest.approx(0.96 / 0.89, abs=1e-4)
    assert s["high_over_plain"]["ratio"] == pytest.approx(0.96 / 0.78, abs=1e-4)
    assert s["high_over_high_nospec"]["ratio"] == pytest.approx(0.96 / 1.18, abs=1e-4)
    assert [s[k]["reading"] for k in pv.SPEED] == ["within"] * 4 + ["recorded"]
    assert s["high_nospec_over_baseline"]["ratio"] == pytest.approx(1.18, abs=1e-4)


def test_the_priority_ignored_is_read_as_such_on_the_committed_traces(tmp_path):
    """The 2026-12-07 serial run's servers in the registered roles: its plugin-only server
    (SGLang's second stream, default priority) as ``high@nospec`` and its plain 5/1/6 as
    ``high``, what an unhonored priority would serve. The verdict names the dear stretch and
    the unhidden shared expert, and reads the speed ratios below their ranges."""
    with tarfile.open(f"{RUN}-moe-traces.tgz") as tgz:
        tgz.extractall(tmp_path, filter="data")
    data = json.loads(Path(f"{RUN}-speed-rebuilt.json").read_text())
    roles = pv.ROLES | {"plain": "spec-5-1-6", "high": "spec-5-1-6",
                        "high_nospec": "nospec-plugin", "serial": "spec-5-1-6-serial"}  # fmt: skip
    v = pv.verdict(data, tmp_path, roles, "speed.json")
    assert v["checks"] == {"high_nospec_no_dear_step": False, "high_verify_no_dear_step": False,
                           "high_nospec_hides_the_shared_expert": False}  # fmt: skip
    assert v["regimes"]["high_nospec"]["flips"] == 1
    assert v["speed"]["high_nospec_over_serial_nospec"]["reading"] == "below"
    assert v["speed"]["high_over_serial"]["reading"] == "below"


def test_a_missing_traces_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="--traces .*nothere: no such folder"):
        pv.verdict(bench(SPEEDS), tmp_path / "nothere", pv.ROLES, "speed.json")


def reread(run: Path, module, folder: Path, parts=("moe-traces",)) -> dict:
    """A committed run's verdict read again by ``module`` from its committed archives
    (``parts``, unpacked into ``folder``), held equal to the committed verdict file; that file."""
    for part in parts:
        with tarfile.open(f"{run}-{part}.tgz") as tgz:
            tgz.extractall(folder, filter="data")
    data = json.loads(Path(f"{run}-speed.json").read_text())
    v = module.verdict(data, folder, module.ROLES, f"{run.name}-speed.json")
    committed = json.loads(Path(f"{run}-verdict.json").read_text())
    assert json.loads(json.dumps(v)) == committed
    return committed


def test_the_high_run_reproduces_its_committed_verdict(tmp_path):
    """The run that went out (2026-12-07, twenty-fourth session): every step of the ``high``
    servers dear, every registered ratio below its range but the η ceiling's."""
    committed = reread(HIGH_RUN, pv, tmp_path)
    assert set(committed["checks"].values()) == {False}
    assert [committed["speed"][k]["reading"] for k in pv.SPEED] == (
        ["below"] * 3 + ["within", "recorded"]
    )
    high = committed["regimes"]["high_nospec"]["regimes"]
    serial = committed["regimes"]["serial_nospec"]["regimes"]
    clear = serial["one"]["kernel_median_us"]
    assert [r["kernel_median_us"] > 2 * clear for r in high.values()] == [True]


def test_the_server_logs_beside_the_traces_say_what_the_switch_changed(tmp_path):
    """With the run's server logs unpacked into the traces folder, the verdict reads how many
    MoE layers each switched server's log names (60 at the rank shape); without them it reads
    as committed (no ``logs``)."""
    for part in ("moe-traces", "server-logs"):
        with tarfile.open(f"{HIGH_RUN}-{part}.tgz") as tgz:
            tgz.extractall(tmp_path, filter="data")
    data = json.loads(Path(f"{HIGH_RUN}-speed.json").read_text())
    v = pv.verdict(data, tmp_path, pv.ROLES, "speed.json")
    assert v["logs"] == {r: {"moe_layers": 60, "forks": None}
                         for r in ("high", "high_nospec", "serial", "serial_nospec")}  # fmt: skip
    assert v["checks"]["logs_name_every_moe_layer"] is True
    assert "join_forks_captured" not in v["checks"]
