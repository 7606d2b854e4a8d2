"""Issue #24's result file is assembled from the session's own outputs (the committed H200
run of 2026-12-02): figures copied or derived, never typed in, and never over an existing file."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from sglang_ext_tools import seed_shape_result as ssr

RESULTS = Path(__file__).parent / "gpu" / "results"
SEED = RESULTS / "seed-shape-2026-12-02-nvidia-h200-sglang0.5.23"


RUN_1203 = RESULTS / "seed-shape-2026-12-03-nvidia-h200-sglang0.5.23"


def args(tmp_path, out, run=SEED, date="2026-12-02", records="*.jsonl", overlap=False):
    with tarfile.open(f"{run}-bench-server-logs.tgz") as tar:
        tar.extractall(tmp_path / "logs", filter="data")
    acceptance = sorted(str(p) for p in (tmp_path / "logs" / "acceptance").glob(records))
    argv = ["--bench", f"{run}-bench.json", "--probe", f"{run}-probe-dummy.json",
            "--fixtures", str(RESULTS / f"mla-fixtures-{date}-nvidia-h200-seed-shape.json"),
            "--target-config", str(RESULTS / f"seed-shape-{date}-wide-target-config.json"),
            "--acceptance", *acceptance, "--out", str(out)]  # fmt: skip
    if overlap:
        argv += ["--overlap-probe", f"{run}-tree-overlap-probe.json"]
    return argv


def test_the_committed_result_is_what_the_sources_give(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert ssr.main(args(tmp_path, out)) == 0
    built = json.loads(out.read_text())
    committed = json.loads(Path(f"{SEED}.json").read_text())
    assert built == committed
    bench = json.loads(Path(f"{SEED}-bench.json").read_text())
    assert built["rows"] == bench["rows"]
    chain = built["cycle_split"]["3/1/4"]
    row = next(r for r in bench["rows"] if r["topk"] == 1)
    assert chain["trained_cycle"] == round(row["tau"] / row["speedup"], 4)
    assert built["goals"]["best_chain_eta"] == row["eta"]
    assert built["advisor"]["rank_match"] is built["advisor"]["check"]["rank_match"]
    capsys.readouterr()
    assert ssr.main(args(tmp_path, out)) == 1  # never overwritten
    assert "exists" in capsys.readouterr().err


def test_the_split_expert_run_is_what_its_sources_give(tmp_path):
    """2026-12-03, the split-expert rank shape: the main drafter's records only (the
    converted pair's are another drafter), and the tree-overlap probe's finding."""
    out = tmp_path / "result.json"
    argv = args(tmp_path, out, RUN_1203, "2026-12-03", "spec-*.jsonl", overlap=True)
    assert ssr.main(argv) == 0
    built = json.loads(out.read_text())
    assert built == json.loads(Path(f"{RUN_1203}.json").read_text())
    # the advisor the node ran (`sglang-ext tune` on the same files) said the same
    node = json.loads(Path(f"{RUN_1203}-advisor-node.json").read_text())
    assert built["advisor"]["check"] == node["check"]
    assert built["advisor"]["recommended"] == node["recommended"]
    probe = built["tree_overlap"]["overlap_probe"]
    assert probe["tree_cycle_overlap_off"] > probe["tree_cycle_overlap_on"]
    assert probe["tree_overlaps"] is True
    assert "incomplete" not in built  # the bench and the probe both ran to the end


def test_a_bench_cut_short_is_marked_incomplete(tmp_path):
    """bench_speed's per-measurement checkpoint carries `partial`; the result says so."""
    bench = json.loads(Path(f"{SEED}-bench.json").read_text())
    cut = tmp_path / "bench.json"
    cut.write_text(json.dumps({**bench, "partial": "5 of 12 measurements"}))
    argv = args(tmp_path, tmp_path / "result.json")
    argv[argv.index("--bench") + 1] = str(cut)
    assert ssr.main(argv) == 0
    built = json.loads((tmp_path / "result.json").read_text())
    assert built["incomplete"] == {"bench": {"partial": "5 of 12 measurements", "aborted": None}}


def test_a_probe_on_the_trained_target_gets_no_modelled_fanout(tmp_path):
    """A probe served on the trained target (the drafter's never-right twin, `sglang-ext
    probe-drafter`) routes drafts through the target's router: its costs are used as
    measured, with no fan-out model added, and the split says which probe it was."""
    probe = json.loads(Path(f"{RUN_1203}-probe-dummy.json").read_text())
    probe["server_extra_args"] = [
        a for a in probe["server_extra_args"] if a not in ("--load-format", "dummy")
    ]
    twin = tmp_path / "probe.json"
    twin.write_text(json.dumps(probe))
    argv = args(tmp_path, tmp_path / "result.json", RUN_1203, "2026-12-03", "spec-*.jsonl")
    argv[argv.index("--probe") + 1] = str(twin)
    assert ssr.main(argv) == 0
    built = json.loads((tmp_path / "result.json").read_text())
    assert "never-right twin" in built["advisor"]["costs_note"]
    chain = built["cycle_split"]["3/1/4"]
    assert chain["probe_cycle"] == 1.093 and "dummy_cycle" not in chain
    assert chain["fanout_predicted"] is None
    predicted = built["advisor"]["predicted"]["3/1/4"]
    assert predicted["cycle_cost"] == predicted["probe_cost"] == 1.093
