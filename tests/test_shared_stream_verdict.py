"""shared_stream_verdict: the registered shared-expert run read from its bench and each
server's slim trace (launches beside another stream's kernel, speed against the ranges)."""

from __future__ import annotations

import gzip
import json

import pytest

from sglang_ext_tools import shared_stream_verdict as sv
from sglang_ext_tools.server_mode_verdict import parse_roles

UP = "fused_moe_kernel"


def k(name, ts, dur, stream, grid=(1, 1, 1)):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"stream": stream, "grid": list(grid)}}  # fmt: skip


def launches(grid, times, resident):
    """One up-projection per 1,000 us on stream 7; where ``resident``, stream 9's GEMM began
    2 us before it and runs 4 us."""
    events = []
    for i, (us, beside) in enumerate(zip(times, resident, strict=True)):
        t = 1000.0 * (i + 1)
        if beside:
            events.append(k("nvjet_shared", t - 2, 4, 9))
        events.append(k(UP, t, us, 7, (grid, 1, 1)))
    return {"traceEvents": events}


def write(tmp_path, traces):
    folder = tmp_path / "traces"
    folder.mkdir()
    for server, trace in traces.items():
        with gzip.open(folder / f"{server}.trace.json.gz", "wt") as fh:
            json.dump(trace, fh)
    return folder


def bench(rows):
    names = ["nospec", "spec-5-1-6", "spec-5-1-6-serial", "nospec-serial"]
    return {"gpu": "NVIDIA H100 80GB HBM3", "gpu_info": {"uuid": "GPU-x"}, "rows": rows,
            "servers": [{"name": n, "ready_after_s": 120.0} for n in names]}  # fmt: skip


def row(server, field, ratio, ci):
    return {"server": server, "batch": 1, field: ratio, f"{field}_ci95": ci}


def test_the_registered_run_read_end_to_end(tmp_path):
    folder = write(tmp_path, {
        "nospec": launches(128, [56.0] * 9 + [26.0], [True] * 9 + [False]),
        "spec-5-1-6": launches(544, [82.0] * 10, [True] * 10),
        "spec-5-1-6-serial": launches(544, [70.0] * 10, [False] * 10),
        "nospec-serial": launches(128, [26.0] * 10, [False] * 10),
    })  # fmt: skip
    rows = [row("nospec-serial", "speedup", 1.11, [1.09, 1.13]),
            row("spec-5-1-6-serial", "vs_setting", 1.05, [1.03, 1.07])]  # fmt: skip
    v = sv.verdict(bench(rows), folder, sv.ROLES, "speed.json")
    assert v["ready_within_150s"] is True
    assert v["launches"]["baseline"]["resident_share"] == 0.9
    assert v["launches"]["baseline"]["resident_over_clear"] == pytest.approx(56 / 26, abs=1e-3)
    assert v["launches"]["plugin_nospec"] is None  # not run: no server, no trace
    assert v["checks"] == {
        "baseline_replicates": True,
        "plain_verify_resident": True,
        "serial_clear": True,
        "serial_nospec_clear": True,
        "serial_verify_not_dearer": True,
        "serial_one_token_at_most_30_us": True,
    }
    assert v["speed"]["serial_nospec"]["reading"] == "within"
    assert v["speed"]["serial"]["reading"] == "above"  # the verify gains too: a lever
    assert v["speed"]["plugin_nospec"]["reading"] == "unread"


@pytest.mark.parametrize("point, ci, reading", [
    (1.12, [1.10, 1.14], "within"), (1.20, [1.16, 1.24], "above"),
    (1.03, [1.01, 1.05], "below"), (1.16, [1.14, 1.18], "point outside"),
    (None, None, "unread"), (1.12, None, "within"),
])  # fmt: skip
def test_a_ratio_placed_against_its_range(point, ci, reading):
    assert sv.place(point, ci, 1.08, 1.15) == reading


def test_failed_checks_read_false(tmp_path):
    folder = write(tmp_path, {
        "nospec": launches(128, [56.0] * 8 + [26.0] * 2, [True] * 8 + [False] * 2),
        "spec-5-1-6": launches(544, [70.0] * 10, [True] * 10),
        "spec-5-1-6-serial": launches(544, [84.0] * 10, [True] + [False] * 9),
        "nospec-serial": launches(128, [31.0] * 10, [False] * 10),
    })  # fmt: skip
    v = sv.verdict(bench([]), folder, sv.ROLES, "speed.json")
    assert v["checks"]["baseline_replicates"] is False  # 80 % resident
    assert v["checks"]["serial_clear"] is False  # 10 % with something beside
    assert v["checks"]["serial_verify_not_dearer"] is False
    assert v["checks"]["serial_one_token_at_most_30_us"] is False


def test_roles_rename_servers_and_bad_ones_are_named(tmp_path, capsys):
    assert parse_roles(["plain=spec-5-1-6-b"], sv.ROLES)["plain"] == "spec-5-1-6-b"
    with pytest.raises(Exception, match="ROLE=SERVER"):
        parse_roles(["verify=spec"], sv.ROLES)
    folder = write(tmp_path, {"spec-5-1-6-b": launches(544, [70.0], [True])})
    path = tmp_path / "speed.json"
    path.write_text(json.dumps(bench([]) | {"servers": [{"name": "spec-5-1-6-b"}]}))
    assert sv.main(["--bench", str(path), "--traces", str(folder),
                    "--role", "plain=spec-5-1-6-b"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["launches"]["plain"]["instances"] == 1


def test_a_trace_without_its_grid_is_named_and_out_never_overwritten(tmp_path, capsys):
    folder = write(tmp_path, {"nospec": launches(544, [70.0], [False])})
    path = tmp_path / "speed.json"
    path.write_text(json.dumps(bench([])))
    assert sv.main(["--bench", str(path), "--traces", str(folder)]) == 2
    assert "nospec.trace.json.gz" in capsys.readouterr().err
    assert sv.main(["--bench", str(path), "--traces", str(tmp_path / "none")]) == 2
    assert "--traces" in capsys.readouterr().err
    out = tmp_path / "v.json"
    out.write_text("keep")
    with pytest.raises(SystemExit):
        sv.main(["--bench", str(path), "--traces", str(folder), "--out", str(out)])
    assert out.read_text() == "keep"


def test_the_committed_run_is_its_verdict(tmp_path):
    """The registered run as it came back on 2026-12-07 (twenty-third session, one H100): the
    committed verdict is what the tool reads from the rebuilt bench and the slim traces. The
    serial 5/1/6 server's gain over the plain one lies above the registered 0.93-1.02."""
    import tarfile
    from pathlib import Path

    run = Path(__file__).resolve().parents[1] / (
        "tests/gpu/results/seed-shape-2026-12-07-serial-nvidia-h100-sglang0.5.23"
    )
    with tarfile.open(f"{run}-moe-traces.tgz") as tgz:
        tgz.extractall(tmp_path, filter="data")
    bench_path = Path(f"{run}-speed-rebuilt.json")
    kept = json.loads(Path(f"{run}-verdict.json").read_text())
    again = sv.verdict(json.loads(bench_path.read_text()), tmp_path, sv.ROLES, bench_path.name)
    assert json.loads(json.dumps(again)) == kept
    assert all(kept["checks"].values())
    assert [kept["speed"][k]["reading"] for k in ("serial_nospec", "serial", "plugin_nospec")] == [
        "within", "above", "point outside"]  # fmt: skip
