"""Issue #24's result file is assembled from the session's own outputs (the committed H200
run of 2026-12-02): figures copied or derived, never typed in, and never over an existing file."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from sglang_ext_tools import seed_shape_result as ssr

RESULTS = Path(__file__).parent / "gpu" / "results"
SEED = RESULTS / "seed-shape-2026-12-02-nvidia-h200-sglang0.5.23"


def args(tmp_path, out):
    with tarfile.open(f"{SEED}-bench-server-logs.tgz") as tar:
        tar.extractall(tmp_path / "logs", filter="data")
    records = sorted(str(p) for p in (tmp_path / "logs" / "acceptance").glob("*.jsonl"))
    return ["--bench", f"{SEED}-bench.json", "--probe", f"{SEED}-probe-dummy.json",
            "--fixtures", str(RESULTS / "mla-fixtures-2026-12-02-nvidia-h200-seed-shape.json"),
            "--target-config", str(RESULTS / "seed-shape-2026-12-02-wide-target-config.json"),
            "--acceptance", *records, "--out", str(out)]  # fmt: skip


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
