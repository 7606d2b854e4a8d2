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
    TP1_OUTPUTS,
    TREE,
    Server,
    baseline,
    gpu_count_safe,
    like_for_like,
    lossless_verdict,
    prometheus_value,
    record_like_for_like,
    running,
    settle_acceptance,
)

from sglang_ext_tools import tau_compare

pytestmark = pytest.mark.skipif(gpu_count_safe() < 2, reason="TP=2 needs 2 GPUs")
TP2 = ["--tp-size", "2"]
JSONL_TP2 = LOG_DIR / "acceptance-tp2.jsonl"


def tp2_servers(port, mla: bool = True) -> list[Server]:
    """The phase's servers (CUDA graphs on, as every suite server): llama no-spec, plugin
    chain with metrics, the capture guard; with ``mla``, the MLA + MoE target no-spec, chain
    and the seed's tree. A CPU test reads their command lines."""
    llama, drafter = str(FIXTURES / "llama-target"), str(FIXTURES / "llama-drafter")
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
    if mla:
        target, mla_drafter = str(MLA_FIXTURES / "deep-target"), str(MLA_FIXTURES / "deep-drafter")
        servers += [
            Server("tp2_mla_nospec", target, next(port), extra=TP2, max_bs=8),
            Server("tp2_mla_chain", target, next(port), mla_drafter, TP2, spec=CHAIN),
            Server("tp2_mla_tree", target, next(port), mla_drafter, TP2, spec=TREE),
        ]
    return servers


@pytest.fixture(scope="module")
def tp2(cluster):
    cluster.only(())  # the TP=1 phases are over: TP=2 servers start on empty GPUs
    port = iter(range(PORT_BASE + 201, PORT_BASE + 300))
    servers = tp2_servers(port, mla=(MLA_FIXTURES / "deep-target").exists())
    JSONL_TP2.unlink(missing_ok=True)
    with running(servers, "startup_tp2") as started:
        yield started


def _case(tp2, nospec: str, spec: str, tp1_name: str, max_new_tokens: int, name: str, fixtures):
    """One TP=2 server against the suite's rules, on the prompts the TP=1 server served:
    every token teacher-forced (its own TP=2 no-spec baseline), tau by equivalence with the
    reference teacher-forced on its own text, and its tau against TP=1's on the same prompts
    (free-running texts differ between the two, so that ratio is recorded with its interval,
    not judged)."""
    for server in (tp2[nospec], tp2[spec]):
        assert server.status == "ready", server.log_text()[-3000:]
    tp1 = TP1_OUTPUTS.get(tp1_name)
    assert tp1, f"no TP=1 outputs of {tp1_name}: the TP=1 phase did not serve them"
    base = baseline(tp2[nospec], tp1["prompts"], max_new_tokens, name)
    outputs = tp2[spec].generate_many(base["ids"], max_new_tokens, concurrency=1)
    lossless = lossless_verdict(base, outputs, name)
    target_dir, drafter_dir = fixtures
    rows = like_for_like(target_dir, drafter_dir, tp1["prompts"], outputs, CHAIN[0])
    equivalent = record_like_for_like(name, outputs, rows, CHAIN[0])
    vs_tp1 = tau_compare.ratio_interval(
        [tau_compare.served_counts(o) for o in outputs],
        [tau_compare.served_counts(o) for o in tp1["outputs"]],
    )
    return {
        "tp": 2,
        "tau_served": vs_tp1["tau_a"],
        "tau_tp1": vs_tp1["tau_b"],
        "tau_ratio": vs_tp1["ratio"],
        "tau_ratio_ci95": vs_tp1["ci95"],
        "like_for_like": equivalent,
        "lossless_pass": lossless["pass"],
        "tokens_checked": lossless["tokens_checked"],
        "prompts": len(outputs),
        "max_new_tokens": max_new_tokens,
        "outputs": outputs,  # popped by the caller, as is "base"
        "base": base,
    }


def _per_request_metrics(server, requests: int) -> dict:
    settle_acceptance()
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
    llama = (FIXTURES / "llama-target", FIXTURES / "llama-drafter")
    result = _case(tp2, "tp2_nospec", "tp2_plugin", "llama", MAX_NEW_TOKENS, "tp2", llama)
    del result["outputs"], result["base"]
    metrics = _per_request_metrics(tp2["tp2_plugin"], result["prompts"])
    result["metrics"] = metrics
    result["per_request_sum_matches_aggregate"] = (
        metrics["summed_verify_steps"] == metrics["sglang_spec_verify_calls_total"]
        and metrics["summed_completion_tokens"] == metrics["sglang_generation_tokens_total"]
    )
    RESULTS["tp2"] = result
    assert result["tokens_checked"] >= 8000, result
    assert result["lossless_pass"], RESULTS["lossless"]["tp2"]
    assert result["like_for_like"]["pass"], result
    # One record per request (SGLang's warmup request included), not one per rank.
    assert metrics["log_lines"] == metrics["jsonl_records"]
    assert result["prompts"] <= metrics["jsonl_records"] <= result["prompts"] + 1
    assert result["per_request_sum_matches_aggregate"], metrics


def test_tp2_mla_chain_and_tree(tp2):
    if "tp2_mla_chain" not in tp2:
        pytest.skip(f"no MLA fixtures in {MLA_FIXTURES}")
    mla = (MLA_FIXTURES / "deep-target", MLA_FIXTURES / "deep-drafter")
    result = _case(
        tp2, "tp2_mla_nospec", "tp2_mla_chain", "mla_chain", MLA_NEW_TOKENS, "tp2_mla", mla
    )
    chain = result.pop("outputs")
    tp1_tree = TP1_OUTPUTS["mla_tree"]
    tree = tp2["tp2_mla_tree"].generate_many(
        [p["input_ids"] for p in tp1_tree["prompts"]], MLA_NEW_TOKENS, concurrency=1
    )
    tree_lossless = lossless_verdict(result.pop("base"), tree, "tp2_mla_tree")
    tree_vs_chain = tau_compare.non_inferiority(
        [tau_compare.served_counts(o) for o in tree],
        [tau_compare.served_counts(o) for o in chain],
        floor=0.95,
    )
    result["tree"] = {
        "setting": "/".join(map(str, TREE)),
        "tau_served": tree_vs_chain["tau_a"],
        "tree_vs_chain": tree_vs_chain,
        "lossless_pass": tree_lossless["pass"],
        "vs_tp1": tau_compare.ratio_interval(
            [tau_compare.served_counts(o) for o in tree],
            [tau_compare.served_counts(o) for o in tp1_tree["outputs"]],
        ),
    }
    RESULTS["tp2_mla"] = result
    assert result["tokens_checked"] >= 8000, result
    assert result["lossless_pass"], RESULTS["lossless"]["tp2_mla"]
    assert result["like_for_like"]["pass"], result
    assert tree_lossless["pass"], tree_lossless
    assert tree_vs_chain["pass"], result["tree"]


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
