"""batch_join_verdict: the registered H100 run of ``join`` at batches 1, 4 and 16 with trained
routing, read from a bench that ``bench_speed.build_result`` writes for the registered plan
(three pairs with the baseline), and from the committed runs whose rows and profiles it reads."""

from __future__ import annotations

import copy
import json
import re
import statistics
from pathlib import Path

import pytest

from sglang_ext_tools import batch_join_verdict as bj
from sglang_ext_tools import bench_speed as bs

RESULTS = Path(__file__).resolve().parent / "gpu" / "results"
H100 = "NVIDIA H100 80GB HBM3"
VARIANTS = ("join@3,1,4:SGLANG_EXT_MOE_SHARED_STREAM=join",
            "join@nospec:SGLANG_EXT_MOE_SHARED_STREAM=join")  # fmt: skip
BATCHES = (1, 4, 16)
PROMPTS = [1.0, 1.1, 0.9, 1.2]  # each prompt's time after its first token on the baseline, s
FIRST = 0.1  # each request's first token, s: whole requests gain less than their decode
DRIFT = [1.0, 1.1, 0.95]  # the machine's pace in each group (each over its own baseline)
ROUNDS = [1.0, 1.02, 0.99]  # and in each round
# server: {batch: speed over its group's baseline (at batch 1 after the first token)}
SPEEDS = {
    "spec-3-1-4": {1: 1.6, 4: 1.30, 16: 1.20},
    "spec-3-1-4-join": {1: 1.6 * 1.07, 4: 1.30 * 1.04, 16: 1.20},
    "nospec-join": {1: 1.15, 4: 1.10, 16: 1.01},
}


def profile(drafter_ms, idle_ms):
    """A profile as bench_speed keeps it, reduced to the whole cycles' split the verdict reads."""
    return {"steady": {"per_cycle_ms": {"drafter_graph_kernels": drafter_ms},
                       "gpu_idle_before_ms": {"drafter_graph": idle_ms}}}  # fmt: skip


def _round(server, group, batch, rnd, speed):
    pace, tokens = DRIFT[group] * ROUNDS[rnd], 128 * len(PROMPTS)
    m = {"round": rnd, "server": server, "batch": batch, "group": group, "status": "ok",
         "tokens": tokens, "errors": 0,
         "verify": tokens / 2.0 if server.startswith("spec") else None,
         "verify_tokens": tokens if server.startswith("spec") else 0}  # fmt: skip
    if batch > 1:  # a round's wall time per wave, no prompt of its own
        return m | {"tok_s": 100.0 * batch * speed / pace, "tpot_ms": None}
    decode = [pace * t / speed for t in PROMPTS]
    latency = [d + FIRST for d in decode]
    return m | {"tok_s": tokens / sum(latency), "tpot_ms": 1000 * sum(decode) / tokens,
                "latency_s": latency, "decode_s": decode}  # fmt: skip


def bench(speeds=SPEEDS, gpu=H100, profiled=(0.60, 0.40), down=(), settings=((3, 1, 4),)):
    """The registered run as bench_speed writes it: its servers, three pairs with the baseline,
    three rounds at each batch, a profile of ``join`` 3/1/4. ``down``: servers that did not
    come up (no measurements, no profile); ``settings=()``: the short form, no plain chain."""
    specs = bs.server_specs(list(settings), None, [bs.parse_variant(v) for v in VARIANTS])
    groups = bs.plan_groups(specs, at_once=2)
    plain = [["nospec", "spec-3-1-4"]] if settings else []
    assert groups == plain + [["nospec", "spec-3-1-4-join"], ["nospec", "nospec-join"]]
    ms = [
        _round(name, g, b, r, 1.0 if name == "nospec" else speeds[name][b])
        for g, names in enumerate(groups)
        for name in names
        if name not in down
        for b in BATCHES
        for r in range(len(ROUNDS))
    ]
    servers = [{"name": s["name"], "status": "exited(-9)" if s["name"] in down else "ready"}
               for s in specs]  # fmt: skip
    meta = {"batches": list(BATCHES), "gpu": gpu, "gpu_info": {"uuid": "GPU-x"},
            "sglang_version": "0.5.23", "sglang_ext_version": "0.1.0"}  # fmt: skip
    out = bs.build_result(meta, servers, ms, specs, None, None, groups)
    if "spec-3-1-4-join" not in down:
        out["profiles"] = {"nospec": {}, "spec-3-1-4-join": profile(*profiled)}
    return out


def whole(group, speed):
    """The summed prompts' whole-request times (each a mean over the rounds)."""
    pace = [DRIFT[group] * r for r in ROUNDS]
    return sum(statistics.fmean(p * t / speed + FIRST for p in pace) for t in PROMPTS)


def test_the_registered_plan_reads_each_figure_where_the_registration_put_it():
    v = bj.verdict(bench(), bj.ROLES, "b.json")
    r = v["readings"]
    assert list(r) == [*bj.REGISTERED, *bj.PROFILED]
    # batch 1: each speedup over its own group's baseline, prompts paired, whole requests
    plain, join = (whole(g, SPEEDS[s][1]) for g, s in ((0, "spec-3-1-4"), (1, "spec-3-1-4-join")))
    over = (whole(1, 1.0) / join) / (whole(0, 1.0) / plain)
    assert r["join_over_plain_b1"]["value"] == pytest.approx(over, abs=1e-4)
    assert 1.06 < over < 1.07  # the first token dilutes the 1.07 of the decode
    assert r["join_over_plain_b1"]["method"] == bs.VS_SETTING_ACROSS
    # after the first token, not the whole request (1.13 here)
    assert r["join_nospec_over_stock_decode_b1"]["value"] == pytest.approx(1.15, abs=1e-4)
    assert whole(2, 1.0) / whole(2, 1.15) < 1.14
    # batch 4: rounds paired over the group's baseline; join over plain without an interval
    assert r["join_nospec_over_stock_b4"]["value"] == pytest.approx(1.10, abs=1e-4)
    assert r["join_nospec_over_stock_b4"]["method"] == "paired rounds, bootstrap"
    assert r["join_over_plain_b4"]["value"] == pytest.approx(1.04, abs=1e-4)
    assert r["join_over_plain_b4"]["ci95"] is None
    assert r["join_over_plain_b4"]["method"] == bs.VS_SETTING_ACROSS_RATIO
    assert r["join_nospec_over_stock_b16"]["value"] == pytest.approx(1.01, abs=1e-4)
    assert r["join_over_plain_b16"]["value"] == pytest.approx(1.0, abs=1e-4)
    assert [x["reading"] for x in r.values()] == ["within"] * 8
    assert r["join_drafter_kernels_ms"]["registered"] == {"low": 0.5, "high": 0.75, "point": 0.6}
    assert v["join_for_batch"] == {"1": True, "4": True, "16": True}
    assert v["card"] == "H100" and v["gpu_uuid"] == "GPU-x" and v["sglang_version"] == "0.5.23"
    assert "not_run" not in v


def test_a_figure_outside_its_range_reads_so_and_the_rest_stay_within():
    speeds = copy.deepcopy(SPEEDS)
    speeds["nospec-join"][4] = 1.20
    v = bj.verdict(bench(speeds), bj.ROLES, "b.json")
    readings = {k: x["reading"] for k, x in v["readings"].items()}
    assert readings.pop("join_nospec_over_stock_b4") == "above"
    assert set(readings.values()) == {"within"}


def test_join_nospec_wholly_below_one_at_a_batch_rules_join_out_there():
    speeds = copy.deepcopy(SPEEDS)
    speeds["nospec-join"][16] = 0.95
    v = bj.verdict(bench(speeds), bj.ROLES, "b.json")
    assert v["readings"]["join_nospec_over_stock_b16"]["ci95"][1] < 1.0
    assert v["readings"]["join_nospec_over_stock_b16"]["reading"] == "below"
    assert v["join_for_batch"] == {"1": True, "4": True, "16": False}


def test_an_interval_that_reaches_one_keeps_join_for_its_batch():
    """The rule reads the interval, not the point: 0.99 with an interval to 1.02 is not below."""
    b = bench()
    [row] = [r for r in b["rows"] if r["server"] == "nospec-join" and r["batch"] == 16]
    row |= {"speedup": 0.99, "speedup_ci95": [0.96, 1.02]}
    v = bj.verdict(b, bj.ROLES, "b.json")
    assert v["join_for_batch"]["16"] is True
    assert v["readings"]["join_nospec_over_stock_b16"]["reading"] == "within"


@pytest.mark.parametrize(
    ("drafter", "idle", "both", "cut"),
    [(0.60, 0.40, 1.0, True), (0.55, 0.20, 0.75, False), (0.59, 0.20, 0.79, False)],
)
def test_the_profiled_split_decides_the_next_step(drafter, idle, both, cut):
    """Over the 0.79 ms gap: cut it; at or under it: the bar is out of reach at this shape."""
    d = bj.verdict(bench(profiled=(drafter, idle)), bj.ROLES, "b.json")["decision"]
    assert bj.GAP_MS == 0.79
    assert d["drafter_and_idle_ms"] == pytest.approx(both, abs=1e-9)
    assert d["cut_the_gap"] is cut
    assert ("cutting that gap" in d["reasoning"]) is cut
    assert ("out of reach" in d["reasoning"]) is not cut
    # between the unrounded gap (0.783) and the registered 0.79: decided by the registration,
    # and flagged
    assert ("a hair's decision" in d["reasoning"]) is (0.783 < both <= 0.79)


def test_a_join_server_that_did_not_come_up_reads_unread():
    v = bj.verdict(bench(down=("spec-3-1-4-join",)), bj.ROLES, "b.json")
    assert v["not_run"] == ["join"]
    r = v["readings"]
    assert r["join_over_plain_b4"]["reading"] == r["join_drafter_kernels_ms"]["reading"] == "unread"
    assert r["join_nospec_over_stock_b4"]["reading"] == "within"
    assert v["decision"]["cut_the_gap"] is None


def test_the_short_form_reads_all_but_what_needs_the_plain_chain():
    """--settings none (the short form registered for a lease that starts late): the plain
    server is absent, not down; the comparisons with it read unread, the rest as registered."""
    v = bj.verdict(bench(settings=()), bj.ROLES, "b.json")
    assert v["short_form"] is True and "not_run" not in v
    r = v["readings"]
    plain = {n for n, (_, field, _, _) in bj.REGISTERED.items() if field == "vs_setting"}
    assert plain == {"join_over_plain_b1", "join_over_plain_b4", "join_over_plain_b16"}
    assert {r[n]["reading"] for n in plain} == {"unread"}
    assert {r[n]["reading"] for n in r if n not in plain} == {"within"}
    assert v["join_for_batch"] == {"1": True, "4": True, "16": True}
    assert v["decision"]["cut_the_gap"] is True
    assert "short_form" not in bj.verdict(bench(), bj.ROLES, "b.json")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda b: b.pop("profiles"), "b.json: no profiles"),
        (lambda b: b["profiles"].pop("spec-3-1-4-join"),
         r"b.json: profiles has no spec-3-1-4-join \(profiled: \['nospec'\]\)"),
        (lambda b: b["profiles"]["spec-3-1-4-join"].update(steady=None),
         r"b.json: profiles\[spec-3-1-4-join\] has no steady.per_cycle_ms.drafter_graph_kernels"),
        (lambda b: b["rows"].pop(next(i for i, r in enumerate(b["rows"])
                                      if r["server"] == "nospec-join" and r["batch"] == 16)),
         "b.json: no row of nospec-join at batch 16"),
        (lambda b: b["servers"].pop(), "b.json: no server join_nospec=nospec-join"),
        (lambda b: b.update(gpu="NVIDIA H200"), "b.json: ran on 'NVIDIA H200'"),
    ],
)  # fmt: skip
def test_what_the_run_lacks_is_named_with_the_file(edit, message):
    b = bench()
    edit(b)
    with pytest.raises(ValueError, match=message):
        bj.verdict(b, bj.ROLES, "b.json")


def test_the_command_line_writes_its_out_once(tmp_path, capsys):
    path, out = tmp_path / "b.json", tmp_path / "verdict.json"
    path.write_text(json.dumps(bench()))
    assert bj.main(["--bench", str(path), "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == printed
    assert printed == bj.verdict(bench(), bj.ROLES, "b.json")
    out.write_text("kept")
    with pytest.raises(SystemExit):
        bj.main(["--bench", str(path), "--out", str(out)])
    assert out.read_text() == "kept" and "not overwriting" in capsys.readouterr().err


def test_a_run_on_another_card_is_refused_at_the_command_line(tmp_path, capsys):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(bench(gpu="NVIDIA H200")))
    assert bj.main(["--bench", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("batch_join_verdict: b.json: ran on 'NVIDIA H200'") and "H100" in err


def _run(tag):
    return RESULTS / f"seed-shape-2026-12-{tag}-nvidia-h100-sglang0.5.23"


def test_the_registrations_reference_split_reads_off_the_traced_run():
    """The eighth run's plain 3/1/4 (the registration's 0.600 and 0.406 ms) through the same
    reading, and the twenty-sixth session's dummy-weight ``join`` 3/1/4 profile beside it."""
    traced = json.loads(Path(f"{_run('06-traced')}-bench.json").read_text())
    r = bj.profiled(traced, "spec-3-1-4", True, "traced.json")
    assert [x["value"] for x in r.values()] == [0.6001, 0.4064]
    assert bj.decision(0.6001, 0.4064)["cut_the_gap"] is True
    dummy = json.loads(Path(f"{_run('07-join-314')}-speed.json").read_text())
    r = bj.profiled(dummy, "spec-3-1-4-join", True, "dummy.json")
    assert [(x["value"], x["reading"]) for x in r.values()] == [(0.5884, "within"),
                                                                (0.3018, "within")]  # fmt: skip


def test_the_twenty_sixth_sessions_dummy_join_rows_read_in_place():
    """That session's committed rows in place of the built ones: ``join`` 3/1/4 over plain at
    batch 1 (1.182 at zero acceptance, above the trained range) and ``join@nospec`` at 4 and
    16 (1.155 and 1.013; the second's interval reaches below 1, not wholly: ``join`` stays)."""
    b = bench()
    dummy = json.loads(Path(f"{_run('07-join-314')}-speed.json").read_text())
    batch = json.loads(Path(f"{_run('07-join-batch')}-speed.json").read_text())
    theirs = {(r["server"], r["batch"]): r for r in [*dummy["rows"], *batch["rows"]]}
    b["rows"] = [theirs.get((r["server"], r["batch"]), r) for r in b["rows"]]
    v = bj.verdict(b, bj.ROLES, "b.json")
    r = v["readings"]
    assert r["join_over_plain_b1"]["value"] == 1.1823
    assert r["join_over_plain_b1"]["reading"] == "above"
    assert r["join_nospec_over_stock_b4"]["ci95"] == [1.1228, 1.1881]
    assert r["join_nospec_over_stock_b4"]["reading"] == "within"
    assert r["join_nospec_over_stock_b16"]["value"] == 1.0132
    assert r["join_nospec_over_stock_b16"]["reading"] == "within"
    assert v["join_for_batch"] == {"1": True, "4": True, "16": True}


def test_committed_runs_that_lack_a_server_or_a_batch_are_named(capsys):
    """The twenty-sixth session's dummy 3/1/4 run served no ``join@nospec``; the trained
    ``join`` 5/1/6 run only batch 1 (its servers named by --role)."""
    dummy = f"{_run('07-join-314')}-speed.json"
    assert bj.main(["--bench", dummy]) == 2
    err = capsys.readouterr().err
    assert f"{Path(dummy).name}: no server join_nospec=nospec-join" in err
    trained = f"{_run('07-trained-join')}-bench.json"
    roles = ["--role", "plain=spec-5-1-6", "join=spec-5-1-6-join"]
    assert bj.main(["--bench", trained, *roles]) == 2
    err = capsys.readouterr().err
    assert f"{Path(trained).name}: no row of nospec-join at batch 4 (the run's batches: [1])" in err


def test_the_ranges_are_the_registrations():
    """Each range and point as docs/next-device-sessions.md registered them (its top section's
    H100 branch), the gap from the committed trained ``join`` 3/1/4 cycle fit, and the profile
    points from the eighth run: a mistyped bound fails here, not only where a figure lands."""
    doc = (RESULTS.parent.parent.parent / "docs" / "next-device-sessions.md").read_text()
    branch = doc.split("- **An H100 (no H200 within the start window): `join` at batches")[1]
    branch = " ".join(branch.split("## Registered")[0].split())
    found = [tuple(map(float, m)) for m in re.findall(
        r"(\d\.\d+)-(\d\.\d+)(?: ms a cycle)? \((\d\.\d+)[;)]", branch)]  # fmt: skip
    ranges = {name: bounds for name, (*_, bounds) in bj.REGISTERED.items()}
    assert found[:6] == [ranges[k] for k in (
        "join_over_plain_b1", "join_nospec_over_stock_decode_b1", "join_nospec_over_stock_b4",
        "join_over_plain_b4", "join_nospec_over_stock_b16", "join_over_plain_b16")]  # fmt: skip
    drafter, idle = (bounds for _, bounds in bj.PROFILED.values())
    assert "the drafter's graph kernels 0.50-0.75 ms a cycle" in branch and drafter[:2] == (
        0.50, 0.75)
    assert "before the drafter's graphs 0.2-0.6 ms" in branch and idle[:2] == (0.2, 0.6)
    assert "0.600 ms" in branch and "(eighth run 0.406)" in branch
    assert (drafter[2], idle[2]) == (0.600, 0.406)
    assert f"≤ {bj.CYCLE_BAR_MS} ms (0.79 ms under {bj.CYCLE_MS})" in branch
    fit = json.loads(Path(f"{_run('07-trained-join-314')}-cycle-fit.json").read_text())
    line = fit["servers"]["spec-3-1-4-join"]
    assert abs(line["ms_per_cycle"] - bj.CYCLE_MS) <= 0.0051  # 10.555, registered as 10.56
    assert bj.GAP_UNROUNDED_MS == round(line["ms_per_cycle"] - line["decode_step_ms"] / 0.82, 3)


def test_join_nospec_below_one_after_the_first_token_rules_join_out_at_batch_1():
    """At batch 1 the rule reads the after-first-token figure: a whole-request interval above 1
    does not keep ``join`` there."""
    b = bench()
    [row] = [r for r in b["rows"] if r["server"] == "nospec-join" and r["batch"] == 1]
    row |= {"decode_speedup": 0.95, "decode_speedup_ci95": [0.93, 0.97],
            "speedup": 1.05, "speedup_ci95": [1.02, 1.08]}  # fmt: skip
    v = bj.verdict(b, bj.ROLES, "b.json")
    assert v["join_for_batch"] == {"1": False, "4": True, "16": True}
    assert v["readings"]["join_nospec_over_stock_decode_b1"]["reading"] == "below"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([], "b.json: the file: expected a JSON object"),
        ({"rows": None, "servers": "abc"}, "b.json: servers: expected a list, found str 'abc'"),
        ({"rows": ["x"]}, r"b.json: rows\[0\]: expected an object, found str 'x'"),
        ({"rows": [{"server": "nospec", "batch": "1"}]},
         r"b.json: rows\[0\].batch: expected an integer, found str '1'"),
        ({"rows": [{"server": "a", "batch": 1, "speedup": "1.1"}]},
         r"b.json: rows\[0\].speedup: expected a number or null, found str '1.1'"),
        ({"rows": [{"server": "a", "batch": 1, "speedup_ci95": [1.0]}]},
         r"b.json: rows\[0\].speedup_ci95: expected \[low, high\], two numbers"),
        ({"servers": [{"status": "ready"}]}, r"b.json: servers\[0\]: expected an object with"),
        ({"profiles": []}, "b.json: profiles: expected an object, found list"),
        ({"gpu": ["H100"]}, r"b.json: gpu: expected a GPU name, found list \['H100'\]"),
        ({"gpu_info": []}, "b.json: gpu_info: expected an object, found list"),
    ],
)  # fmt: skip
def test_a_malformed_bench_is_named_in_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(content))
    assert bj.main(["--bench", str(path)]) == 2
    err = capsys.readouterr().err
    assert re.match(f"batch_join_verdict: {message}", err) and err.count("\n") == 1, err


def test_a_profile_figure_that_is_not_a_number_is_named(tmp_path, capsys):
    b = bench()
    b["profiles"]["spec-3-1-4-join"]["steady"]["gpu_idle_before_ms"]["drafter_graph"] = "0.4"
    path = tmp_path / "b.json"
    path.write_text(json.dumps(b))
    assert bj.main(["--bench", str(path)]) == 2
    err = capsys.readouterr().err
    assert "b.json: profiles[spec-3-1-4-join].steady.gpu_idle_before_ms.drafter_graph: " \
        "expected ms, a number; found str '0.4'" in err
