"""Drafter-health alarm: warns once per episode when the rolling mean accept rate collapses.

A rolling window of per-request accept rates (:class:`DrafterHealthAlarm`) that fires when a
broken drafter keeps the accept length at ~1.0, and the warning naming the likely causes.
Pure state machine; :class:`sglang_ext.metrics.hook.AcceptanceRecorder` logs its events and sets
the Prometheus gauges.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

DEFAULT_ALARM_WINDOW = 20
DEFAULT_ALARM_MIN_TOKENS = 32
DEFAULT_ALARM_ACCEPT_RATE = 0.05

LIKELY_CAUSES = (
    "drafter weights not loaded (randomly initialised drafter; check the load report "
    "for missing/unexpected keys)",
    "auxiliary hidden states not captured from the target, or the drafter's fusion (fc) "
    "layer skipped",
    "auxiliary layer ids off by one (speculators vs SGLang layer indexing)",
    "drafter trained for another target model (different model, revision, tokenizer or "
    "chat template)",
)


@dataclass
class AlarmEvent:
    kind: str  # "unhealthy" or "recovered"
    rolling_accept_rate: float
    window: int


@dataclass
class DrafterHealthAlarm:
    """Rolling mean of per-request accept rates over the last ``window`` eligible
    requests (>= ``min_tokens`` completion tokens). Fires once when a full window's mean
    drops below ``threshold``; re-arms when the mean is back at or above it."""

    window: int = DEFAULT_ALARM_WINDOW
    min_tokens: int = DEFAULT_ALARM_MIN_TOKENS
    threshold: float = DEFAULT_ALARM_ACCEPT_RATE
    _rates: deque = field(init=False, repr=False)
    unhealthy: bool = field(init=False, default=False)
    episodes: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError("window must be >= 1")
        self._rates = deque(maxlen=self.window)

    @property
    def window_full(self) -> bool:
        return len(self._rates) == self.window

    @property
    def rolling_accept_rate(self) -> float | None:
        if not self._rates:
            return None
        # Recompute instead of trusting a running float sum (no drift, window is small).
        return sum(self._rates) / len(self._rates)

    def eligible(self, completion_tokens: int) -> bool:
        return completion_tokens >= self.min_tokens

    def observe(self, accept_rate_value: float | None, completion_tokens: int) -> AlarmEvent | None:
        """Feed one finished speculative request; returns an event on a state change."""
        if accept_rate_value is None or not self.eligible(completion_tokens):
            return None
        self._rates.append(float(accept_rate_value))
        if not self.window_full:
            return None
        mean = self.rolling_accept_rate
        assert mean is not None
        if not self.unhealthy and mean < self.threshold:
            self.unhealthy = True
            self.episodes += 1
            return AlarmEvent("unhealthy", mean, len(self._rates))
        if self.unhealthy and mean >= self.threshold:
            self.unhealthy = False
            return AlarmEvent("recovered", mean, len(self._rates))
        return None


def alarm_warning_message(
    event: AlarmEvent, threshold: float, min_tokens: int, drafter: str | None
) -> str:
    causes = "; ".join(f"({k}) {c}" for k, c in enumerate(LIKELY_CAUSES, 1))
    return (
        f"sglang_ext: SPECULATIVE DRAFTER LOOKS BROKEN: mean accept rate "
        f"{event.rolling_accept_rate:.4f} over the last {event.window} finished speculative "
        f"requests with >= {min_tokens} completion tokens (threshold {threshold}); accept "
        f"length is ~1.0, so speculation only adds overhead. drafter={drafter!s}. "
        f"Likely causes: {causes}."
    )
