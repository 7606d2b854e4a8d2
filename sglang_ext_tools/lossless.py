"""The GPU suite's lossless rule, teacher-forced: every token a speculative server emits is
scored by the no-speculation server, and must be the target's greedy choice up to a tie
tolerance measured on the no-speculation server itself.

Why teacher-forced: bf16 greedy output depends on the batch shape and on prefill vs decode,
so two correct servers part at near-ties, and after the first parting they verify different
texts. Comparing outputs checks one token per prompt. Scoring instead asks, for every emitted
token k, "given exactly the prefix this server produced, is token k the target's argmax?":

  the no-speculation server prefills prompt + output once (``return_logprob``,
  ``logprob_start_len = len(prompt) - 1``, ``top_logprobs_num = 2``, one new token), and
  gap_k = top-1 logprob - logprob of the emitted token k (0 when k is the argmax).

The tolerance is the largest gap of the no-speculation server's own greedy outputs (decode
at concurrency 1 and 8) scored the same way: how far decode-time argmaxes sit from
prefill-time ones in this numeric class. A maximum is not a bound, though: on an MoE target
the gaps have a tail (2026-12-01, the MLA fixture's 16,384 self tokens: 37 gaps up to 1/16,
then 6, 2, 2, 1 per doubling up to 1 nat), so a correct server's next 8,192 tokens may hold
one beyond it. A speculative server therefore passes iff

- no gap reaches the clear margin (`clear_margin`: 4 x the tolerance, at least 1 nat),
  which no tie explains; a token replaced by its runner-up at that margin fails
  (`plant_runner_up`), and
- the tokens above the tolerance are no more than chance allows (`allowed_above`): the
  self comparison saw none of its N tokens above its own maximum, so their rate is at most
  3 / N (95 %, one-sided), and n checked tokens hold more than k of them with probability
  below 0.1 % (Poisson). A bug that shifts many tokens by small gaps fails here, and
- at every rung of a ladder of gaps below the tolerance too (`LADDER`: 1/32 to 4 nats,
  doubling), the checked tokens above it are no more than the self comparison's rate there
  allows (`allowed_count`: its 95 % upper Poisson bound, 0.1 % over the ladder). The MoE
  target's maximum moves with its tail (0.5625 on 2026-12-01's third run, 2.90625 on the
  fourth, from one routing flip), and a maximum of 2.9 nats alone would pass a bug that moves
  1 % of the tokens by 1 nat; the ladder does not.

Alignment (SGLang 0.5.23, ``scheduler_components/logprob_result_processor.py``
``_process_input_token_logprobs`` / ``_process_input_top_logprobs``): with start s the server
returns one entry per input position s..n-1, the token ids ``origin_input_ids[s:]``, and the
values shifted by one (``[None] + raw[:-1]``), so entry j is the logprob of token s + j given
the tokens before it, and entry 0 is None. With s = len(prompt) - 1, entry j >= 1 scores
output token j - 1.

Stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

# float32 log-softmax of the same logits: a difference below this is the same logit.
EXACT = 1e-6


def score_payload(prompt_ids: Sequence[int], output_ids: Sequence[int], top: int = 2) -> dict:
    """The ``/generate`` request that scores ``output_ids`` after ``prompt_ids``."""
    if not prompt_ids:
        raise ValueError("teacher-forced scoring needs a prompt of at least one token")
    return {
        "input_ids": [*prompt_ids, *output_ids],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
        "return_logprob": True,
        "logprob_start_len": len(prompt_ids) - 1,
        "top_logprobs_num": top,
    }


def scored_rows(
    prompt_ids: Sequence[int], output_ids: Sequence[int], meta_info: Mapping
) -> list[tuple[float, list[tuple[float, int]]]]:
    """Per output token: (its logprob, [(logprob, token id) of the top entries]), read from
    a scoring response's ``meta_info`` (see the module's alignment note)."""
    values = meta_info["input_token_logprobs"]
    tops = meta_info["input_top_logprobs"]
    expected = len(output_ids) + 1
    if len(values) != expected or len(tops) != expected:
        raise ValueError(
            f"scoring response has {len(values)} input logprobs and {len(tops)} top rows, "
            f"expected {expected} (the prompt's last token + {len(output_ids)} output tokens)"
        )
    if values[0][1] != prompt_ids[-1]:
        raise ValueError(
            f"scoring response starts at token {values[0][1]}, expected the prompt's last "
            f"token {prompt_ids[-1]}: logprob_start_len was not len(prompt) - 1"
        )
    rows = []
    for k, token in enumerate(output_ids):
        logprob, scored_token = values[k + 1][0], values[k + 1][1]
        # SGLang clips ids >= vocab_size - 1 to 0 in the returned ids (image-token hashes):
        # a 0 there is the clipped token, any other difference is a misalignment.
        if scored_token != token and scored_token != 0:
            raise ValueError(
                f"scoring response entry {k + 1} is token {scored_token}, output token {k} "
                f"is {token}: the response is not aligned with the output"
            )
        top = sorted(((float(e[0]), int(e[1])) for e in tops[k + 1]), reverse=True)
        rows.append((float(logprob), top))
    return rows


def gaps(rows: Sequence[tuple[float, list[tuple[float, int]]]]) -> list[float]:
    """gap_k = top-1 logprob - logprob of the emitted token (0.0 when it is the argmax)."""
    out = []
    for logprob, top in rows:
        gap = top[0][0] - logprob
        out.append(0.0 if gap < EXACT else gap)
    return out


def tolerance(self_gaps: Sequence[Sequence[float]]) -> dict:
    """The tie tolerance: the largest gap of the no-speculation server's own outputs, and
    how many of them lie above each rung of the ladder (``self_above``)."""
    flat = [g for prompt in self_gaps for g in prompt]
    if not flat:
        raise ValueError("no scored tokens to measure the tie tolerance on")
    return {
        "tolerance": round(max(flat), 6),
        "tolerance_from_tokens": len(flat),
        "self_nonzero_gap_fraction": round(sum(g > 0 for g in flat) / len(flat), 6),
        "self_gap_histogram": histogram(flat),
        "self_above": above_ladder(flat),
    }


# Rungs of the exceedance ladder, in nats (bf16 logprob gaps come in 1/32 and 1/16 steps).
LADDER = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0, 2.0, 4.0)


def above_ladder(values: Sequence[float]) -> dict[str, int]:
    """How many gaps lie above each rung: ``{"0.03125": n, ...}``."""
    return {f"{x:g}": sum(v > x + EXACT for v in values) for x in LADDER}


def histogram(values: Sequence[float]) -> dict[str, int]:
    """Counts of gaps: exactly 0, and up to 1/32, 1/16, 1/8, 1/4, 1/2, 1, above 1."""
    edges = (0.0, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
    counts = {f"<={e:g}": 0 for e in edges} | {">1": 0}
    for v in values:
        for e in edges:
            if v <= e + EXACT:
                counts[f"<={e:g}"] += 1
                break
        else:
            counts[">1"] += 1
    return counts


def clear_margin(tolerance: float) -> float:
    """A gap no numeric tie explains: 4 x the tie tolerance, and at least 1 nat."""
    return max(1.0, 4 * tolerance)


# The chance, for a correct server, of more tokens above the tolerance than allowed; the
# ladder's rungs share another such budget.
ABOVE_TOLERANCE_P = 1e-3


def allowed_above(checked: int, self_tokens: int, p: float = ABOVE_TOLERANCE_P) -> int:
    """Tokens above the tolerance that chance allows among ``checked``: the smallest k with
    P(X > k) <= p for X ~ Poisson(3 * checked / self_tokens) (none of the ``self_tokens``
    self-scored tokens lies above their own maximum: the rate is at most 3 / self_tokens)."""
    if self_tokens <= 0:
        raise ValueError("the tolerance was measured on no tokens")
    return poisson_quantile(3.0 * checked / self_tokens, p)


def poisson_quantile(lam: float, p: float) -> int:
    """The smallest k with P(X > k) <= p for X ~ Poisson(lam)."""
    k, term = 0, math.exp(-lam)
    cumulative = term
    while 1.0 - cumulative > p:
        k += 1
        term *= lam / k
        cumulative += term
    return k


def verdict(gaps_by_prompt: Mapping[str, Sequence[float]], measured: Mapping) -> dict:
    """Pass iff no emitted token's gap reaches the clear margin and the tokens above the
    measured tolerance are no more than chance allows (see the module docstring)."""
    tol = measured["tolerance"]
    margin = clear_margin(tol)
    flat = [g for prompt in gaps_by_prompt.values() for g in prompt]
    failures = {
        pid: [[k, round(g, 5)] for k, g in enumerate(prompt) if g > tol + EXACT][:8]
        for pid, prompt in gaps_by_prompt.items()
    }
    failures = {pid: f for pid, f in failures.items() if f}
    above = sum(g > tol + EXACT for g in flat)
    clear = sum(g >= margin - EXACT for g in flat)
    allowed = allowed_above(len(flat), measured["tolerance_from_tokens"])
    rungs = ladder(flat, measured)
    over = [r["above"] for r in rungs or () if r["tokens"] > r["allowed"]]
    return {
        "rule": "teacher-forced",
        "prompts": len(gaps_by_prompt),
        "tokens_checked": len(flat),
        "tolerance": tol,
        "tolerance_from_tokens": measured["tolerance_from_tokens"],
        "max_gap": round(max(flat, default=0.0), 6),
        "nonzero_gap_fraction": round(sum(g > 0 for g in flat) / max(1, len(flat)), 6),
        "self_nonzero_gap_fraction": measured["self_nonzero_gap_fraction"],
        "gap_histogram": histogram(flat),
        "tokens_above_tolerance": above,
        "tokens_above_tolerance_allowed": allowed,
        "clear_margin": margin,
        "tokens_at_clear_margin": clear,
        "ladder": rungs,
        "ladder_over": over,
        # the tokens above the tolerance (at most 8 per prompt), failing or not
        "failures": failures,
        "pass": bool(flat) and clear == 0 and above <= allowed and not over,
    }


def plant_runner_up(
    output_ids: Sequence[int],
    rows: Sequence[tuple[float, list[tuple[float, int]]]],
    min_margin: float,
) -> tuple[int, list[int]] | None:
    """A planted bug: the first output token whose top-1 leads the runner-up by at least
    ``min_margin``, replaced by the runner-up. (position, new output ids), or None."""
    for k, (_, top) in enumerate(rows):
        if len(top) >= 2 and top[0][1] == output_ids[k] and top[0][0] - top[1][0] >= min_margin:
            return k, [*output_ids[:k], top[1][1], *output_ids[k + 1 :]]
    return None


def rate_upper(events: int, confidence: float = 0.95) -> float:
    """The one-sided upper confidence bound of a Poisson mean from ``events`` observed: the
    lam with P(X <= events; lam) = 1 - confidence (2.996 for none: the rule of three)."""
    target = 1.0 - confidence

    def cdf(lam: float) -> float:
        term = total = math.exp(-lam)
        for k in range(1, events + 1):
            term *= lam / k
            total += term
        return total

    lo, hi = 0.0, max(10.0, 4.0 * events + 10.0)
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > target else (lo, mid)
    return hi


def allowed_count(checked: int, self_events: int, self_tokens: int, p: float) -> int:
    """Gaps above a rung that chance allows among ``checked`` tokens, when ``self_events``
    of ``self_tokens`` self-scored ones lay above it: the smallest k with P(X > k) <= p for
    X ~ Poisson(checked * rate_upper(self_events) / self_tokens)."""
    if self_tokens <= 0:
        raise ValueError("the tolerance was measured on no tokens")
    return poisson_quantile(checked * rate_upper(self_events) / self_tokens, p)


def ladder(flat: Sequence[float], measured: Mapping) -> list[dict] | None:
    """Each rung: the checked tokens above it against what the self rate there allows (None
    when the measurement predates the ladder: no ``self_above``)."""
    self_above = measured.get("self_above")
    if self_above is None:
        return None
    p = ABOVE_TOLERANCE_P / len(LADDER)
    rungs = []
    for x in LADDER:
        served = sum(g > x + EXACT for g in flat)
        allowed = allowed_count(
            len(flat), self_above[f"{x:g}"], measured["tolerance_from_tokens"], p
        )
        rungs.append(
            {"above": x, "tokens": served, "self": self_above[f"{x:g}"], "allowed": allowed}
        )
    return rungs
