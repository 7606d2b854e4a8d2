"""Two servers from two bench_speed runs on one GPU and the same prompts, each taken over the
stock baseline of its own group in its own run: speedup(a) / speedup(b) with its 95 %
interval over prompts (``bench_speed.over_own_baselines`` on the two runs' measurements side
by side; each prompt's four latencies are resampled together, so what the prompts contribute
cancels, and so does a drift of the card between the runs that moves both baselines).

Written for settings a lease could only serve in separate runs (2026-12-07: the seed's tree
``join`` 3/4/5 and the chain ``join`` 3/1/4 after the trained ``join`` 5/1/6 run). Refused,
naming the field, where the runs differ in GPU (UUID), SGLang, attention backend, fixture
manifest (a retrained pair moves τ) or a measurement's prompts, or where a server did not
measure at batch 1.

    python -m sglang_ext_tools.across_runs \\
        --pair tree_over_chain=A.json:spec-3-4-5-join,B.json:spec-3-1-4-join --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext_tools.bench_shape import bench_shape
from sglang_ext_tools.bench_speed import over_own_baselines
from sglang_ext_tools.json_out import emit

SAME = ("sglang_version", "attention_backend", "fixtures")  # beside the GPU's UUID
OFFSET = 1_000_000  # the second run's groups, kept apart from the first's


def _uuid(bench: Mapping[str, Any]) -> str | None:
    return (bench.get("gpu_info") or {}).get("uuid")


def _batch1(bench: Mapping[str, Any], server: str, where: str) -> list[Mapping[str, Any]]:
    ms = [m for m in bench.get("measurements", []) if m.get("server") == server
          and m.get("batch") == 1 and m.get("status") == "ok"]  # fmt: skip
    if not ms:
        raise ValueError(f"{where}: no batch-1 measurement of server {server!r}")
    return ms


def _prompts(ms: Sequence[Mapping[str, Any]], label: str) -> list[int]:
    lists = {tuple(m.get("prompts") or ()) for m in ms}
    if len(lists) != 1:
        raise ValueError(f"{label}: its rounds ran different prompts")
    return list(lists.pop())


def same_runs(benches: Mapping[str, Mapping[str, Any]]) -> None:
    """Raises ValueError naming the field where a run (by file name) differs from the first:
    the GPU's UUID (which must be recorded) or a field of ``SAME``."""
    (fa, ba), *rest = benches.items()
    for fb, bb in rest:
        if _uuid(ba) is None or _uuid(ba) != _uuid(bb):
            raise ValueError(f"gpu_info.uuid: {fa} ran on {_uuid(ba)}, {fb} on {_uuid(bb)}")
        for field in SAME:
            if ba.get(field) != bb.get(field):
                shown = [str(x.get(field))[:80] for x in (ba, bb)]
                raise ValueError(f"{field}: {fa} has {shown[0]!r}, {fb} {shown[1]!r}")


def compare(
    a: tuple[Mapping[str, Any], str, str], b: tuple[Mapping[str, Any], str, str]
) -> dict[str, Any]:
    """``a`` and ``b``: (bench JSON, server, file name). Raises ValueError naming what
    differs between the runs or what is missing."""
    (ba, sa, fa), (bb, sb, fb) = a, b
    same_runs({fa: ba, fb: bb})
    merged, picks, prompts = [], [], set()
    for k, (bench, server, where) in enumerate(((ba, sa, fa), (bb, sb, fb))):
        ms = _batch1(bench, server, where)
        group = ms[0].get("group", 0)
        base = [m for m in _batch1(bench, "nospec", where) if m.get("group", 0) == group]
        if not base:
            raise ValueError(f"{where}: no batch-1 baseline in {server!r}'s group {group}")
        prompts |= {tuple(_prompts(ms, f"{where}:{server}")),
                    tuple(_prompts(base, f"{where}:nospec"))}  # fmt: skip
        merged += [{**m, "group": m.get("group", 0) + k * OFFSET}
                   for m in bench["measurements"]]  # fmt: skip
        picks.append((server, group + k * OFFSET))
    if len(prompts) != 1:
        raise ValueError(f"prompts: {fa}:{sa} and {fb}:{sb} were not timed on the same prompts")
    ratio, ci = over_own_baselines(merged, picks[0], picks[1])
    return {
        "a": {"bench": fa, "server": sa}, "b": {"bench": fb, "server": sb},
        "speedup_ratio": ratio, "ci95": ci, "prompts": len(prompts.pop()),
    }  # fmt: skip


def _side(text: str) -> tuple[Path, str]:
    path, _, server = text.rpartition(":")
    if not path or not server:
        raise ValueError(f"{text!r}: expected FILE.json:SERVER")
    return Path(path), server


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--pair", nargs="+", action="extend", required=True,
        metavar="NAME=A.json:SERVER,B.json:SERVER",
        help="speedup of A's server over B's, each over its own run's baseline",
    )  # fmt: skip
    p.add_argument("--out", help="write the result here too (never over an existing file)")
    args = p.parse_args(argv)
    if args.out and Path(args.out).exists():
        p.error(f"--out {args.out}: exists; not overwriting it")
    pairs, benches, files = {}, {}, {}  # benches by file name, each name's one file
    try:
        for spec in args.pair:
            name, _, sides = spec.partition("=")
            if not name or sides.count(",") != 1:
                raise ValueError(f"--pair {spec!r}: expected NAME=A.json:SERVER,B.json:SERVER")
            loaded = []
            for path, server in map(_side, sides.split(",")):
                if files.setdefault(path.name, path.resolve()) != path.resolve():
                    raise ValueError(f"{path}: another file of that name is in --pair already")
                if path.name not in benches:
                    benches[path.name] = json.loads(path.read_text())
                    bench_shape(benches[path.name], path.name)
                loaded.append((benches[path.name], server, path.name))
            pairs[name] = compare(*loaded)
        same_runs(benches)  # the result's GPU and versions hold for every pair
    except (OSError, ValueError) as e:
        print(f"across_runs: {e}", file=sys.stderr)
        return 2
    first = next(iter(benches.values()))
    result = {
        "gpu": first.get("gpu"),
        "gpu_uuid": _uuid(first),
        "date": max((b.get("date") or "" for b in benches.values()), default=None),
        "sglang_version": first.get("sglang_version"),
        "torch_version": first.get("torch_version"),
        "attention_backend": first.get("attention_backend"),
        "runs": {
            name: {"date": b.get("date"), "command": b.get("command")}
            for name, b in benches.items()
        },  # fmt: skip
        "command": "python -m sglang_ext_tools.across_runs --pair " + " ".join(args.pair),
        "pairs": pairs,
    }
    return emit(result, Path(args.out) if args.out else None)


if __name__ == "__main__":
    raise SystemExit(main())
