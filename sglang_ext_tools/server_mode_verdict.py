"""The registered #24 server run read against its predictions: which server drew which mode.

The tenth seed-shape run's 5/1/6 servers drew the MoE up-projection at 6 tokens (launch grid
544) in two modes on an H100, 68.6 us a call (cheap, cycle 11.84 ms) and 82.2 us (dear,
12.86 ms). The standalone probe found neither a fresh compile nor PDL dear outside a server.
The server run registered before it ran (docs/next-device-sessions.md, the
seventeenth session's amendment) serves three 5/1/6 servers in start order beside a no-speculation
baseline: the first pair's plain 5/1/6, ``nopdl`` (Triton MoE launched without PDL, warm
caches) and ``fresh`` (empty caches of its own: it compiles every kernel in its process).
Registered, on an H100:

- every server ready within 150 s; tau within 2 % of 2.885 on all three;
- caches set the mode (a): ``fresh`` cheap, its up-projection <= 72 us, cycle <= 12.1 ms;
- the early launch sets it (b): ``nopdl`` up-projection <= 72 us, cycle <= 11.84 + 0.35 ms;
- both cheap: both readings stay open (next run swaps the order); both dear: neither.

A server's mode is read from its trace's ``kernel_grids`` (``fused_moe_kernel`` at the
up-projection's grid, us per cycle over calls per cycle); its cycle from ``cycle_fit``.

    python -m sglang_ext_tools.server_mode_verdict --bench B.json --cycle-fit C.json \
        --out verdict.json [--role first=spec-5-1-6 nopdl=spec-5-1-6-nopdl ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext_tools.bench_shape import bench_shape, found
from sglang_ext_tools.json_out import emit

# the up-projection's cheap and dear bounds are the standalone probe's registration's
from sglang_ext_tools.moe_mode_verdict import CHEAP_MAX_US, DEAR_MIN_US
from sglang_ext_tools.trace_breakdown import BINARY_KEYS, compiled_binaries

# the rest of the registered bounds (H100, 5/1/6, the tenth run's MoE config)
UP_GRID = 544  # the up-projection's launch grid at 6 tokens
READY_MAX_S = 150.0
TAU_REF = 2.885
TAU_TOL = 0.02
CHEAP_CYCLE_MS = 11.84
FRESH_CYCLE_MAX_MS = 12.1
NOPDL_CYCLE_MAX_MS = CHEAP_CYCLE_MS + 0.35
DEFAULT_ROLES = {"first": "spec-5-1-6", "nopdl": "spec-5-1-6-nopdl", "fresh": "spec-5-1-6-fresh"}


def mode(
    up_us: float | None, cheap_max: float = CHEAP_MAX_US, dear_min: float = DEAR_MIN_US
) -> str:
    """'cheap', 'dear', 'between' (neither bound) or 'unread' (no trace); the bounds default to
    the verify up-projection's at grid 544."""
    if up_us is None:
        return "unread"
    if up_us <= cheap_max:
        return "cheap"
    return "dear" if up_us >= dear_min else "between"


def up_projection(profile: Mapping[str, Any], grid: int, where: str) -> dict[str, Any] | None:
    """``fused_moe_kernel`` at launch grid ``grid`` in the target graph: us a call, and the
    compiled binary's registers, shared memory and achieved occupancy where traced."""
    entries = profile.get("kernel_grids", {}).get("target_graph", {}).get("fused_moe_kernel")
    if not entries:
        return None
    for e in entries:
        if e["grid"][0] == grid:
            if not e.get("calls_per_cycle"):
                raise ValueError(f"{where}: fused_moe_kernel grid {grid}: calls_per_cycle 0")
            us = round(e["us_per_cycle"] / e["calls_per_cycle"], 2)
            return {"us_per_call": us, **{k: e[k] for k in BINARY_KEYS if k in e}}
    found = sorted(e["grid"][0] for e in entries)
    raise ValueError(f"{where}: fused_moe_kernel has no grid {grid} (found {found})")


def traced_up(
    bench: Mapping[str, Any], name: str, grid: int, where: str
) -> tuple[float | None, dict[str, Any] | None]:
    """A server's up-projection at ``grid`` from its profile in ``bench``: (us a call, its
    binary's args or None); (None, None) where the server was not traced."""
    profile = (bench.get("profiles") or {}).get(name)
    kernel = up_projection(profile, grid, f"{where}: profiles[{name}]") if profile else None
    if not kernel:
        return None, None
    return kernel.pop("us_per_call"), kernel or None


def server_rows(bench: Mapping[str, Any], fit: Mapping[str, Any], where: str) -> dict[str, dict]:
    """Per speculative server: start group, ready time, tau, cycle and up-projection."""
    groups = {name: i for i, g in enumerate(bench.get("groups") or []) for name in g}
    rows_by = {r.get("server"): r for r in bench.get("rows", []) if r.get("server")}
    cycles = fit.get("servers", {})
    out = {}
    for s in bench.get("servers", []):
        if s.get("role") not in ("spec", "variant"):
            continue
        name = s["name"]
        row, cyc = rows_by.get(name, {}), cycles.get(name, {})
        up, binary = traced_up(bench, name, UP_GRID, where)
        out[name] = {
            "group": groups.get(name),
            "status": s.get("status"),
            "ready_after_s": s.get("ready_after_s"),
            "tau": row.get("tau"),
            "speedup": row.get("speedup"),
            "speedup_ci95": row.get("speedup_ci95"),
            "ms_per_cycle": cyc.get("ms_per_cycle"),
            "ms_per_cycle_ci95": cyc.get("ms_per_cycle_ci95"),
            "up_us_per_call": up,
            "up_binary": binary,
            "mode": mode(up),
        }
    return out


def _cheap(row: Mapping[str, Any] | None, cycle_max: float) -> bool | None:
    """True/False where the server was traced and timed; None where it was not."""
    if not row or row["up_us_per_call"] is None or row["ms_per_cycle"] is None:
        return None
    return row["mode"] == "cheap" and row["ms_per_cycle"] <= cycle_max


def candidate_reading(fresh: bool | None, nopdl: bool | None) -> str:
    """Which registered candidate holds, from whether ``fresh`` and ``nopdl`` were cheap."""
    if fresh is None or nopdl is None:
        return "not separable: a server was not traced or not timed"
    if fresh and nopdl:
        return "both cheap: both readings stay open (next: swapped start order)"
    if fresh:
        return "(a) caches set the mode"
    if nopdl:
        return "(b) the early PDL launch sets the mode"
    return "neither: both dear"


def verdict_head(
    bench: Mapping[str, Any], where: str, roles: Mapping[str, str]
) -> dict[str, Any]:
    """What every mode verdict opens with: the run's GPU (name and UUID), its bench file and
    the server each role was read from."""
    return {
        "gpu": bench.get("gpu"),
        "gpu_uuid": (bench.get("gpu_info") or {}).get("uuid"),
        "bench": where,
        "roles": dict(roles),
    }


def ready_within(ready_s: Sequence[float | None]) -> bool:
    """Every server, the baseline too, ready within the registered 150 s."""
    return bool(ready_s) and all(r is not None and r <= READY_MAX_S for r in ready_s)


def verdict(
    bench: Mapping[str, Any], fit: Mapping[str, Any], roles: Mapping[str, str], where: str
) -> dict[str, Any]:
    servers = server_rows(bench, fit, where)
    missing = [f"{r}={n}" for r, n in roles.items() if n not in servers]
    by_role = {r: servers.get(n) for r, n in roles.items()}
    # every server of the run, the baseline too, as registered
    ready = [s.get("ready_after_s") for s in bench.get("servers", [])]
    taus = [s["tau"] for s in servers.values()]
    known = [t for t in taus if t]
    fresh = _cheap(by_role.get("fresh"), FRESH_CYCLE_MAX_MS)
    nopdl = _cheap(by_role.get("nopdl"), NOPDL_CYCLE_MAX_MS)
    first = by_role.get("first")
    binaries = compiled_binaries(s["up_binary"] for s in servers.values())
    return {
        **verdict_head(bench, where, roles),
        "missing_roles": missing,
        "servers": servers,
        "bounds": {
            "cheap_max_us": CHEAP_MAX_US,
            "dear_min_us": DEAR_MIN_US,
            "up_grid": UP_GRID,
            "fresh_cycle_max_ms": FRESH_CYCLE_MAX_MS,
            "nopdl_cycle_max_ms": NOPDL_CYCLE_MAX_MS,
        },
        "ready_within_150s": ready_within(ready),
        "tau_within_2pct": bool(taus)
        and all(t is not None and abs(t / TAU_REF - 1) <= TAU_TOL for t in taus),
        # the servers against each other (one set of models: a fresh build's tau is its own)
        "tau_spread": round(max(known) / min(known), 4) if known else None,
        "fresh_cheap": fresh,
        "nopdl_cheap": nopdl,
        "first_mode": first["mode"] if first else None,
        # one compiled up-projection in every server (registers and shared memory alike), or
        # several; None where the traces did not record them
        "one_up_binary": len(set(binaries)) == 1 if len(binaries) == len(servers) > 0 else None,
        "reading": candidate_reading(fresh, nopdl),
    }


def parse_roles(
    items: Sequence[str], defaults: Mapping[str, str] = DEFAULT_ROLES
) -> dict[str, str]:
    """``defaults`` (role: server) with each ``ROLE=SERVER`` of ``items`` in its place."""
    roles = dict(defaults)
    for item in items:
        role, sep, name = item.partition("=")
        if not sep or role not in defaults or not name:
            known = tuple(defaults)
            raise ValueError(f"--role {item!r}: expected ROLE=SERVER, ROLE one of {known}")
        roles[role] = name
    return roles


def cli(
    argv: Sequence[str] | None,
    description: str,
    name: str,
    read: Callable[..., dict[str, Any]],
    *,
    cycle_fit: bool = False,
    traces: bool = False,
    roles: Mapping[str, str] = DEFAULT_ROLES,
    folder: tuple[str, str] = ("--traces", "a folder of SERVER.trace.json.gz"),
) -> int:
    """The command line of a mode verdict: ``--bench`` (and ``--cycle-fit`` where the reading
    needs cycles, ``--traces`` where it reads the servers' slim traces: ``folder`` names that
    folder's flag and help), ``--role`` (over ``roles``), ``--out`` never written over; exit
    2 naming a file it cannot read, one not shaped as its tool writes it (``bench_shape``),
    or a cycle fit made on another bench. ``read(bench, [fit,] [folder,] roles, where)`` makes
    the verdict."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--bench", required=True, help="bench_speed's JSON (with --profile)")
    if cycle_fit:
        p.add_argument("--cycle-fit", required=True, help="cycle_fit's JSON on that bench")
    if traces:
        p.add_argument(folder[0], dest="folder", required=True, help=folder[1])
    p.add_argument("--role", nargs="*", default=[], help=f"ROLE=SERVER ({', '.join(roles)})")
    p.add_argument("--out", help="write the verdict here too (never over an existing file)")
    args = p.parse_args(argv)
    if args.out and Path(args.out).exists():
        p.error(f"--out {args.out}: exists; not overwriting it")
    try:
        named = parse_roles(args.role, roles)
        bench_name = Path(args.bench).name
        bench = json.loads(Path(args.bench).read_text())
        bench_shape(bench, bench_name)
        fit = (json.loads(Path(args.cycle_fit).read_text()),) if cycle_fit else ()
        if fit and not isinstance(fit[0], Mapping):
            raise ValueError(
                f"{args.cycle_fit}: expected a JSON object (cycle_fit's --out), found "
                f"{found(fit[0])}"
            )
        of = fit[0].get("bench") if fit else None
        if of is not None and of != bench_name:
            raise ValueError(
                f"--cycle-fit {args.cycle_fit}: a fit of {of}, not of --bench {bench_name}"
            )
        where = (Path(args.folder),) if traces else ()
        result = read(bench, *fit, *where, named, bench_name)
    except (OSError, ValueError, KeyError) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    return emit(result, Path(args.out) if args.out else None)


def main(argv: Sequence[str] | None = None) -> int:
    return cli(argv, __doc__.split("\n\n")[0], "server_mode_verdict", verdict, cycle_fit=True)


if __name__ == "__main__":
    raise SystemExit(main())
