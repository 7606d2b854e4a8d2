"""speculators' sliding window served: a drafter trained with window S = 256 on 1280-token
sequences (make_fixtures --variants ...,window) on prompts of 1100-1500 tokens, where the
window binds. Its served tau is compared with the offline reference computed with the
trained window (speculators' mask) and with full attention (fixtures.json "window").

Where this SGLang applies the drafter's window (`sglang_ext.compat`, feature
"draft_layer_window": 0.5.23 on) the served tau must match the windowed reference within
2 %; where it cannot (0.5.17: full attention, with a startup warning) the figures are only
recorded. Writes the results JSON's "window" key.
"""

from __future__ import annotations

import json
import re

import pytest
from suite import FIXTURES, RESULTS, WINDOW_DRAFTER, reference, served_tau, tau_of

from sglang_ext_tools import tau_compare

FEATURE = "draft_layer_window"
# The plugin's startup warning when the window is served as full attention.
NOT_APPLIED_LOG = re.compile(r"cannot apply a per-layer window")
TOLERANCE = 0.02


def window_applied(server) -> tuple[bool, str]:
    """Whether this SGLang applies the drafter's per-layer window, and where that came from:
    the plugin's feature table (`compat.supports`) or, without it, the server's log."""
    try:
        from sglang_ext import compat

        if FEATURE in getattr(compat, "FEATURE_SINCE", {}):
            return compat.supports(FEATURE), f"sglang_ext.compat.supports({FEATURE!r})"
    except ImportError:
        pass
    return not NOT_APPLIED_LOG.search(server.log_text()), "server log (no compat feature)"


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
    ref_window = tau_of([window_rows[p["id"]] for p in prompts])
    ref_full = tau_of([full_rows[p["id"]] for p in prompts])
    applied, applied_source = window_applied(server)
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
        "tau_reference": round(ref_window, 4),
        "tau_reference_full": round(ref_full, 4),
        "relative_difference": round(abs(served / ref_window - 1), 4),
        "relative_difference_full": round(abs(served / ref_full - 1), 4),
        "reference_dtype": info.get("reference_dtype"),
        # recorded: the ratio's interval, and tau on the prompts both sides verified alike
        "per_prompt": tau_compare.compare(outputs, [window_rows[p["id"]] for p in prompts]),
        "per_prompt_full": tau_compare.compare(outputs, [full_rows[p["id"]] for p in prompts]),
        "applied": applied,
        "applied_source": applied_source,
        "not_applied_warning_logged": bool(NOT_APPLIED_LOG.search(server.log_text())),
        "sglang_version": _sglang_version(),
        "definition": "(accepted draft tokens + verify steps) / verify steps; references: "
        "sglang_ext_tools.reference chain loop with the trained window (speculators' mask "
        "kv > q - S) and with full attention (fixtures.json window)",
    }
    assert served >= 1.0
    if applied:
        assert abs(served / ref_window - 1) <= TOLERANCE, RESULTS["window"]


def _sglang_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None
