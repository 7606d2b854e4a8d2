"""served_tau_ab: two servers' served τ from one bench_speed run, paired by prompt, and the
2026-12-06 drafter-steps A/B rebuilt from its committed bench file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ext_tools import served_tau_ab as ab

RESULTS = Path(__file__).parent / "gpu" / "results"
H100 = RESULTS / "speed-2026-12-06-nvidia-h100-sglang0.5.23"
H100_AB = RESULTS / "speed-tau-ab-2026-12-06-nvidia-h100-sglang0.5.23.json"


def _m(server, rnd, steps, per=128, prompts=None):
    prompts = list(range(len(steps))) if prompts is None else prompts
    return {"server": server, "round": rnd, "batch": 1, "status": "ok", "prompts": prompts,
            "verify_steps": steps, "verify_tokens": per * len(steps)}  # fmt: skip


def _bench(a_steps, b_steps, rounds=(0, 1)):
    return {"measurements": [_m(s, r, st) for r in rounds
                             for s, st in (("a", a_steps), ("b", b_steps))]}  # fmt: skip


def test_each_requests_counts_come_from_its_verify_cycles_and_equal_completions():
    assert ab.request_counts(_m("a", 0, [32, 64], prompts=[5, 9])) == {5: (96, 32), 9: (64, 64)}


def test_the_ratio_is_of_pooled_tau_with_a_paired_interval():
    a, b = [32, 40, 30, 50, 36, 44], [40, 44, 38, 52, 40, 50]
    got = ab.compare(_bench(a, b), "a", "b")
    tau_a, tau_b = 128 * 6 / sum(a), 128 * 6 / sum(b)
    assert got["tau_a"] == pytest.approx(tau_a, abs=1e-4)
    assert got["ratio"] == pytest.approx(tau_a / tau_b, abs=1e-4)
    lo, hi = got["ci95"]
    assert 1 < lo <= got["ratio"] <= hi  # a better on every prompt
    assert got["prompts"] == 6 and got["rounds_agree"] is True


def test_a_round_that_verified_other_counts_is_flagged():
    bench = _bench([32, 40], [40, 44])
    bench["measurements"].append(_m("a", 2, [33, 40]))
    bench["measurements"].append(_m("b", 2, [40, 44]))
    assert ab.compare(bench, "a", "b")["rounds_agree"] is False


def test_counts_that_cannot_be_read_are_refused_by_name():
    with pytest.raises(ab.CountsError, match="no verify_steps"):
        ab.request_counts({**_m("a", 0, [1]), "verify_steps": None})
    with pytest.raises(ab.CountsError, match="a request failed"):
        ab.request_counts(_m("a", 0, [30, None]))
    with pytest.raises(ab.CountsError, match="not 2 equal requests"):
        ab.request_counts({**_m("a", 0, [30, 40]), "verify_tokens": 255})
    with pytest.raises(ab.CountsError, match="'c'"):
        ab.compare(_bench([30], [40]), "a", "c")


def test_an_existing_output_is_never_overwritten(tmp_path):
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps(_bench([30], [40])))
    out = tmp_path / "out.json"
    out.write_text("keep")
    assert ab.main(["--bench", str(bench), "--pair", "a:b", "--out", str(out)]) == 1
    assert out.read_text() == "keep"


def test_the_2026_12_06_steps_ab_is_what_its_bench_file_gives(tmp_path):
    """One H100 run, one target: the drafter trained 5,000 steps against the one trained
    2,500 (registered 1.04-1.15 at 7/1/8), and the fp8 head against the fp8 drafter's bf16
    head (registered within 2 %: the switch's default)."""
    out = tmp_path / "ab.json"
    argv = ["--bench", f"{H100}.json", "--pair", "spec-7-1-8:nbrfalse-plugin-7-1-8",
            "--pair", "spec-7-1-8-fp8head:spec-7-1-8-fp8long",
            "--pair", "spec-3-1-4-fp8head:spec-3-1-4", "--out", str(out)]  # fmt: skip
    assert ab.main(argv) == 0
    built = json.loads(out.read_text())
    assert built == json.loads(H100_AB.read_text())
    steps, head, head314 = built["pairs"]
    assert 1.04 <= steps["ratio"] <= 1.15 and steps["ci95"][0] > 1
    for pair in (head, head314):
        assert 0.98 <= pair["ci95"][0] and pair["ci95"][1] <= 1.02
