"""How long the GPU soak streams (tests/gpu/harness.py soak_seconds): the issue's three
minutes, cut to the session's device time less the wrap-up, never under two minutes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
import harness  # noqa: E402


def test_three_minutes_unless_the_session_is_short():
    assert harness.soak_seconds({}, now=0) == 180
    reserve = harness.SOAK_RESERVE_S
    plenty = {"SGLANG_EXT_SUITE_DEADLINE": str(1000 + 180 + reserve + 50)}
    assert harness.soak_seconds(plenty, now=1000) == 180
    short = {"SGLANG_EXT_SUITE_DEADLINE": str(1000 + 150 + reserve)}
    assert harness.soak_seconds(short, now=1000) == 150
    late = {"SGLANG_EXT_SUITE_DEADLINE": str(1000 + 30)}
    assert harness.soak_seconds(late, now=1000) == 120  # never under two minutes


def test_an_explicit_duration_wins():
    env = {"SGLANG_EXT_SOAK_S": "45", "SGLANG_EXT_SUITE_DEADLINE": "1"}
    assert harness.soak_seconds(env, now=0) == 45.0
