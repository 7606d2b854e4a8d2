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


def _run(steps, build=1, max_new=128):
    return {**_bench(steps, steps), "max_new_tokens": max_new,
            "fixtures": {"stages": {"base": {"created_unix": build}}}}  # fmt: skip


def test_b_read_from_an_earlier_run_of_the_same_target_build():
    now, earlier = _run([32, 40, 30]), _run([40, 44, 38])
    got = ab.compare(now, "a", "a", earlier)
    assert got["tau_a"] == pytest.approx(128 * 3 / 102, abs=1e-4)
    assert got["tau_b"] == pytest.approx(128 * 3 / 122, abs=1e-4)
    ab.check_same_target(now, earlier)


@pytest.mark.parametrize(
    "other, field",
    [(_run([40], build=2), "target build"), (_run([40], max_new=64), "max_new_tokens"),
     ({"measurements": []}, "target build")],
)  # fmt: skip
def test_runs_of_other_targets_or_lengths_are_refused_by_field(tmp_path, other, field, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_run([40])))
    b.write_text(json.dumps(other))
    assert ab.main(["--bench", str(a), "--bench-b", str(b), "--pair", "a:a"]) == 1
    err = capsys.readouterr().err
    assert field in err and "expected the same" in err


RESUME = RESULTS / "speed-2026-12-06-resume-nvidia-h100-sglang0.5.23"


def test_the_2026_12_06_resume_run_is_what_its_bench_files_give(tmp_path):
    """The 12,500-step drafter against the 2,500-step one in its own run (registered
    1.06-1.14 at 3/1/4: missed, 1.051) and against its 5,000-step self of the run before, on
    the same target build and prompts."""
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    argv = ["--bench", f"{RESUME}.json", "--pair", "spec-3-1-4:nbrfalse-plugin-3-1-4",
            "--pair", "spec-3-1-4-fp8:spec-3-1-4",
            "--pair", "spec-7-1-8-fp8:spec-7-1-8"]  # fmt: skip
    assert ab.main([*argv, "--out", str(one)]) == 0
    assert json.loads(one.read_text()) == json.loads(
        (RESULTS / "speed-tau-ab-2026-12-06-resume-nvidia-h100-sglang0.5.23.json").read_text()
    )
    steps = json.loads(one.read_text())["pairs"][0]
    assert steps["ci95"][0] > 1 and steps["ci95"][1] < 1.14
    argv = ["--bench", f"{RESUME}.json", "--bench-b", f"{H100}.json",
            "--pair", "spec-3-1-4:spec-3-1-4", "--pair", "spec-7-1-8:spec-7-1-8",
            "--pair", "nbrfalse-plugin-3-1-4:spec-3-1-4", "--out", str(two)]  # fmt: skip
    assert ab.main(argv) == 0
    built = json.loads(two.read_text())
    across = RESULTS / "speed-tau-ab-2026-12-06-resume-vs-5000-nvidia-h100-sglang0.5.23.json"
    assert built == json.loads(across.read_text())
    assert built["bench_b"] == f"{H100.name}.json"
    on314 = built["pairs"][0]
    assert 1 < on314["ci95"][0] and on314["ratio"] < 1.05  # 7,500 more steps: ~2 %
