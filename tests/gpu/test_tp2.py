"""Tensor parallelism: the speculators drafter served at --tp-size 2 (llama and the MLA + MoE
seed-case target), chain and tree, CUDA graphs on. Under TP the drafter's fc is replicated, the
aux capture runs on every rank and the plugin loads in every scheduler process.

A second phase of the GPU suite: it runs last, stops the TP=1 servers first and starts the
TP=2 ones alone (TP=2 servers started beside TP=1 servers die with "The memory capacity is
unbalanced"). TP=1 figures come from the first phase, on the same prompts.
"""

from __future__ import annotations

import json

import pytest
from suite import (
    CHAIN,
    FIXTURES,
    LOG_DIR,
    MAX_NEW_TOKENS,
    MLA_FIXTURES,
    MLA_NEW_TOKENS,
    PORT_BASE,
    RESULTS,
    TREE,
    Server,
    baseline,
    gpu_count_safe,
    load_prompts,
    lossless_verdict,
    prometheus_value,
    running,
    served_tau,
)

pytestmark = pytest.mark.skipif(gpu_count_safe() < 2, reason="TP=2 needs 2 GPUs")
TP2 = ["--tp-size", "2"]
JSONL_TP2 = LOG_DIR / "acceptance-tp2.jsonl"
LOSSLESS_PROMPTS = 32


@pytest.fixture(scope="module")
def tp2(cluster):
    cluster.only(())  # the TP=1 phases are over: TP=2 servers start on empty GPUs
    llama, drafter = str(FIXTURES / "llama-target"), str(FIXTURES / "llama-drafter")
    port = iter(range(PORT_BASE + 201, PORT_BASE + 300))
    metrics_env = {"SGLANG_EXT_ACCEPTANCE_JSONL": str(JSONL_TP2)}
    servers = [
        Server("tp2_nospec", llama, next(port), extra=TP2, max_bs=8),
        Server("tp2_plugin", llama, next(port), drafter, TP2 + ["--enable-metrics"], metrics_env),
        Server(
            "tp2_guard",
            str(FIXTURES / "llama4layer-target"),
            next(port),
            str(FIXTURES / "llama4layer-sglang-drafter"),
            TP2,
        ),
    ]
    if (MLA_FIXTURES / "deep-target").exists():
        target, mla_drafter = str(MLA_FIXTURES / "deep-target"), str(MLA_FIXTURES / "deep-drafter")
        servers += [
            Server("tp2_mla_nospec", target, next(port), extra=TP2, max_bs=8),
            Server("tp2_mla_chain", target, next(port), mla_drafter, TP2, spec=CHAIN),
            Server("tp2_mla_tree", target, next(port), mla_drafter, TP2, spec=TREE),
        ]
    JSONL_TP2.unlink(missing_ok=True)
    with running(servers, "startup_tp2") as started:
        yield started


def _case(tp2, nospec: str, spec: str, prompts, max_new_tokens: int, tau_tp1, name: str) -> dict:
    for server in (tp2[nospec], tp2[spec]):
        assert server.status == "ready", server.log_text()[-3000:]
    base = baseline(tp2[nospec], prompts, max_new_tokens, name)
    outputs = tp2[spec].generate_many(base["ids"], max_new_tokens, concurrency=1)
    lossless = lossless_verdict(base, outputs, f"tp2_{name}")
    tau = served_tau(outputs)
    return {
        "tp": 2,
        "tau_served": round(tau, 4),
        "tau_tp1": tau_tp1,
        "relative_difference": round(abs(tau - tau_tp1) / tau_tp1, 4) if tau_tp1 else None,
        "lossless_pass": lossless["pass"],
        "lossless": lossless,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
    }


def _per_request_metrics(server, requests: int) -> dict:
    log_lines = sum("sglang_ext.acceptance {" in line for line in server.log_text().splitlines())
    records = [json.loads(line) for line in JSONL_TP2.read_text().splitlines() if line.strip()]
    text = server.metrics_text()
    verify_total = prometheus_value(text, "sglang:spec_verify_calls_total")
    tokens_total = prometheus_value(text, "sglang:generation_tokens_total")
    return {
        "requests_sent": requests,
        "log_lines": log_lines,
        "jsonl_records": len(records),
        "summed_verify_steps": sum(r["verify_steps"] for r in records),
        "sglang_spec_verify_calls_total": verify_total,
        "summed_completion_tokens": sum(r["completion_tokens"] for r in records),
        "sglang_generation_tokens_total": tokens_total,
    }


def test_tp2_llama_is_lossless_with_tp1_acceptance_and_one_record_per_request(tp2):
    tau_tp1 = RESULTS.get("lossless", {}).get("tau_served")  # phase 1, same prompts
    prompts = load_prompts()[:LOSSLESS_PROMPTS]
    result = _case(tp2, "tp2_nospec", "tp2_plugin", prompts, MAX_NEW_TOKENS, tau_tp1, "tp2")
    metrics = _per_request_metrics(tp2["tp2_plugin"], len(prompts))
    result["metrics"] = metrics
    result["per_request_sum_matches_aggregate"] = (
        metrics["summed_verify_steps"] == metrics["sglang_spec_verify_calls_total"]
        and metrics["summed_completion_tokens"] == metrics["sglang_generation_tokens_total"]
    )
    RESULTS["tp2"] = result
    assert result["lossless_pass"], result["lossless"]
    assert tau_tp1 and result["relative_difference"] <= 0.02
    # One record per request (SGLang's warmup request included), not one per rank.
    assert metrics["log_lines"] == metrics["jsonl_records"]
    assert len(prompts) <= metrics["jsonl_records"] <= len(prompts) + 1
    assert result["per_request_sum_matches_aggregate"], metrics


def test_tp2_mla_chain_and_tree(tp2):
    if "tp2_mla_chain" not in tp2:
        pytest.skip(f"no MLA fixtures in {MLA_FIXTURES}")
    tau_tp1 = RESULTS.get("mla", {}).get("chain", {}).get("tau_served_all_prompts")
    prompts = load_prompts(MLA_FIXTURES)[:LOSSLESS_PROMPTS]
    result = _case(
        tp2, "tp2_mla_nospec", "tp2_mla_chain", prompts, MLA_NEW_TOKENS, tau_tp1, "tp2_mla"
    )
    tree = tp2["tp2_mla_tree"].generate_many(
        [p["input_ids"] for p in prompts], MLA_NEW_TOKENS, concurrency=1
    )
    result["tree"] = {"setting": "/".join(map(str, TREE)), "tau_served": round(served_tau(tree), 4)}
    RESULTS["tp2_mla"] = result
    assert result["lossless_pass"], result["lossless"]
    assert tau_tp1 and result["relative_difference"] <= 0.02
    assert result["tree"]["tau_served"] >= result["tau_served"]


def test_tp2_capture_mismatch_fails_at_startup_like_tp1(tp2):
    guard = tp2["tp2_guard"]
    tp1_error = RESULTS.get("fusion_guard", {}).get("plugin", {}).get("error")
    found = [line for line in guard.log_text().splitlines() if "DrafterConfigError: " in line]
    RESULTS["tp2_guard"] = {
        "status": guard.status,
        "error": found[-1] if found else None,
        "tp1_error_first_line": tp1_error.splitlines()[0] if tp1_error else None,
    }
    assert guard.status.startswith("exited"), guard.log_text()[-3000:]
    assert found and tp1_error
    assert (
        found[-1].split("DrafterConfigError: ", 1)[1]
        == tp1_error.splitlines()[0].split("DrafterConfigError: ", 1)[1]
    )
