"""Issue #24's result file from one seed-shape session's outputs: the trained bench_speed matrix,
the zero-acceptance probe (dummy weights), the fixture manifest, the served acceptance records
and the wide target's config -- measured figures copied, derived ones computed here
(cycle costs, the MoE fan-out split, the advisor and its check), nothing typed in.

    python -m sglang_ext_tools.seed_shape_result --bench B.json --probe P.json \\
        --fixtures mla-fixtures.json --target-config config.json --acceptance A.jsonl ... \\
        --out seed-shape-DATE-nvidia-h200-sglang0.5.23.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sglang_ext.cli import tune
from sglang_ext.cli.moe_fanout import MoeFanout
from sglang_ext_tools import bench_speed

CHAIN_ETA_GOAL = 0.82  # issue #24: 95 % of stock's dummy-probe ceiling (0.864)


def cycle(row: dict) -> float | None:
    """Decode steps per verify cycle as measured: tau / speedup."""
    if row.get("tau") is None or not row.get("speedup"):
        return None
    return round(row["tau"] / row["speedup"], 4)


def paired_ratio(bench: dict, a: dict | None, b: dict | None) -> dict[str, Any] | None:
    """Row a's server against row b's at batch 1, per prompt on the same prompts (each
    prompt's time averaged over the rounds): ratio of speeds and its bootstrap interval."""
    if not a or not b:
        return None
    agg = bench_speed.aggregate(bench.get("measurements", []))
    # on the rounds both servers finished (bench_speed.common_rounds)
    fast, slow = bench_speed.common_rounds(agg.get((a["server"], 1)), agg.get((b["server"], 1)))
    if not fast or not slow:
        return None
    ci, method = bench_speed.speedup_interval(slow, fast, 1)
    # the point as the run's schema has it (bench_speed.SCHEMA_VERSION's note)
    paired = bench.get("schema_version", 1) >= bench_speed.PAIRED_POINT_SINCE
    return {
        "ratio": round(bench_speed.speed_ratio(fast, slow, 1, paired), 4),
        "ratio_ci95": ci,
        "method": method,
        "servers": [a["server"], b["server"]],
    }


def overlap_finding(overlap_probe: dict | None, path: str | None) -> dict[str, Any] | None:
    """The seed's tree with the overlap scheduler on and off, side by side in one run (zero
    acceptance): whether topk > 1 overlaps in practice, and what the overlap saves."""
    if overlap_probe is None:
        return None
    rows = [r for r in overlap_probe.get("rows", []) if r.get("batch") == 1]
    by_overlap = {}
    for r in rows:
        if (r.get("steps"), r.get("topk"), r.get("draft_tokens")) == (3, 4, 5):
            by_overlap[bool(r.get("overlap"))] = r
    if set(by_overlap) != {True, False}:
        raise SystemExit(f"{path}: expected the 3/4/5 row with overlap on and off at batch 1")
    on, off = by_overlap[True], by_overlap[False]
    on_cycle, off_cycle = on["cycle_cost_decode_steps"], off["cycle_cost_decode_steps"]
    apart = on["speedup_ci95"][0] > off["speedup_ci95"][1]
    return {
        "source": path,
        "command": overlap_probe.get("command"),
        "tree_cycle_overlap_on": on_cycle,
        "tree_cycle_overlap_off": off_cycle,
        "speedup_ci95": {"on": on["speedup_ci95"], "off": off["speedup_ci95"]},
        "overlap_saves_decode_steps": round(off_cycle - on_cycle, 4),
        "tree_overlaps": bool(apart),
    }


def moe_tuning(report: dict | None, rows: list[dict]) -> dict[str, Any] | None:
    """What the served fused-MoE config (tune_moe) saves per forward, in ms, at decode (1
    token) and at each batch-1 row's verify size (its draft tokens), from the tuner's kernel
    times: the prediction the served cycle is held against."""
    if report is None:
        return None
    tokens = report["tokens"]

    def saving(m: int) -> float | None:
        entry = tokens.get(str(m))
        return entry.get("saving_ms_per_forward") if entry else None

    verify = {
        f"{r['steps']}/{r['topk']}/{r['draft_tokens']}": saving(r["draft_tokens"])
        for r in rows
        if r.get("batch") == 1 and r.get("draft_tokens")
    }
    return {
        "config_file": Path(report["config_file"]).name,
        "shape": report["shape"],
        "wall_s": report.get("wall_s"),
        "saving_ms_decode": saving(1),
        "saving_ms_verify": verify,
        "kernel_us": {
            m: {"default": round(e["default_ms"] * 1e3, 1), "tuned": round(e["best_ms"] * 1e3, 1)}
            for m, e in tokens.items()
        },
    }


def decode_split(costs: tune.Costs, setting: tune.Setting, row: dict) -> dict[str, Any]:
    """A trained row's cycle and the probe's, each request's first token taken out (the
    probe's request model; the trained servers' first token taken as the probe's)."""
    probe = costs.by_setting.get(setting)
    tau, tok_s = row.get("tau"), row.get("spec_tok_s")
    trained = costs.request.cycle(setting.label, tau, tok_s) if tau and tok_s else None
    return {
        "trained_decode_cycle": round(trained, 4) if trained is not None else None,
        "probe_decode_cycle": round(probe, 4) if probe is not None else None,
        "decode_difference": round(trained - probe, 4) if None not in (trained, probe) else None,
    }


def build(
    bench: dict,
    probe: dict,
    fixtures: dict,
    config: dict,
    records: list[dict],
    paths: dict,
    overlap_probe: dict | None = None,
    tune_moe_report: dict | None = None,
    request_model: bool = True,
) -> dict[str, Any]:
    trained = tune.bench_rows(bench, paths["bench"])
    # whole cycles (tau x tok/s ratio) on both sides of the split; the advice takes each
    # request's first token out of the probe's where it can (request_model)
    whole = tune.read_cost_file(probe, paths["probe"], split_first_token=False)
    costs = tune.read_cost_file(probe, paths["probe"]) if request_model else whole
    fanout = None if costs.has_fanout else MoeFanout.from_config(config, paths["target_config"])
    probe_key = "probe_cycle" if costs.has_fanout else "dummy_cycle"
    split = {}
    for setting, row in trained.items():
        probed = whole.by_setting.get(setting)
        measured = cycle(row)
        split[setting.label] = {
            "trained_cycle": measured,
            probe_key: probed,
            "difference": round(measured - probed, 4) if None not in (measured, probed) else None,
            "fanout_predicted": round(fanout.extra_decode_steps(setting.draft_tokens), 4)
            if fanout
            else None,
            "distinct_experts_per_layer": round(fanout.distinct_experts(setting.draft_tokens), 3)
            if fanout
            else None,
            # the same two without each request's first token (the probe's request model):
            # what a cycle costs once it is not averaged with the prefill
            **(decode_split(costs, setting, row) if costs.request else {}),
        }
    advice = tune.advise(tune.measured(records), costs.by_setting, fanout, costs.request)
    advice["check"] = tune.check_against(advice, trained)
    chains = [s for s in trained if s.is_chain and trained[s].get("eta") is not None]
    best_chain = max(chains, key=lambda s: trained[s]["speedup"]) if chains else None
    tree = trained.get(tune.Setting(3, 4, 5))
    chain = trained.get(tune.Setting(3, 1, 4))
    widen = fixtures["stages"]["widen"]
    # a run cut short (bench_speed writes its result after every measurement) says so
    incomplete = {
        name: {"partial": d.get("partial"), "aborted": d.get("aborted")}
        for name, d in (("bench", bench), ("probe", probe))
        if d.get("partial") or d.get("aborted")
    }
    return {
        **({"incomplete": incomplete} if incomplete else {}),
        "schema_version": 1,
        "date": bench["date"],
        "gpu": bench["gpu"],
        "gpu_info": bench.get("gpu_info"),
        "sglang_version": bench["sglang_version"],
        "torch_version": bench["torch_version"],
        "sglang_ext_version": bench.get("sglang_ext_version"),
        "backend": bench["attention_backend"],
        "commands": {"bench": bench["command"], "probe": probe["command"]},
        "sources": paths,
        "target": {
            "shape": widen["wide_target"]["shape"],
            "bytes": widen["wide_target"]["bytes"],
            "experts": config.get("n_routed_experts"),
            "experts_per_token": config.get("num_experts_per_tok"),
        },
        "drafter": widen["wide_drafter"]["shape"],
        "rows": bench["rows"],
        **(
            {"moe_tuning": moe_tuning(tune_moe_report, bench["rows"])}
            if tune_moe_report is not None
            else {}
        ),
        "probe_rows": probe["rows"],
        "function_check": {**widen["function_check"], "reference_tau": widen["reference_tau"]},
        "cycle_split": split,
        "tree_overlap": {
            "tree_cycle": split.get("3/4/5"),
            "chain_cycle": split.get("3/1/4"),
            "tree_speedup": tree and tree["speedup"],
            "chain_speedup": chain and chain["speedup"],
            "intervals_overlap": bool(
                tree
                and chain
                and tree["speedup_ci95"][1] >= chain["speedup_ci95"][0]
                and chain["speedup_ci95"][1] >= tree["speedup_ci95"][0]
            ),
            "patch": None,
            # the seed's tree against the best chain, same prompts, paired: what stands between
            "tree_vs_best_chain": paired_ratio(
                bench, tree, trained.get(best_chain) if best_chain else None
            ),
            **(
                {"overlap_probe": overlap_finding(overlap_probe, paths.get("overlap_probe"))}
                if overlap_probe is not None
                else {}
            ),
        },
        "advisor": {
            "recommended": advice["recommended"],
            "predicted": {r["setting"]: r for r in advice["rows"]},
            "measured": {s.label: r["speedup"] for s, r in trained.items()},
            "rank_match": advice["check"]["rank_match"],
            "check": advice["check"],
            "costs_note": "dummy-probe costs + MoE fan-out from the target config"
            if fanout
            else "costs probed on the trained target with the drafter's never-right twin"
            if costs.has_fanout
            else "dummy-probe costs",
            # each request's first token apart from its cycles (sglang_ext.cli.request_time),
            # or None: the probe's whole cycles
            "request": advice.get("request"),
        },
        "goals": {
            "best_chain": best_chain.label if best_chain else None,
            "best_chain_eta": trained[best_chain]["eta"] if best_chain else None,
            # η after the first token (long outputs): 1 / its trained cycle less the first
            # token (the probe's request model), where the probe allows it
            "best_chain_decode_eta": round(1.0 / split[best_chain.label]["trained_decode_cycle"], 4)
            if best_chain and split[best_chain.label].get("trained_decode_cycle")
            else None,
            "best_chain_speedup_ci95": trained[best_chain]["speedup_ci95"] if best_chain else None,
            "chain_eta_goal": CHAIN_ETA_GOAL,
            "chain_eta_pass": bool(best_chain and trained[best_chain]["eta"] >= CHAIN_ETA_GOAL),
            "plugin_vs_stock": (bench.get("goals") or {}).get("plugin_vs_stock"),
            # with its interval, and two stock servers' ratio beside it (--instance-noise)
            **{
                key: (bench.get("goals") or {}).get(key)
                for key in ("plugin_vs_stock_ci95", "stock_vs_stock", "stock_vs_stock_ci95")
            },
            # --second-pair: plugin_vs_stock is both pairs pooled; each pair's figure beside it
            **{
                key: bench["goals"][key]
                for key in bench_speed.SECOND_PAIR_GOALS
                if key in (bench.get("goals") or {})
            },
            "tree_ge_best_chain": bool(
                tree and best_chain and tree["speedup"] >= trained[best_chain]["speedup"]
            ),
        },
    }


def setting_pairs(bench: dict) -> dict[str, dict[str, Any]]:
    """Every pair of the main drafter's settings at batch 1 (`A over B`), paired by prompt:
    what a cut run's measurements still say about their order."""
    rows = [
        r
        for r in bench.get("rows", [])
        if r.get("batch") == 1 and r.get("spec_tok_s") and r.get("server", "").startswith("spec-")
    ]
    out = {}
    for i, a in enumerate(rows):
        for b in rows[i + 1 :]:
            name = f"{a['server'].removeprefix('spec-')} over {b['server'].removeprefix('spec-')}"
            out[name] = paired_ratio(bench, a, b)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["pairs"]:
        # python -m sglang_ext_tools.seed_shape_result pairs BENCH.json
        if len(argv) != 2:
            print("usage: seed_shape_result pairs BENCH.json", file=sys.stderr)
            return 2
        print(json.dumps(setting_pairs(json.loads(Path(argv[1]).read_text())), indent=2))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", type=Path, required=True, help="bench_speed result, trained pair")
    p.add_argument("--probe", type=Path, required=True, help="bench_speed result, dummy weights")
    p.add_argument("--fixtures", type=Path, required=True, help="make_mla_fixtures manifest")
    p.add_argument("--target-config", type=Path, required=True)
    p.add_argument("--acceptance", type=Path, nargs="+", required=True)
    p.add_argument(
        "--overlap-probe",
        type=Path,
        help="bench_speed result with the 3/4/5 row overlap on and off (--no-overlap-at 3,4,5)",
    )
    p.add_argument(
        "--tune-moe", type=Path, help="tune_moe's report: the fused-MoE config the servers ran"
    )
    p.add_argument(
        "--whole-cycles",
        action="store_true",
        help="advise on the probe's whole cycles (tau x tok/s ratio, each request's first "
        "token inside them), as `sglang-ext tune` did before 2026-12-03's fourth run",
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.out.exists():
        print(f"error: {args.out} exists; results are never overwritten", file=sys.stderr)
        return 1
    load = tune.read_json
    paths = {
        "bench": args.bench.name,
        "probe": args.probe.name,
        "fixtures": args.fixtures.name,
        "target_config": args.target_config.name,
        "acceptance": [a.name for a in args.acceptance],
        **({"overlap_probe": args.overlap_probe.name} if args.overlap_probe else {}),
        **({"tune_moe": args.tune_moe.name} if args.tune_moe else {}),
    }
    result = build(
        load(args.bench),
        load(args.probe),
        load(args.fixtures),
        load(args.target_config),
        tune.read_records(args.acceptance),
        paths,
        load(args.overlap_probe) if args.overlap_probe else None,
        load(args.tune_moe) if args.tune_moe else None,
        request_model=not args.whole_cycles,
    )
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"advisor": result["advisor"]["check"], "goals": result["goals"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
