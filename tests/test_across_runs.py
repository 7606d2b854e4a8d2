"""across_runs: a server of one bench run over a server of another, each over its own run's
baseline, prompts paired; and the runs it refuses to compare."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sglang_ext_tools import across_runs as ar

RESULTS = Path(__file__).resolve().parent / "gpu" / "results"
STEM = "seed-shape-2026-12-07-trained-join"
TREE = RESULTS / f"{STEM}-345-nvidia-h100-sglang0.5.23-bench.json"
CHAIN = RESULTS / f"{STEM}-314-nvidia-h100-sglang0.5.23-bench.json"
ACROSS = RESULTS / f"{STEM}-across-nvidia-h100-sglang0.5.23.json"


def test_the_committed_reading_is_reproduced_from_its_runs(monkeypatch, capsys):
    """The committed file's figures come from the committed runs, through the command it
    names (run from the repository's root)."""
    committed = json.loads(ACROSS.read_text())
    monkeypatch.chdir(RESULTS.parent.parent.parent)
    argv = committed["command"].split()[3:]
    assert argv[0] == "--pair"
    assert ar.main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["pairs"] == committed["pairs"]
    tree = committed["pairs"]["tree_join_over_chain_join_314"]
    assert tree["ci95"][1] < 1  # the seed's tree below the chain at the same steps


def test_a_server_over_its_own_twin_in_one_run_matches_the_run(capsys):
    """Both sides from one file: the ratio is the one the run's own rows give
    (speedup of one over the other's, each over the same baseline)."""
    bench = json.loads(TREE.read_text())
    r = ar.compare((bench, "spec-3-4-5-join", "t"), (bench, "spec-3-4-5", "t"))
    rows = {x["server"]: x for x in bench["rows"] if x["batch"] == 1}
    assert r["speedup_ratio"] == pytest.approx(
        rows["spec-3-4-5-join"]["speedup"] / rows["spec-3-4-5"]["speedup"], rel=0.01
    )
    assert r["ci95"][0] < r["speedup_ratio"] < r["ci95"][1]
    assert r["prompts"] == 16


def _bench(path):
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda b: b["gpu_info"].update(uuid="GPU-other"), "gpu_info.uuid"),
        (lambda b: b.pop("gpu_info"), "gpu_info.uuid"),
        (lambda b: b.update(attention_backend="triton"), "attention_backend"),
        (lambda b: b["fixtures"].update(path="/tmp/mla-retrained"), "fixtures"),
        (
            lambda b: [m.update(prompts=[p + 1 for p in m["prompts"]]) for m in b["measurements"]],
            "prompts",
        ),  # fmt: skip
    ],
)
def test_runs_that_differ_are_refused_by_the_field(change, named):
    other = copy.deepcopy(_bench(CHAIN))
    change(other)
    with pytest.raises(ValueError, match=named):
        ar.compare((_bench(TREE), "spec-3-4-5-join", "t.json"), (other, "spec-3-1-4-join", "c"))


def test_a_missing_server_or_an_existing_out_is_named(tmp_path, capsys):
    argv = ["--pair", f"x={TREE}:spec-9-9-9,{CHAIN}:spec-3-1-4-join"]
    assert ar.main(argv) == 2
    assert "no batch-1 measurement of server 'spec-9-9-9'" in capsys.readouterr().err
    out = tmp_path / "o.json"
    out.write_text("mine")
    with pytest.raises(SystemExit):
        ar.main([*argv, "--out", str(out)])
    assert out.read_text() == "mine"
    assert ar.main(["--pair", f"x={TREE}:spec-3-4-5-join"]) == 2
    assert "expected NAME=A.json:SERVER,B.json:SERVER" in capsys.readouterr().err


def test_pairs_on_other_runs_or_two_files_of_one_name_are_refused(tmp_path, capsys):
    """The result states one GPU and one set of versions, so every pair's runs must share
    them; and runs are named by file name, so two files of one name cannot both be read."""
    other = copy.deepcopy(_bench(CHAIN))
    other["gpu_info"]["uuid"] = "GPU-other"
    elsewhere = tmp_path / "o.json"
    elsewhere.write_text(json.dumps(other))
    pairs = [f"x={TREE}:spec-3-4-5-join,{TREE}:spec-3-4-5",
             f"y={elsewhere}:spec-3-1-4-join,{elsewhere}:spec-3-1-4-join"]  # fmt: skip
    assert ar.main(["--pair", *pairs]) == 2
    assert "gpu_info.uuid" in capsys.readouterr().err
    twin = tmp_path / CHAIN.name
    twin.write_text(CHAIN.read_text())
    argv = ["--pair", f"x={CHAIN}:spec-3-1-4-join,{twin}:spec-3-1-4-join"]
    assert ar.main(argv) == 2
    assert "another file of that name" in capsys.readouterr().err
