"""variant_result: a variant server against its plain twin from one bench_speed run, and the
eighth session's block-N-64 run rebuilt from its sources."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sglang_ext_tools import variant_result as vr

RESULTS = Path(__file__).parent / "gpu" / "results"
BN64 = RESULTS / "seed-shape-2026-12-03-bn64-nvidia-h200-sglang0.5.23"
FIFTH = RESULTS / "seed-shape-2026-12-03-moeprobe-nvidia-h200-sglang0.5.23"


def _measurement(server, rnd, latency, decode, tok_s):
    return {"server": server, "round": rnd, "batch": 1, "status": "ok", "tok_s": tok_s,
            "tpot_ms": 4.0, "ttft_ms": 100.0, "latency_s": latency, "decode_s": decode,
            "verify": 10, "verify_tokens": 30, "tau": 3.0}  # fmt: skip


def _bench(variant_decode_scale: float, rounds=(0, 1)) -> dict:
    """Two servers on 8 prompts: the variant's decode times scaled, its first tokens equal."""
    plain_decode = [1.0 + 0.1 * i for i in range(8)]
    measurements = []
    for r in rounds:
        for name, scale in (("spec-5-1-6", 1.0), ("spec-5-1-6-bn64", variant_decode_scale)):
            decode = [d * scale for d in plain_decode]
            latency = [d + 0.2 for d in decode]
            measurements.append(_measurement(name, r, latency, decode, 100.0 / scale))
    rows = [
        {"server": "spec-5-1-6", "batch": 1, "steps": 5, "topk": 1, "draft_tokens": 6,
         "tau": 3.0, "decode_cycle_cost": 1.30},
        {"server": "spec-5-1-6-bn64", "batch": 1, "steps": 5, "topk": 1, "draft_tokens": 6,
         "tau": 3.0, "decode_cycle_cost": round(1.30 * variant_decode_scale, 4),
         "vs_setting_server": "spec-5-1-6"},
    ]  # fmt: skip
    return {"date": "2026-12-03", "gpu": "NVIDIA H200", "rows": rows, "measurements": measurements}


def test_a_slower_variant_reads_below_one_with_its_interval_and_its_cycle_difference():
    (got,) = vr.compare(_bench(1.02))
    assert got["variant"] == "spec-5-1-6-bn64" and got["plain"] == "spec-5-1-6"
    assert got["decode"]["ratio"] == pytest.approx(1 / 1.02, abs=1e-4)
    lo, hi = got["decode"]["ratio_ci95"]
    assert lo <= got["decode"]["ratio"] <= hi < 1
    # whole requests: the same first tokens dilute the same decode change
    assert 1 / 1.02 < got["whole"]["ratio"] < 1
    assert got["decode_cycle"]["plain_minus_variant"] == pytest.approx(-0.026, abs=1e-4)


def test_the_point_is_the_statistic_its_interval_resamples():
    """bench_speed's vs_setting divides median tok/s; here the point is the ratio of the
    summed per-prompt times, so it lies inside its own interval."""
    bench = _bench(1.0)
    # one round where the variant's tok/s (median input) says otherwise than its times
    for m in bench["measurements"]:
        if m["server"] == "spec-5-1-6-bn64":
            m["tok_s"] = 50.0
    (got,) = vr.compare(bench)
    lo, hi = got["whole"]["ratio_ci95"]
    assert got["whole"]["ratio"] == pytest.approx(1.0) and lo <= 1.0 <= hi


def test_only_the_rounds_both_servers_finished_are_compared():
    bench = _bench(1.0)
    bench["measurements"].append(
        _measurement("spec-5-1-6-bn64", 2, [9.0] * 8, [8.8] * 8, 10.0)  # a round plain lacks
    )
    (got,) = vr.compare(bench)
    assert got["rounds"] == [0, 1] and got["decode"]["ratio"] == pytest.approx(1.0)


def test_the_gpu_while_measured_is_pooled_per_server():
    bench = _bench(1.0)
    for m in bench["measurements"]:
        slow = m["server"] == "spec-5-1-6-bn64" and m["round"] == 1
        m["gpu_watch"] = {"samples": 9, "sm_mhz_median": 1500 if slow else 1980,
                          "sm_mhz_min": 1400 if slow else 1950,
                          "clock_event_reasons": ["sw_power_cap"] if slow else []}  # fmt: skip
    (got,) = vr.compare(bench)
    assert got["gpu_while_measured"]["plain"] == {
        "measurements": 2, "sm_mhz_median": 1980, "sm_mhz_min": 1950, "clock_event_reasons": []
    }  # fmt: skip
    variant = got["gpu_while_measured"]["variant"]
    assert variant["sm_mhz_min"] == 1400 and variant["clock_event_reasons"] == ["sw_power_cap"]
    # a run from before gpu_watch: nothing to pool
    assert vr.compare(_bench(1.0))[0]["gpu_while_measured"]["plain"] is None


def test_a_prediction_is_held_against_the_cycle_difference():
    result = vr.build(_bench(0.9), None, [], [vr.parse_prediction("bn64@5,1,6=0.10:0.24")], {})
    (check,) = result["predictions"]
    assert check["variant"] == "spec-5-1-6-bn64"
    assert check["measured"] == pytest.approx(0.13) and check["met"] is True
    result = vr.build(_bench(1.0), None, [], [vr.parse_prediction("bn64@5,1,6=0.10:0.24")], {})
    assert result["predictions"][0]["met"] is False


def test_a_malformed_prediction_is_refused_by_its_expected_form():
    with pytest.raises(argparse.ArgumentTypeError, match=r"LABEL@STEPS,TOPK,DRAFT\[/BASE\]"):
        vr.parse_prediction("bn64=0.1")


def _three(head_scale: float) -> dict:
    """A plain server and two variants of it: ``long`` 0.9 of its decode times, ``head``
    ``head_scale`` of those."""
    bench = _bench(0.9)
    for m in bench["measurements"]:
        m["server"] = m["server"].replace("bn64", "long")
    head = [
        {**m, "server": "spec-5-1-6-head",
         "decode_s": [d * head_scale for d in m["decode_s"]],
         "latency_s": [d * head_scale + 0.2 for d in m["decode_s"]]}
        for m in bench["measurements"] if m["server"] == "spec-5-1-6-long"
    ]  # fmt: skip
    bench["measurements"] += head
    long_row = bench["rows"][1]
    long_row["server"] = "spec-5-1-6-long"
    bench["rows"].append(
        {**long_row, "server": "spec-5-1-6-head",
         "decode_cycle_cost": round(long_row["decode_cycle_cost"] * head_scale, 4)}
    )  # fmt: skip
    return bench


def test_a_variant_is_read_against_another_variant_of_its_setting():
    """fp8head@7,1,8/fp8long: the head's cut against the fp8 drafter whose head stays bf16,
    not against the bf16 twin (which would count the layers' fp8 too)."""
    server, base, low, high = vr.parse_prediction("head@5,1,6/long=0.04:0.06")
    assert (server, base) == ("spec-5-1-6-head", "spec-5-1-6-long")
    result = vr.build(_three(0.96), None, [], [(server, base, low, high)], {})
    pairs = {(v["variant"], v["plain"]) for v in result["variants"]}
    assert pairs == {("spec-5-1-6-long", "spec-5-1-6"), ("spec-5-1-6-head", "spec-5-1-6"),
                     ("spec-5-1-6-head", "spec-5-1-6-long")}  # fmt: skip
    (check,) = result["predictions"]
    assert check["plain"] == "spec-5-1-6-long"
    # 1.17 x 0.04: against the twin it would read 1.30 - 1.1232 = 0.177
    assert check["measured"] == pytest.approx(0.0468, abs=1e-4) and check["met"] is True
    head = next(v for v in result["variants"] if v["plain"] == "spec-5-1-6-long")
    assert head["decode"]["ratio"] == pytest.approx(1 / 0.96, abs=1e-4)


def test_a_prediction_against_a_server_the_run_lacks_is_refused_by_name(tmp_path, capsys):
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps(_three(0.96)))
    out = tmp_path / "out.json"
    argv = ["--bench", str(bench), "--predict", "head@5,1,6/fp8long=0.04:0.06",
            "--out", str(out)]  # fmt: skip
    assert vr.main(argv) == 1
    assert "'spec-5-1-6-fp8long'" in capsys.readouterr().err and not out.exists()


def test_an_existing_output_is_never_overwritten(tmp_path):
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps(_bench(1.0)))
    out = tmp_path / "out.json"
    out.write_text("keep")
    assert vr.main(["--bench", str(bench), "--out", str(out)]) == 1
    assert out.read_text() == "keep"


def test_the_bn64_run_is_what_its_sources_give_and_block_n_64_did_not_pay(tmp_path):
    """2026-12-03, eighth session: block N 64 at 4-6 tokens beside the tuner's block N 32 at
    5/1/6, one group, three rounds. Registered: the variant's decode cycle 0.10-0.24 under
    the plain server's. Measured: 1.5 % slower after the first token, by an interval that
    excludes 1; the plain server's cycle 0.14 under the fifth run's on the same tuner pick."""
    out = tmp_path / "variants.json"
    argv = ["--bench", f"{BN64}-bench.json", "--tune-moe", f"{BN64}-tune-moe.json",
            "--earlier", f"{FIFTH}-bench.json,{FIFTH}-tune-moe.json",
            "--predict", "bn64@5,1,6=0.10:0.24", "--out", str(out)]  # fmt: skip
    assert vr.main(argv) == 0
    built = json.loads(out.read_text())
    assert built == json.loads(Path(f"{BN64}-variants.json").read_text())
    (variant,) = built["variants"]
    assert variant["tau"]["variant"] == variant["tau"]["plain"]
    assert variant["decode"]["ratio_ci95"][1] < 1
    assert built["predictions"][0]["met"] is False
    this, fifth = built["across_runs"]
    assert this["tuner_pick"]["6"] == fifth["tuner_pick"]["6"]  # the same config served
    assert fifth["decode_cycle"]["spec-5-1-6"] - this["decode_cycle"]["spec-5-1-6"] > 0.1
    # 3/1/4 held still between the two runs
    assert abs(fifth["decode_cycle"]["spec-3-1-4"] - this["decode_cycle"]["spec-3-1-4"]) < 0.02


def test_the_fp8_head_run_is_what_its_sources_give(tmp_path):
    """2026-12-06, one H100, trained 8B-shaped drafter: the fp8 head against the fp8 drafter
    whose head stays bf16, registered 0.04-0.06 decode steps a 7/1/8 cycle; at 3/1/4 (layer
    and head in fp8) against bf16, registered 0.02-0.06. Both held."""
    h100 = RESULTS / "speed-2026-12-06-nvidia-h100-sglang0.5.23.json"
    out = tmp_path / "variants.json"
    argv = ["--bench", str(h100), "--predict", "fp8head@7,1,8/fp8long=0.04:0.06",
            "--predict", "fp8head@3,1,4=0.02:0.06", "--out", str(out)]  # fmt: skip
    assert vr.main(argv) == 0
    built = json.loads(out.read_text())
    committed = RESULTS / "speed-variants-2026-12-06-nvidia-h100-sglang0.5.23.json"
    assert built == json.loads(committed.read_text())
    assert [p["met"] for p in built["predictions"]] == [True, True]
