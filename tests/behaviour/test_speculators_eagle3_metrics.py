"""Per-request speculative acceptance: the structured log line, the exact accept length and
per-position acceptance in meta_info, and the drafter-health alarm, all produced by SGLang's
TokenizerManager._calculate_spec_decoding_metrics for each finished request.

SGLang's own `spec_accept_length` (completion_tokens / verify steps) counts the prefill token:
a drafter that never gets a token accepted reads 1.33 on a 3-step request. The exact accept
length is (accepted drafts + verify steps) / verify steps.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from types import SimpleNamespace

import pytest
from eagle3_behaviour import MODE, serving
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="stage-a-test-cpu")

# The per-request log line: the plugin's own logger and prefix, or the series' line in the
# tokenizer manager's log. Both carry the same JSON record.
LOGGER, PREFIX = {
    "plugin": ("sglang.srt.sglang_ext.acceptance", "sglang_ext.acceptance "),
    "patched": ("sglang.srt.managers.tokenizer_manager", "Spec acceptance: "),
}[MODE]
STEPS = 3  # --speculative-num-steps; a chain: --speculative-num-draft-tokens 4
SPEC = dict(speculative_algorithm="EAGLE3", speculative_num_steps=STEPS,
            speculative_eagle_topk=1, speculative_num_draft_tokens=STEPS + 1,
            speculative_draft_model_path="/models/drafter")


def simulate(rid: str, accept: float, verify_steps: int, seed: int) -> dict:
    """One request's per-step accepted drafts (a chain: the first rejection ends a step)."""
    rng = random.Random(seed)
    steps = []
    for _ in range(verify_steps):
        a = 0
        while a < STEPS and rng.random() < accept:
            a += 1
        steps.append(a)
    histogram = [0] * (STEPS + 1)
    for a in steps:
        histogram[a] += 1
    return {"rid": rid, "steps": steps, "histogram": histogram,
            "verify": verify_steps, "accepted": sum(steps),
            "completion": 1 + sum(steps) + verify_steps}


def batch(requests: list[dict]):
    """The fields of a BatchStrOutput that the tokenizer manager reads."""
    return SimpleNamespace(
        rids=[r["rid"] for r in requests],
        finished_reasons=[{"type": "length"} for _ in requests],
        prompt_tokens=[17 for _ in requests],
        completion_tokens=[r["completion"] for r in requests],
        spec_verify_ct=[r["verify"] for r in requests],
        spec_num_correct_drafts=[r["accepted"] for r in requests],
        spec_num_block_accept_tokens=None,
        spec_num_cap_tokens=None,
        spec_correct_drafts_histogram=[r["histogram"] for r in requests],
        spec_cap_lens_histogram=None,
    )


def finish(requests: list[dict]) -> list[dict]:
    """Run SGLang's per-request spec metrics for each finished request; their meta_info."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    recv = batch(requests)
    metas = []
    with serving(**SPEC) as args:
        manager = SimpleNamespace(server_args=args, enable_metrics=False,
                                  metrics_collector=None, rid_to_state={})
        for i, request in enumerate(requests):
            meta = {"id": request["rid"]}
            TokenizerManager._calculate_spec_decoding_metrics(manager, meta, recv, i)
            metas.append(meta)
    return metas


def acceptance_lines(caplog, expected: int = 0) -> list[dict]:
    """The acceptance lines logged so far, once there are ``expected`` of them (within 5 s),
    or after 1 s when none are expected: a line may trail the response (the plugin writes its
    lines from a flusher thread every 0.25 s; the series writes them in the call)."""
    deadline = time.monotonic() + (5.0 if expected else 1.0)
    while True:
        lines = []
        for record in list(caplog.records):
            message = record.getMessage()
            if message.startswith(PREFIX + "{"):
                lines.append(json.loads(message[len(PREFIX):]))
        if (expected and len(lines) >= expected) or time.monotonic() >= deadline:
            return lines
        time.sleep(0.01)


def test_each_finished_request_logs_one_line_and_fills_meta_info(sglang_env, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    requests = [simulate(f"req-{k}", accept, 12, seed=k)
                for k, accept in enumerate((0.8, 0.5, 0.0))]
    metas = finish(requests)
    lines = acceptance_lines(caplog, len(requests))
    assert [line["rid"] for line in lines] == [r["rid"] for r in requests]
    for request, meta, line in zip(requests, metas, lines, strict=True):
        verify, accepted = request["verify"], request["accepted"]
        # SGLang's own keys are there and untouched ...
        assert meta["spec_verify_ct"] == verify
        assert meta["spec_accept_length"] == pytest.approx(request["completion"] / verify)
        assert meta["spec_num_correct_drafts"] == accepted
        assert meta["spec_num_proposed_drafts"] == verify * STEPS
        # ... the exact figures next to them.
        exact = (accepted + verify) / verify
        assert meta["spec_accept_length_exact"] == pytest.approx(exact, abs=1e-4)
        per_position = [sum(1 for a in request["steps"] if a > i) for i in range(STEPS)]
        assert meta["spec_accepted_per_position"] == per_position
        assert meta["spec_proposed_per_position"] == [verify] * STEPS
        assert meta["spec_accept_per_position"] == [
            pytest.approx(n / verify, abs=1e-4) for n in per_position]
        assert line["accept_length"] == pytest.approx(exact, abs=1e-4)
        sglang_accept_length = line.get("sglang_accept_length", line.get("spec_accept_length"))
        assert sglang_accept_length == pytest.approx(request["completion"] / verify, abs=1e-4)
        assert line["accept_rate"] == pytest.approx(accepted / (verify * STEPS), abs=1e-4)
        assert line["drafter"] == "/models/drafter" and line["algorithm"] == "EAGLE3"
        assert line["prompt_tokens"] == 17 and line["finish_reason"] == "length"
    never = lines[2]
    assert never["accept_length"] == 1.0 and metas[2]["spec_accept_length"] > 1.0


def test_a_request_that_finished_at_prefill_adds_nothing(sglang_env, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    request = simulate("prefill-only", 0.5, 0, seed=0)
    (meta,) = finish([request])
    assert "spec_accept_length_exact" not in meta
    assert acceptance_lines(caplog) == []


@pytest.mark.skipif(MODE == "patched", reason="the drafter-health alarm is the plugin's own; "
                    "the upstream series exports the per-position counters it is computed from")
def test_a_drafter_that_stops_being_accepted_raises_the_alarm_once(sglang_env, caplog):
    """20 long requests (the default window) at accept rate ~0 after healthy ones: one
    warning that names the likely causes, not one per request."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    healthy = [simulate(f"ok-{k}", 0.8, 40, seed=k) for k in range(20)]
    broken = [simulate(f"bad-{k}", 0.0, 40, seed=k) for k in range(25)]
    finish(healthy)
    acceptance_lines(caplog, len(healthy))
    caplog.clear()
    finish(broken)
    acceptance_lines(caplog, len(broken))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "SPECULATIVE DRAFTER LOOKS BROKEN" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "auxiliary layer ids off by one" in warnings[0]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
