"""Prometheus metrics for per-request acceptance: metric names, buckets, AcceptanceMetrics.

Histograms of accept length and rate, per-position counters and the drafter-health gauges,
labelled with SGLang's tokenizer labels. prometheus_client is imported only when
:class:`AcceptanceMetrics` is created, never at module import.
"""

from __future__ import annotations

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
      manager's thread spent in this hook (what these metrics cost, read against wall time;
      CPU, not wall: see hook.after_calculate_spec_decoding_metrics)

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

    def add_hook_seconds(self, labels: Mapping[str, str], seconds: float) -> None:
        self.hook_seconds.labels(**self._labels(labels)).inc(max(0.0, seconds))

    def _labels(self, labels: Mapping[str, str]) -> dict[str, str]:
        return {k: str(labels.get(k, "")) for k in self.labelnames}

    def observe(self, record: Mapping[str, Any], labels: Mapping[str, str]) -> None:
        lab = self._labels(labels)
        if record.get("accept_length") is not None:
            self.accept_length.labels(**lab).observe(record["accept_length"])
        if record.get("accept_rate") is not None:
            self.accept_rate.labels(**lab).observe(record["accept_rate"])
        acc = record.get("accepted_per_position")
        prop = record.get("proposed_per_position")
        if acc is not None and prop is not None:
            for pos, (a, p) in enumerate(zip(acc, prop, strict=True)):
                if p:
                    self.proposed.labels(**lab, position=str(pos)).inc(p)
                if a:
                    self.accepted.labels(**lab, position=str(pos)).inc(a)
                elif p:
                    # Make the zero visible (a position that never accepts is the signal).
                    self.accepted.labels(**lab, position=str(pos))

    def set_health(
        self, labels: Mapping[str, str], unhealthy: bool, rolling_rate: float | None
    ) -> None:
        lab = self._labels(labels)
        self.unhealthy.labels(**lab).set(1 if unhealthy else 0)
        if rolling_rate is not None:
            self.rolling_accept_rate.labels(**lab).set(rolling_rate)
