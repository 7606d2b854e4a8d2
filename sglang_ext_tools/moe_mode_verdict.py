"""``moe_mode``'s runs read against what was registered before they ran (issue #24).

``moe_mode`` times SGLang's fused MoE in fresh processes that differ in two things: whether
the process's kernels were compiled in it (label ``fresh-…``) or loaded from a cache an
earlier process filled (``warm-…``), and whether the Triton MoE GEMM launches with PDL
(``pdl`` "1"/"0"). The tenth seed-shape run's servers drew the up-projection at 6 tokens in
two modes, 68.6 and 82.2 us a call on an H100. Registered on 2026-12-06
(docs/next-device-sessions.md) before the probe ran, on an H100:

- the cache condition took: each fresh run's first call >= 1 s at each token count, each warm
  run's < 1 s;
- if the cache sets the mode: fresh up-projections <= 72 us at 6 tokens, warm >= 78;
- if PDL sets it: PDL runs >= 78 us, no-PDL runs <= 72;
- expected, neither: all up-projections at 6 tokens within 3 % of each other and <= 72 us.

Those runs all took one layer's expert weights, which stay in L2 from call to call; a
server's 60 layers do not. Registered 2026-12-06 (seventeenth session), after that probe and
before the next ran: runs with ``:LAYERS`` > 1 (cold weights) against the same lease's
one-layer runs, on an H100,
- L2 explains part of the one-token gap (standalone ~27 us, the cheapest server 33.0): the
  cold up-projection at 1 token >= 1.10x the one-layer figure;
- no L2 effect: cold over one-layer within 0.95-1.05 at every token count;
- cold weights are the dear mode: every cold run >= 78 us at 6 tokens or >= 50 us at 1;
- expected: the first, and at 6 tokens within 5 % (~190 MB a call streams past a 50 MB L2).
The first probe's verdicts are read on one-layer runs only. In the same registration, runs
with ``:frag`` (many layers' weights mapped from scattered physical holes) against the clean
cold runs: fragmentation is the dear mode if every frag run is >= 78 us at 6 tokens or
>= 50 us at 1; no effect if frag over clean cold is within 0.95-1.05 at every token count;
expected: no effect (the weights are paged the same either way), held loosely.

Registered 2026-12-07 (eighteenth session), before it ran: the standalone binary. Runs that
record the up-projection's compiled binary (registers, shared memory; ``moe_mode`` since
then) share one binary, fresh and warm alike, with PDL on and with it off
(``one_up_binary``, per token count; None for a group with a run that recorded none).

Besides the verdicts: per token count, each group's mean up-projection and each group ratio
(PDL over no PDL, fresh over warm; the fused call alone as well) with a 95 % bootstrap
interval that resamples runs within each group. Several ``moe_mode`` files (e.g. a second
order) are read as one set of runs.

    python -m sglang_ext_tools.moe_mode_verdict --json A.json B.json --out verdict.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext_tools.json_out import emit
from sglang_ext_tools.trace_breakdown import COMPILED_KEYS, compiled_binaries

# the registered bounds (us a call, up-projection at MODE_TOKENS tokens, H100)
CHEAP_MAX_US = 72.0
DEAR_MIN_US = 78.0
SPREAD_MAX = 1.03
COLD_GAIN_MIN = 1.10  # cold over one-layer at 1 token, if L2 explains the gap
NO_EFFECT = (0.95, 1.05)
DEAR_ONE_TOKEN_MIN_US = 50.0
COMPILED_MIN_S = 1.0
MODE_TOKENS = "6"


def run_rows(reports: Sequence[Mapping[str, Any]], files: Sequence[str]) -> list[dict[str, Any]]:
    """One row per process of every report: its file's index, label, fresh/warm, PDL, and per
    token count the first call's seconds, the call alone and the up-projection (us)."""
    rows = []
    for index, (report, name) in enumerate(zip(reports, files, strict=True)):
        for run in report.get("runs", []):
            label = run.get("label", "?")
            if "error" in run:
                raise ValueError(f"{name}: run {label!r} failed: {run['error']}")
            start = label.split("-", 1)[0]
            if start not in ("fresh", "warm"):
                raise ValueError(
                    f"{name}: run label {label!r}: expected it to start with 'fresh-' or "
                    "'warm-' (moe_mode's convention), found neither"
                )
            try:
                rows.append(_row(index, run, start))
            except KeyError as exc:
                raise ValueError(f"{name}: run {label!r}: field {exc} missing") from None
    return rows


def _row(index: int, run: Mapping[str, Any], start: str) -> dict[str, Any]:
    return {
        "report": index,
        "label": run["label"],
        "fresh": start == "fresh",
        "pdl": str(run["pdl"]) == "1",
        # files of the first probe have neither "layers" (1) nor "alloc" ("")
        "layers": run.get("layers", 1),
        "frag": run.get("alloc", "") == "frag",
        "cold": run.get("layers", 1) > 1 and run.get("alloc", "") != "frag",
        "tokens": {
            m: {
                "first_call_s": t["first_call_s"],
                "alone_us": t["alone_us"],
                "up_us": t["kernels"]["up"]["mean_us"],
                **up_binary(t["kernels"]["up"]),
            }
            for m, t in run["tokens"].items()
        },
    }


def up_binary(up: Mapping[str, Any]) -> dict[str, Any]:
    """The up-projection's compiled binary (registers, shared memory) where the run recorded
    it (files since 2026-12-07); nothing for earlier files."""
    if "registers" not in up:
        return {}
    return {"up_binary": {k: up.get(k) for k in COMPILED_KEYS}}


def one_binary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per token count, PDL on and off apart: whether every run of the group ran one compiled
    up-projection (None where a run of the group recorded none), and the distinct binaries."""
    out: dict[str, Any] = {}
    for m in rows[0]["tokens"]:
        seen = compiled_binaries(r["tokens"][m].get("up_binary") for r in rows)
        out[m] = {"binaries": [[json.loads(x) for x in b] for b in sorted(set(seen))]}
        for name, pdl in (("pdl", True), ("nopdl", False)):
            group = [r["tokens"][m].get("up_binary") for r in rows if r["pdl"] == pdl]
            found = set(compiled_binaries(group))
            out[m][name] = len(found) == 1 if group and all(group) else None
    return out


def ratio_ci(
    num: Sequence[float], den: Sequence[float], draws: int = 4000, seed: int = 0
) -> list[float] | None:
    """95 % interval of mean(num) / mean(den), each group resampled on its own."""
    if len(num) < 2 or len(den) < 2:
        return None
    rng = random.Random(seed)
    stats = sorted(
        statistics.fmean(rng.choices(num, k=len(num)))
        / statistics.fmean(rng.choices(den, k=len(den)))
        for _ in range(draws)
    )
    return [round(stats[int(0.025 * draws)], 4), round(stats[int(0.975 * draws) - 1], 4)]


def compare(rows: Sequence[Mapping[str, Any]], key: str, tokens: str, field: str) -> dict:
    """Group means of ``field`` at ``tokens`` split by the boolean ``key``, and their ratio."""
    yes = [r["tokens"][tokens][field] for r in rows if r[key]]
    no = [r["tokens"][tokens][field] for r in rows if not r[key]]
    if not yes or not no:
        return {"n": [len(yes), len(no)]}
    return {
        "n": [len(yes), len(no)],
        "mean_us": [round(statistics.fmean(yes), 2), round(statistics.fmean(no), 2)],
        "ratio": round(statistics.fmean(yes) / statistics.fmean(no), 4),
        "ratio_ci95": ratio_ci(yes, no),
    }


def ups(rows: Sequence[Mapping[str, Any]], key: str | None = None, value: bool = True):
    """The up-projection at MODE_TOKENS of each row (whose ``key`` is ``value``, if given)."""
    return [r["tokens"][MODE_TOKENS]["up_us"] for r in rows if key is None or r[key] == value]


def verdicts(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    every = ups(rows)
    fresh_up, warm_up = ups(rows, "fresh"), ups(rows, "fresh", False)
    pdl_up, nopdl_up = ups(rows, "pdl"), ups(rows, "pdl", False)
    took = {
        m: all((r["tokens"][m]["first_call_s"] >= COMPILED_MIN_S) == r["fresh"] for r in rows)
        for m in rows[0]["tokens"]
    }
    spread = max(every) / min(every)
    return {
        "cache_condition_took": took,
        "cache_sets_mode": bool(fresh_up and warm_up)
        and max(fresh_up) <= CHEAP_MAX_US
        and min(warm_up) >= DEAR_MIN_US,
        "pdl_sets_mode": bool(pdl_up and nopdl_up)
        and min(pdl_up) >= DEAR_MIN_US
        and max(nopdl_up) <= CHEAP_MAX_US,
        "neither": {
            "spread": round(spread, 4),
            "within_3_percent": spread <= SPREAD_MAX,
            "max_up_us": max(every),
            "all_at_most_72_us": max(every) <= CHEAP_MAX_US,
            "any_dear": max(every) >= DEAR_MIN_US,
        },
    }


def dear_in_all(rows: Sequence[Mapping[str, Any]]) -> bool:
    return bool(rows) and all(
        r["tokens"][MODE_TOKENS]["up_us"] >= DEAR_MIN_US
        or r["tokens"].get("1", {}).get("up_us", 0.0) >= DEAR_ONE_TOKEN_MIN_US
        for r in rows
    )


def arm(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[dict, bool, bool, list[int]]:
    """An arm (rows whose ``key`` is set) against the rest: the up-projection's ratio per
    token count, whether every ratio is inside NO_EFFECT, whether every arm run is dear, and
    the two groups' sizes."""
    ratios = {m: compare(rows, key, m, "up_us") for m in rows[0]["tokens"]}
    no_effect = all(
        "ratio" in c and NO_EFFECT[0] <= c["ratio"] <= NO_EFFECT[1] for c in ratios.values()
    )
    return ratios, no_effect, dear_in_all([r for r in rows if r[key]]), ratios[MODE_TOKENS]["n"]


def cold_verdicts(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The second registration's readings (cold weights against one layer's)."""
    ratios, no_effect, dear, n = arm([r for r in rows if not r["frag"]], "cold")
    one_token = ratios.get("1", {}).get("ratio")
    return {
        "cold_over_one_layer": ratios,
        "l2_explains_one_token_gap": one_token is not None and one_token >= COLD_GAIN_MIN,
        "no_l2_effect": no_effect,
        "cold_is_dear": dear,
        "n": n,
    }


def frag_verdicts(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The fragmented-allocation runs against the clean cold runs (both many layers)."""
    ratios, no_effect, dear, n = arm([r for r in rows if r["layers"] > 1], "frag")
    return {
        "frag_over_clean_cold": ratios,
        "no_frag_effect": no_effect,
        "frag_is_dear": dear,
        "n": n,
    }


def traced(row: Mapping[str, Any]) -> bool:
    return any("up_binary" in t for t in row["tokens"].values())


def verdict(reports: Sequence[Mapping[str, Any]], files: Sequence[str]) -> dict[str, Any]:
    rows = run_rows(reports, files)
    if not rows:
        raise ValueError("no runs in the reports")
    for r in rows:
        if MODE_TOKENS not in r["tokens"] or set(r["tokens"]) != set(rows[0]["tokens"]):
            raise ValueError(
                f"{files[r['report']]}: run {r['label']!r}: token counts {sorted(r['tokens'])}, "
                f"expected {sorted(rows[0]['tokens'])} with {MODE_TOKENS} among them"
            )
        if r["frag"] and r["layers"] == 1:
            raise ValueError(
                f"{files[r['report']]}: run {r['label']!r}: a frag run is read against the "
                "clean cold runs, so it needs LAYERS > 1; found 1"
            )
    one_layer = [r for r in rows if r["layers"] == 1 and not r["frag"]]
    if not one_layer:
        raise ValueError("no one-layer runs (LAYERS 1): nothing to read the bounds against")
    gpus = sorted({r["gpu"].get("name", "?") for r in reports if isinstance(r.get("gpu"), dict)})
    tokens = list(rows[0]["tokens"])
    return {
        "files": list(files),
        "gpus": gpus,
        "dates": [r.get("date") for r in reports],
        "bounds_us": {"cheap_max": CHEAP_MAX_US, "dear_min": DEAR_MIN_US, "tokens": MODE_TOKENS},
        "runs": rows,
        "pdl_over_nopdl": {
            m: {f: compare(one_layer, "pdl", m, f) for f in ("up_us", "alone_us")} for m in tokens
        },
        "fresh_over_warm": {
            m: {f: compare(one_layer, "fresh", m, f) for f in ("up_us", "alone_us")} for m in tokens
        },
        "verdicts": verdicts(one_layer),
        **({"one_up_binary": one_binary(rows)} if any(traced(r) for r in rows) else {}),
        **({"cold": cold_verdicts(rows)} if any(r["cold"] for r in rows) else {}),
        **({"frag": frag_verdicts(rows)} if any(r["frag"] for r in rows) else {}),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", nargs="+", required=True, help="moe_mode result files")
    p.add_argument("--out", help="write the verdict here (never over a file)")
    args = p.parse_args(argv)
    if args.out and Path(args.out).exists():
        p.error(f"--out {args.out}: exists; not overwriting it")
    try:
        reports = [json.loads(Path(f).read_text()) for f in args.json]
        result = verdict(reports, args.json)
    except (OSError, ValueError) as exc:
        print(f"moe_mode_verdict: {exc}", file=sys.stderr)
        return 2
    return emit(result, Path(args.out) if args.out else None)


if __name__ == "__main__":
    raise SystemExit(main())
