"""Prometheus metrics for per-request acceptance: metric names, buckets, AcceptanceMetrics.

Histograms of accept length and rate, per-position counters and the drafter-health gauges,
labelled with SGLang's tokenizer labels. prometheus_client is imported only when
:class:`AcceptanceMetrics` is created, never at module import.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

ACCEPT_LENGTH_BUCKETS = (
    1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0,
    10.0, 12.0, 16.0,
)  # fmt: skip
ACCEPT_RATE_BUCKETS = (
    0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0,
)  # fmt: skip

METRIC_ACCEPT_LENGTH = "sglang:spec_ext_accept_length"
METRIC_ACCEPT_RATE = "sglang:spec_ext_accept_rate"
METRIC_PROPOSED = "sglang:spec_ext_proposed_draft_tokens_total"
METRIC_ACCEPTED = "sglang:spec_ext_accepted_draft_tokens_total"
METRIC_UNHEALTHY = "sglang:spec_ext_drafter_unhealthy"
METRIC_ROLLING_RATE = "sglang:spec_ext_rolling_accept_rate"
METRIC_HOOK_SECONDS = "sglang:spec_ext_metrics_hook_seconds_total"

# How long the per-position counters, the rolling rate and the hook-seconds counter may lag
# (the histograms and the alarm gauge never do). Written per request, these eight
# multiprocess writes were a third of the hook's CPU cost (2026-12-01 profile); a scrape
# every 15 s cannot tell a quarter-second lag.
FLUSH_INTERVAL_S = 0.25


class AcceptanceMetrics:
    """Prometheus metrics, labelled with SGLang's tokenizer label set.

    - ``sglang:spec_ext_accept_length`` histogram, one observation per finished
      speculative request (exact accept length, (A+V)/V)
    - ``sglang:spec_ext_accept_rate`` histogram, per request
    - ``sglang:spec_ext_proposed_draft_tokens_total`` / ``..._accepted_draft_tokens_total``
      counters with an extra ``position`` label ("0".."S-1")
    - ``sglang:spec_ext_drafter_unhealthy`` gauge 0/1 (multiprocess mode ``max``)
    - ``sglang:spec_ext_rolling_accept_rate`` gauge (multiprocess mode ``mostrecent``)
    - ``sglang:spec_ext_metrics_hook_seconds_total`` counter: the CPU time the tokenizer
      manager's thread spent in this hook, plus the flusher thread's (what these metrics
      cost, read against wall time; CPU, not wall: see
      hook.after_calculate_spec_decoding_metrics)

    ``registry=None`` uses prometheus_client's default registry (what SGLang's collectors
    use; in multiprocess mode the values go to ``PROMETHEUS_MULTIPROC_DIR``). Tests pass a
    fresh ``CollectorRegistry``. ``flush_interval_s`` > 0 defers the per-position counts,
    the rolling rate and the hook seconds to a daemon thread that writes them every that
    many seconds (the server uses :data:`FLUSH_INTERVAL_S`); 0 writes them at once.
    """

    def __init__(
        self, labelnames: Sequence[str], registry: Any = None, flush_interval_s: float = 0.0
    ):
        # Imported here, never at module import: prometheus_client picks its value class
        # (multiprocess or not) at import time from PROMETHEUS_MULTIPROC_DIR.
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        reg = REGISTRY if registry is None else registry
        self.labelnames = tuple(labelnames)
        if "position" in self.labelnames:
            raise ValueError("label 'position' is reserved for the per-position counters")
        names = list(self.labelnames)
        self.accept_length = Histogram(
            METRIC_ACCEPT_LENGTH,
            "Per-request speculative accept length: (accepted drafts + verify steps) / "
            "verify steps (sglang_ext).",
            labelnames=names,
            buckets=ACCEPT_LENGTH_BUCKETS,
            registry=reg,
        )
        self.accept_rate = Histogram(
            METRIC_ACCEPT_RATE,
            "Per-request speculative accept rate: accepted / proposed draft tokens (sglang_ext).",
            labelnames=names,
            buckets=ACCEPT_RATE_BUCKETS,
            registry=reg,
        )
        self.proposed = Counter(
            METRIC_PROPOSED,
            "Draft tokens proposed at each draft position (sglang_ext).",
            labelnames=[*names, "position"],
            registry=reg,
        )
        self.accepted = Counter(
            METRIC_ACCEPTED,
            "Draft tokens accepted at each draft position (sglang_ext).",
            labelnames=[*names, "position"],
            registry=reg,
        )
        self.unhealthy = Gauge(
            METRIC_UNHEALTHY,
            "1 while the rolling mean accept rate of the drafter is below the alarm "
            "threshold (sglang_ext).",
            labelnames=names,
            multiprocess_mode="max",
            registry=reg,
        )
        self.rolling_accept_rate = Gauge(
            METRIC_ROLLING_RATE,
            "Rolling mean per-request accept rate used by the drafter-health alarm (sglang_ext).",
            labelnames=names,
            multiprocess_mode="mostrecent",
            registry=reg,
        )

        self.hook_seconds = Counter(
            METRIC_HOOK_SECONDS,
            "CPU seconds the tokenizer manager's thread spent in sglang_ext's per-request "
            "acceptance hook (what these metrics cost; sglang_ext).",
            labelnames=names,
            registry=reg,
        )
        self.flush_interval_s = flush_interval_s
        self._series: dict[tuple[str, ...], _BoundSeries] = {}
        self._last_bound: _BoundSeries | None = None
        self._lock = threading.Lock()
        self._flusher: threading.Thread | None = None

    def add_hook_seconds(self, labels: Mapping[str, str], seconds: float) -> None:
        with self._lock:
            self._bound(labels).pending_seconds += max(0.0, seconds)
            self._updated()

    def _bound(self, labels: Mapping[str, str]) -> _BoundSeries:
        """This label set's series, looked up once: prometheus_client's ``labels()`` costs
        ~4 us per call (it validates and sorts the names), eight calls per request were
        half of what the metrics cost on CPU (2026-12-01 profile)."""
        key = tuple(map(labels.get, self.labelnames))  # a missing name: None, exported ""
        bound = self._series.get(key)
        if bound is None:
            values = ("" if v is None else str(v) for v in key)
            lab = dict(zip(self.labelnames, values, strict=True))
            bound = _BoundSeries(self, lab)
            self._series[key] = bound
        self._last_bound = bound
        return bound

    def observe(self, record: Mapping[str, Any], labels: Mapping[str, str]) -> None:
        with self._lock:
            bound = self._bound(labels)
            if record.get("accept_length") is not None:
                bound.accept_length.observe(record["accept_length"])
            if record.get("accept_rate") is not None:
                bound.accept_rate.observe(record["accept_rate"])
            acc = record.get("accepted_per_position")
            prop = record.get("proposed_per_position")
            if acc is not None and prop is not None:
                for pos, (a, p) in enumerate(zip(acc, prop, strict=True)):
                    if p:
                        bound.add_position(pos, p, a)
            self._updated()

    def set_health(
        self, labels: Mapping[str, str], unhealthy: bool, rolling_rate: float | None
    ) -> None:
        with self._lock:
            bound = self._bound(labels)
            flag = 1 if unhealthy else 0
            if flag != bound.last_unhealthy:  # at once: the alarm is not deferred
                bound.unhealthy.set(flag)
                bound.last_unhealthy = flag
            if rolling_rate is not None:
                bound.pending_rolling_rate = rolling_rate
            self._updated()

    def flush(self) -> None:
        """Write every deferred count and gauge now."""
        with self._lock:
            for bound in self._series.values():
                bound.flush()

    def _updated(self) -> None:
        """Called under the lock after an update: write through, or leave it to the
        flusher thread (started on the first deferred update)."""
        if self.flush_interval_s <= 0:
            self._last_bound.flush()
        elif self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush_loop, name="sglang_ext-metrics-flush", daemon=True
            )
            self._flusher.start()
            atexit.register(self.flush)

    def _flush_loop(self) -> None:
        # Its CPU time is the metrics' cost too: counted as hook seconds, then written.
        while True:
            time.sleep(self.flush_interval_s)
            start = time.thread_time()
            with self._lock:
                dirty = [b for b in self._series.values() if b.dirty]
                for bound in dirty:
                    bound.flush()
                if dirty:
                    dirty[0].hook_seconds.inc(time.thread_time() - start)


class _BoundSeries:
    """The children of :class:`AcceptanceMetrics`' metrics for one label set, and the
    counts and gauge values not yet written to them."""

    def __init__(self, metrics: AcceptanceMetrics, lab: dict[str, str]):
        self._metrics = metrics
        self._lab = lab
        self.accept_length = metrics.accept_length.labels(**lab)
        self.accept_rate = metrics.accept_rate.labels(**lab)
        self.unhealthy = metrics.unhealthy.labels(**lab)
        self.rolling_accept_rate = metrics.rolling_accept_rate.labels(**lab)
        self.hook_seconds = metrics.hook_seconds.labels(**lab)
        self.last_unhealthy: int | None = None
        self._positions: dict[int, tuple[Any, Any]] = {}
        self._pending_positions: dict[int, list[int]] = {}  # position: [proposed, accepted]
        self.pending_seconds = 0.0
        self.pending_rolling_rate: float | None = None

    @property
    def dirty(self) -> bool:
        return bool(
            self._pending_positions or self.pending_seconds or self.pending_rolling_rate is not None
        )

    def add_position(self, pos: int, proposed: int, accepted: int) -> None:
        pending = self._pending_positions.get(pos)
        if pending is None:
            if pos not in self._positions:  # both series exist from the first count on,
                name = str(pos)  # so a position that never accepts shows its zero
                self._positions[pos] = (
                    self._metrics.proposed.labels(**self._lab, position=name),
                    self._metrics.accepted.labels(**self._lab, position=name),
                )
            pending = self._pending_positions[pos] = [0, 0]
        pending[0] += proposed
        pending[1] += accepted

    def flush(self) -> None:
        for pos, (proposed, accepted) in self._pending_positions.items():
            proposed_counter, accepted_counter = self._positions[pos]
            proposed_counter.inc(proposed)
            if accepted:
                accepted_counter.inc(accepted)
        self._pending_positions.clear()
        if self.pending_seconds:
            self.hook_seconds.inc(self.pending_seconds)
            self.pending_seconds = 0.0
        if self.pending_rolling_rate is not None:
            self.rolling_accept_rate.set(self.pending_rolling_rate)
            self.pending_rolling_rate = None
