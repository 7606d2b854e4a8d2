"""Small statistics for benchmark figures: bootstrap intervals over paired items (used by
sglang_ext_tools/bench_speed.py, the GPU seed-case test and `tau_compare`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from sglang_ext.cli.bench_report import bootstrap_interval

T = TypeVar("T")


def bootstrap_ci(
    items: Sequence[T], statistic: Callable[[Sequence[T]], float], draws: int = 4000, seed: int = 0
) -> list[float] | None:
    """95 % percentile interval of ``statistic`` over ``items`` resampled with replacement
    (None for fewer than two items), rounded to 4 digits: bench_report.bootstrap_interval."""
    if len(items) < 2:
        return None
    lo, hi = bootstrap_interval(items, statistic, draws, seed)
    return [round(lo, 4), round(hi, 4)]


def paired_values(
    numerator: Sequence[float | None], denominator: Sequence[float | None]
) -> list[tuple[float, float]]:
    """The (numerator, denominator) pairs where both are present (None: a failed prompt)."""
    return [
        (a, b)
        for a, b in zip(numerator, denominator, strict=False)
        if a is not None and b is not None
    ]


def _sum_ratio(pairs: Sequence[tuple[float, float]]) -> float:
    return sum(a for a, _ in pairs) / sum(b for _, b in pairs)


def ratio_of_sums(
    numerator: Sequence[float | None], denominator: Sequence[float | None]
) -> float | None:
    """sum(numerator) / sum(denominator) over the pairs both have: the point of the interval
    ``bootstrap_ratio_ci`` draws (None without pairs)."""
    pairs = paired_values(numerator, denominator)
    if not pairs or not sum(b for _, b in pairs):
        return None
    return _sum_ratio(pairs)


def bootstrap_ratio_ci(
    numerator: Sequence[float | None],
    denominator: Sequence[float | None],
    draws: int = 4000,
    seed: int = 0,
) -> list[float] | None:
    """95 % interval of sum(numerator) / sum(denominator), resampling the pairs. With equal
    token counts per prompt (ignore_eos), nospec time / spec time is the speedup."""
    return bootstrap_ci(paired_values(numerator, denominator), _sum_ratio, draws, seed)


def ratio_of_speedups(
    first: Sequence[tuple[float, float]],
    second: Sequence[tuple[float, float]],
    draws: int = 4000,
    seed: int = 0,
) -> tuple[float, list[float] | None]:
    """speedup(first) / speedup(second) and its 95 % interval. Each item is one prompt's
    (speculative latency, baseline latency), equal tokens on both sides; the lists are paired
    by prompt, and the bootstrap resamples prompts with all four latencies together, so what
    the prompts themselves contribute cancels."""
    if len(first) != len(second) or len(first) < 2:
        raise ValueError(f"need two equal lists of >= 2 prompts, got {len(first)}, {len(second)}")
    rows = [(a[0], a[1], b[0], b[1]) for a, b in zip(first, second, strict=True)]

    def ratio(picks: Sequence[tuple[float, float, float, float]]) -> float:
        fs, fb, ss, sb = (sum(r[k] for r in picks) for k in range(4))
        return (fb / fs) / (sb / ss)

    return round(ratio(rows), 4), bootstrap_ci(rows, ratio, draws, seed)


def speedup_agreement(
    first: Sequence[tuple[float, float]],
    second: Sequence[tuple[float, float]],
    tolerance: float,
    draws: int = 4000,
    seed: int = 0,
) -> dict:
    """Do two timings of the same prompts on the same two servers report the same speedup?
    Each item is one prompt's (speculative latency, baseline latency), equal tokens on both
    sides; the lists are paired by prompt. ratio = speedup(first) / speedup(second), its 95 %
    interval resampling the prompts (all four latencies of a prompt together, so what the
    prompts themselves contribute cancels). ``agree`` is False only when the interval lies
    wholly outside [1 / (1 + tolerance), 1 + tolerance]: the timings are shown to differ by
    more than the tolerance, which noise alone does in at most 2.5 % of runs."""
    point, ci = ratio_of_speedups(first, second, draws, seed)
    band = [round(1 / (1 + tolerance), 4), round(1 + tolerance, 4)]
    return {
        "ratio": point,
        "ci95": ci,
        "band": band,
        "prompts": len(first),
        "agree": ci[1] >= band[0] and ci[0] <= band[1],
    }
