"""moe_mode (sglang_ext_tools/moe_mode.py) as far as a CPU takes it: the runs it starts, the
env each process gets, the config it rebuilds from a committed tuner report, and how it reads
a profiled replay's fused-MoE launches."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sglang_ext_tools import moe_mode as mm

RESULTS = Path(__file__).parent / "gpu" / "results"
TENTH_TUNE = RESULTS / "seed-shape-2026-12-06-draws-nvidia-h100-sglang0.5.23-tune-moe.json"


def test_runs_parse_and_bad_ones_are_named():
    runs = mm.parse_runs(mm.DEFAULT_RUNS)
    assert [r.label for r in runs][:2] == ["fresh-pdl", "warm-pdl"]
    assert {r.cache for r in runs} == {"a"}  # one cache: every run after the first finds it warm
    assert [r.pdl for r in runs] == ["1", "1", "0", "0", "1"]
    for bad, says in [
        ("x:a", "LABEL:CACHE:PDL"),
        ("x:a:1:0", "LAYERS must be a whole number >= 1"),
        ("x:a:1:two", "LAYERS must be a whole number >= 1"),
        ("x:a:1:8:9", "fifth field may only be 'frag'"),
        ("x:a:1:8:frag:1", "LABEL:CACHE:PDL"),
        ("x:a:2", "PDL must be 0 or 1"),
        ("x:../b:1", "plain folder name"),
        ("x:moe-configs:1", "plain folder name"),
    ]:
        with pytest.raises(ValueError, match=says):
            mm.parse_runs([bad])
    with pytest.raises(ValueError, match="labels repeat"):
        mm.parse_runs(["x:a:1", "x:b:0"])
    assert {r.layers for r in runs} == {1}  # the first probe's runs: one layer's weights
    (cold,) = mm.parse_runs(["warm-pdl-l8:a:1:8"])
    assert (cold.cache, cold.pdl, cold.layers, cold.alloc) == ("a", "1", 8, "")
    (frag,) = mm.parse_runs(["warm-pdl-l8-frag:a:1:8:frag"])
    assert (frag.layers, frag.alloc) == (8, "frag")


def test_the_fragmenting_plan_fills_to_the_margin_and_releases_every_other_segment():
    mb = 1 << 20
    count, released = mm.frag_plan(1000 * mb, hole_mb=20, leave_mb=256)
    assert count == (1000 - 256) // 20 == 37
    assert released == list(range(0, 37, 2)) and len(released) == 19
    assert mm.frag_plan(100 * mb, hole_mb=20, leave_mb=256) == (0, [])


def test_each_run_gets_its_caches_and_switch_and_the_servers_config(tmp_path):
    a1, a0, b1 = mm.parse_runs(["p:a:1", "q:a:0", "r:b:1"])
    cfg = tmp_path / "moe-configs"
    env = {r.label: mm.run_env(r, tmp_path, cfg, {"PATH": "/bin"}) for r in (a1, a0, b1)}
    assert (
        env["p"]["TRITON_CACHE_DIR"] == env["q"]["TRITON_CACHE_DIR"] == str(tmp_path / "a/triton")
    )
    assert env["r"]["TRITON_CACHE_DIR"] == str(tmp_path / "b/triton")
    assert env["p"]["SGLANG_JIT_CACHE_DIR"] == str(tmp_path / "a/jit")
    assert env["p"]["SGLANG_CACHE_DIR"] == str(tmp_path / "a")
    assert (env["p"]["SGLANG_EXT_MOE_PDL"], env["q"]["SGLANG_EXT_MOE_PDL"]) == ("1", "0")
    assert all(e["SGLANG_MOE_CONFIG_DIR"] == str(cfg) and e["PATH"] == "/bin" for e in env.values())


def test_the_tenth_runs_tuner_report_gives_its_shape_and_configs():
    report = json.loads(TENTH_TUNE.read_text())
    shape, best = mm.shape_and_best(report)
    assert (shape.experts, shape.intermediate, shape.hidden, shape.topk) == (32, 256, 7168, 8)
    assert shape.shared == 256
    assert sorted(best) == [1, 2, 4, 5, 6, 8, 16, 32]
    assert best[6] == report["tokens"]["6"]["best"]
    with pytest.raises(ValueError, match="not a tune_moe report"):
        mm.shape_and_best({"shape": {"experts": 1}})


def _kernel(ts, dur, grid, name="fused_moe_kernel"):
    return {"name": name, "ts": ts, "dur": dur, "args": {"grid": grid}}


def test_the_first_gemm_of_each_call_is_the_up_projection():
    events = []
    for call in range(3):  # up, an unrelated kernel, down; the events given out of order
        t = 100.0 * call
        events += [_kernel(t + 50, 30.0, [1792]), _kernel(t, 68.0 + call, [544])]
        events.append(_kernel(t + 40, 5.0, [6], name="act_and_mul_kernel"))
    got = mm.up_and_down(events)
    assert got["up"] == {"calls": 3, "mean_us": 69.0, "grids": [[544]]}
    assert got["down"] == {"calls": 3, "mean_us": 30.0, "grids": [[1792]]}
    with pytest.raises(ValueError, match="expected two a call"):
        mm.up_and_down(events[:2] + [_kernel(999, 1.0, [544])])
    with pytest.raises(ValueError, match="0 fused_moe_kernel"):
        mm.up_and_down([])


def test_the_up_projections_binary_is_kept_where_the_trace_has_it():
    """Registers and shared memory, as a server trace's kernel_grids keeps them: the
    standalone binary compares with a server's."""
    events = []
    for call in range(2):
        up, down = _kernel(100.0 * call, 70.0, [544]), _kernel(100.0 * call + 50, 30.0, [1792])
        up["args"].update({"registers per thread": 128, "shared memory": 49152})
        down["args"].update({"registers per thread": 96, "est. achieved occupancy %": 20})
        events += [up, down]
    got = mm.up_and_down(events)
    assert got["up"]["registers"] == [128] and got["up"]["shared_memory"] == [49152]
    assert got["down"]["registers"] == [96] and got["down"]["occupancy_pct"] == 20.0


def test_children_run_in_order_and_a_failed_one_says_why(tmp_path):
    seen = []

    def runner(cmd, env, **_):
        assert cmd[-4] == "--child-layers" and cmd[-2] == "--child-alloc"
        seen.append((cmd[-5], cmd[-3], cmd[-1], env["SGLANG_EXT_MOE_PDL"], env["TRITON_CACHE_DIR"]))
        if env["SGLANG_EXT_MOE_PDL"] == "0":
            return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="Traceback: boom")
        body = {"tokens": {"6": {"alone_us": 150.0}}}
        return subprocess.CompletedProcess(
            cmd, 0, stdout="log\n" + mm.CHILD_MARK + json.dumps(body)
        )

    runs = mm.parse_runs(["fresh:a:1", "nopdl:a:0:8:frag"])
    so_far = []
    rows = mm.run_children(
        runs, ["--child", "LAST"], tmp_path, tmp_path / "cfg", runner,
        on_row=lambda r: so_far.append([x["label"] for x in r]),
    )  # fmt: skip
    assert so_far == [["fresh"], ["fresh", "nopdl"]]  # a cut lease keeps the runs that ended
    assert [r["order"] for r in rows] == [1, 2] and [r["label"] for r in rows] == ["fresh", "nopdl"]
    assert rows[0]["tokens"]["6"]["alone_us"] == 150.0 and "error" not in rows[0]
    assert rows[1]["error"].startswith("exit 1: ") and "boom" in rows[1]["error"]
    assert seen == [
        ("LAST", "1", "clean", "1", str(tmp_path / "a/triton")),
        ("LAST", "8", "frag", "0", str(tmp_path / "a/triton")),
    ]
    assert [r["layers"] for r in rows] == [1, 8]


def test_it_never_writes_over_a_result_or_into_an_old_cache_root(tmp_path, capsys):
    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    base = ["--tune-json", str(TENTH_TUNE), "--cache-root", str(tmp_path / "new")]
    with pytest.raises(SystemExit):
        mm.parse_args([*base, "--json", str(kept)])
    assert "not overwriting" in capsys.readouterr().err and kept.read_text() == "{}"
    with pytest.raises(SystemExit):
        mm.parse_args(["--tune-json", str(TENTH_TUNE), "--cache-root", str(tmp_path)])
    assert "exists; give a new folder" in capsys.readouterr().err
    no_shared = json.loads(TENTH_TUNE.read_text())
    no_shared["shape"]["shared"] = 0
    (tmp_path / "t.json").write_text(json.dumps(no_shared))
    with pytest.raises(SystemExit):
        mm.parse_args(
            ["--tune-json", str(tmp_path / "t.json"), "--cache-root", str(tmp_path / "n")]
        )
    assert "no shared experts" in capsys.readouterr().err
    args = mm.parse_args(base)
    assert [r.label for r in args.runs] == [s.split(":")[0] for s in mm.DEFAULT_RUNS]


def test_the_rebuilt_config_is_the_file_the_servers_read(tmp_path, monkeypatch):
    """The tuner's best per token count, under the name and folder SGLang looks for on the
    tenth run's card (its device name stood in: a CPU has none)."""
    pytest.importorskip("sglang")
    pytest.importorskip("triton")
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as cfg

    monkeypatch.setattr(cfg, "get_device_name", lambda: "NVIDIA H100 80GB HBM3")
    report = json.loads(TENTH_TUNE.read_text())
    shape, best = mm.shape_and_best(report)
    path = mm.write_config(shape, best, tmp_path)
    assert path.name == Path(report["config_file"]).name
    assert path.parent.parent == tmp_path / "configs"
    table = json.loads(path.read_text())
    assert all(table[str(m)] == cfg_ for m, cfg_ in best.items())
    assert {"64", "1024"} <= set(table)  # SGLang's defaults fill the counts above the tuned ones


def test_main_writes_each_run_as_it_ends_and_marks_the_file_complete(tmp_path, monkeypatch):
    pytest.importorskip("sglang")
    out = tmp_path / "moe-mode.json"
    seen_partial = []

    def fake_children(runs, argv_child, root, config_dir, runner=None, on_row=None):
        assert "--child" in argv_child and config_dir == root / "moe-configs"
        rows = []
        for k, run in enumerate(runs, 1):
            rows.append({"label": run.label, "order": k})
            on_row(rows)
            seen_partial.append(json.loads(out.read_text()))
        return rows

    monkeypatch.setattr(mm, "write_config", lambda shape, best, d: d / "cfg.json")
    monkeypatch.setattr(mm, "run_children", fake_children)
    argv = ["--tune-json", str(TENTH_TUNE), "--cache-root", str(tmp_path / "root"),
            "--run", "f:a:1", "w:a:1", "--json", str(out)]  # fmt: skip
    assert mm.main(argv) == 0
    assert [len(p["runs"]) for p in seen_partial] == [1, 2]
    assert not any(p["complete"] for p in seen_partial)
    final = json.loads(out.read_text())
    assert final["complete"] and [r["label"] for r in final["runs"]] == ["f", "w"]
    assert final["shape"]["experts"] == 32 and final["command"].startswith("python -m ")
    assert {"sglang", "torch", "triton"} <= set(final["versions"]) and "gpu" in final
    assert final["backend"] == "triton fused_moe"
