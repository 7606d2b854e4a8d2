"""The trained rank-shape run with ``SGLANG_EXT_MOE_SHARED_STREAM=join`` read against its
registration: with trained routing, where a verify's tokens fan out over the experts, does
``join`` keep the cheaper step it showed on dummy weights, and where does it put #24's η?

Registered before it runs (docs/next-device-sessions.md), one table per card, since the two
branches serve different servers and were predicted from different runs:

- an H200 (twenty-fifth session, three ranges amended in the twenty-sixth before any run):
  the trained pipeline's settings, the plugin/stock pair at 3/1/4 and ``join@nospec``,
  ``join`` 5/1/6 and ``join`` 3/4/5. ``join@nospec`` over the stock baseline 1.06-1.20;
  ``join`` 5/1/6 over plain 5/1/6 0.98-1.15; ``join`` 5/1/6's cycle in ``join@nospec``'s
  decode steps 1.30-1.62; its whole-request η over ``join@nospec`` (``eta_same_switch``, as
  the serial registration before it) 0.54-0.68; the seed's tree
  (``join`` 3/4/5) at a lower η than ``join`` 5/1/6; plugin over stock at 3/1/4 0.97-1.03;
- an H100 (twenty-sixth session): plain 5/1/6, ``join`` 5/1/6 and ``join@nospec``, three pairs
  with the baseline. ``join@nospec`` over the stock baseline after the first token
  1.08-1.22; ``join`` 5/1/6 over plain 5/1/6 0.98-1.13; ``join`` 5/1/6's cycle 11.4-12.3 ms
  (plain's cheap one: ``join`` makes every step the cheap mode, not cheaper), 1.52-1.78 of
  ``join@nospec``'s decode steps; its whole-request η over the stock baseline 0.62-0.72; its
  τ within 2 % of plain 5/1/6's.

On both: every ``join`` server's log names 60 MoE layers and the forks its CUDA graphs
captured, and #24's bar (η ≥ 0.82 over the stock baseline, the best chain row) is predicted
not met. A cycle comes from ``cycle_fit`` (the slope of a request's time after its first
token over its verify cycles, with its interval over prompts); in decode steps it is that over
``join@nospec``'s time per output token, taken as known (no interval of its own: the
interval is the slope's). Readings as ``shared_stream_verdict.against``.

    python -m sglang_ext_tools.trained_join_verdict --bench B.json --cycle-fit F.json \\
        --logs DIR [--out verdict.json]

``DIR`` is the run's ``-bench-server-logs.tgz`` unpacked (``server-SERVER.log``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext_tools.server_mode_verdict import cli, ready_within, verdict_head
from sglang_ext_tools.shared_stream_verdict import against, batch1_row, ready, served
from sglang_ext_tools.stream_priority_verdict import log_checks, read_log

ROLES = {
    "baseline": "nospec",
    "plain": "spec-5-1-6",
    "join": "spec-5-1-6-join",
    "join_nospec": "nospec-join",
    "tree_join": "spec-3-4-5-join",
}
ETA_BAR = 0.82  # issue #24's: the best chain row's η over no speculation
TAU_TOL = 0.02
# name: (figure, role read, (low, high, point)); None: recorded, not bounded
REGISTERED = {
    "H200": {
        "join_nospec_over_stock": ("speedup", "join_nospec", (1.06, 1.20, 1.13)),
        "join_over_plain": ("vs_setting", "join", (0.98, 1.15, 1.04)),
        "join_cycle_in_join_nospec_steps": ("cycle_steps", "join", (1.30, 1.62, 1.45)),
        "join_eta_same_switch": ("eta_same_switch", "join", (0.54, 0.68, 0.60)),
        "plugin_over_stock_314": ("plugin_vs_stock", None, (0.97, 1.03, 1.00)),
        "join_eta_over_stock": ("eta", "join", None),
    },
    "H100": {
        "join_nospec_over_stock_decode": ("decode_speedup", "join_nospec", (1.08, 1.22, 1.15)),
        "join_over_plain": ("vs_setting", "join", (0.98, 1.13, 1.05)),
        "join_cycle_ms": ("cycle_ms", "join", (11.4, 12.3, 11.84)),
        "join_cycle_in_join_nospec_steps": ("cycle_steps", "join", (1.52, 1.78, 1.65)),
        "join_eta_over_stock": ("eta", "join", (0.62, 0.72, 0.67)),
        "join_eta_same_switch": ("eta_same_switch", "join", None),
    },
}


def card(bench: Mapping[str, Any]) -> str:
    """The registration's card for the run's GPU; a GPU neither names is refused by name."""
    gpu = str(bench.get("gpu") or "")
    for name in REGISTERED:
        if name in gpu:
            return name
    raise ValueError(f"gpu {gpu!r}: no registration for it (expected one of {list(REGISTERED)})")


def _scaled(ci: Sequence[float] | None, by: float | None) -> list[float] | None:
    return [round(c / by, 4) for c in ci] if ci and by else None


def figure(
    bench: Mapping[str, Any], fit: Mapping[str, Any], roles: Mapping[str, str], name: str,
    role: str | None,
) -> tuple[float | None, list[float] | None]:  # fmt: skip
    """One registered figure and its interval; (None, None) where the run has no figure."""
    if name == "plugin_vs_stock":
        goals = bench.get("goals") or {}
        return goals.get(name), goals.get(f"{name}_ci95")
    row = batch1_row(bench.get("rows", []), roles[role]) or {}
    tau = row.get("tau")
    if name in ("eta", "eta_same_switch"):  # the speedup's interval over τ
        base = "speedup" if name == "eta" else "speedup_same_switch"
        return row.get(name), _scaled(row.get(f"{base}_ci95"), tau)
    if name in ("cycle_ms", "cycle_steps"):
        line = (fit.get("servers") or {}).get(roles[role]) or {}
        ms, ci = line.get("ms_per_cycle"), line.get("ms_per_cycle_ci95")
        if name == "cycle_ms" or ms is None:
            return ms, ci
        step = (batch1_row(bench.get("rows", []), roles["join_nospec"]) or {}).get("spec_tpot_ms")
        return (round(ms / step, 4), _scaled(ci, step)) if step else (None, None)
    return row.get(name), row.get(f"{name}_ci95")


def verdict(
    bench: Mapping[str, Any], fit: Mapping[str, Any], logs: Path, roles: Mapping[str, str],
    where: str,
) -> dict[str, Any]:  # fmt: skip
    which = card(bench)
    servers = served(bench, logs, "--logs")
    ran = ready(servers)
    readings = {}
    for name, (field, role, bounds) in REGISTERED[which].items():
        point, ci = figure(bench, fit, roles, field, role)
        readings[name] = {
            "figure": field,
            "server": roles[role] if role else "the plugin/stock pair",
            "value": point,
            "ci95": ci,
            **against(point, ci, bounds),
        }
    join, plain, tree = (
        batch1_row(bench.get("rows", []), roles[r]) or {} for r in ("join", "plain", "tree_join")
    )
    eta = join.get("eta")
    checks: dict[str, Any] = {"issue_24_eta_met": None if eta is None else eta >= ETA_BAR}
    if roles["tree_join"] in ran:  # the H200's: the seed's tree below the chain
        a, b = tree.get("eta_same_switch"), join.get("eta_same_switch")
        checks["tree_eta_below_chain"] = None if a is None or b is None else a < b
    if which == "H100":
        tj, tp = join.get("tau"), plain.get("tau")
        checks["tau_within_2pct_of_plain"] = (
            None if not tj or not tp else abs(tj / tp - 1) <= TAU_TOL
        )
    joined = ("join", "join_nospec", "tree_join")
    forked = {r: read_log(logs, roles[r]) for r in joined if roles[r] in ran}
    checks |= log_checks(forked, joined)
    not_run = [r for r, n in roles.items() if n not in ran]
    return {
        **verdict_head(bench, where, roles),
        "card": which,
        "cycle_fit_of": fit.get("bench"),  # the CLI refuses a fit of another bench
        "ready_within_150s": ready_within([s.get("ready_after_s") for s in servers.values()]),
        **({"not_run": not_run} if not_run else {}),
        **({"logs": forked} if any(forked.values()) else {}),
        "checks": checks,
        "readings": readings,
    }


def main(argv: Sequence[str] | None = None) -> int:
    logs = ("--logs", "the run's server logs (-bench-server-logs.tgz), unpacked")
    return cli(argv, __doc__.split("\n\n")[0], "trained_join_verdict", verdict, cycle_fit=True,
               traces=True, roles=ROLES, folder=logs)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
