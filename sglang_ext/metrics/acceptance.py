"""Acceptance accounting: accept length, rates, per-position counts, the per-request record.

Pure arithmetic on the integers SGLang already keeps per request; imports neither SGLang nor
anything else of the package (the hook in :mod:`sglang_ext.metrics.hook` feeds it).

The log line is the fixed prefix ``sglang_ext.acceptance`` followed by one compact JSON object
(:func:`format_log_line` / :func:`parse_log_line`); :func:`meta_info_extras` are the keys the
hook in :mod:`sglang_ext.metrics.hook` adds to a response's ``meta_info``.

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
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

LOG_PREFIX = "sglang_ext.acceptance"
RECORD_SCHEMA = 1


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
# Per-request record, log line, meta_info keys
# --------------------------------------------------------------------------------------


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def request_counts(
    *,
    verify_steps: int,
    accepted_draft_tokens: int,
    histogram: Sequence[int] | None,
    num_draft_tokens: int | None,
    num_steps: int | None,
) -> dict[str, Any]:
    """The per-request figures of the record and of ``meta_info``, in one flat function.

    Per position it calls :func:`per_position_from_histogram`; the rest are the definitions of
    :func:`draft_tokens_per_step`, :func:`accept_length`, :func:`accept_rate` and :func:`rates`
    written out (a test holds them equal). Flat, because the hook computes this inside
    SGLang's tokenizer loop, between SGLang's own work, where every further Python call is
    paid with cold caches: calling those helpers instead raised ``bench_metrics_hook``'s
    queued / in-hook ratio from 0.353 to 0.38-0.39 (2026-12-01, CI's CPU).

    Raises ValueError on counts that contradict each other (histogram total != verify
    steps, or histogram mass != accepted drafts), which would mean SGLang's counters
    changed meaning.
    """
    if verify_steps <= 0:
        raise ValueError("a speculative record needs at least one verify step")
    if num_draft_tokens:
        per_step = max(int(num_draft_tokens) - 1, 0)
    else:
        per_step = int(num_steps) if num_steps else 0
    proposed = verify_steps * per_step
    accepted_pp = proposed_pp = rates_pp = None
    if histogram:
        positions = int(num_steps) if num_steps else per_step
        total = mass = 0
        for a, c in enumerate(histogram):
            total += c
            mass += a * c
        if total != verify_steps:
            raise ValueError(f"histogram total {total} != verify steps {verify_steps}")
        if mass != accepted_draft_tokens:
            raise ValueError(f"histogram mass {mass} != accepted drafts {accepted_draft_tokens}")
        accepted_pp, proposed_pp = per_position_from_histogram(histogram, positions)
        rates_pp = [round(x / total, 4) for x in accepted_pp] if accepted_pp else None
    return {
        "verify_steps": verify_steps,
        "draft_tokens_per_step": per_step,
        "proposed_draft_tokens": proposed,
        "accepted_draft_tokens": accepted_draft_tokens,
        "accept_length": round((accepted_draft_tokens + verify_steps) / verify_steps, 4),
        "accept_rate": round(accepted_draft_tokens / proposed, 4) if proposed > 0 else None,
        "accept_per_position": rates_pp,
        "accepted_per_position": accepted_pp,
        "proposed_per_position": proposed_pp,
    }


def assemble_record(
    counts: Mapping[str, Any],
    *,
    rid: str,
    prompt_tokens: int | None,
    completion_tokens: int,
    topk: int | None = None,
    drafter: str | None = None,
    algorithm: str | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """The per-request record (what is logged / written / exported) from
    :func:`request_counts` and the request's own fields."""
    verify_steps = counts["verify_steps"]
    return {
        "schema": RECORD_SCHEMA,
        "rid": rid,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "verify_steps": verify_steps,
        "draft_tokens_per_step": counts["draft_tokens_per_step"],
        "proposed_draft_tokens": counts["proposed_draft_tokens"],
        "accepted_draft_tokens": counts["accepted_draft_tokens"],
        "accept_length": counts["accept_length"],
        "sglang_accept_length": _round(sglang_accept_length(completion_tokens, verify_steps)),
        "accept_rate": counts["accept_rate"],
        "accept_per_position": counts["accept_per_position"],
        "accepted_per_position": counts["accepted_per_position"],
        "proposed_per_position": counts["proposed_per_position"],
        "topk": topk,
        "algorithm": algorithm,
        "drafter": drafter,
        "finish_reason": finish_reason,
    }


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
    """Assemble the per-request acceptance record: :func:`request_counts` (which raises
    ValueError on contradicting counts), then :func:`assemble_record`."""
    counts = request_counts(
        verify_steps=verify_steps,
        accepted_draft_tokens=accepted_draft_tokens,
        histogram=histogram,
        num_draft_tokens=num_draft_tokens,
        num_steps=num_steps,
    )
    return assemble_record(
        counts,
        rid=rid,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        topk=topk,
        drafter=drafter,
        algorithm=algorithm,
        finish_reason=finish_reason,
    )


def encode_record(record: Mapping[str, Any]) -> str:
    """The record as one compact JSON object (what the log line and the JSONL line carry)."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def format_log_line(record: Mapping[str, Any], encoded: str | None = None) -> str:
    """``sglang_ext.acceptance {json}`` (compact JSON, one line); ``encoded`` is the record's
    :func:`encode_record` when the caller has it already."""
    return LOG_PREFIX + " " + (encode_record(record) if encoded is None else encoded)


def parse_log_line(line: str) -> dict[str, Any]:
    """Inverse of :func:`format_log_line`; tolerates any prefix (timestamps etc.)."""
    marker = LOG_PREFIX + " {"
    pos = line.find(marker)
    if pos < 0:
        raise ValueError(f"not a {LOG_PREFIX} line: {line[:80]!r}")
    return json.loads(line[pos + len(LOG_PREFIX) + 1 :])


def meta_info_extras(record: Mapping[str, Any]) -> dict[str, Any]:
    """The keys added to the response meta_info (SGLang's own keys stay as they are), from a
    record or from its :func:`request_counts`."""
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
