"""trained_join_verdict: the trained rank-shape run with ``join`` read against the table
registered for the card it ran on (bench rows, cycle_fit's lines, the servers' logs)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from sglang_ext_tools import trained_join_verdict as tj
from tests.test_join_verdict import log

RESULTS = Path(__file__).resolve().parent / "gpu" / "results"


def run(gpu, rows, goals=None, names=None):
    """A bench file as the pipeline writes it, reduced to what the verdict reads."""
    servers = [{"name": n, "status": "ready", "ready_after_s": 80.0}
               for n in (names or ["nospec", *(r["server"] for r in rows)])]  # fmt: skip
    return {"gpu": gpu, "gpu_info": {"uuid": "GPU-x"}, "servers": servers, "goals": goals or {},
            "rows": [{"batch": 1, **r} for r in rows]}  # fmt: skip


def over(ci, by):
    """An interval divided by a figure taken as known, as the verdict rounds it."""
    return [pytest.approx(c / by, abs=1e-4) for c in ci]


def row(server, **figures):
    return {"server": server, **figures}


H100_CHECKS = ("issue_24_eta_met", "tau_within_2pct_of_plain", "logs_name_every_moe_layer",
               "join_forks_captured")  # fmt: skip
FIT = {"bench": "b.json", "servers": {"spec-5-1-6-join": {
    "ms_per_cycle": 11.8, "ms_per_cycle_ci95": [11.5, 12.1]}}}  # fmt: skip
H100_ROWS = [
    row("spec-5-1-6", tau=2.90, speedup=1.93, speedup_ci95=[1.6, 2.4], eta=0.666),
    row("spec-5-1-6-join", tau=2.88, speedup=1.93, speedup_ci95=[1.7, 2.1], eta=0.670,
        vs_setting=1.07, vs_setting_ci95=[1.04, 1.10], speedup_same_switch=1.78,
        speedup_same_switch_ci95=[1.6, 1.9], eta_same_switch=0.618),
    row("nospec-join", speedup=1.14, decode_speedup=1.16, decode_speedup_ci95=[1.12, 1.20],
        spec_tpot_ms=7.2),
]  # fmt: skip


def test_the_h100_run_reads_its_own_table(tmp_path):
    for server in ("spec-5-1-6-join", "nospec-join"):
        log(tmp_path, server, 60, 180)
    v = tj.verdict(run("NVIDIA H100 80GB HBM3", H100_ROWS), FIT, tmp_path, tj.ROLES, "b.json")
    assert v["card"] == "H100" and v["not_run"] == ["tree_join"]
    r = v["readings"]
    assert list(r) == list(tj.REGISTERED["H100"])
    assert [x["reading"] for x in r.values()] == ["within"] * 5 + ["recorded"]
    assert r["join_cycle_in_join_nospec_steps"]["value"] == pytest.approx(11.8 / 7.2, abs=1e-4)
    assert r["join_cycle_in_join_nospec_steps"]["ci95"] == over([11.5, 12.1], 7.2)
    assert r["join_eta_over_stock"]["ci95"] == over([1.7, 2.1], 2.88)
    assert v["checks"] == dict(zip(H100_CHECKS, (False, True, True, True), strict=True))


def test_a_join_that_lost_its_forks_or_its_text_reads_so(tmp_path):
    log(tmp_path, "spec-5-1-6-join", 60)
    log(tmp_path, "nospec-join", 60, 180)
    rows = [dict(r) for r in H100_ROWS]
    rows[1] |= {"tau": 2.70, "eta": 0.84, "speedup_ci95": [2.2, 2.4], "speedup": 2.27}
    v = tj.verdict(run("NVIDIA H100 80GB HBM3", rows), FIT, tmp_path, tj.ROLES, "b.json")
    assert v["checks"] == dict(zip(H100_CHECKS, (True, False, True, False), strict=True))
    assert v["readings"]["join_eta_over_stock"]["reading"] == "above"


def test_the_h200_run_reads_the_tree_and_the_pair(tmp_path):
    rows = [*H100_ROWS, row("spec-3-4-5-join", tau=2.70, eta_same_switch=0.58)]
    pair = {"plugin_vs_stock": 1.004, "plugin_vs_stock_ci95": [0.99, 1.02]}
    fit = {"servers": {"spec-5-1-6-join": {"ms_per_cycle": 10.4,
                                           "ms_per_cycle_ci95": [10.1, 10.7]}}}  # fmt: skip
    v = tj.verdict(run("NVIDIA H200", rows, pair), fit, tmp_path, tj.ROLES, "b.json")
    r = v["readings"]
    assert list(r) == list(tj.REGISTERED["H200"])
    assert [x["reading"] for x in r.values()] == ["within"] * 5 + ["recorded"]
    assert r["join_cycle_in_join_nospec_steps"]["value"] == pytest.approx(10.4 / 7.2, abs=1e-4)
    assert r["join_eta_same_switch"]["ci95"] == over([1.6, 1.9], 2.88)
    assert v["checks"] == {"issue_24_eta_met": False, "tree_eta_below_chain": True}
    assert "not_run" not in v and "logs" not in v  # no logs unpacked: no log checks


def test_a_card_without_a_registration_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(ValueError, match="'NVIDIA A100'"):
        tj.verdict(run("NVIDIA A100", H100_ROWS), FIT, tmp_path, tj.ROLES, "b.json")
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps(run("NVIDIA A100", H100_ROWS)))
    fit = tmp_path / "f.json"
    fit.write_text(json.dumps(FIT))
    argv = ["--bench", str(bench), "--cycle-fit", str(fit), "--logs", str(tmp_path)]
    assert tj.main(argv) == 2
    assert "no registration" in capsys.readouterr().err


DRAWS = RESULTS / "seed-shape-2026-12-06-draws-nvidia-h100-sglang0.5.23"


def test_a_committed_h100_run_reads_through_the_command_line(tmp_path, capsys):
    """The tenth run's files, its twin server b standing in for ``join`` (--role): the reading
    works on the pipeline's own formats. b ran SGLang's stream, so its log names no fork."""
    with tarfile.open(f"{DRAWS}-bench-server-logs.tgz") as tgz:
        tgz.extractall(tmp_path, filter="data")
    argv = ["--bench", f"{DRAWS}-bench.json", "--cycle-fit", f"{DRAWS}-cycle-fit.json",
            "--logs", str(tmp_path), "--role", "join=spec-5-1-6-b"]  # fmt: skip
    assert tj.main(argv) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["readings"]["join_cycle_ms"]["value"] == 12.857
    assert v["readings"]["join_cycle_ms"]["reading"] == "above"
    assert v["checks"] == dict(zip(H100_CHECKS, (False, True, False, False), strict=True))


def test_a_join_server_that_served_without_a_log_is_not_read_as_held(tmp_path):
    """With the logs unpacked, a ``join`` server that ran but left no log fails the log
    checks (as ``stream_priority_verdict``'s), and a missing folder is named as ``--logs``."""
    log(tmp_path, "spec-5-1-6-join", 60, 180)  # nospec-join served too, but has no log
    v = tj.verdict(run("NVIDIA H100 80GB HBM3", H100_ROWS), FIT, tmp_path, tj.ROLES, "b.json")
    assert v["logs"]["join_nospec"] is None
    assert v["checks"]["logs_name_every_moe_layer"] is False
    assert v["checks"]["join_forks_captured"] is False
    with pytest.raises(FileNotFoundError, match="--logs .*nothere: no such folder"):
        tj.verdict(run("NVIDIA H100 80GB HBM3", H100_ROWS), FIT, tmp_path / "nothere",
                   tj.ROLES, "b.json")  # fmt: skip


TRAINED = RESULTS / "seed-shape-2026-12-07-trained-join-nvidia-h100-sglang0.5.23"


def test_the_committed_trained_join_run_reproduces_its_verdict(tmp_path, capsys):
    """The twenty-seventh session's H100 run, from its committed files through the command
    line: every registered figure within its range, #24's η not met."""
    with tarfile.open(f"{TRAINED}-bench-server-logs.tgz") as tgz:
        tgz.extractall(tmp_path, filter="data")
    argv = ["--bench", f"{TRAINED}-bench.json", "--cycle-fit", f"{TRAINED}-cycle-fit.json",
            "--logs", str(tmp_path)]  # fmt: skip
    assert tj.main(argv) == 0
    v = json.loads(capsys.readouterr().out)
    assert v == json.loads(Path(f"{TRAINED}-verdict.json").read_text())
    bounded = [r["reading"] for r in v["readings"].values() if r["registered"]]
    assert bounded == ["within"] * 5
    assert v["checks"] == dict(zip(H100_CHECKS, (False, True, True, True), strict=True))


def test_a_cycle_fit_of_another_bench_is_refused(tmp_path, capsys):
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps(run("NVIDIA H100 80GB HBM3", H100_ROWS)))
    fit = tmp_path / "f.json"
    fit.write_text(json.dumps({**FIT, "bench": "other.json"}))
    argv = ["--bench", str(bench), "--cycle-fit", str(fit), "--logs", str(tmp_path)]
    assert tj.main(argv) == 2
    assert "a fit of other.json, not of --bench b.json" in capsys.readouterr().err
