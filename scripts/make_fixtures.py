#!/usr/bin/env python
"""Build the deterministic model fixtures used by the sglang_ext tests and benchmarks.

Everything is trained from scratch on text that exists on every machine: the Python
standard library's own source files. Nothing is downloaded.

Fixture layout (``--out DIR``)::

    DIR/
      fixtures.json                 manifest (versions, seeds, timings, losses, tau, ...)
      prompts.jsonl                 >= 64 held-out prompts {"id","input_ids","text","source"}
      splits.json                   train / held-out stdlib file lists (relative paths)
      tokenizer/                    byte-level BPE tokenizer (tokenizer.json + config)
      vocab/{t2d.pt,d2t.pt}         draft-vocab mapping shared by all drafters
      reference/<drafter>.jsonl     offline reference tokens / acceptance per prompt
      llama-target/                 LlamaForCausalLM (+ tokenizer files)          [llama]
      llama-drafter/                speculators Eagle3DraftModel, 1 llama layer   [llama]
      llama-drafter-3layer/         same, 3 draft layers                          [llama3layer]
      random-drafter/               llama-drafter config, untrained weights       [random]
      qwen3-target/ qwen3-drafter/  Qwen3ForCausalLM + qwen3-layer drafter        [qwen3]
      dsv3-target/ dsv3-drafter/    random DeepseekV3ForCausalLM (MLA+MoE)        [dsv3]
      llama4layer-target/           4-layer llama                                 [sglang4layer]
      llama4layer-sglang-drafter/   plain SGLang-format EAGLE-3 drafter (midlayer.*,
                                    no eagle_config -> SGLang default aux ids collapse)
      window-drafter/               llama-target drafter trained with sliding_window   [window]
                                    256 on 1280-token sequences (fixtures_window)
      window-prompts.jsonl          long held-out prompts (1100-1500 tokens)          [window]
      reference/window-drafter{,-full}.jsonl   its tau with the window / full attention

Aux hidden-state ids (``eagle_aux_hidden_state_layer_ids``) follow the speculators /
vLLM convention: id ``k`` is the residual stream ENTERING decoder layer ``k``, i.e.
transformers ``output_hidden_states[k]``; id ``num_layers`` would be the last decoder
output before the final norm. Drafter training targets use that pre-norm last hidden state
(speculators applies ``verifier_norm`` + ``verifier_lm_head`` itself); note transformers 5
returns the POST-norm state as ``output_hidden_states[-1]``, so we capture the input of
the final norm instead (``sglang_ext_tools.reference.collect_hidden_states``).

Determinism: every stage reseeds python/torch RNGs from ``--seed`` and a per-stage
offset, so a stage's result does not depend on which other variants are built. The CPU
(tiny) build is bitwise reproducible for a given torch build; CUDA training is seeded
but not bitwise deterministic (``torch.use_deterministic_algorithms`` is not enabled
because some SDPA/index backward kernels have no deterministic variant and it would
slow training down).

The build's parts, one idea each (this file is the CLI: stages and manifest;
other scripts import the parts directly):
``fixtures_common`` (scales, seeding, JSON), ``fixtures_data`` (stdlib corpus, tokenizer,
prompts, draft vocabulary), ``fixtures_targets``, ``fixtures_drafters``, ``fixtures_reference``,
``fixtures_window`` (the sliding-window drafter's long prompts and two references).

Usage::

    python scripts/make_fixtures.py --out /tmp/fixtures --scale tiny --device cpu \\
        --variants llama,random,sglang4layer
    python scripts/make_fixtures.py --out fixtures --scale full --device cuda
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the parts, also when this file is loaded by path (tests)
    sys.path.insert(0, str(HERE))

# The build's parts.
from fixtures_common import (  # noqa: E402
    _AMP,
    AUX_IDS,
    HELDOUT_PERCENT,
    LOSS_NAME,
    NUM_SPEC_TOKENS,
    SCALES,
    SPECIAL_TOKENS,
    SPLIT_SALT,
    VARIANTS,
    _clean_floats,
    amp_enabled,
    log,
    patch_config,
    seed_all,
    sha256_file,
    versions,
    write_json,
)
from fixtures_data import (  # noqa: E402
    build_vocab_mapping,
    collect_sources,
    encode_stream,
    heldout_chunks,
    make_prompts,
    select_training_subset,
    train_tokenizer,
)
from fixtures_drafters import (  # noqa: E402
    build_drafter,
    drafter_summary,
    eval_drafter,
    save_drafter,
    train_drafter,
    write_sglang_eagle3_drafter,
)
from fixtures_reference import (  # noqa: E402
    run_reference,
)
from fixtures_targets import (  # noqa: E402
    build_dsv3,
    build_llama,
    build_qwen3,
    eval_causal_lm,
    save_target,
    target_summary,
    train_causal_lm,
)
from fixtures_window import (  # noqa: E402
    WINDOW_DRAFTER,
    WINDOW_PROMPTS,
    check_positions,
    make_long_prompts,
    window_reference,
    write_prompts,
)

# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


class Manifest:
    def __init__(self, path: Path, base: dict[str, Any]):
        self.path = path
        self.data = base
        self.flush()

    def flush(self) -> None:
        write_json(self.path, _clean_floats(self.data))


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--scale", choices=tuple(SCALES), default="full")
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma list from {VARIANTS} (default: all)"
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace fixture subdirectories that already exist in --out",
    )
    p.add_argument("--skip-reference", action="store_true", help="skip the offline tau runs")
    p.add_argument("--ref-dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument(
        "--ref-prompts",
        type=int,
        default=None,
        help="prompts for the llama-drafter reference run (default per scale)",
    )
    p.add_argument("--ref-prompts-other", type=int, default=None)
    p.add_argument(
        "--window-ref-prompts",
        type=int,
        default=None,
        help="long prompts for the window drafter's free-running references (default: all)",
    )
    p.add_argument(
        "--draft-attn-impl", choices=("sdpa", "eager", "simple_flex_attention"), default="sdpa"
    )
    p.add_argument(
        "--compile-drafter",
        action="store_true",
        help="let speculators torch.compile the drafter forward (CUDA only)",
    )
    p.add_argument("--loss-impl", choices=("auto", "fused", "eager"), default="auto")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: 1 with --device cpu, where tiny "
        "matmuls are dominated by thread-pool overhead; torch default "
        "with --device cuda)",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="cap every training stage at this many steps (smoke tests)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="plumbing check of any scale: 1 step, batch 2, 1 reference prompt",
    )
    p.add_argument(
        "--cpu-autocast",
        action="store_true",
        help="debug: run the bf16-autocast (CUDA) code path on CPU",
    )
    p.add_argument(
        "--time-cap-scale",
        type=float,
        default=1.0,
        help="multiply the per-stage wall-clock caps (0 disables caps)",
    )
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {VARIANTS}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda requested but CUDA is not available")
    if args.draft_attn_impl == "simple_flex_attention" and args.device != "cuda":
        p.error("simple_flex_attention needs CUDA")
    return args


def main(argv=None) -> int:  # noqa: C901 - a linear sequence of stages
    args = parse_args(argv)
    scale = SCALES[args.scale]
    _AMP["cpu"] = args.cpu_autocast

    if args.smoke:
        args.max_steps = 1
        args.ref_prompts = args.ref_prompts or 1
        args.ref_prompts_other = args.ref_prompts_other or 1
        args.max_new_tokens = args.max_new_tokens or 6
        scale = dataclasses.replace(
            scale,
            heldout_eval_chunks=2,
            ref_lossless_prompts=1,
            llama_train={**scale.llama_train, "batch": 2},
            qwen3_train={**scale.qwen3_train, "batch": 2},
            llama4_train={**scale.llama4_train, "batch": 2},
            drafter_train={k: {**v, "chunks": 1} for k, v in scale.drafter_train.items()},
            window={**scale.window, "prompts": 1},
        )

    def steps_for(n: int) -> int:
        return n if args.max_steps is None else max(1, min(n, args.max_steps))

    device = args.device
    bf16 = scale.name == "full"
    loss_impl = (
        args.loss_impl if args.loss_impl != "auto" else ("fused" if device == "cuda" else "eager")
    )
    variants = set(args.variants)
    need_llama = bool(variants & {"llama", "llama3layer", "random", "window"})
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    owned = [
        "tokenizer",
        "vocab",
        "reference",
        "llama-target",
        "llama-drafter",
        "llama-drafter-3layer",
        "random-drafter",
        "qwen3-target",
        "qwen3-drafter",
        "dsv3-target",
        "dsv3-drafter",
        "llama4layer-target",
        "llama4layer-sglang-drafter",
        WINDOW_DRAFTER,
        WINDOW_PROMPTS,
    ]
    existing = [d for d in owned if (out / d).exists()]
    if existing and not args.overwrite:
        raise SystemExit(f"{out} already has {existing}; pass --overwrite to replace them")
    for d in existing:
        if (out / d).is_dir():
            shutil.rmtree(out / d)
        else:
            (out / d).unlink()

    def cap(name: str) -> float | None:
        c = scale.time_caps.get(name)
        return None if c is None or args.time_cap_scale <= 0 else c * args.time_cap_scale

    t_start = time.perf_counter()
    threads = args.threads or (1 if device == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    torch.set_float32_matmul_precision("high")  # TF32 for fp32 parts of training
    manifest = Manifest(
        out / "fixtures.json",
        {
            "schema_version": 1,
            "created_unix": int(time.time()),
            "scale": scale.name,
            "device": device,
            "device_name": torch.cuda.get_device_name(0)
            if device == "cuda"
            else (platform.processor() or platform.machine()),
            "seed": args.seed,
            "seeds": {
                "stage_offsets": {
                    "data": 0,
                    "llama-target": 1,
                    "qwen3-target": 2,
                    "dsv3-target": 3,
                    "llama4layer-target": 4,
                    "llama-drafter": 11,
                    "llama-drafter-3layer": 12,
                    "random-drafter": 13,
                    "qwen3-drafter": 14,
                    "dsv3-drafter": 15,
                    "llama4layer-sglang-drafter": 16,
                    "window-drafter": 17,
                    "window-prompts": 18,
                },
                "rule": "each stage calls seed_all(seed + offset) and uses "
                "torch.Generator(seed + offset) for batch sampling",
            },
            "versions": versions(),
            "variants": sorted(variants),
            "determinism": (
                "seeded everywhere; CPU builds are bitwise reproducible for a given torch "
                "build; CUDA training is seeded but torch.use_deterministic_algorithms is not "
                "enabled, so bf16 CUDA results can differ in the last bits between runs"
            ),
            "conventions": {
                "aux_layer_ids": "speculators/vLLM: id k = residual stream entering decoder "
                "layer k = transformers output_hidden_states[k] "
                "(0 = embeddings, num_layers = last layer output, pre-norm)",
                "verifier_last_hidden_states": "pre-norm output of the last decoder layer "
                "(input of model.norm); transformers 5 "
                "output_hidden_states[-1] is post-norm",
                "drafter_alignment": "speculators shift_batch: input_ids[1:], "
                "hidden_states[:-1], verifier_last_hidden_states[1:], "
                "position_ids[1:] (start at 1)",
                "reference_positions": "drafter pair (x_{i+1}, g_i) at RoPE position i "
                "(SGLang); relative RoPE makes offset 1 equivalent",
            },
            "config": {
                "num_speculative_tokens": NUM_SPEC_TOKENS,
                "draft_attn_impl": args.draft_attn_impl,
                "compile_drafter": args.compile_drafter,
                "loss_fn": LOSS_NAME,
                "loss_implementation": loss_impl,
                "train_dtype": "bf16 autocast, fp32 master" if amp_enabled(device) else "fp32",
                "saved_dtype": "bfloat16" if bf16 else "float32",
                "ref_dtype": args.ref_dtype,
            },
            "stages": {},
            "targets": {},
            "drafters": {},
        },
    )

    def stage_done(name: str, t0: float) -> None:
        manifest.data["stages"][name] = {"wall_s": round(time.perf_counter() - t0, 2)}
        manifest.flush()

    # ---------------- data ----------------
    t0 = time.perf_counter()
    seed_all(args.seed)
    corpus = collect_sources()
    train_files = select_training_subset(corpus, scale.train_char_budget)
    train_chars = sum(len(t) for _, t in train_files)
    if train_chars < (2_000_000 if scale.name == "full" else 100_000):
        raise SystemExit(
            f"only {train_chars} characters of stdlib source found under "
            f"{corpus.root}; is this a Python without .py sources?"
        )
    log(
        f"stdlib {corpus.root}: {len(corpus.train)} train / {len(corpus.heldout)} held-out "
        f"files ({corpus.skipped} unreadable); using {len(train_files)} for training"
    )
    hf_tok = train_tokenizer([t for _, t in train_files], scale.vocab_size, out / "tokenizer")
    train_stream = encode_stream(hf_tok, [t for _, t in train_files])
    heldout_stream = encode_stream(hf_tok, [t for _, t in corpus.heldout])
    prompts = make_prompts(hf_tok, corpus.heldout, scale, args.seed)
    with (out / "prompts.jsonl").open("w") as fh:
        for pr in prompts:
            fh.write(json.dumps(pr) + "\n")
    write_json(
        out / "splits.json",
        {
            "rule": f"sha256('{SPLIT_SALT}:' + relpath)[:8] as int % 100 < {HELDOUT_PERCENT} "
            "-> held-out",
            "stdlib_root": corpus.root,
            "train_used": [r for r, _ in train_files],
            "train_all": [r for r, _ in corpus.train],
            "heldout": [r for r, _ in corpus.heldout],
        },
    )
    heldout_eval = heldout_chunks(heldout_stream, scale.seq_len, scale.heldout_eval_chunks)
    draft_vocab = scale.vocab_size // 2
    t2d, d2t, coverage = build_vocab_mapping(train_stream, scale.vocab_size, draft_vocab)
    (out / "vocab").mkdir(exist_ok=True)
    torch.save(t2d, out / "vocab" / "t2d.pt")
    torch.save(d2t, out / "vocab" / "d2t.pt")
    manifest.data["data"] = {
        "stdlib_root": corpus.root,
        "python_version": platform.python_version(),
        "train_files": len(corpus.train),
        "train_files_used": len(train_files),
        "heldout_files": len(corpus.heldout),
        "unreadable_files": corpus.skipped,
        "split_rule": f"sha256('{SPLIT_SALT}:'+relpath) % 100 < {HELDOUT_PERCENT} -> held-out",
        "train_tokens": int(train_stream.numel()),
        "heldout_tokens": int(heldout_stream.numel()),
        "tokenizer": {
            "type": "byte-level BPE (tokenizers)",
            "vocab_size": scale.vocab_size,
            "special_tokens": dict(zip(SPECIAL_TOKENS, range(3), strict=True)),
            "sha256": sha256_file(out / "tokenizer" / "tokenizer.json"),
        },
        "seq_len": scale.seq_len,
    }
    manifest.data["prompts"] = {
        "path": "prompts.jsonl",
        "count": len(prompts),
        "min_len": min(len(p["input_ids"]) for p in prompts),
        "max_len": max(len(p["input_ids"]) for p in prompts),
        "source_files": len({p["source"] for p in prompts}),
    }
    manifest.data["vocab_mapping"] = {
        "draft_vocab_size": draft_vocab,
        "t2d_sum": int(t2d.sum()),
        "train_token_coverage": round(coverage, 4),
        "rule": "top draft_vocab_size training-token frequencies (ties -> lower id), "
        "ascending; d2t[i] + i = target id",
    }
    window_prompts: list[dict[str, Any]] = []
    if "window" in variants:
        wcfg = scale.window
        window_prompts = make_long_prompts(
            hf_tok, corpus.heldout, wcfg["prompts"], wcfg["prompt_len"], args.seed + 18
        )
        manifest.data["window"] = {
            "prompts": write_prompts(out / WINDOW_PROMPTS, window_prompts),
            "sliding_window": wcfg["sliding_window"],
            "train_seq_len": wcfg["seq_len"],
        }
    stage_done("data", t0)
    log(f"data: {train_stream.numel()} train tokens, {len(prompts)} prompts")

    targets: dict[str, Any] = {}

    def make_target(
        name: str, builder, cfg: dict[str, Any], train_cfg: dict[str, Any] | None, offset: int
    ):
        t0 = time.perf_counter()
        seed_all(args.seed + offset)
        model = builder(cfg, scale.vocab_size)
        info = target_summary(model)
        if train_cfg is not None:
            info["train"] = train_causal_lm(
                model,
                train_stream,
                steps=steps_for(train_cfg["steps"]),
                batch=train_cfg["batch"],
                seq_len=scale.seq_len,
                lr=train_cfg["lr"],
                device=device,
                seed=args.seed + offset,
                time_cap=cap(name),
            )
        else:
            model.to(device).eval()
            info["train"] = None
            info["weights"] = "random (seeded), untrained"
        info["heldout"] = eval_causal_lm(model, heldout_eval, device)
        save_target(model, out / name, hf_tok, bf16)
        if model.config.model_type == "deepseek_v3":
            # Router fields that the original DeepSeek-V3 config.json carries and SGLang's
            # deepseek_v2 reads unconditionally; they describe what transformers'
            # DeepseekV3 MoE computes (sigmoid scores + e_score_correction_bias group top-k).
            patch_config(
                out / name,
                topk_method="noaux_tc",
                scoring_func="sigmoid",
                moe_layer_freq=1,
                ep_size=1,
            )
        info["dir"] = name
        info["dtype"] = "bfloat16" if bf16 else "float32"
        manifest.data["targets"][name] = info
        stage_done(name, t0)
        log(f"{name}: held-out {info['heldout']}")
        model.to(device).float().eval()  # fp32 copy for feature extraction
        targets[name] = model
        return model

    def make_drafter(
        name: str,
        target_name: str,
        num_layers: int,
        arch: str,
        aux_ids: list[int],
        train: bool,
        offset: int,
        sliding_window: int = 2048,
        seq_len: int = scale.seq_len,
    ):
        t0 = time.perf_counter()
        drafter, source = build_drafter(
            out / target_name,
            num_layers=num_layers,
            draft_arch=arch,
            aux_ids=aux_ids,
            t2d=t2d,
            d2t=d2t,
            attn_impl=args.draft_attn_impl,
            seed=args.seed + offset,
            sliding_window=sliding_window,
        )
        info = drafter_summary(drafter, target_name, source)
        if train:
            tc = scale.drafter_train[name]
            info["train"] = train_drafter(
                drafter,
                targets[target_name],
                train_stream,
                heldout_eval,
                steps=steps_for(tc["steps"]),
                chunks=tc["chunks"],
                seq_len=seq_len,
                lr=tc["lr"],
                device=device,
                seed=args.seed + offset,
                loss_impl=loss_impl,
                compile_drafter=args.compile_drafter,
                time_cap=cap(name),
            )
            log(
                f"{name}: train loss {info['train'].get('first_loss')} -> "
                f"{info['train'].get('last_loss')}, held-out {info['train']['heldout']}"
            )
        else:
            from speculators.losses import resolve_loss_config

            info["train"] = None
            info["weights"] = (
                "untrained: fc/layers/norms from HF init, embed_tokens and "
                "lm_head copied from the verifier (speculators default init)"
            )
            info["heldout"] = eval_drafter(
                drafter,
                targets[target_name],
                heldout_eval,
                device,
                resolve_loss_config(LOSS_NAME, "eager"),
                args.compile_drafter,
            )
        save_drafter(drafter, out / name, bf16)
        info["dir"] = name
        info["dtype"] = "bfloat16" if bf16 else "float32"
        manifest.data["drafters"][name] = info
        stage_done(name, t0)
        return info

    # ---------------- llama family ----------------
    llama_aux = AUX_IDS["llama-target"] if scale.llama["num_hidden_layers"] == 6 else [1, 2, 3]
    if need_llama:
        make_target("llama-target", build_llama, scale.llama, scale.llama_train, 1)
    if "llama" in variants:
        make_drafter("llama-drafter", "llama-target", 1, "llama", llama_aux, True, 11)
    if "llama3layer" in variants:
        make_drafter("llama-drafter-3layer", "llama-target", 3, "llama", llama_aux, True, 12)
    if "random" in variants:
        make_drafter("random-drafter", "llama-target", 1, "llama", llama_aux, False, 13)
    if "window" in variants:
        check_positions(
            out / "llama-target",
            window_prompts,
            args.max_new_tokens or scale.window["max_new_tokens"],
        )
        make_drafter(
            WINDOW_DRAFTER,
            "llama-target",
            1,
            "llama",
            llama_aux,
            True,
            17,
            sliding_window=scale.window["sliding_window"],
            seq_len=scale.window["seq_len"],
        )

    # ---------------- qwen3 ----------------
    if "qwen3" in variants:
        make_target("qwen3-target", build_qwen3, scale.qwen3, scale.qwen3_train, 2)
        make_drafter("qwen3-drafter", "qwen3-target", 1, "qwen3", AUX_IDS["qwen3-target"], True, 14)

    # ---------------- deepseek v3 ----------------
    if "dsv3" in variants:
        make_target("dsv3-target", build_dsv3, scale.dsv3, None, 3)
        make_drafter("dsv3-drafter", "dsv3-target", 1, "llama", AUX_IDS["dsv3-target"], True, 15)
        ids = AUX_IDS["dsv3-target"]
        manifest.data["drafters"]["dsv3-drafter"]["sglang_note"] = (
            "first aux id is 1: stock SGLang deepseek_v2.set_eagle3_layers_to_capture adds "
            f"+1 to every id only in that case, so passing {ids} verbatim captures "
            f"{[k + 1 for k in ids]} while passing {[k - 1 for k in ids]} captures "
            f"{[k - 1 for k in ids]}; neither equals the needed {ids}"
        )

    # ---------------- 4-layer llama + plain SGLang drafter ----------------
    if "sglang4layer" in variants:
        model = make_target("llama4layer-target", build_llama, scale.llama4, scale.llama4_train, 4)
        t0 = time.perf_counter()
        info = write_sglang_eagle3_drafter(
            out / "llama4layer-sglang-drafter", model, t2d, d2t, bf16, args.seed + 16
        )
        info["dir"] = "llama4layer-sglang-drafter"
        manifest.data["drafters"]["llama4layer-sglang-drafter"] = info
        stage_done("llama4layer-sglang-drafter", t0)

    # free training copies before the reference runs
    targets.clear()
    if device == "cuda":
        torch.cuda.empty_cache()

    # ---------------- offline reference tau ----------------
    if not args.skip_reference:
        torch.set_float32_matmul_precision("highest")
        t0 = time.perf_counter()
        n_main = args.ref_prompts or scale.ref_prompts_main
        n_other = args.ref_prompts_other or scale.ref_prompts_other
        plan = [
            ("llama-drafter", "llama-target", n_main, scale.ref_lossless_prompts),
            ("llama-drafter-3layer", "llama-target", n_other, 0),
            (
                "random-drafter",
                "llama-target",
                min(n_other, args.ref_prompts_other or scale.ref_prompts_random),
                0,
            ),
            ("qwen3-drafter", "qwen3-target", n_other, 0),
            ("dsv3-drafter", "dsv3-target", n_other, 0),
        ]
        for dname, tname, n, lossless in plan:
            if dname not in manifest.data["drafters"]:
                continue
            manifest.data["drafters"][dname]["reference"] = run_reference(
                out, dname, out / tname, out / dname, prompts, n, args, scale, lossless
            )
            manifest.flush()
        stage_done("reference", t0)
        if WINDOW_DRAFTER in manifest.data["drafters"]:
            t0 = time.perf_counter()
            result = window_reference(
                out,
                "llama-target",
                window_prompts[: args.window_ref_prompts or len(window_prompts)],
                args,
                args.max_new_tokens or scale.window["max_new_tokens"],
            )
            manifest.data["drafters"][WINDOW_DRAFTER]["reference"] = result
            manifest.data["window"].update(
                {k: result[k] for k in ("tau_reference_window", "tau_reference_full", "chain")},
                reference_dtype=result["dtype"],
                max_new_tokens=result["window"]["max_new_tokens"],
            )
            manifest.flush()
            stage_done("window-reference", t0)

    manifest.data["total_wall_s"] = round(time.perf_counter() - t_start, 2)
    manifest.flush()
    log(f"done in {manifest.data['total_wall_s']}s -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
