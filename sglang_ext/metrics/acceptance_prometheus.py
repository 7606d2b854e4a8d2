"""Prometheus metrics for per-request acceptance: metric names, buckets, AcceptanceMetrics.

Histograms of accept length and rate, per-position counters and the drafter-health gauges,
labelled with SGLang's tokenizer labels. prometheus_client is imported only when
:class:`AcceptanceMetrics` is created, never at module import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
      manager's thread spent in this hook, plus the recorder's flusher thread (what these
      metrics cost, read against wall time; CPU, not wall: see
      hook.after_calculate_spec_decoding_metrics)

    ``registry=None`` uses prometheus_client's default registry (what SGLang's collectors
    use; in multiprocess mode the values go to ``PROMETHEUS_MULTIPROC_DIR``). Tests pass a
    fresh ``CollectorRegistry``.
    """

    def __init__(self, labelnames: Sequence[str], registry: Any = None):
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
        self._series: dict[tuple[str, ...], _BoundSeries] = {}

    def add_hook_seconds(self, labels: Mapping[str, str], seconds: float) -> None:
        self._bound(labels).hook_seconds.inc(max(0.0, seconds))

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
        return bound

    def observe(self, record: Mapping[str, Any], labels: Mapping[str, str]) -> None:
        self.observe_many((record,), labels)

    def observe_many(self, records: Iterable[Mapping[str, Any]], labels: Mapping[str, str]) -> None:
        """Each record into the histograms; the per-position counts summed over them first
        (one write per position, not one per position per request)."""
        bound = self._bound(labels)
        proposed_sums: list[int] = []
        accepted_sums: list[int] = []
        for record in records:
            if record.get("accept_length") is not None:
                bound.accept_length.observe(record["accept_length"])
            if record.get("accept_rate") is not None:
                bound.accept_rate.observe(record["accept_rate"])
            acc = record.get("accepted_per_position")
            prop = record.get("proposed_per_position")
            if acc is None or prop is None:
                continue
            if len(prop) > len(proposed_sums):
                proposed_sums.extend([0] * (len(prop) - len(proposed_sums)))
                accepted_sums.extend([0] * (len(prop) - len(accepted_sums)))
            for pos, (a, p) in enumerate(zip(acc, prop, strict=True)):
                proposed_sums[pos] += p
                accepted_sums[pos] += a
        for pos, p in enumerate(proposed_sums):
            if p:
                proposed, accepted = bound.position(pos)
                proposed.inc(p)
                if accepted_sums[pos]:  # a zero stays visible: position() created the series
                    accepted.inc(accepted_sums[pos])

    def set_health(
        self, labels: Mapping[str, str], unhealthy: bool, rolling_rate: float | None
    ) -> None:
        bound = self._bound(labels)
        flag = 1 if unhealthy else 0
        if flag != bound.last_unhealthy:  # this object is the gauge's only writer
            bound.unhealthy.set(flag)
            bound.last_unhealthy = flag
        if rolling_rate is not None:
            bound.rolling_accept_rate.set(rolling_rate)


class _BoundSeries:
    """The children of :class:`AcceptanceMetrics`' metrics for one label set."""

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

    def position(self, pos: int) -> tuple[Any, Any]:
        """(proposed, accepted) counters of draft position ``pos``."""
        pair = self._positions.get(pos)
        if pair is None:
            name = str(pos)
            pair = (
                self._metrics.proposed.labels(**self._lab, position=name),
                self._metrics.accepted.labels(**self._lab, position=name),
            )
            self._positions[pos] = pair
        return pair
