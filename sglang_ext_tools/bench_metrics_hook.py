"""CPU cost per finished request of the acceptance-metrics hook: queued (the default, a flusher
writes the sinks in batches) against written in the hook (``SGLANG_EXT_ACCEPTANCE_FLUSH_S=0``),
side by side in one run, with cold caches between calls as in SGLang's tokenizer loop.

Why cold: in the server the hook runs once per finished request between SGLang's own work. On
the H200 node (2026-12-01) its CPU-time counter read 0.36 ms per request for code that takes
0.08 ms in a warm loop; a loop that evicts the caches between calls reads the node's figure.

    python -m sglang_ext_tools.bench_metrics_hook --out hook-cost.json

Each round runs ``--requests`` hook calls per variant, alternating call by call (the variants
see the same machine state), then hands the queued variant's queue to its flusher; both are
charged their CPU time (``time.thread_time``) per request. The output is the per-request cost
of each and the ratio queued / in-hook with its 95 % bootstrap interval over rounds. All sinks
are on, as in the GPU suite's ``plugin`` server: log line, JSONL, Prometheus (multiprocess).
Run it as its own process: it sets ``PROMETHEUS_MULTIPROC_DIR``, and prometheus_client keeps
the mode it found at import for the rest of the process.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_ext_tools.stats import bootstrap_ci

LABELS = {"model_name": "target", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}


def _batch(count: int) -> SimpleNamespace:
    """The BatchStrOutput fields the hook reads: ``count`` finished 3-step chain requests."""
    rng = random.Random(0)
    hists = []
    for _ in range(count):
        hist = [rng.randrange(5, 20) for _ in range(4)]
        hists.append(hist)
    return SimpleNamespace(
        rids=[f"bench-{k:06d}" for k in range(count)],
        finished_reasons=[{"type": "length"}] * count,
        prompt_tokens=[120] * count,
        completion_tokens=[128] * count,
        spec_verify_ct=[sum(h) for h in hists],
        spec_num_correct_drafts=[sum(a * c for a, c in enumerate(h)) for h in hists],
        spec_correct_drafts_histogram=hists,
    )


def _manager() -> SimpleNamespace:
    spec = SimpleNamespace(
        speculative_algorithm="EAGLE3",
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        speculative_draft_model_path="/models/drafter",
    )
    return SimpleNamespace(
        server_args=spec,
        enable_metrics=True,
        metrics_collector=SimpleNamespace(labels=dict(LABELS)),
        rid_to_state={},
    )


class _Evictor:
    """Touches ``mb`` MiB and reorders a few thousand Python objects: what SGLang's own work
    between two finished requests does to the caches."""

    def __init__(self, mb: int):
        self.source = bytearray(mb << 20)
        self.target = bytearray(mb << 20)
        self.objects = [{f"k{j}": list(range(16)) for j in range(32)} for _ in range(2000)]
        self.rng = random.Random(1)

    def __call__(self) -> None:
        if self.source:
            self.target[:] = self.source  # every cache line of both, read and written
        self.rng.shuffle(self.objects)
        sorted(self.objects[:500], key=lambda d: d["k3"][0])


def measure(rounds: int, requests: int, evict_mb: int, workdir: Path) -> dict[str, Any]:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(workdir / "prometheus")
    (workdir / "prometheus").mkdir(parents=True, exist_ok=True)
    from prometheus_client import CollectorRegistry

    from sglang_ext.metrics import hook

    handler = logging.StreamHandler(open(workdir / "server.log", "w"))  # noqa: SIM115
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)

    def recorder(name: str, flush_s: float) -> hook.AcceptanceRecorder:
        # the interval only starts the flusher; the round hands over the queue itself
        config = hook.MetricsConfig(
            jsonl_path=str(workdir / f"{name}.jsonl"), flush_interval_s=flush_s
        )
        # a registry each: two recorders cannot register the same names in one
        return hook.AcceptanceRecorder(config, prom_registry=CollectorRegistry())

    variants = {"in_hook": recorder("in_hook", 0.0), "queued": recorder("queued", 3600.0)}
    calls = len(variants) * (32 + rounds * requests)
    tm, recv, evict = _manager(), _batch(calls), _Evictor(evict_mb)
    index = 0

    def call(rec: hook.AcceptanceRecorder) -> float:
        nonlocal index
        hook._RECORDER = rec
        start = time.thread_time()
        hook.after_calculate_spec_decoding_metrics(None, tm, {}, recv, index)
        index += 1
        return time.thread_time() - start

    for _ in range(32):  # warm-up: lazy Prometheus creation, first flusher start
        for rec in variants.values():
            call(rec)
    variants["queued"].flush()
    per_round: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        spent = dict.fromkeys(variants, 0.0)
        for _ in range(requests):
            for name, rec in variants.items():
                evict()
                spent[name] += call(rec)
        evict()
        start = time.thread_time()
        variants["queued"].flush()
        spent["queued"] += time.thread_time() - start
        for name in variants:
            per_round[name].append(spent[name] / requests)
    root.removeHandler(handler)
    handler.close()
    log = (workdir / "server.log").read_text()
    if "sglang_ext: cannot" in log or "failed" in log:
        raise RuntimeError(f"a sink failed during the benchmark:\n{log[-2000:]}")
    for name in variants:
        lines = (workdir / f"{name}.jsonl").read_text().count("\n")
        if lines != 32 + rounds * requests:
            raise RuntimeError(f"{name}: {lines} JSONL records, expected {32 + rounds * requests}")
    pairs = list(zip(per_round["queued"], per_round["in_hook"], strict=True))
    ratio = sum(q for q, _ in pairs) / sum(h for _, h in pairs)
    return {
        "ms_per_request": {
            name: round(1e3 * sum(values) / len(values), 4) for name, values in per_round.items()
        },
        "ratio_queued_vs_in_hook": round(ratio, 4),
        "ratio_ci95": bootstrap_ci(pairs, lambda p: sum(q for q, _ in p) / sum(h for _, h in p)),
        "per_round_ms": {
            name: [round(1e3 * v, 4) for v in values] for name, values in per_round.items()
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--requests", type=int, default=40, help="hook calls per variant, round")
    parser.add_argument("--evict-mb", type=int, default=64, help="0: a warm loop")
    parser.add_argument("--out", type=Path, help="write the result JSON here")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.out is not None and args.out.exists():
        parser.error(f"{args.out} exists; this tool does not overwrite it")
    with tempfile.TemporaryDirectory(prefix="bench-hook-") as tmp:
        figures = measure(args.rounds, args.requests, args.evict_mb, Path(tmp))
    from importlib.metadata import version

    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m sglang_ext_tools.bench_metrics_hook", *argv]),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "versions": {
            "python": platform.python_version(),
            "prometheus_client": version("prometheus_client"),
            "sglang-ext": version("sglang-ext"),
        },
        "setting": {"rounds": args.rounds, "requests": args.requests, "evict_mb": args.evict_mb},
        **figures,
    }
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    ms = result["ms_per_request"]
    print(
        f"ms of CPU per request: in the hook {ms['in_hook']}, queued {ms['queued']}; "
        f"ratio {result['ratio_queued_vs_in_hook']} (95 % CI {result['ratio_ci95']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
