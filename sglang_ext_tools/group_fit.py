"""Whether each bench group's servers fit the GPU together, checked before any starts.

bench_speed runs a group's servers side by side on one GPU. Where they do not fit, SGLang
does not say so: the last one to load fails its KV-cache check
(``kv_cache_configurator.py:_profile_available_bytes``, "Loaded weights leave no GPU memory
for the KV cache"), and the row reads ``exited(-9)``. 2026-12-06, an H100 fallback of a
seed-shape run: three servers of the 61-layer rank-shape target (25.3 GiB of weights each)
at ``--at-once 3`` lost the plain 5/1/6 server, and a rerun cost 300 s of device time.

A server's estimate: its target's and drafter's weight files, its KV pool where
``--max-total-tokens`` fixes it, and :data:`OVERHEAD_GIB` for the CUDA context and graphs.
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
    target: str | Path, drafter: str | Path | None, max_total_tokens: int | None
) -> dict[str, Any]:
    """One server's estimate, in GiB by part, or ``skipped`` saying why there is none."""
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
    return {**{k: round(v, 2) for k, v in parts.items()}, "total": round(sum(parts.values()), 2)}


def check(
    groups: Sequence[Sequence[str]],
    servers: Mapping[str, Mapping[str, Any]],
    gpu_total_mib: int | None,
) -> dict[str, Any]:
    """Each group's estimated sum against the GPU's memory. ``servers``: name -> its
    :func:`server_bytes`. The result's ``refused`` names the first group that does not fit,
    each server's estimate and the GPU's size; absent where every group fits or no check was
    possible (``skipped`` says why)."""
    out: dict[str, Any] = {"servers": dict(servers), "overhead_gib": OVERHEAD_GIB}
    if not gpu_total_mib:
        return {**out, "skipped": "no GPU memory size (no NVML)"}
    gpu_gib = gpu_total_mib / 1024
    out["gpu_gib"] = round(gpu_gib, 2)
    skipped = sorted({s["skipped"] for s in servers.values() if "skipped" in s})
    if skipped:
        return {**out, "skipped": "; ".join(skipped)}
    out["groups"] = []
    for names in groups:
        total = sum(servers[n]["total"] for n in names)
        out["groups"].append({"servers": list(names), "gib": round(total, 2)})
        if total > gpu_gib and "refused" not in out:
            each = ", ".join(f"{n} {servers[n]['total']:.1f}" for n in names)
            largest = max(servers[n]["total"] for n in names)
            fits = int(gpu_gib // largest)
            advice = (
                f"--at-once {fits} fits ({fits} servers of {largest:.1f} GiB)"
                if fits >= 2
                else "not even the baseline and one server fit: a larger GPU"
            )
            out["refused"] = (
                f"group {list(names)} needs ~{total:.1f} GiB together ({each} GiB: weights, "
                f"KV cache at --max-total-tokens, {OVERHEAD_GIB:g} GiB each for context and "
                f"graphs) on a {gpu_gib:.1f} GiB GPU; SGLang would refuse the last to load "
                f"(its KV-cache check). {advice}"
            )
    return out
