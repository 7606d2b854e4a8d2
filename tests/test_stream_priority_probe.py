"""stream_priority_probe: the per-step reading of a profiler trace (where the small GEMM ended
within the large one's span) and the verdict over the four conditions; the GPU part runs on
the node."""

from __future__ import annotations

import pytest

from sglang_ext_tools import stream_priority_probe as sp


def kern(ts, dur):
    return {"ph": "X", "cat": "kernel", "name": "gemm", "ts": ts, "dur": dur}


def test_each_step_reads_where_the_small_gemm_ended_in_the_large_ones_span():
    kernels = [
        kern(0, 1000), kern(5, 8), kern(990, 6),  # a step: ends at 996 of 1000 (reduction last)
        kern(2000, 1000), kern(2050, 10),  # a step: ends at 60 of 1000
    ]
    assert sp.fractions(kernels) == [0.996, 0.06]
    with pytest.raises(ValueError, match="a step of 1 kernel"):
        sp.fractions([kern(0, 1000)])


def test_the_reading_says_whether_the_graph_kept_the_priority():
    def run(mode, asked, median):
        return {"mode": mode, "priority_asked": asked, "small_end_fraction_median": median}

    kept = sp.reading([run("eager", 0, 0.98), run("eager", sp.HIGHEST, 0.1),
                       run("graph", 0, 0.97), run("graph", sp.HIGHEST, 0.12)])  # fmt: skip
    assert kept["eager_default_over_high"] == 9.8 and kept["graph_keeps_priority"] is True
    lost = sp.reading([run("eager", 0, 0.98), run("eager", sp.HIGHEST, 0.1),
                       run("graph", 0, 0.97), run("graph", sp.HIGHEST, 0.95)])  # fmt: skip
    assert lost["graph_keeps_priority"] is False
