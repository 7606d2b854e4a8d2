"""The stream-priority run read against its registration: does giving the shared expert its own
stream of the highest priority (``SGLANG_EXT_MOE_SHARED_STREAM=high``) make every decode step
run the MoE up-projection cheap, and hide the shared expert that the serial switch pays for?

Registered 2026-12-07 (twenty-third session) before it ran (docs/next-device-sessions.md), on
an H100 with dummy weights at the seed's rank shape, every server beside a stock no-speculation
baseline: plain 3/1/4, ``high`` 3/1/4, ``high@nospec``, ``serial@nospec``, ``serial`` 3/1/4.
The reasoning: the same session's traces split the dear mode into stretches of whole steps
(``moe_regimes``); in a cheap step the shared expert's kernels had finished 11 µs before the
routed up-projection launched, in a dear one its last GEMM began 0.8 µs before it. A cheap step
took 6.8 ms, a dear one 8.6, the serial server's 7.6. If the priority is honored, the shared
expert's branch is dispatched first at every fork, and every step is a cheap one.

- every server ready within 150 s;
- the ``high`` servers: every regime's up-projection median at most ``CHEAP_FACTOR`` times the
  serial server's at the same grid (no dear step), and without speculation a step period at most
  ``HIDDEN_FACTOR`` times the serial one's (the shared expert hidden, not run in series);
- speed, each with its paired interval: ``high@nospec`` over ``serial@nospec`` 1.05-1.14 (point
  1.10); ``high`` 3/1/4 over ``serial`` 3/1/4 1.03-1.12 (1.07); ``high`` 3/1/4 over plain 3/1/4
  1.15-1.30 (1.22); ``high`` 3/1/4 over ``high@nospec`` (its ``speedup_same_switch``: the
  zero-acceptance η ceiling over the fastest baseline) 0.78-0.86 (0.82). ``high@nospec`` over the
  stock baseline is recorded, not bounded: the baseline's own mix of cheap and dear stretches
  decides it.

Readings as in ``shared_stream_verdict.place``: "within", "above", "below", "point outside".

    python -m sglang_ext_tools.stream_priority_verdict --bench speed.json --traces DIR \
        [--out verdict.json]

``DIR`` holds ``SERVER.trace.json.gz`` per server (the pipeline's ``slim-traces.tgz`` or
``moe-traces.tgz``, unpacked); ``server-SERVER.log`` beside them (``server-logs.tgz``) adds what
each switched server's log says it changed (``read_log``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext_tools.bench_speed import over_own_baselines, server_groups
from sglang_ext_tools.moe_regimes import load_trace, regimes
from sglang_ext_tools.server_mode_verdict import cli, ready_within, verdict_head
from sglang_ext_tools.shared_stream_verdict import against, batch1_row, ready, served

KERNEL = "fused_moe_kernel"
ROLES = {
    "baseline": "nospec",
    "plain": "spec-3-1-4",
    "high": "spec-3-1-4-high",
    "high_nospec": "nospec-high",
    "serial_nospec": "nospec-serial",
    "serial": "spec-3-1-4-serial",
}
CHEAP_FACTOR = 1.15
HIDDEN_FACTOR = 0.95
# name: (numerator role, denominator role), (low, high, point); None: recorded, not bounded
SPEED = {
    "high_nospec_over_serial_nospec": (("high_nospec", "serial_nospec"), (1.05, 1.14, 1.10)),
    "high_over_serial": (("high", "serial"), (1.03, 1.12, 1.07)),
    "high_over_plain": (("high", "plain"), (1.15, 1.30, 1.22)),
    "high_over_high_nospec": (("high", "high_nospec"), (0.78, 0.86, 0.82)),
    "high_nospec_over_baseline": (("high_nospec", "baseline"), None),
}


def read_regimes(traces: Path, server: str) -> dict[str, Any] | None:
    """``moe_regimes`` on SERVER's trace at its up-projection's grid; None without a trace."""
    path = traces / f"{server}.trace.json.gz"
    if not path.is_file():
        return None
    try:
        trace = load_trace(path)
        return regimes(trace, KERNEL)  # at the up-projection's grid
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


LAYERS_LINE = re.compile(r"sglang_ext: (\d+) MoE layers of \S+ (.*)\(SGLANG_EXT_MOE_SHARED_STREAM=")
FORKS_LINE = re.compile(r"sglang_ext: (\d+) shared-expert forks captured")
MOE_LAYERS = 60  # the rank shape's: 61 layers, the first dense


def read_log(traces: Path, server: str) -> dict[str, Any] | None:
    """What SERVER's log (``server-SERVER.log`` beside the traces: the pipeline's
    ``server-logs.tgz`` unpacked into the same folder) says the switch did: the MoE layers it
    changed and, for =join, the forks its CUDA graphs captured; None without a log."""
    path = traces / f"server-{server}.log"
    if not path.is_file():
        return None
    text = path.read_text(errors="replace")
    layers = [int(m.group(1)) for m in LAYERS_LINE.finditer(text)]
    forks = [int(m.group(1)) for m in FORKS_LINE.finditer(text)]
    return {"moe_layers": layers[-1] if layers else None, "forks": forks[-1] if forks else None}


def log_checks(
    logs: Mapping[str, Mapping[str, Any] | None], forking: Sequence[str] | None
) -> dict[str, bool | None]:
    """What the served servers' logs (``read_log`` by role; None: no log) say, where any was
    unpacked ({} where none was): every one names ``MOE_LAYERS`` MoE layers, and, with
    ``forking`` (the roles that ran ``=join``), each of those among them captured its forks
    (None where none of them served)."""
    if not any(logs.values()):
        return {}
    out: dict[str, bool | None] = {
        "logs_name_every_moe_layer": all(
            (log or {}).get("moe_layers") == MOE_LAYERS for log in logs.values()
        )
    }
    if forking is not None:
        forked = [logs[r] for r in forking if r in logs]
        out["join_forks_captured"] = (
            all(((log or {}).get("forks") or 0) > 0 for log in forked) if forked else None
        )
    return out


def ratio(
    bench: Mapping[str, Any], first: str, second: str
) -> tuple[float | None, list[float] | None]:
    """first's speed over second's at batch 1, each over its own group's baseline (the stock
    baseline itself: its own speedup, 1)."""
    group_of = server_groups(bench.get("groups") or [])
    ms = bench.get("measurements", [])
    if second == "nospec":
        row = batch1_row(bench.get("rows", []), first) or {}
        return row.get("speedup"), row.get("speedup_ci95")
    if first not in group_of or second not in group_of:
        return None, None
    return over_own_baselines(ms, (first, group_of[first]), (second, group_of[second]))


def _cheap(read: Mapping[str, Any] | None, serial: Mapping[str, Any] | None) -> bool | None:
    if read is None or serial is None or read["grid"] != serial["grid"]:
        return None
    clear = max(r["kernel_median_us"] for r in serial["regimes"].values())
    return all(r["kernel_median_us"] <= CHEAP_FACTOR * clear for r in read["regimes"].values())


def _slowest(read: Mapping[str, Any] | None, key: str) -> float | None:
    """The slowest regime's ``key``: its median step period (a server hides the shared expert
    only where every stretch of its steps does) or its median MoE span (recorded beside the
    period: a step the host held up has a period longer than its GPU work, the span does not)."""
    if read is None:
        return None
    values = [r.get(key) for r in read["regimes"].values()]
    return max((v for v in values if v is not None), default=None)


def verdict_for(label: str, table: Mapping[str, Any]):
    """The reading of a run that sets a shared-stream candidate (roles ``LABEL`` at 3/1/4 and
    ``LABEL_nospec``) against the serial switch and SGLang's stream, with ``table``'s registered
    ratios (as ``SPEED``)."""
    nospec = f"{label}_nospec"

    def read(
        bench: Mapping[str, Any], traces: Path, roles: Mapping[str, str], where: str
    ) -> dict[str, Any]:
        servers = served(bench, traces)
        reads = {r: read_regimes(traces, n) if n in servers else None for r, n in roles.items()}
        period, serial_period = (
            _slowest(reads[r], "step_period_median_ms") for r in (nospec, "serial_nospec")
        )
        checks = {
            f"{nospec}_no_dear_step": _cheap(reads[nospec], reads["serial_nospec"]),
            f"{label}_verify_no_dear_step": _cheap(reads[label], reads["serial"]),
            f"{nospec}_hides_the_shared_expert": None
            if period is None or serial_period is None
            else period <= HIDDEN_FACTOR * serial_period,
        }
        speed = {}
        for name, ((a, b), bounds) in table.items():
            point, ci = ratio(bench, roles[a], roles[b])
            speed[name] = {
                "servers": [roles[a], roles[b]],
                "ratio": point,
                "ci95": ci,
                **against(point, ci, bounds),
            }
        # a server the bench's limit stopped before it served is read as not run
        ran = ready(servers)
        not_run = [r for r, n in roles.items() if n not in ran]
        switched = (label, nospec, "serial", "serial_nospec")
        logs = {r: read_log(traces, roles[r]) for r in switched if roles.get(r) in ran}
        checks |= log_checks(logs, (label, nospec) if label == "join" else None)
        return {
            **verdict_head(bench, where, roles),
            "bounds": {"cheap_factor": CHEAP_FACTOR, "hidden_factor": HIDDEN_FACTOR},
            "ready_within_150s": ready_within([s.get("ready_after_s") for s in servers.values()]),
            **({"not_run": not_run} if not_run else {}),
            "regimes": reads,
            "step_period_ms": {nospec: period, "serial_nospec": serial_period},
            "moe_span_ms": {
                r: _slowest(reads[r], "moe_span_median_ms") for r in (nospec, "serial_nospec")
            },
            **({"logs": logs} if any(logs.values()) else {}),
            "checks": checks,
            "speed": speed,
        }

    return read


verdict = verdict_for("high", SPEED)


def main(argv: Sequence[str] | None = None) -> int:
    return cli(argv, __doc__.split("\n\n")[0], "stream_priority_verdict", verdict, traces=True,
               roles=ROLES)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
