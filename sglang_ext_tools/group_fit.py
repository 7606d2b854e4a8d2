"""Whether each bench group's servers fit the GPU together, checked before any starts.

bench_speed runs a group's servers side by side on one GPU. Where they do not fit, SGLang
does not say so: the last one to load fails its KV-cache check
(``kv_cache_configurator.py:_profile_available_bytes``, "Loaded weights leave no GPU memory
for the KV cache"), and the row reads ``exited(-9)``. 2026-12-06, an H100 fallback of a
seed-shape run: three servers of the 61-layer rank-shape target at ``--at-once 3`` lost the
plain 5/1/6 server, and a rerun cost 300 s of device time.

That check keeps ``(1 - mem_fraction_static)`` of the memory that was free before the
server loaded its weights as slack, and what is free after loading must exceed it. Servers
that start together each saw the GPU's memory free before any loaded, and each sees every
other's weights after: a group fits only if its servers' sum stays under ``mem_fraction``
of the GPU, not under the whole GPU. 2026-12-06 (fourteenth session), an H100 (79.65 GiB):
three rank-shape servers estimated at 78.4 GiB in all passed a whole-GPU rule, and SGLang
refused two of them at ``--mem-fraction 0.9`` (its bound 71.7), asking for 0.958 and 0.961.

A server's estimate: its target's and drafter's weight files, its KV pool where
``--max-total-tokens`` fixes it, :data:`OVERHEAD_GIB` for the CUDA context and decode
graphs, and :data:`PREFILL_GRAPH_GIB` where it captures SGLang's prefill graph.
Without ``--max-total-tokens`` each server sizes its pool from ``--mem-fraction``, so the
group's fit is SGLang's to decide and no check is made; the same where a model has no
weight files (a config-only dummy target).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext.drafter.checkpoint_files import DrafterLoadError, weight_files

GIB = 1 << 30
# Per server, beyond weights and KV: CUDA context, graph pools, allocator slack. 2026-12-06
# (H100, the rerun's logs, two servers started together): each held ~26.5 GiB, against 25.3
# of target weights, 0.9 of drafter and 1.1 of KV cache; the checks passed with 26.7 GiB
# left. 1 GiB keeps a group that fitted there fitting here.
OVERHEAD_GIB = 1.0
# Per server with SGLang's prefill graph (``--cuda-graph-backend-prefill``, up to 512
# tokens): 2026-12-06 (fourteenth session, H100, the rank shape) the capture logged 3.59 GB
# on the first server to capture and 1.34 GB on the second; the larger, in GiB, for all.
PREFILL_GRAPH_GIB = 3.35


def weights_bytes(model_dir: str | Path) -> int:
    """The bytes of the weight files SGLang loads from a model directory (an index's shards,
    else its safetensors, else its pickles: ``checkpoint_files.weight_files``, which raises
    ``DrafterLoadError`` naming what is missing)."""
    return sum(p.stat().st_size for p in weight_files(model_dir))


def kv_bytes_per_token(config: Mapping[str, Any], dtype_bytes: int = 2) -> int | None:
    """One token's KV cache over every layer: MLA keeps its latent and rope key
    (``kv_lora_rank + qk_rope_head_dim`` a layer), attention with KV heads a key and a value
    per head. None where the config does not say."""
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int):
        return None
    if config.get("kv_lora_rank"):
        per_layer = config["kv_lora_rank"] + config.get("qk_rope_head_dim", 0)
    else:
        heads = config.get("num_attention_heads")
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or (
            config["hidden_size"] // heads if heads and config.get("hidden_size") else None
        )
        if not (kv_heads and head_dim):
            return None
        per_layer = 2 * kv_heads * head_dim
    return per_layer * layers * dtype_bytes


def _config(model_dir: str | Path) -> dict[str, Any]:
    try:
        return json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def server_bytes(
    target: str | Path,
    drafter: str | Path | None,
    max_total_tokens: int | None,
    prefill_graph: bool = False,
) -> dict[str, Any]:
    """One server's estimate, in GiB by part, or ``skipped`` saying why there is none;
    ``prefill_graph``: the server captures SGLang's prefill graph (:data:`PREFILL_GRAPH_GIB`)."""
    if not max_total_tokens:
        return {"skipped": "no --max-total-tokens: SGLang sizes each pool from --mem-fraction"}
    try:
        target_w = weights_bytes(target)
        drafter_w = weights_bytes(drafter) if drafter else 0
    except DrafterLoadError as exc:
        return {"skipped": f"no weight files SGLang loads: {exc}"}
    per_token = kv_bytes_per_token(_config(target))
    if per_token is None:
        return {"skipped": f"{target}/config.json: no KV geometry (num_hidden_layers, heads)"}
    parts = {
        "target_weights": target_w / GIB,
        "drafter_weights": drafter_w / GIB,
        "kv_cache": per_token * max_total_tokens / GIB,
        "overhead": OVERHEAD_GIB,
    }
    if prefill_graph:
        parts["prefill_graph"] = PREFILL_GRAPH_GIB
    return {**{k: round(v, 2) for k, v in parts.items()}, "total": round(sum(parts.values()), 2)}


def check(
    groups: Sequence[Sequence[str]],
    servers: Mapping[str, Mapping[str, Any]],
    gpu_total_mib: int | None,
    mem_fraction: float,
) -> dict[str, Any]:
    """Each group's estimated sum against ``mem_fraction`` of the GPU's memory (the module's
    docstring says why not all of it). ``servers``: name -> its :func:`server_bytes`. The
    result's ``refused`` names the first group that does not fit, each server's estimate
    and the bound; absent where every group fits or no check was possible (``skipped`` says
    why)."""
    out: dict[str, Any] = {"servers": dict(servers), "overhead_gib": OVERHEAD_GIB}
    if not gpu_total_mib:
        return {**out, "skipped": "no GPU memory size (no NVML)"}
    gpu_gib = gpu_total_mib / 1024
    bound = gpu_gib * mem_fraction
    out["gpu_gib"] = round(gpu_gib, 2)
    out["bound_gib"] = round(bound, 2)
    skipped = sorted({s["skipped"] for s in servers.values() if "skipped" in s})
    if skipped:
        return {**out, "skipped": "; ".join(skipped)}
    out["groups"] = []
    for names in groups:
        total = sum(servers[n]["total"] for n in names)
        out["groups"].append({"servers": list(names), "gib": round(total, 2)})
        if total > bound and "refused" not in out:
            each = ", ".join(f"{n} {servers[n]['total']:.1f}" for n in names)
            largest = max(servers[n]["total"] for n in names)
            fits = int(bound // largest)
            advice = (
                f"--at-once {fits} fits ({fits} servers of {largest:.1f} GiB)"
                if fits >= 2
                else "not even the baseline and one server fit: a larger GPU or a higher "
                "--mem-fraction"
            )
            out["refused"] = (
                f"group {list(names)} needs ~{total:.1f} GiB together ({each} GiB: weights, "
                f"KV cache at --max-total-tokens, {OVERHEAD_GIB:g} GiB each for context and "
                f"decode graphs, {PREFILL_GRAPH_GIB:g} GiB a prefill graph), over "
                f"{bound:.1f} GiB: --mem-fraction {mem_fraction:g} of a {gpu_gib:.1f} GiB GPU. "
                f"SGLang would refuse the last to load (its KV-cache "
                f"check keeps {1 - mem_fraction:.2g} of the memory free before loading). "
                f"{advice}"
            )
    return out
