"""sglang_ext_tools.trace_breakdown on a synthetic torch-profiler trace of known composition."""

from __future__ import annotations

import gzip
import json

import pytest

from sglang_ext_tools.trace_breakdown import breakdown, load_trace, newest_trace, steady_breakdown


def _trace(cycles: int = 2, gap_us: float = 500.0) -> dict:
    """Per cycle: drafter decode graph (5 x 20 us), target verify graph (40 x 100 us),
    drafter extend graph (6 x 30 us), one kernel outside any graph (50 us); `gap_us` of idle
    GPU after each of the four."""
    events, t, corr = [], 0.0, 0

    def graph(n: int, dur: float) -> None:
        nonlocal t, corr
        corr += 1
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaGraphLaunch_v10000",
                "ts": t,
                "dur": 5,
                "args": {"correlation": corr},
            }
        )
        for _ in range(n):
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "k",
                    "ts": t,
                    "dur": dur,
                    "args": {"correlation": corr},
                }
            )
            t += dur
        t += gap_us

    for _ in range(cycles):
        graph(5, 20.0)
        graph(40, 100.0)
        graph(6, 30.0)
        corr += 1
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "argmax",
                "ts": t,
                "dur": 50.0,
                "args": {"correlation": corr},
            }
        )
        t += 50.0 + gap_us
        events.append({"ph": "X", "cat": "python_function", "name": "scheduler", "ts": 0, "dur": t})
    return {"traceEvents": events}


def test_cycle_splits_into_target_drafter_other_and_idle():
    out = breakdown(_trace(cycles=2))
    assert out["target_graph_launches"] == 2 and out["drafter_graph_launches"] == 4
    assert out["kernels_per_target_graph"] == 40.0
    per = out["per_cycle_ms"]
    assert per["target_graph_kernels"] == pytest.approx(4.0)
    assert per["drafter_graph_kernels"] == pytest.approx(0.28)
    assert per["other_kernels"] == pytest.approx(0.05)
    # window ends with the last kernel: 4 gaps per cycle, minus the trailing one
    assert per["gpu_idle"] == pytest.approx((8 * 500 - 500) / 2 / 1000)
    assert per["total"] == pytest.approx(
        per["target_graph_kernels"]
        + per["drafter_graph_kernels"]
        + per["other_kernels"]
        + per["gpu_idle"]
    )
    assert out["drafter_graphs_per_cycle"] == 2.0
    assert 0 < out["gpu_busy_fraction"] < 1


def test_idle_time_tracks_the_host_gaps():
    busy = breakdown(_trace(gap_us=0.0))
    assert busy["per_cycle_ms"]["gpu_idle"] == pytest.approx(0.0)
    assert busy["gpu_busy_fraction"] == pytest.approx(1.0)


def test_trace_without_kernels_is_an_error():
    with pytest.raises(ValueError, match="no GPU kernels"):
        breakdown({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 1}]})


def test_gzipped_trace_is_found_and_read(tmp_path):
    path = tmp_path / "spec" / "x-TP-0.trace.json.gz"
    path.parent.mkdir()
    with gzip.open(path, "wt") as fh:
        json.dump(_trace(cycles=1), fh)
    assert newest_trace(tmp_path) == path
    assert breakdown(load_trace(path))["target_graph_launches"] == 1
    with pytest.raises(FileNotFoundError, match="no torch-profiler trace"):
        newest_trace(tmp_path / "spec" / "none")


def test_summary_names_the_costliest_kernels_per_cycle(tmp_path):
    from sglang_ext_tools.trace_breakdown import main

    path = tmp_path / "spec-TP-0.trace.json.gz"
    trace = _trace(cycles=2)
    trace["deviceProperties"] = [{"name": "FakeGPU", "numSms": 7}]
    with gzip.open(path, "wt") as fh:
        json.dump(trace, fh)
    out = tmp_path / "summary.json"
    assert main([str(path), "--out", str(out), "--meta", "command=x y"]) == 0
    summary = json.loads(out.read_text())
    assert summary["command"] == "x y"
    entry = summary["traces"][path.name]
    assert entry["device"]["name"] == "FakeGPU" and len(entry["sha256"]) == 64
    assert entry["top_kernels"]["target_graph"] == [
        {"kernel": "k", "us_per_cycle": 4000.0, "calls_per_cycle": 40.0}
    ]
    assert entry["top_kernels"]["drafter_graph"] == [
        {"kernel": "k", "us_per_cycle": 280.0, "calls_per_cycle": 11.0}
    ]
    assert entry["breakdown"]["target_graph_launches"] == 2


def test_kernel_families_count_the_cascade_merges():
    """A tree's verify under FA3 merges prefix and tree attention once per layer
    (merge_state); a chain's never does: the family counts say which path ran."""
    from sglang_ext_tools.trace_breakdown import kernel_families

    trace = _trace(cycles=2)
    verify = [e for e in trace["traceEvents"] if e.get("name") == "k" and e["dur"] == 100.0]
    for k in verify[::4]:  # 10 of each graph's 40: an FA3 call
        k["name"] = "void flash::FlashAttnFwdSm90<...>"
    for k in verify[1::8]:  # 5 of 40: a merge after it
        k["name"] = "void merge_attn_states_kernel<__nv_bfloat16, 128u>(...)"  # merge_state_v2
    out = kernel_families(trace)["target_graph"]
    assert out["flash_attention"] == {"calls_per_cycle": 10.0, "us_per_cycle": 1000.0}
    assert out["merge_state"] == {"calls_per_cycle": 5.0, "us_per_cycle": 500.0}
    drafter = kernel_families(trace)["drafter_graph"]
    assert drafter["merge_state"] == {"calls_per_cycle": 0.0, "us_per_cycle": 0.0}


def test_kernel_grids_say_which_config_the_fused_moe_kernels_ran():
    """Two target verifies whose fused-MoE kernels ran different block-N configs (4 tokens:
    block N 32, grid 512; 6 tokens: block N 64, grid 272): the grids tell them apart, per
    cycle, most-called first; kernels of other names stay out."""
    from sglang_ext_tools.trace_breakdown import kernel_grids

    trace = _trace(cycles=2)
    verify = [e for e in trace["traceEvents"] if e.get("name") == "k" and e["dur"] == 100.0]
    first, second = verify[:40], verify[40:]
    for k in first[:6]:
        k["name"] = "fused_moe_kernel"
        k["args"].update(grid=[512, 1, 1], block=[128, 1, 1])
    for k in second[:6]:
        k["name"] = "fused_moe_kernel"
        k["args"].update(grid=[272, 1, 1], block=[128, 1, 1])
    second[6]["name"] = "fused_moe_kernel"
    second[6]["args"].update(grid=[512, 1, 1], block=[128, 1, 1])
    out = kernel_grids(trace)
    assert out["target_graph"]["fused_moe_kernel"] == [
        {"grid": [512, 1, 1], "block": [128, 1, 1], "calls_per_cycle": 3.5, "us_per_cycle": 350.0},
        {"grid": [272, 1, 1], "block": [128, 1, 1], "calls_per_cycle": 3.0, "us_per_cycle": 300.0},
    ]
    assert out["drafter_graph"] == {}
    assert kernel_grids(_trace(cycles=1)) == {"target_graph": {}, "drafter_graph": {}}


def test_kernel_grids_tell_a_different_binary_of_one_grid_by_its_registers():
    """Issue #24's two modes ran one grid; CUPTI's registers, shared memory and occupancy say
    whether they ran one compiled kernel. Launches of one grid with two register counts are
    one shape with both counts listed; the occupancy is the launches' mean."""
    from sglang_ext_tools.trace_breakdown import kernel_grids

    trace = _trace(cycles=2)
    verify = [e for e in trace["traceEvents"] if e.get("name") == "k" and e["dur"] == 100.0]
    for i, k in enumerate(verify[:4] + verify[40:44]):
        k["name"] = "fused_moe_kernel"
        k["args"].update(
            {
                "grid": [544, 1, 1],
                "block": [128, 1, 1],
                "registers per thread": 128 if i < 4 else 96,
                "shared memory": 49152,
                "blocks per SM": 4.12,
                "est. achieved occupancy %": 25 if i < 4 else 19,
            }
        )
    (row,) = kernel_grids(trace)["target_graph"]["fused_moe_kernel"]
    assert row["grid"] == [544, 1, 1] and row["calls_per_cycle"] == 4.0
    assert row["registers"] == [96, 128] and row["shared_memory"] == [49152]
    assert row["blocks_per_sm"] == [4.12] and row["occupancy_pct"] == 22.0


def _with_prefill(trace: dict, us: float = 9000.0) -> dict:
    """The request's prefill before the first cycle: one long kernel outside any graph."""
    events = trace["traceEvents"]
    first = min(e["ts"] for e in events if e.get("cat") == "kernel")
    events.append(
        {
            "ph": "X",
            "cat": "kernel",
            "name": "prefill",
            "ts": first - us - 200,
            "dur": us,
            "args": {"correlation": 999},
        }
    )
    return trace


def test_steady_cycles_leave_the_prefill_out_and_say_what_the_gpu_waited_for():
    trace = _with_prefill(_trace(cycles=3))
    whole = breakdown(trace)
    steady = steady_breakdown(trace)
    # the window spreads the 9 ms prefill over its 3 cycles; the steady part has none of it
    assert whole["per_cycle_ms"]["other_kernels"] == pytest.approx(0.05 + 9.0 / 3)
    assert steady["cycles"] == 2
    per = steady["per_cycle_ms"]
    assert (
        per["target_graph_kernels"],
        per["drafter_graph_kernels"],
        per["other_kernels"],
    ) == pytest.approx((4.0, 0.28, 0.05))
    assert per["gpu_idle"] == pytest.approx(2.0)  # the four 500 us gaps of each cycle
    assert per["total"] == pytest.approx(4.0 + 0.28 + 0.05 + 2.0)
    # each gap charged to what started after it: the target graph after the draft, the
    # drafter's extend after the target and its next draft after the argmax, the argmax
    assert steady["gpu_idle_before_ms"] == pytest.approx(
        {"target_graph": 0.5, "drafter_graph": 1.0, "other_kernels": 0.5}
    )
    # prefill and the first draft, outside the cycles
    assert steady["before_first_cycle_ms"]["gpu_kernels"] == pytest.approx(9.0 + 0.1)
    assert steady["before_first_cycle_ms"]["wall"] == pytest.approx(9.0 + 0.2 + 0.1 + 0.5)
    busy = steady_breakdown(_trace(cycles=3, gap_us=0.0))
    assert busy["per_cycle_ms"]["gpu_idle"] == pytest.approx(0.0)
    assert set(busy["gpu_idle_before_ms"].values()) == {0.0}
    assert steady_breakdown(_trace(cycles=1)) is None  # no whole cycle


def _launch(ts: float, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": ts, "dur": 5,
            "args": {"correlation": corr}}  # fmt: skip


def _kernel(name: str, ts: float, dur: float, corr: int, stream: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": stream}}  # fmt: skip


def _two_stream_trace(launches: int = 2) -> dict:
    """Per target launch (40 kernels, so it is the largest graph): the main stream 7 runs
    0-200 us in 39 kernels (20 "moe", then "attn"), the second stream 9 one kernel over
    50-150 us beside it; one small drafter launch between target launches."""
    events, t, corr = [], 0.0, 0
    for _ in range(launches):
        corr += 1
        events.append(_launch(t, corr))
        step = 200 / 39
        events += [_kernel("moe" if i < 20 else "attn", t + i * step, step, corr, 7)
                   for i in range(39)]  # fmt: skip
        events.append(_kernel("shared_expert", t + 50, 100, corr, 9))
        corr += 1
        events += [_launch(t + 300, corr), _kernel("draft", t + 300, 20, corr, 7)]
        t += 1000
    return {"traceEvents": events}


def test_graph_streams_give_the_span_not_the_summed_kernels():
    from sglang_ext_tools.trace_breakdown import graph_streams

    out = graph_streams(_two_stream_trace())
    assert out["span_ms"] == pytest.approx(0.2)
    assert out["busy_ms"] == pytest.approx(0.2)
    assert out["overlap_ms"] == pytest.approx(0.1)  # the second stream ran beside the first
    main, side = out["streams"]["7"], out["streams"]["9"]
    assert main["busy_ms"] == pytest.approx(0.2) and main["kernels_per_cycle"] == 39
    assert side["kernel_ms"] == pytest.approx(0.1)
    assert side["top"] == [
        {"kernel": "shared_expert", "us_per_cycle": 100.0, "calls_per_cycle": 1.0}
    ]
    assert [k["kernel"] for k in main["top"]] == ["moe", "attn"]
    assert main["overlap_ms"] == pytest.approx(0.0) and side["overlap_ms"] == pytest.approx(0.0)
    # the overlapped 0.1 ms counts once in the breakdown, twice in the summed kernel times
    assert breakdown(_two_stream_trace())["per_cycle_ms"]["target_graph_kernels"] == (
        pytest.approx(0.2)
    )
    assert main["kernel_ms"] + side["kernel_ms"] == pytest.approx(0.3)


def test_a_prefill_graph_before_the_first_cycle_is_no_drafter_graph():
    """SGLang's breakable prefill graph: launches before the first target graph whose kernel
    counts no later drafter launch repeats are the prefill's, counted outside the graphs as an
    eager prefill is; the first cycle's draft (5 kernels, as every later one) stays the
    drafter's."""
    trace = _trace(cycles=2)
    events = trace["traceEvents"]
    for n in range(3):  # three prefill segments of 7 kernels, 10 us each, before it all
        corr, ts = 900 + n, -1000.0 + n * 100
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch_v10000",
                       "ts": ts, "dur": 5, "args": {"correlation": corr}})  # fmt: skip
        events += [{"ph": "X", "cat": "kernel", "name": "p", "ts": ts + k * 10, "dur": 10.0,
                    "args": {"correlation": corr}} for k in range(7)]  # fmt: skip
    out = breakdown(trace)
    assert out["target_graph_launches"] == 2 and out["drafter_graph_launches"] == 4
    assert out["per_cycle_ms"]["drafter_graph_kernels"] == pytest.approx(0.28)
    assert out["per_cycle_ms"]["other_kernels"] == pytest.approx(0.05 + 3 * 7 * 10 / 2 / 1000)


def _pdl_trace(launches: int = 2) -> dict:
    events, corr = [], 0
    for t in (1000.0 * n for n in range(launches)):
        corr += 1
        events.append(_launch(t, corr))
        events.append(_kernel("gemm", t, 60, corr, 7))
        events.append(_kernel("act", t + 5, 65, corr, 7))
        events += [_kernel("rest", t + 70 + i, 1, corr, 7) for i in range(38)]
        corr += 1
        events += [_launch(t + 300, corr), _kernel("draft", t + 300, 20, corr, 7)]
    return {"traceEvents": events}


def test_an_early_launch_counts_once_in_the_cycle_split():
    """The steady split partitions each cycle: kernels and idle add up to it, with the
    activation's wait on the GEMM counted once (2026-12-06: at the seed's rank shape the
    summed durations had made the target's verify longer than the whole cycle)."""
    out = steady_breakdown(_pdl_trace(3))["per_cycle_ms"]
    assert out["total"] == pytest.approx(1.0)
    assert out["target_graph_kernels"] == pytest.approx(0.108)
    assert out["drafter_graph_kernels"] == pytest.approx(0.02)
    parts = ("target_graph_kernels", "drafter_graph_kernels", "other_kernels", "gpu_idle")
    assert sum(out[k] for k in parts) == pytest.approx(out["total"])
    assert breakdown(_pdl_trace(3))["per_cycle_ms"]["target_graph_kernels"] == (
        pytest.approx(0.108)
    )


def test_an_early_launch_on_one_stream_shows_as_that_streams_overlap():
    """PDL on one stream: SGLang's fused MoE GEMM releases the activation after it as it
    starts, so the activation is recorded from the GEMM's start. Per target launch here the
    GEMM runs 0-60 us and the activation 5-70 us on stream 7, in 40 kernels in all."""
    from sglang_ext_tools.trace_breakdown import graph_streams

    out = graph_streams(_pdl_trace())
    main = out["streams"]["7"]
    assert main["busy_ms"] == pytest.approx(0.108)  # 0-70 us, then 38 one-us kernels
    assert main["kernel_ms"] == pytest.approx(0.163)
    assert main["overlap_ms"] == pytest.approx(0.055)  # the activation's wait on the GEMM
    assert out["overlap_ms"] == pytest.approx(0.0)  # one stream: nothing across streams
