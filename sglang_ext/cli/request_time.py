"""A request's time as a benchmark measures it: a fixed part and a part per verify cycle.

`sglang-ext tune` predicts a setting's speedup from a zero-acceptance probe. A speedup
measured in output tokens per second over whole requests holds more than the cycle: each
request also waits for its first token (prefill, the drafter's prefill, the way in and out),
``F`` ms, once. A request of ``N`` output tokens takes

    no speculation:  F_nospec + (N - 1) x step
    a setting:       F_spec   + (N - 1) x step x cycle / tau

(``step``: the decode step without speculation; ``cycle``: one verify cycle in decode steps;
``tau``: tokens per cycle). The probe emits one token per cycle (tau ~ 1), so its tok/s
ratio gives ``F + (N - 1) x cycle`` as one number, and reading it as a cycle weighs ``F``
tau-fold in a served run whose cycles emit tau tokens each: on one H200 at the seed's shape
(issue #24, 2026-12-03, 128-token requests, F ~ 145 ms against a 8.5 ms step) the trained
chains' cycles came out 0.16-0.21 decode steps above the probe's, and the advice 8-12 % high.

The split comes from the probe itself, in the first of these that it has:

1. **measured**: each server's time to first token and time per output token after it
   (``bench_speed`` rows' ``*_ttft_ms`` / ``*_tpot_ms``, streamed requests);
2. **the no-speculation trace**: ``bench_speed --profile``'s steady decode step of the
   baseline; ``F_nospec = N / tok_s - (N - 1) x step``, and each setting's first token taken
   as long as no speculation's;
3. none: the probe's tok/s cycle as it is (``F = 0``), and the advice says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestTime:
    """Per-request times of a probe, in ms; ``first`` by setting label ("3/1/4")."""

    tokens: int
    step_ms: float
    nospec_first_ms: float
    first_ms: Mapping[str, float]
    source: str

    def at(self, tokens: int) -> RequestTime:
        """The same machine, requests of another length (a user's typical output)."""
        return dataclasses.replace(self, tokens=tokens)

    def first(self, setting: str) -> float:
        """``setting``'s time to first token: its own where measured, else no speculation's."""
        return self.first_ms.get(setting, self.nospec_first_ms)

    def cycle(self, setting: str, tau: float, tok_s: float) -> float:
        """The cycle, in decode steps, of ``setting`` measured at ``tok_s`` output tokens per
        second with ``tau`` tokens per cycle: its requests' time less their first token."""
        decode_ms = 1000.0 * self.tokens / tok_s - self.first(setting)
        return tau * decode_ms / ((self.tokens - 1) * self.step_ms)

    def speedup(self, setting: str, tau: float, cycle: float) -> float:
        """Whole-request speedup of ``setting`` at ``tau`` tokens per cycle of ``cycle``
        decode steps, for requests of ``self.tokens`` output tokens."""
        decode = (self.tokens - 1) * self.step_ms
        return (self.nospec_first_ms + decode) / (self.first(setting) + decode * cycle / tau)


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


def _nospec_trace_step(data: Mapping[str, Any]) -> float | None:
    profile = (data.get("profiles") or {}).get("nospec") or {}
    return _number(((profile.get("steady") or {}).get("per_cycle_ms") or {}).get("total"))


def from_probe(
    data: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]]
) -> tuple[RequestTime | None, dict[str, float]]:
    """The request model of a bench_speed probe (``rows``: its batch-1 main-drafter rows by
    setting label) and each setting's cycle in decode steps without the first token's part;
    (None, {}) where the probe has neither TTFTs nor a no-speculation trace."""
    tokens = data.get("max_new_tokens")
    if not isinstance(tokens, int) or tokens < 2 or not rows:
        return None, {}
    measured = {
        label: (_number(r.get("spec_ttft_ms")), _number(r.get("decode_cycle_cost")))
        for label, r in rows.items()
    }
    first = next(iter(rows.values()))
    step, nospec_first = _number(first.get("nospec_tpot_ms")), _number(first.get("nospec_ttft_ms"))
    if step and nospec_first and all(f and c for f, c in measured.values()):
        model = RequestTime(
            tokens,
            step,
            nospec_first,
            {label: f for label, (f, _) in measured.items()},
            "measured: each server's time to first token and per output token",
        )
        return model, {label: c for label, (_, c) in measured.items()}
    step = _nospec_trace_step(data)
    nospec_tok_s = _number(first.get("nospec_tok_s"))
    if not step or not nospec_tok_s:
        return None, {}
    nospec_first = 1000.0 * tokens / nospec_tok_s - (tokens - 1) * step
    if nospec_first <= 0:
        return None, {}
    model = RequestTime(
        tokens,
        step,
        nospec_first,
        {},
        "the no-speculation trace's decode step; each setting's first token taken as long as "
        "no speculation's (the probe has no TTFT)",
    )
    cycles = {}
    for label, row in rows.items():
        spec_tok_s, tau = _number(row.get("spec_tok_s")), _number(row.get("tau"))
        if not spec_tok_s or not tau:
            return None, {}
        cycles[label] = model.cycle(label, tau, spec_tok_s)
    return model, cycles
