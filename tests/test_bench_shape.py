"""bench_shape: what bench_speed writes passes, what it does not is one line naming the file
and field, for every tool that reads a bench (the mode verdicts, across_runs, cycle_fit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ext_tools import across_runs, cycle_fit
from sglang_ext_tools.bench_shape import bench_shape


def test_every_committed_bench_has_the_shape_the_verdicts_check():
    """``bench_shape`` refuses what bench_speed does not write, and nothing it wrote: every
    committed bench and speed file passes it."""
    root = Path(__file__).resolve().parent / "gpu" / "results"
    files = {p.name: json.loads(p.read_text()) for p in sorted(root.glob("*.json"))}
    benches = {n: d for n, d in files.items() if isinstance(d, dict) and "servers" in d
               and "rows" in d}  # fmt: skip
    assert len(benches) >= 40
    for name, bench in benches.items():
        bench_shape(bench, name)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"measurements": [1]}, "measurements[0]: expected an object, found int 1"),
        ({"measurements": {}}, "measurements: expected a list, found dict {}"),
        ({"rows": [{"server": "a", "batch": True}]},
         "rows[0].batch: expected an integer, found bool True"),
        ({"rows": [{"server": "a", "batch": 1, "tau": [2.4]}]},
         "rows[0].tau: expected a number or null, found list [2.4]"),
        ({"rows": [{"server": "a", "batch": 1, "speedup_ci95": [1.0, "x"]}]},
         "rows[0].speedup_ci95: expected [low, high], two numbers, found list [1.0, 'x']"),
        ({"profiles": {"nospec": 3}}, "profiles.nospec: expected an object, found int 3"),
    ],
)  # fmt: skip
def test_what_is_not_a_bench_is_named(content, message):
    with pytest.raises(ValueError) as e:
        bench_shape(content, "b.json")
    assert str(e.value) == f"b.json: {message}"


def test_across_runs_and_cycle_fit_name_a_bench_that_is_not_one(tmp_path, capsys):
    path = tmp_path / "b.json"
    path.write_text("[]")
    assert across_runs.main(["--pair", f"x={path}:a,{path}:b"]) == 2
    err = capsys.readouterr().err
    assert err == "across_runs: b.json: the file: expected a JSON object (bench_speed's " \
        "--out-json), found list []\n"
    path.write_text(json.dumps({"rows": [{"server": "a", "batch": 1}], "measurements": "x"}))
    assert cycle_fit.main(["--bench", str(path)]) == 1
    err = capsys.readouterr().err
    assert err == "error: b.json: measurements: expected a list, found str 'x'\n"
