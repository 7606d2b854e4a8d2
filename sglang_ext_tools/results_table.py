"""README's GPU-suite table, rendered from an integration results JSON, so every figure in
README is one the run produced.

    python -m sglang_ext_tools.results_table RESULTS.json            # print the block
    python -m sglang_ext_tools.results_table RESULTS.json --write README.md
    python -m sglang_ext_tools.results_table RESULTS.json --check README.md

The block sits between ``<!-- gpu-results:begin -->`` and ``<!-- gpu-results:end -->``;
``--write`` replaces it, ``--check`` exits 1 when README's block differs from the rendering.
Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SEED_TEST = "test_seed_case_stock_stalls_plugin_refuses_then_serves_faster"
OFF_BY_ONE_TEST = "test_off_by_one_aux_ids_are_captured_as_configured"
METRICS_TEST = "test_metrics_overhead_at_concurrency_32"
BENCH_TEST = "test_bench_client_against_baseline"
NOT_RUN = "not run"  # collected, never reached (tests/gpu/conftest.py)
BEGIN, END = "<!-- gpu-results:begin -->", "<!-- gpu-results:end -->"


def _ci(ci) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-"


def _verdict(ok) -> str:
    return "not run" if ok is None else ("**pass**" if ok else "**FAIL**")


def _passed(data: dict, test: str):
    """The test's outcome in this run: True, False, or None when it did not run."""
    outcome = data.get("outcomes", {}).get(test)
    return None if outcome is None else outcome == "passed"


def _lossless_rows(data: dict) -> list[str]:
    rows = []
    tolerances = data.get("lossless_tolerance", {})
    for name, r in sorted(data.get("lossless", {}).items()):
        target = "mla" if name.startswith("mla") else "llama"
        base_tokens = tolerances.get(target, {}).get("tolerance_from_tokens", "?")
        counts = ""
        if "tokens_above_tolerance_allowed" in r:  # the rule with the tail allowance
            counts = (
                f"; above the tolerance {r['tokens_above_tolerance']} (chance allows "
                f"{r['tokens_above_tolerance_allowed']}), at the clear margin "
                f"(>= {r['clear_margin']:g}) {r['tokens_at_clear_margin']}"
            )
        if r.get("ladder"):  # the exceedance ladder below the tolerance
            over = r.get("ladder_over") or []
            counts += "; ladder: " + (
                "over the self rate above " + ", ".join(f"{x:g}" for x in over)
                if over
                else "within the self rate at every rung"
            )
        rows.append(
            f"| lossless `{name}` (teacher-forced) | {r['tokens_checked']} tokens, max gap "
            f"{r['max_gap']:g} vs tolerance {r['tolerance']:g} (from {base_tokens} "
            f"no-spec tokens){counts}; tokens with gap > 0: {r['nonzero_gap_fraction']:.4f} "
            f"(no-spec itself {r['self_nonzero_gap_fraction']:.4f}) | {_verdict(r['pass'])} |"
        )
    planted = data.get("lossless_planted")
    if planted:
        rows.append(
            f"| planted bug: runner-up at margin >= {planted['min_margin']:g} "
            f"(prompt {planted['prompt']}, token {planted['position']}) | rule says "
            f"{'pass' if planted['verdict_pass'] else 'fail'} | "
            f"{_verdict(not planted['verdict_pass'])} |"
        )
    return rows


def _tau_rows(data: dict) -> list[str]:
    rows = []
    for name, r in sorted(data.get("tau_equivalence", {}).items()):
        rows.append(
            f"| τ `{name}` vs {r.get('reference', 'the other server')} | ratio {r['ratio']:.4f}, "
            f"95 % CI {_ci(r['ci95'])} over {r['prompts']} prompts (τ {r['tau_a']:.3f} vs "
            f"{r['tau_b']:.3f}); band {_ci(r['band'])} | {_verdict(r['pass'])} |"
        )
    return rows


def _other_rows(data: dict) -> list[str]:
    rows = []
    llf = data.get("like_for_like", {}).get("mla_chain")
    if llf:
        rows.append(
            f"| MLA per-position acceptance, served vs like-for-like reference | "
            f"{llf['served_per_position']} vs {llf['reference_per_position']} | recorded |"
        )
    deficit = data.get("mla_deficit")
    if deficit:
        ev = deficit["evidence"]
        rows.append(
            f"| MLA deficit: cause | {deficit['cause']}; target features SGLang vs HF, largest "
            f"per-layer mean: {ev.get('max_mean_ulps_mla')} bf16 ulps (llama control "
            f"{ev.get('max_mean_ulps_llama')}) | "
            f"{_verdict(_passed(data, 'test_mla_deficit_explained'))} |"
        )
    off = data.get("off_by_one")
    if off and "plus1_vs_trained_same_text" in off:  # judged on one text since 2026-12-01
        same = {k: off[f"{k}_vs_trained_same_text"] for k in ("plus1", "minus1")}
        floor = off.get("no_features_vs_trained_same_text")
        floor_text = (
            f"; no features at all {floor['ratio']:.3f} (CI {_ci(floor['ci95'])})" if floor else ""
        )
        collapse = {k: off.get(f"{k}_collapse") for k in ("plus1", "minus1")}
        if all(collapse.values()):
            floor_text += (
                "; share of the features' gain lost: "
                + ", ".join(
                    f"{sign} {c['share_lost']:.2f} (CI {_ci(c['ci95'])})"
                    for sign, c in zip(("+1", "-1"), collapse.values(), strict=True)
                )
                + f", collapse at ≥ {collapse['plus1']['share']}"
            )
        rows.append(
            f"| aux ids shifted ±1 (MLA, {off['prompts']} prompts, the trained server's text) "
            f"| τ ratio to the trained drafter: +1 {same['plus1']['ratio']:.3f} (CI "
            f"{_ci(same['plus1']['ci95'])}), -1 {same['minus1']['ratio']:.3f} (CI "
            f"{_ci(same['minus1']['ci95'])}){floor_text}; captured features match their own "
            f"id | {_verdict(_passed(data, OFF_BY_ONE_TEST))} |"
        )
    elif off and "plus1_vs_trained" in off:
        rows.append(
            f"| aux ids shifted ±1 (MLA, {off['prompts']} prompts) | τ trained "
            f"{off['trained_tau']:.3f}, +1 {off['plus1_tau']:.3f} (ratio CI "
            f"{_ci(off['plus1_vs_trained']['ci95'])}), -1 {off['minus1_tau']:.3f} (ratio CI "
            f"{_ci(off['minus1_vs_trained']['ci95'])}); captured features match their own id | "
            f"{_verdict(_passed(data, OFF_BY_ONE_TEST))} |"
        )
    tree = data.get("tree", {}).get("tree_vs_chain")
    if tree:
        rows.append(
            f"| MLA tree 3/4/5 vs chain 3/1/4 | τ {tree['tau_a']:.3f} vs {tree['tau_b']:.3f}, "
            f"ratio CI {_ci(tree['ci95'])}, floor {tree['floor']} | {_verdict(tree['pass'])} |"
        )
    stock = data.get("stock", {}).get("plugin_vs_converted")
    if stock:
        rows.append(
            f"| plugin vs stock on the `convert --force` copy | τ {stock['tau_a']:.3f} vs "
            f"{stock['tau_b']:.3f}, ratio CI {_ci(stock['ci95'])}, floor {stock['floor']} | "
            f"{_verdict(stock['pass'])} |"
        )
    metrics = data.get("metrics", {})
    if "overhead_ratio_ci95" in metrics:
        hook = metrics.get("hook_share_of_wall")
        rows.append(
            f"| metrics on / off throughput, concurrency 32 | {metrics['overhead_ratio']:.3f} "
            f"(CI {_ci(metrics['overhead_ratio_ci95'])})"
            + (f"; hook time {hook:.2%} of wall" if hook is not None else "")
            + f" | {_verdict(_passed(data, METRICS_TEST))} |"
        )
    bench = data.get("bench", {})
    if "bench_vs_suite" in bench:
        agree = bench["bench_vs_suite"]
        low, high = agree["band"]
        rows.append(
            f"| `sglang-ext bench` speedup vs the suite's own timing of the same prompts | "
            f"{bench['bench_speedup']:.3f} (CI {_ci(bench['bench_speedup_ci95'])}) vs "
            f"{bench['suite_speedup']:.3f} (CI {_ci(bench['suite_speedup_ci95'])}); ratio "
            f"{agree['ratio']:.3f} (CI {_ci(agree['ci95'])}, paired over {agree['prompts']} "
            f"prompts), fails only wholly outside [{low:.3f}, {high:.3f}]; τ "
            f"{bench['bench_tau']} vs {bench['suite_tau']} | "
            f"{_verdict(_passed(data, BENCH_TEST))} |"
        )
    elif "suite_speedup_ci95" in bench:  # the rule until 2026-12-02
        speedup = bench["comparison"]["speedup"]
        low, high = bench["bench_speedup_allowed"]
        rows.append(
            f"| `sglang-ext bench` speedup vs the suite's own side-by-side | {speedup:.3f} vs "
            f"{bench['suite_speedup']:.3f} (allowed {low:.3f}-{high:.3f}); τ {bench['bench_tau']} "
            f"vs {bench['suite_tau']} | {_verdict(_passed(data, BENCH_TEST))} |"
        )
    seed = data.get("seed_case")
    if seed and "plugin_speedup_ci95" in seed:
        rows.append(
            f"| seed case speed, tree 3/4/5, {seed.get('distinct_prompts')} prompts, "
            f"measured alone | plugin {seed['plugin_speedup']:.3f}x "
            f"(CI {_ci(seed['plugin_speedup_ci95'])}), "
            f"stock {seed['stock_speedup']:.3f}x (CI {_ci(seed['stock_speedup_ci95'])}, τ "
            f"{seed['stock_tau']}) | "
            f"{_verdict(_passed(data, SEED_TEST))} |"
        )
    soak = data.get("soak")
    if soak:
        rows.append(
            f"| soak: {soak['streams']} streams, {soak['seconds']:g} s, client aborts | "
            f"{soak['finished']} finished (one record each: {soak['finished_with_one_record']}), "
            f"{soak['aborted_by_client']} aborted ({soak['aborted_with_a_record']} with a record), "
            f"sums match: {soak['sums_match']}, memory growth "
            f"{soak['gpu_memory_growth_after_warmup_mib']} MiB | "
            f"{_verdict(_passed(data, 'test_soak_64_streams_with_client_aborts'))} |"
        )
    public = data.get("public_configs")
    if public:
        agree = sum(v.get("doctor") == v.get("server") for v in public.values())
        rows.append(
            f"| published drafter configs: doctor's verdict = server startup | {agree} of "
            f"{len(public)} agree | {_verdict(agree == len(public))} |"
        )
    return rows


def render(data: dict, source: str) -> str:
    outcomes = data.get("outcomes", {})
    kinds = ("passed", "failed", "skipped", NOT_RUN)
    counts = {k: sum(v == k for v in outcomes.values()) for k in kinds}
    versions = data.get("versions", {})
    gpu = data.get("gpu", {})
    lines = [
        BEGIN,
        f"From `{source}`:",
        f"run {data.get('date')} on {gpu.get('name')} (uuid {gpu.get('uuid', '?')}), SGLang "
        f"{data.get('sglang_version')}, torch {data.get('torch_version')}, transformers "
        f"{versions.get('transformers')}, attention backend {data.get('attention_backend')}: "
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
        + (f", {counts[NOT_RUN]} not run (the session ended first)" if counts[NOT_RUN] else "")
        + " "
        f"(`{data.get('command')}`).",
        "",
        "| check | figures | verdict |",
        "|---|---|---|",
        *_lossless_rows(data),
        *_tau_rows(data),
        *_other_rows(data),
    ]
    # each test that did not pass, by name: a skip is named too, so "TP=2 skipped, nothing
    # else" can be read off the block
    for kind, label in (("failed", "Failed"), ("skipped", "Skipped"), (NOT_RUN, "Not run")):
        names = sorted(k for k, v in outcomes.items() if v == kind)
        if names:
            lines += ["", f"{label}: " + ", ".join(f"`{k}`" for k in names) + "."]
    return "\n".join([*lines, END])


def block_source(text: str) -> str | None:
    """The results file README's block was rendered from (None without a block)."""
    if BEGIN not in text:
        return None
    first = text.split(BEGIN, 1)[1].strip().splitlines()[0]
    return first.split("`")[1] if first.startswith("From `") else None


def replace_block(text: str, block: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"README has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + block + tail


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="integration-<date>-<gpu>-sglang<v>.json")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, help="replace the block in this README")
    group.add_argument("--check", type=Path, help="exit 1 if this README's block differs")
    args = parser.parse_args(argv)
    block = render(json.loads(args.results.read_text()), args.results.as_posix())
    if args.write:
        args.write.write_text(replace_block(args.write.read_text(), block))
    elif args.check:
        text = args.check.read_text()
        if replace_block(text, block) != text:
            print(f"{args.check}: GPU results block differs from {args.results}", file=sys.stderr)
            return 1
    else:
        print(block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
