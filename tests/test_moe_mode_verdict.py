"""moe_mode_verdict: moe_mode's runs against the bounds registered before the probe ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ext_tools import moe_mode_verdict as mv

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "tests/gpu/results/seed-shape-2026-12-06-moemode"


def run(label, pdl, up6, first=(0.4, 0.005), up1=27.0, alone=(46.0, 118.0)):
    tokens = {}
    for m, up, f, a in (("1", up1, first[0], alone[0]), ("6", up6, first[1], alone[1])):
        kernels = {"up": {"calls": 20, "mean_us": up, "grids": [[544, 1, 1]]}}
        tokens[m] = {"first_call_s": f, "alone_us": a, "beside_us": a + 1, "kernels": kernels}
    return {"label": label, "cache": "a", "pdl": pdl, "order": 1, "tokens": tokens}


def report(*runs):
    return {"date": "2026-12-06", "gpu": {"name": "NVIDIA H100 80GB HBM3"}, "runs": list(runs)}


def four(fresh_pdl, warm_pdl, fresh_nopdl, warm_nopdl):
    """The four processes of one probe, by their up-projection at 6 tokens."""
    return report(
        run("fresh-pdl", "1", fresh_pdl, first=(10.0, 2.0)),
        run("warm-pdl", "1", warm_pdl),
        run("fresh-nopdl", "0", fresh_nopdl, first=(1.5, 1.2)),
        run("warm-nopdl", "0", warm_nopdl),
    )


@pytest.mark.parametrize(
    "ups, cache, pdl, close",
    [
        ((71.5, 71.0, 70.8, 71.2), False, False, True),  # neither: as expected
        ((69.0, 82.0, 70.0, 81.0), True, False, False),  # fresh cheap, warm dear
        ((82.5, 82.0, 70.0, 71.0), False, True, False),  # PDL dear, fresh or warm
    ],
)
def test_each_reading_is_told_by_its_bounds(ups, cache, pdl, close):
    v = mv.verdict([four(*ups)], ["a.json"])["verdicts"]
    assert v["cache_condition_took"] == {"1": True, "6": True}
    assert (v["cache_sets_mode"], v["pdl_sets_mode"]) == (cache, pdl)
    assert v["neither"]["within_3_percent"] == close == v["neither"]["all_at_most_72_us"]
    assert v["neither"]["any_dear"] == (not close)


def test_a_fresh_run_that_loaded_fails_the_cache_condition_at_that_count():
    rep = report(run("fresh-pdl", "1", 71.0, first=(9.0, 0.5)), run("warm-pdl", "1", 71.0))
    took = mv.verdict([rep], ["a.json"])["verdicts"]["cache_condition_took"]
    assert took == {"1": True, "6": False}


def test_group_ratios_and_their_intervals_across_files():
    one = report(run("fresh-pdl", "1", 72.0), run("warm-nopdl", "0", 70.0))
    two = report(run("warm-pdl", "1", 73.0), run("fresh-nopdl", "0", 71.0))
    out = mv.verdict([one, two], ["a.json", "b.json"])
    assert [r["report"] for r in out["runs"]] == [0, 0, 1, 1]
    cmp = out["pdl_over_nopdl"]["6"]["up_us"]
    assert cmp["n"] == [2, 2] and cmp["mean_us"] == [72.5, 70.5]
    assert cmp["ratio"] == round(72.5 / 70.5, 4)
    lo, hi = cmp["ratio_ci95"]
    assert lo <= cmp["ratio"] <= hi and lo >= 72 / 71 - 1e-4 and hi <= 73 / 70 + 1e-4
    assert mv.ratio_ci([1.0], [1.0, 2.0]) is None


@pytest.mark.parametrize(
    "bad, says",
    [
        (run("cold-pdl", "1", 70.0), "'cold-pdl': expected it to start with 'fresh-'"),
        ({**run("warm-pdl", "1", 70.0), "error": "exit 1"}, "'warm-pdl' failed: exit 1"),
        ({k: v for k, v in run("warm-pdl", "1", 70.0).items() if k != "pdl"}, "'pdl' missing"),
    ],
)
def test_bad_runs_are_named_with_their_file(bad, says):
    with pytest.raises(ValueError, match="x.json") as err:
        mv.verdict([report(bad)], ["x.json"])
    assert says in str(err.value)


def test_runs_with_other_token_counts_are_refused():
    short = run("warm-pdl", "1", 70.0)
    del short["tokens"]["6"]
    with pytest.raises(ValueError, match=r"token counts \['1'\], expected \['1', '6'\]"):
        mv.verdict([report(run("fresh-pdl", "1", 70.0), short)], ["x.json"])


def test_main_writes_once_and_never_over_a_file(tmp_path, capsys):
    src = tmp_path / "mm.json"
    src.write_text(json.dumps(report(run("fresh-pdl", "1", 71.0), run("warm-pdl", "1", 71.5))))
    out = tmp_path / "v.json"
    assert mv.main(["--json", str(src), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["verdicts"]["neither"]["max_up_us"] == 71.5
    with pytest.raises(SystemExit):
        mv.main(["--json", str(src), "--out", str(out)])
    assert "exists; not overwriting it" in capsys.readouterr().err
    assert mv.main(["--json", str(tmp_path / "none.json")]) == 2


def test_the_committed_verdict_is_what_its_runs_give(monkeypatch):
    monkeypatch.chdir(ROOT)
    files = [f"{RESULTS}-nvidia-h100-sglang0.5.23-moe-mode.json",
             f"{RESULTS}-swapped-nvidia-h100-sglang0.5.23-moe-mode.json"]  # fmt: skip
    committed = json.loads(Path(f"{RESULTS}-nvidia-h100-sglang0.5.23-verdict.json").read_text())
    reports = [json.loads(Path(f).read_text()) for f in files]
    assert mv.verdict(reports, files) == committed


def test_cold_runs_are_read_against_the_one_layer_runs_of_the_lease():
    def cold(label, up6, up1):
        return {**run(label, "1", up6, up1=up1), "layers": 8}

    rep = report(
        run("fresh-pdl", "1", 72.0, first=(10.0, 2.0), up1=27.0),
        cold("warm-pdl-l8", 73.0, 31.0),
        run("warm-pdl", "1", 72.2, up1=27.2),
        cold("warm-pdl-l8-again", 72.8, 31.4),
    )
    out = mv.verdict([rep], ["a.json"])
    # the first probe's bounds read on the one-layer runs only
    assert out["verdicts"]["neither"]["max_up_us"] == 72.2
    assert out["pdl_over_nopdl"]["6"]["up_us"]["n"] == [2, 0]
    c = out["cold"]
    assert c["n"] == [2, 2] and c["cold_over_one_layer"]["1"]["ratio"] == round(31.2 / 27.1, 4)
    assert c["l2_explains_one_token_gap"] and not c["no_l2_effect"] and not c["cold_is_dear"]
    dear = report(run("warm-pdl", "1", 72.0), cold("warm-pdl-l8", 82.0, 40.0))
    assert mv.verdict([dear], ["a.json"])["cold"]["cold_is_dear"]
    flat = report(run("warm-pdl", "1", 72.0), cold("warm-pdl-l8", 72.5, 27.5))
    assert mv.verdict([flat], ["a.json"])["cold"]["no_l2_effect"]
    assert "cold" not in mv.verdict([report(run("warm-pdl", "1", 72.0))], ["a.json"])
    with pytest.raises(ValueError, match="no one-layer runs"):
        mv.verdict([report(cold("warm-pdl-l8", 72.0, 27.0))], ["a.json"])


def test_fragmented_runs_are_read_against_the_clean_cold_runs():
    def many(label, up6, up1, alloc=""):
        return {**run(label, "1", up6, up1=up1), "layers": 8, "alloc": alloc}

    rep = report(
        run("fresh-pdl", "1", 72.0, first=(10.0, 2.0)),
        many("warm-pdl-l8", 72.5, 31.0),
        many("warm-pdl-l8-frag", 82.5, 52.0, "frag"),
        many("warm-pdl-l8-again", 72.7, 31.2),
        many("warm-pdl-l8-frag-again", 82.0, 51.0, "frag"),
    )
    out = mv.verdict([rep], ["a.json"])
    assert out["cold"]["n"] == [2, 1]  # the frag runs are not among the clean cold ones
    f = out["frag"]
    assert f["n"] == [2, 2] and f["frag_is_dear"] and not f["no_frag_effect"]
    assert f["frag_over_clean_cold"]["6"]["ratio"] == round(82.25 / 72.6, 4)
    flat = report(
        run("warm-pdl", "1", 72.0), many("warm-8", 72.0, 31.0), many("warm-8f", 72.4, 31.3, "frag")
    )
    assert mv.verdict([flat], ["a.json"])["frag"]["no_frag_effect"]
    one = report(run("warm-pdl", "1", 72.0), {**run("warm-pdl-frag", "1", 72.0), "alloc": "frag"})
    with pytest.raises(ValueError, match="needs LAYERS > 1; found 1"):
        mv.verdict([one], ["a.json"])


def committed_verdict(stem):
    """The committed verdict of one probe's file, recomputed from its runs and held equal."""
    files = [f"tests/gpu/results/{stem}-moe-mode.json"]
    v = mv.verdict([json.loads(Path(files[0]).read_text())], files)
    assert v == json.loads(Path(f"tests/gpu/results/{stem}-verdict.json").read_text())
    return v


def test_the_committed_cold_verdict_is_what_its_runs_give(monkeypatch):
    """The 2026-12-07 cold/frag probe: no L2 effect, no frag effect, nothing dear."""
    monkeypatch.chdir(ROOT)
    v = committed_verdict("seed-shape-2026-12-07-moemode-cold-nvidia-h100-sglang0.5.23")
    assert v["cold"]["no_l2_effect"] and not v["cold"]["l2_explains_one_token_gap"]
    assert v["frag"]["no_frag_effect"] and not v["frag"]["frag_is_dear"]


def traced(r, regs=48, smem=24576):
    """``r`` with its up-projection's binary recorded at every token count."""
    for t in r["tokens"].values():
        t["kernels"]["up"].update(registers=[regs], shared_memory=[smem], occupancy_pct=26.0)
    return r


def test_the_up_projection_binary_is_compared_within_pdl_on_and_off():
    fresh = traced(run("fresh-pdl", "1", 72.0, first=(10.0, 2.0)))
    same = report(fresh, traced(run("warm-pdl", "1", 72.0)))
    b = mv.verdict([same], ["a.json"])["one_up_binary"]
    assert b["6"] == {"binaries": [[[48], [24576]]], "pdl": True, "nopdl": None}
    other = report(
        traced(run("fresh-pdl", "1", 72.0, first=(10.0, 2.0))),
        traced(run("warm-pdl", "1", 82.0), regs=64),
        traced(run("warm-nopdl", "0", 72.0)),
    )
    b = mv.verdict([other], ["a.json"])["one_up_binary"]
    assert b["6"]["pdl"] is False and b["6"]["nopdl"] is True
    assert b["6"]["binaries"] == [[[48], [24576]], [[64], [24576]]]
    # a run of the group that recorded no binary: the group cannot be said to share one
    part = report(fresh, run("warm-pdl", "1", 72.0))
    assert mv.verdict([part], ["a.json"])["one_up_binary"]["6"]["pdl"] is None
    # files from before the binary was recorded read as they did
    assert "one_up_binary" not in mv.verdict([four(71.5, 71.0, 70.8, 71.2)], ["a.json"])


def test_the_committed_binary_verdict_is_what_its_runs_give(monkeypatch):
    """The 2026-12-07 H200 probe, PDL on: one binary fresh and warm, nothing dear."""
    monkeypatch.chdir(ROOT)
    v = committed_verdict("seed-shape-2026-12-07-moemode-binary-nvidia-h200-sglang0.5.23")
    assert v["one_up_binary"]["6"]["pdl"] and v["one_up_binary"]["1"]["pdl"]
    assert v["verdicts"]["neither"]["within_3_percent"] and not v["verdicts"]["neither"]["any_dear"]


def test_the_committed_h100_four_process_verdict_is_what_its_runs_give(monkeypatch):
    """The 2026-12-07 (twenty-second session) H100 probe, fresh and warm with PDL on and off:
    one binary at each token count in all four, within 3 % at six tokens, nothing dear."""
    monkeypatch.chdir(ROOT)
    v = committed_verdict("seed-shape-2026-12-07-moemode-h100-nvidia-h100-sglang0.5.23")
    for tokens in ("1", "6"):
        assert v["one_up_binary"][tokens]["pdl"] and v["one_up_binary"][tokens]["nopdl"]
        assert len(v["one_up_binary"][tokens]["binaries"]) == 1
    assert v["verdicts"]["neither"]["within_3_percent"] and not v["verdicts"]["neither"]["any_dear"]
