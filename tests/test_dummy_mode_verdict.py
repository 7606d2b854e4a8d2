"""dummy_mode_verdict: the fixture-free #24 mode probe's servers against the bounds registered
before it ran (baseline at the one-token grid, the 5/1/6 servers against each other)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ext_tools import dummy_mode_verdict as dv
from sglang_ext_tools.server_mode_verdict import parse_roles

ROOT = Path(__file__).resolve().parents[1]
TENTH = ROOT / "tests/gpu/results/seed-shape-2026-12-06-draws-nvidia-h100-sglang0.5.23-bench.json"


def _grids(up: float, grid: int, binary: dict | None = None) -> dict:
    entries = [
        {"grid": [grid, 1, 1], "calls_per_cycle": 60.0, "us_per_cycle": up * 60, **(binary or {})},
        {"grid": [7616, 1, 1], "calls_per_cycle": 60.0, "us_per_cycle": 1680.0},
    ]
    return {"kernel_grids": {"target_graph": {"fused_moe_kernel": entries}}}


def bench(base_up, ups, binaries=None, ready=60.0):
    """Baseline at the one-token grid and the three 5/1/6 servers at the verify grid."""
    names = ["spec-5-1-6", "spec-5-1-6-nopdl", "spec-5-1-6-fresh"]
    out = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_info": {"uuid": "GPU-x"}, "profiles": {}}
    out["servers"] = [{"name": "nospec", "role": "nospec", "ready_after_s": ready}]
    if base_up is not None:
        out["profiles"]["nospec"] = _grids(base_up, 128)
    for i, (name, up) in enumerate(zip(names, ups, strict=True)):
        role = "spec" if i == 0 else "variant"
        out["servers"].append({"name": name, "role": role, "ready_after_s": ready})
        if up is not None:
            binary = (binaries or [None] * 3)[i]
            out["profiles"][name] = _grids(up, 544, binary)
    return out


def read(b):
    return dv.verdict(b, dict(parse_roles([])), "b.json")


def test_tenth_run_read_with_its_twins_in_the_roles():
    """The trained tenth run, its twins as nopdl and fresh: the baseline dear at one token,
    the verify servers 1.20 apart (modes appear), cheap, dear, dear: neither."""
    b = json.loads(TENTH.read_text())
    roles = parse_roles(["nopdl=spec-5-1-6-b", "fresh=spec-5-1-6-c"])
    v = dv.verdict(b, roles, TENTH.name)
    assert v["baseline"] == {
        "server": "nospec", "up_us_per_call": 54.91, "mode": "dear", "up_binary": None,
    }  # fmt: skip
    assert v["verify_spread"] == pytest.approx(1.199, abs=1e-3)
    assert v["modes"] == "modes appear"
    assert [v["servers"][r]["cheap"] for r in ("first", "nopdl", "fresh")] == [True, False, False]
    assert v["reading"] == "neither: both dear"
    assert v["ready_within_150s"] is True


@pytest.mark.parametrize(
    "ups, modes, reading",
    [
        ((70.0, 71.0, 72.0), "no modes", "no reading of the candidates: no modes"),
        ((70.0, 74.0, 72.0), "unclear", "no reading of the candidates: unclear"),
        ((82.0, 82.5, 68.0), "modes appear", "(a) caches set the mode"),
        ((82.0, 68.0, 82.5), "modes appear", "(b) the early PDL launch sets the mode"),
        ((82.0, 68.0, 69.0), "modes appear", "both cheap"),
        ((68.0, 82.0, 82.5), "modes appear", "neither: both dear"),
    ],
)
def test_the_verify_servers_against_each_other(ups, modes, reading):
    v = read(bench(33.0, ups))
    assert v["modes"] == modes
    assert v["reading"].startswith(reading)


@pytest.mark.parametrize("us, mode", [(33.0, "cheap"), (40.0, "cheap"), (44.0, "between"),
                                      (48.0, "dear"), (54.9, "dear")])  # fmt: skip
def test_the_baseline_at_one_token(us, mode):
    assert read(bench(us, (70.0, 70.0, 70.0)))["baseline"]["mode"] == mode


def test_untraced_servers_are_unread_not_guessed():
    v = read(bench(None, (70.0, None, None)))
    assert v["baseline"]["mode"] == "unread"
    assert v["modes"] == "unread" and v["verify_spread"] is None
    assert v["servers"]["nopdl"]["up_us_per_call"] is None


def test_binaries_compared_by_registers_and_shared_memory():
    same = [{"registers": 128, "shared_memory": 32768, "blocks_per_sm": 2}] * 3
    assert read(bench(33.0, (70.0, 82.0, 70.0), same))["one_up_binary"] is True
    other = [*same[:2], {"registers": 96, "shared_memory": 32768}]
    assert read(bench(33.0, (70.0, 82.0, 70.0), other))["one_up_binary"] is False
    assert read(bench(33.0, (70.0, 82.0, 70.0)))["one_up_binary"] is None


def test_readiness_over_every_server():
    assert read(bench(33.0, (70.0, 70.0, 70.0), ready=151.0))["ready_within_150s"] is False


def test_a_trace_without_the_grid_is_named(tmp_path):
    b = bench(33.0, (70.0, 70.0, 70.0))
    b["profiles"]["spec-5-1-6"] = _grids(70.0, 512)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(b))
    assert dv.main(["--bench", str(path)]) == 2


def test_never_writes_over_out(tmp_path, capsys):
    path, out = tmp_path / "b.json", tmp_path / "v.json"
    path.write_text(json.dumps(bench(33.0, (70.0, 70.0, 70.0))))
    out.write_text("keep")
    with pytest.raises(SystemExit):
        dv.main(["--bench", str(path), "--out", str(out)])
    assert out.read_text() == "keep"
    assert "not overwriting" in capsys.readouterr().err


DUMMY = ROOT / "tests/gpu/results/seed-shape-2026-12-07-dummy-nvidia-h100-sglang0.5.23"
STANDALONE = ROOT / "tests/gpu/results/seed-shape-2026-12-07-moemode-h100-nvidia-h100-sglang0.5.23"


def test_the_committed_dummy_verdict_is_what_its_bench_gives():
    """The twenty-second session's run: the baseline traced, its three 5/1/6 servers dead at
    startup (the CuTe DSL off PYTHONPATH), so nothing among them is read."""
    bench_json = json.loads(Path(f"{DUMMY}-speed.json").read_text())
    v = dv.verdict(bench_json, dict(parse_roles([])), f"{DUMMY.name}-speed.json")
    assert v == json.loads(Path(f"{DUMMY}-verdict.json").read_text())
    assert v["baseline"]["mode"] == "dear" and v["modes"] == "unread"
    assert v["ready_within_150s"] is False
    assert all(s["ready_after_s"] is None for s in v["servers"].values())


def test_the_dear_one_token_server_runs_the_standalone_binary():
    """Same lease, same card: the dummy-weight baseline's one-token up-projection (grid 128)
    compiled to the binary the standalone probe's four processes ran there, and took more than
    twice as long a call. The dear mode at one token is how that binary runs in a server, not
    another kernel."""
    server = json.loads(Path(f"{DUMMY}-verdict.json").read_text())
    alone = json.loads(Path(f"{STANDALONE}-verdict.json").read_text())
    moe = json.loads(Path(f"{STANDALONE}-moe-mode.json").read_text())
    assert server["gpu_uuid"] == moe["gpu"]["uuid"]
    base = server["baseline"]["up_binary"]
    assert [[base["registers"], base["shared_memory"]]] == alone["one_up_binary"]["1"]["binaries"]
    one_token = [r["tokens"]["1"]["up_us"] for r in alone["runs"]]
    assert server["baseline"]["up_us_per_call"] > 2 * max(one_token)
