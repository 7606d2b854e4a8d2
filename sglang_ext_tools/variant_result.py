"""A variant server against its plain twin, from one bench_speed run: what one switch (an
environment variable, a server flag) changes at one setting, with the same drafter, prompts
and group. Measured figures are read from the run's JSON, derived ones computed here:

- ``whole`` and ``decode``: the variant's speed over the plain server's, per prompt on the same
  prompts and rounds (each prompt's time averaged over the rounds both servers finished), over
  whole requests and after each request's first token; the point is the ratio of the summed
  times, the statistic the bootstrap interval resamples (``stats.ratio_of_sums``; the
  ``vs_setting`` of a schema-1 bench file divided median tok/s and could sit outside it);
- ``decode_cycle``: decode steps per verify cycle of each, tau x spec TPOT / no-spec TPOT;
- ``across_runs``: the same setting's decode cycle in earlier runs' JSON beside this one, with
  the fused-MoE block sizes each run's tuner picked (``tune_moe``'s report), so an effect that
  moves between runs on one config shows as such;
- ``per_cycle`` (where each request's verify count is known): ``cycle_fit``'s split of the
  time after the first token into a cost per verify cycle and a cost per request, for both
  servers, the variant's less the plain one's with intervals over prompts, and the per-cycle
  difference in decode steps (no speculation's TPOT). bench_speed records the counts since
  2026-12-06; for an earlier file ``--acceptance`` gives the run's acceptance records (a
  folder, or its server-logs tarball);
- ``predictions``: registered ranges for (plain - variant) decode cycles, held against the run.

    python -m sglang_ext_tools.variant_result --bench B.json --tune-moe T.json \\
        --earlier E1.json,T1.json E2.json,T2.json --predict bn64@5,1,6=0.10:0.24 --out OUT.json

``--predict fp8head@7,1,8/fp8long=0.04:0.06`` reads the variant against another variant of
its setting (here the fp8 drafter with a bf16 head) instead of its plain twin, and adds that
pair to ``variants``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
from pathlib import Path
from typing import Any

from sglang_ext_tools import bench_speed, cycle_fit
from sglang_ext_tools.stats import bootstrap_ratio_ci, paired_values, ratio_of_sums

VERIFY_SIZES = ("4", "5", "6")
HEADER = (
    "date",
    "gpu",
    "gpu_info",
    "sglang_version",
    "torch_version",
    "attention_backend",
    "command",
)


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {path}: cannot read it as JSON ({e})") from None


def _paired(plain: dict, variant: dict, key: str) -> dict[str, Any] | None:
    """variant speed / plain speed = plain time / variant time, summed over paired prompts."""
    a = bench_speed.per_prompt_times(plain.get(key, []))
    b = bench_speed.per_prompt_times(variant.get(key, []))
    point = ratio_of_sums(a, b)
    if point is None:
        return None
    return {
        "ratio": round(point, 4),
        "ratio_ci95": bootstrap_ratio_ci(a, b),
        "prompts": len(paired_values(a, b)),
    }


def _cycles(bench: dict) -> dict[str, float]:
    """Each speculative server's decode cycle at batch 1 as the run's rows give it."""
    return {
        r["server"]: r["decode_cycle_cost"]
        for r in bench.get("rows", [])
        if r.get("batch") == 1 and r.get("decode_cycle_cost") is not None
    }


def gpu_while_measured(bench: dict, server: str) -> dict[str, Any] | None:
    """A server's measurements' ``gpu_watch`` summaries (bench_speed since 2026-12-03's
    eighth session) pooled: the median of their median SM clocks, the lowest clock seen,
    every clock-event reason; None for a run recorded before them."""
    watched = [
        m["gpu_watch"]
        for m in bench.get("measurements", [])
        if m.get("server") == server and m.get("batch") == 1 and m.get("gpu_watch")
    ]
    medians = [w["sm_mhz_median"] for w in watched if w.get("sm_mhz_median") is not None]
    lows = [w["sm_mhz_min"] for w in watched if w.get("sm_mhz_min") is not None]
    if not medians:
        return None
    return {
        "measurements": len(watched),
        "sm_mhz_median": statistics.median(medians),
        "sm_mhz_min": min(lows) if lows else None,
        "clock_event_reasons": sorted(
            {r for w in watched for r in w.get("clock_event_reasons", [])}
        ),
    }


def block_sizes(report: dict | None) -> dict[str, dict[str, int]] | None:
    """The tuner's pick at the verify sizes: {tokens: {BLOCK_SIZE_N, BLOCK_SIZE_K, ...}}."""
    if not report:
        return None
    tokens = report.get("tokens") or {}
    return {m: dict(tokens[m]["best"]) for m in VERIFY_SIZES if m in tokens and "best" in tokens[m]}


def per_cycle(
    measurements: list[dict[str, Any]],
    plain: str,
    variant: str,
    rounds: list[int],
    step_ms: float | None,
) -> dict[str, Any] | None:
    """cycle_fit's comparison of the two servers on the rounds both finished, the per-cycle
    difference also in decode steps (None where the verify counts are not known)."""
    got = cycle_fit.compare(
        cycle_fit.server_points(measurements, plain, rounds),
        cycle_fit.server_points(measurements, variant, rounds),
    )
    if got is None:
        return None
    if step_ms:
        got["decode_step_ms"] = step_ms
        (
            got["variant_minus_plain_decode_steps"],
            got["variant_minus_plain_decode_steps_ci95"],
        ) = cycle_fit.in_decode_steps(
            got["variant_minus_plain_ms_per_cycle"],
            got["variant_minus_plain_ms_per_cycle_ci95"],
            step_ms,
        )
    return got


class UnknownServer(ValueError):
    """A --predict BASE (or variant) that names no batch-1 row of the bench file."""


def pairs(bench: dict, against: list[tuple[str, str]] = ()) -> list[tuple[dict, str]]:
    """(variant row, plain server name): every batch-1 variant row with its plain twin
    (bench_speed's vs_setting_server), then each (variant, other server) of ``against``: a
    variant read against another variant of its group (the fp8 head against the fp8 drafter
    whose head stays bf16)."""
    rows = [r for r in bench.get("rows", []) if r.get("batch") == 1]
    out = [(r, r["vs_setting_server"]) for r in rows if r.get("vs_setting_server")]
    by_server = {r.get("server"): r for r in rows}
    for variant, plain in against:
        if variant not in by_server or plain not in by_server:
            missing = variant if variant not in by_server else plain
            raise UnknownServer(f"no batch-1 row for server {missing!r} in the bench file")
        if (by_server[variant], plain) not in out:
            out.append((by_server[variant], plain))
    return out


def compare(
    bench: dict, records: Path | None = None, against: list[tuple[str, str]] = ()
) -> list[dict[str, Any]]:
    """Every pair of ``pairs`` (variant against plain); ``records``: the run's acceptance
    records, for a file without per-request verify counts."""
    agg = bench_speed.aggregate(bench.get("measurements", []))
    cycles = _cycles(bench)
    # each server's verify counts aligned once, however many variants share it as their plain
    measurements = list(bench.get("measurements", []))
    out = []
    for row, plain_name in pairs(bench, against):
        plain_row = next((r for r in bench["rows"] if r.get("server") == plain_name), {})
        plain, variant = bench_speed.common_rounds(
            agg.get((plain_name, 1)), agg.get((row["server"], 1))
        )
        if not plain or not variant:
            continue
        c_plain, c_variant = cycles.get(plain_name), cycles.get(row["server"])
        rounds = sorted(plain["tok_s_rounds"])
        measurements = cycle_fit.with_verify(measurements, [plain_name, row["server"]], records)
        split = per_cycle(
            measurements,
            plain_name,
            row["server"],
            rounds,
            row.get("nospec_tpot_ms"),
        )
        out.append(
            {
                "variant": row["server"],
                "plain": plain_name,
                "setting": [row["steps"], row["topk"], row["draft_tokens"]],
                "rounds": rounds,
                "tau": {"variant": row.get("tau"), "plain": plain_row.get("tau")},
                "whole": _paired(plain, variant, "latency_rounds"),
                "decode": _paired(plain, variant, "decode_rounds"),
                "gpu_while_measured": {
                    "variant": gpu_while_measured(bench, row["server"]),
                    "plain": gpu_while_measured(bench, plain_name),
                },
                "decode_cycle": {
                    "variant": c_variant,
                    "plain": c_plain,
                    "plain_minus_variant": (
                        round(c_plain - c_variant, 4)
                        if c_plain is not None and c_variant is not None
                        else None
                    ),
                },
                **({"per_cycle": split} if split else {}),
            }
        )
    return out


def parse_prediction(text: str) -> tuple[str, str | None, float, float]:
    """LABEL@S,K,D[/BASE]=LOW:HIGH -> (variant server, plain server or None, low, high): a
    registered range for the plain server's decode cycle less the variant's. Without BASE
    the plain server is the variant's twin; with it, the variant BASE of the same setting
    (``fp8head@7,1,8/fp8long=0.04:0.06``)."""
    try:
        name, bounds = text.split("=", 1)
        label, setting = name.split("@", 1)
        setting, _, base = setting.partition("/")
        low, high = (float(x) for x in bounds.split(":", 1))
        prefix = f"spec-{setting.replace(',', '-')}"
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--predict {text!r}: expected LABEL@STEPS,TOPK,DRAFT[/BASE]=LOW:HIGH "
            "(e.g. bn64@5,1,6=0.10:0.24, fp8head@7,1,8/fp8long=0.04:0.06)"
        ) from None
    return f"{prefix}-{label}", (f"{prefix}-{base}" if base else None), low, high


def build(
    bench: dict,
    tune_report: dict | None,
    earlier: list[tuple[str, dict, dict | None]],
    predictions: list[tuple[str, float, float]],
    paths: dict[str, Any],
    records: Path | None = None,
) -> dict[str, Any]:
    against = [(server, base) for server, base, _, _ in predictions if base]
    variants = compare(bench, records, against)
    twins = {r.get("server"): r.get("vs_setting_server") for r in bench.get("rows", [])}
    by_pair = {(v["variant"], v["plain"]): v for v in variants}
    checked = []
    for server, base, low, high in predictions:
        plain = base or twins.get(server)
        got = (by_pair.get((server, plain)) or {}).get("decode_cycle", {})
        got = got.get("plain_minus_variant")
        checked.append(
            {
                "variant": server,
                # named where it is not the twin (files built before it stay as they were)
                **({"plain": plain} if base else {}),
                "plain_minus_variant_registered": [low, high],
                "measured": got,
                "met": None if got is None else low <= got <= high,
            }
        )
    runs = [("this run", bench, tune_report), *earlier]
    return {
        **{k: bench.get(k) for k in HEADER},
        "sources": paths,
        "variants": variants,
        "predictions": checked,
        "across_runs": [
            {"run": name, "decode_cycle": _cycles(b), "tuner_pick": block_sizes(t)}
            for name, b, t in runs
        ],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", type=Path, required=True, help="bench_speed result with variants")
    p.add_argument("--tune-moe", type=Path, help="tune_moe's report for the run's servers")
    p.add_argument(
        "--earlier",
        nargs="*",
        default=[],
        metavar="BENCH[,TUNE]",
        help="earlier runs' bench_speed JSON, each with its tuner report after a comma",
    )
    p.add_argument("--predict", type=parse_prediction, action="append", default=[])
    p.add_argument(
        "--acceptance",
        type=Path,
        help="the run's acceptance records (a folder of <server>.jsonl, or the server-logs "
        "tarball) for a bench file without per-request verify counts",
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.out.exists():
        print(f"error: {args.out} exists; results are never overwritten", file=sys.stderr)
        return 1
    earlier = []
    for item in args.earlier:
        bench_path, _, tune_path = item.partition(",")
        earlier.append(
            (
                Path(bench_path).name,
                _load(Path(bench_path)),
                _load(Path(tune_path)) if tune_path else None,
            )
        )
    paths = {
        "bench": args.bench.name,
        **({"tune_moe": args.tune_moe.name} if args.tune_moe else {}),
        **({"acceptance": args.acceptance.name} if args.acceptance else {}),
        "earlier": [" + ".join(Path(f).name for f in e.split(",")) for e in args.earlier],
    }
    try:
        result = build(
            _load(args.bench),
            _load(args.tune_moe) if args.tune_moe else None,
            earlier,
            args.predict,
            paths,
            args.acceptance,
        )
    except (OSError, tarfile.TarError, cycle_fit.AlignmentError) as e:
        print(f"error: {args.acceptance}: {e}", file=sys.stderr)
        return 1
    except UnknownServer as e:
        print(f"error: {args.bench}: --predict: {e}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("variants", "predictions")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
