"""The GPU suite's teacher-forced lossless rule (sglang_ext_tools.lossless), on responses
shaped exactly as SGLang 0.5.23 builds them, so the alignment is checked on CPU."""

from __future__ import annotations

import math
import random

import pytest

from sglang_ext_tools import lossless


def sglang_scoring_response(sequence: list[int], start: int, logits: list[list[float]], top: int):
    """``meta_info`` of a scoring request as SGLang 0.5.23 fills it
    (logprob_result_processor._process_input_token_logprobs / _process_input_top_logprobs):
    raw entry j is computed at position start + j for the NEXT input token; the returned
    values are ``[None] + raw[:-1]`` against the ids ``sequence[start:]``."""

    def log_softmax(row):
        m = max(row)
        z = m + math.log(sum(math.exp(x - m) for x in row))
        return [x - z for x in row]

    raw_values, raw_tops = [], []
    for pos in range(start, len(sequence)):
        lp = log_softmax(logits[pos])
        nxt = sequence[pos + 1] if pos + 1 < len(sequence) else None
        raw_values.append(None if nxt is None else lp[nxt])
        ranked = sorted(range(len(lp)), key=lambda t: -lp[t])[:top]
        raw_tops.append([[lp[t], t, None] for t in ranked])
    values = [None, *raw_values[:-1]]
    tops = [None, *raw_tops[:-1]]
    ids = sequence[start:]
    return {
        "input_token_logprobs": [[v, t, None] for v, t in zip(values, ids, strict=True)],
        "input_top_logprobs": tops,
    }


def greedy_world(vocab=16, length=40, seed=0):
    """A fixed 'target': logits at every position; its greedy continuation of a prompt."""
    rng = random.Random(seed)
    logits = [[rng.gauss(0, 3) for _ in range(vocab)] for _ in range(length)]
    prompt = [rng.randrange(vocab) for _ in range(8)]
    seq = list(prompt)
    while len(seq) < length:
        row = logits[len(seq) - 1]
        seq.append(max(range(vocab), key=row.__getitem__))
    return prompt, seq[len(prompt) :], logits


def score(prompt, output, logits):
    payload = lossless.score_payload(prompt, output)
    assert payload["logprob_start_len"] == len(prompt) - 1
    assert payload["input_ids"] == prompt + output
    meta = sglang_scoring_response(payload["input_ids"], len(prompt) - 1, logits, 2)
    return lossless.scored_rows(prompt, output, meta)


def test_greedy_output_has_zero_gap_at_every_token():
    prompt, output, logits = greedy_world()
    rows = score(prompt, output, logits)
    assert len(rows) == len(output)
    assert lossless.gaps(rows) == [0.0] * len(output)


def test_the_alignment_is_one_entry_per_output_token():
    """Entry k scores output token k from the logits at the position before it."""
    prompt, output, logits = greedy_world()
    rows = score(prompt, output, logits)
    for k, (logprob, top) in enumerate(rows):
        assert top[0][1] == output[k]
        row = logits[len(prompt) + k - 1]
        assert logprob == pytest.approx(row[output[k]] - math.log(sum(map(math.exp, row))))


def test_a_planted_runner_up_at_a_clear_margin_fails_the_rule():
    prompt, output, logits = greedy_world()
    rows = score(prompt, output, logits)
    measured = lossless.tolerance([lossless.gaps(rows)])
    assert measured["tolerance"] == 0.0 and measured["tolerance_from_tokens"] == len(output)
    margin = lossless.clear_margin(measured["tolerance"])
    planted = lossless.plant_runner_up(output, rows, min_margin=margin)
    assert planted is not None
    position, bad = planted
    bad_rows = score(prompt, bad, logits)
    result = lossless.verdict({"p0": lossless.gaps(bad_rows)}, measured)
    assert not result["pass"]
    assert result["tokens_at_clear_margin"] == 1
    assert result["failures"]["p0"][0][0] == position
    assert result["failures"]["p0"][0][1] >= margin
    assert result["tokens_checked"] == len(bad)


# The 2026-12-01 MLA run's shape: 16,384 self-scored tokens (tolerance 0.5625), 8,192 checked.
MLA_MEASURED = {
    "tolerance": 0.5625,
    "tolerance_from_tokens": 16384,
    "self_nonzero_gap_fraction": 0.003,
}


def test_one_token_in_the_tail_beyond_the_self_maximum_passes():
    """A correct server's tokens follow the self gaps' tail: one of 8,192 at 1.1875 (the
    2026-12-01 MLA chain, p016 token 106) is within chance and short of the clear margin."""
    gaps = {"p016": [0.0] * 106 + [1.1875] + [0.0] * 21, "rest": [0.0] * (8192 - 128)}
    result = lossless.verdict(gaps, MLA_MEASURED)
    assert result["pass"], result
    assert result["tokens_above_tolerance"] == 1 and result["failures"] == {"p016": [[106, 1.1875]]}
    assert result["clear_margin"] == 2.25


def test_many_small_deviations_above_the_tolerance_fail():
    """A bug that moves many tokens a little: more above the tolerance than chance allows."""
    allowed = lossless.allowed_above(8192, 16384)
    assert allowed == 6  # Poisson(1.5): P(X > 6) = 0.00045
    gaps = {f"p{i}": [0.75] + [0.0] * 127 for i in range(allowed + 1)}
    gaps["rest"] = [0.0] * (8192 - 128 * (allowed + 1))
    result = lossless.verdict(gaps, MLA_MEASURED)
    assert not result["pass"]
    assert result["tokens_above_tolerance"] == allowed + 1
    assert result["tokens_at_clear_margin"] == 0
    gaps["p0"][0] = 0.0
    assert lossless.verdict(gaps, MLA_MEASURED)["pass"]


def test_one_token_at_the_clear_margin_fails_however_many_are_checked():
    gaps = {"p0": [2.25] + [0.0] * 8191}
    result = lossless.verdict(gaps, MLA_MEASURED)
    assert not result["pass"] and result["tokens_at_clear_margin"] == 1


# The fourth 2026-12-01 run's MLA self comparison (16,384 tokens): one routing flip at 2.906
# made the maximum, the rest of the tail below 1 nat (self_gap_histogram of that run).
MOE_SELF = [0.0] * 16330 + [1 / 32] * 4 + [1 / 16] * 36 + [1 / 8] * 3 + [1 / 4] * 2
MOE_SELF += [1 / 2] * 4 + [1.0] * 4 + [2.90625]


def test_a_tail_maximum_does_not_hide_many_tokens_moved_by_one_nat():
    """The maximum of an MoE target's self gaps is one routing flip (2.9 nats); a bug that
    moves 1 % of the tokens by 1 nat stays under it and under the clear margin (11.6), so
    only the ladder catches it: 82 tokens above 1/2 nat where the self rate allows 15."""
    measured = lossless.tolerance([MOE_SELF])
    assert measured["tolerance"] == 2.90625 and measured["self_above"]["0.5"] == 5
    gaps = {f"p{i}": [1.0] + [0.0] * 99 for i in range(82)}  # 8,200 tokens, 82 at 1 nat
    result = lossless.verdict(gaps, measured)
    assert result["tokens_above_tolerance"] == 0 and result["tokens_at_clear_margin"] == 0
    assert not result["pass"]
    assert 0.5 in result["ladder_over"] and 0.25 in result["ladder_over"]
    rung = next(r for r in result["ladder"] if r["above"] == 0.5)
    assert rung == {"above": 0.5, "tokens": 82, "self": 5, "allowed": 15}
    without_ladder = {k: v for k, v in measured.items() if k != "self_above"}
    assert lossless.verdict(gaps, without_ladder)["pass"]  # the rule before the ladder


def test_the_recorded_honest_runs_pass_the_ladder():
    """Served gaps like the fourth run's MLA chain (8,192 tokens: 30 above 1/32, 7, 6, 6, 5
    above 1/2, 2 above 1 nat, max 1.65625) against that run's self comparison: within chance
    at every rung."""
    measured = lossless.tolerance([MOE_SELF])
    served = [0.0] * 8162 + [1 / 32] * 23 + [1 / 16] * 1 + [1 / 2] * 1 + [1.0] * 3
    served += [1.5, 1.65625]
    assert len(served) == 8192
    result = lossless.verdict({"all": served}, measured)
    assert result["pass"], result["ladder"]
    assert result["ladder_over"] == []


def test_rate_upper_is_the_poisson_bound():
    assert lossless.rate_upper(0) == pytest.approx(2.9957, abs=1e-3)  # the rule of three
    assert lossless.rate_upper(1) == pytest.approx(4.7439, abs=1e-3)
    assert lossless.rate_upper(10) == pytest.approx(17.0, abs=0.05)
    assert lossless.allowed_count(8192, 0, 16384, 1e-3) == lossless.allowed_above(8192, 16384)


def test_allowed_above_is_the_poisson_quantile():
    # lambda = 3: P(X > 9) = 0.0011, P(X > 10) = 0.0003
    assert lossless.allowed_above(100, 100) == 10
    assert lossless.allowed_above(1, 10**9) == 0
    with pytest.raises(ValueError, match="no tokens"):
        lossless.allowed_above(10, 0)


def test_a_near_tie_within_the_measured_tolerance_passes():
    prompt, output, logits = greedy_world()
    k = 5
    pos = len(prompt) + k - 1
    runner = sorted(range(16), key=lambda t: -logits[pos][t])[1]
    logits[pos][runner] = logits[pos][output[k]] - 0.03  # a near-tie
    rows = score(prompt, output, logits)
    tied = [*output[:k], runner, *output[k + 1 :]]
    # The self outputs met a tie of 0.05 once: the tolerance is 0.05.
    measured = {
        "tolerance": 0.05,
        "tolerance_from_tokens": 1000,
        "self_nonzero_gap_fraction": 0.001,
    }
    result = lossless.verdict({"p0": lossless.gaps(score(prompt, tied, logits))}, measured)
    assert result["pass"], result
    assert result["max_gap"] == pytest.approx(0.03, abs=1e-4)
    assert lossless.gaps(rows)[k] == 0.0


def test_every_token_is_checked_not_only_the_first_divergence():
    prompt, output, logits = greedy_world()
    rows = score(prompt, output, logits)
    late = len(output) - 2
    top = rows[late][1]
    wrong = [*output[:late], top[1][1], *output[late + 1 :]]
    measured = lossless.tolerance([lossless.gaps(rows)])
    result = lossless.verdict(
        {"ok": lossless.gaps(rows), "late": lossless.gaps(score(prompt, wrong, logits))}, measured
    )
    assert list(result["failures"]) == ["late"]
    assert result["failures"]["late"][0][0] == late


def test_a_misaligned_response_is_an_error_not_a_verdict():
    prompt, output, logits = greedy_world()
    payload = lossless.score_payload(prompt, output)
    meta = sglang_scoring_response(payload["input_ids"], len(prompt), logits, 2)  # start + 1
    with pytest.raises(ValueError, match="expected"):
        lossless.scored_rows(prompt, output, meta)


def test_tolerance_needs_tokens():
    with pytest.raises(ValueError, match="no scored tokens"):
        lossless.tolerance([[], []])
