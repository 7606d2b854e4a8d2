"""The H100 run of ``SGLANG_EXT_MOE_SHARED_STREAM=join`` at batches 1, 4 and 16 with trained
routing read against its registration: is ``join`` for every batch, and where does the trained
``join`` 3/1/4 cycle spend the 0.79 ms by which it misses #24's bar?

Registered 2026-12-07 (twenty-seventh session) before it ran (docs/next-device-sessions.md, its
H100 branch): ``seed-shape-start --settings 3,1,4 --batches 1 4 16 --rounds 3 --profile`` with
``join@3,1,4`` and ``join@nospec``, three pairs with the stock baseline (``nospec`` beside
``spec-3-1-4``, ``spec-3-1-4-join``, ``nospec-join``), so every figure is each server over its
own group's baseline:

- batch 1: ``join`` 3/1/4 over plain 3/1/4 (the row's ``vs_setting``, prompts paired) 1.03-1.13
  (point 1.07); ``join@nospec`` over stock after the first token (``decode_speedup``, read as
  ``trained_join_verdict``'s H100 table reads it) 1.08-1.22 (1.15);
- batch 4: ``join@nospec`` over stock (the row's ``speedup``, rounds paired) 1.04-1.16 (1.10);
  ``join`` 3/1/4 over plain 3/1/4 (``vs_setting``: across groups, the ratio of the two rows'
  speedups, no interval) 0.98-1.10 (1.04);
- batch 16: ``join@nospec`` 0.97-1.07 (1.01); ``join`` over plain 0.95-1.06 (1.00);
- where ``join@nospec``'s interval at a batch lies wholly below 1.00, ``join`` is not for that
  batch (``join_for_batch``; the same rule at batch 1, on the figure read there);
- the profiled ``join`` 3/1/4 cycle (the bench's ``profiles``: one batch-1 request under the
  profiler, whole cycles, ``trace_breakdown.steady_breakdown``): the drafter's graph kernels
  0.50-0.75 ms a cycle and the GPU idle before the drafter's graphs 0.2-0.6 ms. No point was
  registered for these two: the eighth run's plain 3/1/4 on this card (0.600 and 0.406 ms,
  ``seed-shape-2026-12-06-traced-…-bench.json``) stands as the point, since the drafter is the
  same layer and ``join`` touches only the target.

What the profile decides (``decision``): #24's bar needs the cycle at <= 9.77 ms, 0.79 ms under
the 10.56 ms the trained ``join`` 3/1/4 cycle measured. If the drafter's kernels and the idle
before them together exceed 0.79 ms, cutting that gap (the drafter's launches and the host work
between the verify and the drafter) is the next step to predict and try; if not, the bar is out
of reach at this shape short of a cheaper target verify. Readings as
``shared_stream_verdict.against``. A server, batch or profile the run lacks is named, with the
file, rather than read as unread; a server that did not come up reads "unread".

    python -m sglang_ext_tools.batch_join_verdict --bench B.json [--out verdict.json]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sglang_ext_tools.bench_shape import is_number
from sglang_ext_tools.server_mode_verdict import cli, verdict_head
from sglang_ext_tools.shared_stream_verdict import against, ready

CARD = "H100"
ROLES = {
    "baseline": "nospec",
    "plain": "spec-3-1-4",
    "join": "spec-3-1-4-join",
    "join_nospec": "nospec-join",
}
# name: (batch, row figure, role read, (low, high, point))
REGISTERED = {
    "join_over_plain_b1": (1, "vs_setting", "join", (1.03, 1.13, 1.07)),
    "join_nospec_over_stock_decode_b1": (1, "decode_speedup", "join_nospec", (1.08, 1.22, 1.15)),
    "join_nospec_over_stock_b4": (4, "speedup", "join_nospec", (1.04, 1.16, 1.10)),
    "join_over_plain_b4": (4, "vs_setting", "join", (0.98, 1.10, 1.04)),
    "join_nospec_over_stock_b16": (16, "speedup", "join_nospec", (0.97, 1.07, 1.01)),
    "join_over_plain_b16": (16, "vs_setting", "join", (0.95, 1.06, 1.00)),
}
# name: (where in profiles[join], (low, high, point)); the points are the eighth run's
PROFILED = {
    "join_drafter_kernels_ms": (
        ("steady", "per_cycle_ms", "drafter_graph_kernels"),
        (0.50, 0.75, 0.600),
    ),
    "join_idle_before_drafter_ms": (
        ("steady", "gpu_idle_before_ms", "drafter_graph"),
        (0.2, 0.6, 0.406),
    ),
}
# where a row says how its interval was drawn (bench_speed.build_rows, vs_setting_across_groups)
METHOD = {"speedup": "speedup_ci_method", "vs_setting": "vs_setting_method"}
CYCLE_MS = 10.56  # cycle_fit's trained join 3/1/4 (seed-shape-2026-12-07-trained-join-314-…)
CYCLE_BAR_MS = 9.77  # #24's η >= 0.82 at that τ: 1.22 of its group's stock decode steps
# as registered, from the rounded figures; unrounded it is 0.783 (10.555 - 8.013 / 0.82): a
# sum of drafter kernels and idle between the two is decided by the registered gap, and flagged
GAP_MS = round(CYCLE_MS - CYCLE_BAR_MS, 2)
GAP_UNROUNDED_MS = 0.783


def h100(bench: Mapping[str, Any], where: str) -> None:
    """The registered table is the H100's: a run on another GPU is refused by name."""
    gpu = str(bench.get("gpu") or "")
    if CARD not in gpu:
        raise ValueError(
            f"{where}: ran on {gpu!r}; this table was registered for an {CARD} (an H200 run of "
            "the twenty-seventh session is trained_join_verdict's)"
        )


def row_at(bench: Mapping[str, Any], server: str, batch: int, where: str) -> Mapping[str, Any]:
    """``server``'s bench row at ``batch``; a batch the run did not serve is named."""
    for row in bench.get("rows", []):
        if row.get("server") == server and row.get("batch") == batch:
            return row
    raise ValueError(
        f"{where}: no row of {server} at batch {batch} (the run's batches: "
        f"{bench.get('batches')}); the registered run serves --batches 1 4 16"
    )


def reading(
    bench: Mapping[str, Any], roles: Mapping[str, str], name: str, where: str
) -> dict[str, Any]:
    """One registered row figure: its value, interval, how the interval was drawn, and where it
    lies against its range."""
    batch, field, role, bounds = REGISTERED[name]
    row = row_at(bench, roles[role], batch, where)
    # the row's figure and its interval, as trained_join_verdict reads them at batch 1
    point, ci = row.get(field), row.get(f"{field}_ci95")
    return {
        "batch": batch,
        "figure": field,
        "server": roles[role],
        "value": point,
        "ci95": ci,
        # how the row says it was drawn: at batch 4 or 16 vs_setting across groups is the
        # ratio of two rows' speedups (bench_speed.VS_SETTING_ACROSS_RATIO, no interval)
        **({"method": row[METHOD[field]]} if row.get(METHOD.get(field, "")) else {}),
        **against(point, ci, bounds),
    }


def profiled(
    bench: Mapping[str, Any], server: str, served: bool, where: str
) -> dict[str, dict[str, Any]]:
    """The profiled cycle's two registered figures; unread where ``server`` did not serve. A
    run without profiles, or without this server's, or a profile without whole cycles, is
    named."""
    values: dict[str, float | None] = dict.fromkeys(PROFILED)
    if served:
        profiles = bench.get("profiles")
        if not profiles:
            raise ValueError(f"{where}: no profiles; the registered run was started with --profile")
        if server not in profiles:
            raise ValueError(f"{where}: profiles has no {server} (profiled: {sorted(profiles)})")
        for name, (keys, _) in PROFILED.items():
            value: Any = profiles[server]
            for key in keys:
                value = value.get(key) if isinstance(value, Mapping) else None
            if value is None:
                raise ValueError(
                    f"{where}: profiles[{server}] has no {'.'.join(keys)} (whole cycles need "
                    "two target graphs in the trace: trace_breakdown.steady_breakdown)"
                )
            if not is_number(value):
                raise ValueError(
                    f"{where}: profiles[{server}].{'.'.join(keys)}: expected ms, a number; "
                    f"found {type(value).__name__} {value!r}"
                )
            values[name] = value
    return {
        name: {"server": server, "value": values[name], **against(values[name], None, bounds)}
        for name, (_, bounds) in PROFILED.items()
    }


def decision(drafter_ms: float | None, idle_ms: float | None) -> dict[str, Any]:
    """What the profiled split decides for #24: cut the gap before the drafter, or the bar is
    out of reach at this shape short of a cheaper target verify."""
    head = {"cycle_ms": CYCLE_MS, "cycle_bar_ms": CYCLE_BAR_MS, "gap_ms": GAP_MS}
    if drafter_ms is None or idle_ms is None:
        return {**head, "drafter_and_idle_ms": None, "cut_the_gap": None,
                "reasoning": "unread: the join 3/1/4 server did not serve its profile"}  # fmt: skip
    both = round(drafter_ms + idle_ms, 4)
    cut = both > GAP_MS
    hair = (
        f" (between the unrounded gap, {GAP_UNROUNDED_MS} ms, and the registered one: a hair's "
        "decision)"
        if GAP_UNROUNDED_MS < both <= GAP_MS
        else ""
    )
    alone = (
        "the drafter's kernels alone are not over it: a faster drafter cannot close it by itself"
        if drafter_ms <= GAP_MS
        else "the drafter's kernels alone exceed it"
    )
    split = (
        f"the drafter's graph kernels ({drafter_ms:.3f} ms a cycle) and the GPU idle before "
        f"them ({idle_ms:.3f} ms) add to {both:.3f} ms{hair}"
    )
    if cut:
        reasoning = (
            f"{split}, over the {GAP_MS} ms by which the {CYCLE_MS} ms cycle misses #24's bar "
            f"({CYCLE_BAR_MS} ms); {alone}: cutting that gap (the drafter's launches and the "
            "host work between the verify and the drafter) is the next step to predict and try"
        )
    else:
        reasoning = (
            f"{split}, not over the {GAP_MS} ms by which the {CYCLE_MS} ms cycle misses #24's "
            f"bar ({CYCLE_BAR_MS} ms): removing both would not take the cycle under it, so the bar "
            "is out of reach at this shape short of a cheaper target verify (#24's note says "
            "so, with this split)"
        )
    return {**head, "drafter_and_idle_ms": both, "cut_the_gap": cut, "reasoning": reasoning}


def verdict(bench: Mapping[str, Any], roles: Mapping[str, str], where: str) -> dict[str, Any]:
    h100(bench, where)
    servers = {s["name"]: s for s in bench.get("servers", [])}
    # the short form (--settings none; registered by the twenty-ninth session) serves no plain
    # chain: what reads against it is unread, the rest as registered
    short_form = roles["plain"] not in servers
    absent = [
        f"{role}={name}" for role, name in roles.items()
        if name not in servers and role != "plain"
    ]  # fmt: skip
    if absent:
        raise ValueError(
            f"{where}: no server {', '.join(absent)} (served: {sorted(servers)}); the registered "
            "run serves join@3,1,4 and join@nospec beside plain 3/1/4 (--role ROLE=SERVER)"
        )
    ran = ready(servers)
    readings = {name: reading(bench, roles, name, where) for name in REGISTERED}
    if short_form:
        for name, (_, field, _, _) in REGISTERED.items():
            if field == "vs_setting":
                readings[name] |= {"reading": "unread", "why": "no plain server (--settings none)"}
    readings |= profiled(bench, roles["join"], roles["join"] in ran, where)
    # whether join is for each batch, from join@nospec's interval there (None: no interval)
    join_for_batch = {}
    for name, (batch, _, role, _) in REGISTERED.items():
        if role == "join_nospec":
            ci = readings[name]["ci95"]
            join_for_batch[str(batch)] = None if not ci else not ci[1] < 1.0
    not_run = [role for role, name in roles.items() if name not in ran and name in servers]
    return {
        **verdict_head(bench, where, roles),
        "sglang_version": bench.get("sglang_version"),
        "sglang_ext_version": bench.get("sglang_ext_version"),
        "card": CARD,
        **({"not_run": not_run} if not_run else {}),
        **({"short_form": True} if short_form else {}),
        "readings": readings,
        "join_for_batch": join_for_batch,
        "decision": decision(
            readings["join_drafter_kernels_ms"]["value"],
            readings["join_idle_before_drafter_ms"]["value"],
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    return cli(argv, __doc__.split("\n\n")[0], "batch_join_verdict", verdict, roles=ROLES)


if __name__ == "__main__":
    raise SystemExit(main())
