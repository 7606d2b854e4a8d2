#!/usr/bin/env python
"""Side-by-side speed of EAGLE-3 speculation on one GPU: no speculation vs the plugin-served
speculators drafter at several (steps, topk, draft tokens) settings, and, at one setting, a
norm_before_residual=false drafter served by the plugin vs the same weights converted to
SGLang's format and served by stock SGLang.

All servers run at once on the one GPU (small --mem-fraction-static each) and are measured in
rounds in mirrored pairs (the second backwards), so slow drift (clocks, temperature) spreads
over all of them. Per (server, batch) the figure is the median over rounds.

    python -m sglang_ext_tools.bench_speed --target /tmp/fixtures/llama-target \\
        --drafter /tmp/fixtures/llama-drafter --prompts /tmp/fixtures/prompts.jsonl \\
        --out-json $OUT/bench_speed.json --out-png $OUT/bench_speed.png

Definitions: tok/s = completion tokens / wall time of a measurement; tau (accept length) =
sum completion_tokens / sum spec_verify_ct over requests (SGLang's meta_info definition);
speedup = spec tok/s / nospec tok/s; eta = speedup / tau; cycle cost = 1 / eta (one
speculative cycle in units of one plain decode step); plugin_vs_stock = tok/s of the
nbr-false drafter through the plugin / tok/s of its converted copy on stock SGLang.
Each row also says whether SGLang's overlap scheduler ran (``--no-overlap-at`` adds a server
with it off) and the drafter's draft vocabulary; with ``--profile``, ``cycle_breakdown`` gives
each profiled server's batch-1 cycle in decode steps: target verify, drafter and other
kernels from its trace, host time as the timed cycle less those.

The result JSON is written even when servers fail to start (their rows say so). Exit codes:
0 all servers served every request; 1 a server failed, a request failed or the run was
interrupted (partial results written); 2 usage error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import sglang_ext
from sglang_ext.cli.arg_types import positive_int
from sglang_ext.cli.bench import BenchError, RequestSpec, load_prompts, run_benchmark
from sglang_ext.cli.bench_report import RequestResult
from sglang_ext_tools import cpu_pinning, group_fit
from sglang_ext_tools.gpu_watch import GpuWatch, gpu_info
from sglang_ext_tools.launch import DEFAULT_SPEC, STOCK_ENV, Server, start_all, stop_all
from sglang_ext_tools.stats import bootstrap_ratio_ci, ratio_of_speedups, ratio_of_sums
from sglang_ext_tools.trace_breakdown import (
    breakdown,
    graph_streams,
    group_kernels,
    kernel_families,
    kernel_grids,
    load_trace,
    newest_trace,
    steady_breakdown,
    top_kernels,
)
from sglang_ext_tools.trace_host import host_breakdown

# 2 (2026-12-03): at batch 1 every paired figure's point (speedup, plugin_vs_stock, its
# second pair, vs_setting, decode_speedup) is the paired prompts' summed-time ratio, the
# statistic its bootstrap interval resamples (stats.ratio_of_sums); schema 1 divided medians
# of tok/s, which with three rounds fell outside its own interval. rebuild() derives a file's
# figures by the file's own schema
SCHEMA_VERSION = 2
PAIRED_POINT_SINCE = 2
MAIN = "speculators (plugin)"
NBR_PLUGIN = "nbr_false (plugin)"
NBR_STOCK = "nbr_false converted (stock SGLang)"
NOISE = "no speculation, measured again (noise of the ratios)"
# a variant of the baseline (LABEL@nospec): no drafter, the plugin loaded with its switch
NOSPEC_VARIANT = "no speculation"
NOSPEC_AT = "nospec"
NO_SETTINGS = "none"  # --settings none: no plain plugin server
NBR_STOCK_TWIN = "nbr_false converted (stock SGLang), second server"
NBR_PLUGIN_B = "nbr_false (plugin), second pair"
NBR_STOCK_B = "nbr_false converted (stock SGLang), second pair"
# the goals' keys --second-pair adds beside the pooled plugin_vs_stock
SECOND_PAIR_GOALS = (
    "plugin_vs_stock_pooled_over",
    "plugin_vs_stock_a",
    "plugin_vs_stock_a_ci95",
    "plugin_vs_stock_b",
    "plugin_vs_stock_b_ci95",
)
# goal name -> (figure, threshold); evaluated at `best` (plugin_vs_stock: compare setting)
GOALS = {
    "speedup_ge_2_5": ("speedup", 2.5),
    "eta_ge_0_80": ("eta", 0.80),
    "plugin_vs_stock_ge_0_99": ("plugin_vs_stock", 0.99),
}
Setting = tuple[int, int, int]

# -- Pure parts: settings, servers, plan ---------------------------------------------------------


def parse_setting(text: str) -> Setting:
    """``"steps,topk,draft_tokens"`` -> a validated tuple (argparse type)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise argparse.ArgumentTypeError(
            f"setting {text!r}: expected three integers steps,topk,draft_tokens"
        )
    steps, topk, draft = values
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"setting {text!r}: all three must be positive")
    if topk == 1 and draft != steps + 1:
        raise argparse.ArgumentTypeError(
            f"setting {text!r}: with topk 1 draft_tokens must be steps+1 = {steps + 1}"
        )
    if topk > 1 and draft > topk * steps + 1:
        raise argparse.ArgumentTypeError(
            f"setting {text!r}: draft_tokens {draft} exceeds topk*steps+1 = {topk * steps + 1}"
        )
    return steps, topk, draft


def _setting_or_none(text: str) -> Setting | None:
    """``--settings``' type: a setting, or ``none`` (no plain plugin server: the baseline and
    the variants alone, each ``LABEL@nospec`` or ``LABEL@STEPS,TOPK,DRAFT``)."""
    return None if text == NO_SETTINGS else parse_setting(text)


def label(setting: Sequence[int] | None) -> str:
    return ",".join(map(str, setting)) if setting else "-"


def parse_variant(text: str) -> tuple[str, ...]:
    """``LABEL:KEY=VALUE``: one more plugin server with the main drafter and env KEY=VALUE,
    or, where KEY starts with ``--``, with the server argument ``KEY VALUE`` (e.g.
    ``fp8draft:--speculative-draft-model-quantization=fp8``); several joined by ``+``
    (``host:A=1+B=1+--flag=x``) go to one server together. It runs at the compare setting,
    or at the one a ``LABEL@STEPS,TOPK,DRAFT`` names (``variant_setting``); ``LABEL@nospec``
    serves no drafter, the plugin loaded with the switch, against the baseline (its row's
    speedup is the switch's effect without speculation). Returns the label followed by each
    assignment's key and value."""
    label, sep, assignments = text.partition(":")
    name = label.partition("@")[0]
    out: list[str] = [label]
    for assignment in assignments.split("+"):
        key, eq, value = assignment.partition("=")
        flag = key.startswith("--")
        if (
            not (sep and eq and name and key)
            or not name.replace("_", "").isalnum()
            or (flag and (len(key) < 3 or not value))
            or key in out[1::2]
        ):
            raise argparse.ArgumentTypeError(
                f"variant {text!r}: expected LABEL:KEY=VALUE, e.g."
                " splitkv:SGLANG_EXT_SPLITKV_VERIFY=1 (an env var) or"
                " fp8draft:--speculative-draft-model-quantization=fp8 (a server argument),"
                " several (each KEY once) joined by +; LABEL@STEPS,TOPK,DRAFT runs it at that"
                " setting"
            )
        out += [key, value]
    variant_setting(label, None)  # a LABEL@SETTING's setting: ArgumentTypeError naming it
    return tuple(out)


def variant_setting(label: str, default: Setting | None) -> tuple[str, Setting | None]:
    """(name, setting) of a variant label: ``fp8@7,1,8`` -> ("fp8", (7, 1, 8)); ``serial@nospec``
    -> ("serial", None), a baseline variant (``nospec_variant``)."""
    name, at, setting = label.partition("@")
    if at and setting == NOSPEC_AT:
        return name, None
    return name, (parse_setting(setting) if at else default)


def nospec_variant(label: str) -> bool:
    """Whether a variant label names a variant of the baseline (``LABEL@nospec``)."""
    return label.partition("@")[2] == NOSPEC_AT


def variant_parts(*assignments: str) -> dict[str, Any]:
    """A variant's spec fields from its keys and values (key, value, key, value, ...):
    ``env`` for env vars, ``extra`` server args for flags."""
    env: dict[str, str] = {}
    extra: list[str] = []
    for key, value in zip(assignments[::2], assignments[1::2], strict=True):
        if key.startswith("--"):
            extra += [key, value]
        else:
            env[key] = value
    return {**({"extra": extra} if extra else {}), **({"env": env} if env else {})}


NO_OVERLAP = "--disable-overlap-schedule"


def server_specs(
    settings: Sequence[Setting],
    compare: Setting | None,
    variants: Sequence[tuple[str, str, str]] = (),
    noise: bool = False,
    no_overlap: Sequence[Setting] = (),
    instance_noise: bool = False,
    second_pair: bool = False,
) -> list[dict[str, Any]]:
    """The servers of one run, as plain data. `compare` None: no nbr-false servers. Each
    variant runs the main drafter at the compare setting (else the first) with its env.
    `noise`: the no-speculation server is measured twice per round ("nospec-again", no second
    server), so the run states the noise of its own ratios. Each `no_overlap` setting gets one
    more plugin server with SGLang's overlap scheduler off (its rows: overlap false).
    `instance_noise`: a second stock server of the nbr-false pair's configuration beside it,
    so the run states how far two servers of one configuration lie apart (plugin_vs_stock
    compares two servers, not one server twice). `second_pair`: a second plugin server and a
    second stock server of the pair's configuration, side by side (a group of their own where
    the pair's is full): two independent plugin/stock comparisons, pooled for the goal. One
    pair's figure is one draw of the servers' instance noise: on 2026-12-03 the same
    comparison gave 0.960 (0.941-0.976), 1.005 and 1.024 on three pairs of fresh servers."""

    def spec(name: str, role: str, setting: Setting | None, stock: bool = False, **kw) -> dict:
        return {"name": name, "role": role, "setting": setting, "stock": stock, **kw}

    specs = [spec("nospec", "nospec", None, stock=True)]
    if noise:
        specs.append(spec("nospec-again", "noise", None, stock=True, alias_of="nospec"))
    specs += [spec("spec-" + "-".join(map(str, s)), "spec", s) for s in settings]
    if compare is not None:
        tag = "-".join(map(str, compare))
        specs.append(spec(f"nbrfalse-plugin-{tag}", "nbr_plugin", compare))
        specs.append(spec(f"nbrfalse-stock-{tag}", "nbr_stock", compare, stock=True))
        if instance_noise:
            specs.append(spec(f"nbrfalse-stock2-{tag}", "nbr_stock_twin", compare, stock=True))
        if second_pair:
            specs.append(spec(f"nbrfalse-plugin-b-{tag}", "nbr_plugin_b", compare))
            specs.append(spec(f"nbrfalse-stock-b-{tag}", "nbr_stock_b", compare, stock=True))
    default = compare if compare is not None else (settings[0] if settings else None)
    for text, *assignments in variants:
        label, at = variant_setting(text, default)
        if nospec_variant(text):
            parts = variant_parts(*assignments)
            specs.append(spec(f"nospec-{label}", "nospec_variant", None, label=label, **parts))
            continue
        specs.append(
            spec(
                f"spec-{'-'.join(map(str, at))}-{label}",
                "variant",
                at,
                label=label,
                **variant_parts(*assignments),
            )
        )
    for setting in no_overlap:
        specs.append(
            spec(
                f"spec-{'-'.join(map(str, setting))}-nooverlap",
                "variant",
                setting,
                label="nooverlap",
                extra=[NO_OVERLAP],
            )
        )
    return specs


def drafter_path(spec: Mapping[str, Any], args: argparse.Namespace) -> str | None:
    """The drafter directory a spec's server serves (None: no speculation)."""
    return {
        "spec": args.drafter,
        "variant": args.drafter,
        "nbr_plugin": args.drafter_nbr_false,
        "nbr_stock": args.drafter_nbr_false_sglang,
        "nbr_stock_twin": args.drafter_nbr_false_sglang,
        "nbr_plugin_b": args.drafter_nbr_false,
        "nbr_stock_b": args.drafter_nbr_false_sglang,
    }.get(spec["role"])


def draft_vocab(path: str | Path | None) -> int | None:
    """A drafter's draft vocabulary from its config.json: ``draft_vocab_size`` (speculators
    and SGLang alike), else its vocabulary (a full-vocabulary drafter); None where there is
    no readable config (no drafter, a dry run's placeholder paths)."""
    if not path:
        return None
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    layer = cfg.get("transformer_layer_config") or {}
    for value in (cfg.get("draft_vocab_size"), cfg.get("vocab_size"), layer.get("vocab_size")):
        if isinstance(value, int) and value > 0:
            return value
    return None


def fit_groups(specs: Sequence[Mapping[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Whether each group's servers fit the GPU together (group_fit), before any starts.
    With ``--at-once-fit`` a group that does not fit lowers ``args.at_once`` (and regroups
    ``args.groups``) to the largest that fits; the result's ``lowered`` says from what."""
    sizes = server_sizes(specs, args)
    gpu_mib = gpu_info().get("memory_total_mib")
    fit = group_fit.check(args.groups, sizes, gpu_mib, args.mem_fraction)
    if not (fit.get("refused") and args.at_once_fit):
        return fit
    start = args.at_once or len(specs)
    for n in range(start - 1, 1, -1):
        try:
            groups = plan_groups(specs, n)
        except ValueError:  # what must run together no longer fits a group of n
            break
        trial = group_fit.check(groups, sizes, gpu_mib, args.mem_fraction)
        if "refused" not in trial:
            args.at_once, args.groups = n, groups
            return {**trial, "lowered": {"from": start, "to": n, "because": fit["refused"]}}
    return fit


def server_sizes(
    specs: Sequence[Mapping[str, Any]], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """Each spec's server estimate (group_fit.server_bytes), read off the server make_servers
    would start (its drafter, its command's prefill graph); an alias counts nothing."""
    servers = {server.name: server for server in make_servers(specs, args)}
    sizes: dict[str, dict[str, Any]] = {}
    for spec in specs:
        if spec.get("alias_of"):  # a second measurement of a server already counted
            sizes[spec["name"]] = {"total": 0.0, "alias_of": spec["alias_of"]}
        else:
            server = servers[spec["name"]]
            sizes[spec["name"]] = group_fit.server_bytes(
                args.target,
                server.draft,
                args.max_total_tokens,
                captures_prefill_graph(server.command()),
            )
    return sizes


PREFILL_GRAPH_FLAG = "--cuda-graph-backend-prefill"


def captures_prefill_graph(command: Sequence[str]) -> bool:
    """Whether a server command captures SGLang's prefill graph: the last
    ``--cuda-graph-backend-prefill`` it gives wins, as in argparse (``--prefill-graph`` puts
    one in every command, a variant's own flag comes after it); none given, SGLang 0.5.23's
    default, breakable."""
    backend = "breakable"
    for k, arg in enumerate(command):
        if arg.startswith(PREFILL_GRAPH_FLAG + "="):
            backend = arg.split("=", 1)[1]
        elif arg == PREFILL_GRAPH_FLAG and k + 1 < len(command):
            backend = command[k + 1]
    return backend != "disabled"


def make_servers(specs: Sequence[Mapping[str, Any]], args: argparse.Namespace) -> list[Server]:
    """One server per spec, except aliases (a second measurement of another spec's server)."""
    specs = [spec for spec in specs if not spec.get("alias_of")]
    return [
        Server(
            spec["name"],
            args.target,
            args.port_base + k,
            drafter_path(spec, args),
            env=server_env(spec, args),
            mem_fraction=args.mem_fraction,
            max_bs=max(args.batches),
            log_dir=Path(args.log_dir),
            spec=tuple(spec["setting"] or DEFAULT_SPEC),
            attention_backend=args.attention_backend,
            prefill_graph=args.prefill_graph,
            prefill_graph_max_tokens=args.prefill_graph_max_tokens,
            extra=server_extra_args(args) + list(spec.get("extra") or []),
        )
        for k, spec in enumerate(specs)
    ]


def server_env(spec: Mapping[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """A server's environment: stock SGLang's for stock servers; for a plugin server its
    variant's, plus (``--acceptance-dir``) the plugin's per-request acceptance records in
    DIR/NAME.jsonl, what ``sglang-ext tune`` reads."""
    if spec["stock"]:
        return dict(STOCK_ENV)
    env = dict(spec.get("env") or {})
    directory = getattr(args, "acceptance_dir", None)
    if directory and spec.get("setting"):
        env["SGLANG_EXT_ACCEPTANCE_JSONL"] = str(Path(directory) / f"{spec['name']}.jsonl")
    return env


def server_extra_args(args: argparse.Namespace) -> list[str]:
    """Flags every server gets. With several big servers starting at once, SGLang's KV budget
    (free memory now minus (1 - mem_fraction) x free memory before loading) races between
    them; a high --mem-fraction plus an explicit --max-total-tokens makes each pool a fixed
    size instead."""
    extra = shlex.split(args.server_args or "")
    if args.max_total_tokens:
        extra += ["--max-total-tokens", str(args.max_total_tokens)]
    return extra


def requests_for_batch(batch: int, waves: int, batch1_requests: int = 64) -> int:
    """Batch 1: ``batch1_requests`` prompts one after another (enough for a per-prompt
    interval); batch b: ``waves`` waves of b concurrent requests."""
    return max(batch1_requests, waves) if batch == 1 else batch * waves


def rotate(names: Sequence[str], round_idx: int) -> list[str]:
    """The servers' order in a round: rounds come in mirrored pairs (the second of a pair runs
    the first's order backwards, so over a pair every server's mean place is the same and a
    linear drift in time cancels, and each pair of neighbours runs in both orders), and each
    pair starts one place further on than the one before. (In the 2026-12-02 fa3 run every
    round only rotated: the plugin/stock pair always ran in the same order.)"""
    k = (round_idx // 2) % len(names)
    order = list(names[k:]) + list(names[:k])
    return order[::-1] if round_idx % 2 else order


def prompt_indices(num_prompts: int, round_idx: int, count: int) -> list[int]:
    """The prompts of one (round, batch): the same ones, in the same order, for every server
    and every round, so rounds differ only in time and a per-prompt pairing holds."""
    del round_idx  # kept in the signature: the plan asks per round
    return [k % num_prompts for k in range(count)]


def build_plan(
    names: Sequence[str],
    batches: Sequence[int],
    rounds: int,
    waves: int,
    num_prompts: int,
    batch1_requests: int = 64,
) -> list[dict[str, Any]]:
    plan = []
    for r in range(rounds):
        for name in rotate(names, r):
            for b in batches:
                n = requests_for_batch(b, waves, batch1_requests)
                plan.append(
                    {
                        "round": r,
                        "server": name,
                        "batch": b,
                        "requests": n,
                        "concurrency": b,
                        "prompts": prompt_indices(num_prompts, r, n),
                    }
                )
    return plan


BASELINE_ROLES = ("nospec", "noise")  # measured in every group (noise: the same server)


def plan_groups(specs: Sequence[Mapping[str, Any]], at_once: int | None) -> list[list[str]]:
    """The servers measured together, as name lists: one group of all (``at_once`` None or
    large enough), else the baseline in every group and the other servers, in order, at most
    ``at_once - 1`` to a group (the baseline is the one more that stays up). The nbr-false
    pair goes in one group: plugin_vs_stock compares the two side by side. So does each
    variant (an env switch, overlap off) with the main drafter's server at its setting, where
    the group has room: groups differ by a few per cent (2026-12-02: the same drafter cost in
    two groups came out 1.889x and 1.971x), about what a variant is meant to show. Raises
    ValueError when a group cannot hold what must run together."""
    base = [s["name"] for s in specs if s["role"] in BASELINE_ROLES]
    units: list[list[str]] = []
    previous = None
    for spec in specs:
        if spec["role"] in BASELINE_ROLES:
            continue
        if (spec["role"], previous) in (
            ("nbr_stock", "nbr_plugin"),
            ("nbr_stock_twin", "nbr_stock"),
            ("nbr_stock_b", "nbr_plugin_b"),
        ):  # server_specs' order: each pair (and its second stock server) goes together
            units[-1].append(spec["name"])
        else:
            units.append([spec["name"]])
        previous = spec["role"]
    if at_once is None or at_once >= 1 + sum(map(len, units)):
        return [base + [name for unit in units for name in unit]]
    room = at_once - 1
    by_name = {spec["name"]: spec for spec in specs}
    for spec in specs:
        if spec["role"] != "variant":
            continue
        main = [
            u
            for u in units
            if by_name[u[0]]["role"] == "spec" and by_name[u[0]]["setting"] == spec["setting"]
        ]
        if main and len(main[0]) < room:
            units.remove([spec["name"]])
            main[0].append(spec["name"])
    widest = max(units, key=len)
    if len(widest) > room:
        raise ValueError(
            f"--at-once {at_once}: {' and '.join(widest)} run beside the baseline together, "
            f"which needs --at-once {1 + len(widest)} or more"
        )
    groups: list[list[str]] = []
    for unit in units:
        if not groups or len(groups[-1]) + len(unit) > room:
            groups.append([])
        groups[-1].extend(unit)
    return [base + group for group in groups]


def grouped_plan(groups: Sequence[Sequence[str]], *args: Any, **kwargs: Any) -> list[dict]:
    """``build_plan(names, *args, **kwargs)`` for each group's names in turn, every entry
    marked with its group."""
    return [
        {**entry, "group": g}
        for g, names in enumerate(groups)
        for entry in build_plan(names, *args, **kwargs)
    ]


def warmup_plan(batches: Sequence[int]) -> list[dict[str, int]]:
    top = max(batches)
    return [{"requests": 2, "concurrency": 1}, {"requests": top, "concurrency": top}]


# -- Pure parts: measurements, aggregation, rows -------------------------------------------------


def summarize_measurement(results: Sequence[RequestResult], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    spec = [r for r in ok if r.acceptance.verify_steps]
    verify = sum(r.acceptance.verify_steps for r in spec)
    tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    return {
        "tokens": tokens,
        "wall_s": round(wall_s, 4),
        "tok_s": round(tokens / wall_s, 3) if tokens and wall_s > 0 else None,
        "tpot_ms": round(1000 * statistics.fmean(tpots), 4) if tpots else None,
        "ttft_ms": round(1000 * statistics.fmean(ttfts), 4) if ttfts else None,
        "verify": verify or None,
        "verify_tokens": sum(r.completion_tokens or 0 for r in spec),
        "tau": round(sum(r.completion_tokens or 0 for r in spec) / verify, 4) if verify else None,
        "errors": len(results) - len(ok),
        "error_samples": [r.error for r in results if not r.ok][:3],
        # in request order (= the plan's prompt order); None for a failed request
        "latency_s": [_r(r.latency_s, 5) if r.ok else None for r in results],
        # each request's time after its first token (None: failed, or not streamed)
        "decode_s": [
            _r(r.latency_s - r.ttft_s, 5)
            if r.ok and r.ttft_s is not None and r.latency_s is not None
            else None
            for r in results
        ],
        # each request's verify cycles (None: failed or no speculation), for cycle_fit's
        # split of decode_s into a cost per cycle and a cost per request
        "verify_steps": [
            r.acceptance.verify_steps if r.ok and r.acceptance.verify_steps else None
            for r in results
        ],
    }


def aggregate(measurements: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], dict]:
    """(server, batch) -> median tok/s over rounds (+ min, max, per round), pooled tau."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for m in measurements:
        if m.get("status") == "ok":
            groups.setdefault((m["server"], m["batch"]), []).append(m)
    out = {}
    for key, ms in groups.items():
        timed = sorted((m for m in ms if m.get("tok_s")), key=lambda m: m["round"])
        if timed:
            out[key] = {**summarize_rounds(timed), "errors": sum(m.get("errors", 0) for m in ms)}
    return out


def summarize_rounds(timed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One server's figures at one batch from its timed rounds (in round order); the rounds
    themselves are kept (``measured``) so that two servers can be compared on the rounds both
    finished (``common_rounds``). Errors are counted by the callers, over every round."""
    toks = [m["tok_s"] for m in timed]
    verify = sum(m.get("verify") or 0 for m in timed)
    vtokens = sum(m.get("verify_tokens") or 0 for m in timed if m.get("verify"))
    tpots = [m["tpot_ms"] for m in timed if m.get("tpot_ms") is not None]
    ttfts = [m["ttft_ms"] for m in timed if m.get("ttft_ms") is not None]
    return {
        "tok_s": statistics.median(toks),
        "tok_s_min": min(toks),
        "tok_s_max": max(toks),
        "tok_s_mean": statistics.fmean(toks),
        "tok_s_rounds": {m["round"]: m["tok_s"] for m in timed},
        "latency_rounds": [m.get("latency_s") or [] for m in timed],
        "decode_rounds": [m.get("decode_s") or [] for m in timed],
        "tau": vtokens / verify if verify else None,
        "tpot_ms": statistics.median(tpots) if tpots else None,
        "ttft_ms": statistics.median(ttfts) if ttfts else None,
        "measured": list(timed),
    }


def common_rounds(*entries: Mapping[str, Any] | None) -> tuple[Mapping[str, Any] | None, ...]:
    """The servers' figures on the rounds all of them finished: a run cut inside a round
    leaves one server with a round the other lacks, and a server's time moves with its place
    in the round order (rotate), so a comparison reads the same rounds on both sides. Entries
    as they are where their rounds already agree (or were built without ``measured``)."""
    if any(e is None for e in entries):
        return entries
    rounds = [set(e.get("tok_s_rounds", {})) for e in entries]
    shared = set.intersection(*rounds)
    if all(r == shared for r in rounds) or not shared:
        return entries
    if any("measured" not in e for e in entries):
        return entries
    return tuple(
        e
        if r == shared
        else {
            **summarize_rounds([m for m in e["measured"] if m["round"] in shared]),
            "tau": e["tau"],  # acceptance is not timing: every round's verify steps count
            "errors": e.get("errors", 0),
        }
        for e, r in zip(entries, rounds, strict=True)
    )


def decode_cycle(tau: float | None, run: Mapping[str, Any], base: Mapping[str, Any]):
    """One verify cycle in decode steps from the time per output token after the first:
    ``tau x spec TPOT / no-spec TPOT`` (None without TPOTs: a run without streaming)."""
    spec, nospec = run.get("tpot_ms"), base.get("tpot_ms")
    if tau is None or not spec or not nospec:
        return None
    return tau * spec / nospec


def decode_speedup(
    base: Mapping[str, Any], run: Mapping[str, Any], batch: int, paired: bool = True
):
    """(speedup, interval) after the first token, batch 1, and the interval of each prompt's
    time after its first token, paired (None: no TTFTs). The point: those times summed
    (``paired``, schema 2), or no-spec TPOT / spec TPOT (schema 1)."""
    point = _ratio(base.get("tpot_ms"), run.get("tpot_ms"))
    if batch != 1 or point is None:
        return None, None
    nospec = per_prompt_times(base.get("decode_rounds", []))
    spec = per_prompt_times(run.get("decode_rounds", []))
    summed = ratio_of_sums(nospec, spec) if paired else None
    return summed if summed is not None else point, bootstrap_ratio_ci(nospec, spec)


def speed_ratio(
    fast: Mapping[str, Any] | None, slow: Mapping[str, Any] | None, batch: int, paired: bool
) -> float | None:
    """fast's speed over slow's: at batch 1 under ``paired`` their prompts' times paired and
    summed (the statistic of the interval beside it; 2026-12-03: a ratio of median tok/s read
    0.984 against its interval 0.988-1.021), else the ratio of median tok/s."""
    if not fast or not slow:
        return None
    if paired and batch == 1:
        summed = ratio_of_sums(
            per_prompt_times(slow.get("latency_rounds", [])),
            per_prompt_times(fast.get("latency_rounds", [])),
        )
        if summed is not None:
            return summed
    return _ratio(fast["tok_s"], slow["tok_s"])


def per_prompt_times(latency_rounds: Sequence[Sequence[float | None]]) -> list[float | None]:
    """Each prompt's mean latency over the rounds (None where any round failed it)."""
    if not latency_rounds:
        return []
    n = min(len(r) for r in latency_rounds)
    out = []
    for i in range(n):
        values = [r[i] for r in latency_rounds]
        out.append(None if any(v is None for v in values) else statistics.fmean(values))
    return out


def speedup_interval(base: Mapping[str, Any], run: Mapping[str, Any], batch: int):
    """(interval, method): batch 1 pairs prompts (each one's time averaged over rounds);
    larger batches pair rounds (a round's wall time per wave is not per prompt)."""
    if batch == 1:
        nospec = per_prompt_times(base.get("latency_rounds", []))
        spec = per_prompt_times(run.get("latency_rounds", []))
        return bootstrap_ratio_ci(nospec, spec), "paired prompts, bootstrap"
    rounds = sorted(set(base.get("tok_s_rounds", {})) & set(run.get("tok_s_rounds", {})))
    return (
        bootstrap_ratio_ci(
            [run["tok_s_rounds"][r] for r in rounds], [base["tok_s_rounds"][r] for r in rounds]
        ),
        "paired rounds, bootstrap",
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _why(status: str | None) -> str:
    return status if status and status != "ready" else "no measurement"


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def build_rows(
    agg: Mapping[tuple[str, int], Mapping[str, Any]],
    specs: Sequence[Mapping[str, Any]],
    batches: Sequence[int],
    statuses: Mapping[str, str] | None = None,
    backend: str | None = None,
    server_args: Sequence[str] = (),
    schema_version: int = SCHEMA_VERSION,
) -> list[dict[str, Any]]:
    """One row per (speculative server, batch) against the baseline. ``server_args``: the
    flags every server got (a row's ``overlap`` is false where they or its own turn SGLang's
    overlap scheduler off). ``schema_version``: which point a paired figure has
    (SCHEMA_VERSION's note)."""
    paired = schema_version >= PAIRED_POINT_SINCE
    statuses = statuses or {}
    nbr = {s["role"]: s for s in specs if s["role"] in ("nbr_plugin", "nbr_stock")}
    twin = next((s["name"] for s in specs if s["role"] == "nbr_stock_twin"), None)
    drafter_of = {
        "spec": MAIN,
        "nbr_plugin": NBR_PLUGIN,
        "nbr_stock": NBR_STOCK,
        "noise": NOISE,
        "nbr_stock_twin": NBR_STOCK_TWIN,
        "nbr_plugin_b": NBR_PLUGIN_B,
        "nbr_stock_b": NBR_STOCK_B,
    }

    def pair(first: str | None, second: str | None, b: int):
        """Two servers' entries at batch b on the rounds both finished (common_rounds)."""
        return common_rounds(*(agg.get((name, b)) if name else None for name in (first, second)))

    def ratio(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, batch: int):
        return speed_ratio(a, b, batch, paired)

    # a variant against the main drafter's server at its setting (same drafter, prompts and
    # group): what the variant's switch alone changes, paired by prompt
    main_at = {tuple(s["setting"]): s["name"] for s in specs if s["role"] == "spec"}

    rows = []
    for spec in specs:
        if spec["role"] == "nospec":
            continue
        steps, topk, draft = spec["setting"] or (None, None, None)
        plain = main_at.get(tuple(spec["setting"])) if spec["role"] == "variant" else None
        pvs_pair = (
            (nbr["nbr_plugin"]["name"], nbr["nbr_stock"]["name"])
            if len(nbr) == 2
            and spec["setting"] is not None
            and tuple(spec["setting"]) == tuple(nbr["nbr_plugin"]["setting"])
            else None
        )
        for b in batches:
            # every comparison on the rounds both of its servers finished (common_rounds)
            run, base = pair(spec["name"], "nospec", b)
            speedup = ratio(run, base, b)
            tau = run["tau"] if run else None
            eta = _ratio(speedup, tau)
            plugin, stock = pair(*pvs_pair, b) if pvs_pair else (None, None)
            pvs = ratio(plugin, stock, b)
            pvs_ci = speedup_interval(stock, plugin, b)[0] if plugin and stock else None
            # the same after each request's first token (TPOT; prompts' decode times paired)
            pvs_decode, pvs_decode_ci = (
                decode_speedup(stock, plugin, b, paired) if plugin and stock else (None, None)
            )
            # the same comparison between two stock servers of one configuration
            second, stock2 = pair(twin, pvs_pair[1], b) if pvs_pair and twin else (None, None)
            svs = ratio(second, stock2, b)
            svs_ci = speedup_interval(stock2, second, b)[0] if second and stock2 else None
            variant, plain_run = pair(spec["name"], plain, b) if plain else (None, None)
            vs_plain = ratio(variant, plain_run, b)
            vs_plain_ci = (
                speedup_interval(plain_run, variant, b)[0] if plain_run and variant else None
            )
            missing = [n for n, e in (("nospec", base), (spec["name"], run)) if e is None]
            per_round = []
            for r in sorted((run or {}).get("tok_s_rounds", {})):
                s_tok = run["tok_s_rounds"][r]
                n_tok = (base or {}).get("tok_s_rounds", {}).get(r)
                per_round.append(
                    {
                        "round": r,
                        "nospec_tok_s": n_tok,
                        "spec_tok_s": s_tok,
                        "speedup": _r(_ratio(s_tok, n_tok)),
                    }
                )
            status = (
                "ok"
                if not missing
                else "missing: " + ", ".join(f"{n} ({_why(statuses.get(n))})" for n in missing)
            )
            run, base = run or {}, base or {}
            ci, method = speedup_interval(base, run, b) if run and base else (None, None)
            decode, decode_ci = (
                decode_speedup(base, run, b, paired) if run and base else (None, None)
            )
            rows.append(
                {
                    "backend": backend,
                    "batch": b,
                    "steps": steps,
                    "topk": topk,
                    "draft_tokens": draft,
                    "drafter": drafter_of.get(spec["role"])
                    or f"{NOSPEC_VARIANT if spec['role'] == 'nospec_variant' else MAIN}"
                    f" [{spec.get('label')}]",
                    "server": spec["name"],
                    "overlap": NO_OVERLAP not in [*server_args, *(spec.get("extra") or [])],
                    "draft_vocab": spec.get("draft_vocab"),
                    "nospec_tok_s": _r(base.get("tok_s"), 2),
                    "spec_tok_s": _r(run.get("tok_s"), 2),
                    "spec_tok_s_min": _r(run.get("tok_s_min"), 2),
                    "spec_tok_s_max": _r(run.get("tok_s_max"), 2),
                    "tau": _r(tau),
                    "speedup": _r(speedup),
                    "eta": _r(eta),
                    "speedup_ci95": ci,
                    "speedup_ci_method": method,
                    "spec_tok_s_mean": _r(run.get("tok_s_mean"), 2),
                    "prompts": len(run.get("latency_rounds", [[]])[0]) if run else None,
                    "plugin_vs_stock": _r(pvs),
                    "plugin_vs_stock_ci95": pvs_ci,
                    "plugin_vs_stock_decode": _r(pvs_decode),
                    "plugin_vs_stock_decode_ci95": pvs_decode_ci,
                    **(
                        {"stock_vs_stock": _r(svs), "stock_vs_stock_ci95": svs_ci}
                        if twin and pvs_pair
                        else {}
                    ),
                    **(
                        {
                            "vs_setting_server": plain,
                            "vs_setting": _r(vs_plain),
                            "vs_setting_ci95": vs_plain_ci,
                        }
                        if plain
                        else {}
                    ),
                    "nospec_tpot_ms": _r(base.get("tpot_ms"), 3),
                    "spec_tpot_ms": _r(run.get("tpot_ms"), 3),
                    # the first token's time (prefill, the request's way in and out): a
                    # request's fixed part, which the tok/s speedup weighs tau-fold in its
                    # cycle (sglang_ext.cli.tune's request model)
                    "nospec_ttft_ms": _r(base.get("ttft_ms"), 3),
                    "spec_ttft_ms": _r(run.get("ttft_ms"), 3),
                    "cycle_cost_decode_steps": _r(_ratio(1.0, eta)),
                    # the cycle after the first token: tau x spec TPOT / no-spec TPOT
                    "decode_cycle_cost": _r(decode_cycle(tau, run, base)),
                    # the speedup after the first token (long outputs' limit), batch 1
                    "decode_speedup": _r(decode),
                    "decode_speedup_ci95": decode_ci,
                    "errors": run.get("errors", 0) + base.get("errors", 0),
                    "status": status,
                    "rounds": per_round,
                }
            )
    return rows


def pooled_pairs(
    agg: Mapping[tuple[str, int], Mapping[str, Any]],
    pairs: Sequence[tuple[str, str]],
    batch: int,
    schema_version: int = SCHEMA_VERSION,
) -> dict[str, Any] | None:
    """Two plugin/stock pairs of one configuration (--second-pair): the second pair's ratio,
    and both pooled. Batch 1: the stock servers' summed prompt times over the plugin servers',
    its interval resampling the prompts, each with all four servers' times; larger batches:
    the plugin servers' tok/s summed over the stock servers' (no interval). None where a
    server did not measure."""
    entries = [agg.get((name, batch)) for pair in pairs for name in pair]
    if any(e is None for e in entries):
        return None
    # the four on the rounds all of them finished (common_rounds)
    plugin_a, stock_a, plugin_b, stock_b = common_rounds(*entries)
    # batch 1: each prompt's (stock a + stock b, plugin a + plugin b) times
    kept = four_server_times((stock_a, stock_b), (plugin_a, plugin_b)) if batch == 1 else []
    if kept:
        stock_times, plugin_times = zip(*kept, strict=True)
        point = ratio_of_sums(stock_times, plugin_times)
        ci = bootstrap_ratio_ci(stock_times, plugin_times)
    else:
        point = (plugin_a["tok_s"] + plugin_b["tok_s"]) / (stock_a["tok_s"] + stock_b["tok_s"])
        ci = None
    return {
        "plugin_vs_stock_b": _r(
            speed_ratio(plugin_b, stock_b, batch, schema_version >= PAIRED_POINT_SINCE)
        ),
        "plugin_vs_stock_b_ci95": speedup_interval(stock_b, plugin_b, batch)[0],
        "plugin_vs_stock_pooled": _r(point),
        "plugin_vs_stock_pooled_ci95": ci,
    }


def four_server_times(
    stock: Sequence[Mapping[str, Any]], plugin: Sequence[Mapping[str, Any]]
) -> list[tuple[float, float]]:
    """Per prompt, the two stock servers' times summed and the two plugin servers' (each a
    mean over its rounds); prompts any of the four failed are left out."""

    def summed(entries):
        a, b = (per_prompt_times(e["latency_rounds"]) for e in entries)
        return [None if None in (x, y) else x + y for x, y in zip(a, b, strict=False)]

    pairs = zip(summed(stock), summed(plugin), strict=False)
    return [(s, p) for s, p in pairs if None not in (s, p)]


def pool_second_pair(
    rows: list[dict[str, Any]],
    specs: Sequence[Mapping[str, Any]],
    measurements: Sequence[Mapping[str, Any]],
    compare: Setting | None,
    batches: Sequence[int],
    schema_version: int = SCHEMA_VERSION,
) -> None:
    """--second-pair: each row at the compare setting gets the second pair's ratio and both
    pairs pooled (each pair measured in its own group, so each server's figures are its own
    group's; the pooled figure adds the two)."""
    roles = {s["role"]: s["name"] for s in specs}
    names = [roles.get(r) for r in ("nbr_plugin", "nbr_stock", "nbr_plugin_b", "nbr_stock_b")]
    if compare is None or None in names:
        return
    agg = aggregate(measurements)  # server names are unique across groups (nospec aside)
    for b in batches:
        pooled = pooled_pairs(agg, [(names[0], names[1]), (names[2], names[3])], b, schema_version)
        if pooled is None:
            continue  # a server of the two pairs did not measure at this batch
        for row in rows:
            if row["batch"] == b and (row["steps"], row["topk"], row["draft_tokens"]) == tuple(
                compare
            ):
                row.update(pooled)


VS_SETTING_ACROSS = (
    "across groups: each server over its own group's baseline, paired prompts, bootstrap"
    " (a prompt's four times resampled together)"
)
# batches above 1 have no per-prompt times to pair: the figure is a ratio without an interval
VS_SETTING_ACROSS_RATIO = (
    "across groups: the ratio of the two rows' speedups, each over its own group's baseline;"
    " no interval"
)


def server_groups(groups: Sequence[Sequence[str]]) -> dict[str, int]:
    """Each server's group (plan_groups), the baseline left out: it is in every group."""
    return {name: g for g, names in enumerate(groups) for name in names if name != "nospec"}


def _switch(spec: Mapping[str, Any]) -> tuple:
    """What a variant's server was served with: its label, env and extra flags."""
    return (
        spec.get("label"),
        tuple(sorted((spec.get("env") or {}).items())),
        tuple(spec.get("extra") or ()),
    )


def over_own_baselines(
    measurements: Sequence[Mapping[str, Any]],
    first: tuple[str, int],
    second: tuple[str, int],
) -> tuple[float | None, list[float] | None]:
    """(server, group) first's speedup over its group's baseline divided by second's over its
    own, at batch 1, prompts paired (stats.ratio_of_speedups); (None, None) where a server or
    baseline did not measure or fewer than two prompts finished on all four."""
    entries = []
    for name, g in (first, second):
        agg = aggregate([m for m in measurements if m.get("group", 0) == g])
        entries += list(common_rounds(agg.get((name, 1)), agg.get(("nospec", 1))))
    if any(e is None for e in entries):
        return None, None
    times = [per_prompt_times(e["latency_rounds"]) for e in entries]
    kept = [t for t in zip(*times, strict=False) if None not in t]
    if len(kept) < 2:
        return None, None
    return ratio_of_speedups([(a, b) for a, b, _, _ in kept], [(c, d) for _, _, c, d in kept])


def vs_setting_across_groups(
    rows: list[dict[str, Any]],
    specs: Sequence[Mapping[str, Any]],
    measurements: Sequence[Mapping[str, Any]],
    groups: Sequence[Sequence[str]],
) -> None:
    """A variant served in another group than the main drafter's server at its setting
    (--at-once 2 serves each beside the baseline alone) gets its ``vs_setting`` all the
    same: its speedup over the plain server's, each measured against its own group's
    baseline, so a drift of the machine between the groups cancels. Batch 1 pairs prompts
    (over_own_baselines); larger batches divide the two rows' speedups (no interval).
    Rows that have a ``vs_setting`` from their own group keep it."""
    group_of = server_groups(groups)
    main_at = {tuple(s["setting"]): s["name"] for s in specs if s["role"] == "spec"}
    speedup_of = {(r["server"], r["batch"]): r.get("speedup") for r in rows}
    for spec in specs:
        if spec["role"] != "variant" or spec.get("setting") is None:
            continue
        plain = main_at.get(tuple(spec["setting"]))
        gv, gp = group_of.get(spec["name"]), group_of.get(plain)
        if plain is None or gv is None or gp is None or gv == gp:
            continue
        for row in rows:
            if row["server"] != spec["name"] or row.get("vs_setting") is not None:
                continue
            b = row["batch"]
            if b == 1:
                point, ci = over_own_baselines(measurements, (spec["name"], gv), (plain, gp))
                method = VS_SETTING_ACROSS
            else:
                point, ci = _r(_ratio(row.get("speedup"), speedup_of.get((plain, b)))), None
                method = VS_SETTING_ACROSS_RATIO
            if point is not None:
                row.update(
                    vs_setting_server=plain,
                    vs_setting=point,
                    vs_setting_ci95=ci,
                    vs_setting_method=method,
                )


def same_switch_baseline(
    rows: list[dict[str, Any]],
    specs: Sequence[Mapping[str, Any]],
    measurements: Sequence[Mapping[str, Any]],
    groups: Sequence[Sequence[str]],
) -> None:
    """A variant LABEL@S whose run also served LABEL@nospec (the baseline with the same
    switch) gets its speedup over that server as well, ``speedup_same_switch`` with its
    interval and ``eta_same_switch``: what speculation adds over the fastest server without
    it where the switch speeds the target itself (2026-12-07: the shared expert on the main
    stream, 1.09x without speculation). Batch 1 only, each server over its own group's
    baseline (over_own_baselines)."""
    group_of = server_groups(groups)
    twin = {_switch(s): s["name"] for s in specs if s["role"] == "nospec_variant"}
    for spec in specs:
        if spec["role"] != "variant":
            continue
        key = _switch(spec)
        base = twin.get(key)
        if base is None or spec["name"] not in group_of or base not in group_of:
            continue
        point, ci = over_own_baselines(
            measurements, (spec["name"], group_of[spec["name"]]), (base, group_of[base])
        )
        for row in rows:
            if row["server"] == spec["name"] and row["batch"] == 1 and point is not None:
                row.update(
                    same_switch_server=base,
                    speedup_same_switch=point,
                    speedup_same_switch_ci95=ci,
                    eta_same_switch=_r(_ratio(point, row.get("tau"))),
                )


def best_and_goals(
    rows: Sequence[Mapping[str, Any]], compare: Setting | None, *, variants: bool = False
):
    """Best main-drafter row at batch 1 (the smallest batch if 1 was not measured), and the
    goals evaluated there. ``variants``: its variant rows (a flag or variable the server ran
    with, e.g. the drafter in fp8) are candidates too: ``best_served``. plugin_vs_stock: at
    that batch of the compare setting, from whichever row carries it (the pair's own rows
    where the servers ran in groups); its goal fails only where its interval lies wholly
    below the threshold: the two servers run the same math, so a point estimate a hair
    under it is the run's noise (2026-12-02: 0.989 on 64 prompts, 1.155 on 16 with the
    same servers)."""
    main = [r for r in rows if r["drafter"] == MAIN or (variants and _variant_row(r))]
    if not main:
        return None, {}
    batch = 1 if any(r["batch"] == 1 for r in main) else min(r["batch"] for r in main)
    candidates = [r for r in main if r["batch"] == batch and r["speedup"] is not None]
    best = max(candidates, key=lambda r: r["speedup"], default=None)
    at_compare = [
        r
        for r in sorted(rows, key=lambda r: r["drafter"] != MAIN)
        if compare is not None
        and r["batch"] == batch
        and (r["steps"], r["topk"], r["draft_tokens"]) == tuple(compare)
        and r.get("plugin_vs_stock") is not None
    ]
    pvs = at_compare[0] if at_compare else {}
    # --second-pair: the goal reads both pairs pooled (one pair is one draw of the servers'
    # instance noise), the first pair's figure stays beside it
    pooled = "plugin_vs_stock_pooled" in pvs and pvs["plugin_vs_stock_pooled"] is not None
    key_pvs = "plugin_vs_stock_pooled" if pooled else "plugin_vs_stock"
    values = {
        "speedup": (best or {}).get("speedup"),
        "eta": (best or {}).get("eta"),
        "plugin_vs_stock": pvs.get(key_pvs),
    }
    goals: dict[str, Any] = {
        "batch": batch,
        **values,
        "plugin_vs_stock_ci95": pvs.get(f"{key_pvs}_ci95"),
        # --instance-noise: two stock servers of one configuration, the same comparison
        **{k: pvs[k] for k in ("stock_vs_stock", "stock_vs_stock_ci95") if k in pvs},
        **(
            {  # SECOND_PAIR_GOALS
                "plugin_vs_stock_pooled_over": 2,
                "plugin_vs_stock_a": pvs.get("plugin_vs_stock"),
                "plugin_vs_stock_a_ci95": pvs.get("plugin_vs_stock_ci95"),
                "plugin_vs_stock_b": pvs.get("plugin_vs_stock_b"),
                "plugin_vs_stock_b_ci95": pvs.get("plugin_vs_stock_b_ci95"),
            }
            if pooled
            else {}
        ),
    }
    for name, (key, threshold) in GOALS.items():
        value = values[key]
        if key == "plugin_vs_stock" and goals["plugin_vs_stock_ci95"]:
            value = max(value, goals["plugin_vs_stock_ci95"][1])
        goals[name] = None if value is None else value >= threshold
    goals["thresholds"] = {key: threshold for key, threshold in GOALS.values()}
    return dict(best) if best else None, goals


def cycle_breakdown(
    profiles: Mapping[str, Mapping[str, Any]],
    specs: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    new_tokens: int | None = None,
) -> dict[str, Any] | None:
    """Each profiled speculative server's batch-1 cycle split in decode steps. The torch
    profiler slows the host (2026-12-02, H200: the traced no-speculation step took 10.06 ms,
    the timed one 5.00 ms), so a trace's GPU idle is not the served one: the kernel parts
    come from the trace (target graph, drafter graphs, other kernels; ms per cycle), the
    cycle and the decode step from the timed rounds of the server's row (cycle = tau / spec
    tok/s, step = 1 / nospec tok/s of its group), and ``host`` (GPU idle while serving) is
    the difference. With FA3's cascade launches per verify. None without a profiled
    baseline.

    Where the traces have whole cycles (``steady``: trace_breakdown.steady_breakdown) and
    ``new_tokens`` (each request's completion length) is known, the parts are steady decode
    cycles and the request's prefill comes out of the timed figures too: its GPU time (the
    trace's kernels before the first cycle) over the request's tau-long cycles (``split``
    "steady"); else the parts spread the prefill over the traced window (``split``
    "window", as in the 2026-12-02 results)."""
    base = (profiles.get("nospec") or {}).get("per_cycle_ms") or {}
    if not base.get("total"):
        return None
    base_steady = (profiles.get("nospec") or {}).get("steady") or None

    def prefill_ms(profile: Mapping[str, Any]) -> float:
        return profile["steady"]["before_first_cycle_ms"]["gpu_kernels"]

    at_b1 = {r["server"]: r for r in rows if r["batch"] == 1 and r.get("spec_tok_s")}
    kernels = ("target_graph_kernels", "drafter_graph_kernels", "other_kernels")
    servers = {}
    for spec in specs:
        profile, row = profiles.get(spec["name"]) or {}, at_b1.get(spec["name"])
        parts = profile.get("per_cycle_ms")
        if spec["role"] == "nospec" or not parts or not row or not row.get("tau"):
            continue
        step_ms = 1000.0 / row["nospec_tok_s"]
        cycle_ms = 1000.0 * row["tau"] / row["spec_tok_s"]
        steady = bool(new_tokens and base_steady and profile.get("steady"))
        if steady:
            parts = profile["steady"]["per_cycle_ms"]
            step_ms -= prefill_ms(profiles["nospec"]) / new_tokens
            cycle_ms -= prefill_ms(profile) * row["tau"] / new_tokens
        busy = {k: parts.get(k) or 0.0 for k in kernels}
        families = (profile.get("kernel_families") or {}).get("target_graph") or {}
        servers[spec["name"]] = {
            "setting": label(spec["setting"]),
            "overlap": row.get("overlap"),
            "split": "steady" if steady else "window",
            "decode_step_ms": _r(step_ms, 3),
            "cycle_ms": _r(cycle_ms, 3),
            "decode_steps": {
                "total": _r(cycle_ms / step_ms),
                "target_verify": _r(busy["target_graph_kernels"] / step_ms),
                "drafter": _r(busy["drafter_graph_kernels"] / step_ms),
                "other_kernels": _r(busy["other_kernels"] / step_ms),
                "host": _r((cycle_ms - sum(busy.values())) / step_ms),
            },
            "profiled_cycle_ms": parts.get("total"),
            **(
                {
                    "prefill_gpu_ms": prefill_ms(profile),
                    "traced_gpu_idle_before_ms": profile["steady"]["gpu_idle_before_ms"],
                }
                if steady
                else {}
            ),
            **{
                f"{family}_per_verify": (families.get(family) or {}).get("calls_per_cycle")
                for family in ("flash_attention", "merge_state")
            },
            # the traced host per cycle (trace_host): its calls, and its wait for the GPU
            **(
                {
                    "traced_host_calls": profile["host"]["calls_per_cycle"],
                    "traced_host_sync_ms": profile["host"]["sync_ms"],
                }
                if profile.get("host")
                else {}
            ),
        }
    return {
        "baseline": {
            "profiled_step_ms": base["total"],
            "target_graph_ms": base.get("target_graph_kernels"),
            "other_kernels_ms": base.get("other_kernels"),
        },
        "servers": servers,
    }


def _compact(value: Any, depth: int = 4) -> Any:
    """Scalars, short scalar lists and nested dicts of them; training histories dropped."""
    scalar = (str, int, float, bool, type(None))
    if isinstance(value, scalar):
        return value
    if isinstance(value, list):
        ok = len(value) <= 16 and all(isinstance(x, scalar) for x in value)
        return value if ok else None
    if isinstance(value, Mapping) and depth > 0:
        out = {}
        history = value.get("history")
        if isinstance(history, list) and history and isinstance(history[-1], Mapping):
            out["final_loss"] = history[-1].get("loss")
        for key, item in value.items():
            if key in ("history", "per_prompt"):
                continue
            kept = _compact(item, depth - 1)
            if kept is not None and kept != {}:
                out[key] = kept
        return out
    return None


def summarize_fixtures(manifest: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """A compact copy of a fixtures manifest: make_fixtures.py's (targets/drafters) or
    make_speed_fixtures.py's (one report per stage)."""
    out: dict[str, Any] = {"path": path}
    for key in (
        "schema_version",
        "scale",
        "device",
        "device_name",
        "seed",
        "total_wall_s",
        "cache",
    ):
        if key in manifest:
            out[key] = manifest[key]
    if "stages" in manifest:
        out["stages"] = _compact(manifest["stages"])
        return out
    out["versions"] = manifest.get("versions")
    for group in ("targets", "drafters"):
        out[group] = {name: _compact(entry) for name, entry in (manifest.get(group) or {}).items()}
    return out


def build_result(
    meta: Mapping[str, Any],
    servers: Sequence[Mapping[str, Any]],
    measurements: Sequence[Mapping[str, Any]],
    specs: Sequence[Mapping[str, Any]],
    compare: Setting | None,
    fixtures: Mapping[str, Any] | None = None,
    groups: Sequence[Sequence[str]] | None = None,
    schema_version: int = SCHEMA_VERSION,
) -> dict[str, Any]:
    """The result JSON from run metadata, server records and raw measurements (measured in
    ``groups``, see plan_groups; None: all servers together); ``schema_version``: a rebuilt
    run's own (its paired figures' points, SCHEMA_VERSION's note)."""
    statuses = {s["name"]: s["status"] for s in servers}
    groups = groups or [[spec["name"] for spec in specs]]
    rows = []
    for g, names in enumerate(groups):  # each group's rows against its own baseline
        members = [spec for spec in specs if spec["name"] in names]
        group_rows = build_rows(
            aggregate([m for m in measurements if m.get("group", 0) == g]),
            members,
            meta["batches"],
            statuses,
            meta.get("attention_backend"),
            meta.get("server_extra_args") or (),
            schema_version,
        )
        rows += group_rows if len(groups) == 1 else [{**r, "group": g} for r in group_rows]
    pool_second_pair(rows, specs, measurements, compare, meta["batches"], schema_version)
    vs_setting_across_groups(rows, specs, measurements, groups)
    same_switch_baseline(rows, specs, measurements, groups)
    best, goals = best_and_goals(rows, compare)
    return {
        "schema_version": schema_version,
        **meta,
        "groups": [list(names) for names in groups],
        "compare_setting": list(compare) if compare else None,
        "servers": list(servers),
        "rows": rows,
        "best": best,
        "goals": goals,
        **served_best(rows, compare),
        "measurements": list(measurements),
        "fixtures": fixtures,
    }


def _variant_row(row: Mapping[str, Any]) -> bool:
    """A main-drafter row served with a variant's flag or variable ("MAIN [label]")."""
    return row["drafter"].startswith(f"{MAIN} [")


def served_best(rows: Sequence[Mapping[str, Any]], compare: Setting | None) -> dict[str, Any]:
    """{"best_served", "goals_served"}: best and goals with the variant rows among the
    candidates, where the run has variant rows (a run whose fastest row is a variant, such
    as 7/1/8 with the drafter in fp8 on 2026-12-06, has its issue goals read there); {}
    otherwise, so files without variants keep their keys."""
    if not any(_variant_row(r) for r in rows):
        return {}
    best, goals = best_and_goals(rows, compare, variants=True)
    return {"best_served": best, "goals_served": goals}


def merge_results(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One result from runs on several attention backends (one run per backend: a server's
    backend is fixed at startup): rows side by side, `best` and goals over all of them, each
    run's metadata and measurements kept under `runs`."""
    if not results:
        raise ValueError("nothing to merge")
    rows = [
        dict(r, backend=r.get("backend") or res.get("attention_backend"))
        for res in results
        for r in res["rows"]
    ]
    compare = results[0].get("compare_setting")
    best, goals = best_and_goals(rows, tuple(compare) if compare else None)
    # the plugin must keep up with stock on every backend, each at its own run's compare
    # setting: that goal per backend, and overall only where every backend measured it
    per_backend = {}
    for res in results:
        backend = res.get("attention_backend")
        theirs = [r for r in rows if r["backend"] == backend]
        own = res.get("compare_setting")
        _, its = best_and_goals(theirs, tuple(own) if own else None)
        if its.get("plugin_vs_stock") is not None:
            per_backend[backend] = {
                k: its[k]
                for k in (
                    "batch",
                    "plugin_vs_stock",
                    "plugin_vs_stock_ci95",
                    "stock_vs_stock",
                    "stock_vs_stock_ci95",
                )
                if k in its
            } | {"pass": its["plugin_vs_stock_ge_0_99"]}
    goals["plugin_vs_stock_by_backend"] = per_backend
    backends = [res.get("attention_backend") for res in results]
    goals["plugin_vs_stock_ge_0_99"] = (
        all(per_backend[b]["pass"] for b in backends) if set(backends) <= set(per_backend) else None
    )
    return {
        # the rows are the runs' own: their points are as old as the oldest run's
        "schema_version": min(res.get("schema_version", 1) for res in results),
        "merged": True,
        "backends": [res.get("attention_backend") for res in results],
        "batches": sorted({b for res in results for b in res["batches"]}),
        "rows": rows,
        "best": best,
        "goals": goals,
        "runs": [{k: v for k, v in res.items() if k != "rows"} for res in results],
    }


def _f(x: Any, fmt: str) -> str:
    return "-" if x is None else fmt.format(x)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = (
        "backend",
        "drafter",
        "setting",
        "b",
        "nospec",
        "spec",
        "tau",
        "speedup",
        "95% ci",
        "eta",
        "p/s",
        "tpot ms",
        "status",
    )
    left = {0, 1, 2, len(head) - 1}
    lines = [head]
    for r in rows:
        figures = [_f(r[k], "{:.1f}") for k in ("nospec_tok_s", "spec_tok_s")]
        figures += [_f(r[k], "{:.3f}") for k in ("tau", "speedup")]
        ci = r.get("speedup_ci95")
        figures.append(f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-")
        figures += [_f(r[k], "{:.3f}") for k in ("eta", "plugin_vs_stock")]
        setting = label((r["steps"], r["topk"], r["draft_tokens"])) if r["steps"] else "-"
        lines.append(
            (
                str(r.get("backend") or "-"),
                r["drafter"],
                setting,
                str(r["batch"]),
                *figures,
                _f(r["spec_tpot_ms"], "{:.2f}"),
                r["status"],
            )
        )
    widths = [max(len(line[k]) for line in lines) for k in range(len(head))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if k in left else cell.rjust(w)
            for k, (cell, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )


def write_png(result: Mapping[str, Any], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: --out-png skipped", file=sys.stderr)
        return False
    rows, batches = result["rows"], list(result["batches"])
    series: dict[str, list[Mapping[str, Any]]] = {}
    backends = {r.get("backend") for r in rows}
    for r in rows:
        name = label((r["steps"], r["topk"], r["draft_tokens"])) if r["steps"] else ""
        key = name if r["drafter"] == MAIN else f"{r['drafter']} {name}".strip()
        if len(backends) > 1:
            key = f"{r.get('backend')} {key}"
        series.setdefault(key, []).append(r)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    xs = range(len(batches))
    colour = {key: f"C{k}" for k, key in enumerate(series)}
    for key, rs in series.items():
        pts = [(batches.index(r["batch"]), r) for r in rs if r["speedup"] is not None]
        if not pts:
            continue
        style = "-" if rs[0]["drafter"] == MAIN else "--"
        left.plot(
            [x for x, _ in pts],
            [r["speedup"] for _, r in pts],
            style,
            marker="o",
            color=colour[key],
            label=key,
        )
        for x, r in pts:
            if r["eta"] is not None:
                left.annotate(
                    f"η={r['eta']:.2f}",
                    (x, r["speedup"]),
                    fontsize=7,
                    textcoords="offset points",
                    xytext=(4, 4),
                )
    left.axhline(1.0, color="grey", linewidth=0.8)
    left.set(
        xticks=list(xs),
        xticklabels=[str(b) for b in batches],
        xlabel="batch",
        ylabel="speedup vs no speculation",
        title="speedup (η = speedup / τ)",
    )
    left.legend(fontsize=8, title="steps,topk,draft")
    bars = {"nospec": {r["batch"]: r["nospec_tok_s"] for r in rows}}
    bars.update({k: {r["batch"]: r["spec_tok_s"] for r in rs} for k, rs in series.items()})
    width = 0.8 / max(len(bars), 1)
    for i, (key, by_batch) in enumerate(bars.items()):
        right.bar(
            [x + (i - (len(bars) - 1) / 2) * width for x in xs],
            [by_batch.get(b) or 0.0 for b in batches],
            width,
            label=key,
            color=colour.get(key, "grey"),
        )
    right.set(
        xticks=list(xs),
        xticklabels=[str(b) for b in batches],
        xlabel="batch",
        ylabel="output tokens / s",
        title="throughput (median over rounds)",
    )
    right.legend(fontsize=8)
    fig.suptitle(
        f"EAGLE-3 speed: {result.get('gpu')} · SGLang {result.get('sglang_version')} · "
        f"{result.get('attention_backend')} attention · {result.get('date')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- Environment and the run ---------------------------------------------------------------------


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="Llama target (SGLang format)")
    p.add_argument("--drafter", required=True, help="speculators EAGLE-3 drafter (plugin)")
    p.add_argument("--drafter-nbr-false", help="speculators drafter, norm_before_residual false")
    p.add_argument("--drafter-nbr-false-sglang", help="the same, converted (stock SGLang)")
    p.add_argument("--prompts", required=True, help="JSONL with input_ids per line")
    p.add_argument(
        "--settings",
        nargs="+",
        type=_setting_or_none,
        default=[(3, 1, 4), (5, 1, 6), (4, 4, 8)],
        metavar="STEPS,TOPK,DRAFT",
        help="the plain plugin servers' settings; 'none' alone: no plain server (the "
        "baseline and the variants, each naming its setting or @nospec)",
    )
    p.add_argument("--compare-setting", type=parse_setting, default=(5, 1, 6))
    p.add_argument("--batches", nargs="+", type=positive_int, default=[1, 4, 16])
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--requests-per-batch", type=positive_int, default=2, metavar="WAVES")
    p.add_argument(
        "--noise",
        action="store_true",
        help="measure the no-speculation server twice per round: the ratio of the "
        "two is the run's own noise floor (row 'no speculation, measured again')",
    )
    p.add_argument(
        "--second-pair",
        action="store_true",
        help="a second plugin server and a second stock server of the nbr-false pair's "
        "configuration: two independent plugin/stock comparisons, pooled for the goal",
    )
    p.add_argument(
        "--instance-noise",
        action="store_true",
        help="a second stock server beside the nbr-false pair: its ratio to the first "
        "(stock_vs_stock) is how far two servers of one configuration lie apart, the yardstick "
        "for plugin_vs_stock",
    )
    p.add_argument(
        "--batch1-requests",
        type=positive_int,
        default=64,
        help="prompts per server per round at batch 1, the same ones every round "
        "(the per-prompt bootstrap interval of the speedup needs them)",
    )
    p.add_argument("--mem-fraction", type=float, default=0.13)
    p.add_argument(
        "--at-once",
        type=positive_int,
        metavar="N",
        help="servers up at a time, the baseline included (default: all). Where not every "
        "server fits the GPU (eight 8B-shaped servers at ~17 GB of weights each on one "
        "H200), the baseline stays up and the others come up N-1 at a time, each group "
        "timed against the baseline in rounds of its own",
    )
    p.add_argument(
        "--at-once-fit",
        action="store_true",
        help="where a group would not fit the GPU (group_fit), lower --at-once until every "
        "group fits instead of refusing (a seed-shape run sized for an H200 on an H100)",
    )
    p.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        default=[],
        metavar="LABEL:KEY=VALUE",
        help="one more plugin server (main drafter, compare setting) with an env "
        "var, e.g. splitkv:SGLANG_EXT_SPLITKV_VERIFY=1, or a server argument, e.g. "
        "fp8draft:--speculative-draft-model-quantization=fp8; LABEL@7,1,8:... runs it at "
        "that setting instead, LABEL@nospec:... without a drafter against the baseline; "
        "repeatable",
    )
    p.add_argument(
        "--no-overlap-at",
        nargs="+",
        type=parse_setting,
        default=[],
        metavar="STEPS,TOPK,DRAFT",
        help="one more plugin server per setting (each one of --settings) with SGLang's "
        "overlap scheduler off (--disable-overlap-schedule); its rows say overlap false",
    )
    p.add_argument(
        "--max-total-tokens", type=positive_int, help="fixed KV pool size per server (tokens)"
    )
    p.add_argument("--server-args", default="", help="extra flags for every server (one string)")
    p.add_argument(
        "--prefill-graph",
        choices=("disabled", "breakable"),
        default="disabled",
        help="every server's prefill CUDA graph (SGLang 0.5.23's default is breakable; off by "
        "default here: each server's capture took ~80 s). It shortens each request's first "
        "token, which a batch-1 speedup over whole requests weighs",
    )
    p.add_argument(
        "--prefill-graph-max-tokens",
        type=positive_int,
        default=512,
        help="with --prefill-graph: the longest prefill captured (longer ones run eager)",
    )
    p.add_argument(
        "--acceptance-dir",
        help="plugin servers write their per-request acceptance records to DIR/SERVER.jsonl "
        "(the input of `sglang-ext tune`)",
    )
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--attention-backend", default="triton")
    p.add_argument("--port-base", type=positive_int, default=31000)
    p.add_argument("--log-dir", default="/tmp/sglang-ext-bench")
    p.add_argument("--out-json", help="result JSON (default: LOG_DIR/bench_speed.json)")
    p.add_argument("--out-png")
    p.add_argument("--fixtures-json", help="fixtures manifest to embed a summary of")
    p.add_argument("--dry-run", action="store_true", help="print servers and plan, start nothing")
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the rounds, profile one batch-1 request per server (torch "
        "profiler via /start_profile) and add a per-cycle time breakdown",
    )
    p.add_argument(
        "--pin-cpus",
        metavar="PLAN",
        help="the same cores for each part of every server (cpu_pinning): 'auto', or "
        "'client=0-1;scheduler=2-3;detokenizer=4;server=5-6'",
    )
    p.add_argument("--profile-steps", type=positive_int, default=40)
    p.add_argument("--profile-dir", help="trace folder (default: LOG_DIR/profiles)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.drafter_nbr_false) != bool(args.drafter_nbr_false_sglang):
        parser.error("--drafter-nbr-false and --drafter-nbr-false-sglang go together")
    if None in args.settings:
        if len(args.settings) > 1:
            parser.error("--settings none: stands alone (no plain plugin server)")
        if not args.variant:
            parser.error("--settings none: no --variant either, nothing beside the baseline")
        unset = [v[0] for v in args.variant if "@" not in v[0]]
        if unset:
            parser.error(
                f"--settings none: variant {unset[0]!r} names no setting "
                "(LABEL@STEPS,TOPK,DRAFT or LABEL@nospec)"
            )
        args.settings = []
    if len(set(args.settings)) != len(args.settings):
        parser.error(f"--settings: repeated setting in {[label(s) for s in args.settings]}")
    if args.drafter_nbr_false and args.compare_setting not in args.settings:
        parser.error(
            f"--compare-setting {label(args.compare_setting)} is not one of --settings "
            f"{' '.join(label(s) for s in args.settings)}"
        )
    if not 0 < args.mem_fraction < 1:
        parser.error(f"--mem-fraction {args.mem_fraction}: must be in (0, 1)")
    args.batches = sorted(set(args.batches))
    args.compare = args.compare_setting if args.drafter_nbr_false else None
    if args.at_once is not None and args.at_once < 2:
        parser.error(f"--at-once {args.at_once}: the baseline and one server need 2")
    stray = [label(x) for x in args.no_overlap_at if x not in args.settings]
    if stray:
        parser.error(f"--no-overlap-at {' '.join(stray)}: not one of --settings")
    for flag, on in (
        ("--instance-noise", args.instance_noise),
        ("--second-pair", args.second_pair),
    ):
        if on and not args.drafter_nbr_false:
            parser.error(f"{flag} needs the nbr-false pair (--drafter-nbr-false ...)")
    args.specs = server_specs(
        args.settings,
        args.compare,
        args.variant,
        args.noise,
        args.no_overlap_at,
        args.instance_noise,
        args.second_pair,
    )
    for spec in args.specs:  # the rows say what draft vocabulary each server ran
        spec["draft_vocab"] = draft_vocab(drafter_path(spec, args))
    try:
        args.groups = plan_groups(args.specs, args.at_once)
        args.pin_plan = cpu_pinning.parse_plan(args.pin_cpus) if args.pin_cpus else None
    except ValueError as exc:
        parser.error(str(exc))
    return args


def _run(server: Server, prompts: Sequence[Any], concurrency: int, max_new_tokens: int):
    spec = RequestSpec(
        api="generate",
        url=server.url,
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        ignore_eos=True,
        stream=True,
    )
    return run_benchmark(spec, prompts, concurrency, warmup=0, progress=False)


def profile_server(server: Server, prompt: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One batch-1 request under SGLang's torch profiler (POST /start_profile, stopping by
    itself after --profile-steps scheduler steps); the per-cycle breakdown of its trace, its
    kernel families and costliest kernels (trace_breakdown)."""
    import urllib.request

    out_dir = Path(args.profile_dir or Path(args.log_dir) / "profiles") / server.name
    out_dir.mkdir(parents=True, exist_ok=True)
    body = {
        "output_dir": str(out_dir),
        "num_steps": args.profile_steps,
        "activities": ["CPU", "GPU"],
        "profile_prefix": server.name,
    }
    request = urllib.request.Request(
        server.url + "/start_profile",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        resp.read()
    # the clock while traced: under the profiler a step takes ~10x its time (2026-12-06:
    # TPOT 83-147 ms against 4-8 ms timed), the GPU idles between steps, and one traced
    # no-speculation step spent 1.3 ms more in one kernel than its timed rounds allowed
    with GpuWatch() as watch:
        results, wall = _run(server, [prompt], 1, args.max_new_tokens)
    deadline = time.time() + 120
    while True:  # the trace is written after the last profiled step, asynchronously
        try:
            path = newest_trace(out_dir)
            time.sleep(2)  # let the writer finish the file
            trace = load_trace(path)
            graphs = group_kernels(trace)  # grouped once for the analyses
            out = {
                **breakdown(graphs),
                "steady": steady_breakdown(graphs),
                # the scheduler thread's side: launches, copies and waits per cycle
                "host": host_breakdown(trace),
                # which attention path ran (cascade for trees: merge_state) and the costliest
                # kernels: the traces themselves stay on the node
                "kernel_families": kernel_families(graphs),
                "top_kernels": top_kernels(graphs, n=12),
                # which config the fused-MoE kernels ran with (their launch grids)
                "kernel_grids": kernel_grids(graphs),
                "graph_streams": graph_streams(graphs),
            }
            break
        except (FileNotFoundError, EOFError, OSError, ValueError) as exc:
            if time.time() > deadline:
                return {"error": f"{type(exc).__name__}: {exc}", "dir": str(out_dir)}
            time.sleep(2)
    return {
        **out,
        "trace": str(path),
        "request": summarize_measurement(results, wall),
        "gpu_watch": watch.summary(),
    }


def measure(server: Server, entry: Mapping[str, Any], prompts, args) -> dict[str, Any]:
    """One plan entry on its server: the measurement record (its status where the server is
    not ready or has died)."""
    if server.status == "ready" and not server.alive():
        server.status = f"died during measurement ({server.process.returncode})"
    m = {**entry, "status": "ok" if server.status == "ready" else server.status}
    if server.status == "ready":
        chosen = [prompts[i] for i in entry["prompts"]]
        # the GPU's clock, power and throttle reasons while it ran (gpu_watch: the same
        # configuration's cycle moved 10 % between sessions on 2026-12-03)
        with GpuWatch() as watch:
            results, wall = _run(server, chosen, entry["concurrency"], args.max_new_tokens)
        m.update(summarize_measurement(results, wall))
        m["gpu_watch"] = watch.summary()
        print(
            f"round {entry['round']} {entry['server']} b={entry['batch']}: "
            f"{m['tok_s']} tok/s tau={m['tau']} errors={m['errors']}",
            file=sys.stderr,
        )
    return m


def merge_main(argv: Sequence[str]) -> int:
    """``bench_speed.py merge RUN.json ... --out-json OUT [--out-png PNG]``: the backend
    matrix from one run per attention backend."""
    parser = argparse.ArgumentParser(prog="bench_speed.py merge", description=merge_main.__doc__)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out-json", type=Path, required=True)
    parser.add_argument("--out-png")
    args = parser.parse_args(argv)
    results = []
    for path in args.runs:
        try:
            results.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            print(f"error: {path}: not a bench_speed result ({exc})", file=sys.stderr)
            return 2
        if "rows" not in results[-1] or "batches" not in results[-1]:
            print(f"error: {path}: no rows/batches: not a bench_speed result", file=sys.stderr)
            return 2
    if args.out_json.exists():
        print(f"error: {args.out_json} exists; not overwritten", file=sys.stderr)
        return 2
    merged = merge_results(results)
    args.out_json.write_text(json.dumps(merged, indent=1) + "\n")
    print(format_table(merged["rows"]))
    if args.out_png:
        write_png(merged, args.out_png)
    return 0


RESULT_PARTS = (
    "schema_version",
    "groups",
    "compare_setting",
    "servers",
    "rows",
    "best",
    "goals",
    "best_served",
    "goals_served",
    "measurements",
    "fixtures",
    "profiles",
    "cycle_breakdown",
    "specs",
    "rebuilt",
)


def specs_of(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A run's server specs: the stored ones, else (results before 2026-12-02) rebuilt from
    its server records and rows -- role, setting, the overlap flag in the command, the
    variant's label from its name, the draft vocabulary its rows said. (A ``--noise`` run's
    second baseline measurement has no server record: only stored specs bring it back.)"""
    if result.get("specs"):
        return [
            dict(s, setting=tuple(s["setting"]) if s.get("setting") else None)
            for s in result["specs"]
        ]
    vocab = {r["server"]: r.get("draft_vocab") for r in result.get("rows", [])}
    specs = []
    for server in result["servers"]:
        setting = tuple(server["setting"]) if server.get("setting") else None
        spec = {
            "name": server["name"],
            "role": server["role"],
            "setting": setting,
            "draft_vocab": vocab.get(server["name"]),
        }
        if NO_OVERLAP in (server.get("command") or []):
            spec["extra"] = [NO_OVERLAP]
        if server["role"] == "variant":
            spec["label"] = server["name"].rsplit("-", 1)[-1]
        elif server["role"] == "nospec_variant":
            spec["label"] = server["name"].split("-", 1)[1]
        specs.append(spec)
    return specs


def rebuild(result: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A result's rows, best, goals and cycle breakdown derived again, by this version's
    code, from what the run measured (its measurements, server records and traces' parts);
    ``rebuilt`` says from which file and by what."""
    meta = {k: v for k, v in result.items() if k not in RESULT_PARTS}
    specs = specs_of(result)
    compare = tuple(result["compare_setting"]) if result.get("compare_setting") else None
    out = build_result(
        meta,
        result["servers"],
        result["measurements"],
        specs,
        compare,
        result.get("fixtures"),
        result.get("groups"),
        result.get("schema_version", 1),
    )
    out["specs"] = specs
    if result.get("profiles"):
        out["profiles"] = result["profiles"]
        out["cycle_breakdown"] = cycle_breakdown(
            result["profiles"], specs, out["rows"], result.get("max_new_tokens")
        )
    out["rebuilt"] = {
        "from": source,
        "by": f"sglang_ext_tools.bench_speed rebuild (sglang-ext {package_version('sglang-ext')})",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    return out


def rebuild_main(argv: Sequence[str]) -> int:
    """``bench_speed.py rebuild RUN.json --out-json OUT [--out-png PNG]``: a run's derived
    figures again from its measurements, by this version's code."""
    parser = argparse.ArgumentParser(
        prog="bench_speed.py rebuild", description=rebuild_main.__doc__
    )
    parser.add_argument("run", type=Path)
    parser.add_argument("--out-json", type=Path, required=True)
    parser.add_argument("--out-png")
    args = parser.parse_args(argv)
    try:
        result = json.loads(args.run.read_text())
    except (OSError, ValueError) as exc:
        print(f"error: {args.run}: not a bench_speed result ({exc})", file=sys.stderr)
        return 2
    missing = [k for k in ("servers", "measurements", "batches") if k not in result]
    if missing:
        print(f"error: {args.run}: no {', '.join(missing)}: not a bench_speed run", file=sys.stderr)
        return 2
    if args.out_json.exists():
        print(f"error: {args.out_json} exists; not overwritten", file=sys.stderr)
        return 2
    out = rebuild(result, str(args.run))
    args.out_json.write_text(json.dumps(out, indent=2) + "\n")
    print(format_table(out["rows"]))
    print(f"goals: {json.dumps(out['goals'])}")
    if args.out_png:
        write_png(out, args.out_png)
    return 0


def assemble(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    specs: Sequence[Mapping[str, Any]],
    servers: Sequence[Server],
    measurements: Sequence[Mapping[str, Any]],
    profiles: Mapping[str, Any],
    date: str,
    started: float,
    aborted: str | None,
    source: str,
    num_prompts: int,
    partial: str | None = None,
) -> dict[str, Any]:
    """The result JSON as it stands: at the end of the run, or after any measurement with
    ``partial`` saying how far it got (so a machine lost mid-run still leaves the rounds
    that finished)."""
    gpu = gpu_info()
    server_records = []
    for spec, s in zip(specs, servers, strict=True):
        record = {
            "name": s.name,
            "role": spec["role"],
            "setting": spec["setting"],
            "command": s.command(),
            "env": s.env,
            "status": s.status,
            "ready_after_s": s.ready_after_s,
            "log": str(s.log_path),
        }
        if s.status != "ready":
            record["log_tail"] = s.log_tail(30)
            record["error"] = s.startup_error()
        server_records.append(record)
    fixtures = None
    if args.fixtures_json:
        path = Path(args.fixtures_json)
        fixtures = summarize_fixtures(json.loads(path.read_text()), str(path))
    meta = {
        "date": date,
        "gpu": gpu.get("name"),
        "gpu_info": gpu,
        "sglang_version": package_version("sglang"),
        "torch_version": package_version("torch"),
        "sglang_ext_version": sglang_ext.__version__,
        "attention_backend": args.attention_backend,
        "command": " ".join(sys.argv if argv is None else [__file__, *argv]),
        "settings": [list(s) for s in args.settings],
        "batches": args.batches,
        "max_new_tokens": args.max_new_tokens,
        "rounds": args.rounds,
        "requests_per_batch": args.requests_per_batch,
        "mem_fraction": args.mem_fraction,
        "at_once": args.at_once,
        "server_extra_args": server_extra_args(args),
        "prompts": {"source": source, "count": num_prompts},
        "wall_s": round(time.time() - started, 1),
        "aborted": aborted,
        "partial": partial,
    }
    result = build_result(
        meta, server_records, measurements, specs, args.compare, fixtures, args.groups
    )
    result["specs"] = specs
    if args.profile:
        result["profiles"] = profiles
        result["cycle_breakdown"] = cycle_breakdown(
            profiles, specs, result["rows"], args.max_new_tokens
        )
    return result


def write_result(result: Mapping[str, Any], args: argparse.Namespace) -> Path:
    """Write the result JSON atomically (a reader copying it mid-run never sees half a file)."""
    out_json = Path(args.out_json or Path(args.log_dir) / "bench_speed.json")
    out_json.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_json.with_name(out_json.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out_json)
    return out_json


def bring_up(
    up: Sequence[Server],
    timeout: float,
    pin_plan: Mapping[str, frozenset[int]] | None,
    every_core: frozenset[int],
) -> dict[str, dict[str, int]]:
    """Start a group's servers; with a pin plan, pin each ready one's processes to their
    roles' cores, and then this process, which sends the requests, to the client's. A server
    inherits this process's affinity when it starts, so the servers start on every core the
    benchmark may use: pinned to the client's cores first, a group's whole startup (imports,
    graph captures) shared two cores (2026-12-03, five servers: the first ready after 295 s,
    the other four past the 300 s timeout). Server -> role -> threads pinned."""
    if pin_plan:
        os.sched_setaffinity(0, every_core)
    start_all(list(up), timeout)
    pinned = {}
    for s in up:
        print(f"{s.name}: {s.status} after {s.ready_after_s} s", file=sys.stderr)
        if s.status != "ready" and (cause := s.startup_error()):
            # 2026-12-06: "exited(-9)" alone hid SGLang's KV-cache refusal (the result's
            # server record had it; the log a user watches did not)
            print(f"{s.name}: {cause}", file=sys.stderr)
        if pin_plan and s.status == "ready" and s.process:
            pinned[s.name] = cpu_pinning.pin_group(s.process.pid, pin_plan)
    if pin_plan:  # this thread's later threads (the request senders) inherit this
        os.sched_setaffinity(0, pin_plan["client"])
    return pinned


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        return merge_main(argv[1:])
    if argv[:1] == ["rebuild"]:
        return rebuild_main(argv[1:])
    args = parse_args(argv)
    try:
        prompts, source = load_prompts(args.prompts)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if any(p.input_ids is None for p in prompts):
        print(
            f"error: {source}: every line needs input_ids (servers skip the tokenizer)",
            file=sys.stderr,
        )
        return 2
    specs = args.specs
    servers = make_servers(specs, args)
    at_once = args.at_once
    fit = fit_groups(specs, args)
    if fit.get("refused"):
        print(f"error: --at-once {at_once}: {fit['refused']}", file=sys.stderr)
    elif fit.get("lowered"):
        print(
            f"--at-once-fit: --at-once {at_once} -> {args.at_once} ({fit['lowered']['because']})",
            file=sys.stderr,
        )
    plan = grouped_plan(
        args.groups,
        args.batches,
        args.rounds,
        args.requests_per_batch,
        len(prompts),
        args.batch1_requests,
    )
    if args.dry_run:
        dry = {
            "group_fit": fit,
            "servers": [
                {"name": s.name, "url": s.url, "command": s.command(), "env": s.env}
                for s in servers
            ],
            "warmup": warmup_plan(args.batches),
            "groups": args.groups,
            "plan": plan,
            "prompts": {"source": source, "count": len(prompts)},
        }
        print(json.dumps(dry, indent=1))
        return 2 if fit.get("refused") else 0
    if fit.get("refused"):
        return 2

    date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    started, measurements, aborted, profiles = time.time(), [], None, {}
    by_name = {s.name: s for s in servers}
    by_name.update(
        {spec["name"]: by_name[spec["alias_of"]] for spec in specs if spec.get("alias_of")}
    )
    brought_up: set[str] = set()
    pinned: dict[str, dict[str, int]] = {}  # server -> role -> threads pinned
    every_core = frozenset(os.sched_getaffinity(0))

    def snapshot(aborted: str | None, partial: str | None = None) -> dict[str, Any]:
        result = assemble(
            args, argv, specs, servers, measurements, profiles, date, started, aborted,
            source, len(prompts), partial=partial,
        )  # fmt: skip
        result["group_fit"] = fit
        if args.pin_plan:
            result["cpu_pinning"] = {
                "plan": cpu_pinning.describe(args.pin_plan),
                "threads_pinned": pinned,
            }
        return result

    def checkpoint(partial: str) -> None:
        """The result so far, on disk after each measurement: the node's watcher copies it
        back on every poll, so losing the machine mid-run loses at most one measurement."""
        try:
            write_result(snapshot(None, partial), args)
        except Exception as exc:  # the run goes on; its final write still has everything
            print(f"warning: partial result not written: {exc!r}", file=sys.stderr)

    try:
        for g, names in enumerate(args.groups):
            up = [s for s in servers if s.name in names and s.name not in brought_up]
            pinned.update(bring_up(up, args.startup_timeout, args.pin_plan, every_core))
            brought_up.update(s.name for s in up)
            for s in up:
                if s.status == "ready":
                    for w in warmup_plan(args.batches):
                        ids = prompt_indices(len(prompts), 0, w["requests"])
                        _run(s, [prompts[i] for i in ids], w["concurrency"], args.max_new_tokens)
            for entry in (e for e in plan if e["group"] == g):
                measurements.append(measure(by_name[entry["server"]], entry, prompts, args))
                checkpoint(f"{len(measurements)} of {len(plan)} measurements")
            if args.profile:  # each server while it is up (a group's go down below)
                for s in up:
                    if s.status == "ready" and s.alive():
                        profiles[s.name] = profile_server(s, prompts[0], args)
                        cycle = profiles[s.name].get("per_cycle_ms")
                        print(f"profile {s.name}: {json.dumps(cycle)}", file=sys.stderr)
                        checkpoint(f"{len(measurements)} of {len(plan)} measurements, profiles")
            if g + 1 < len(args.groups):  # free the GPU for the next group
                leaving = [by_name[n] for n in names if n not in args.groups[g + 1]]
                stop_all(leaving)
                for s in leaving:
                    if not s.wait_gone():
                        raise RuntimeError(f"{s.name}: processes left after stop")
    except (Exception, KeyboardInterrupt) as exc:
        aborted = f"{type(exc).__name__}: {exc}"
        print(f"aborted: {aborted} (writing partial results)", file=sys.stderr)
    finally:
        stop_all(servers)

    result = snapshot(aborted)
    out_json = write_result(result, args)
    print(format_table(result["rows"]))
    best = result["best"] or {}
    keys = ("steps", "topk", "draft_tokens", "batch", "speedup", "eta", "tau")
    print(f"best: {json.dumps({k: best.get(k) for k in keys} if best else None)}")
    print(f"goals: {json.dumps(result['goals'])}")
    if result.get("best_served") is not None:
        served = result["best_served"]
        print(f"best served (variants too): {json.dumps({k: served.get(k) for k in keys})}")
        print(f"goals served: {json.dumps(result['goals_served'])}")
    print(f"results written to {out_json}")
    if args.out_png and write_png(result, args.out_png):
        print(f"plot written to {args.out_png}")
    failed = any(s.status != "ready" for s in servers) or any(m.get("errors") for m in measurements)
    return 1 if aborted or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
