"""Per-request speculative-decoding acceptance metrics for SGLang (plugin side).

Why: a deployment once ran EAGLE-3 at 24.8 tok/s instead of ~90 with an accept length
of exactly 1.00 and nobody noticed, because only throughput was looked at. This module
makes acceptance visible for every finished speculative request, in four places:

1. one structured log line per finished speculative request (INFO, logger
   ``sglang.srt.sglang_ext.acceptance``)::

       sglang_ext.acceptance {"rid":"...","prompt_tokens":..,"completion_tokens":..,...}

   i.e. the fixed prefix ``sglang_ext.acceptance`` followed by one JSON object (see
   :func:`format_log_line` / :func:`parse_log_line`). SGLang's log formatter prepends
   ``[timestamp] ``; grep for ``sglang_ext.acceptance {``.
2. optional JSONL file, one object per request (same object as in the log line plus
   ``ts``), selected by ``SGLANG_EXT_ACCEPTANCE_JSONL=/path/file.jsonl``. Lines are
   appended with a single ``write(2)`` on an ``O_APPEND`` descriptor, so several
   tokenizer processes may share one file.
3. Prometheus metrics, when SGLang runs with ``--enable-metrics`` (see
   :class:`AcceptanceMetrics` for names; labels are SGLang's own tokenizer labels,
   e.g. ``model_name``, ``engine_type``, plus ``position`` on the per-position counters).
   Metrics are created lazily in the process that records them (the TokenizerManager
   process), after SGLang has set ``PROMETHEUS_MULTIPROC_DIR``, so SGLang's
   multiprocess ``/metrics`` endpoint exports them.
4. extra ``meta_info`` keys in the response of every finished speculative request
   (SGLang's own ``spec_*`` keys are kept untouched):

   - ``spec_accept_length_exact``: (accepted drafts + verify steps) / verify steps
   - ``spec_accepted_draft_tokens`` / ``spec_proposed_draft_tokens``
   - ``spec_accept_per_position``: acceptance rate of draft position 0..S-1
   - ``spec_accepted_per_position`` / ``spec_proposed_per_position``: the counts behind it

   (The OpenAI-compatible endpoints re-pack meta_info into a fixed pydantic model, so
   these extra keys are only visible on the native ``/generate`` endpoint.)

Plus a drafter-health alarm (:class:`DrafterHealthAlarm`): a rolling window over the last
N finished speculative requests that had at least M completion tokens; when the window is
full and its mean accept rate is below a threshold, one WARNING is logged per episode
(re-armed once the rolling mean is back at or above the threshold) and the Prometheus
gauge ``sglang:spec_ext_drafter_unhealthy`` is set to 1.

Definitions (pure functions below, unit-tested)
------------------------------------------------
Per request, with ``V`` = verify steps (``Req.spec_verify_ct``), ``A`` = accepted draft
tokens (``Req.spec_num_correct_drafts``, the bonus token excluded), ``D`` = draft tokens
proposed per verify step:

- accept length = (A + V) / V  (tokens committed per verify step: accepted drafts plus
  the bonus token). This is ``accept_length`` / ``spec_accept_length_exact``.
- SGLang's ``meta_info["spec_accept_length"]`` is completion_tokens / V. We report it
  side by side as ``sglang_accept_length``. It counts the first token, which comes from
  prefill and not from any verify step, so it is inflated on short requests: a request
  whose drafter never gets a token accepted and that runs 3 verify steps has 4 completion
  tokens, so sglang_accept_length = 1.33 although accept_length = 1.00.
- proposed = V x D with D = ``speculative_num_draft_tokens - 1`` (SGLang's own
  definition, falling back to ``speculative_num_steps``). For a chain (``topk == 1``)
  D = ``speculative_num_steps``. For a tree (``topk > 1``) D is the number of non-root
  tree nodes verified per step, so accept rate = A / (V x D) is relative to the whole
  tree budget and cannot reach 1.
- accept rate = A / proposed.
- per-position acceptance (S = ``speculative_num_steps`` positions): a verify step that
  accepted ``a`` drafts counts positions 0..a-1 as accepted and all S positions as
  proposed. Position ``i`` acceptance = accepted_i / proposed_i = P(a > i). For a chain
  this is the chance that draft token ``i`` is accepted (conditional on nothing: the
  curve is cumulative and non-increasing). For a tree, position ``i`` means depth
  ``i + 1`` of the accepted path.

Where the numbers come from (no extra work per verify step)
-----------------------------------------------------------
SGLang (0.5.17 and 0.5.23) already updates, per request and per verify step, on CPU:
``Req.spec_verify_ct``, ``Req.spec_num_correct_drafts`` and
``Req.spec_correct_drafts_histogram`` (``hist[a]`` = number of verify steps that
accepted exactly ``a`` drafts; ``Req.update_spec_correct_drafts_histogram``). The
scheduler's output streamer copies them into ``BatchTokenIDOutput``; the detokenizer
copies them into ``BatchStrOutput``; the TokenizerManager reads them in
``TokenizerManager._calculate_spec_decoding_metrics(meta_info, recv_obj, i)``, once per
finished request. For a chain the histogram is a sufficient statistic for per-position
acceptance (accepted_i = sum of hist[a] for a > i, proposed_i = V), so nothing new has to
cross process boundaries: we hook that method (AFTER) and do O(S) integer arithmetic per
finished request.

Environment variables
---------------------
``SGLANG_EXT_METRICS``            ``0`` disables everything here (``install()`` registers
                                  no hook). Default ``1``.
``SGLANG_EXT_ACCEPTANCE_JSONL``   path of a JSONL file to append one object per request.
``SGLANG_EXT_ACCEPTANCE_LOG``     ``0`` silences the per-request log line (the alarm, the
                                  JSONL sink, Prometheus and meta_info stay on). Default 1.
``SGLANG_EXT_ALARM_WINDOW``       N, requests in the rolling window. Default 20.
``SGLANG_EXT_ALARM_MIN_TOKENS``   M, minimum completion tokens for a request to enter the
                                  window (short requests are too noisy). Default 32.
``SGLANG_EXT_ALARM_ACCEPT_RATE``  threshold on the window's mean accept rate. Default 0.05
                                  (a trained EAGLE-3 drafter is typically at 0.3-0.8; a
                                  random one at ~0).

The module imports neither sglang nor torch nor prometheus_client at import time; SGLang
is imported by :func:`install` and by the hook, prometheus_client lazily.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

LOGGER_NAME = "sglang.srt.sglang_ext.acceptance"
LOG_PREFIX = "sglang_ext.acceptance"
RECORD_SCHEMA = 1

logger = logging.getLogger(LOGGER_NAME)

# Dotted targets hooked by install(). Each must exist in SGLang 0.5.17 and 0.5.23.
CALC_SPEC_METRICS_TARGET = (
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._calculate_spec_decoding_metrics"
)

ENV_ENABLE = "SGLANG_EXT_METRICS"
ENV_JSONL = "SGLANG_EXT_ACCEPTANCE_JSONL"
ENV_LOG = "SGLANG_EXT_ACCEPTANCE_LOG"
ENV_ALARM_WINDOW = "SGLANG_EXT_ALARM_WINDOW"
ENV_ALARM_MIN_TOKENS = "SGLANG_EXT_ALARM_MIN_TOKENS"
ENV_ALARM_ACCEPT_RATE = "SGLANG_EXT_ALARM_ACCEPT_RATE"

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


# --------------------------------------------------------------------------------------
# Pure arithmetic
# --------------------------------------------------------------------------------------


def accept_length(accepted_draft_tokens: int, verify_steps: int) -> float | None:
    """Exact accept length: (accepted drafts + verify steps) / verify steps.

    Each verify step commits the drafts it accepted plus one bonus token from the target.
    Returns None when there was no verify step.
    """
    if verify_steps <= 0:
        return None
    return (accepted_draft_tokens + verify_steps) / verify_steps


def sglang_accept_length(completion_tokens: int, verify_steps: int) -> float | None:
    """SGLang's per-request ``spec_accept_length``: completion_tokens / verify steps.

    Includes the first completion token, which the prefill produced, so it overstates
    the accept length by 1/verify_steps (more on short requests).
    """
    if verify_steps <= 0:
        return None
    return completion_tokens / verify_steps


def draft_tokens_per_step(num_draft_tokens: int | None, num_steps: int | None) -> int:
    """Draft tokens proposed (and verified) per verify step, SGLang's definition.

    ``speculative_num_draft_tokens - 1`` (the root of the verify tree is the last
    committed token, not a draft), else ``speculative_num_steps``, else 0.
    """
    if num_draft_tokens:
        return max(int(num_draft_tokens) - 1, 0)
    if num_steps:
        return int(num_steps)
    return 0


def proposed_draft_tokens(verify_steps: int, per_step: int) -> int:
    """Draft tokens proposed over a request: verify steps x draft tokens per step."""
    return verify_steps * per_step


def accept_rate(accepted_draft_tokens: int, proposed: int) -> float | None:
    """Accepted draft tokens / proposed draft tokens (None if nothing was proposed)."""
    if proposed <= 0:
        return None
    return accepted_draft_tokens / proposed


def histogram_from_steps(accepted_per_step: Iterable[int]) -> list[int]:
    """Histogram of accepted drafts per verify step, same layout as SGLang's
    ``Req.spec_correct_drafts_histogram``: ``hist[a]`` = steps that accepted ``a`` drafts."""
    hist: list[int] = []
    for a in accepted_per_step:
        a = int(a)
        if a < 0:
            raise ValueError(f"negative accepted count {a}")
        if len(hist) <= a:
            hist.extend([0] * (a + 1 - len(hist)))
        hist[a] += 1
    return hist


def per_position_from_steps(
    accepted_per_step: Iterable[int], num_positions: int
) -> tuple[list[int], list[int]]:
    """Per-position (accepted, proposed) counts straight from the per-step definition.

    A verify step that accepted ``a`` drafts counts positions 0..a-1 accepted and all
    ``num_positions`` positions proposed.
    """
    accepted = [0] * num_positions
    proposed = [0] * num_positions
    for a in accepted_per_step:
        a = int(a)
        if a > num_positions:
            raise ValueError(f"step accepted {a} drafts but only {num_positions} positions")
        for pos in range(num_positions):
            proposed[pos] += 1
            if pos < a:
                accepted[pos] += 1
    return accepted, proposed


def per_position_from_histogram(
    histogram: Sequence[int], num_positions: int
) -> tuple[list[int], list[int]]:
    """Per-position (accepted, proposed) counts from an accepted-drafts histogram.

    accepted_i = sum(hist[a] for a > i); proposed_i = sum(hist) (= verify steps). Exactly
    equal to :func:`per_position_from_steps` on the steps the histogram summarises.
    ``num_positions`` is widened if the histogram has longer runs (defensive).
    """
    num_positions = max(num_positions, len(histogram) - 1, 0)
    steps = sum(int(c) for c in histogram)
    accepted = [0] * num_positions
    # Suffix sums: running = number of steps that accepted more than ``pos`` drafts.
    running = 0
    for pos in range(num_positions - 1, -1, -1):
        if pos + 1 < len(histogram):
            running += int(histogram[pos + 1])
        accepted[pos] = running
    return accepted, [steps] * num_positions


def rates(accepted: Sequence[int], proposed: Sequence[int]) -> list[float | None]:
    """Element-wise accepted / proposed (None where nothing was proposed)."""
    return [(a / p if p > 0 else None) for a, p in zip(accepted, proposed, strict=True)]


def sglang_aggregate(
    records: Iterable[Mapping[str, Any]], num_draft_tokens: int | None, num_steps: int | None
) -> dict[str, float | int | None]:
    """The aggregate SGLang's scheduler logs ("accept len", "accept rate") over the same
    verify steps, from per-request counts.

    SGLang's ``SchedulerMetricsReporter.update_spec_metrics`` adds, per decode batch,
    ``bs`` to ``spec_num_forward_ct`` and (accepted drafts + bs) to
    ``spec_num_accept_tokens``; the decode log computes accept len =
    spec_num_accept_tokens / spec_num_forward_ct and accept rate = accepted drafts /
    (spec_num_forward_ct x (speculative_num_draft_tokens - 1)). Summed over batches, bs
    is the number of verify steps, so over requests this is
    sum(A + V) / sum(V) and sum(A) / (sum(V) x D).
    """
    forward_ct = 0
    accepted = 0
    for r in records:
        forward_ct += int(r["verify_steps"])
        accepted += int(r["accepted_draft_tokens"])
    per_step = draft_tokens_per_step(num_draft_tokens, num_steps)
    total_draft = forward_ct * per_step
    return {
        "spec_num_forward_ct": forward_ct,
        "spec_num_accept_tokens": accepted + forward_ct,
        "spec_num_correct_drafts": accepted,
        "accept_length": (accepted + forward_ct) / forward_ct if forward_ct else None,
        "accept_rate": accepted / total_draft if total_draft else None,
    }


def pooled_per_position(records: Iterable[Mapping[str, Any]]) -> list[float | None]:
    """Per-position acceptance pooled over requests (sum of counts, then divide)."""
    acc: list[int] = []
    prop: list[int] = []
    for r in records:
        a = r.get("accepted_per_position")
        p = r.get("proposed_per_position")
        if a is None or p is None:
            continue
        if len(acc) < len(a):
            acc.extend([0] * (len(a) - len(acc)))
            prop.extend([0] * (len(a) - len(prop)))
        for k, (x, y) in enumerate(zip(a, p, strict=True)):
            acc[k] += int(x)
            prop[k] += int(y)
    return rates(acc, prop)


# --------------------------------------------------------------------------------------
# Per-request record, log line, JSONL sink
# --------------------------------------------------------------------------------------


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def build_record(
    *,
    rid: str,
    prompt_tokens: int | None,
    completion_tokens: int,
    verify_steps: int,
    accepted_draft_tokens: int,
    histogram: Sequence[int] | None,
    num_draft_tokens: int | None,
    num_steps: int | None,
    topk: int | None = None,
    drafter: str | None = None,
    algorithm: str | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """Assemble the per-request acceptance record (what is logged / written / exported).

    Raises ValueError on counts that contradict each other (histogram total != verify
    steps, or histogram mass != accepted drafts), which would mean SGLang's counters
    changed meaning.
    """
    if verify_steps <= 0:
        raise ValueError("a speculative record needs at least one verify step")
    per_step = draft_tokens_per_step(num_draft_tokens, num_steps)
    proposed = proposed_draft_tokens(verify_steps, per_step)
    num_positions = int(num_steps) if num_steps else per_step
    accepted_pp: list[int] | None = None
    proposed_pp: list[int] | None = None
    if histogram:
        if sum(histogram) != verify_steps:
            raise ValueError(f"histogram total {sum(histogram)} != verify steps {verify_steps}")
        mass = sum(a * c for a, c in enumerate(histogram))
        if mass != accepted_draft_tokens:
            raise ValueError(f"histogram mass {mass} != accepted drafts {accepted_draft_tokens}")
        accepted_pp, proposed_pp = per_position_from_histogram(histogram, num_positions)
    return {
        "schema": RECORD_SCHEMA,
        "rid": rid,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "verify_steps": verify_steps,
        "draft_tokens_per_step": per_step,
        "proposed_draft_tokens": proposed,
        "accepted_draft_tokens": accepted_draft_tokens,
        "accept_length": _round(accept_length(accepted_draft_tokens, verify_steps)),
        "sglang_accept_length": _round(sglang_accept_length(completion_tokens, verify_steps)),
        "accept_rate": _round(accept_rate(accepted_draft_tokens, proposed)),
        "accept_per_position": (
            [_round(x) for x in rates(accepted_pp, proposed_pp)] if accepted_pp else None
        ),
        "accepted_per_position": accepted_pp,
        "proposed_per_position": proposed_pp,
        "topk": topk,
        "algorithm": algorithm,
        "drafter": drafter,
        "finish_reason": finish_reason,
    }


def format_log_line(record: Mapping[str, Any]) -> str:
    """``sglang_ext.acceptance {json}`` (compact JSON, one line)."""
    return LOG_PREFIX + " " + json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def parse_log_line(line: str) -> dict[str, Any]:
    """Inverse of :func:`format_log_line`; tolerates any prefix (timestamps etc.)."""
    marker = LOG_PREFIX + " {"
    pos = line.find(marker)
    if pos < 0:
        raise ValueError(f"not a {LOG_PREFIX} line: {line[:80]!r}")
    return json.loads(line[pos + len(LOG_PREFIX) + 1 :])


def meta_info_extras(record: Mapping[str, Any]) -> dict[str, Any]:
    """The keys added to the response meta_info (SGLang's own keys stay as they are)."""
    out: dict[str, Any] = {
        "spec_accept_length_exact": record["accept_length"],
        "spec_accepted_draft_tokens": record["accepted_draft_tokens"],
        "spec_proposed_draft_tokens": record["proposed_draft_tokens"],
    }
    if record.get("accept_per_position") is not None:
        out["spec_accept_per_position"] = record["accept_per_position"]
        out["spec_accepted_per_position"] = record["accepted_per_position"]
        out["spec_proposed_per_position"] = record["proposed_per_position"]
    return out


class JsonlSink:
    """Appends one JSON object per line; one ``os.write`` per record on ``O_APPEND``."""

    def __init__(self, path: str):
        self.path = path
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(self, record: Mapping[str, Any]) -> None:
        obj = dict(record)
        obj.setdefault("ts", round(time.time(), 3))
        data = (json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        with self._lock:
            os.write(self._fd, data)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


def _parse_bool(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected 0/1/true/false")


@dataclass(frozen=True)
class MetricsConfig:
    enabled: bool = True
    log_requests: bool = True
    jsonl_path: str | None = None
    alarm_window: int = DEFAULT_ALARM_WINDOW
    alarm_min_tokens: int = DEFAULT_ALARM_MIN_TOKENS
    alarm_accept_rate: float = DEFAULT_ALARM_ACCEPT_RATE

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MetricsConfig:
        """Read the SGLANG_EXT_* variables; ValueError names the bad variable."""
        env = os.environ if env is None else env

        def _int(name: str, default: int, minimum: int) -> int:
            raw = env.get(name)
            if raw is None or raw.strip() == "":
                return default
            try:
                v = int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r}: expected an integer") from None
            if v < minimum:
                raise ValueError(f"{name}={v}: must be >= {minimum}")
            return v

        raw_rate = env.get(ENV_ALARM_ACCEPT_RATE)
        rate = DEFAULT_ALARM_ACCEPT_RATE
        if raw_rate is not None and raw_rate.strip() != "":
            try:
                rate = float(raw_rate)
            except ValueError:
                raise ValueError(
                    f"{ENV_ALARM_ACCEPT_RATE}={raw_rate!r}: expected a float"
                ) from None
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{ENV_ALARM_ACCEPT_RATE}={rate}: must be within [0, 1]")
        return cls(
            enabled=_parse_bool(ENV_ENABLE, env.get(ENV_ENABLE, "1")),
            log_requests=_parse_bool(ENV_LOG, env.get(ENV_LOG, "1")),
            jsonl_path=(env.get(ENV_JSONL) or None),
            alarm_window=_int(ENV_ALARM_WINDOW, DEFAULT_ALARM_WINDOW, 1),
            alarm_min_tokens=_int(ENV_ALARM_MIN_TOKENS, DEFAULT_ALARM_MIN_TOKENS, 0),
            alarm_accept_rate=rate,
        )


# --------------------------------------------------------------------------------------
# Drafter-health alarm (state machine)
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Prometheus
# --------------------------------------------------------------------------------------

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


class AcceptanceMetrics:
    """Prometheus metrics, labelled with SGLang's tokenizer label set.

    - ``sglang:spec_ext_accept_length`` histogram, one observation per finished
      speculative request (exact accept length, (A+V)/V)
    - ``sglang:spec_ext_accept_rate`` histogram, per request
    - ``sglang:spec_ext_proposed_draft_tokens_total`` / ``..._accepted_draft_tokens_total``
      counters with an extra ``position`` label ("0".."S-1")
    - ``sglang:spec_ext_drafter_unhealthy`` gauge 0/1 (multiprocess mode ``max``)
    - ``sglang:spec_ext_rolling_accept_rate`` gauge (multiprocess mode ``mostrecent``)

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


# --------------------------------------------------------------------------------------
# Per-process recorder (glue between the hook and the pure parts)
# --------------------------------------------------------------------------------------


class AcceptanceRecorder:
    """Everything that happens for one finished speculative request, minus SGLang access.

    Thread-safe (SGLang calls it from the tokenizer manager's event loop thread, but a
    lock costs nothing here).
    """

    def __init__(self, config: MetricsConfig, prom_registry: Any = None):
        self.config = config
        self.alarm = DrafterHealthAlarm(
            window=config.alarm_window,
            min_tokens=config.alarm_min_tokens,
            threshold=config.alarm_accept_rate,
        )
        self._sink: JsonlSink | None = None
        self._sink_failed = False
        self._prom: AcceptanceMetrics | None = None
        self._prom_failed = False
        self._prom_registry = prom_registry
        self._lock = threading.Lock()
        self._announced = False
        self.num_records = 0

    def _get_sink(self) -> JsonlSink | None:
        if self._sink is None and self.config.jsonl_path and not self._sink_failed:
            try:
                self._sink = JsonlSink(self.config.jsonl_path)
            except OSError:
                self._sink_failed = True
                logger.exception(
                    "sglang_ext: cannot open %s=%s; JSONL sink disabled",
                    ENV_JSONL,
                    self.config.jsonl_path,
                )
        return self._sink

    def _get_prom(self, labels: Mapping[str, str]) -> AcceptanceMetrics | None:
        if self._prom is None and not self._prom_failed:
            try:
                self._prom = AcceptanceMetrics(list(labels.keys()), registry=self._prom_registry)
            except Exception:
                self._prom_failed = True
                logger.exception("sglang_ext: cannot create Prometheus metrics; disabled")
        return self._prom

    def record(
        self, record: Mapping[str, Any], prom_labels: Mapping[str, str] | None = None
    ) -> AlarmEvent | None:
        with self._lock:
            self.num_records += 1
            if not self._announced:
                self._announced = True
                logger.info(
                    "sglang_ext: per-request acceptance metrics active (drafter=%s, "
                    "draft tokens/step=%s, positions=%s, jsonl=%s, prometheus=%s, alarm: "
                    "window=%d min_tokens=%d accept_rate<%s)",
                    record.get("drafter"),
                    record.get("draft_tokens_per_step"),
                    len(record.get("proposed_per_position") or ()),
                    self.config.jsonl_path,
                    prom_labels is not None,
                    self.config.alarm_window,
                    self.config.alarm_min_tokens,
                    self.config.alarm_accept_rate,
                )
            if self.config.log_requests:
                logger.info("%s", format_log_line(record))
            sink = self._get_sink()
            if sink is not None:
                try:
                    sink.write(record)
                except OSError:
                    self._sink_failed = True
                    self._sink = None
                    logger.exception("sglang_ext: JSONL write failed; sink disabled")
            event = self.alarm.observe(record.get("accept_rate"), record["completion_tokens"])
            prom = self._get_prom(prom_labels) if prom_labels is not None else None
            if prom is not None:
                prom.observe(record, prom_labels)
                prom.set_health(prom_labels, self.alarm.unhealthy, self.alarm.rolling_accept_rate)
            if event is not None:
                if event.kind == "unhealthy":
                    logger.warning(
                        alarm_warning_message(
                            event,
                            self.config.alarm_accept_rate,
                            self.config.alarm_min_tokens,
                            record.get("drafter"),
                        )
                    )
                else:
                    logger.info(
                        "sglang_ext: drafter acceptance recovered: rolling mean accept rate "
                        "%.4f >= %s over the last %d requests; alarm re-armed",
                        event.rolling_accept_rate,
                        self.config.alarm_accept_rate,
                        event.window,
                    )
            return event


# --------------------------------------------------------------------------------------
# SGLang side: reading TokenizerManager / BatchStrOutput, and the hook
# --------------------------------------------------------------------------------------

_SPEC_KEYS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_model_path",
)


def spec_settings(tm: Any) -> dict[str, Any]:
    """Resolved speculative settings as the tokenizer process sees them.

    SGLang 0.5.23 reads them from ``sglang.srt.runtime_context.get_spec()`` (resolved
    values); 0.5.17 from ``self.server_args``. Try the former, fill gaps from the latter.
    """
    out: dict[str, Any] = dict.fromkeys(_SPEC_KEYS)
    try:
        from sglang.srt.runtime_context import get_spec

        bag = get_spec()
        for k in _SPEC_KEYS:
            try:
                out[k] = getattr(bag, k)
            except Exception:
                pass
    except Exception:
        pass
    sa = getattr(tm, "server_args", None)
    for k in _SPEC_KEYS:
        if out[k] is None and sa is not None:
            out[k] = getattr(sa, k, None)
    return out


def _item(recv_obj: Any, name: str, i: int) -> Any:
    seq = getattr(recv_obj, name, None)
    if seq is None:
        return None
    try:
        return seq[i] if len(seq) > i else None
    except TypeError:
        return None


def record_from_batch_output(tm: Any, recv_obj: Any, i: int) -> dict[str, Any] | None:
    """Build the record for item ``i`` of a BatchStrOutput / BatchTokenIDOutput, or None
    when the request had no verify step (e.g. finished at prefill)."""
    verify = _item(recv_obj, "spec_verify_ct", i)
    accepted = _item(recv_obj, "spec_num_correct_drafts", i)
    if not verify or accepted is None:
        return None
    spec = spec_settings(tm)
    finish = _item(recv_obj, "finished_reasons", i)
    finish_type = finish.get("type") if isinstance(finish, Mapping) else None
    rids = getattr(recv_obj, "rids", None) or ()
    algo = spec.get("speculative_algorithm")
    kwargs = dict(
        rid=str(rids[i]) if len(rids) > i else "",
        prompt_tokens=_item(recv_obj, "prompt_tokens", i),
        completion_tokens=int(_item(recv_obj, "completion_tokens", i) or 0),
        verify_steps=int(verify),
        accepted_draft_tokens=int(accepted),
        num_draft_tokens=spec.get("speculative_num_draft_tokens"),
        num_steps=spec.get("speculative_num_steps"),
        topk=spec.get("speculative_eagle_topk"),
        drafter=spec.get("speculative_draft_model_path"),
        algorithm=None if algo is None else str(getattr(algo, "name", algo)),
        finish_reason=finish_type,
    )
    histogram = _item(recv_obj, "spec_correct_drafts_histogram", i) or None
    try:
        return build_record(histogram=histogram, **kwargs)
    except ValueError as e:
        # Counters disagree with the histogram: keep the totals, drop per-position.
        global _HISTOGRAM_WARNED
        if not _HISTOGRAM_WARNED:
            _HISTOGRAM_WARNED = True
            logger.warning("sglang_ext: per-position acceptance unavailable: %s", e)
        return build_record(histogram=None, **kwargs)


def prometheus_labels(tm: Any, rid: str | None) -> dict[str, str] | None:
    """SGLang's tokenizer metric labels (``tm.metrics_collector.labels``) when
    ``--enable-metrics`` is on, with the request's priority / allowed custom labels filled
    in the way ``TokenizerManager.collect_metrics`` does (keys never added)."""
    if not getattr(tm, "enable_metrics", False):
        return None
    base = getattr(getattr(tm, "metrics_collector", None), "labels", None)
    if not isinstance(base, Mapping):
        return None
    labels = {k: str(v) for k, v in base.items()}
    state = getattr(tm, "rid_to_state", {}).get(rid) if rid is not None else None
    obj = getattr(state, "obj", None)
    custom = getattr(obj, "custom_labels", None)
    if isinstance(custom, Mapping):
        for k, v in custom.items():
            if k in labels:
                labels[k] = str(v)
    if "priority" in labels:
        prio = getattr(obj, "priority", None)
        if prio is not None:
            labels["priority"] = str(prio)
    return labels


_RECORDER: AcceptanceRecorder | None = None
_INTERNAL_ERRORS = 0
_HISTOGRAM_WARNED = False


def get_recorder() -> AcceptanceRecorder:
    global _RECORDER
    if _RECORDER is None:
        _RECORDER = AcceptanceRecorder(MetricsConfig.from_env())
    return _RECORDER


def after_calculate_spec_decoding_metrics(
    result: Any, tm: Any, meta_info: Any = None, recv_obj: Any = None, i: Any = None, *a, **kw
) -> None:
    """AFTER hook on ``TokenizerManager._calculate_spec_decoding_metrics(meta_info,
    recv_obj, i)``: called once per finished request while speculation is on. Never
    raises into SGLang; always returns None (the original returns None)."""
    global _INTERNAL_ERRORS
    try:
        meta_info = kw.get("meta_info", meta_info)
        recv_obj = kw.get("recv_obj", recv_obj)
        i = kw.get("i", i)
        record = record_from_batch_output(tm, recv_obj, i)
        if record is None:
            return None
        if isinstance(meta_info, dict):
            for k, v in meta_info_extras(record).items():
                meta_info.setdefault(k, v)
        get_recorder().record(record, prometheus_labels(tm, record["rid"]))
    except Exception:
        _INTERNAL_ERRORS += 1
        if _INTERNAL_ERRORS <= 3:
            logger.exception("sglang_ext: acceptance metrics hook failed (request unaffected)")
    return None


def _sglang_version() -> str:
    try:
        import sglang

        return str(getattr(sglang, "__version__", "unknown"))
    except Exception:
        return "unknown"


def hook_specs() -> list[tuple[str, str, Any]]:
    """(dotted target, hook type name, hook function) for every hook install() adds."""
    return [(CALC_SPEC_METRICS_TARGET, "AFTER", after_calculate_spec_decoding_metrics)]


def install() -> list[str]:
    """Register the acceptance-metrics hooks with SGLang's HookRegistry.

    Returns the dotted targets registered ([] when ``SGLANG_EXT_METRICS=0``). Raises
    RuntimeError naming the variable or target when the environment is invalid or a
    target does not exist in the installed SGLang. Idempotent per process.
    """
    global _RECORDER
    try:
        config = MetricsConfig.from_env()
    except ValueError as e:
        raise RuntimeError(f"sglang_ext.metrics: invalid environment: {e}") from e
    if not config.enabled:
        logger.info("sglang_ext: acceptance metrics disabled (%s=0)", ENV_ENABLE)
        return []

    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    specs = hook_specs()
    for target, _, _ in specs:
        try:
            pkgutil.resolve_name(target)
        except (ImportError, AttributeError, ValueError) as e:
            raise RuntimeError(
                f"sglang_ext.metrics: hook target {target!r} does not exist in the installed "
                f"SGLang {_sglang_version()} ({type(e).__name__}: {e}). This plugin supports "
                f"SGLang 0.5.17-0.5.23; per-request acceptance metrics cannot be installed."
            ) from e

    if _RECORDER is None or _RECORDER.config != config:
        _RECORDER = AcceptanceRecorder(config)

    registered: list[str] = []
    hooks_table = getattr(HookRegistry, "_hooks", {})
    for target, type_name, fn in specs:
        already = any(h is fn for _, h, *_ in hooks_table.get(target, ()))
        if not already:
            HookRegistry.register(target, fn, getattr(HookType, type_name))
        registered.append(target)
    return registered
