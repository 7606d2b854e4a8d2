"""speculators' sliding window served: a drafter trained with window S = 256 on 1280-token
sequences (make_fixtures --variants ...,window) on prompts of 1100-1500 tokens, where the
window binds. Its served tau is compared with the offline reference computed with the
trained window (speculators' mask) and with full attention (fixtures.json "window").

Whether this server applies the window is read from its own startup log (served as trained
on SGLang >= 0.5.23, full attention with a warning before). Its tau must be equivalent (95 %
paired interval inside [0.95, 1.05]) to the reference teacher-forced on the served text with
the window it applies. Writes the results JSON's "window" key.
"""

from __future__ import annotations

import json
import re

import pytest
from suite import (
    FIXTURES,
    RESULTS,
    WINDOW_DRAFTER,
    free_running,
    like_for_like,
    paired_counts,
    reference,
    served_tau,
)

from sglang_ext_tools import tau_compare

# The plugin's startup lines, from this run's server log: served as trained, or full attention.
APPLIED_LOG = re.compile(r"sliding window as trained")
NOT_APPLIED_LOG = re.compile(r"cannot apply a per-layer window")


def load_window_prompts(info: dict) -> list[dict]:
    path = FIXTURES / info["prompts"]["path"]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_window_drafter_served_like_its_windowed_reference(cluster):
    manifest = json.loads((FIXTURES / "fixtures.json").read_text())
    info = manifest.get("window")
    if not info or "tau_reference_window" not in info:
        pytest.skip("no window fixture: make_fixtures.py --variants ...,window (with reference)")
    server = cluster["window"]
    RESULTS["window"] = {"status": server.status}
    assert server.status == "ready", server.log_text()[-4000:]
    prompts = load_window_prompts(info)
    window_rows, full_rows = reference(WINDOW_DRAFTER), reference(f"{WINDOW_DRAFTER}-full")
    outputs = server.generate_many(
        [p["input_ids"] for p in prompts], info["max_new_tokens"], concurrency=1
    )
    served = served_tau(outputs)
    log = server.log_text()
    applied = bool(APPLIED_LOG.search(log))
    assert applied != bool(NOT_APPLIED_LOG.search(log)), "the server log says neither or both"
    # Like for like: the reference teacher-forced on the served text, with the trained window
    # and with full attention; the one this server applies must be equivalent to it.
    steps = 3
    rows_window = like_for_like(
        FIXTURES / "llama-target", FIXTURES / WINDOW_DRAFTER, prompts, outputs, steps
    )
    rows_full = like_for_like(
        FIXTURES / "llama-target", FIXTURES / WINDOW_DRAFTER, prompts, outputs, steps, False
    )
    served_counts, window_counts = paired_counts(outputs, rows_window)
    _, full_counts = paired_counts(outputs, rows_full)
    vs_window = tau_compare.equivalence(served_counts, window_counts)
    vs_full = tau_compare.equivalence(served_counts, full_counts)
    expected = vs_window if applied else vs_full
    RESULTS.setdefault("tau_equivalence", {})["window"] = {
        **expected,
        "reference": "like for like, " + ("trained window" if applied else "full attention"),
    }
    lengths = [len(p["input_ids"]) for p in prompts]
    RESULTS["window"] = {
        "status": server.status,
        "trained_window": info["sliding_window"],
        "prompt_tokens": {"min": min(lengths), "mean": round(sum(lengths) / len(lengths), 1)},
        "prompts": len(prompts),
        "max_new_tokens": info["max_new_tokens"],
        "setting": "3/1/4",
        "concurrency": 1,
        "tau_served": round(served, 4),
        "like_for_like_window": vs_window,
        "like_for_like_full": vs_full,
        "applied": applied,
        "applied_source": "this run's server log (the plugin's startup line)",
        "sglang_version": _sglang_version(),
        # recorded: the fixtures' free-running references (their own continuations)
        "free_running_window": free_running(prompts, outputs, window_rows),
        "free_running_full": free_running(prompts, outputs, full_rows),
        "definition": "(accepted draft tokens + verify steps) / verify steps; references: "
        "sglang_ext_tools.reference teacher-forced on the served text, with the trained "
        "window (speculators' mask kv > q - S) and with full attention",
    }
    assert expected["pass"], RESULTS["window"]


def _sglang_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None
