"""`sglang-ext tune`: tau per setting (measured, or predicted for chains from per-position
acceptance) over each setting's cycle cost; the best is recommended."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from sglang_ext.cli import exit_codes, main
from sglang_ext.cli import tune as t
from sglang_ext.cli.moe_fanout import FanoutConfigError, MoeFanout
from sglang_ext.metrics.acceptance import build_record, histogram_from_steps


def record(steps_accepted, num_steps=3, topk=1, draft_tokens=4):
    return build_record(
        rid="r", prompt_tokens=10, completion_tokens=sum(steps_accepted) + len(steps_accepted),
        verify_steps=len(steps_accepted), accepted_draft_tokens=sum(steps_accepted),
        histogram=histogram_from_steps(steps_accepted), num_draft_tokens=draft_tokens,
        num_steps=num_steps, topk=topk,
    )  # fmt: skip


CHAIN = [record([3, 1, 0, 2]), record([3, 3, 1, 0])]  # 8 cycles, 13 accepted
TREE = [record([3, 3, 2, 1], topk=4, draft_tokens=5)]
COSTS = {
    "settings": [
        {"steps": 3, "topk": 1, "draft_tokens": 4, "cycle_cost": 1.342},
        {"steps": 5, "topk": 1, "draft_tokens": 6, "cycle_cost": 1.518},
        {"steps": 3, "topk": 4, "draft_tokens": 5, "cycle_cost": 1.551},
        {"steps": 3, "topk": 4, "draft_tokens": 8, "cycle_cost": 1.565},
    ]
}


def test_measured_tau_and_positions_per_setting():
    found = t.measured(CHAIN + TREE)
    chain = found[t.Setting(3, 1, 4)]
    assert chain["requests"] == 2 and chain["tau"] == (13 + 8) / 8
    assert chain["per_position"] == [6 / 8, 4 / 8, 3 / 8]
    assert found[t.Setting(3, 4, 5)]["tau"] == (9 + 4) / 4


def test_a_deeper_chain_extends_the_last_conditional_rate():
    a = [0.75, 0.5, 0.375]
    assert t.chain_tau(a, 3) == pytest.approx(1 + sum(a))
    assert t.chain_tau(a, 2) == pytest.approx(1.75 + 0.5)
    # past depth 3 each position is the last times 0.375 / 0.5
    assert t.chain_tau(a, 5) == pytest.approx(1 + sum(a) + 0.375 * 0.75 + 0.375 * 0.75**2)


def test_advice_ranks_by_predicted_speedup_and_says_where_tau_came_from():
    advice = t.advise(t.measured(CHAIN), t.read_costs_from(COSTS))
    rows = {r["setting"]: r for r in advice["rows"]}
    assert rows["3/1/4"]["tau_source"].startswith("measured")
    assert rows["5/1/6"]["tau_source"] == "predicted from chain 3/1/4"
    assert rows["3/4/5"]["tau"] is None and "serve it once" in rows["3/4/5"]["tau_source"]
    best = max((r for r in advice["rows"] if r["speedup"]), key=lambda r: r["speedup"])
    assert advice["recommended"] == best["setting"] == advice["rows"][0]["setting"]
    assert rows["3/1/4"]["speedup"] == pytest.approx((21 / 8) / 1.342)
    with_tree = t.advise(t.measured(CHAIN + TREE), t.read_costs_from(COSTS))
    assert {r["setting"]: r for r in with_tree["rows"]}["3/4/5"]["tau"] == 13 / 4


def test_the_command_end_to_end(tmp_path, capsys):
    records = tmp_path / "acceptance.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in CHAIN + TREE))
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(COSTS))
    assert main(["tune", str(records), "--costs", str(costs)]) == 0
    out = capsys.readouterr().out
    assert "recommended:" in out and "5/1/6" in out
    assert main(["tune", str(records), "--costs", str(costs), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recommended"]


@pytest.mark.parametrize(
    "costs, message",
    [
        ({"settings": []}, "non-empty list under 'settings'"),
        ({"settings": [{"steps": 3, "topk": 1, "draft_tokens": 4}]}, "'cycle_cost' must be"),
        (
            {"settings": [{"steps": 0, "topk": 1, "draft_tokens": 4, "cycle_cost": 1.3}]},
            "settings[0]: field 'steps'",
        ),
    ],
)
def test_bad_cost_files_name_the_field_and_exit_1(tmp_path, capsys, costs, message):
    records = tmp_path / "a.jsonl"
    records.write_text(json.dumps(CHAIN[0]) + "\n")
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs))
    assert main(["tune", str(records), "--costs", str(path)]) == 1
    err = capsys.readouterr().err
    assert message in err and str(path) in err and "Traceback" not in err


def test_a_broken_record_names_its_line(tmp_path, capsys):
    records = tmp_path / "a.jsonl"
    records.write_text(json.dumps(CHAIN[0]) + "\n{not json\n")
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(COSTS))
    assert main(["tune", str(records), "--costs", str(path)]) == 1
    assert f"{records}:2: not a JSON record" in capsys.readouterr().err


def bench_result(speedups, costs=None):
    """A bench_speed result's shape: main-drafter rows at batch 1 (and one at batch 4 and
    one of another drafter, which the advisor must skip)."""
    rows = []
    for label, speedup in speedups.items():
        steps, topk, draft = map(int, label.split("/"))
        row = {"batch": 1, "steps": steps, "topk": topk, "draft_tokens": draft,
               "drafter": t.BENCH_MAIN_DRAFTER, "speedup": speedup}  # fmt: skip
        if costs:
            row["cycle_cost_decode_steps"] = costs[label]
        rows += [row, {**row, "batch": 4, "speedup": 0.5}, {**row, "drafter": "other"}]
    return {"rows": rows}


def test_costs_straight_from_a_bench_speed_result():
    costs = t.read_costs_from(
        bench_result({"3/1/4": 2.0, "5/1/6": 2.2}, {"3/1/4": 1.3, "5/1/6": 1.5})
    )
    assert costs == {t.Setting(3, 1, 4): 1.3, t.Setting(5, 1, 6): 1.5}
    with pytest.raises(t.TuneInputError, match="no rows of 'speculators \\(plugin\\)' at batch 1"):
        t.read_costs_from({"rows": [{"batch": 4}]}, "b.json")


def test_the_advice_checked_against_a_measured_matrix():
    advice = t.advise(t.measured(CHAIN), t.read_costs_from(COSTS))
    predicted = {r["setting"]: r["speedup"] for r in advice["rows"] if r["speedup"]}
    assert set(predicted) == {"3/1/4", "5/1/6"}  # the trees have no tau from a chain run
    close = t.check_against(
        advice, t.bench_rows(bench_result({k: v * 1.05 for k, v in predicted.items()}), "m")
    )
    assert close["pass"] and close["rank_match"]
    assert close["max_abs_relative_error"] == pytest.approx(1 - 1 / 1.05, abs=1e-3)
    assert close["settings"] == 2
    far = t.check_against(
        advice, t.bench_rows(bench_result({k: v * 1.2 for k, v in predicted.items()}), "m")
    )
    assert far["rank_match"] and not far["pass"]  # every prediction 17 % low
    ranked = sorted(predicted, key=predicted.get)
    swapped = {ranked[0]: 3.0, ranked[1]: 1.0}  # the measured order is the other way round
    wrong = t.check_against(advice, t.bench_rows(bench_result(swapped), "m"))
    assert not wrong["rank_match"] and not wrong["pass"]
    with pytest.raises(t.TuneInputError, match="both a predicted and a measured"):
        t.check_against(advice, t.bench_rows(bench_result({"3/4/8": 1.1}), "m"))


def test_the_command_checks_itself_against_a_bench_result(tmp_path, capsys):
    records = tmp_path / "acceptance.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in CHAIN))
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(COSTS))
    advice = t.advise(t.measured(CHAIN), t.read_costs_from(COSTS))
    speedups = {r["setting"]: r["speedup"] for r in advice["rows"] if r["speedup"]}
    measured_path = tmp_path / "bench.json"
    measured_path.write_text(json.dumps(bench_result(speedups)))
    assert main(["tune", str(records), "--costs", str(costs), "--against", str(measured_path)]) == 0
    out = capsys.readouterr().out
    assert "ranking matches" in out and "largest error 0.0 %" in out and ": pass" in out


def test_a_real_bench_result_has_a_settings_list_too():
    """bench_speed writes "settings": [[3, 1, 4], ...] beside "rows" (the H200 probe of
    2026-12-02 crashed tune with an AttributeError); its dummy load format is read off."""
    data = bench_result({"3/1/4": 0.9}, {"3/1/4": 1.12})
    data |= {"settings": [[3, 1, 4]], "server_extra_args": ["--load-format", "dummy"]}
    costs = t.read_cost_file(data, "probe.json")
    assert costs.by_setting == {t.Setting(3, 1, 4): 1.12} and costs.dummy_target is True
    data["server_extra_args"] = []
    assert t.read_cost_file(data, "probe.json").dummy_target is False
    assert t.read_cost_file(COSTS, "c.json").dummy_target is None
    with pytest.raises(t.TuneInputError, match=r"settings\[0\]: expected an object"):
        t.read_cost_file({"settings": [[3, 1, 4]]}, "c.json")


RESULTS = Path(__file__).parent / "gpu" / "results"
SEED = RESULTS / "seed-shape-2026-12-02-nvidia-h200-sglang0.5.23"


def test_the_fanout_term_on_the_h200_seed_shape_run(tmp_path, capsys):
    """The committed H200 run at one TP8 rank of Kimi-K2.5 (issue #24): the dummy probe's
    costs plus the fan-out of the target's config predict the trained matrix; without the
    config the advice misses by ~20 % and says why."""
    records = tmp_path / "acceptance"
    with tarfile.open(f"{SEED}-bench-server-logs.tgz") as tar:
        tar.extractall(records, filter="data")
    files = sorted(str(p) for p in (records / "acceptance").glob("*.jsonl"))
    assert len(files) == 2
    args = ["tune", *files, "--costs", f"{SEED}-probe-dummy.json", "--against",
            f"{SEED}-bench.json", "--json"]  # fmt: skip
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert not plain["check"]["pass"] and plain["check"]["max_abs_relative_error"] > 0.15
    assert "pass --target-config" in plain["costs_note"]
    config = RESULTS / "seed-shape-2026-12-02-wide-target-config.json"
    assert main([*args, "--target-config", str(config)]) == 0
    fanned = json.loads(capsys.readouterr().out)
    assert fanned["check"]["pass"] and fanned["check"]["rank_match"], fanned["check"]
    assert fanned["recommended"] == "3/1/4"
    rows = {r["setting"]: r for r in fanned["rows"]}
    measured = json.loads(Path(f"{SEED}-bench.json").read_text())["rows"]
    chain = next(r for r in measured if (r["steps"], r["topk"]) == (3, 1))
    assert rows["3/1/4"]["cycle_cost"] == pytest.approx(chain["tau"] / chain["speedup"], rel=0.01)


def test_fanout_from_a_deepseek_config():
    cfg = json.loads((RESULTS / "seed-shape-2026-12-02-wide-target-config.json").read_text())
    fan = MoeFanout.from_config(cfg, "config.json")
    assert fan.distinct_experts(1) == pytest.approx(2.0)
    assert fan.distinct_experts(4) == pytest.approx(8 * (1 - 0.75**4))
    assert fan.extra_decode_steps(1) == pytest.approx(0.0)
    assert 0.2 < fan.extra_decode_steps(4) < fan.extra_decode_steps(5) < 0.35
    # Kimi-K2.5 (its text_config nested, as published): 384 experts top-8 on a TP8 rank; its
    # published int4 experts (compressed-tensors, attention and lm_head ignored) halve the term
    kimi = json.loads((RESULTS.parent.parent / "data" / "public_configs"
                       / "target-kimi-k2.5-text.json").read_text())  # fmt: skip
    big = MoeFanout.from_config({"text_config": kimi}, "kimi.json", tp=8)
    assert big.experts == 384 and big.distinct_experts(4) == pytest.approx(31.0, abs=0.05)
    assert big.extra_decode_steps(4) == pytest.approx(1.60, abs=0.01)
    int4 = {"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*self_attn.*"],
            "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}}  # fmt: skip
    small = MoeFanout.from_config({**kimi, "quantization_config": int4}, "kimi.json", tp=8)
    assert [round(small.extra_decode_steps(n), 2) for n in (4, 5, 8)] == [0.77, 1.01, 1.71]
    fp8 = MoeFanout.from_config({**kimi, "quantization_config": {"quant_method": "fp8"}}, "k", 8)
    assert fp8.extra_decode_steps(4) > small.extra_decode_steps(4)
    with pytest.raises(FanoutConfigError, match="quant_method 'awq' is not modelled"):
        MoeFanout.from_config({**kimi, "quantization_config": {"quant_method": "awq"}}, "k", 8)
    assert MoeFanout.from_config({"hidden_size": 8, "num_hidden_layers": 2}, "dense.json") is None
    with pytest.raises(FanoutConfigError, match="outside the DeepSeek-V3 family"):
        MoeFanout.from_config({"num_experts": 8, "num_experts_per_tok": 2}, "qwen.json")
    with pytest.raises(FanoutConfigError, match="kimi.json: field 'moe_intermediate_size'"):
        MoeFanout.from_config({**kimi, "moe_intermediate_size": "2048"}, "kimi.json")
    with pytest.raises(FanoutConfigError, match="tensor parallelism 3"):
        MoeFanout.from_config(kimi, "kimi.json", tp=3)


# ------------------------------------------------------------------ the request model


def probe_result(**row_extra):
    """A bench_speed probe of 101-token requests: no speculation 10 ms a step after a 100 ms
    first token (1,100 ms a request); 3/1/4 at one token a cycle of 1.5 steps (1,600 ms)."""
    row = {"batch": 1, "steps": 3, "topk": 1, "draft_tokens": 4, "drafter": t.BENCH_MAIN_DRAFTER,
           "nospec_tok_s": 101 / 1.1, "spec_tok_s": 101 / 1.6, "tau": 1.0,
           "cycle_cost_decode_steps": 1.6 / 1.1, **row_extra}  # fmt: skip
    return {"rows": [row], "max_new_tokens": 101}


def test_the_request_model_from_the_no_speculation_trace():
    data = probe_result() | {"profiles": {"nospec": {"steady": {"per_cycle_ms": {"total": 10.0}}}}}
    costs = t.read_cost_file(data, "probe.json")
    request = costs.request
    assert request.nospec_first_ms == pytest.approx(100.0) and request.step_ms == 10.0
    assert costs.by_setting[t.Setting(3, 1, 4)] == pytest.approx(1.5)  # not 1.6 / 1.1
    # a served run at tau 3: 100 + 100 x 10 x 1.5 / 3 = 600 ms against 1,100
    assert request.speedup("3/1/4", 3.0, 1.5) == pytest.approx(1100 / 600)
    assert request.cycle("3/1/4", 3.0, 101 / 0.6) == pytest.approx(1.5)
    # long outputs: the first token fades, the speedup goes to tau / cycle
    assert request.at(100_000).speedup("3/1/4", 3.0, 1.5) == pytest.approx(2.0, abs=1e-3)
    whole = t.read_cost_file(data, "probe.json", split_first_token=False)
    assert whole.request is None
    assert whole.by_setting[t.Setting(3, 1, 4)] == pytest.approx(1.6 / 1.1)


def test_the_request_model_from_measured_first_tokens():
    data = probe_result(nospec_tpot_ms=10.0, nospec_ttft_ms=90.0, spec_ttft_ms=120.0,
                        decode_cycle_cost=1.45)  # fmt: skip
    costs = t.read_cost_file(data, "probe.json")
    assert costs.request.source.startswith("measured")
    assert costs.request.first_ms == {"3/1/4": 120.0} and costs.request.nospec_first_ms == 90.0
    assert costs.by_setting[t.Setting(3, 1, 4)] == 1.45
    advice = t.advise({t.Setting(3, 1, 4): {"tau": 3.0, "requests": 4, "per_position": []}},
                      costs.by_setting, None, costs.request)  # fmt: skip
    row = advice["rows"][0]
    assert row["speedup"] == pytest.approx((90 + 1000) / (120 + 1000 * 1.45 / 3))
    assert row["decode_speedup"] == pytest.approx(3 / 1.45)
    assert advice["request"]["output_tokens"] == 101


def test_no_request_model_without_first_tokens_or_a_trace(capsys, tmp_path):
    costs = t.read_cost_file(probe_result(), "probe.json")
    assert costs.request is None
    assert costs.by_setting[t.Setting(3, 1, 4)] == pytest.approx(1.6 / 1.1)
    records = tmp_path / "a.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in CHAIN))
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe_result()))
    assert main(["tune", str(records), "--costs", str(path)]) == 0
    assert "the probe has no first-token time" in capsys.readouterr().out


def test_output_tokens_sets_the_request_length(capsys, tmp_path):
    records = tmp_path / "a.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in CHAIN))
    data = probe_result() | {"profiles": {"nospec": {"steady": {"per_cycle_ms": {"total": 10.0}}}}}
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(data))
    runs = {}
    for n in (101, 4000):
        argv = ["tune", str(records), "--costs", str(path), "--json", "--output-tokens", str(n)]
        assert main(argv) == 0
        runs[n] = json.loads(capsys.readouterr().out)
    short, long = (next(r for r in runs[n]["rows"] if r["setting"] == "3/1/4") for n in runs)
    assert short["speedup"] < long["speedup"] < long["decode_speedup"]
    assert runs[4000]["request"]["output_tokens"] == 4000


# ------------------------------------------ bad input: one line naming file and field, exit 1

ERROR = "sglang-ext tune: error: "


def refused(capsys, argv, code=exit_codes.INPUT_ERROR) -> str:
    """The one line `tune` prints for bad input (after its prefix), checked to be no bug report."""
    assert main(["tune", *map(str, argv)]) == code
    out = capsys.readouterr()
    assert out.out == "" and "internal error" not in out.err and "Traceback" not in out.err
    assert len(out.err.splitlines()) == 1 and out.err.startswith(ERROR), out.err
    return out.err[len(ERROR) :].rstrip("\n")


def write(path: Path, data) -> Path:
    """``data`` as JSON (NaN and Infinity as Python's json writes them), bytes or text as is."""
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.fixture
def inputs(tmp_path):
    """Good acceptance records and costs, for a case to replace one of them."""
    records = write(tmp_path / "acc.jsonl", "".join(json.dumps(r) + "\n" for r in CHAIN))
    return records, write(tmp_path / "costs.json", COSTS)


NAN, INF = float("nan"), float("inf")
COUNTS = "must be a list of counts (integers >= 0), one per draft position, found"
# CHAIN[0]: 4 verify steps, 6 accepted drafts, accepted_per_position [3, 2, 1] of [4, 4, 4]


@pytest.mark.parametrize(
    "line, message",
    [
        ("5", "expected a JSON object (one acceptance record), found 5"),
        ("null", "expected a JSON object (one acceptance record), found None"),
        ('"verify_steps"', "expected a JSON object (one acceptance record), found 'verify_steps'"),
        ("[1, 2]", "expected a JSON object (one acceptance record), found [1, 2]"),
        *(
            ({"verify_steps": v}, f"field 'verify_steps' must be a positive integer, found {v!r}")
            for v in ("abc", None, NAN, INF, -4, 0, 4.7, True)
        ),
        *(
            (
                {"accepted_draft_tokens": v},
                f"field 'accepted_draft_tokens' must be an integer >= 0, found {v!r}",
            )
            for v in ("x", None, NAN, INF, -1, False)
        ),
        (
            {"accepted_draft_tokens": 13},
            "field 'accepted_draft_tokens' is 13, more than 4 verify_steps x 3 draft positions "
            "= 12 could accept",
        ),
        *(
            ({"accepted_per_position": v}, f"field 'accepted_per_position' {COUNTS} {v!r}")
            for v in (3, None, [], ["a", 2, 1], "321", [3, 2, -1], [3.0, 2, 1])
        ),
        (
            {"accepted_per_position": [3, 2, 0]},
            "field 'accepted_per_position' sums to 5, not to accepted_draft_tokens 6 (each "
            "accepted draft counts at its position)",
        ),
        (
            {"accepted_per_position": [5, 1, 0]},
            "field 'accepted_per_position' counts 5 accepted at position 0, more than the 4 "
            "proposed there",
        ),
        (
            {"proposed_per_position": [4, 1, 4]},
            "field 'accepted_per_position' counts 2 accepted at position 1, more than the 1 "
            "proposed there",
        ),
        *(
            (
                {"proposed_per_position": v},
                f"field 'proposed_per_position' must be a list of 3 counts (integers >= 0), one "
                f"per draft position, found {v!r}",
            )
            for v in ([4, 4], [4, 4, 4, 4], "444", 4)
        ),
        *(
            ({"topk": v}, f"field 'topk' must be a positive integer, found {v!r}")
            for v in ("x", [3], 0, -2, 1.5)
        ),
        *(
            (
                {"draft_tokens_per_step": v},
                f"field 'draft_tokens_per_step' must be an integer >= 0, found {v!r}",
            )
            for v in ("x", [3], -3)
        ),
        ({"verify_steps": ...}, "record has no 'verify_steps'"),
    ],
)
def test_a_bad_acceptance_record_names_its_line_and_field(inputs, capsys, line, message):
    records, costs = inputs
    if isinstance(line, dict):
        record = {**CHAIN[0], **line}
        line = json.dumps({k: v for k, v in record.items() if v is not ...})
    write(records, f"{json.dumps(CHAIN[1])}\n\n{line}\n")
    assert refused(capsys, [records, "--costs", costs]) == f"{records}:3: {message}"


def test_records_keep_a_line_separator_inside_a_string(inputs, capsys):
    """The plugin writes records with ensure_ascii=False: U+2028 in a string is not a line end."""
    records, costs = inputs
    lines = (json.dumps({**r, "rid": "a\u2028b"}, ensure_ascii=False) for r in CHAIN)
    write(records, "".join(line + "\n" for line in lines))
    assert main(["tune", str(records), "--costs", str(costs)]) == 0
    assert "measured (2 requests)" in capsys.readouterr().out


@pytest.mark.parametrize("which", ["acceptance", "--costs", "--target-config"])
def test_a_file_that_is_not_utf8_is_named(inputs, capsys, tmp_path, which):
    records, costs = inputs
    config = write(tmp_path / "config.json", {"hidden_size": 8})
    if which == "acceptance":
        write(records, json.dumps(CHAIN[0]).encode() + b"\n\xff\xfe{}\n")
        expected = f"{records}:2: not UTF-8 text (byte 0: invalid start byte); expected the "
        expected += "plugin's acceptance JSONL"
    else:
        bad = write(costs if which == "--costs" else config, b"\xff\xfe{}")
        expected = f"{bad}: not UTF-8 text (byte 0: invalid start byte); expected a JSON file"
    argv = [records, "--costs", costs, "--target-config", config]
    assert refused(capsys, argv) == expected


CYCLE = (
    "must be a number >= 1 (decode steps per verify cycle; a cycle cannot cost less than the "
    "step it verifies), found"
)
SETTING = {"steps": 3, "topk": 1, "draft_tokens": 4}
TRACE = {"profiles": {"nospec": {"steady": {"per_cycle_ms": {"total": 10.0}}}}}
MEASURED_SPLIT = {"nospec_tpot_ms": 10.0, "nospec_ttft_ms": 90.0, "spec_ttft_ms": 120.0}


def bench_probe(*rows, **top):
    """probe_result's probe with these rows (each over probe_result's one) and top-level keys."""
    base = probe_result()
    return {**base, "rows": [{**base["rows"][0], **r} for r in rows or [{}]], **top}


@pytest.mark.parametrize(
    "costs, message",
    [
        (
            [1, 2],
            ": expected a non-empty list under 'settings' (a cost file) or a list under 'rows' "
            "(a bench_speed result), found [1, 2]",
        ),
        (
            {"measured_on": "H200"},
            ": expected a non-empty list under 'settings' (a cost file) or a list under 'rows' "
            "(a bench_speed result), found an object without 'settings'",
        ),
        ({"rows": ["x"]}, ": rows[0]: expected an object (one bench_speed measurement), found 'x'"),
        *(
            (
                {"settings": [{**SETTING, "cycle_cost": v}]},
                f": settings[0]: 'cycle_cost' {CYCLE} {v!r}",
            )
            for v in ("1.3", NAN, INF, -INF, 0, -1.5, 0.99, None, True)
        ),
        (
            {
                "settings": [
                    {**SETTING, "cycle_cost": 1.3},
                    {"topk": 4, "steps": 3, "draft_tokens": 5, "cycle_cost": 1.5},
                    {**SETTING, "cycle_cost": 9.0},
                ]
            },
            ": settings[2]: the setting 3/1/4 again (steps/topk/draft tokens of settings[0]); give "
            "each setting one cycle_cost",
        ),
        *(
            (
                {**COSTS, "target_weights": v},
                f": field 'target_weights' must be 'dummy' or 'trained' (what the probe's target "
                f"ran on) or left out, found {v!r}",
            )
            for v in ("banana", "Dummy", 5, True, ["dummy"])
        ),
        (
            bench_probe(profiles=[1]),
            ": field 'profiles' must be an object (bench_speed --profile's traces), found [1]",
        ),
        (
            bench_probe(profiles={"nospec": {"steady": "fast"}}),
            ": field 'profiles.nospec.steady' must be an object (bench_speed --profile's traces), "
            "found 'fast'",
        ),
        (
            bench_probe(profiles={"nospec": {"steady": {"per_cycle_ms": {"total": "x"}}}}),
            ": profiles.nospec.steady.per_cycle_ms: field 'total' must be a number, found 'x'",
        ),
        (
            bench_probe(max_new_tokens="101"),
            ": field 'max_new_tokens' must be a positive integer (output tokens per request), "
            "found '101'",
        ),
        (
            bench_probe({**MEASURED_SPLIT, "spec_ttft_ms": "slow"}),
            ": the 3/1/4 row at batch 1: field 'spec_ttft_ms' must be a number, found 'slow'",
        ),
        (
            bench_probe({"spec_tok_s": INF}, **TRACE),
            ": the 3/1/4 row at batch 1: field 'spec_tok_s' must be a number, found inf",
        ),
        (
            bench_probe({**MEASURED_SPLIT, "decode_cycle_cost": 0.5}),
            f": rows[0]: 'decode_cycle_cost' {CYCLE} 0.5",
        ),
        (
            bench_probe({"cycle_cost_decode_steps": NAN}),
            f": rows[0]: 'cycle_cost_decode_steps' {CYCLE} nan",
        ),
        (
            bench_probe(
                {"cycle_cost_decode_steps": None, "status": "missing: spec-3-1-4 (exited(-9))"}
            ),
            f": rows[0]: 'cycle_cost_decode_steps' {CYCLE} None (the row's status: 'missing: "
            "spec-3-1-4 (exited(-9))')",
        ),
        (
            bench_probe({"backend": "fa3"}, {"backend": "triton"}),
            ": rows[1]: a second row of 3/1/4 at batch 1, after rows[0] (backends 'fa3' and "
            "'triton'); pass one run's result, with one row per setting (not a merged matrix)",
        ),
        (
            bench_probe(server_extra_args={"load-format": "dummy"}),
            ": field 'server_extra_args' must be a string or a list of arguments, found "
            "{'load-format': 'dummy'}",
        ),
        (
            {"rows": [{"batch": 1, "drafter": t.BENCH_MAIN_DRAFTER, **SETTING, "steps": "3"}]},
            ": rows[0]: field 'steps' must be a positive integer, found '3'",
        ),
    ],
)
def test_a_bad_cost_file_names_the_file_and_field(inputs, capsys, costs, message):
    records, path = inputs
    write(path, costs)
    assert refused(capsys, [records, "--costs", path]) == f"{path}{message}"


def test_cost_files_that_say_what_the_target_ran_on_are_still_read():
    assert t.read_cost_file({**COSTS, "target_weights": "trained"}, "c").dummy_target is False
    assert t.read_cost_file({**COSTS, "target_weights": "dummy"}, "c").dummy_target is True
    assert t.read_cost_file({**COSTS, "target_weights": None}, "c").dummy_target is None
    assert t.read_cost_file(bench_probe(profiles=None, max_new_tokens=None), "p").request is None


# a DeepSeek-V3-family MoE config, small: 8 experts top-2, MLA
SMALL_MOE = {
    "hidden_size": 64, "num_hidden_layers": 4, "first_k_dense_replace": 1, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "intermediate_size": 128,
    "num_attention_heads": 4, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 8, "vocab_size": 256,
}  # fmt: skip
INT4 = {"quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 4}}}}  # fmt: skip


@pytest.mark.parametrize(
    "config, message",
    [
        ([1], "expected a JSON object (the target's config.json), found [1]"),
        ('"x"', "expected a JSON object (the target's config.json), found 'x'"),
        *(
            (
                {"text_config": v, **SMALL_MOE},
                "field 'text_config' must be an object (the nested text model's config, as "
                f"Kimi-K2.5 ships it) or null, found {v!r}",
            )
            for v in ([1], "deepseek", 0)
        ),
        *(
            ({**SMALL_MOE, k: v}, f"field {k!r} must be a positive integer, found {v!r}")
            for k, v in (
                ("n_routed_experts", 0),
                ("hidden_size", 0),
                ("num_experts_per_tok", 0),
                ("vocab_size", -1),
                ("num_attention_heads", True),
                ("kv_lora_rank", 1.5),
            )
        ),
        *(
            ({**SMALL_MOE, k: v}, f"field {k!r} must be an integer >= 0, found {v!r}")
            for k, v in (
                ("q_lora_rank", "x"),
                ("n_shared_experts", "2"),
                ("first_k_dense_replace", -1),
                ("n_shared_experts", [1]),
            )
        ),
        (
            {**SMALL_MOE, "num_experts_per_tok": 9},
            "field 'num_experts_per_tok' is 9, more than n_routed_experts 8 (a token routes to k "
            "of the N experts)",
        ),
        (
            {**SMALL_MOE, "quantization_config": [1]},
            "field 'quantization_config' must be an object with a 'quant_method', found [1]",
        ),
        *(
            (
                {**SMALL_MOE, "quantization_config": {**INT4, "config_groups": v}},
                "quantization_config.config_groups must be an object of named groups (each with "
                f"its 'weights'), found {v!r}",
            )
            for v in ([1], None, "int4")
        ),
        (
            {**SMALL_MOE, "quantization_config": {**INT4, "config_groups": {"g": 1}}},
            "quantization_config.config_groups['g'] must be an object whose 'weights' is an "
            "object, found 1",
        ),
        *(
            (
                {
                    **SMALL_MOE,
                    "quantization_config": {
                        **INT4,
                        "config_groups": {"g": {"weights": {"num_bits": v}}},
                    },
                },
                "quantization_config.config_groups: expected one weights.num_bits (a positive "
                f"integer), found {[str(v)]}",
            )
            for v in (True, 0, "4")
        ),
        *(
            (
                {**SMALL_MOE, "quantization_config": {**INT4, "ignore": v}},
                "quantization_config.ignore must be a list of module names or 're:' patterns, "
                f"found {v!r}",
            )
            for v in (5, "lm_head", ["lm_head", 5])
        ),
    ],
)
def test_a_bad_target_config_names_the_file_and_field(inputs, capsys, tmp_path, config, message):
    records, costs = inputs
    path = write(tmp_path / "config.json", config)
    argv = [records, "--costs", costs, "--target-config", path]
    assert refused(capsys, argv) == f"{path}: {message}"


def test_target_configs_with_null_fields_are_read_as_left_out():
    """text_config null is no nested model (the MoE fields are read, not taken for a dense
    target); q_lora_rank and n_shared_experts null (DeepSeek-V2-Lite) are none."""
    plain = MoeFanout.from_config(SMALL_MOE, "c")
    assert plain is not None and plain.experts == 8
    assert MoeFanout.from_config({"text_config": None, **SMALL_MOE}, "c") == plain
    nulls = {**SMALL_MOE, "q_lora_rank": None, "n_shared_experts": None}
    assert MoeFanout.from_config(nulls, "c") == plain
    assert MoeFanout.from_config({**SMALL_MOE, "quantization_config": None}, "c") == plain
    int4 = MoeFanout.from_config({**SMALL_MOE, "quantization_config": INT4}, "c")
    assert int4.expert_bytes == plain.expert_bytes / 4


@pytest.mark.parametrize(
    "against, message",
    [
        ([1], ": expected a bench_speed result with a list under 'rows', found [1]"),
        (
            {"rows": {}},
            ": expected a bench_speed result with a list under 'rows', found 'rows': {}",
        ),
        ({"rows": ["x"]}, ": rows[0]: expected an object (one bench_speed measurement), found 'x'"),
        *(
            (
                bench_result({"3/1/4": v}),
                ": the 3/1/4 row at batch 1: field 'speedup' must be a positive number (the "
                f"measured speedup over no speculation), found {v!r}",
            )
            for v in ("x", 0, -1.2, [1], NAN, INF, True)
        ),
    ],
)
def test_a_bad_measured_matrix_names_the_file_and_field(inputs, capsys, tmp_path, against, message):
    records, costs = inputs
    path = write(tmp_path / "bench.json", against)
    argv = [records, "--costs", costs, "--against", path]
    assert refused(capsys, argv) == f"{path}{message}"


def test_a_measured_matrix_without_the_advised_settings_is_named(inputs, capsys, tmp_path):
    records, costs = inputs
    advice = t.advise(t.measured(CHAIN), t.read_costs_from(COSTS))
    predicted = ", ".join(r["setting"] for r in advice["rows"] if r["speedup"] is not None)
    path = write(tmp_path / "bench.json", bench_result({"9/1/10": 1.2}))
    assert refused(capsys, [records, "--costs", costs, "--against", path]) == (
        f"{path}: no setting has both a predicted and a measured speedup (predicted: "
        f"{predicted}; measured at batch 1: 9/1/10)"
    )


@pytest.mark.parametrize(
    "flag, value", [("--output-tokens", 0), ("--output-tokens", -5), ("--tp", 0), ("--tp", -2)]
)
def test_counts_on_the_command_line_must_be_positive(inputs, capsys, flag, value):
    """Refused by the parser (cli.arg_types.positive_int), before any file is read."""
    records, costs = inputs
    assert main(["tune", str(records), "--costs", str(costs), flag, str(value)]) == exit_codes.USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1] == (
        f"sglang-ext tune: error: argument {flag}: expected a positive integer, found '{value}'"
    )
