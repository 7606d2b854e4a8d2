"""argparse types for counts: one reader, one message, for every command line of ours."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low`` (1: a count that 0 cannot mean)."""
    wanted = "a positive integer" if low == 1 else f"an integer >= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"expected {wanted}, found {text!r}")
        return value

    return parse


positive_int = int_at_least(1)
