"""Two servers' served τ from one bench_speed run, paired by prompt: an A/B of drafters (or
of anything else that moves acceptance) on the same target, prompts and setting.

A retrained target moves τ by up to 0.5 from one session to the next, so a drafter recipe
is judged inside one run, where both drafters verify against the same target. Each
request's counts come from the bench file: its verify cycles (``verify_steps``, recorded
since 2026-12-06) and its completion tokens. The bench sends ``ignore_eos`` with a fixed
``max_new_tokens``, so every request of a measurement returns the same number of tokens,
``verify_tokens / requests``; a measurement where that does not divide evenly is refused.
Greedy requests verify the same text in every round, so each prompt's counts are taken from
the first round both servers finished, and ``rounds_agree`` says whether the later rounds
repeated them.

    python -m sglang_ext_tools.served_tau_ab --bench B.json \\
        --pair spec-7-1-8:nbrfalse-plugin-7-1-8 [--pair A:B ...] [--out OUT.json]

``--bench-b EARLIER.json`` reads every pair's B server from an earlier run instead: a drafter
carried across sessions against its earlier self. Both runs must have served the same target
build (the fixture manifest's base stage, ``created_unix``) with the same ``max_new_tokens``;
otherwise the pairing by prompt means nothing and the files are refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext_tools.json_out import emit
from sglang_ext_tools.tau_compare import ratio_interval


class CountsError(ValueError):
    """A measurement whose per-request counts cannot be read."""


def request_counts(m: Mapping[str, Any]) -> dict[int, tuple[int, int]]:
    """{prompt index: (accepted draft tokens, verify cycles)} of one batch-1 measurement."""
    steps = m.get("verify_steps")
    where = f"server {m.get('server')!r} round {m.get('round')}"
    if not steps:
        raise CountsError(f"{where}: no verify_steps (a bench file from before 2026-12-06?)")
    if any(s is None for s in steps):
        raise CountsError(f"{where}: a request failed or was not speculative")
    per, rest = divmod(m["verify_tokens"], len(steps))
    if rest:
        raise CountsError(
            f"{where}: verify_tokens {m['verify_tokens']} is not {len(steps)} equal requests"
        )
    return {p: (per - s, s) for p, s in zip(m["prompts"], steps, strict=True)}


def _rounds(bench: Mapping[str, Any], server: str) -> dict[int, dict[int, tuple[int, int]]]:
    rounds = {}
    for m in bench.get("measurements", []):
        if m.get("server") == server and m.get("batch") == 1 and m.get("status") == "ok":
            rounds[m["round"]] = request_counts(m)
    if not rounds:
        raise CountsError(f"server {server!r}: no finished batch-1 measurement in the bench file")
    return rounds


def target_build(bench: Mapping[str, Any]) -> Any:
    """The served target's build: its fixture manifest's base stage time (None if absent)."""
    stages = (bench.get("fixtures") or {}).get("stages") or {}
    return (stages.get("base") or {}).get("created_unix")


def check_same_target(a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    """Two runs pair by prompt only on one target build and one request length."""
    for what, va, vb in (
        ("the target build (fixtures.stages.base.created_unix)", target_build(a), target_build(b)),
        ("max_new_tokens", a.get("max_new_tokens"), b.get("max_new_tokens")),
    ):
        if va is None or va != vb:
            raise CountsError(f"{what}: {va!r} in A's run, {vb!r} in B's; expected the same")


def compare(
    bench: Mapping[str, Any], a: str, b: str, bench_b: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """τ(a) / τ(b) over the prompts both served, with its paired bootstrap interval; b from
    ``bench_b`` where given (an earlier run on the same target build)."""
    ra, rb = _rounds(bench, a), _rounds(bench if bench_b is None else bench_b, b)
    common = sorted(set(ra) & set(rb))
    if not common:
        raise CountsError(f"servers {a!r} and {b!r} finished no round in common")
    first = common[0]
    prompts = sorted(set(ra[first]) & set(rb[first]))
    agree = all(
        counts.get(q, rounds[first][q]) == rounds[first][q]
        for rounds in (ra, rb)
        for counts in rounds.values()
        for q in prompts
    )
    out = ratio_interval([ra[first][p] for p in prompts], [rb[first][p] for p in prompts])
    return {"a": a, "b": b, "round": first, "rounds_agree": agree, **out}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", type=Path, required=True)
    p.add_argument("--pair", action="append", required=True, metavar="A:B")
    p.add_argument("--bench-b", type=Path, help="read B from this (earlier) run")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.out and args.out.exists():
        print(f"error: {args.out} exists; results are never overwritten", file=sys.stderr)
        return 1
    bench = json.loads(args.bench.read_text())
    bench_b = json.loads(args.bench_b.read_text()) if args.bench_b else None
    if bench_b is not None:
        try:
            check_same_target(bench, bench_b)
        except CountsError as e:
            print(f"error: {args.bench} against {args.bench_b}: {e}", file=sys.stderr)
            return 1
    results = []
    for pair in args.pair:
        a, sep, b = pair.partition(":")
        if not sep or not a or not b:
            print(f"error: --pair {pair!r}: expected SERVER_A:SERVER_B", file=sys.stderr)
            return 2
        try:
            results.append(compare(bench, a, b, bench_b))
        except CountsError as e:
            print(f"error: {args.bench}: {e}", file=sys.stderr)
            return 1
    head = {k: bench.get(k) for k in ("date", "gpu", "sglang_version", "attention_backend")}
    out = {**head, "bench": args.bench.name, "pairs": results}
    if args.bench_b:
        out["bench_b"] = args.bench_b.name
    return emit(out, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
