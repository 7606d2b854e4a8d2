"""moe_overlap: instances of one kernel at one grid, split by whether another stream's kernel
was running as each started; the committed H100 trace read again."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sglang_ext_tools import moe_overlap as mo

ROOT = Path(__file__).resolve().parents[1]
DUMMY = ROOT / "tests/gpu/results/seed-shape-2026-12-07-dummy-nvidia-h100-sglang0.5.23"
STANDALONE = ROOT / "tests/gpu/results/seed-shape-2026-12-07-moemode-h100-nvidia-h100-sglang0.5.23"


def k(name, ts, dur, stream, grid=(1, 1, 1), **args):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"stream": stream, "grid": list(grid), **args}}  # fmt: skip


def trace():
    """Four up-projections on stream 7: two launched while stream 9's GEMM still runs (one
    of those GEMMs began long before), two clear; a down-projection and a host event ignored."""
    up = "fused_moe_kernel"
    return {"traceEvents": [
        k("gemm", 0, 12, 9), k(up, 10, 55, 7, (128, 1, 1), **{"registers per thread": 48}),
        k(up, 100, 25, 7, (128, 1, 1), **{"registers per thread": 48}),
        k(up, 130, 26, 7, (128, 1, 1), **{"registers per thread": 48}),
        k("long", 150, 100, 9), k(up, 240, 57, 7, (128, 1, 1), **{"registers per thread": 48}),
        k(up, 300, 14, 7, (1792, 1, 1)),
        {"ph": "X", "cat": "cpu_op", "name": up, "ts": 11, "dur": 1, "args": {}},
    ]}  # fmt: skip


def test_instances_split_by_a_resident_kernel_of_another_stream():
    out = mo.overlap(trace(), "fused_moe_kernel", 128)
    assert out["instances"] == 4 and out["stream"] == 7
    assert out["resident"]["n"] == 2 and out["clear"]["n"] == 2
    assert out["resident"]["median_us"] == 56.0 and out["clear"]["median_us"] == 25.5
    assert out["resident"]["median_left_us"] == pytest.approx(6.0)  # 2 and 10 us left
    assert [x["name"] for x in out["resident"]["kernels"]] == ["gemm", "long"]
    assert out["resident_over_clear"] == pytest.approx(56.0 / 25.5, abs=1e-3)
    assert out["binaries"] == [(48, None)]


def test_a_kernel_ending_as_the_instance_starts_is_not_resident():
    events = [k("gemm", 0, 10, 9), k("fused_moe_kernel", 10, 25, 7, (128, 1, 1))]
    out = mo.overlap({"traceEvents": events}, "fused_moe_kernel", 128)
    assert out["clear"]["n"] == 1 and out["resident"]["n"] == 0
    assert out["resident_over_clear"] is None


def test_no_instance_at_the_grid_is_named(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace()))
    with pytest.raises(SystemExit) as exc:
        mo.main(["--trace", str(path), "--grid", "544"])
    assert exc.value.code == 2
    assert "no fused_moe_kernel at grid [544, 1, 1]" in capsys.readouterr().err


def test_the_slim_trace_reads_the_same_and_nothing_is_overwritten(tmp_path, capsys):
    path, slim, out = tmp_path / "t.json", tmp_path / "s.json.gz", tmp_path / "o.json"
    path.write_text(json.dumps(trace()))
    assert mo.main(["--trace", str(path), "--slim", str(slim), "--out", str(out)]) == 0
    with gzip.open(slim, "rt") as fh:
        slimmed = json.load(fh)
    assert all(e["cat"] == "kernel" for e in slimmed["traceEvents"])
    read = mo.overlap(slimmed, "fused_moe_kernel", 128)
    assert read == mo.overlap(trace(), "fused_moe_kernel", 128)
    out.write_text("keep")
    with pytest.raises(SystemExit):
        mo.main(["--trace", str(path), "--out", str(out)])
    assert out.read_text() == "keep" and "not overwriting" in capsys.readouterr().err


def test_the_committed_h100_server_trace_reads_as_committed():
    """2026-12-07, a dummy-weight no-speculation server at the rank shape: the one-token
    up-projection is dear (over twice the clear side's time) where the shared expert's GEMM is
    resident at its launch, and at the standalone probe's time where nothing is; the
    down-projection, which launches clear, runs alike either way."""
    slim = f"{DUMMY}-nospec.trace.json.gz"
    name = Path(slim).name
    for grid, stem in ((128, "overlap"), (1792, "overlap-down")):
        out = {"trace": name} | mo.overlap(mo.load_trace(slim), "fused_moe_kernel", grid)
        assert json.loads(json.dumps(out)) == json.loads(Path(f"{DUMMY}-{stem}.json").read_text())
    up = json.loads(Path(f"{DUMMY}-overlap.json").read_text())
    assert up["resident_over_clear"] > 2.0
    assert up["resident"]["kernels"][0]["name"].startswith("nvjet")
    alone = json.loads(Path(f"{STANDALONE}-moe-mode.json").read_text())
    one_token = [r["tokens"]["1"]["kernels"]["up"]["mean_us"] for r in alone["runs"]]
    assert min(one_token) * 0.95 <= up["clear"]["median_us"] <= max(one_token) * 1.05
    # the slim copy gives the bench's own reading of the fused MoE's grids, binaries included
    from sglang_ext_tools.trace_breakdown import kernel_grids

    grids = kernel_grids(mo.load_trace(slim))["target_graph"]["fused_moe_kernel"]
    bench = json.loads(Path(f"{DUMMY}-speed.json").read_text())
    assert grids == bench["profiles"]["nospec"]["kernel_grids"]["target_graph"]["fused_moe_kernel"]
    down = json.loads(Path(f"{DUMMY}-overlap-down.json").read_text())
    assert down["clear"]["n"] > 0.95 * down["instances"]
    assert down["resident_over_clear"] == pytest.approx(1.0, abs=0.05)


UP = "fused_moe_kernel"


def test_kernel_grids_reads_a_slim_trace_as_the_whole_one():
    """The slim copy keeps the graph launches, the correlation ids and every binary arg
    ``trace_breakdown.kernel_grids`` reads, and drops the rest."""
    from sglang_ext_tools.trace_breakdown import kernel_grids

    events = []
    for step in range(3):
        t, corr = 1000.0 * step, 100 + step
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t,
                       "dur": 5, "args": {"correlation": corr, "cbid": 311}})
        for i, grid in enumerate((128, 1792)):
            events.append(k(UP, t + 10 + 60 * i, 56.0 - 40 * i, 7, (grid, 1, 1),
                            correlation=corr, **{"registers per thread": 48,
                            "shared memory": 36864, "blocks per SM": 0.97,
                            "est. achieved occupancy %": 6, "queued": 0}))  # fmt: skip
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 3})
    whole = {"traceEvents": events}
    slimmed = mo.slim(whole)
    assert kernel_grids(slimmed) == kernel_grids(whole)
    assert len(slimmed["traceEvents"]) == 9
    for event in slimmed["traceEvents"]:
        assert "queued" not in event["args"] and "cbid" not in event["args"]


def test_slim_only_writes_a_trace_without_the_grid(tmp_path, capsys):
    """A speculative server's trace has no one-token launch; the node slims it all the same."""
    path, slim = tmp_path / "t.json", tmp_path / "s.json.gz"
    path.write_text(json.dumps(trace()))
    assert mo.main(["--trace", str(path), "--grid", "544", "--slim", str(slim), "--slim-only"]) == 0
    with gzip.open(slim, "rt") as fh:
        assert len(json.load(fh)["traceEvents"]) == 7  # the host event left out
    assert capsys.readouterr().out == ""
    with pytest.raises(SystemExit):
        mo.main(["--trace", str(path), "--slim-only"])


def test_around_keeps_the_kernel_what_ran_beside_it_and_each_launch_start():
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 2,
              "args": {"correlation": 5}}  # fmt: skip
    events = [launch] + [dict(e, args={**e["args"], "correlation": 5}) for e in [
        k("first", 1, 2, 7), k("gemm", 5, 12, 9), k("same_start", 10, 3, 9),
        k("fused_moe_kernel", 10, 55, 7, (128, 1, 1)), k("after", 70, 5, 9),
        k("before", 3, 1, 9)]]  # fmt: skip
    cut = mo.around({"traceEvents": events}, "fused_moe_kernel")
    kept = [e["name"] for e in cut["traceEvents"]]
    assert kept == ["cudaGraphLaunch", "first", "gemm", "same_start", "fused_moe_kernel"]


def test_around_reads_as_the_slim_trace_does():
    """The committed dummy baseline's slim trace and the same cut around the MoE kernels give
    the same per-instance and per-step readings (what the session's committed traces rely on)."""
    from sglang_ext_tools import moe_regimes as mr

    whole = mo.load_trace(f"{DUMMY}-nospec.trace.json.gz")
    cut = mo.around(whole, "fused_moe_kernel")
    assert len(cut["traceEvents"]) < len(whole["traceEvents"]) / 3
    up = "fused_moe_kernel"
    for grid in (128, 1792):
        assert mo.overlap(cut, up, grid) == mo.overlap(whole, up, grid)
    assert mr.up_grid(cut) == mr.up_grid(whole) == 128
    assert mr.regimes(cut, "fused_moe_kernel", 128) == mr.regimes(whole, "fused_moe_kernel", 128)
