"""CPU tests of sglang_ext_tools.bench_speed: its pure parts (settings, plan, aggregation, rows,
goals, JSON, PNG) and its main() with the servers and requests replaced by fakes. No SGLang
server is started here; the GPU run is the same module on the node."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from sglang_ext.cli.bench_report import Acceptance, RequestResult
from sglang_ext.compat import sglang_version
from sglang_ext_tools import bench_speed as bs
from sglang_ext_tools.launch import STOCK_ENV, Server

ALL_SERVERS = {
    "nospec",
    "spec-3-1-4",
    "spec-5-1-6",
    "spec-4-4-8",
    "nbrfalse-plugin-5-1-6",
    "nbrfalse-stock-5-1-6",
}
REQUIRED_KEYS = {
    "schema_version", "date", "gpu", "gpu_info", "sglang_version", "torch_version",
    "sglang_ext_version", "attention_backend", "command", "servers", "settings", "batches",
    "max_new_tokens", "rounds", "rows", "best", "goals", "measurements", "fixtures",
}


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"input_ids": [k + 1, k + 2]}) + "\n" for k in range(10)))
    return path


def _argv(prompts_file, *extra, nbr=True):
    argv = ["--target", "T", "--drafter", "D", "--prompts", str(prompts_file)]
    if nbr:
        argv += ["--drafter-nbr-false", "N", "--drafter-nbr-false-sglang", "NS"]
    return argv + list(extra)


# ------------------------------------------------------------------ settings


def test_parse_setting_accepts_valid_settings():
    assert bs.parse_setting("3,1,4") == (3, 1, 4)
    assert bs.parse_setting("4,4,8") == (4, 4, 8)
    assert bs.parse_setting("4,4,17") == (4, 4, 17)  # topk*steps+1 is the ceiling


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("4,1,4", "with topk 1 draft_tokens must be steps+1 = 5"),
        ("3,2,8", "draft_tokens 8 exceeds topk*steps+1 = 7"),
        ("0,1,1", "all three must be positive"),
        ("3,-1,4", "all three must be positive"),
        ("3,1", "expected three integers"),
        ("3,x,4", "expected three integers"),
    ],
)
def test_bad_settings_are_argparse_errors_naming_the_value(prompts_file, capsys, value, reason):
    with pytest.raises(SystemExit) as exc:
        bs.parse_args(_argv(prompts_file, "--settings", "3,1,4", value))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --settings: setting '{value}'" in err
    assert reason in err


def test_compare_setting_must_be_one_of_the_settings(prompts_file, capsys):
    with pytest.raises(SystemExit):
        bs.parse_args(_argv(prompts_file, "--settings", "3,1,4", "--compare-setting", "5,1,6"))
    assert "--compare-setting 5,1,6 is not one of --settings 3,1,4" in capsys.readouterr().err
    # without the nbr-false drafters the compare setting is not used, so it is not checked
    args = bs.parse_args(_argv(prompts_file, "--settings", "3,1,4", nbr=False))
    assert args.compare is None


def test_nbr_false_drafters_go_together_and_batches_are_sorted(prompts_file, capsys):
    with pytest.raises(SystemExit):
        bs.parse_args(["--target", "T", "--drafter", "D", "--prompts", str(prompts_file),
                       "--drafter-nbr-false", "N"])
    assert "go together" in capsys.readouterr().err
    args = bs.parse_args(_argv(prompts_file, "--batches", "16", "1", "4", "4"))
    assert args.batches == [1, 4, 16]
    assert args.compare == (5, 1, 6)


# ------------------------------------------------------------------ plan


def test_rotation_alternates_the_server_order_across_rounds():
    assert bs.rotate(["a", "b"], 0) == ["a", "b"]
    assert bs.rotate(["a", "b"], 1) == ["b", "a"]
    assert bs.rotate(["a", "b"], 2) == ["b", "a"]
    assert bs.rotate(["a", "b", "c"], 4) == ["c", "a", "b"]
    # over each pair of rounds every server's mean place is the same (linear drift cancels)
    # and each pair of neighbours runs once in each order
    names = ["nospec", "s1", "s2", "plugin", "stock"]
    for first in (0, 2, 4):
        pair = [bs.rotate(names, first), bs.rotate(names, first + 1)]
        assert {sum(order.index(n) for order in pair) for n in names} == {len(names) - 1}
        assert [o.index("plugin") < o.index("stock") for o in pair] in ([True, False],
                                                                          [False, True])
    plan = bs.build_plan(["a", "b", "c"], [1, 4], rounds=3, waves=2, num_prompts=10)
    order = {}
    for entry in plan:
        names = order.setdefault(entry["round"], [])
        if entry["server"] not in names:
            names.append(entry["server"])
    assert order == {0: ["a", "b", "c"], 1: ["c", "b", "a"], 2: ["b", "c", "a"]}
    assert len(plan) == 3 * 3 * 2


def test_same_prompts_per_round_and_batch_across_servers():
    plan = bs.build_plan(["a", "b", "c"], [1, 4], rounds=2, waves=2, num_prompts=10)
    seen: dict = {}
    for entry in plan:
        seen.setdefault((entry["round"], entry["batch"]), set()).add(tuple(entry["prompts"]))
        assert entry["concurrency"] == entry["batch"]
    assert all(len(v) == 1 for v in seen.values())
    assert seen[(0, 1)] == {tuple(k % 10 for k in range(64))}  # batch 1: 64 requests
    assert seen[(0, 4)] == {(0, 1, 2, 3, 4, 5, 6, 7)}  # batch 4: 4 x 2 waves
    assert seen[(1, 4)] == seen[(0, 4)] and seen[(1, 1)] == seen[(0, 1)]  # every round alike
    assert bs.requests_for_batch(1, 6) == 64 and bs.requests_for_batch(16, 2) == 32
    assert bs.requests_for_batch(1, 2, batch1_requests=8) == 8


# ------------------------------------------------------------------ aggregation


def _m(server, batch, rnd, tok_s, tokens=1024, verify=None, tpot=None, errors=0, status="ok",
       ttft=None, decode=None):
    return {
        "round": rnd, "server": server, "batch": batch, "status": status, "tokens": tokens,
        "wall_s": tokens / tok_s if tok_s else None, "tok_s": tok_s, "tpot_ms": tpot,
        "ttft_ms": ttft, "verify": verify, "verify_tokens": tokens if verify else 0,
        "errors": errors, "decode_s": decode,
    }


SPECS = bs.server_specs([(3, 1, 4), (5, 1, 6), (4, 4, 8)], (5, 1, 6))
STATUSES = {s["name"]: "ready" for s in SPECS} | {"spec-4-4-8": "exited(1)"}


def _measurements():
    ms = []
    for r, t in enumerate([100, 90, 130]):  # medians differ from means on purpose
        ms.append(_m("nospec", 1, r, t, tpot=[10.0, 14.0, 9.0][r], ttft=[150.0, 170.0, 140.0][r],
                     decode=[1.2, 1.0, 1.4, 1.1]))  # fmt: skip
        ms.append(_m("nospec", 4, r, 4 * t))
    for r, (t, v) in enumerate([(250, 400), (240, 410), (300, 390)]):
        ms.append(_m("spec-3-1-4", 1, r, t, verify=v, tpot=4.0 + r * r, ttft=160.0 + r,
                     decode=[0.6, 0.5, 0.7, 0.55 + 0.01 * r]))  # fmt: skip
        ms.append(_m("spec-3-1-4", 4, r, 3 * 4 * [100, 90, 130][r], verify=v, errors=r))
    for r, t in enumerate([280, 330, 290]):
        ms.append(_m("spec-5-1-6", 1, r, t, verify=300))
    for r, (p, s) in enumerate([(200, 205), (198, 200), (230, 240)]):
        ms.append(_m("nbrfalse-plugin-5-1-6", 1, r, p, verify=350))
        ms.append(_m("nbrfalse-stock-5-1-6", 1, r, s, verify=340))
    for r in range(3):
        ms.append(_m("spec-4-4-8", 1, r, None, tokens=0, status="exited(1)"))
    return ms


def test_aggregate_median_and_pooled_tau():
    agg = bs.aggregate(_measurements())
    assert agg[("nospec", 1)]["tok_s"] == 100
    assert agg[("nospec", 1)]["tok_s_min"] == 90 and agg[("nospec", 1)]["tok_s_max"] == 130
    assert agg[("nospec", 1)]["tau"] is None
    assert agg[("nospec", 1)]["tpot_ms"] == 10.0
    spec = agg[("spec-3-1-4", 1)]
    assert spec["tok_s"] == 250
    assert spec["tok_s_rounds"] == {0: 250, 1: 240, 2: 300}
    assert spec["tau"] == pytest.approx(3 * 1024 / (400 + 410 + 390))  # sum tokens / sum verify
    assert agg[("spec-3-1-4", 4)]["errors"] == 0 + 1 + 2
    assert ("spec-4-4-8", 1) not in agg  # the failed server has no figures


def _row(rows, drafter, setting, batch):
    found = [
        r for r in rows
        if r["drafter"] == drafter and (r["steps"], r["topk"], r["draft_tokens"]) == setting
        and r["batch"] == batch
    ]
    assert len(found) == 1, (drafter, setting, batch)
    return found[0]


def test_rows_speedup_eta_plugin_vs_stock_best_and_goals():
    rows = bs.build_rows(bs.aggregate(_measurements()), SPECS, [1, 4], STATUSES)
    r = _row(rows, bs.MAIN, (3, 1, 4), 1)
    tau = 3 * 1024 / 1200
    assert r["nospec_tok_s"] == 100 and r["spec_tok_s"] == 250
    assert r["tau"] == pytest.approx(tau, abs=1e-4)
    assert r["speedup"] == 2.5
    assert r["eta"] == pytest.approx(2.5 / tau, abs=1e-4)
    assert r["cycle_cost_decode_steps"] == pytest.approx(tau / 2.5, abs=1e-4)
    assert r["plugin_vs_stock"] is None  # not the compare setting
    assert r["nospec_tpot_ms"] == 10.0 and r["spec_tpot_ms"] == 5.0
    assert r["nospec_ttft_ms"] == 150.0 and r["spec_ttft_ms"] == 161.0  # medians over rounds
    assert r["decode_cycle_cost"] == pytest.approx(tau * 5.0 / 10.0, abs=1e-4)
    assert _row(rows, bs.MAIN, (5, 1, 6), 1)["decode_cycle_cost"] is None  # no spec TPOT
    # after the first token: the prompts' decode times paired and summed (schema 2), the
    # statistic of its interval; the TPOT ratio (2.0) was schema 1's point
    assert r["decode_speedup"] == pytest.approx(4.7 / 2.36, abs=1e-4)
    low, high = r["decode_speedup_ci95"]
    assert low <= r["decode_speedup"] <= high and high - low < 0.2
    old = bs.build_rows(bs.aggregate(_measurements()), SPECS, [1], STATUSES, schema_version=1)
    assert _row(old, bs.MAIN, (3, 1, 4), 1)["decode_speedup"] == 2.0
    assert _row(rows, bs.MAIN, (5, 1, 6), 1)["decode_speedup"] is None
    assert [x["speedup"] for x in r["rounds"]] == [2.5, pytest.approx(2.6667, abs=1e-4),
                                                   pytest.approx(2.3077, abs=1e-4)]
    assert r["status"] == "ok"
    assert _row(rows, bs.MAIN, (3, 1, 4), 4)["speedup"] == 3.0
    assert _row(rows, bs.MAIN, (3, 1, 4), 4)["errors"] == 3
    # plugin_vs_stock only at the compare setting: main row and both nbr-false rows
    pvs = pytest.approx(200 / 205, abs=1e-4)
    assert _row(rows, bs.MAIN, (5, 1, 6), 1)["plugin_vs_stock"] == pvs
    assert _row(rows, bs.NBR_PLUGIN, (5, 1, 6), 1)["plugin_vs_stock"] == pvs
    assert _row(rows, bs.NBR_STOCK, (5, 1, 6), 1)["plugin_vs_stock"] == pvs
    assert _row(rows, bs.NBR_PLUGIN, (5, 1, 6), 1)["speedup"] == 2.0
    assert _row(rows, bs.NBR_STOCK, (5, 1, 6), 1)["spec_tok_s"] == 205
    assert _row(rows, bs.NBR_STOCK, (5, 1, 6), 4)["plugin_vs_stock"] is None  # not measured
    assert all(x["plugin_vs_stock"] is None for x in rows if x["steps"] != 5)
    failed = _row(rows, bs.MAIN, (4, 4, 8), 1)
    assert failed["speedup"] is None and failed["status"] == "missing: spec-4-4-8 (exited(1))"
    assert len(rows) == (3 + 2) * 2

    best, goals = bs.best_and_goals(rows, (5, 1, 6))
    assert (best["steps"], best["topk"], best["draft_tokens"], best["batch"]) == (5, 1, 6, 1)
    assert best["speedup"] == 2.9
    assert goals["speedup"] == 2.9 and goals["speedup_ge_2_5"] is True
    assert goals["eta"] == pytest.approx(2.9 / (1024 / 300), abs=1e-4)
    assert goals["eta_ge_0_80"] is True
    assert goals["plugin_vs_stock"] == pvs and goals["plugin_vs_stock_ge_0_99"] is False
    # without a comparison, that goal is unknown, not failed
    _, goals = bs.best_and_goals(rows, None)
    assert goals["plugin_vs_stock"] is None and goals["plugin_vs_stock_ge_0_99"] is None


def test_a_pair_cut_inside_a_round_is_compared_on_the_rounds_both_finished():
    """2026-12-03: the bench limit stopped a group inside round 1, after the stock server's
    second round and before the plugin's; pairing the plugin's round 0 with the mean of the
    stock server's two rounds read the rotation (who ran first) as a plugin/stock gap."""
    ms = [m for m in _measurements() if not m["server"].startswith("nbrfalse")]
    lat = {"p": ([1.0, 2.0, 3.0], None), "s": ([1.0, 2.0, 3.0], [0.5, 1.0, 1.5])}
    for name, key in (("nbrfalse-plugin-5-1-6", "p"), ("nbrfalse-stock-5-1-6", "s")):
        for r, latency in enumerate(lat[key]):
            if latency is not None:
                slower = 1.02 if key == "p" else 1.0  # the plugin 2 % slower after token 1
                m = _m(name, 1, r, 6 / sum(latency) * 100, verify=300, tpot=2.0 * slower,
                       decode=[x * 0.8 * slower for x in latency])  # fmt: skip
                ms.append(m | {"latency_s": latency})
    agg = bs.aggregate(ms)
    plugin, stock = agg[("nbrfalse-plugin-5-1-6", 1)], agg[("nbrfalse-stock-5-1-6", 1)]
    assert set(plugin["tok_s_rounds"]) == {0} and set(stock["tok_s_rounds"]) == {0, 1}
    p2, s2 = bs.common_rounds(plugin, stock)
    assert set(s2["tok_s_rounds"]) == {0} and s2["tau"] == stock["tau"]
    assert p2 is plugin  # already on round 0 alone: its figures as they are
    rows = bs.build_rows(agg, SPECS, [1], STATUSES)
    row = _row(rows, bs.NBR_PLUGIN, (5, 1, 6), 1)
    # round 0: the same times on both servers, so 1 with a zero-width interval
    assert row["plugin_vs_stock"] == 1.0 and row["plugin_vs_stock_ci95"] == [1.0, 1.0]
    # and after each request's first token: TPOT's ratio, decode times paired by prompt
    assert row["plugin_vs_stock_decode"] == pytest.approx(1 / 1.02, abs=1e-4)
    low, high = row["plugin_vs_stock_decode_ci95"]
    assert low == pytest.approx(1 / 1.02, abs=1e-3) and high == pytest.approx(1 / 1.02, abs=1e-3)
    # every round of both, as before the cut, would have read the stock's faster round 1
    assert bs._ratio(plugin["tok_s"], stock["tok_s"]) < 0.8
    # rounds already alike: nothing recomputed
    agg_full = bs.aggregate(_measurements())
    pair = agg_full[("nospec", 1)], agg_full[("spec-3-1-4", 1)]
    assert bs.common_rounds(*pair) == pair


def test_summarize_measurement_from_request_results():
    results = [
        RequestResult(0, True, completion_tokens=256, tpot_s=0.004, ttft_s=0.1,
                      acceptance=Acceptance(verify_steps=100)),
        RequestResult(1, True, completion_tokens=256, tpot_s=0.006, ttft_s=0.2,
                      acceptance=Acceptance(verify_steps=60)),
        RequestResult(2, False, error="HTTP 500"),
    ]
    m = bs.summarize_measurement(results, 2.0)
    assert m["tokens"] == 512 and m["tok_s"] == 256.0
    assert m["tau"] == 512 / 160 and m["verify"] == 160
    assert m["tpot_ms"] == 5.0 and m["ttft_ms"] == pytest.approx(150.0)
    assert m["decode_s"] == [None, None, None]  # no latencies in these results
    assert m["verify_steps"] == [100, 60, None]  # per request, for cycle_fit
    assert m["errors"] == 1 and m["error_samples"] == ["HTTP 500"]
    nospec = bs.summarize_measurement([RequestResult(0, True, completion_tokens=10)], 1.0)
    assert nospec["tau"] is None and nospec["verify"] is None
    assert nospec["verify_steps"] == [None]


# ------------------------------------------------------------------ JSON, table, PNG


def _result():
    meta = {"date": "2026-12-01T00:00:00+00:00", "gpu": "NVIDIA H200", "gpu_info": {},
            "sglang_version": "0.5.17", "torch_version": "2.9", "sglang_ext_version": "0.1.0",
            "attention_backend": "triton", "command": "bench_speed.py", "settings": [],
            "batches": [1, 4], "max_new_tokens": 256, "rounds": 3}
    servers = [{"name": n, "status": s} for n, s in STATUSES.items()]
    manifest = {"scale": "full", "drafters": {"d": {"params": 5, "train": {"history": [
        {"loss": 9.0}, {"loss": 1.5}]}, "reference": {"tau": 2.1, "per_prompt": list(range(99))}}}}
    return bs.build_result(meta, servers, _measurements(), SPECS, (5, 1, 6),
                           bs.summarize_fixtures(manifest, "fixtures.json"))


def test_result_json_has_the_required_keys(tmp_path):
    path = tmp_path / "out.json"
    path.write_text(json.dumps(_result()))
    data = json.loads(path.read_text())
    assert REQUIRED_KEYS <= set(data)
    assert data["best"]["speedup"] == 2.9 and data["goals"]["speedup_ge_2_5"] is True
    assert len(data["measurements"]) == len(_measurements())
    assert data["fixtures"]["drafters"]["d"] == {
        "params": 5, "train": {"final_loss": 1.5}, "reference": {"tau": 2.1}
    }
    table = bs.format_table(data["rows"])
    assert table.splitlines()[0].split()[:4] == ["backend", "drafter", "setting", "b"]
    assert "missing: spec-4-4-8 (exited(1))" in table
    assert len(table.splitlines()) == 1 + len(data["rows"])


def test_png_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "speed.png"
    assert bs.write_png(_result(), str(path)) is True
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _fake_requests(name, count, max_new_tokens, speed, per_step=4, jitter=0.0):
    """`count` finished requests from server `name` at `speed` tok/s, prompt k's time stretched
    by (k % 3) * jitter; a speculative server verifies in max_new_tokens // per_step steps.
    Returns (results, wall seconds) as bench_speed._run does."""
    results = [
        RequestResult(k, True, completion_tokens=max_new_tokens, tpot_s=0.005,
                      latency_s=max_new_tokens / speed * (1 + k % 3 * jitter),
                      acceptance=Acceptance(verify_steps=None if name == "nospec"
                                            else max_new_tokens // per_step))
        for k in range(count)
    ]  # fmt: skip
    return results, sum(r.latency_s for r in results)


def _all_ready(servers, timeout):
    """start_all's stand-in: every server up."""
    for s in servers:
        s.status = "ready"
    return {s.name: s.status for s in servers}


# ------------------------------------------------------------------ CLI


def test_dry_run_prints_servers_and_plan_and_starts_nothing(prompts_file, capsys, monkeypatch):
    monkeypatch.setattr(bs, "start_all", lambda *a: pytest.fail("dry run started servers"))
    rc = bs.main(_argv(prompts_file, "--dry-run", "--batches", "1", "4", "--rounds", "2"))
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    servers = {s["name"]: s for s in out["servers"]}
    assert set(servers) == ALL_SERVERS
    stock = {n for n, s in servers.items() if "SGLANG_PLUGINS" in s["env"]}
    assert stock == {"nospec", "nbrfalse-stock-5-1-6"}
    assert servers["nospec"]["env"] == STOCK_ENV
    cmd = servers["nbrfalse-stock-5-1-6"]["command"]
    assert cmd[cmd.index("--speculative-draft-model-path") + 1] == "NS"
    assert cmd[cmd.index("--speculative-num-steps") + 1] == "5"
    assert cmd[cmd.index("--cuda-graph-max-bs-decode") + 1] == "4"
    assert cmd[cmd.index("--mem-fraction-static") + 1] == "0.13"
    assert "--speculative-algorithm" not in servers["nospec"]["command"]
    topk = servers["spec-4-4-8"]["command"]
    assert topk[topk.index("--speculative-eagle-topk") + 1] == "4"
    assert len({s["url"] for s in out["servers"]}) == 6
    assert len(out["plan"]) == 2 * 6 * 2
    assert out["warmup"] == [{"requests": 2, "concurrency": 1}, {"requests": 4, "concurrency": 4}]


def test_main_with_fake_servers_writes_partial_results(
    prompts_file, tmp_path, monkeypatch, capsys
):
    """Full main(): one server fails to start, the others are measured through a fake
    request runner; the JSON is still written, with the failure and its log tail."""

    def fake_start_all(servers, timeout):
        for s in servers:
            s.status = "exited(1)" if s.name == "spec-4-4-8" else "ready"
            s.log_dir.mkdir(parents=True, exist_ok=True)
            s.log_path.write_text("".join(f"line {k}\n" for k in range(40)) + "ValueError: x\n")
        return {s.name: s.status for s in servers}

    speed = {"nospec": 100.0, "spec-3-1-4": 250.0, "spec-5-1-6": 280.0,
             "nbrfalse-plugin-5-1-6": 200.0, "nbrfalse-stock-5-1-6": 202.0}
    calls = []

    def fake_run(server, prompts, concurrency, max_new_tokens):
        calls.append((server.name, len(prompts), concurrency))
        return _fake_requests(server.name, len(prompts), max_new_tokens, speed[server.name])

    monkeypatch.setattr(bs, "start_all", fake_start_all)
    monkeypatch.setattr(bs, "_run", fake_run)
    monkeypatch.setattr(Server, "alive", lambda self: True)
    monkeypatch.setattr(bs, "gpu_info", lambda: {"name": "FakeGPU"})
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    rc = bs.main(_argv(prompts_file, "--batches", "1", "2", "--rounds", "2", "--max-new-tokens",
                       "64", "--log-dir", str(tmp_path / "logs"), "--out-json", str(out_json),
                       "--out-png", str(out_png)))
    assert rc == 1  # a server failed
    data = json.loads(out_json.read_text())
    assert REQUIRED_KEYS <= set(data)
    assert data["gpu"] == "FakeGPU" and data["aborted"] is None
    failed = next(s for s in data["servers"] if s["name"] == "spec-4-4-8")
    assert failed["status"] == "exited(1)" and failed["error"] == "ValueError: x"
    assert len(failed["log_tail"]) == 30 and failed["log_tail"][-1] == "ValueError: x"
    # the log a user watches names the cause, not only the exit status
    assert "spec-4-4-8: ValueError: x" in capsys.readouterr().err.splitlines()
    # warm-up: 2 at batch 1 and one wave at the largest batch, per ready server
    assert calls[:2] == [("nospec", 2, 1), ("nospec", 2, 2)]
    timed = calls[2 * 5:]
    assert len(timed) == 2 * 5 * 2  # rounds x ready servers x batches
    assert ("nospec", 64, 1) in timed and ("spec-3-1-4", 4, 2) in timed
    row = _row(data["rows"], bs.MAIN, (3, 1, 4), 1)
    assert row["speedup"] == 2.5 and row["tau"] == 4.0 and row["eta"] == 0.625
    assert row["speedup_ci95"] == [2.5, 2.5] and row["prompts"] == 64
    assert row["speedup_ci_method"] == "paired prompts, bootstrap"
    assert row["backend"] == "triton"
    assert _row(data["rows"], bs.MAIN, (5, 1, 6), 2)["plugin_vs_stock"] == pytest.approx(
        200 / 202, abs=1e-4
    )
    assert _row(data["rows"], bs.MAIN, (4, 4, 8), 1)["status"].startswith("missing: spec-4-4-8")
    assert data["goals"]["speedup_ge_2_5"] is True and data["goals"]["eta_ge_0_80"] is False
    if importlib.util.find_spec("matplotlib") is not None:
        assert out_png.read_bytes()[:4] == b"\x89PNG"


def _fake_servers(monkeypatch, fake_run):
    """Every server up at once and measured by ``fake_run`` (bench_speed._run's stand-in)."""
    monkeypatch.setattr(bs, "start_all", _all_ready)
    monkeypatch.setattr(bs, "stop_all", lambda servers: None)
    monkeypatch.setattr(Server, "alive", lambda self: True)
    monkeypatch.setattr(Server, "wait_gone", lambda self: True)
    monkeypatch.setattr(bs, "_run", fake_run)
    monkeypatch.setattr(bs, "gpu_info", lambda: {"name": "FakeGPU"})


def _pair_run(prompts_file, tmp_path, monkeypatch, speed, flag):
    """bench_speed's main on faked servers (tok/s per server name, 2 % jitter), 3/1/4 and
    its nbr-false pair with ``flag``, four at a time: the result JSON."""

    def fake_run(server, prompts, concurrency, max_new_tokens):
        name = server.name
        return _fake_requests(name, len(prompts), max_new_tokens, speed[name], jitter=1 / 50)

    _fake_servers(monkeypatch, fake_run)
    out_json = tmp_path / "r.json"
    argv = _argv(prompts_file, "--settings", "3,1,4", "--compare-setting", "3,1,4",
                 flag, "--at-once", "4", "--batches", "1", "--rounds", "2",
                 "--batch1-requests", "8", "--max-new-tokens", "64", "--log-dir",
                 str(tmp_path / "logs"), "--out-json", str(out_json))  # fmt: skip
    assert bs.main(argv) == 0
    return json.loads(out_json.read_text())


def test_instance_noise_puts_a_second_stock_server_beside_the_pair(
    prompts_file, tmp_path, monkeypatch
):
    """--instance-noise: a second stock server of the pair's configuration, in the pair's
    group, and its ratio to the first (stock_vs_stock, paired per prompt) beside
    plugin_vs_stock, the yardstick the plugin's figure is read against."""
    specs = bs.server_specs([(3, 1, 4)], (3, 1, 4), instance_noise=True)
    roles = {s["name"]: s["role"] for s in specs}
    assert roles["nbrfalse-stock2-3-1-4"] == "nbr_stock_twin"
    assert bs.plan_groups(specs, 4) == [
        ["nospec", "spec-3-1-4"],
        ["nospec", "nbrfalse-plugin-3-1-4", "nbrfalse-stock-3-1-4", "nbrfalse-stock2-3-1-4"],
    ]
    with pytest.raises(ValueError, match="needs --at-once 4"):
        bs.plan_groups(specs, 3)

    speed = {"nospec": 100.0, "spec-3-1-4": 250.0, "nbrfalse-plugin-3-1-4": 194.0,
             "nbrfalse-stock-3-1-4": 200.0, "nbrfalse-stock2-3-1-4": 196.0}  # fmt: skip
    data = _pair_run(prompts_file, tmp_path, monkeypatch, speed, "--instance-noise")
    stock = _row(data["rows"], bs.NBR_STOCK, (3, 1, 4), 1)
    assert stock["plugin_vs_stock"] == pytest.approx(194 / 200, abs=1e-4)
    assert stock["stock_vs_stock"] == pytest.approx(196 / 200, abs=1e-4)
    low, high = stock["stock_vs_stock_ci95"]
    assert low <= 196 / 200 <= high
    assert _row(data["rows"], bs.NBR_STOCK_TWIN, (3, 1, 4), 1)["status"] == "ok"
    assert data["goals"]["stock_vs_stock"] == stock["stock_vs_stock"]
    with pytest.raises(SystemExit):  # the second stock server needs the pair
        bs.parse_args(_argv(prompts_file, "--instance-noise", nbr=False))


class _MachineLost(BaseException):
    """The process dies mid-run (the node went back): nothing after this point runs."""


def test_a_run_lost_mid_way_leaves_the_measurements_that_finished_on_disk(
    prompts_file, tmp_path, monkeypatch
):
    """After every measurement the result so far is on disk, marked partial: a run killed
    during its 4th measurement leaves the first three, and round 0's speedup with them."""

    speed = {"nospec": 100.0, "spec-3-1-4": 250.0}
    timed = []

    def fake_run(server, prompts, concurrency, max_new_tokens):
        if len(prompts) == 8:  # timed requests (warm-up sends 2)
            timed.append(server.name)
            if len(timed) == 4:
                raise _MachineLost
        return _fake_requests(server.name, len(prompts), max_new_tokens, speed[server.name])

    monkeypatch.setattr(bs, "start_all", _all_ready)
    monkeypatch.setattr(bs, "stop_all", lambda servers: None)
    monkeypatch.setattr(Server, "alive", lambda self: True)
    monkeypatch.setattr(bs, "_run", fake_run)
    monkeypatch.setattr(bs, "gpu_info", lambda: {"name": "FakeGPU"})
    out_json = tmp_path / "r.json"
    argv = [
        "--target", "T", "--drafter", "D", "--prompts", str(prompts_file), "--settings",
        "3,1,4", "--batches", "1", "--rounds", "4", "--batch1-requests", "8",
        "--max-new-tokens", "64", "--log-dir", str(tmp_path / "logs"), "--out-json",
        str(out_json),
    ]
    with pytest.raises(_MachineLost):
        bs.main(argv)
    assert timed == ["nospec", "spec-3-1-4", "spec-3-1-4", "nospec"]
    data = json.loads(out_json.read_text())
    assert data["partial"] == "3 of 8 measurements"
    assert [(m["server"], m["round"]) for m in data["measurements"]] == [
        ("nospec", 0), ("spec-3-1-4", 0), ("spec-3-1-4", 1),
    ]
    row = _row(data["rows"], bs.MAIN, (3, 1, 4), 1)
    assert row["speedup"] == 2.5 and row["tau"] == 4.0
    assert not list(tmp_path.glob("*.tmp"))


# ------------------------------------------------------------------ groups (--at-once)


def test_groups_keep_the_baseline_up_and_the_nbr_pair_together():
    specs = bs.server_specs([(3, 1, 4), (5, 1, 6), (3, 4, 5)], (5, 1, 6), noise=True)
    everyone = [s["name"] for s in specs]
    assert bs.plan_groups(specs, None) == [everyone]
    assert bs.plan_groups(specs, 6) == [everyone]  # 6 real servers: the alias takes no GPU
    base = ["nospec", "nospec-again"]
    assert bs.plan_groups(specs, 3) == [
        [*base, "spec-3-1-4", "spec-5-1-6"],
        [*base, "spec-3-4-5"],
        [*base, "nbrfalse-plugin-5-1-6", "nbrfalse-stock-5-1-6"],
    ]
    plain = bs.server_specs([(3, 1, 4), (5, 1, 6)], None)
    assert bs.plan_groups(plain, 2) == [["nospec", "spec-3-1-4"], ["nospec", "spec-5-1-6"]]
    with pytest.raises(ValueError, match="needs --at-once 3"):
        bs.plan_groups(specs, 2)
    plan = bs.grouped_plan(bs.plan_groups(plain, 2), [1], rounds=2, waves=1, num_prompts=4)
    assert [(e["group"], e["round"], e["server"]) for e in plan] == [
        (0, 0, "nospec"), (0, 0, "spec-3-1-4"), (0, 1, "spec-3-1-4"), (0, 1, "nospec"),
        (1, 0, "nospec"), (1, 0, "spec-5-1-6"), (1, 1, "spec-5-1-6"), (1, 1, "nospec"),
    ]  # fmt: skip


def test_groups_put_each_variant_beside_the_main_server_at_its_setting_where_room_allows():
    specs = bs.server_specs(
        [(3, 1, 4), (5, 1, 6), (7, 1, 8)], (3, 1, 4),
        variants=[("glue", "A", "1"), ("planstream", "B", "1")], no_overlap=[(5, 1, 6)],
    )
    assert bs.plan_groups(specs, 5) == [
        ["nospec", "spec-3-1-4", "spec-3-1-4-glue", "spec-3-1-4-planstream"],
        ["nospec", "spec-5-1-6", "spec-5-1-6-nooverlap", "spec-7-1-8"],
        ["nospec", "nbrfalse-plugin-3-1-4", "nbrfalse-stock-3-1-4"],
    ]  # fmt: skip
    # two places beside the baseline: 3,1,4 takes one variant, the other runs on its own
    assert bs.plan_groups(specs, 3) == [
        ["nospec", "spec-3-1-4", "spec-3-1-4-glue"],
        ["nospec", "spec-5-1-6", "spec-5-1-6-nooverlap"],
        ["nospec", "spec-7-1-8"],
        ["nospec", "nbrfalse-plugin-3-1-4", "nbrfalse-stock-3-1-4"],
        ["nospec", "spec-3-1-4-planstream"],
    ]  # fmt: skip
    # without a main server at its setting, a variant keeps its own place
    lone = bs.server_specs([(5, 1, 6)], None, no_overlap=[(3, 1, 4)])
    assert bs.plan_groups(lone, 2) == [["nospec", "spec-5-1-6"],
                                       ["nospec", "spec-3-1-4-nooverlap"]]


def test_at_once_errors_name_the_flag(prompts_file, capsys):
    with pytest.raises(SystemExit) as exc:
        bs.parse_args(_argv(prompts_file, "--at-once", "2"))
    assert exc.value.code == 2
    assert "nbrfalse-plugin-5-1-6 and nbrfalse-stock-5-1-6" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bs.parse_args(_argv(prompts_file, "--at-once", "1", nbr=False))
    assert "--at-once 1: the baseline and one server need 2" in capsys.readouterr().err


def test_at_once_two_times_each_server_beside_the_baseline_of_its_own_group(
    prompts_file, tmp_path, monkeypatch
):
    """--at-once 2 with three settings: never more than two servers up, the baseline up
    throughout, each group's servers stopped (and gone) before the next group starts, and
    each row's speedup against the baseline timed in its own group: the baseline here slows
    from 100 to 50 to 25 tok/s between groups while every setting runs at 2x it."""
    up: set[str] = set()
    peak, starts, group = [0], [], [0]

    def fake_start_all(servers, timeout):
        starts.append([s.name for s in servers])
        for s in servers:
            s.status = "ready"
            up.add(s.name)
        peak[0] = max(peak[0], len(up))
        return {s.name: "ready" for s in servers}

    def fake_stop(self):
        if self.name in up:
            up.discard(self.name)
            if self.name != "nospec":
                group[0] += 1

    def fake_run(server, prompts, concurrency, max_new_tokens):
        base = 100.0 / 2 ** group[0]
        speed = base if server.name == "nospec" else 2 * base
        return _fake_requests(server.name, len(prompts), max_new_tokens, speed, per_step=2)

    monkeypatch.setattr(bs, "start_all", fake_start_all)
    monkeypatch.setattr(bs, "_run", fake_run)
    monkeypatch.setattr(Server, "alive", lambda self: self.name in up)
    monkeypatch.setattr(Server, "stop", fake_stop)
    monkeypatch.setattr(Server, "wait_gone", lambda self, timeout=60.0: self.name not in up)
    monkeypatch.setattr(bs, "gpu_info", lambda: {"name": "FakeGPU"})
    out_json = tmp_path / "r.json"
    rc = bs.main(_argv(prompts_file, "--settings", "3,1,4", "5,1,6", "3,4,5", "--at-once", "2",
                       "--batches", "1", "--rounds", "2", "--batch1-requests", "4",
                       "--log-dir", str(tmp_path / "logs"), "--out-json", str(out_json),
                       nbr=False))  # fmt: skip
    assert rc == 0
    assert starts == [["nospec", "spec-3-1-4"], ["spec-5-1-6"], ["spec-3-4-5"]]
    assert peak[0] == 2
    data = json.loads(out_json.read_text())
    assert data["at_once"] == 2 and len(data["groups"]) == 3
    rows = {r["server"]: r for r in data["rows"]}
    assert {name: r["group"] for name, r in rows.items()} == {
        "spec-3-1-4": 0, "spec-5-1-6": 1, "spec-3-4-5": 2
    }  # fmt: skip
    assert [rows[n]["nospec_tok_s"] for n in ("spec-3-1-4", "spec-5-1-6", "spec-3-4-5")] == [
        100.0, 50.0, 25.0
    ]  # fmt: skip
    assert all(r["speedup"] == 2.0 and r["speedup_ci95"] == [2.0, 2.0] for r in rows.values())


def test_launch_server_spec_and_attention_backend():
    cmd = Server("s", "m", 1, "d", spec=(5, 1, 6), attention_backend="fa3").command()
    assert cmd[cmd.index("--attention-backend") + 1] == "fa3"
    assert cmd[cmd.index("--speculative-num-steps") + 1] == "5"
    assert cmd[cmd.index("--speculative-num-draft-tokens") + 1] == "6"
    default = Server("s", "m", 1).command()
    assert default[default.index("--attention-backend") + 1] == "triton"
    assert "--speculative-algorithm" not in default


def test_launch_flags_parse_in_the_installed_sglang_and_idle_servers_sleep():
    """Every flag the suite and bench_speed give a server is one the installed SGLang parses
    (a renamed flag would fail each server's startup on the node), and idle servers sleep:
    14 spinning schedulers on one 16-core node moved the timed servers' latency (launch.py)."""
    pytest.importorskip("sglang")
    from sglang.srt.server_args import prepare_server_args

    cmd = Server("s", "m", 1, "d", max_total_tokens=4096).command()
    try:
        args = prepare_server_args(cmd[cmd.index("--model-path") :])
    except RuntimeError as exc:  # 0.5.17's ServerArgs detects the device as it parses
        if "No accelerator" not in str(exc):
            raise
        pytest.skip(f"SGLang {sglang_version()} parses server flags only beside a GPU: {exc}")
    assert args.sleep_on_idle is True
    assert args.skip_tokenizer_init and args.disable_radix_cache
    assert args.speculative_algorithm == "EAGLE3" and args.max_total_tokens == 4096
    assert args.cuda_graph_backend_prefill == "disabled"
    # bench_speed --prefill-graph breakable: SGLang's default prefill graph, up to 512 tokens
    graph = Server("s", "m", 1, "d", prefill_graph="breakable", prefill_graph_max_tokens=512)
    cmd = graph.command()
    args = prepare_server_args(cmd[cmd.index("--model-path") :])
    assert args.cuda_graph_backend_prefill == "breakable" and args.cuda_graph_max_bs_prefill == 512


def test_speed_fixture_manifest_is_summarized_per_stage():
    manifest = {
        "schema_version": 1,
        "stages": {
            "widen-target": {"function_check": {"big_vs_small": {"top1_agreement": 0.98}}},
            "drafter-nbr-true": {
                "small_drafter_nbr-true": {
                    "train": {"history": [{"loss": 9.0}, {"loss": 3.25}], "ttt_steps": 5},
                    "reference": {"tau": 3.2, "per_prompt": [{"tau": 1}]},
                }
            },
        },
    }
    out = bs.summarize_fixtures(manifest, "m.json")
    assert out["path"] == "m.json"
    assert "cache" not in out
    carried = {**manifest, "cache": {"packed": "2026-12-03T08:00:00+00:00"}}
    assert bs.summarize_fixtures(carried)["cache"] == carried["cache"]  # said in the result
    assert out["stages"]["widen-target"]["function_check"]["big_vs_small"] == {
        "top1_agreement": 0.98
    }
    drafter = out["stages"]["drafter-nbr-true"]["small_drafter_nbr-true"]
    assert drafter["train"] == {"final_loss": 3.25, "ttt_steps": 5}
    assert drafter["reference"] == {"tau": 3.2}


RESULTS = Path(__file__).resolve().parent / "gpu" / "results"
ROW_KEYS = {"batch", "steps", "topk", "draft_tokens", "nospec_tok_s", "spec_tok_s", "tau",
            "speedup", "eta", "plugin_vs_stock"}


@pytest.mark.parametrize("path", sorted(RESULTS.glob("speed-20*-*.json")), ids=lambda p: p.name)
def test_committed_speed_results_are_self_consistent(path):
    """The committed GPU results carry the issue's keys, and every derived figure follows
    from the raw measurements in the same file (nothing edited by hand)."""
    data = json.loads(path.read_text())
    assert {"date", "gpu", "sglang_version", "rows", "measurements", "command"} <= set(data)
    assert data["gpu"] and data["sglang_version"] and data["rows"]
    def recomputed(group):  # a grouped run times each group against its own baseline
        return bs.aggregate([m for m in data["measurements"] if m.get("group", 0) == group])

    for row in data["rows"]:
        assert ROW_KEYS <= set(row)
        if row.get("status", "ok") != "ok":  # a server that never measured (a run cut short)
            assert row["speedup"] is None and row["spec_tok_s"] is None and row["tau"] is None
            continue
        assert row["eta"] == pytest.approx(row["speedup"] / row["tau"], rel=1e-3)
        again = recomputed(row.get("group", 0))
        whole = again[(row["server"], row["batch"])], again[("nospec", row["batch"])]
        if data.get("schema_version", 1) >= bs.PAIRED_POINT_SINCE and row["batch"] == 1:
            # the prompts' times paired and summed, inside its own interval
            point = bs.speed_ratio(*bs.common_rounds(*whole), 1, True)
            assert row["speedup"] == pytest.approx(point, rel=1e-3)
            low, high = row["speedup_ci95"]
            assert low <= row["speedup"] <= high
        else:
            assert row["speedup"] == pytest.approx(
                row["spec_tok_s"] / row["nospec_tok_s"], rel=1e-3
            )
        # on the rounds both finished (common_rounds); a run's own file written on the node
        # before that (no `rebuilt`) took every round each server finished
        ways = [bs.common_rounds(*whole)] + ([whole] if not data.get("rebuilt") else [])
        assert any(
            run["tok_s"] == pytest.approx(row["spec_tok_s"], 1e-3)
            and base["tok_s"] == pytest.approx(row["nospec_tok_s"], 1e-3)
            for run, base in ways
        )
    if data.get("rebuilt"):  # derived again from a committed run: the same as rebuilding it
        source = json.loads((RESULTS.parent.parent.parent / data["rebuilt"]["from"]).read_text())
        fresh = bs.rebuild(source, data["rebuilt"]["from"])
        fresh = json.loads(json.dumps(fresh))
        # a row key added since the run was rebuilt (TTFT, the decode cycle) has no figure
        # from a run that did not measure it
        for row, again in zip(data["rows"], fresh["rows"], strict=True):
            added = set(again) - set(row)
            # a variant read across groups (vs_setting_across_groups, 2026-12-07) has its
            # vs_setting from measurements the run already had
            if again.get("vs_setting_method") in (bs.VS_SETTING_ACROSS, bs.VS_SETTING_ACROSS_RATIO):
                added -= {"vs_setting_server", "vs_setting", "vs_setting_ci95",
                          "vs_setting_method"}
            assert all(again[k] is None for k in added), added
        fresh["rows"] = [
            {k: r[k] for k in row} for r, row in zip(fresh["rows"], data["rows"], strict=True)
        ]
        if data.get("best") and fresh.get("best"):
            fresh["best"] = {k: fresh["best"][k] for k in data["best"]}
        for key in ("rows", "best", "goals", "cycle_breakdown"):
            assert data.get(key) == fresh.get(key), key


def test_profile_server_asks_sglang_to_profile_and_reads_its_trace(tmp_path, monkeypatch):
    """A local HTTP endpoint stands in for SGLang's /start_profile: it records the request
    body and writes a trace where SGLang would; the breakdown of that trace comes back."""
    import gzip
    import http.server
    import threading

    from test_trace_breakdown import _trace

    received = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.update(path=self.path, body=body)
            out = Path(body["output_dir"]) / f"{body['profile_prefix']}-TP-0.trace.json.gz"
            with gzip.open(out, "wt") as fh:
                json.dump(_trace(cycles=3), fh)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"Start profiling.\n")

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server = Server("spec-5-1-6", "/t", httpd.server_address[1])
        watched = []

        class Watch:  # GpuWatch's stand-in: what ran inside it, and its summary
            def __enter__(self):
                watched.append("entered")
                return self

            def __exit__(self, *exc):
                watched.append("left")

            def summary(self):
                return {"sm_mhz_median": 1410, "while": "traced"}

        def run(*a):
            assert watched == ["entered"]  # the request runs inside the watch
            return [], 1.0

        monkeypatch.setattr(bs, "_run", run)
        monkeypatch.setattr(bs, "GpuWatch", Watch)
        monkeypatch.setattr(bs.time, "sleep", lambda s: None)
        args = bs.parse_args(["--target", "t", "--drafter", "d", "--prompts", "p",
                              "--log-dir", str(tmp_path), "--profile", "--profile-steps", "7"])
        out = bs.profile_server(server, object(), args)
    finally:
        httpd.shutdown()
    assert received["path"] == "/start_profile"
    assert received["body"]["num_steps"] == 7
    assert received["body"]["activities"] == ["CPU", "GPU"]
    assert out["target_graph_launches"] == 3
    assert out["per_cycle_ms"]["target_graph_kernels"] == pytest.approx(4.0)
    assert out["trace"].endswith("spec-5-1-6-TP-0.trace.json.gz")
    # the trace stays on the node: which kernels ran comes back in the record
    assert out["top_kernels"]["target_graph"][0]["calls_per_cycle"] == 40.0
    assert out["kernel_families"]["target_graph"]["merge_state"]["calls_per_cycle"] == 0.0
    # and the host's side of the same cycles (trace_host): three graph launches each
    assert out["host"]["calls_per_cycle"]["graph_launch"] == 3.0
    # the traced request's clock is recorded as a timed one's is
    assert out["gpu_watch"] == {"sm_mhz_median": 1410, "while": "traced"}


def test_a_flag_variant_runs_the_main_drafter_with_that_server_argument():
    """``LABEL:--flag=value`` is a server argument, not an env var (SGLang's own switches
    such as an fp8 drafter are arguments)."""
    parsed = bs.parse_variant("fp8draft:--speculative-draft-model-quantization=fp8")
    assert parsed == ("fp8draft", "--speculative-draft-model-quantization", "fp8")
    for bad in ("fp8draft:--=fp8", "fp8draft:--speculative-draft-model-quantization="):
        with pytest.raises(argparse.ArgumentTypeError, match="server"):
            bs.parse_variant(bad)
    specs = bs.server_specs([(3, 1, 4)], (3, 1, 4), [parsed])
    variant = specs[-1]
    assert variant["name"] == "spec-3-1-4-fp8draft" and variant["role"] == "variant"
    assert "env" not in variant
    args = bs.parse_args(["--target", "t", "--drafter", "d", "--prompts", "p",
                          "--variant", "fp8draft:--speculative-draft-model-quantization=fp8"])
    assert args.variant == [parsed]
    server = bs.make_servers(specs, args)[-1]
    assert server.draft == "d" and server.env == {}
    command = server.command()
    at = command.index("--speculative-draft-model-quantization")
    assert command[at + 1] == "fp8"
    # LABEL@SETTING: the same at another setting (beside the main server there)
    at = bs.parse_variant("fp8long@7,1,8:--speculative-draft-model-quantization=fp8")
    with pytest.raises(argparse.ArgumentTypeError, match="draft_tokens must be steps"):
        bs.parse_variant("fp8long@7,1,5:--speculative-draft-model-quantization=fp8")
    both = bs.server_specs([(3, 1, 4), (7, 1, 8)], (3, 1, 4), [parsed, at])
    assert [(s["name"], s["setting"], s["label"]) for s in both[-2:]] == [
        ("spec-3-1-4-fp8draft", (3, 1, 4), "fp8draft"),
        ("spec-7-1-8-fp8long", (7, 1, 8), "fp8long"),
    ]
    groups = bs.plan_groups(both, at_once=4)
    assert any({"spec-7-1-8", "spec-7-1-8-fp8long"} <= set(g) for g in groups)
    # still a server with the overlap scheduler on
    rows = bs.build_rows({("nospec", 1): {"tok_s": 200.0},
                          ("spec-3-1-4-fp8draft", 1): {"tok_s": 400.0, "tau": 2.5}}, specs, [1])
    row = next(r for r in rows if r["server"] == "spec-3-1-4-fp8draft")
    assert row["overlap"] is True and row["drafter"].endswith("[fp8draft]")


def test_variant_server_runs_the_main_drafter_with_its_env(capsys):
    assert bs.parse_variant("splitkv:SGLANG_EXT_SPLITKV_VERIFY=1") == (
        "splitkv", "SGLANG_EXT_SPLITKV_VERIFY", "1"
    )
    with pytest.raises(argparse.ArgumentTypeError, match="LABEL:KEY=VALUE"):
        bs.parse_variant("SGLANG_EXT_SPLITKV_VERIFY=1")
    specs = bs.server_specs([(3, 1, 4), (5, 1, 6)], (5, 1, 6),
                            [("splitkv", "SGLANG_EXT_SPLITKV_VERIFY", "1")])
    variant = specs[-1]
    assert variant["name"] == "spec-5-1-6-splitkv" and variant["setting"] == (5, 1, 6)
    args = bs.parse_args(["--target", "t", "--drafter", "d", "--prompts", "p",
                          "--variant", "splitkv:SGLANG_EXT_SPLITKV_VERIFY=1"])
    servers = bs.make_servers(specs, args)
    assert servers[-1].draft == "d"
    assert servers[-1].env == {"SGLANG_EXT_SPLITKV_VERIFY": "1"}
    agg = {("nospec", 1): {"tok_s": 200.0}, ("spec-5-1-6-splitkv", 1): {"tok_s": 500.0,
                                                                        "tau": 3.0}}
    rows = [r for r in bs.build_rows(agg, specs, [1]) if r["server"] == "spec-5-1-6-splitkv"]
    assert rows[0]["drafter"] == "speculators (plugin) [splitkv]"
    assert rows[0]["speedup"] == 2.5 and rows[0]["eta"] == pytest.approx(0.8333, 1e-3)


def test_bootstrap_interval_pairs_prompts_and_brackets_the_ratio():
    nospec = [1.0, 1.2, 0.9, 1.1, 1.0, 1.05] * 11
    spec = [0.5, 0.4, 0.45, 0.6, 0.5, 0.55] * 11
    low, high = bs.bootstrap_ratio_ci(nospec, spec)
    point = sum(nospec) / sum(spec)
    assert low < point < high and high - low < 0.3
    assert bs.bootstrap_ratio_ci([1.0], [0.5]) is None  # one pair: no interval
    # a prompt failed in any round has no time
    assert bs.per_prompt_times([[1.0, 2.0, None], [3.0, 4.0, 5.0]]) == [2.0, 3.0, None]


def test_larger_batches_pair_rounds():
    base = {"tok_s_rounds": {0: 100.0, 1: 110.0, 2: 90.0}}
    run = {"tok_s_rounds": {0: 150.0, 1: 160.0, 2: 140.0}}
    ci, method = bs.speedup_interval(base, run, 4)
    assert method == "paired rounds, bootstrap" and ci[0] <= 1.5 <= ci[1]


def test_noise_measures_the_no_speculation_server_again_without_a_second_server(prompts_file,
                                                                                 capsys):
    assert bs.main(_argv(prompts_file, "--noise", "--dry-run")) == 0
    dry = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in dry["servers"]].count("nospec") == 1
    assert "nospec-again" not in [s["name"] for s in dry["servers"]]
    assert {e["server"] for e in dry["plan"]} >= {"nospec", "nospec-again"}
    specs = bs.server_specs([(3, 1, 4)], None, noise=True)
    agg = {("nospec", 1): {"tok_s": 100.0, "tok_s_rounds": {0: 100.0},
                           "latency_rounds": [[1.0, 1.1, 0.9]], "tau": None},
           ("nospec-again", 1): {"tok_s": 101.0, "tok_s_rounds": {0: 101.0},
                                 "latency_rounds": [[1.0, 1.0, 1.0]], "tau": None}}
    [noise] = [r for r in bs.build_rows(agg, specs, [1]) if r["drafter"] == bs.NOISE]
    # the prompts' times paired and summed (3.0 against 3.0), not tok/s (101 / 100)
    assert noise["speedup"] == 1.0 and noise["steps"] is None
    low, high = noise["speedup_ci95"]
    assert low <= noise["speedup"] <= high


def test_merge_puts_backends_side_by_side_and_never_overwrites(tmp_path):
    def run(backend, speedup):
        row = {"backend": None, "batch": 1, "steps": 3, "topk": 1, "draft_tokens": 4,
               "drafter": bs.MAIN, "nospec_tok_s": 100.0, "spec_tok_s": 100.0 * speedup,
               "tau": 3.0, "speedup": speedup, "eta": speedup / 3, "plugin_vs_stock": None,
               "speedup_ci95": [speedup - 0.1, speedup + 0.1], "spec_tpot_ms": 1.0,
               "status": "ok"}
        path = tmp_path / f"{backend}.json"
        path.write_text(json.dumps({"attention_backend": backend, "batches": [1], "rows": [row],
                                    "compare_setting": None}))
        return path

    out = tmp_path / "matrix.json"
    args = ["merge", str(run("triton", 2.2)), str(run("fa3", 2.6)), "--out-json", str(out)]
    assert bs.main(args) == 0
    merged = json.loads(out.read_text())
    assert [r["backend"] for r in merged["rows"]] == ["triton", "fa3"]
    assert merged["best"]["backend"] == "fa3" and merged["goals"]["speedup_ge_2_5"] is True
    assert bs.main(args) == 2  # the output exists: not overwritten
    assert "fa3" in bs.format_table(merged["rows"])


def test_merge_judges_plugin_vs_stock_on_every_backend():
    def run(backend, pvs=None, ci=None):
        def row(drafter, value):
            return {"backend": None, "batch": 1, "steps": 3, "topk": 1, "draft_tokens": 4,
                    "drafter": drafter, "speedup": 2.0, "eta": 0.7, "tau": 2.8,
                    "plugin_vs_stock": value, "plugin_vs_stock_ci95": ci if value else None}

        rows = [row(bs.MAIN, None)]
        if pvs is not None:
            rows += [row(bs.NBR_PLUGIN, pvs), row(bs.NBR_STOCK, pvs)]
        return {"attention_backend": backend, "batches": [1], "rows": rows,
                "compare_setting": [3, 1, 4]}

    fa3, triton = run("fa3", 0.989, [0.983, 0.993]), run("triton", 0.97, [0.96, 0.98])
    goals = bs.merge_results([fa3, triton])["goals"]
    assert goals["plugin_vs_stock_by_backend"] == {
        "fa3": {"batch": 1, "plugin_vs_stock": 0.989, "plugin_vs_stock_ci95": [0.983, 0.993],
                "pass": True},
        "triton": {"batch": 1, "plugin_vs_stock": 0.97, "plugin_vs_stock_ci95": [0.96, 0.98],
                   "pass": False},
    }
    assert goals["plugin_vs_stock_ge_0_99"] is False  # one backend shown below 0.99
    assert bs.merge_results([fa3, run("triton", 1.0, [0.99, 1.01])])["goals"][
        "plugin_vs_stock_ge_0_99"] is True
    # a backend without the pair: the goal is not known, whatever fa3 says
    partial = bs.merge_results([fa3, run("flashinfer")])["goals"]
    assert set(partial["plugin_vs_stock_by_backend"]) == {"fa3"}
    assert partial["plugin_vs_stock_ge_0_99"] is None


def test_acceptance_dir_gives_each_plugin_server_its_records_file(tmp_path):
    specs = bs.server_specs([(3, 1, 4), (3, 4, 5)], None)
    args = bs.parse_args(["--target", "t", "--drafter", "d", "--prompts", "p",
                          "--acceptance-dir", str(tmp_path)])  # fmt: skip
    envs = {s.name: s.env for s in bs.make_servers(specs, args)}
    assert envs["spec-3-4-5"]["SGLANG_EXT_ACCEPTANCE_JSONL"] == str(tmp_path / "spec-3-4-5.jsonl")
    assert envs["spec-3-1-4"]["SGLANG_EXT_ACCEPTANCE_JSONL"] == str(tmp_path / "spec-3-1-4.jsonl")
    assert "SGLANG_EXT_ACCEPTANCE_JSONL" not in envs["nospec"]
    plain = bs.parse_args(["--target", "t", "--drafter", "d", "--prompts", "p"])
    assert all(not s.env for s in bs.make_servers(specs, plain) if s.name != "nospec")


# ------------------------------------------------------------------ issue #23's row keys


def test_no_overlap_server_runs_its_setting_with_the_overlap_scheduler_off(prompts_file, capsys):
    argv = _argv(prompts_file, "--settings", "3,1,4", "5,1,6", "--no-overlap-at", "3,1,4")
    args = bs.parse_args(argv)
    servers = {s.name: s.command() for s in bs.make_servers(args.specs, args)}
    assert bs.NO_OVERLAP in servers["spec-3-1-4-nooverlap"]
    assert all(bs.NO_OVERLAP not in c for n, c in servers.items() if "nooverlap" not in n)
    spec = next(s for s in args.specs if s["name"] == "spec-3-1-4-nooverlap")
    assert spec["setting"] == (3, 1, 4) and spec["role"] == "variant"
    ms = [m for m in _measurements() if m["server"] in ("nospec", "spec-3-1-4")]
    # per-prompt latencies: the variant takes 1/0.8 .. 1/0.9 of the plain server's time
    for m in ms:
        m["latency_s"] = [1.0 + 0.1 * i for i in range(8)]
    slower = [0.8, 0.9, 0.85, 0.82, 0.88, 0.84, 0.86, 0.81]
    ms += [
        {
            **m,
            "server": "spec-3-1-4-nooverlap",
            "tok_s": m["tok_s"] * 0.85,
            "latency_s": [t / f for t, f in zip(m["latency_s"], slower, strict=True)],
        }
        for m in ms
        if m["server"] == "spec-3-1-4"
    ]
    rows = bs.build_rows(bs.aggregate(ms), args.specs[:2] + [spec], [1])
    assert [(r["server"], r["overlap"]) for r in rows] == [
        ("spec-3-1-4", True), ("spec-3-1-4-nooverlap", False)
    ]
    # the variant against the plain server at its setting; the plain row has no such key
    assert "vs_setting" not in rows[0]
    assert rows[1]["vs_setting_server"] == "spec-3-1-4"
    plain = [1.0 + 0.1 * i for i in range(8)]
    variant = [t / f for t, f in zip(plain, slower, strict=True)]
    assert rows[1]["vs_setting"] == pytest.approx(sum(plain) / sum(variant), abs=1e-4)
    low, high = rows[1]["vs_setting_ci95"]
    assert 0.8 <= low <= rows[1]["vs_setting"] <= high <= 0.9
    everywhere = bs.build_rows(bs.aggregate(ms), args.specs[:2], [1], server_args=[bs.NO_OVERLAP])
    assert [r["overlap"] for r in everywhere] == [False]
    best, _ = bs.best_and_goals(rows, None)
    assert best["server"] == "spec-3-1-4"  # a variant row is never the best main row
    # among served configurations it is a candidate; slower here, so the plain row stays
    assert bs.served_best(rows, None)["best_served"]["server"] == "spec-3-1-4"
    with pytest.raises(SystemExit):
        bs.parse_args(
            _argv(prompts_file, "--settings", "3,1,4", "--no-overlap-at", "5,1,6", nbr=False)
        )
    assert "--no-overlap-at 5,1,6: not one of --settings" in capsys.readouterr().err


def test_rows_say_each_drafters_draft_vocabulary(prompts_file, tmp_path):
    reduced, full, converted = tmp_path / "reduced", tmp_path / "full", tmp_path / "sglang"
    for d, cfg in (
        (reduced, {"draft_vocab_size": 32000, "transformer_layer_config": {"vocab_size": 128256}}),
        (full, {"transformer_layer_config": {"vocab_size": 8192}}),
        (converted, {"draft_vocab_size": 32000, "vocab_size": 128256}),
    ):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
    argv = ["--target", "T", "--drafter", str(reduced), "--prompts", str(prompts_file),
            "--drafter-nbr-false", str(full), "--drafter-nbr-false-sglang", str(converted),
            "--settings", "5,1,6"]
    args = bs.parse_args(argv)
    vocab = {s["name"]: s["draft_vocab"] for s in args.specs}
    assert vocab == {"nospec": None, "spec-5-1-6": 32000, "nbrfalse-plugin-5-1-6": 8192,
                     "nbrfalse-stock-5-1-6": 32000}
    rows = bs.build_rows(bs.aggregate(_measurements()), args.specs, [1])
    assert {r["server"]: r["draft_vocab"] for r in rows}["spec-5-1-6"] == 32000
    assert bs.draft_vocab(tmp_path / "missing") is None and bs.draft_vocab(None) is None


def test_cycle_breakdown_takes_kernels_from_the_trace_and_the_cycle_from_the_timed_rounds():
    # traced: the host runs slow under the profiler (idle 6 ms of a 15 ms cycle); timed: the
    # baseline decodes 200 tok/s (5 ms a step) and the chain 360 tok/s at tau 2.4 (6.667 ms)
    profiles = {
        "nospec": {"per_cycle_ms": {"total": 10.0, "target_graph_kernels": 4.6,
                                    "other_kernels": 0.25, "gpu_idle": 5.15}},
        "spec-3-1-4": {
            "per_cycle_ms": {"total": 15.0, "target_graph_kernels": 4.9,
                             "drafter_graph_kernels": 0.75, "other_kernels": 0.3,
                             "gpu_idle": 9.05},
            "kernel_families": {"target_graph": {"flash_attention": {"calls_per_cycle": 96.0},
                                                 "merge_state": {"calls_per_cycle": 0.0}}},
        },
        "spec-5-1-6": {"per_cycle_ms": {"total": 16.0, "target_graph_kernels": 4.9}},
        "spec-4-4-8": {"error": "no trace"},
    }
    rows = [
        {"server": "spec-3-1-4", "batch": 1, "nospec_tok_s": 200.0, "spec_tok_s": 360.0,
         "tau": 2.4, "overlap": True},
        {"server": "spec-3-1-4", "batch": 4, "nospec_tok_s": 700.0, "spec_tok_s": 1.0,
         "tau": 2.4},
        {"server": "spec-5-1-6", "batch": 1, "nospec_tok_s": 200.0, "spec_tok_s": None,
         "tau": None},  # not measured: no cycle, so no split
    ]
    out = bs.cycle_breakdown(profiles, SPECS, rows)
    assert out["baseline"] == {"profiled_step_ms": 10.0, "target_graph_ms": 4.6,
                               "other_kernels_ms": 0.25}
    chain = out["servers"]["spec-3-1-4"]
    assert chain["setting"] == "3,1,4" and chain["overlap"] is True
    assert chain["decode_step_ms"] == 5.0 and chain["cycle_ms"] == pytest.approx(6.667)
    steps = chain["decode_steps"]
    assert steps["total"] == pytest.approx(2.4 / 1.8, abs=1e-4)  # = the row's tau / speedup
    assert (steps["target_verify"], steps["drafter"], steps["other_kernels"]) == (
        0.98, 0.15, 0.06)
    assert steps["host"] == pytest.approx((6.6667 - 5.95) / 5.0, abs=1e-4)
    assert sum(steps.values()) - steps["total"] == pytest.approx(steps["total"], abs=2e-4)
    assert chain["profiled_cycle_ms"] == 15.0
    assert chain["flash_attention_per_verify"] == 96.0 and chain["merge_state_per_verify"] == 0.0
    assert set(out["servers"]) == {"spec-3-1-4"}  # failed trace / unmeasured row: no figure
    assert bs.cycle_breakdown({"spec-3-1-4": profiles["spec-3-1-4"]}, SPECS, rows) is None


def _paired(server, group, seconds, rounds=2):
    """Batch-1 measurements of one server: each prompt's latency per round."""
    return [
        {**_m(server, 1, r, len(seconds) * 128 / sum(seconds), tokens=len(seconds) * 128,
              verify=40 * len(seconds) if server != "nospec" else None),
         "group": group, "latency_s": list(seconds)}
        for r in range(rounds)
    ]


def _grouped_result(plugin_seconds, stock_seconds):
    meta = {"batches": [1], "attention_backend": "fa3"}
    groups = [["nospec", "spec-3-1-4", "spec-5-1-6"],
              ["nospec", "nbrfalse-plugin-5-1-6", "nbrfalse-stock-5-1-6"]]
    base = [1.0, 1.2, 0.8, 1.1, 0.9, 1.0, 1.3, 0.7]
    ms = _paired("nospec", 0, base) + _paired("nospec", 1, base)
    ms += _paired("spec-3-1-4", 0, [t / 2 for t in base])
    ms += _paired("spec-5-1-6", 0, [t / 2.2 for t in base])
    ms += _paired("nbrfalse-plugin-5-1-6", 1, plugin_seconds)
    ms += _paired("nbrfalse-stock-5-1-6", 1, stock_seconds)
    specs = [s for s in SPECS if s["name"] != "spec-4-4-8"]
    servers = [{"name": s["name"], "status": "ready"} for s in specs]
    return bs.build_result(meta, servers, ms, specs, (5, 1, 6), None, groups)


def test_plugin_vs_stock_goal_reads_the_pair_run_in_another_group_and_judges_its_interval():
    # the same math on both servers: per-prompt times scattered around equal, plugin 1.1 %
    # slower in total -- a point estimate under 0.99 whose interval reaches above it
    stock = [0.50, 0.62, 0.38, 0.55, 0.47, 0.49, 0.66, 0.33]
    plugin = [0.53, 0.60, 0.40, 0.55, 0.45, 0.50, 0.68, 0.3345]
    result = _grouped_result(plugin, stock)
    pair = _row(result["rows"], bs.NBR_PLUGIN, (5, 1, 6), 1)
    assert pair["plugin_vs_stock"] == pytest.approx(sum(stock) / sum(plugin), abs=1e-4)
    lo, hi = pair["plugin_vs_stock_ci95"]
    assert lo < pair["plugin_vs_stock"] < 0.99 < hi
    # the main drafter's 5,1,6 row ran in group 0, without the pair: no figure of its own
    assert _row(result["rows"], bs.MAIN, (5, 1, 6), 1)["plugin_vs_stock"] is None
    goals = result["goals"]
    assert goals["plugin_vs_stock"] == pair["plugin_vs_stock"]
    assert goals["plugin_vs_stock_ci95"] == [lo, hi]
    assert goals["plugin_vs_stock_ge_0_99"] is True  # not shown below 0.99: noise
    # a plugin 5 % slower on every prompt: the interval lies below 0.99 and the goal fails
    slow = _grouped_result([t * 1.05 for t in stock], stock)
    assert slow["goals"]["plugin_vs_stock_ci95"][1] < 0.99
    assert slow["goals"]["plugin_vs_stock_ge_0_99"] is False


def test_rebuild_derives_the_same_figures_from_the_measurements_with_or_without_specs(tmp_path):
    original = json.loads(json.dumps(_grouped_result(
        [0.53, 0.60, 0.40, 0.55, 0.45, 0.50, 0.68, 0.3345],
        [0.50, 0.62, 0.38, 0.55, 0.47, 0.49, 0.66, 0.33])))
    commands = {"spec-3-1-4": ["python", "-m", "sglang.launch_server", bs.NO_OVERLAP]}
    original["servers"] = [
        {"name": s["name"], "role": s["role"], "setting": s["setting"], "status": "ready",
         "command": commands.get(s["name"], ["python", "-m", "sglang.launch_server"])}
        for s in SPECS if s["name"] != "spec-4-4-8"
    ]
    # a stored run: derived parts stale (as written by an older version), no specs
    stale = {**original, "goals": {"plugin_vs_stock": None},
             "rows": [{**r, "plugin_vs_stock_ci95": None} for r in original["rows"]]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(stale))
    out = tmp_path / "rebuilt.json"
    assert bs.main(["rebuild", str(path), "--out-json", str(out)]) == 0
    rebuilt = json.loads(out.read_text())
    assert rebuilt["rebuilt"]["from"] == str(path)
    assert rebuilt["goals"]["plugin_vs_stock_ci95"] == original["goals"]["plugin_vs_stock_ci95"]
    assert rebuilt["goals"]["plugin_vs_stock_ge_0_99"] is True
    by_server = {(r["server"], r["batch"]): r for r in rebuilt["rows"]}
    for row in original["rows"]:
        again = by_server[(row["server"], row["batch"])]
        same = ("speedup", "speedup_ci95", "tau", "plugin_vs_stock", "plugin_vs_stock_ci95")
        assert {k: again[k] for k in same} == {k: row[k] for k in same}
    # the overlap flag came back from the server's command
    assert by_server[("spec-3-1-4", 1)]["overlap"] is False
    assert by_server[("spec-5-1-6", 1)]["overlap"] is True
    # never over an existing file; not a run: usage error
    assert bs.main(["rebuild", str(path), "--out-json", str(out)]) == 2
    (tmp_path / "rows.json").write_text(json.dumps({"rows": []}))
    assert bs.main(["rebuild", str(tmp_path / "rows.json"), "--out-json",
                    str(tmp_path / "x.json")]) == 2
    # stored specs win over the records (a new run's file)
    assert bs.specs_of({**stale, "specs": [{"name": "nospec", "role": "nospec",
                                            "setting": None}]}) == [
        {"name": "nospec", "role": "nospec", "setting": None}]


def test_cycle_breakdown_of_steady_cycles_takes_the_prefill_out_of_the_timed_figures():
    def steady(prefill, per_cycle, idle_before=None):
        return {"per_cycle_ms": per_cycle, "gpu_idle_before_ms": idle_before or {},
                "before_first_cycle_ms": {"gpu_kernels": prefill, "wall": prefill + 1}}

    profiles = {
        "nospec": {"per_cycle_ms": {"total": 10.0, "other_kernels": 0.25},
                   "steady": steady(9.6, {"target_graph_kernels": 4.6, "other_kernels": 0.02})},
        "spec-3-1-4": {
            "per_cycle_ms": {"total": 15.0, "target_graph_kernels": 4.9, "other_kernels": 0.3},
            "steady": steady(10.4, {"target_graph_kernels": 4.9, "drafter_graph_kernels": 0.75,
                                    "other_kernels": 0.05}, {"target_graph": 0.4}),
        },
    }
    rows = [{"server": "spec-3-1-4", "batch": 1, "nospec_tok_s": 200.0, "spec_tok_s": 360.0,
             "tau": 2.4, "overlap": True}]
    chain = bs.cycle_breakdown(profiles, SPECS, rows, new_tokens=128)["servers"]["spec-3-1-4"]
    step = 5.0 - 9.6 / 128  # the timed step less the prefill spread over 128 tokens
    cycle = 1000 * 2.4 / 360 - 10.4 * 2.4 / 128  # ... over the request's 128 / tau cycles
    assert chain["split"] == "steady" and chain["prefill_gpu_ms"] == 10.4
    assert chain["decode_step_ms"] == pytest.approx(step, abs=1e-3)
    assert chain["cycle_ms"] == pytest.approx(cycle, abs=1e-3)
    parts = chain["decode_steps"]
    assert parts["other_kernels"] == pytest.approx(0.05 / step, abs=1e-4)
    assert parts["host"] == pytest.approx((cycle - 5.7) / step, abs=1e-4)
    assert chain["traced_gpu_idle_before_ms"] == {"target_graph": 0.4}
    assert "traced_host_sync_ms" not in chain  # a trace read before trace_host
    profiles["spec-3-1-4"]["host"] = {"calls_per_cycle": {"eager_launch": 41.0}, "sync_ms": 0.02}
    chain = bs.cycle_breakdown(profiles, SPECS, rows, new_tokens=128)["servers"]["spec-3-1-4"]
    assert chain["traced_host_calls"] == {"eager_launch": 41.0}
    assert chain["traced_host_sync_ms"] == 0.02
    # without the completion length (or a steady baseline): the window split, as before
    assert bs.cycle_breakdown(profiles, SPECS, rows)["servers"]["spec-3-1-4"]["split"] == "window"


def test_second_pair_pools_two_plugin_stock_comparisons(prompts_file, tmp_path, monkeypatch):
    """--second-pair: a second plugin server and a second stock server, side by side (in a
    group of their own where the pair's is full), and the goal on both pairs pooled: one
    pair is one draw of the servers' instance noise (2026-12-03, the seed shape: 0.960 on one
    pair of fresh servers, 1.005 and 1.024 on the next)."""
    specs = bs.server_specs([(3, 1, 4)], (3, 1, 4), second_pair=True)
    roles = {s["name"]: s["role"] for s in specs}
    assert roles["nbrfalse-plugin-b-3-1-4"] == "nbr_plugin_b"
    assert roles["nbrfalse-stock-b-3-1-4"] == "nbr_stock_b"
    assert next(s for s in specs if s["role"] == "nbr_stock_b")["stock"] is True
    assert bs.plan_groups(specs, 4) == [
        ["nospec", "spec-3-1-4", "nbrfalse-plugin-3-1-4", "nbrfalse-stock-3-1-4"],
        ["nospec", "nbrfalse-plugin-b-3-1-4", "nbrfalse-stock-b-3-1-4"],
    ]
    assert bs.plan_groups(specs, 5)[1] == [
        "nospec", "nbrfalse-plugin-b-3-1-4", "nbrfalse-stock-b-3-1-4"]  # fmt: skip

    speed = {"nospec": 100.0, "spec-3-1-4": 250.0, "nbrfalse-plugin-3-1-4": 192.0,
             "nbrfalse-stock-3-1-4": 200.0, "nbrfalse-plugin-b-3-1-4": 212.0,
             "nbrfalse-stock-b-3-1-4": 200.0}  # fmt: skip
    data = _pair_run(prompts_file, tmp_path, monkeypatch, speed, "--second-pair")
    stock = _row(data["rows"], bs.NBR_STOCK, (3, 1, 4), 1)
    assert stock["plugin_vs_stock"] == pytest.approx(192 / 200, abs=2e-3)
    assert stock["plugin_vs_stock_b"] == pytest.approx(212 / 200, abs=2e-3)
    # pooled: the four servers' times per prompt, stock over plugin
    assert stock["plugin_vs_stock_pooled"] == pytest.approx(0.01 / (1 / 192 + 1 / 212), abs=2e-3)
    low, high = stock["plugin_vs_stock_pooled_ci95"]
    assert low <= stock["plugin_vs_stock_pooled"] <= high
    assert _row(data["rows"], bs.NBR_PLUGIN_B, (3, 1, 4), 1)["status"] == "ok"
    goals = data["goals"]
    # the first pair alone (0.96, its interval under 0.99) would fail; pooled, it passes
    assert stock["plugin_vs_stock_ci95"][1] < 0.99
    assert goals["plugin_vs_stock"] == stock["plugin_vs_stock_pooled"]
    assert goals["plugin_vs_stock_ci95"] == [low, high]
    assert goals["plugin_vs_stock_a"] == stock["plugin_vs_stock"]
    assert goals["plugin_vs_stock_ge_0_99"] is True and goals["plugin_vs_stock_pooled_over"] == 2
    assert set(bs.SECOND_PAIR_GOALS) <= set(goals)  # what seed_shape_result carries over
    with pytest.raises(SystemExit):  # the second pair needs the first
        bs.parse_args(_argv(prompts_file, "--second-pair", nbr=False))


def test_pin_cpus_pins_every_server_the_same_way_and_the_result_says_how(
    prompts_file, tmp_path, monkeypatch
):
    """--pin-cpus: the servers started on every core (they inherit this process's affinity),
    each server's process group pinned by role once it is up, then the client (this process)
    on its cores before any request; the plan and the threads in the JSON."""
    import types

    from sglang_ext_tools import cpu_pinning

    def ready_with_pids(servers, timeout):
        for k, s in enumerate(servers):
            s.status, s.process = "ready", types.SimpleNamespace(pid=1000 + k)
        return {s.name: s.status for s in servers}

    pinned, client = [], []
    monkeypatch.setattr(bs, "start_all", ready_with_pids)
    monkeypatch.setattr(bs, "stop_all", lambda servers: None)
    monkeypatch.setattr(Server, "alive", lambda self: True)
    monkeypatch.setattr(Server, "wait_gone", lambda self: True)
    monkeypatch.setattr(bs, "gpu_info", lambda: {"name": "FakeGPU"})
    monkeypatch.setattr(bs.os, "sched_setaffinity", lambda pid, cpus: client.append(cpus))
    monkeypatch.setattr(
        cpu_pinning, "pin_group",
        lambda pgid, plan: pinned.append(pgid) or {"scheduler": 3, "detokenizer": 1, "server": 4},
    )  # fmt: skip
    monkeypatch.setattr(
        bs, "_run",
        lambda server, prompts, c, n: _fake_requests(server.name, len(prompts), n, 100.0),
    )  # fmt: skip
    plan = "client=0;scheduler=1;detokenizer=2;server=3"
    monkeypatch.setattr(cpu_pinning.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    out_json = tmp_path / "r.json"
    argv = _argv(prompts_file, "--settings", "3,1,4", "--batches", "1", "--rounds", "1",
                 "--batch1-requests", "4", "--max-new-tokens", "16", "--pin-cpus", plan,
                 "--log-dir", str(tmp_path / "logs"), "--out-json", str(out_json),
                 nbr=False)  # fmt: skip
    assert bs.main(argv) == 0
    data = json.loads(out_json.read_text())
    assert client == [frozenset({0, 1, 2, 3}), frozenset({0})]
    assert pinned == [1000, 1001]  # nospec and spec-3-1-4, each once
    assert data["cpu_pinning"]["plan"] == {
        "client": [0], "scheduler": [1], "detokenizer": [2], "server": [3],
    }  # fmt: skip
    assert data["cpu_pinning"]["threads_pinned"]["spec-3-1-4"]["scheduler"] == 3


def test_a_variant_joins_several_switches_with_plus():
    """``LABEL:A=1+B=1+--flag=x``: SGLang's host-side switches tried together on one server
    (each env var and each server argument once)."""
    parsed = bs.parse_variant(
        "host@7,1,8:SGLANG_ENABLE_METADATA_GLUE_GRAPH=1+SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW=1"
        "+--speculative-draft-model-quantization=fp8"
    )
    assert parsed[0] == "host@7,1,8" and len(parsed) == 7
    (variant,) = [s for s in bs.server_specs([(3, 1, 4), (7, 1, 8)], None, [parsed])
                  if s["role"] == "variant"]  # fmt: skip
    assert variant["name"] == "spec-7-1-8-host" and variant["setting"] == (7, 1, 8)
    assert variant["env"] == {"SGLANG_ENABLE_METADATA_GLUE_GRAPH": "1",
                              "SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW": "1"}  # fmt: skip
    assert variant["extra"] == ["--speculative-draft-model-quantization", "fp8"]
    for bad in ("host:A=1+A=2", "host:A=1+", "host:A=1+--=x"):
        with pytest.raises(argparse.ArgumentTypeError, match="joined by \\+"):
            bs.parse_variant(bad)


def test_the_next_registered_seed_shape_run_plans_twins_and_the_prefill_graph_variant(
    prompts_file,
):
    """The next #24 run of docs/next-device-sessions.md (registered 2026-12-03, eighth session):
    seed-shape-bench's own flags, then the run's. Each twin (`b`, an environment variable nothing
    reads) measures in its plain server's group, and the prefill-graph variant's flags come after
    the bench's `--cuda-graph-backend-prefill disabled`, so SGLang's parser keeps the variant's."""
    argv = [
        "--target", "T", "--drafter", "D", "--prompts", str(prompts_file),
        "--settings", "3,1,4", "5,1,6", "3,4,5", "--attention-backend", "fa3",
        "--max-new-tokens", "128", "--batch1-requests", "16", "--at-once", "4",
        "--mem-fraction", "0.9", "--max-total-tokens", "16384", "--batches", "1",
        "--rounds", "2",
        "--settings", "3,1,4", "5,1,6", "--rounds", "3",
        "--variant", "b@3,1,4:SGLANG_EXT_INSTANCE=b",
        "--variant", "b@5,1,6:SGLANG_EXT_INSTANCE=b",
        "--variant",
        "pg@5,1,6:--cuda-graph-backend-prefill=breakable+--cuda-graph-max-bs-prefill=512",
    ]  # fmt: skip
    args = bs.parse_args(argv)
    assert args.rounds == 3
    assert bs.plan_groups(args.specs, args.at_once) == [
        ["nospec", "spec-3-1-4", "spec-3-1-4-b"],
        ["nospec", "spec-5-1-6", "spec-5-1-6-b", "spec-5-1-6-pg"],
    ]
    servers = {s.name: s for s in bs.make_servers(args.specs, args)}
    assert servers["spec-5-1-6-b"].env == {"SGLANG_EXT_INSTANCE": "b"}
    command = servers["spec-5-1-6-pg"].command()
    flag = "--cuda-graph-backend-prefill"
    last = max(i for i, c in enumerate(command) if c == flag)
    assert command[last + 1] == "breakable" and command.count(flag) == 2
    assert command[command.index("--cuda-graph-max-bs-prefill") + 1] == "512"


def test_the_fastest_served_configuration_is_read_beside_the_best_main_row():
    """2026-12-06, one H100: 7/1/8 with the drafter in fp8 (a variant row) was the fastest
    row; `best` keeps its meaning (plain servers of the main drafter), `best_served` and
    `goals_served` read the issue's goals there. A run without variant rows has neither."""
    data = json.loads((RESULTS / "speed-2026-12-06-nvidia-h100-sglang0.5.23.json").read_text())
    served = bs.served_best(data["rows"], tuple(data["compare_setting"]))
    assert data["best"]["server"] == "spec-7-1-8"
    assert served["best_served"]["server"] == "spec-7-1-8-fp8head"
    assert served["best_served"]["speedup"] == pytest.approx(2.3571, abs=1e-4)
    goals = served["goals_served"]
    assert goals["speedup_ge_2_5"] is False and goals["eta_ge_0_80"] is False
    assert goals["plugin_vs_stock"] == data["goals"]["plugin_vs_stock"]
    plain = [r for r in data["rows"] if "[" not in r["drafter"]]
    assert bs.served_best(plain, None) == {}


def test_a_nospec_variant_serves_no_drafter_with_its_switch_against_the_baseline(prompts_file,
                                                                                capsys):
    """``LABEL@nospec``: the baseline again with the plugin loaded and the switch set (what
    the switch does without speculation, paired by prompt against ``nospec``); its row is
    neither a speculative candidate for best nor a cycle."""
    parsed = bs.parse_variant("serial@nospec:SGLANG_EXT_MOE_SHARED_STREAM=0")
    assert bs.variant_setting(parsed[0], (5, 1, 6)) == ("serial", None)
    specs = bs.server_specs([(5, 1, 6)], None, [parsed])
    variant = specs[-1]
    assert variant["name"] == "nospec-serial" and variant["role"] == "nospec_variant"
    assert variant["setting"] is None and variant["stock"] is False
    args = bs.parse_args(["--target", "t", "--drafter", "d", "--prompts", "p",
                          "--variant", "serial@nospec:SGLANG_EXT_MOE_SHARED_STREAM=0"])
    server = bs.make_servers(specs, args)[-1]
    assert server.draft is None and server.env == {"SGLANG_EXT_MOE_SHARED_STREAM": "0"}
    assert "--speculative-algorithm" not in server.command()
    # in pairs beside the baseline, as any server
    groups = [["nospec", "spec-5-1-6"], ["nospec", "nospec-serial"]]
    assert bs.plan_groups(specs, at_once=2) == groups
    times = [[1.0, 1.0, 1.0, 1.0]]
    agg = {("nospec", 1): {"tok_s": 100.0, "tok_s_rounds": {0: 100.0}, "latency_rounds": times,
                           "tau": None},
           ("nospec-serial", 1): {"tok_s": 112.0, "tok_s_rounds": {0: 112.0},
                                  "latency_rounds": [[0.9, 0.88, 0.9, 0.89]], "tau": None},
           ("spec-5-1-6", 1): {"tok_s": 150.0, "tok_s_rounds": {0: 150.0},
                               "latency_rounds": [[0.7, 0.6, 0.7, 0.65]], "tau": 2.0}}  # fmt: skip
    rows = bs.build_rows(agg, specs, [1])
    [row] = [r for r in rows if r["server"] == "nospec-serial"]
    assert row["drafter"] == "no speculation [serial]" and row["steps"] is None
    assert row["speedup"] == pytest.approx(4.0 / 3.57, abs=1e-3) and row["eta"] is None
    low, high = row["speedup_ci95"]
    assert low <= row["speedup"] <= high
    best, _ = bs.best_and_goals(rows, None, variants=True)
    assert best["server"] == "spec-5-1-6"
    # a result without stored specs rebuilds the variant from its server record
    rebuilt = bs.specs_of({"servers": [{"name": "nospec-serial", "role": "nospec_variant"}]})
    assert rebuilt[0]["label"] == "serial" and rebuilt[0]["setting"] is None
    assert bs.main(_argv(prompts_file, "--variant", "serial@nospec:A=1", "--dry-run")) == 0
    dry = json.loads(capsys.readouterr().out)
    assert {"nospec", "nospec-serial"} <= {s["name"] for s in dry["servers"]}


def _timed(server, group, latencies, tau=None):
    """One round of ``server`` in ``group``: each prompt's latency (128 tokens each)."""
    tokens = 128 * len(latencies)
    verify = tokens / tau if tau else None
    m = _m(server, 1, 0, tokens / sum(latencies), tokens=tokens, verify=verify)
    return m | {"group": group, "latency_s": list(latencies)}


def test_a_variant_in_another_group_reads_vs_setting_and_its_switched_baseline():
    """--at-once 2 serves each server beside the baseline alone, so a variant and the plain
    server at its setting sit in different groups (2026-12-07: the registered shared-expert
    run came back without ``vs_setting``). Each is read over its own group's baseline, so the
    machine's drift between groups cancels; a LABEL@nospec twin gives the speedup over the
    baseline with the same switch."""
    variants = [bs.parse_variant(v) for v in ("serial@3,1,4:X=0", "serial@nospec:X=0")]
    specs = bs.server_specs([(3, 1, 4)], None, variants)
    groups = bs.plan_groups(specs, at_once=2)
    assert groups == [["nospec", "spec-3-1-4"], ["nospec", "spec-3-1-4-serial"],
                      ["nospec", "nospec-serial"]]  # fmt: skip
    spread = [1.0, 1.1, 0.9, 1.2]  # prompts differ; each server keeps their shape
    ms = [
        _timed("nospec", 0, spread),
        _timed("spec-3-1-4", 0, [x / 0.8 for x in spread], tau=1.0),  # 0.8x
        _timed("nospec", 1, [1.1 * x for x in spread]),  # the machine 10 % slower now
        _timed("spec-3-1-4-serial", 1, [1.1 * x / 0.9 for x in spread], tau=1.0),  # 0.9x
        _timed("nospec", 2, [0.95 * x for x in spread]),
        _timed("nospec-serial", 2, [0.95 * x / 1.1 for x in spread]),  # 1.1x
    ]
    servers = [{"name": s["name"], "status": "ready"} for s in specs]
    out = bs.build_result({"batches": [1]}, servers, ms, specs, None, None, groups)
    rows = {r["server"]: r for r in out["rows"]}
    serial = rows["spec-3-1-4-serial"]
    assert serial["vs_setting_server"] == "spec-3-1-4"
    assert serial["vs_setting"] == pytest.approx(0.9 / 0.8, abs=1e-4)  # not 1.0227, the drift
    low, high = serial["vs_setting_ci95"]
    assert low == pytest.approx(0.9 / 0.8, abs=1e-3) and high == pytest.approx(0.9 / 0.8, abs=1e-3)
    assert serial["vs_setting_method"] == bs.VS_SETTING_ACROSS
    # a larger batch has no per-prompt times to pair: a ratio, labelled as one
    out4 = bs.build_result(
        {"batches": [1, 4]}, servers,
        ms + [{**m, "batch": 4} for m in ms], specs, None, None, groups,
    )
    serial4 = next(
        r for r in out4["rows"] if r["server"] == "spec-3-1-4-serial" and r["batch"] == 4
    )
    assert serial4["vs_setting_ci95"] is None
    assert serial4["vs_setting_method"] == bs.VS_SETTING_ACROSS_RATIO
    assert serial["same_switch_server"] == "nospec-serial"
    assert serial["speedup_same_switch"] == pytest.approx(0.9 / 1.1, abs=1e-4)
    assert serial["eta_same_switch"] == pytest.approx(0.9 / 1.1, abs=1e-3)  # tau 1
    assert (
        "vs_setting" not in rows["spec-3-1-4"]
        and "speedup_same_switch" not in rows["nospec-serial"]
    )


def test_a_variant_without_its_switched_baseline_gets_no_same_switch_figure():
    specs = bs.server_specs([(3, 1, 4)], None, [bs.parse_variant("serial@3,1,4:X=0"),
                                                bs.parse_variant("other@nospec:X=1")])  # fmt: skip
    groups = bs.plan_groups(specs, at_once=2)
    ms = [_timed("nospec", g, [1.0, 1.1]) for g in range(3)] + [
        _timed("spec-3-1-4", 0, [1.2, 1.3], tau=1.0),
        _timed("spec-3-1-4-serial", 1, [1.1, 1.2], tau=1.0),
        _timed("nospec-other", 2, [0.9, 1.0]),
    ]
    servers = [{"name": s["name"], "status": "ready"} for s in specs]
    out = bs.build_result({"batches": [1]}, servers, ms, specs, None, None, groups)
    [serial] = [r for r in out["rows"] if r["server"] == "spec-3-1-4-serial"]
    assert serial["vs_setting"] is not None and "speedup_same_switch" not in serial


SERIAL_RUNS = {
    tag: RESULTS / f"seed-shape-2026-12-07-{tag}-nvidia-h100-sglang0.5.23"
    for tag in ("serial", "serial-b", "serial-c")
}


@pytest.mark.parametrize("tag", sorted(SERIAL_RUNS))
def test_the_committed_shared_stream_runs_rebuild_to_their_committed_rows(tag):
    """The three H100 runs of 2026-12-07 (twenty-third session): the rows of each rebuilt file
    are what this code derives from the run's own measurements."""
    raw = json.loads(Path(f"{SERIAL_RUNS[tag]}-speed.json").read_text())
    kept = json.loads(Path(f"{SERIAL_RUNS[tag]}-speed-rebuilt.json").read_text())
    assert bs.rebuild(raw, "x")["rows"] == kept["rows"]


def test_the_shared_expert_on_the_main_stream_pays_in_every_committed_pair():
    """Serial over SGLang's second stream: the baseline 1.09x in two runs, every speculative
    setting 1.11-1.14x over its plain server (interval lower ends above 1.04)."""
    rows = {
        (tag, r["server"]): r
        for tag in SERIAL_RUNS
        for r in json.loads(Path(f"{SERIAL_RUNS[tag]}-speed-rebuilt.json").read_text())["rows"]
    }
    for key in (("serial", "nospec-serial"), ("serial-c", "nospec-serial")):
        assert rows[key]["speedup_ci95"][0] > 1.05
    pairs = [("serial", "spec-5-1-6-serial"), ("serial-b", "spec-3-1-4-serial"),
             ("serial-b", "spec-3-4-5-serial"), ("serial-c", "spec-3-1-4-serial")]  # fmt: skip
    for key in pairs:
        assert rows[key]["vs_setting_ci95"][0] > 1.04, key
    # over the baseline with the same switch, chain 3/1/4's zero-acceptance ceiling
    assert rows[("serial-c", "spec-3-1-4-serial")]["eta_same_switch"] == pytest.approx(
        0.82, abs=0.01
    )


def test_settings_none_runs_the_baseline_and_the_variants_alone(prompts_file, tmp_path,
                                                                 monkeypatch, capsys):
    """``--settings none``: no plain plugin server, so a short lease measures only what its
    variants switch; a variant must name its setting then, and none at all is refused."""
    variants = ["--variant", "join@nospec:S=join", "--variant", "serial@nospec:S=0",
                "--variant", "join@3,1,4:S=join"]  # fmt: skip
    for extra, said in (
        (["--settings", "none", "3,1,4", *variants], "stands alone"),
        (["--settings", "none"], "nothing beside the baseline"),
        (["--settings", "none", "--variant", "join:S=join"], "'join' names no setting"),
    ):
        with pytest.raises(SystemExit):
            bs.parse_args(_argv(prompts_file, *extra, nbr=False))
        assert said in capsys.readouterr().err
    speed = {"nospec": 100.0, "nospec-join": 107.0, "nospec-serial": 110.0,
             "spec-3-1-4-join": 90.0}  # fmt: skip

    def fake_run(server, prompts, concurrency, max_new_tokens):
        results, wall = _fake_requests(server.name, len(prompts), max_new_tokens,
                                       speed[server.name], jitter=1 / 50)  # fmt: skip
        if server.draft is None:
            for r in results:
                r.acceptance = Acceptance(verify_steps=None)
        return results, wall

    _fake_servers(monkeypatch, fake_run)
    out_json = tmp_path / "r.json"
    argv = _argv(prompts_file, "--settings", "none", *variants, "--at-once", "2", "--batches",
                 "1", "--rounds", "1", "--batch1-requests", "8", "--max-new-tokens", "64",
                 "--log-dir", str(tmp_path / "logs"), "--out-json", str(out_json),
                 nbr=False)  # fmt: skip
    assert bs.main(argv) == 0
    data = json.loads(out_json.read_text())
    assert [s["name"] for s in data["servers"]] == [
        "nospec", "nospec-join", "nospec-serial", "spec-3-1-4-join"]  # fmt: skip
    assert data["settings"] == []
    rows = {r["server"]: r for r in data["rows"]}
    assert set(rows) == {"nospec-join", "nospec-serial", "spec-3-1-4-join"}
    assert rows["nospec-join"]["speedup"] == pytest.approx(1.07, abs=0.01)
    assert rows["spec-3-1-4-join"]["speedup"] == pytest.approx(0.90, abs=0.01)
    assert rows["spec-3-1-4-join"]["tau"] == 4.0
