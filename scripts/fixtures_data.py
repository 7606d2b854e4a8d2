"""Fixture data: the Python standard library's own sources, their train / held-out split, a
byte-level BPE tokenizer, token streams, held-out prompts, and the draft vocabulary.

Part of the fixture build (``scripts/make_fixtures.py`` is its CLI); import these names from here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import sysconfig
from pathlib import Path
from typing import Any

import torch
from fixtures_common import EOS_ID, SPECIAL_TOKENS, Scale, heldout_split, write_json

# --------------------------------------------------------------------------------------
# Data: stdlib sources, split, tokenizer, token streams, prompts
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Corpus:
    root: str
    train: list[tuple[str, str]]  # (relative path, text)
    heldout: list[tuple[str, str]]
    skipped: int


def collect_sources() -> Corpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip_dirs = {"site-packages", "dist-packages", "__pycache__"}
    train, heldout, skipped = [], [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            try:
                text = full.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                skipped += 1
                continue
            if not text.strip():
                continue
            (heldout if heldout_split(rel) else train).append((rel, text))
    return Corpus(root=str(root), train=train, heldout=heldout, skipped=skipped)


def select_training_subset(corpus: Corpus, budget: int | None) -> list[tuple[str, str]]:
    if budget is None:
        return corpus.train
    ordered = sorted(corpus.train, key=lambda rt: hashlib.sha256(rt[0].encode()).hexdigest())
    chosen, total = [], 0
    for rel, text in ordered:
        if total >= budget:
            break
        chosen.append((rel, text))
        total += len(text)
    return sorted(chosen)


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    save_tokenizer(hf_tok, out_dir)
    return hf_tok


def save_tokenizer(hf_tok, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(str(out_dir))
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    # A class name every transformers version resolves (v5 maps it to TokenizersBackend).
    cfg.update(
        tokenizer_class="PreTrainedTokenizerFast",
        model_max_length=4096,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        add_bos_token=False,
        add_eos_token=False,
        clean_up_tokenization_spaces=False,
    )
    write_json(cfg_path, cfg)


def _backend(hf_tok):
    """The underlying ``tokenizers.Tokenizer`` (fast batch encoding, no special tokens)."""
    return getattr(hf_tok, "backend_tokenizer", None) or hf_tok._tokenizer


def encode_stream(hf_tok, texts: list[str]) -> torch.Tensor:
    encs = _backend(hf_tok).encode_batch(texts)
    ids: list[int] = []
    for enc in encs:
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.int32)


def make_prompts(hf_tok, heldout: list[tuple[str, str]], scale: Scale, seed: int):
    rng = random.Random(seed)
    lo, hi = scale.prompt_len
    encoded = [
        (rel, enc.ids)
        for (rel, _), enc in zip(
            heldout, _backend(hf_tok).encode_batch([t for _, t in heldout]), strict=True
        )
    ]
    prompts: list[dict[str, Any]] = []
    per_file_cursor = {rel: 0 for rel, _ in encoded}
    # Round-robin over held-out files so prompts come from many different files.
    while len(prompts) < scale.num_prompts:
        progressed = False
        for rel, ids in encoded:
            if len(prompts) >= scale.num_prompts:
                break
            length = rng.randint(lo, hi)
            start = per_file_cursor[rel]
            if start + length > len(ids):
                continue
            chunk = ids[start : start + length]
            per_file_cursor[rel] = start + length
            prompts.append(
                {
                    "id": f"p{len(prompts):03d}",
                    "input_ids": chunk,
                    "text": hf_tok.decode(chunk),
                    "source": rel,
                    "offset": start,
                }
            )
            progressed = True
        if not progressed:
            raise RuntimeError(
                f"held-out split too small for {scale.num_prompts} prompts of {lo}-{hi} tokens"
            )
    return prompts


def sample_batch(
    stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator, device: str
) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(seq_len)[None]
    return stream[idx].long().to(device)


def heldout_chunks(stream: torch.Tensor, seq_len: int, n: int) -> torch.Tensor:
    n = min(n, len(stream) // seq_len)
    return stream[: n * seq_len].reshape(n, seq_len).long()


# --------------------------------------------------------------------------------------
# Draft vocabulary
# --------------------------------------------------------------------------------------


def build_vocab_mapping(stream: torch.Tensor, vocab_size: int, draft_vocab_size: int):
    """Most frequent ``draft_vocab_size`` target tokens (ties -> lower id), ascending.

    ``d2t[i] + i`` is the target id of draft id ``i`` and ``t2d`` marks the kept target
    ids -- the same layout as speculators' ``build_vocab_mappings_from_distribution``.
    """
    counts = torch.bincount(stream.long(), minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda t: (-int(counts[t]), t))
    selected = torch.tensor(sorted(order[:draft_vocab_size]), dtype=torch.long)
    d2t = selected - torch.arange(draft_vocab_size, dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[selected] = True
    coverage = counts[selected].sum().item() / max(1, counts.sum().item())
    return t2d, d2t, coverage
