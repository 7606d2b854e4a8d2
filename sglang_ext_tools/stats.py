"""Small statistics for benchmark figures: bootstrap intervals over paired items (used by
sglang_ext_tools/bench_speed.py, the GPU seed-case test and `tau_compare`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def bootstrap_ci(
    items: Sequence[T], statistic: Callable[[Sequence[T]], float], draws: int = 4000, seed: int = 0
) -> list[float] | None:
    """95 % percentile interval of ``statistic`` over ``items`` resampled with replacement
    (None for fewer than two items)."""
    if len(items) < 2:
        return None
    rng = random.Random(seed)
    values = sorted(
        statistic([items[rng.randrange(len(items))] for _ in items]) for _ in range(draws)
    )
    return [round(values[int(0.025 * draws)], 4), round(values[int(0.975 * draws) - 1], 4)]


def bootstrap_ratio_ci(
    numerator: Sequence[float], denominator: Sequence[float], draws: int = 4000, seed: int = 0
) -> list[float] | None:
    """95 % interval of sum(numerator) / sum(denominator), resampling the pairs. With equal
    token counts per prompt (ignore_eos), nospec time / spec time is the speedup."""
    pairs = [
        (a, b)
        for a, b in zip(numerator, denominator, strict=False)
        if a is not None and b is not None
    ]
    return bootstrap_ci(
        pairs, lambda picks: sum(a for a, _ in picks) / sum(b for _, b in picks), draws, seed
    )
