"""Small statistics for benchmark figures: a bootstrap interval of a ratio of paired sums
(used by scripts/bench_speed.py and the GPU seed-case test)."""

from __future__ import annotations

import random
from collections.abc import Sequence


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
    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        picks = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        ratios.append(sum(a for a, _ in picks) / sum(b for _, b in picks))
    ratios.sort()
    return [round(ratios[int(0.025 * draws)], 4), round(ratios[int(0.975 * draws) - 1], 4)]
