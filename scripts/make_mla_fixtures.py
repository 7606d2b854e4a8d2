#!/usr/bin/env python
"""Fixtures for the seed case: an MLA + MoE (DeepSeek-V3-class) target that is a trained,
predictable language model, a speculators EAGLE-3 drafter trained on it, and the seed's
broken configuration in miniature. Nothing is downloaded.

Why this shape: the failure this project exists for happened on Kimi-K2.5 (DeepSeek-V3 text
model: MLA attention, MoE with routed + shared experts, first dense layer). A 6-layer
DeepseekV3ForCausalLM is trained here; served as is, a decode step is launch-bound (a 6-layer
27M llama runs speculation at 0.88x of no speculation), so it is also deepened
function-preservingly to DeepSeek-V3's 61 layers: small layer i sits at deep layer
placement[i], the 55 layers in between are identity residual blocks (attention o_proj, every
expert's and the shared expert's down_proj zero; router and the rest copied from a trained MoE
layer). The deep target computes exactly what the small one computes and costs what 61 MLA +
MoE layers cost.

Placement exposes off-by-one aux ids. The drafter is trained on small aux ids [1, 3, 5]
(speculators id k: the state entering decoder layer k); in the deep target they become
placement[k]. An identity block leaves the state unchanged, so if the layer before a captured
one were an identity block, the id one too low would capture the very same tensor and no test
could see it. The small layers therefore sit in adjacent pairs around every captured boundary:
FULL (0, 1, 29, 30, 49, 50) -> deep aux ids [1, 30, 50]; each of 0/2, 29/31, 49/51 enters a
layer across a trained layer from the captured one, so it carries a different state. Small
layer 0 (the dense one, first_k_dense_replace = 1) stays at deep 0, so the lowest captured id
is 1 and its -1 neighbour is 0 (the embedding output): with identity blocks no other placement
makes both neighbours of the first captured id differ (any id below a captured p > 1 enters
an identity block and carries the state entering p). Aux id 0 is valid for the plugin
(aux_capture.check_capture accepts 0..L-1; SGLang's deepseek_v2 captures at the layer-0
boundary the residual it prepares, the embeddings). deep-drafter-plus1/ and
deep-drafter-minus1/ are the deep drafter with every id shifted by +1 / -1: served, SGLang
must hand them the shifted states (the suite checks the features; their acceptance drops only
~6 %, 2026-12-01).

Stages (``--stage``), each writing into ``--out``:

  base     tokenizer, data and held-out prompts (as scripts/make_fixtures.py), the small
           target trained on Python stdlib text, and the target's own greedy continuations
           ("distillation" text: what the drafter sees when serving greedy requests).
  drafter  speculators' Eagle3DraftModel (a llama-type draft layer, as speculators builds
           for such verifiers) trained with speculators' forward and kl_div loss on half raw
           text, half distillation text; aux ids [1, 3, 5]; full vocabulary; and the offline
           reference tau (sglang_ext_tools.reference chain loop) on held-out prompts, in bf16 (the
           served numeric class; fp32 too with --ref-fp32, and on CPU fp32 only).
  deepen   deep-target/ (61 layers), deep-drafter/ (the same weights, aux ids [1, 30, 50]),
           deep-drafter-plus1/ and deep-drafter-minus1/ (ids [2, 31, 51] and [0, 29, 49]),
           a bf16 check that deep and small logits agree, and seed-drafter/: the seed's
           configuration -- the drafter in SGLang's own format (``sglang-ext convert
           --force``) whose eagle_config names ONE aux layer while its fc keeps the trained
           three, so the target hands over one layer as wide as the drafter and stock SGLang
           skips fc without a word; and seed-nocapture-drafter/: the same with
           ``use_aux_hidden_state: false``, so the target captures nothing and hands over its
           final hidden state (what a target class that never switches capture on does).

    python scripts/make_mla_fixtures.py --stage all --out /tmp/mla --device cuda
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import make_speed_fixtures as msf  # noqa: E402
from fixtures_common import (  # noqa: E402
    _clean_floats,
    dsv3_cfg,
    log,
    patch_config,
    versions,
    write_json,
)
from fixtures_data import heldout_chunks  # noqa: E402
from fixtures_targets import build_dsv3, save_target  # noqa: E402

from sglang_ext_tools import reference as ref  # noqa: E402


@dataclasses.dataclass(frozen=True, kw_only=True)
class MlaScale(msf.TrainScale):
    deep_layers: int
    seed_aux_ids: tuple[int, ...] = ()  # the seed's one captured layer (deep-target ids)
    served: bool = True  # the target must fit SGLang's triton MLA decode (CPU tests: False)


# SGLang's triton MLA decode kernel (sglang/kernels/ops/attention/decode_attention.py,
# 0.5.17) splits the latent key only for kv_lora_rank + qk_rope_head_dim of 576 (512 + 64,
# DeepSeek-V3) or 288 (256 + 32); any other sum fails to compile at CUDA-graph capture
# ("Cannot make_shape_compatible ... 64 and 128" for 64 + 16 on the H200, 2026-11-30).
SGLANG_TRITON_MLA_LK = (576, 288)


def check_served_geometry(cfg: dict[str, Any]) -> None:
    lk = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    if lk not in SGLANG_TRITON_MLA_LK:
        raise SystemExit(
            f"kv_lora_rank {cfg['kv_lora_rank']} + qk_rope_head_dim {cfg['qk_rope_head_dim']} "
            f"= {lk}: SGLang's triton MLA decode serves only {SGLANG_TRITON_MLA_LK}"
        )


FULL = MlaScale(
    name="full",
    vocab_size=8192,
    seq_len=512,
    train_char_budget=None,
    # kv_lora_rank + qk_rope_head_dim = 288: see SGLANG_TRITON_MLA_LK.
    target=dsv3_cfg(6, 384, 1024, 192, 8, 8, 128, 256, 32, 32, 32),
    target_train=dict(steps=1200, batch=64, lr=1.5e-3, time_cap=150),
    distill=dict(sequences=1024, prompt_len=128, batch=512, heldout_sequences=64),
    drafter_train=dict(steps=1800, chunks=8, lr=2e-3, ttt_steps=3, time_cap=150),
    deep_layers=61,
    # Small layers in pairs around the captured boundaries 1, 30, 50 (module docstring).
    placement=(0, 1, 29, 30, 49, 50),
    seed_aux_ids=(50,),
    # The free-running bf16 reference (its own continuation, recorded beside the served tau):
    # 16 held-out prompts, 43.5 s on the H200 (2026-12-01). tau equivalence is judged like
    # for like on the served text in the GPU suite (64 prompts), not against this run.
    reference=dict(prompts=16, max_new_tokens=128, steps=3),
)
TINY = MlaScale(
    name="tiny",
    vocab_size=512,
    seq_len=64,
    train_char_budget=300_000,
    target=dsv3_cfg(6, 32, 64, 16, 2, 4, 16, 16, 8, 8, 8),
    target_train=dict(steps=10, batch=8, lr=1e-2, time_cap=None),
    distill=dict(sequences=8, prompt_len=32, batch=8, heldout_sequences=4),
    drafter_train=dict(steps=6, chunks=4, lr=5e-3, ttt_steps=3, time_cap=None),
    deep_layers=9,
    placement=(0, 1, 3, 4, 6, 7),  # deep aux ids [1, 4, 7]; +1: [2, 5, 8], -1: [0, 3, 6]
    seed_aux_ids=(7,),
    heldout_eval_chunks=4,
    num_prompts=4,
    prompt_len=(32, 48),
    reference=dict(prompts=2, max_new_tokens=8, steps=3),
    check_chunks=2,
    served=False,
)
SCALES = {"full": FULL, "tiny": TINY}


def deep_aux_ids(scale: MlaScale) -> list[int]:
    """Speculators id k (state entering small layer k) -> the deep layer small layer k sits
    at: identity blocks before it leave the state entering it unchanged."""
    return [scale.placement[k] for k in scale.aux_ids]


# The drafters served with every deep aux id shifted: (directory, shift).
SHIFTED_DRAFTERS = (("deep-drafter-plus1", 1), ("deep-drafter-minus1", -1))


def check_neighbours_differ(scale: MlaScale) -> None:
    """Each captured deep id's neighbours (id - 1, id + 1) must enter a layer across a trained
    layer from it; else they carry the same state (identity blocks) and a shift is invisible."""
    trained = set(scale.placement)
    for deep_id in deep_aux_ids(scale):
        below, above = deep_id - 1, deep_id + 1
        # state entering j differs from entering j + 1 iff layer j is a trained layer
        if below < 0 or below not in trained or deep_id not in trained:
            raise ValueError(
                f"placement {scale.placement}: aux id {deep_id} and {below} carry the same "
                "state (or one does not exist)"
            )
        if above >= scale.deep_layers:  # DeepSeek classes capture no state after the last
            raise ValueError(f"aux id {above} is beyond the {scale.deep_layers} deep layers")


# --------------------------------------------------------------------------------------
# Stages
# --------------------------------------------------------------------------------------


def stage_base(args, scale: MlaScale) -> dict[str, Any]:
    if scale.served:
        check_served_geometry(scale.target)
    return msf.base_stage(args, scale, build_dsv3, 3, save_dsv3_target)


def save_dsv3_target(model, out_dir: Path, hf_tok, bf16: bool) -> None:
    save_target(model, out_dir, hf_tok, bf16)
    # Router fields the original DeepSeek-V3 config.json carries and SGLang's deepseek_v2
    # reads unconditionally (as scripts/make_fixtures.py writes them for its dsv3 target).
    patch_config(
        out_dir, topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1, ep_size=1
    )


def load_dsv3(path: Path, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    return ref.use_eager_experts(model).to(device).eval()


def stage_drafter(args, scale: MlaScale) -> dict[str, Any]:
    out, device = args.out, args.device
    target = load_dsv3(out / "small-target", device, torch.float32)
    _, summary = msf.distilled_drafter(
        args, scale, target, nbr=True, seed=args.seed + 15, out_name="small-drafter"
    )
    del target
    if device == "cuda":
        torch.cuda.empty_cache()

    # Reference tau of the chain loop, in the served numeric class (bf16 on CUDA) and fp32.
    r = scale.reference
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").open()][: r["prompts"]]
    references = {}
    if device != "cuda":
        dtypes = ("float32",)
    else:
        dtypes = ("bfloat16", "float32") if args.ref_fp32 else ("bfloat16",)
    for dtype in dtypes:
        result = ref.evaluate_tau(
            ref.load_target(out / "small-target", device=device, dtype=dtype),
            ref.load_drafter(out / "small-drafter", device=device, dtype=dtype),
            [p["input_ids"] for p in prompts],
            num_steps=r["steps"],
            max_new_tokens=r["max_new_tokens"],
        )
        (out / "reference").mkdir(exist_ok=True)
        with (out / "reference" / f"drafter.{dtype}.jsonl").open("w") as fh:
            for prompt, row in zip(prompts, result.pop("per_prompt"), strict=True):
                fh.write(json.dumps(_clean_floats({"id": prompt["id"], **row})) + "\n")
        references[dtype] = {**result, "per_prompt_file": f"reference/drafter.{dtype}.jsonl"}
        log(f"reference {dtype}: tau {result['tau']:.3f} at {r['steps']} steps")
    return {"small_drafter": {**summary, "reference": references}}


# -- deepen -------------------------------------------------------------------------------

# Tensors of an inserted layer that must be zero for it to be an identity residual block:
# what attention and the MoE (routed and shared experts) write into the residual stream.
IDENTITY_ZERO = re.compile(r"self_attn\.o_proj\.|mlp\.(shared_)?experts\..*down_proj")
LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def deepen_state_dict(
    small: dict[str, torch.Tensor],
    num_small: int,
    placement: tuple[int, ...],
    deep_layers: int,
    template_layer: int,
) -> dict[str, torch.Tensor]:
    """Small layer i at deep layer placement[i]; every other deep layer a copy of the small
    ``template_layer`` with its residual writes zeroed."""
    if len(placement) != num_small or list(placement) != sorted(set(placement)):
        raise ValueError(f"placement {placement} must be {num_small} increasing layer indices")
    if placement[0] != 0 or placement[-1] >= deep_layers:
        raise ValueError(f"placement {placement} must start at 0 and stay below {deep_layers}")
    layers: dict[int, dict[str, torch.Tensor]] = {}
    deep: dict[str, torch.Tensor] = {}
    for key, tensor in small.items():
        found = LAYER_KEY.match(key)
        if found:
            layers.setdefault(int(found.group(1)), {})[found.group(2)] = tensor
        else:
            deep[key] = tensor
    where = {deep_index: small_index for small_index, deep_index in enumerate(placement)}
    zeroed = 0
    for j in range(deep_layers):
        if j in where:
            source = layers[where[j]]
        else:
            source = {}
            for name, tensor in layers[template_layer].items():
                if IDENTITY_ZERO.search(name):
                    tensor, zeroed = torch.zeros_like(tensor), zeroed + 1
                source[name] = tensor
        for name, tensor in source.items():
            deep[f"model.layers.{j}.{name}"] = tensor.clone()
    if deep_layers > num_small and zeroed == 0:
        raise ValueError("no o_proj / down_proj tensor found to zero: unknown checkpoint layout")
    return deep


def write_deep_target(small_dir: Path, deep_dir: Path, scale: MlaScale) -> dict[str, Any]:
    from safetensors.torch import load_file, save_file

    config = json.loads((small_dir / "config.json").read_text())
    files = sorted(small_dir.glob("*.safetensors"))
    small: dict[str, torch.Tensor] = {}
    for path in files:
        small.update(load_file(str(path)))
    first_moe = int(config["first_k_dense_replace"])
    deep = deepen_state_dict(
        small, config["num_hidden_layers"], scale.placement, scale.deep_layers, first_moe
    )
    if deep_dir.exists():
        shutil.rmtree(deep_dir)
    shutil.copytree(small_dir, deep_dir, ignore=shutil.ignore_patterns("*.safetensors*"))
    save_file(deep, str(deep_dir / "model.safetensors"), metadata={"format": "pt"})
    config["num_hidden_layers"] = scale.deep_layers
    (deep_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {
        "dir": deep_dir.name,
        "num_layers": scale.deep_layers,
        "placement": list(scale.placement),
        "identity_template_layer": first_moe,
        "params": sum(t.numel() for t in deep.values()),
        "rule": "small layer i at deep layer placement[i]; the others are identity residual "
        "blocks (o_proj and every down_proj zero)",
    }


def write_deep_drafter(small_dir: Path, deep_dir: Path, aux_ids: list[int], target: Path):
    if deep_dir.exists():
        shutil.rmtree(deep_dir)
    shutil.copytree(small_dir, deep_dir)
    config = json.loads((deep_dir / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = aux_ids
    verifier = config.get("speculators_config", {}).get("verifier", {})
    if verifier:
        verifier["name_or_path"] = str(target)
    (deep_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_seed_drafter(
    deep_drafter: Path,
    seed_dir: Path,
    ids: list[int],
    capture: bool = True,
):
    """The seed's configuration: the trained drafter in SGLang's format, its fc built for the
    layers it was trained on (``num_aux_hidden_states``, which SGLang's llama_eagle3 reads),
    while ``eagle_config`` asks the target to capture one layer. Stock SGLang loads every
    weight, the target hands over one layer as wide as the drafter, and
    ``if hidden_states.shape[-1] != embeds.shape[-1]`` skips fc without a word. With
    ``capture=False`` the config switches capture off instead (``use_aux_hidden_state``, read
    by SGLang's spec_aux_hidden_state.py): the target hands over its final hidden state.

    ``ids`` are written as given (SGLang-format eagle_config ids). The conversion runs without
    the target: the deep drafter's first aux id 1 is not expressible in eagle_config ids for
    a DeepSeek class (aux_capture.sglang_ids_for_capture refuses it), and the ids convert
    would derive are replaced here anyway."""
    from sglang_ext.cli.convert import convert

    if seed_dir.exists():
        shutil.rmtree(seed_dir)
    differences = convert(deep_drafter, seed_dir, target=None, force=True)
    # convert's note on its llama-rule id guess: moot, the ids are replaced below.
    moot = "aux ids converted for"
    differences = [d for d in differences if not d.startswith(moot)]
    notes = seed_dir / "CONVERTED.md"
    if notes.exists():
        lines = notes.read_text().splitlines()
        kept = [line for line in lines if not line.startswith(f"- differs: {moot}")]
        notes.write_text("\n".join(kept) + "\n")
    config = json.loads((seed_dir / "config.json").read_text())
    trained = len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    config["num_aux_hidden_states"] = trained
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    config["eagle_config"]["use_aux_hidden_state"] = capture
    (seed_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {
        "dir": seed_dir.name,
        "eagle_aux_hidden_state_layer_ids": ids,
        "use_aux_hidden_state": capture,
        "converted_differences": differences,
    }


@torch.no_grad()
def function_check(small_dir: Path, deep_dir: Path, chunks: torch.Tensor, device: str) -> dict:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    small = load_dsv3(small_dir, device, dtype)
    deep = load_dsv3(deep_dir, device, dtype)
    max_diff, agree = 0.0, []
    for i in range(len(chunks)):
        x = chunks[i : i + 1].to(device)
        a, b = small(input_ids=x).logits.float(), deep(input_ids=x).logits.float()
        max_diff = max(max_diff, (a - b).abs().max().item())
        agree.append((a.argmax(-1) == b.argmax(-1)).float().mean().item())
    return {
        "dtype": str(dtype).replace("torch.", ""),
        "tokens": int(chunks.numel()),
        "max_abs_diff": round(max_diff, 6),
        "top1_agreement": round(sum(agree) / len(agree), 6),
    }


def stage_deepen(args, scale: MlaScale) -> dict[str, Any]:
    out = args.out
    check_neighbours_differ(scale)
    target = write_deep_target(out / "small-target", out / "deep-target", scale)
    ids = deep_aux_ids(scale)
    write_deep_drafter(out / "small-drafter", out / "deep-drafter", ids, out / "deep-target")
    shifted = {}
    for name, shift in SHIFTED_DRAFTERS:
        shifted_ids = [k + shift for k in ids]
        write_deep_drafter(out / "small-drafter", out / name, shifted_ids, out / "deep-target")
        shifted[name.removeprefix("deep-drafter-")] = {
            "dir": name,
            "eagle_aux_hidden_state_layer_ids": shifted_ids,
            "shift": shift,
        }
    seed = write_seed_drafter(out / "deep-drafter", out / "seed-drafter", list(scale.seed_aux_ids))
    # Capture off: the ids only give fc's count; the plugin refuses on use_aux_hidden_state.
    nocapture = write_seed_drafter(out / "deep-drafter", out / "seed-nocapture-drafter", ids, False)
    streams = torch.load(out / "streams.pt")
    chunks = heldout_chunks(streams["heldout"], scale.seq_len, scale.check_chunks)
    check = function_check(out / "small-target", out / "deep-target", chunks, args.device)
    log(f"deep target: {json.dumps(check)}")
    return {
        "deep_target": target,
        "deep_drafter": {
            "dir": "deep-drafter",
            "eagle_aux_hidden_state_layer_ids": ids,
            "small_aux_ids": list(scale.aux_ids),
        },
        # Off-by-one drafters: keys "plus1" / "minus1", each {dir, eagle_aux_hidden_state_layer_ids,
        # shift}; the same weights as deep-drafter.
        "shifted_drafters": shifted,
        "seed_drafter": seed,
        "seed_nocapture_drafter": nocapture,
        "function_check": check,
    }


STAGES = {"base": stage_base, "drafter": stage_drafter, "deepen": stage_deepen}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=(*STAGES, "all"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--draft-attn-impl", default="sdpa")
    parser.add_argument(
        "--ref-fp32",
        action="store_true",
        help="on CUDA, also run the reference in fp32 (bf16 is the served class; ~80 s more)",
    )
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    scale = SCALES[args.scale]
    torch.set_float32_matmul_precision("high")
    if args.device == "cpu":
        torch.set_num_threads(2)
    for stage in list(STAGES) if args.stage == "all" else [args.stage]:
        t0 = time.perf_counter()
        result = STAGES[stage](args, scale)
        result.update(
            stage=stage,
            scale=scale.name,
            wall_s=round(time.perf_counter() - t0, 2),
            device=args.device,
            device_name=msf._device_name(args.device),
            versions=versions(),
            created_unix=int(time.time()),
        )
        write_json(args.out / f"stage-{stage}.json", result)
        log(f"stage {stage} done in {result['wall_s']} s")
    merged = {
        path.stem.removeprefix("stage-"): json.loads(path.read_text())
        for path in sorted(args.out.glob("stage-*.json"))
    }
    write_json(args.out / "mla-fixtures.json", {"schema_version": 1, "stages": merged})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
