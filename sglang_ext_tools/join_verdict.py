"""The join run read against its registration: does forking the shared expert and joining it
right before the routed up-projection (``SGLANG_EXT_MOE_SHARED_STREAM=join``) hide it behind the
router and the block alignment, with no step made dear?

Registered 2026-12-07 (twenty-fourth session) before it ran (docs/next-device-sessions.md), on
an H100 with dummy weights at the seed's rank shape, every server beside a stock no-speculation
baseline: plain 3/1/4, ``join`` 3/1/4, ``join@nospec``, ``serial@nospec``, ``serial`` 3/1/4 (the
twenty-fourth session's servers, ``high`` replaced by ``join``). The reasoning, from that
session's serial trace at one token a layer: the shared expert's four kernels take ~12.3 µs
(split-K GEMM, its reduce, the activation, the down GEMM); the router's GEMM, its top-k kernel
and the block alignment ~9 µs; the up-projection 26.9 µs. ``join`` runs the first two side by
side and the up-projection alone. Medians over the trace's 2,336 layers: the shared expert's
span 12.48 µs, the router's GEMM to the alignment's end 9.25 µs. ~7-8 µs a layer saved after
interference, 0.42-0.48 ms over 60 MoE layers of a 7.64 ms step (1.06-1.07); the cheap
dual-stream stretches, which ran this order by chance, took 6.81 ms a step (1.12), so the range
reaches that. The verify (four tokens) saves about the same per cycle of ~9.4 ms; the drafter
is untouched.

- every server ready within 150 s (first servers of a fresh node took 151-179 s on 2026-12-07:
  recorded, not a reading of the switch);
- the ``join`` servers: every regime's up-projection median at most ``CHEAP_FACTOR`` times the
  serial server's at the same grid (no dear step: the up-projection never launches beside the
  shared expert), and without speculation a step period at most ``HIDDEN_FACTOR`` times the
  serial one's;
- speed, each with its paired interval: ``join@nospec`` over ``serial@nospec`` 1.03-1.13
  (point 1.07); ``join`` 3/1/4 over ``serial`` 3/1/4 1.02-1.10 (1.05); ``join`` 3/1/4 over plain
  3/1/4 1.13-1.30 (1.20); ``join`` 3/1/4 over ``join@nospec`` (its ``speedup_same_switch``, the
  zero-acceptance η ceiling over the fastest baseline) 0.77-0.85 (0.81): the same saving on a
  shorter step raises the cycle's cost in steps a little. ``join@nospec`` over the stock
  baseline recorded, not bounded (the baseline's own mix of stretches decides it).

If the ``join`` servers show dear steps, the wait was not captured where it was issued (or the
up-projection's programmatic launch slipped past it), and serial stays the switch to serve.

    python -m sglang_ext_tools.join_verdict --bench speed.json --traces DIR [--out verdict.json]

``DIR`` holds ``SERVER.trace.json.gz`` per server (the pipeline's ``moe-traces.tgz``, unpacked),
and with ``server-logs.tgz`` unpacked into it too, the checks that every switched server's log
names 60 MoE layers and that both ``join`` servers' graphs captured their forks.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_ext_tools.server_mode_verdict import cli
from sglang_ext_tools.stream_priority_verdict import verdict_for

ROLES = {
    "baseline": "nospec",
    "plain": "spec-3-1-4",
    "join": "spec-3-1-4-join",
    "join_nospec": "nospec-join",
    "serial_nospec": "nospec-serial",
    "serial": "spec-3-1-4-serial",
}
# name: (numerator role, denominator role), (low, high, point); None: recorded, not bounded
SPEED = {
    "join_nospec_over_serial_nospec": (("join_nospec", "serial_nospec"), (1.03, 1.13, 1.07)),
    "join_over_serial": (("join", "serial"), (1.02, 1.10, 1.05)),
    "join_over_plain": (("join", "plain"), (1.13, 1.30, 1.20)),
    "join_over_join_nospec": (("join", "join_nospec"), (0.77, 0.85, 0.81)),
    "join_nospec_over_baseline": (("join_nospec", "baseline"), None),
}
verdict = verdict_for("join", SPEED)


def main(argv: Sequence[str] | None = None) -> int:
    return cli(argv, __doc__.split("\n\n")[0], "join_verdict", verdict, traces=True, roles=ROLES)


if __name__ == "__main__":
    raise SystemExit(main())
