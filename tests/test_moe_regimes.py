"""moe_regimes: a kernel's instances grouped by the target graph launch (step) that ran them,
the steps split into a cheap and a dear regime; the committed H100 traces read again."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from sglang_ext_tools import moe_regimes as mr

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests/gpu/results/seed-shape-2026-12-07-serial-nvidia-h100-sglang0.5.23"
UP = "fused_moe_kernel"


def step(t0, corr, up_us, layers=3):
    """One decode step: a graph launch at t0 (correlation ``corr``) replaying ``layers``
    up-projections at grid 128 and one down-projection each."""
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t0 - 5,
               "dur": 4, "args": {"correlation": corr}}]  # fmt: skip
    for i in range(layers):
        t = t0 + 100 * i
        for name, grid, dur in ((UP, 128, up_us), (UP, 1792, 14)):
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": dur,
                           "args": {"grid": [grid, 1, 1], "correlation": corr}})  # fmt: skip
            t += dur
    return events


def trace(ups, period=1000.0):
    return {"traceEvents": [e for i, us in enumerate(ups) for e in step(period * i, i + 1, us)]}


def test_steps_split_into_runs_of_a_cheap_and_a_dear_regime():
    out = mr.regimes(trace([26, 26, 56, 56, 56, 26]), UP, 128)
    assert out["steps"] == 6 and out["per_step"] == 3
    assert out["sequence"] == "ccDDDc" and out["flips"] == 2
    assert out["runs"] == [{"regime": "cheap", "steps": 2}, {"regime": "dear", "steps": 3},
                           {"regime": "cheap", "steps": 1}]  # fmt: skip
    assert out["regimes"]["dear"]["kernel_median_us"] == 56
    assert out["threshold_us"] == 41.0
    assert out["regimes"]["cheap"]["step_period_median_ms"] == 1.0  # the last step has none


def test_close_step_medians_are_one_regime():
    out = mr.regimes(trace([26, 27, 30, 26]), UP, 128)
    assert out["sequence"] == "...." and out["threshold_us"] is None
    assert list(out["regimes"]) == ["one"] and out["dear_over_cheap_period"] is None
    assert mr.split([26.0]) is None and mr.split([26.0, 26.0]) is None


def test_no_instance_at_the_grid_is_named(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace([26])))
    with pytest.raises(SystemExit):
        mr.main(["--trace", str(path), "--grid", "544"])
    assert (
        "no target graph launch ran fused_moe_kernel at grid [544, 1, 1]" in capsys.readouterr().err
    )


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("traces")
    with tarfile.open(f"{RUN}-moe-traces.tgz") as tgz:
        tgz.extractall(folder, filter="data")
    return folder


@pytest.mark.parametrize("server, grid", [("nospec", 128), ("nospec-plugin", 128),
                                          ("nospec-serial", 128), ("spec-5-1-6", 544),
                                          ("spec-5-1-6-serial", 544)])  # fmt: skip
def test_the_committed_readings_are_the_traces(traces, server, grid):
    kept = json.loads(Path(f"{RUN}-regimes-{server}.json").read_text())
    again = mr.regimes(mr.load_trace(traces / f"{server}.trace.json.gz"), UP, grid)
    assert {"trace": kept["trace"]} | again == kept


def test_the_dear_mode_is_stretches_of_steps_and_the_main_stream_has_none():
    """Both dual-stream servers without speculation flip once inside 39 steps, every step
    all dear or all cheap, a dear step ~1.2x a cheap one; with the shared expert on the main
    stream every step runs the cheap kernel and sits between the two."""
    read = {s: json.loads(Path(f"{RUN}-regimes-{s}.json").read_text())
            for s in ("nospec", "nospec-plugin", "nospec-serial")}  # fmt: skip
    for server in ("nospec", "nospec-plugin"):
        r = read[server]
        assert r["flips"] == 1 and set(r["regimes"]) == {"cheap", "dear"}
        assert (
            r["regimes"]["dear"]["kernel_median_us"] > 2 * r["regimes"]["cheap"]["kernel_median_us"]
        )
        assert 1.15 < r["dear_over_cheap_period"] < 1.35
    serial = read["nospec-serial"]["regimes"]["one"]
    assert serial["kernel_median_us"] < 30
    cheap, dear = (read["nospec"]["regimes"][r]["step_period_median_ms"] for r in ("cheap", "dear"))
    assert cheap < serial["step_period_median_ms"] < dear


def test_the_up_projection_grid_is_the_smaller_of_the_per_layer_ones():
    t = trace([26, 26])
    t["traceEvents"].append({"ph": "X", "cat": "kernel", "name": UP, "ts": 10, "dur": 50,
                             "args": {"grid": [6608, 1, 1], "correlation": 1}})  # fmt: skip
    assert mr.up_grid(t) == 128  # 1792 (down) as often; 6608 once a step
    with pytest.raises(ValueError, match="no target graph launch ran other"):
        mr.up_grid(t, "other")


def test_the_command_reads_the_up_projection_grid_and_never_writes_over(tmp_path, capsys):
    path, out = tmp_path / "t.json", tmp_path / "regimes.json"
    path.write_text(json.dumps(trace([26, 56, 56])))
    assert mr.main(["--trace", str(path), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["grid"] == [128, 1, 1]
    with pytest.raises(SystemExit):
        mr.main(["--trace", str(path), "--out", str(out)])
    assert "regimes.json: exists; not overwriting it" in capsys.readouterr().err


def test_the_moe_span_is_the_gpus_own_time_whatever_the_period():
    """A step's first up-projection to its last: the same 0.2 ms at a period of 1 ms or of
    2 ms (a host that holds the next launch back lengthens the period, not the span)."""
    for period in (1000.0, 2000.0):
        out = mr.regimes(trace([26, 26, 26], period), UP, 128)
        assert out["regimes"]["one"]["moe_span_median_ms"] == 0.2
        assert out["regimes"]["one"]["step_period_median_ms"] == period / 1000
