#!/usr/bin/env python
"""Fixtures for the speed benchmark: an 8B-shaped Llama target that is a useful, predictable
language model, and two speculators EAGLE-3 drafters for it. Nothing is downloaded.

How (and why this way): an 8B model cannot be trained in a GPU lease of minutes, but a small
one can, and a small one can be embedded function-preservingly in an 8B-shaped one
(``sglang_ext_tools.widen``: zero-padded hidden dimensions, RMSNorm weights and eps rescaled, the
small layers spread over 32 with identity residual blocks in between). The big target then
costs what Llama-3.1-8B costs per token (same layer count, widths, GQA 32/8, head_dim 128;
its vocabulary is our 8192-token BPE) and predicts exactly what the small one predicts.

Stages (``--stage``), each writing into ``--out``:

  base      tokenizer + data (Python stdlib sources, as scripts/make_fixtures.py), the small
            target (6 x 512, head_dim 128), held-out prompts, and "distillation" sequences:
            the target's own greedy continuations of training-text prompts, which is what
            the drafter sees when serving greedy requests.
  drafter   one speculators Eagle3DraftModel trained with speculators' forward and loss
            (``--nbr true|false`` = norm_before_residual) on half raw text, half
            distillation sequences; TTT steps 5; aux ids [1, 3, 5]; full attention; full
            vocabulary; plus an offline reference tau on held-out prompts (fp32).
  widen-target / widen-drafters
            target-8b/ (32 layers; small layer i sits at big layer 6i, so the aux ids
            [2, 16, 29] -- speculators' default for 32 layers -- carry the small model's
            [1, 3, 5]), drafter-8b-nbr-{true,false}/ (hidden 4096; the MLP keeps the
            trained width: a lean drafter), drafter-8b-nbr-false-sglang/ (``sglang-ext
            convert``, no behaviour differences), and a bf16 check that the big target's
            logits equal the small target's on held-out text.

Training the drafter at width 512 and widening it is the same as training it at 4096 from
the widened initialisation: the padded coordinates get zero gradient (every weight that
reads them is zero), so they stay zero.

    python scripts/make_speed_fixtures.py --stage base --out /tmp/speed --device cuda
    python scripts/make_speed_fixtures.py --stage drafter --nbr true --out /tmp/speed
    python scripts/make_speed_fixtures.py --stage drafter --nbr false --out /tmp/speed
    python scripts/make_speed_fixtures.py --stage widen-target --out /tmp/speed  # after base
    python scripts/make_speed_fixtures.py --stage widen-drafters --out /tmp/speed
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from fixtures_common import LOSS_NAME, autocast_ctx, log, seed_all, versions, write_json  # noqa: E402
from fixtures_data import (  # noqa: E402
    collect_sources,
    encode_stream,
    heldout_chunks,
    make_prompts,
    sample_batch,
    select_training_subset,
    train_tokenizer,
)
from fixtures_drafters import (  # noqa: E402
    build_drafter,
    drafter_summary,
    eval_drafter,
    save_drafter,
    train_drafter,
)
from fixtures_targets import (  # noqa: E402
    build_llama,
    eval_causal_lm,
    save_target,
    target_summary,
    train_causal_lm,
)

from sglang_ext_tools import reference as ref  # noqa: E402
from sglang_ext_tools import widen  # noqa: E402


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainScale:
    """What `base_stage` and `distilled_drafter` read: a small target trained on the stdlib
    corpus and its drafter distilled on the target's own continuations (this script's speed
    fixtures and make_mla_fixtures' seed case extend it)."""

    name: str
    vocab_size: int
    seq_len: int
    train_char_budget: int | None
    target: dict[str, Any]
    target_train: dict[str, Any]
    distill: dict[str, int]  # sequences, prompt_len, batch (new tokens = seq_len - prompt_len)
    drafter_train: dict[str, Any]
    placement: tuple[int, ...]
    aux_ids: tuple[int, ...] = (1, 3, 5)
    heldout_eval_chunks: int = 32
    num_prompts: int = 64
    prompt_len: tuple[int, int] = (128, 256)
    reference: dict[str, int] = dataclasses.field(default_factory=dict)
    check_chunks: int = 8


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeedScale(TrainScale):
    big: widen.Shape
    big_layers: int
    big_aux_ids: tuple[int, ...] | None


FULL = SpeedScale(
    name="full",
    vocab_size=8192,
    seq_len=512,
    train_char_budget=None,
    # head_dim 128 like the big model: RoPE and the softmax scale stay as trained.
    target=dict(
        num_hidden_layers=6,
        hidden_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        intermediate_size=1536,
    ),
    target_train=dict(steps=1000, batch=64, lr=1.5e-3, time_cap=150),
    distill=dict(sequences=4096, prompt_len=128, batch=512, heldout_sequences=64),
    drafter_train=dict(steps=2500, chunks=8, lr=2e-3, ttt_steps=5, time_cap=270),
    big=widen.Shape(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336),
    big_layers=32,
    placement=(0, 6, 12, 18, 24, 30),
    big_aux_ids=(2, 16, 29),
    reference=dict(prompts=16, max_new_tokens=128, steps=5),
)
TINY = SpeedScale(
    name="tiny",
    vocab_size=512,
    seq_len=64,
    train_char_budget=300_000,
    target=dict(
        num_hidden_layers=6,
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
    ),
    target_train=dict(steps=20, batch=8, lr=1e-2, time_cap=None),
    distill=dict(sequences=16, prompt_len=32, batch=8, heldout_sequences=4),
    drafter_train=dict(steps=10, chunks=4, lr=5e-3, ttt_steps=3, time_cap=None),
    big=widen.Shape(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128),
    big_layers=10,
    placement=(0, 2, 4, 5, 7, 9),
    big_aux_ids=None,
    heldout_eval_chunks=4,
    num_prompts=8,
    prompt_len=(32, 48),
    reference=dict(prompts=2, max_new_tokens=8, steps=3),
    check_chunks=2,
)
SCALES = {"full": FULL, "tiny": TINY}


def _write(path: Path, obj: Any) -> None:
    write_json(path, obj)


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


@torch.no_grad()
def greedy_continuations(
    model, prompts: torch.Tensor, new_tokens: int, batch: int, device: str
) -> torch.Tensor:
    """[N, prompt_len + new_tokens]: each prompt followed by the model's greedy tokens (no EOS
    stop, like the benchmark's ignore_eos requests)."""
    model.to(device).eval()
    out = []
    for i in range(0, len(prompts), batch):
        x = prompts[i : i + batch].to(device)
        with autocast_ctx(device):
            res = model(input_ids=x, use_cache=True)
        past, seqs = res.past_key_values, [x]
        nxt = res.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(new_tokens - 1):
            seqs.append(nxt)
            with autocast_ctx(device):
                res = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past, nxt = res.past_key_values, res.logits[:, -1].argmax(-1, keepdim=True)
        seqs.append(nxt)
        out.append(torch.cat(seqs, dim=1).to("cpu", torch.int32))
    return torch.cat(out)


def _random_windows(stream: torch.Tensor, n: int, length: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - length - 1, (n,), generator=gen)
    return stream[starts[:, None] + torch.arange(length)[None]].long()


# --------------------------------------------------------------------------------------
# Stages
# --------------------------------------------------------------------------------------


def base_stage(args, scale, build, seed_offset: int, save) -> dict[str, Any]:
    """Tokenizer, data and held-out prompts (as scripts/make_fixtures.py), the small target
    ``build(cfg, vocab)`` trained, its greedy continuations, ``save(model, dir, tok, bf16)``
    to small-target/. Shared by this script and scripts/make_mla_fixtures.py."""
    out, device = args.out, args.device
    t0 = time.perf_counter()
    seed_all(args.seed)
    corpus = collect_sources()
    train_files = select_training_subset(corpus, scale.train_char_budget)
    hf_tok = train_tokenizer([t for _, t in train_files], scale.vocab_size, out / "tokenizer")
    train_stream = encode_stream(hf_tok, [t for _, t in train_files])
    heldout_stream = encode_stream(hf_tok, [t for _, t in corpus.heldout])
    prompts = make_prompts(hf_tok, corpus.heldout, scale, args.seed)
    with (out / "prompts.jsonl").open("w") as fh:
        for prompt in prompts:
            fh.write(json.dumps(prompt) + "\n")
    torch.save({"train": train_stream, "heldout": heldout_stream}, out / "streams.pt")
    data_s = time.perf_counter() - t0

    seed_all(args.seed + seed_offset)
    model = build(dict(scale.target), scale.vocab_size)
    train = train_causal_lm(
        model,
        train_stream,
        seq_len=scale.seq_len,
        device=device,
        seed=args.seed + seed_offset,
        **scale.target_train,
    )
    heldout = eval_causal_lm(
        model, heldout_chunks(heldout_stream, scale.seq_len, scale.heldout_eval_chunks), device
    )
    log(f"target: loss {train['last_loss']} (train), held-out {heldout}")

    # The drafter's serving distribution: the target's own greedy text. Prompts come from
    # the training split; the held-out continuations (from held-out text, never the bench
    # prompts' files' offsets) only evaluate.
    d = scale.distill
    t1 = time.perf_counter()
    new = scale.seq_len - d["prompt_len"]
    distill = greedy_continuations(
        model,
        _random_windows(train_stream, d["sequences"], d["prompt_len"], args.seed + 2),
        new,
        d["batch"],
        device,
    )
    heldout_distill = greedy_continuations(
        model,
        _random_windows(heldout_stream, d["heldout_sequences"], d["prompt_len"], args.seed + 3),
        new,
        d["batch"],
        device,
    )
    torch.save({"train": distill, "heldout": heldout_distill}, out / "distill.pt")
    distill_s = time.perf_counter() - t1
    save(model, out / "small-target", hf_tok, device == "cuda")
    return {
        "data": {
            "train_tokens": int(train_stream.numel()),
            "heldout_tokens": int(heldout_stream.numel()),
            "prompts": len(prompts),
            "wall_s": round(data_s, 2),
        },
        "small_target": {**target_summary(model), "train": train, "heldout": heldout},
        "distill": {
            **d,
            "new_tokens": new,
            "train_tokens": int(distill.numel()),
            "distinct_token_fraction": round(
                float(torch.unique(distill[:, d["prompt_len"] :]).numel()) / scale.vocab_size, 4
            ),
            "wall_s": round(distill_s, 2),
        },
    }


def stage_base(args, scale: SpeedScale) -> dict[str, Any]:
    return base_stage(args, scale, build_llama, 1, save_target)


def distilled_drafter(args, scale, target, *, nbr: bool, seed: int, out_name: str):
    """A speculators drafter for small-target/ trained with speculators' forward and loss on
    half raw text, half distillation text (scale.aux_ids, full vocabulary, full attention),
    saved to ``out_name``; returns (drafter, summary with its training and its teacher-forced
    accuracy on held-out greedy text). Shared with scripts/make_mla_fixtures.py."""
    out, device = args.out, args.device
    streams = torch.load(out / "streams.pt")
    distill = torch.load(out / "distill.pt")
    cfg = scale.drafter_train
    drafter, source = build_drafter(
        out / "small-target",
        num_layers=1,
        draft_arch="llama",
        aux_ids=list(scale.aux_ids),
        t2d=None,
        d2t=None,
        attn_impl=args.draft_attn_impl,
        seed=seed,
        norm_before_residual=nbr,
        full_attention=True,
        num_spec_tokens=cfg["ttt_steps"],
    )
    half = cfg["chunks"] // 2

    def sample(gen: torch.Generator) -> torch.Tensor:
        rows = torch.randint(0, len(distill["train"]), (cfg["chunks"] - half,), generator=gen)
        raw = sample_batch(streams["train"], half, scale.seq_len, gen, device)
        return torch.cat([raw, distill["train"][rows].long().to(device)])

    loss_impl = "fused" if device == "cuda" else "eager"
    train = train_drafter(
        drafter,
        target,
        streams["train"],
        heldout_chunks(streams["heldout"], scale.seq_len, scale.heldout_eval_chunks),
        steps=cfg["steps"],
        chunks=cfg["chunks"],
        seq_len=scale.seq_len,
        lr=cfg["lr"],
        device=device,
        seed=seed,
        loss_impl=loss_impl,
        compile_drafter=False,
        time_cap=cfg["time_cap"],
        ttt_steps=cfg["ttt_steps"],
        sample_fn=sample,
    )
    from speculators.losses import resolve_loss_config

    # The implementation training ended up with (it falls back to eager if fused fails).
    used = loss_impl if train["loss_implementation"] == loss_impl else "eager"
    loss_config = resolve_loss_config(LOSS_NAME, used)
    on_greedy = eval_drafter(
        drafter, target, distill["heldout"].long(), device, loss_config, False, cfg["ttt_steps"]
    )
    on_greedy["tau_estimate"] = round(1.0 + sum(on_greedy["full_acc_per_step"]), 4)
    log(f"{out_name}: teacher-forced tau on held-out greedy text {on_greedy['tau_estimate']}")
    save_drafter(drafter, out / out_name, bf16=device == "cuda")
    summary = {
        **drafter_summary(drafter, "small-target", source),
        "train": train,
        "heldout_greedy_text": on_greedy,
    }
    return drafter, summary


def stage_drafter(args, scale: SpeedScale) -> dict[str, Any]:
    from transformers import LlamaForCausalLM

    out, device, tag = args.out, args.device, f"nbr-{args.nbr}"
    nbr = args.nbr == "true"
    target = LlamaForCausalLM.from_pretrained(out / "small-target", dtype=torch.float32)
    target.to(device).eval()
    _, summary = distilled_drafter(
        args,
        scale,
        target,
        nbr=nbr,
        seed=args.seed + (11 if nbr else 12),
        out_name=f"small-drafter-{tag}",
    )

    # Offline reference tau: the reference chain loop (sglang_ext_tools.reference) in fp32.
    r = scale.reference
    prompts = [json.loads(line)["input_ids"] for line in (out / "prompts.jsonl").open()]
    ref_target = ref.load_target(out / "small-target", device=device, dtype="float32")
    ref_drafter = ref.load_drafter(out / f"small-drafter-{tag}", device=device, dtype="float32")
    reference = ref.evaluate_tau(
        ref_target,
        ref_drafter,
        prompts[: r["prompts"]],
        num_steps=r["steps"],
        max_new_tokens=r["max_new_tokens"],
    )
    reference.pop("per_prompt")
    log(f"drafter {tag}: reference tau {reference['tau']:.3f} at {r['steps']} steps")
    return {f"small_drafter_{tag}": {**summary, "reference": reference}}


@torch.no_grad()
def function_check(small_dir: Path, big_dir: Path, chunks: torch.Tensor, device: str) -> dict:
    """Logits of the big target vs the small one on held-out text, both in bf16 (as served),
    next to the bf16-vs-fp32 difference of the small model itself (the tolerance scale)."""
    from transformers import LlamaForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    small = LlamaForCausalLM.from_pretrained(small_dir, dtype=dtype).to(device).eval()
    small32 = LlamaForCausalLM.from_pretrained(small_dir, dtype=torch.float32).to(device).eval()
    big = LlamaForCausalLM.from_pretrained(big_dir, dtype=dtype).to(device).eval()
    stats = {"big_vs_small": [], "small_vs_fp32": []}
    for i in range(len(chunks)):
        x = chunks[i : i + 1].to(device)
        a = small(input_ids=x).logits.float()
        b = big(input_ids=x).logits.float()
        c = small32(input_ids=x).logits.float()
        for key, (u, v) in {"big_vs_small": (b, a), "small_vs_fp32": (a, c)}.items():
            stats[key].append(
                (
                    (u - v).abs().max().item(),
                    (u - v).abs().mean().item(),
                    (u.argmax(-1) == v.argmax(-1)).float().mean().item(),
                )
            )
    out = {"tokens": int(chunks.numel()), "dtype": str(dtype).replace("torch.", "")}
    for key, rows in stats.items():
        out[key] = {
            "max_abs_diff": round(max(r[0] for r in rows), 5),
            "mean_abs_diff": round(sum(r[1] for r in rows) / len(rows), 6),
            "top1_agreement": round(sum(r[2] for r in rows) / len(rows), 5),
        }
    out["logit_scale"] = round(a.abs().mean().item(), 4)
    del big
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def stage_widen_target(args, scale: SpeedScale) -> dict[str, Any]:
    out, device = args.out, args.device
    t0 = time.perf_counter()
    target = widen.write_widened_target(
        out / "small-target",
        out / "target-8b",
        scale.big,
        scale.big_layers,
        scale.placement,
        seed=args.seed + 5,
        device=device,
    )
    target["wall_s"] = round(time.perf_counter() - t0, 2)
    streams = torch.load(out / "streams.pt")
    chunks = heldout_chunks(streams["heldout"], scale.seq_len, scale.check_chunks)
    check = function_check(out / "small-target", out / "target-8b", chunks, device)
    log(f"function check: {json.dumps(check)}")
    return {"target_8b": target, "function_check": check}


def stage_widen_drafters(args, scale: SpeedScale) -> dict[str, Any]:
    from sglang_ext.cli.convert import convert

    out = args.out
    drafters = {}
    for tag in ("nbr-true", "nbr-false"):
        small_dir = out / f"small-drafter-{tag}"
        layer = json.loads((small_dir / "config.json").read_text())["transformer_layer_config"]
        shape = dataclasses.replace(scale.big, intermediate=int(layer["intermediate_size"]))
        drafters[tag] = widen.write_widened_drafter(
            small_dir,
            out / f"drafter-8b-{tag}",
            shape,
            verifier_dir=out / "target-8b",
            placement=scale.placement,
            aux_ids=scale.big_aux_ids,
        )
        drafters[tag]["intermediate_size"] = shape.intermediate
    differences = convert(  # overwrite: this stage's own output when it is run again
        out / "drafter-8b-nbr-false",
        out / "drafter-8b-nbr-false-sglang",
        out / "target-8b",
        overwrite=True,
    )
    if differences:
        raise SystemExit(f"nbr-false drafter should convert exactly, got: {differences}")
    return {
        "drafters_8b": drafters,
        "converted": {"dir": str(out / "drafter-8b-nbr-false-sglang"), "differences": []},
    }


STAGES = {
    "base": stage_base,
    "drafter": stage_drafter,
    "widen-target": stage_widen_target,
    "widen-drafters": stage_widen_drafters,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=(*STAGES, "all"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--nbr", choices=("true", "false"), default="true")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--draft-attn-impl", default="sdpa")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    scale = SCALES[args.scale]
    torch.set_float32_matmul_precision("high")
    if args.device == "cpu":
        torch.set_num_threads(2)
    stages = list(STAGES) if args.stage == "all" else [args.stage]
    for stage in stages:
        runs = [args.nbr] if stage != "drafter" or args.stage != "all" else ["true", "false"]
        for nbr in runs:
            args.nbr = nbr
            t0 = time.perf_counter()
            result = STAGES[stage](args, scale)
            name = stage if stage != "drafter" else f"drafter-nbr-{nbr}"
            result["wall_s"] = round(time.perf_counter() - t0, 2)
            result.update(
                stage=name,
                scale=scale.name,
                device=args.device,
                device_name=_device_name(args.device),
                versions=versions(),
                created_unix=int(time.time()),
            )
            _write(args.out / f"stage-{name}.json", result)
            log(f"stage {name} done in {result['wall_s']} s")
    merged = {
        path.stem.removeprefix("stage-"): json.loads(path.read_text())
        for path in sorted(args.out.glob("stage-*.json"))
    }
    _write(args.out / "speed-fixtures.json", {"schema_version": 1, "stages": merged})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
