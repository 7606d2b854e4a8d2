"""server_mode_verdict: the #24 server run's servers against the bounds registered before it ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ext_tools import server_mode_verdict as sv

ROOT = Path(__file__).resolve().parents[1]
TENTH = ROOT / "tests/gpu/results/seed-shape-2026-12-06-draws-nvidia-h100-sglang0.5.23"


def bench(servers):
    """A bench JSON with (name, up us a call, tau, ready s) per speculative server, in order."""
    out = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_info": {"uuid": "GPU-x"}, "servers": [], "rows": []}
    out["servers"].append({"name": "nospec", "role": "nospec", "ready_after_s": 90.0})
    out["groups"] = [["nospec", name] for name, *_ in servers]
    out["profiles"] = {}
    for i, (name, up, tau, ready) in enumerate(servers):
        role = "spec" if i == 0 else "variant"
        out["servers"].append(
            {"name": name, "role": role, "status": "ready", "ready_after_s": ready}
        )
        out["rows"].append({"server": name, "tau": tau, "speedup": 1.9})
        grids = [
            {"grid": [544, 1, 1], "calls_per_cycle": 60.0, "us_per_cycle": up * 60},
            {"grid": [7616, 1, 1], "calls_per_cycle": 60.0, "us_per_cycle": 1680.0},
        ]
        out["profiles"][name] = {"kernel_grids": {"target_graph": {"fused_moe_kernel": grids}}}
    return out


def fit(cycles):
    return {
        "servers": {
            n: {"ms_per_cycle": c, "ms_per_cycle_ci95": [c - 0.3, c + 0.3]}
            for n, c in cycles.items()
        }
    }


NAMES = ("spec-5-1-6", "spec-5-1-6-nopdl", "spec-5-1-6-fresh")


@pytest.mark.parametrize(
    "ups, cycles, reading",
    [
        ((68.6, 82.2, 68.9), (11.84, 12.86, 11.9), "(a) caches set the mode"),
        ((82.2, 69.0, 82.0), (12.86, 12.0, 12.85), "(b) the early PDL launch sets the mode"),
        ((68.6, 69.0, 68.8), (11.84, 12.0, 11.9), "both cheap: both readings stay open"),
        ((68.6, 82.2, 82.1), (11.84, 12.86, 12.86), "neither: both dear"),
        # cheap kernel but a cycle over its registered bound is not a cheap server
        ((68.6, 82.2, 69.0), (11.84, 12.86, 12.3), "neither: both dear"),
    ],
)
def test_each_reading_is_told_by_its_bounds(ups, cycles, reading):
    b = bench([(n, u, 2.885, 100.0) for n, u in zip(NAMES, ups, strict=True)])
    v = sv.verdict(b, fit(dict(zip(NAMES, cycles, strict=True))), sv.DEFAULT_ROLES, "b.json")
    assert v["reading"].startswith(reading)
    assert v["missing_roles"] == [] and v["first_mode"] == sv.mode(ups[0])
    assert v["ready_within_150s"] and v["tau_within_2pct"]


def test_the_up_projections_binary_is_compared_across_servers():
    """Registers and shared memory name the compiled kernel; occupancy may differ."""
    b = bench([(n, u, 2.885, 100.0) for n, u in zip(NAMES, (68.6, 82.2, 68.9), strict=True)])
    f = fit(dict(zip(NAMES, (11.84, 12.86, 11.9), strict=True)))
    assert sv.verdict(b, f, sv.DEFAULT_ROLES, "b.json")["one_up_binary"] is None  # untraced
    for name, regs, occ in zip(NAMES, (128, 128, 128), (25.0, 19.0, 25.0), strict=True):
        row = b["profiles"][name]["kernel_grids"]["target_graph"]["fused_moe_kernel"][0]
        row.update(registers=[regs], shared_memory=[49152], occupancy_pct=occ)
    v = sv.verdict(b, f, sv.DEFAULT_ROLES, "b.json")
    assert v["one_up_binary"] is True
    assert v["servers"][NAMES[1]]["up_binary"] == {
        "registers": [128],
        "shared_memory": [49152],
        "occupancy_pct": 19.0,
    }
    row = b["profiles"][NAMES[1]]["kernel_grids"]["target_graph"]["fused_moe_kernel"][0]
    row["registers"] = [96]
    assert sv.verdict(b, f, sv.DEFAULT_ROLES, "b.json")["one_up_binary"] is False


def test_modes_between_the_bounds_and_untraced_are_named():
    assert [sv.mode(x) for x in (72.0, 75.0, 78.0, None)] == ["cheap", "between", "dear", "unread"]


def test_late_start_off_tau_and_a_missing_server_are_reported():
    b = bench([(NAMES[0], 68.6, 2.885, 100.0), (NAMES[1], 69.0, 2.80, 160.0)])
    v = sv.verdict(b, fit({NAMES[0]: 11.8, NAMES[1]: 12.0}), sv.DEFAULT_ROLES, "b.json")
    assert not v["ready_within_150s"] and not v["tau_within_2pct"]
    assert v["tau_spread"] == round(2.885 / 2.80, 4)
    b["servers"][2]["ready_after_s"], b["servers"][0]["ready_after_s"] = 140.0, 151.0
    v = sv.verdict(b, fit({NAMES[0]: 11.8}), sv.DEFAULT_ROLES, "b.json")
    assert not v["ready_within_150s"]  # the baseline counts too
    assert v["missing_roles"] == [f"fresh={NAMES[2]}"]
    assert v["reading"].startswith("not separable")


def test_a_trace_without_the_up_projection_grid_names_server_and_grids():
    b = bench([(NAMES[0], 68.6, 2.885, 100.0)])
    b["profiles"][NAMES[0]]["kernel_grids"]["target_graph"]["fused_moe_kernel"][0]["grid"] = [
        512,
        1,
        1,
    ]
    with pytest.raises(
        ValueError, match=r"profiles\[spec-5-1-6\].*no grid 544 \(found \[512, 7616\]\)"
    ):
        sv.verdict(b, fit({}), sv.DEFAULT_ROLES, "b.json")


def test_the_tenth_run_read_with_its_twins_in_the_roles():
    """The committed tenth run: pair 1 cheap (68.6 us), its twins dear (82.2, 82.1)."""
    b = json.loads(Path(f"{TENTH}-bench.json").read_text())
    f = json.loads(Path(f"{TENTH}-cycle-fit.json").read_text())
    roles = sv.parse_roles(["nopdl=spec-5-1-6-b", "fresh=spec-5-1-6-c"])
    v = sv.verdict(b, f, roles, "tenth")
    ups = [
        v["servers"][n]["up_us_per_call"] for n in ("spec-5-1-6", "spec-5-1-6-b", "spec-5-1-6-c")
    ]
    assert ups == [68.58, 82.23, 82.13]
    assert [v["servers"][n]["group"] for n in roles.values()] == [0, 1, 2]
    assert v["first_mode"] == "cheap" and v["reading"] == "neither: both dear"


def test_cli_refuses_an_existing_out_and_a_bad_role(tmp_path, capsys):
    out = tmp_path / "v.json"
    out.write_text("{}")
    args = ["--bench", f"{TENTH}-bench.json", "--cycle-fit", f"{TENTH}-cycle-fit.json"]
    with pytest.raises(SystemExit):
        sv.main([*args, "--out", str(out)])
    assert out.read_text() == "{}"
    assert sv.main([*args, "--role", "slow=x"]) == 2
    assert "--role 'slow=x'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("tool", "flags"),
    [("trained_join_verdict", ("--cycle-fit", "--logs")), ("join_verdict", ("--traces",)),
     ("server_mode_verdict", ("--cycle-fit",)), ("batch_join_verdict", ())],
)  # fmt: skip
def test_every_verdict_names_a_bench_that_is_not_an_object(tool, flags, tmp_path, capsys):
    """The shared command line checks the file's shape before any verdict reads it: a list
    where the object belongs is one line naming the file, not a traceback."""
    import importlib

    module = importlib.import_module(f"sglang_ext_tools.{tool}")
    bench, fit = tmp_path / "b.json", tmp_path / "fit.json"
    bench.write_text("[]")
    fit.write_text("{}")
    given = {"--cycle-fit": str(fit), "--logs": str(tmp_path), "--traces": str(tmp_path)}
    argv = ["--bench", str(bench), *(x for f in flags for x in (f, given[f]))]
    assert module.main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"{tool}: b.json: the file: expected a JSON object (bench_speed's --out-json), "
        "found list []\n"
    )
