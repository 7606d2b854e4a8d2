"""sglang_ext_tools.stats.speedup_agreement: when two timings of the same prompts disagree
(CPU; synthetic latencies with a known answer)."""

from __future__ import annotations

import random

import pytest

from sglang_ext_tools.stats import speedup_agreement


def _timing(speedup: float, noise: float, seed: int, n: int = 16) -> list[tuple[float, float]]:
    """Per prompt (spec latency, baseline latency): prompt lengths vary 3x (they cancel in the
    pairing); each latency carries independent multiplicative noise."""
    rng = random.Random(seed)
    rows = []
    for k in range(n):
        base = 0.2 + 0.4 * k / n
        rows.append(
            (
                base / speedup * (1 + rng.gauss(0, noise)),
                base * (1 + rng.gauss(0, noise)),
            )
        )
    return rows


def test_identical_timings_agree_exactly():
    rows = _timing(0.8, 0.05, seed=1)
    out = speedup_agreement(rows, rows, tolerance=0.1)
    assert out["ratio"] == 1.0 and out["ci95"] == [1.0, 1.0] and out["agree"]
    assert out["band"] == [0.9091, 1.1] and out["prompts"] == 16


def test_noise_alone_does_not_fail_but_a_swapped_baseline_does():
    # 200 pairs of independent timings of the same true speedup (0.8) at 8 % noise per
    # request: almost all agree. The bench with its servers swapped reports 1 / 0.8 = 1.25
    # (ratio 1.56) and fails every time; timing one server twice (speedup 1, ratio 1.25) fails
    # nearly always.
    honest = [
        speedup_agreement(_timing(0.8, 0.08, s), _timing(0.8, 0.08, 1000 + s), 0.1, draws=1000)
        for s in range(200)
    ]
    assert sum(not o["agree"] for o in honest) <= 5
    swapped = [
        speedup_agreement(
            [(b, a) for a, b in _timing(0.8, 0.08, s)], _timing(0.8, 0.08, 1000 + s), 0.1, 1000
        )
        for s in range(50)
    ]
    assert all(not o["agree"] for o in swapped)
    assert all(o["ratio"] == pytest.approx(1.5625, rel=0.15) for o in swapped)
    one_server = [
        speedup_agreement(_timing(1.0, 0.08, s), _timing(0.8, 0.08, 1000 + s), 0.1, 1000)
        for s in range(50)
    ]
    assert sum(not o["agree"] for o in one_server) >= 45


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="equal lists"):
        speedup_agreement(_timing(1, 0, 0, n=4), _timing(1, 0, 0, n=5), 0.1)
    with pytest.raises(ValueError, match=">= 2 prompts"):
        speedup_agreement(_timing(1, 0, 0, n=1), _timing(1, 0, 0, n=1), 0.1)
