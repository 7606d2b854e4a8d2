"""Real SGLang servers for the GPU tests: launched as subprocesses on loopback ports, waited on
through `/health_generate`, always torn down. Several small servers share one GPU (each with a
small --mem-fraction-static) and start in parallel, so the whole suite fits a short GPU lease.
"""

from __future__ import annotations

import contextlib
import os
import time

from sglang_ext_tools.launch import BASE_FLAGS, STOCK_ENV, spec_flags, start_all, stop_all
from sglang_ext_tools.launch import Server as _LaunchServer

__all__ = [
    "BASE_FLAGS",
    "EXTRA_ARGS",
    "DURATIONS",
    "FAILURES",
    "FINISHED_AT",
    "OUTCOMES",
    "PHASES",
    "SPEC_FLAGS",
    "STOCK_ENV",
    "Server",
    "busy_cores",
    "start_all",
    "stop_all",
    "soak_seconds",
    "timed_phase",
    "timed_tokens_per_s",
]

SPEC_FLAGS = spec_flags((3, 1, 4))  # the setting every GPU test server uses
# e.g. SGLANG_EXT_SERVER_ARGS="--dtype float32": appended to every server's command
EXTRA_ARGS = os.environ.get("SGLANG_EXT_SERVER_ARGS", "").split()
OUTCOMES: dict[str, str] = {}  # test id -> passed/failed/skipped, filled by conftest
DURATIONS: dict[str, float] = {}  # test id -> seconds (setup + call), filled by conftest
FINISHED_AT: dict[str, str] = {}  # test id -> UTC time its teardown ended, filled by conftest
# The soak (test_soak.py) streams for the three minutes unless the session's device
# time is short: then as long as it leaves after the wrap-up (settle, teardown, results, the
# last one-wait collecting them), never under two minutes.
SOAK_TARGET_S, SOAK_MIN_S, SOAK_RESERVE_S = 180.0, 120.0, 75.0


def soak_seconds(environ=os.environ, now: float | None = None) -> float:
    """$SGLANG_EXT_SOAK_S when set; else SOAK_TARGET_S cut to $SGLANG_EXT_SUITE_DEADLINE (unix
    seconds; node/gpu_node.sh one-install writes it from the lease's device time left) less
    SOAK_RESERVE_S, at least SOAK_MIN_S."""
    if environ.get("SGLANG_EXT_SOAK_S"):
        return float(environ["SGLANG_EXT_SOAK_S"])
    deadline = environ.get("SGLANG_EXT_SUITE_DEADLINE")
    if not deadline:
        return SOAK_TARGET_S
    left = float(deadline) - (time.time() if now is None else now) - SOAK_RESERVE_S
    return max(SOAK_MIN_S, min(SOAK_TARGET_S, round(left)))


# "test.phase" -> seconds: where a long test's time goes (servers generating, the HF reference
# loading, teacher-forcing, ...), the data a cut of the suite's device time needs
PHASES: dict[str, float] = {}


@contextlib.contextmanager
def timed_phase(name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        PHASES[name] = round(PHASES.get(name, 0.0) + time.perf_counter() - start, 1)


def _cpu_jiffies(stat_text: str) -> tuple[int, int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat's first line (busy: all but idle
    and iowait), and the number of CPUs it sums (its ``cpuN`` lines)."""
    lines = stat_text.splitlines()
    fields = [int(x) for x in lines[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit())
    return sum(fields) - idle, sum(fields), cpus


@contextlib.contextmanager
def busy_cores(record: dict, key: str, stat_path: str = "/proc/stat"):
    """``record[key]``: how many of the node's cores were busy, on average, while the block
    ran (the whole node, every process; None where /proc/stat is unreadable). A timed test
    records it to show what ran beside it: an idle SGLang server without --sleep-on-idle
    keeps one core busy."""

    def read():
        try:
            with open(stat_path) as handle:
                return _cpu_jiffies(handle.read())
        except (OSError, ValueError, IndexError):
            return None

    first = read()
    try:
        yield
    finally:
        last = read()
        if first is None or last is None or last[1] <= first[1]:
            record[key] = None
        else:
            share = (last[0] - first[0]) / (last[1] - first[1])
            record[key] = round(share * (last[2] or os.cpu_count() or 1), 2)


# test id -> the end of its failure report (assertion and values), filled by conftest: a run
# cut short before pytest's summary still says why a test failed (the seventh run did not)
FAILURES: dict[str, str] = {}


class Server(_LaunchServer):
    """`sglang_ext_tools.launch.Server` with $SGLANG_EXT_SERVER_ARGS appended to its command."""

    def command(self) -> list[str]:
        return super().command() + EXTRA_ARGS


def timed_tokens_per_s(
    server: Server, prompts: list[list[int]], max_new_tokens: int, concurrency: int
) -> dict:
    start = time.perf_counter()
    outputs = server.generate_many(prompts, max_new_tokens, concurrency)
    wall = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    return {
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tok_s": round(tokens / wall, 2),
        "requests": len(prompts),
        "concurrency": concurrency,
    }
