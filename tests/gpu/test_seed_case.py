"""The case this project exists for, in miniature: an MLA + MoE (DeepSeek-V3-class) target,
61 layers deep, with a speculators-trained EAGLE-3 drafter, chain and the seed's tree setting
(topk 4, 5 draft tokens), CUDA graphs on. Fixtures: scripts/make_mla_fixtures.py.

The seed: a team served Kimi-K2.5 with a speculators drafter and got accept length 1.00 and
a third of no-speculation speed, because the target handed the drafter one layer as wide as
the drafter and SGLang skipped `fc` without a word. `seed-drafter/` is that configuration.
"""

from __future__ import annotations

import json
import re
import statistics
import time

import pytest
from lossless import verdict
from suite import CHAIN, MLA_FIXTURES, MLA_NEW_TOKENS, RESULTS, TREE, load_prompts, served_tau

from sglang_ext_tools import tau_compare
from sglang_ext_tools.stats import bootstrap_ratio_ci

SPEED_PROMPTS, SPEED_TOKENS, SPEED_ROUNDS = 6, 256, 2


def setting(spec) -> str:
    return "/".join(map(str, spec))


def mla_manifest() -> dict:
    return json.loads((MLA_FIXTURES / "mla-fixtures.json").read_text())["stages"]


@pytest.fixture(scope="module")
def mla(cluster, mla_baseline):
    for name in ("mla_chain", "mla_tree"):
        assert cluster[name].status == "ready", cluster[name].log_text()[-3000:]
    ids = mla_baseline["ids"]
    outputs = {
        name: cluster[name].generate_many(ids, MLA_NEW_TOKENS, concurrency=1)
        for name in ("mla_chain", "mla_tree")
    }
    return {"cluster": cluster, "baseline": mla_baseline, "outputs": outputs}


def test_mla_chain_is_lossless_and_matches_the_reference(mla):
    base, chain = mla["baseline"], mla["outputs"]["mla_chain"]
    result = verdict(base["c1"], chain, base["bound"], [p["id"] for p in base["prompts"]])
    reference = mla_manifest()["drafter"]["small_drafter"]["reference"]
    ref_bf16 = reference["bfloat16"]
    n = ref_bf16["num_prompts"]
    # The reference ran on the first n prompts at its own max_new_tokens.
    at_ref = (
        chain[:n]
        if ref_bf16["max_new_tokens"] == MLA_NEW_TOKENS
        else (
            mla["cluster"]["mla_chain"].generate_many(
                base["ids"][:n], ref_bf16["max_new_tokens"], concurrency=1
            )
        )
    )
    tau = served_tau(at_ref)
    RESULTS.setdefault("mla", {})["chain"] = {
        "setting": setting(CHAIN),
        "tau_served": round(tau, 4),
        "tau_reference_bf16": round(ref_bf16["tau"], 4),
        "tau_reference_fp32": reference.get("float32", {}).get("tau"),  # with --ref-fp32
        "relative_difference": round(abs(tau - ref_bf16["tau"]) / ref_bf16["tau"], 4),
        "reference_prompts": n,
        "tau_served_all_prompts": round(served_tau(chain), 4),
        # recorded: the ratio's interval, and tau on the prompts both sides verified alike
        "per_prompt": tau_compare.compare(at_ref, _reference_rows(ref_bf16)[:n]),
    }
    RESULTS["lossless_mla"] = {
        **result,
        "setting": setting(CHAIN),
        "max_new_tokens": MLA_NEW_TOKENS,
        "concurrency": 1,
    }
    assert result["pass"], result
    assert abs(tau - ref_bf16["tau"]) / ref_bf16["tau"] <= 0.02


def test_tree_is_lossless_and_accepts_at_least_the_chain(mla):
    base = mla["baseline"]
    chain, tree = mla["outputs"]["mla_chain"], mla["outputs"]["mla_tree"]
    result = verdict(base["c1"], tree, base["bound"], [p["id"] for p in base["prompts"]])
    tau_tree, tau_chain = served_tau(tree), served_tau(chain)
    RESULTS["tree"] = {
        "setting": setting(TREE),
        "target": "mla-deep (61 layers)",
        "tau_served": round(tau_tree, 4),
        "tau_chain": round(tau_chain, 4),
        "chain_setting": setting(CHAIN),
        "lossless_pass": result["pass"],
        "lossless": result,
    }
    assert result["pass"], result
    assert tau_tree >= tau_chain


def _reference_rows(reference: dict) -> list[dict]:
    path = MLA_FIXTURES / reference["per_prompt_file"]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _startup_error(server) -> str | None:
    found = re.search(
        # the exception line ("...Error: message"), not the traceback's "raise ...Error("
        r"((?:DrafterConfigError|FusionError|LoadError|ValueError): [^\n]*"
        r"(?:\n  - [^\n]*)*)",
        server.log_text(),
    )
    return found.group(1) if found else server.startup_error()


def _per_request_tok_s(server, prompts: list[list[int]]) -> list[float]:
    rates = []
    for ids in prompts:
        start = time.perf_counter()
        out = server.generate(ids, SPEED_TOKENS)
        rates.append(out["meta_info"]["completion_tokens"] / (time.perf_counter() - start))
    return rates


def test_seed_case_stock_stalls_plugin_refuses_then_serves_faster(mla):
    cluster = mla["cluster"]
    nospec, stock, guard, plugin = (
        cluster[n] for n in ("mla_nospec", "mla_stock_seed", "mla_guard_seed", "mla_tree")
    )
    assert stock.status == "ready", stock.log_text()[-3000:]
    prompts = [p["input_ids"] for p in load_prompts(MLA_FIXTURES)[-SPEED_PROMPTS:]]
    rates: dict[str, list[float]] = {"nospec": [], "stock": [], "plugin": []}
    servers = {"nospec": nospec, "stock": stock, "plugin": plugin}
    for round_index in range(SPEED_ROUNDS):  # alternate the order by round
        order = list(servers) if round_index % 2 == 0 else list(reversed(servers))
        for name in order:
            rates[name] += _per_request_tok_s(servers[name], prompts)
    stock_outputs = stock.generate_many(prompts, SPEED_TOKENS, concurrency=1)
    plugin_outputs = plugin.generate_many(prompts, SPEED_TOKENS, concurrency=1)
    guard_error = _startup_error(guard)
    manifest = mla_manifest()
    mean = {name: round(statistics.fmean(values), 2) for name, values in rates.items()}
    seed = manifest["deepen"]["seed_drafter"]
    RESULTS["seed_case"] = {
        "target_arch": "DeepseekV3ForCausalLM (MLA q/kv LoRA, MoE 8 routed + 1 shared, "
        f"first_k_dense_replace 1), {manifest['deepen']['deep_target']['num_layers']} layers "
        "(6 trained + identity blocks)",
        "setting": setting(TREE),
        "seed_drafter_aux_ids": seed["eagle_aux_hidden_state_layer_ids"],
        "nospec_tok_s": mean["nospec"],
        "stock_tau": round(served_tau(stock_outputs), 4),
        "stock_tok_s": mean["stock"],
        "plugin_guard_status": guard.status,
        "plugin_guard_error": guard_error,
        "plugin_tau": round(served_tau(plugin_outputs), 4),
        "plugin_tok_s": mean["plugin"],
        "plugin_speedup": round(mean["plugin"] / mean["nospec"], 3),
        "plugin_speedup_ci95": bootstrap_ratio_ci(rates["plugin"], rates["nospec"]),
        "stock_speedup": round(mean["stock"] / mean["nospec"], 3),
        "tau_reference": round(
            manifest["drafter"]["small_drafter"]["reference"]["bfloat16"]["tau"], 4
        ),
        "tau_reference_setting": "chain, 3 steps (offline reference loop, bf16)",
        "requests_per_server": len(rates["nospec"]),
        "max_new_tokens": SPEED_TOKENS,
        "concurrency": 1,
        "per_request_tok_s": {k: [round(v, 1) for v in vals] for k, vals in rates.items()},
        "attention_backend": "triton",
    }
    # The seed's other shape (capture off): recorded for stock, refused by the plugin.
    stock_off, guard_off = cluster["mla_stock_nocapture"], cluster["mla_guard_nocapture"]
    off = {
        "stock_status": stock_off.status,
        "plugin_guard_status": guard_off.status,
        "plugin_guard_error": _startup_error(guard_off),
    }
    if stock_off.status == "ready":
        off["stock_tau"] = round(
            served_tau(stock_off.generate_many(prompts, SPEED_TOKENS, concurrency=1)), 4
        )
    RESULTS["seed_case"]["nocapture"] = off
    assert guard_off.status.startswith("exited") and off["plugin_guard_error"]
    assert "use_aux_hidden_state is false" in off["plugin_guard_error"]
    # The plugin refuses the seed's configuration at startup, naming both widths.
    assert guard.status.startswith("exited"), guard.log_text()[-3000:]
    hidden = manifest["base"]["small_target"]["hidden_size"]
    assert guard_error and str(hidden) in guard_error and str(3 * hidden) in guard_error
    # Stock SGLang serves it, silently unfused, and is slower than no speculation: the seed's
    # symptom. Its accept length is not the seed's 1.00 because the seed also ran random
    # weights (its checkpoint was dropped); SGLang >= 0.5.17 loads `layers.0.*`, and the
    # unfused drafter on the raw final state still accepts some (tau 1.31-1.35 on the H200,
    # 2026-11-30 and 2026-12-01, both SGLang versions), far below the fused drafter's.
    assert RESULTS["seed_case"]["stock_tau"] <= RESULTS["seed_case"]["plugin_tau"] - 0.5
    assert mean["plugin"] > mean["nospec"] > mean["stock"]
    assert RESULTS["seed_case"]["plugin_tau"] >= 2.0
