"""The fixture-free #24 mode probe read against its registration: do dummy-weight servers of
the rank shape draw the MoE up-projection's two modes?

Registered 2026-12-07 before it ran (docs/next-device-sessions.md, nineteenth session), on an
H100 with the tenth run's MoE config: a no-speculation baseline beside three 5/1/6 servers in
pairs (the plain one, ``nopdl``, ``fresh``), all ``--load-format dummy``. The fused MoE's grid
does not depend on the weights, so:

- the baseline's one-token up-projection (grid 128) is the trained launch exactly: cheap at
  <= 40 us a call or dear at >= 48 us (the trained baselines' 33.0 and 54.9), else "between";
- the verify up-projection (grid 544) reads fewer experts than a trained verify, so no trained
  bound applies: the three 5/1/6 servers compare with each other. The modes appear if the
  slowest over the fastest is >= 1.10, none if <= 1.05, "unclear" between;
- where they appear, a server is cheap within 5 % of the fastest, and ``fresh`` and ``nopdl``
  read as the server run's candidates (a) and (b);
- every server ready within 150 s.

The baseline's one-token binary (registers, shared memory) is recorded beside its time, for a
standalone ``moe_mode`` run of the same lease to compare with (added after the twenty-second
session's run, whose 5/1/6 servers did not start).

    python -m sglang_ext_tools.dummy_mode_verdict --bench speed.json --out verdict.json \
        [--role first=spec-5-1-6 nopdl=spec-5-1-6-nopdl fresh=spec-5-1-6-fresh]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sglang_ext_tools.server_mode_verdict import (
    candidate_reading,
    cli,
    mode,
    ready_within,
    traced_up,
    verdict_head,
)
from sglang_ext_tools.trace_breakdown import compiled_binaries

ONE_TOKEN_GRID = 128
VERIFY_GRID = 544
BASE_CHEAP_MAX_US = 40.0
BASE_DEAR_MIN_US = 48.0
MODES_MIN_SPREAD = 1.10
NO_MODES_MAX_SPREAD = 1.05
CHEAP_OF_FASTEST = 1.05


def verdict(bench: Mapping[str, Any], roles: Mapping[str, str], where: str) -> dict[str, Any]:
    servers = {s["name"]: s for s in bench.get("servers", [])}
    base = next((s for s in servers.values() if s.get("role") == "nospec"), None)
    base_us, base_binary = (
        traced_up(bench, base["name"], ONE_TOKEN_GRID, where) if base else (None, None)
    )
    spec = {}
    for role, name in roles.items():
        up, binary = traced_up(bench, name, VERIFY_GRID, where) if name in servers else (None, None)
        spec[role] = {
            "server": name,
            "ready_after_s": servers.get(name, {}).get("ready_after_s"),
            "up_us_per_call": up,
            "up_binary": binary,
        }
    read = {r: v["up_us_per_call"] for r, v in spec.items() if v["up_us_per_call"] is not None}
    spread = round(max(read.values()) / min(read.values()), 4) if len(read) >= 2 else None
    if spread is None:
        modes = "unread"
    elif spread >= MODES_MIN_SPREAD:
        modes = "modes appear"
    elif spread <= NO_MODES_MAX_SPREAD:
        modes = "no modes"
    else:
        modes = "unclear"
    if modes == "modes appear":
        fastest = min(read.values())
        cheap = {r: us <= fastest * CHEAP_OF_FASTEST for r, us in read.items()}
        for role in spec:
            spec[role]["cheap"] = cheap.get(role)
        reading = candidate_reading(cheap.get("fresh"), cheap.get("nopdl"))
    else:
        reading = f"no reading of the candidates: {modes} among the 5/1/6 servers"
    binaries = set(compiled_binaries(v["up_binary"] for v in spec.values()))
    ready = [s.get("ready_after_s") for s in servers.values()]
    return {
        **verdict_head(bench, where, roles),
        "bounds": {
            "one_token_grid": ONE_TOKEN_GRID,
            "verify_grid": VERIFY_GRID,
            "baseline_cheap_max_us": BASE_CHEAP_MAX_US,
            "baseline_dear_min_us": BASE_DEAR_MIN_US,
            "modes_min_spread": MODES_MIN_SPREAD,
            "no_modes_max_spread": NO_MODES_MAX_SPREAD,
            "cheap_of_fastest": CHEAP_OF_FASTEST,
        },
        "baseline": {
            "server": base["name"] if base else None,
            "up_us_per_call": base_us,
            "mode": mode(base_us, BASE_CHEAP_MAX_US, BASE_DEAR_MIN_US),
            "up_binary": base_binary,
        },
        "servers": spec,
        "verify_spread": spread,
        "modes": modes,
        "reading": reading,
        "one_up_binary": len(binaries) == 1 if binaries else None,
        "ready_within_150s": ready_within(ready),
    }


def main(argv: Sequence[str] | None = None) -> int:
    return cli(argv, __doc__.split("\n\n")[0], "dummy_mode_verdict", verdict, cycle_fit=False)


if __name__ == "__main__":
    raise SystemExit(main())
