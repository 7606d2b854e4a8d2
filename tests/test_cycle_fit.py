"""cycle_fit: decode time split into a cost per verify cycle and one per request, two servers
compared by a bootstrap over prompts, verify counts aligned from acceptance records; and the
2026-12-06 seed-shape run read through it (variant_result --acceptance)."""

from __future__ import annotations

import io
import json
import random
import tarfile
from pathlib import Path

import pytest

from sglang_ext_tools import cycle_fit, variant_result

RESULTS = Path(__file__).parent / "gpu" / "results"
RUN = RESULTS / "seed-shape-2026-12-06-nvidia-h200-sglang0.5.23"


def _requests(per_cycle_s, per_request_s, cycles, noise_s=0.0, seed=0):
    rng = random.Random(seed)
    return [per_request_s + per_cycle_s * c + rng.gauss(0, noise_s) for c in cycles]


def _measurement(server, rnd, cycles, decode):
    return {"server": server, "round": rnd, "batch": 1, "status": "ok",
            "decode_s": decode, "verify_steps": cycles, "verify": sum(cycles),
            "tokens": 128 * len(cycles)}  # fmt: skip


def test_an_exact_line_is_recovered():
    cycles = [40, 45, 52, 60, 38]
    points = list(zip(cycles, _requests(0.0107, 0.004, cycles), strict=True))
    slope, intercept = cycle_fit.fit(points)
    assert slope == pytest.approx(0.0107)
    assert intercept == pytest.approx(0.004)


def test_one_cycle_count_fits_no_line():
    assert cycle_fit.fit([(40, 0.5), (40, 0.52)]) is None
    assert cycle_fit.fit([(40, 0.5)]) is None


def _pair(variant_cycle_s, variant_request_s, noise_s=0.002, prompts=16, rounds=3):
    rng = random.Random(1)
    counts = [rng.randint(35, 60) for _ in range(prompts)]
    ms = []
    for r in range(rounds):
        ms.append(
            _measurement("plain", r, counts, _requests(0.0107, 0.0, counts, noise_s, seed=10 + r))
        )
        ms.append(_measurement("variant", r, counts,
                               _requests(variant_cycle_s, variant_request_s, counts, noise_s,
                                         seed=20 + r)))  # fmt: skip
    return ms


def _compared(variant_cycle_s, variant_request_s):
    ms = _pair(variant_cycle_s, variant_request_s)
    return cycle_fit.compare(*(cycle_fit.server_points(ms, s) for s in ("plain", "variant")))


def _contains(interval, value):
    return interval[0] <= value <= interval[1]


def test_a_dearer_cycle_is_told_from_a_dearer_request():
    cycle = _compared(0.0120, 0.0)  # 1.3 ms more a cycle, nothing more a request
    assert _contains(cycle["variant_minus_plain_ms_per_cycle_ci95"], 1.3)
    assert cycle["variant_minus_plain_ms_per_cycle_ci95"][0] > 1.0
    assert _contains(cycle["variant_minus_plain_ms_per_request_ci95"], 0)

    request = _compared(0.0107, 0.040)  # 40 ms more a request, nothing more a cycle
    assert _contains(request["variant_minus_plain_ms_per_request_ci95"], 40)
    assert request["variant_minus_plain_ms_per_request_ci95"][0] > 20
    assert _contains(request["variant_minus_plain_ms_per_cycle_ci95"], 0)


def test_twins_read_no_difference_inside_their_interval():
    same = _compared(0.0107, 0.0)
    assert _contains(same["variant_minus_plain_ms_per_cycle_ci95"], 0)


def test_only_the_given_rounds_and_batch_one_count():
    ms = _pair(0.0107, 0.0)
    ms.append({**_measurement("plain", 0, [40], [9.0]), "batch": 4})
    points = cycle_fit.server_points(ms, "plain", rounds=[0, 1])
    assert all(len(v) == 2 for v in points.values())


def _records(counts):
    return [{"verify_steps": c, "completion_tokens": 128} for c in counts]


def test_records_are_aligned_to_the_timed_rounds_after_the_warmup():
    counts = [[40, 50, 45], [41, 49, 46]]
    ms = [{**_measurement("s", r, c, [0.5] * 3), "verify_steps": None}
          for r, c in enumerate(counts)]  # fmt: skip
    warmup = [{"verify_steps": 3, "completion_tokens": 8}] * 2
    got = cycle_fit.attach_verify(ms, "s", warmup + _records(counts[0] + counts[1]))
    assert [m["verify_steps"] for m in got] == counts


def test_records_that_do_not_add_up_are_refused_naming_the_round():
    ms = [{**_measurement("s", 0, [40, 50], [0.5, 0.5]), "verify_steps": None}]
    with pytest.raises(cycle_fit.AlignmentError, match=r"s round 0: records give 91 .* 90"):
        cycle_fit.attach_verify(ms, "s", _records([41, 50]))
    with pytest.raises(cycle_fit.AlignmentError, match="1 acceptance records, 2 timed"):
        cycle_fit.attach_verify(ms, "s", _records([40]))
    larger = [*ms, {**ms[0], "batch": 4, "round": 1}]
    with pytest.raises(cycle_fit.AlignmentError, match="batch > 1"):
        cycle_fit.attach_verify(larger, "s", _records([40, 50, 40, 50]))


def test_records_are_read_from_a_folder_or_a_tarball(tmp_path):
    (tmp_path / "acceptance").mkdir()
    text = "\n".join(json.dumps(r) for r in _records([40, 41])) + "\n"
    (tmp_path / "acceptance" / "spec-3-1-4.jsonl").write_text(text)
    assert len(cycle_fit.read_records(tmp_path, "spec-3-1-4")) == 2
    tgz = tmp_path / "logs.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        info = tarfile.TarInfo("./acceptance/spec-3-1-4.jsonl")
        info.size = len(text.encode())
        tar.addfile(info, io.BytesIO(text.encode()))
    assert cycle_fit.read_records(tgz, "spec-3-1-4") == _records([40, 41])
    with pytest.raises(FileNotFoundError, match="no acceptance/spec-5-1-6.jsonl"):
        cycle_fit.read_records(tgz, "spec-5-1-6")


def test_the_prefill_graph_costs_the_seed_shape_a_cycle_not_a_request(tmp_path):
    """2026-12-06, one H200: 5/1/6 with SGLang's breakable prefill graph against its plain
    twin, 16 prompts x 3 rounds. Per cycle 1.33 ms dearer (10.66 -> 11.99 ms, 0.16 decode
    steps), per request no different; the instance twins differ by under 0.01 decode steps."""
    out = tmp_path / "v.json"
    argv = ["--bench", f"{RUN}-bench.json", "--acceptance", f"{RUN}-bench-server-logs.tgz",
            "--out", str(out)]  # fmt: skip
    assert variant_result.main(argv) == 0
    built = {v["variant"]: v["per_cycle"] for v in json.loads(out.read_text())["variants"]}
    pg = built["spec-5-1-6-pg"]
    lo, hi = pg["variant_minus_plain_ms_per_cycle_ci95"]
    assert 1.0 < lo and hi < 1.6
    lo, hi = pg["variant_minus_plain_ms_per_request_ci95"]
    assert lo <= 0 <= hi
    for twin in ("spec-3-1-4-b", "spec-5-1-6-b"):
        lo, hi = built[twin]["variant_minus_plain_decode_steps_ci95"]
        assert -0.01 < lo and hi < 0.01
    assert built == {
        v["variant"]: v["per_cycle"]
        for v in json.loads(Path(f"{RUN}-variants.json").read_text())["variants"]
    }


def test_variant_result_refuses_records_it_cannot_align(tmp_path, capsys):
    """--acceptance naming a folder without the servers' records: exit 1, the folder and the
    missing file named, nothing written."""
    out = tmp_path / "v.json"
    argv = ["--bench", f"{RUN}-bench.json", "--acceptance", str(tmp_path), "--out", str(out)]
    assert variant_result.main(argv) == 1
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "spec-3-1-4.jsonl" in err
    assert not out.exists()


def test_every_server_of_a_run_gets_its_line_and_a_stock_server_its_reason(tmp_path, capsys):
    """cycle_fit's own command on two committed runs: 2026-12-06 (every server's records in
    its tarball) and 2026-12-03's fifth, whose stock servers wrote none. 3/1/4's cycle held
    within 0.1 ms across the two sessions while 5/1/6's moved by more than 1 ms."""
    fifth = RESULTS / "seed-shape-2026-12-03-moeprobe-nvidia-h200-sglang0.5.23"
    lines = {}
    for run in (RUN, fifth):
        out = tmp_path / f"{run.name}.json"
        argv = ["--bench", f"{run}-bench.json", "--acceptance", f"{run}-bench-server-logs.tgz",
                "--out", str(out)]  # fmt: skip
        assert cycle_fit.main(argv) == 0
        lines[run] = json.loads(out.read_text())["servers"]
    assert (
        "acceptance/nbrfalse-stock-3-1-4.jsonl" in lines[fifth]["nbrfalse-stock-3-1-4"]["skipped"]
    )
    now, then = lines[RUN], lines[fifth]
    assert abs(now["spec-3-1-4"]["ms_per_cycle"] - then["spec-3-1-4"]["ms_per_cycle"]) < 0.1
    assert then["spec-5-1-6"]["ms_per_cycle"] - now["spec-5-1-6"]["ms_per_cycle"] > 1.0
    for line in now.values():
        lo, hi = line["ms_per_cycle_ci95"]
        assert lo <= line["ms_per_cycle"] <= hi
    assert now["spec-5-1-6"]["decode_steps_per_cycle"] == pytest.approx(
        now["spec-5-1-6"]["ms_per_cycle"] / now["spec-5-1-6"]["decode_step_ms"], abs=1e-4
    )
    capsys.readouterr()
    assert cycle_fit.main(argv) == 1  # the output exists: never overwritten
    assert "never overwritten" in capsys.readouterr().err


TENTH = RESULTS / "seed-shape-2026-12-06-draws-nvidia-h100-sglang0.5.23"


def test_the_tenth_runs_three_draws_split_one_cheap_two_dear(tmp_path):
    """2026-12-06's tenth run (an H100): the committed cycle lines are what cycle_fit writes
    from the run's bench and records; 5/1/6 drew the cheap cycle once and the dear one twice,
    and the intervals separate the modes while the twins agree."""
    out = tmp_path / "fit.json"
    argv = ["--bench", f"{TENTH}-bench.json", "--acceptance", f"{TENTH}-bench-server-logs.tgz",
            "--out", str(out)]  # fmt: skip
    assert cycle_fit.main(argv) == 0
    lines = json.loads(out.read_text())["servers"]
    committed = json.loads(Path(f"{TENTH}-cycle-fit.json").read_text())["servers"]
    assert lines == committed
    cheap, b, c = (lines[s] for s in ("spec-5-1-6", "spec-5-1-6-b", "spec-5-1-6-c"))
    assert cheap["ms_per_cycle_ci95"][1] < min(b["ms_per_cycle_ci95"][0], c["ms_per_cycle_ci95"][0])
    assert abs(b["ms_per_cycle"] - c["ms_per_cycle"]) < 0.01
    assert b["ms_per_cycle"] - cheap["ms_per_cycle"] == pytest.approx(1.015, abs=0.01)


def test_the_tenth_runs_dear_mode_is_the_moe_up_projection_alone():
    """The run's traces (bench JSON `profiles`): by launch grid, the up-projection (544 blocks
    at 6 tokens) is 13.6 us a call dearer on both dear servers; the down-projection (7,616
    blocks) and the costliest other kernels stay within 1 %."""
    profiles = json.loads(Path(f"{TENTH}-bench.json").read_text())["profiles"]

    def grid_us(server, grid):
        rows = profiles[server]["kernel_grids"]["target_graph"]["fused_moe_kernel"]
        (row,) = [r for r in rows if r["grid"][0] == grid]
        return row["us_per_cycle"] / row["calls_per_cycle"]

    def kernel_us(server, prefix):
        rows = profiles[server]["top_kernels"]["target_graph"]
        return next(r["us_per_cycle"] for r in rows if r["kernel"].startswith(prefix))

    for dear in ("spec-5-1-6-b", "spec-5-1-6-c"):
        assert grid_us(dear, 544) - grid_us("spec-5-1-6", 544) == pytest.approx(13.6, abs=0.2)
        assert grid_us(dear, 7616) / grid_us("spec-5-1-6", 7616) == pytest.approx(1.0, abs=0.01)
        for other in ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "void cutlass::device_kernel",
                      "void sglang::fused_a_gemm_kernel"):  # fmt: skip
            assert kernel_us(dear, other) / kernel_us("spec-5-1-6", other) == pytest.approx(
                1.0, abs=0.01
            )


TRAINED_JOIN = "seed-shape-2026-12-07-trained-join{}-nvidia-h100-sglang0.5.23"


@pytest.mark.parametrize("run", ["", "-314", "-345"])
def test_the_trained_join_runs_cycle_lines_are_what_cycle_fit_writes(run, tmp_path):
    """2026-12-07's trained `join` run and the two after it on the same node (an H100): the
    committed cycle lines come from the runs' benches and records; `join` is the cheaper
    cycle at 5/1/6 and at the seed's tree, each beside its plain twin where one ran."""
    stem = RESULTS / TRAINED_JOIN.format(run)
    out = tmp_path / "fit.json"
    argv = ["--bench", f"{stem}-bench.json", "--acceptance", f"{stem}-bench-server-logs.tgz",
            "--out", str(out)]  # fmt: skip
    assert cycle_fit.main(argv) == 0
    lines = json.loads(out.read_text())["servers"]
    assert lines == json.loads(Path(f"{stem}-cycle-fit.json").read_text())["servers"]
    for plain in [s for s in lines if s.startswith("spec-") and not s.endswith("-join")]:
        join = lines[f"{plain}-join"]
        assert join["ms_per_cycle_ci95"][1] < lines[plain]["ms_per_cycle_ci95"][0]
