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
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class ProbeFileError(ValueError):
    """A probe whose times are not what bench_speed writes (names the file and field). A plain
    ValueError: this module imports nothing of the package (ARCHITECTURE.md, floor 0), so
    ``tune`` reports it as its own input error."""


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


def _number(fields: Mapping[str, Any], name: str, where: str) -> float | None:
    """A measured time or rate; None where it was not measured (bench_speed writes null, and a
    ratio of nothing is 0); anything but a finite number is an error."""
    value = fields.get(name)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ProbeFileError(f"{where}: field {name!r} must be a number, found {value!r:.60}")
    return float(value) if value > 0 else None


def _object(data: Mapping[str, Any], path: tuple[str, ...], where: str) -> Mapping[str, Any]:
    """``data[path[0]][path[1]]...``; empty where a level is absent or null."""
    node: Any = data
    for depth, key in enumerate(path):
        node = node.get(key)
        if node is None:
            return {}
        if not isinstance(node, Mapping):
            raise ProbeFileError(
                f"{where}: field {'.'.join(path[: depth + 1])!r} must be an object (bench_speed "
                f"--profile's traces), found {node!r:.60}"
            )
    return node


def _nospec_trace_step(data: Mapping[str, Any], where: str) -> float | None:
    path = ("profiles", "nospec", "steady", "per_cycle_ms")
    return _number(_object(data, path, where), "total", f"{where}: {'.'.join(path)}")


def from_probe(
    data: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]], where: str = "<probe>"
) -> tuple[RequestTime | None, dict[str, float]]:
    """The request model of a bench_speed probe (``rows``: its batch-1 main-drafter rows by
    setting label; ``where``: its file) and each setting's cycle in decode steps without the
    first token's part; (None, {}) where the probe has neither TTFTs nor a no-speculation
    trace."""
    tokens = data.get("max_new_tokens")
    if tokens is not None and (
        not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1
    ):
        raise ProbeFileError(
            f"{where}: field 'max_new_tokens' must be a positive integer (output tokens per "
            f"request), found {tokens!r:.60}"
        )
    if tokens is None or tokens < 2 or not rows:
        return None, {}
    at = {label: f"{where}: the {label} row at batch 1" for label in rows}
    measured = {
        label: (
            _number(r, "spec_ttft_ms", at[label]),
            _number(r, "decode_cycle_cost", at[label]),
        )
        for label, r in rows.items()
    }
    first_label, first = next(iter(rows.items()))
    step = _number(first, "nospec_tpot_ms", at[first_label])
    nospec_first = _number(first, "nospec_ttft_ms", at[first_label])
    if step and nospec_first and all(f and c for f, c in measured.values()):
        model = RequestTime(
            tokens,
            step,
            nospec_first,
            {label: f for label, (f, _) in measured.items()},
            "measured: each server's time to first token and per output token",
        )
        return model, {label: c for label, (_, c) in measured.items()}
    step = _nospec_trace_step(data, where)
    nospec_tok_s = _number(first, "nospec_tok_s", at[first_label])
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
        spec_tok_s, tau = _number(row, "spec_tok_s", at[label]), _number(row, "tau", at[label])
        if not spec_tok_s or not tau:
            return None, {}
        cycles[label] = model.cycle(label, tau, spec_tok_s)
    return model, cycles
