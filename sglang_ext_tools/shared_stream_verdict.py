"""The shared-expert run read against its registration: does taking SGLang's second stream from
the DeepSeek MoE layers (``SGLANG_EXT_MOE_SHARED_STREAM=0``) make the routed up-projection
launch clear, and what does it do to speed, with and without speculation?

Registered 2026-12-07 (twenty-second session) before it ran (docs/next-device-sessions.md), on
an H100 with dummy weights at the seed's rank shape, every server beside a stock no-speculation
baseline: plain 5/1/6, ``serial`` 5/1/6, ``serial@nospec`` (and, with time, ``plugin@nospec``):

- every server ready within 150 s;
- the baseline repeats the twenty-second session's trace: the one-token up-projection (grid
  128) launched with another stream's kernel running in >= 90 % of instances, those >= 1.8x the
  clear ones' median;
- the plain 5/1/6 server's verify up-projection (grid 544) likewise in >= 90 %; how much dearer
  is recorded (held loosely: 1.05-1.25x);
- the serial servers launch it with anything of another stream running in <= 5 % of instances;
  the serial verify's median at or below the plain one's; the serial one-token median <= 30 us;
- speed: ``serial@nospec`` over the baseline 1.08-1.15 (point 1.12); serial over plain at 5/1/6
  0.93-1.02 (point 0.98); ``plugin@nospec`` over the baseline 0.98-1.02.

Each speed reading gives its paired interval and where it lies against the range: "within"
(point in range), "above" or "below" (the whole interval outside), else "point outside".

    python -m sglang_ext_tools.shared_stream_verdict --bench speed.json --traces DIR \
        [--out verdict.json]

``DIR`` holds ``SERVER.trace.json.gz`` per server (the pipeline's ``slim-traces.tgz``, unpacked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext_tools.moe_overlap import load_trace, overlap
from sglang_ext_tools.server_mode_verdict import cli, ready_within, verdict_head

ONE_TOKEN_GRID = 128
VERIFY_GRID = 544
KERNEL = "fused_moe_kernel"
ROLES = {
    "baseline": "nospec",
    "plain": "spec-5-1-6",
    "serial": "spec-5-1-6-serial",
    "serial_nospec": "nospec-serial",
    "plugin_nospec": "nospec-plugin",
}
ONE_TOKEN_ROLES = ("baseline", "serial_nospec", "plugin_nospec")  # read at grid 128, else 544
RESIDENT_MIN_SHARE = 0.90
BASELINE_MIN_RATIO = 1.8
SERIAL_MAX_SHARE = 0.05
SERIAL_ONE_TOKEN_MAX_US = 30.0
SPEED = {  # role: (low, high, point) of the registered ratio, and which row field holds it
    "serial_nospec": ((1.08, 1.15, 1.12), "speedup"),
    "serial": ((0.93, 1.02, 0.98), "vs_setting"),
    "plugin_nospec": ((0.98, 1.02, 1.00), "speedup"),
}


def launches(traces: Path, server: str, grid: int) -> dict[str, Any] | None:
    """``moe_overlap`` on SERVER's trace at ``grid``, with the share of resident launches;
    None where the trace is missing."""
    path = traces / f"{server}.trace.json.gz"
    if not path.is_file():
        return None
    try:
        out = overlap(load_trace(path), KERNEL, grid)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    return {
        "instances": out["instances"],
        "resident_share": round(out["resident"]["n"] / out["instances"], 4),
        "median_us": out["all"]["median_us"],
        "resident_median_us": out["resident"]["median_us"],
        "clear_median_us": out["clear"]["median_us"],
        "resident_over_clear": out["resident_over_clear"],
        "resident_kernels": out["resident"]["kernels"],
    }


def place(point: float | None, ci: Sequence[float] | None, low: float, high: float) -> str:
    """Where a ratio lies against its registered range."""
    if point is None:
        return "unread"
    if ci and ci[0] > high:
        return "above"
    if ci and ci[1] < low:
        return "below"
    return "within" if low <= point <= high else "point outside"


def against(
    point: float | None, ci: Sequence[float] | None, bounds: Sequence[float] | None
) -> dict[str, Any]:
    """A figure's registered range (``bounds``: low, high, point) and where the figure lies
    (``place``); "recorded" where no range was registered, "unread" without a figure."""
    if bounds is None:
        return {"registered": None, "reading": "recorded" if point is not None else "unread"}
    return {
        "registered": {"low": bounds[0], "high": bounds[1], "point": bounds[2]},
        "reading": place(point, ci, bounds[0], bounds[1]),
    }


def batch1_row(rows: Sequence[Mapping[str, Any]], server: str) -> Mapping[str, Any] | None:
    """A bench's row of ``server`` at batch 1; None where it has none."""
    return next((r for r in rows if r.get("server") == server and r.get("batch") == 1), None)


def speed(rows: Sequence[Mapping[str, Any]], role: str, server: str) -> dict[str, Any]:
    bounds, field = SPEED[role]
    row = batch1_row(rows, server)
    value = row.get(field) if row else None
    ci = row.get(f"{field}_ci95") if row else None
    return {
        "server": server,
        "field": field,
        "ratio": value,
        "ci95": ci,
        **against(value, ci, bounds),
    }


def served(
    bench: Mapping[str, Any], folder: Path, flag: str = "--traces"
) -> dict[str, Mapping[str, Any]]:
    """The run's servers by name, once the folder given as ``flag`` is there (named where it
    is not)."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{flag} {folder}: no such folder")
    return {s["name"]: s for s in bench.get("servers", [])}


def ready(servers: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """The servers that came up and served (a server the bench's limit stopped first did not)."""
    return {n for n, s in servers.items() if s.get("status") == "ready"}


def verdict(
    bench: Mapping[str, Any], traces: Path, roles: Mapping[str, str], where: str
) -> dict[str, Any]:
    servers = served(bench, traces)
    grid = {r: ONE_TOKEN_GRID if r in ONE_TOKEN_ROLES else VERIFY_GRID for r in roles}
    reads = {
        r: launches(traces, name, grid[r]) if name in servers else None for r, name in roles.items()
    }
    base, plain = reads.get("baseline"), reads.get("plain")
    checks: dict[str, Any] = {
        "baseline_replicates": None
        if base is None
        else base["resident_share"] >= RESIDENT_MIN_SHARE
        and (base["resident_over_clear"] or 0) >= BASELINE_MIN_RATIO,
        "plain_verify_resident": None
        if plain is None
        else plain["resident_share"] >= RESIDENT_MIN_SHARE,
    }
    for role in ("serial", "serial_nospec"):
        read = reads.get(role)
        clear = None if read is None else read["resident_share"] <= SERIAL_MAX_SHARE
        checks[f"{role}_clear"] = clear
    serial = reads.get("serial")
    checks["serial_verify_not_dearer"] = (
        None if serial is None or plain is None else serial["median_us"] <= plain["median_us"]
    )
    one = reads.get("serial_nospec")
    checks["serial_one_token_at_most_30_us"] = (
        None if one is None else one["median_us"] <= SERIAL_ONE_TOKEN_MAX_US
    )
    rows = bench.get("rows", [])
    return {
        **verdict_head(bench, where, roles),
        "bounds": {
            "resident_min_share": RESIDENT_MIN_SHARE,
            "baseline_min_ratio": BASELINE_MIN_RATIO,
            "serial_max_share": SERIAL_MAX_SHARE,
            "serial_one_token_max_us": SERIAL_ONE_TOKEN_MAX_US,
        },
        "ready_within_150s": ready_within([s.get("ready_after_s") for s in servers.values()]),
        "launches": reads,
        "checks": checks,
        "speed": {r: speed(rows, r, roles[r]) for r in SPEED if r in roles},
    }


def main(argv: Sequence[str] | None = None) -> int:
    return cli(argv, __doc__.split("\n\n")[0], "shared_stream_verdict", verdict, traces=True,
               roles=ROLES)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
