"""The demo's checkpoints: a speculators EAGLE-3 drafter and a Llama target config, built or copied.

Builds a tiny speculators-format EAGLE-3 drafter with speculators' own model class and saves it
with its own `save_pretrained` when speculators is installed; otherwise copies the few-KB
fixture bundled in `sglang_ext/data/demo`, made by the same function. `sglang-ext demo`
(`sglang_ext.cli.demo`) prints the doctor report on them.

The builders here are also what the test-suite uses to make its checkpoints, including the
behavioural suite in its patched (no plugin) mode, which allows this one module of the package:
it imports nothing else of it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

BUNDLED = Path(__file__).parent / "data" / "demo"


@dataclass
class Variant:
    """One speculators drafter configuration (defaults: speculators 0.9.0 training defaults)."""

    name: str = "default"
    num_layers: int = 1
    layer_type: str = "llama"
    norm_before_residual: bool = True
    norm_before_fc: bool = True
    fc_norm: bool = False
    norm_output: bool = True
    draft_vocab_size: int | None = 128  # None: same as the target vocab (no d2t/t2d)
    sliding_window: int | None = 2048  # None: full attention on every layer
    embed_requires_grad: bool = False
    aux_ids: tuple[int, ...] | None = (1, 3, 4)


def write_target(
    directory: Path,
    *,
    layers: int = 6,
    hidden: int = 64,
    vocab: int = 256,
    model_type: str = "llama",
) -> Path:
    """A target config directory (config.json only: the drafter never reads target weights)."""
    from transformers import LlamaConfig, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen3": Qwen3Config}[model_type]
    config = cls(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    )
    config.architectures = [{"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[model_type]]
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    return directory


def build_drafter(directory: Path, target_dir: Path, variant: Variant, seed: int = 0, dtype=None):
    """Build an Eagle3DraftModel as speculators' trainer configures it, randomise every weight
    (norms too, so a mis-routed norm cannot hide behind all-ones), save it with speculators'
    save_pretrained, and return the model."""
    import torch
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from speculators.train.cli import create_transformer_layer_config

    full = [] if variant.sliding_window else list(range(variant.num_layers))
    layer_config = create_transformer_layer_config(
        str(target_dir),
        variant.num_layers,
        variant.layer_type,
        None,
        variant.sliding_window or 2048,
        full,
    )
    layer_config._attn_implementation = "eager"  # flex attention needs a GPU compiler
    target = json.loads((Path(target_dir) / "config.json").read_text())
    vocab = target["vocab_size"]
    draft_vocab = variant.draft_vocab_size or vocab
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config,
        draft_vocab_size=draft_vocab,
        norm_before_residual=variant.norm_before_residual,
        norm_before_fc=variant.norm_before_fc,
        fc_norm=variant.fc_norm,
        norm_output=variant.norm_output,
        embed_requires_grad=variant.embed_requires_grad,
        eagle_aux_hidden_state_layer_ids=list(variant.aux_ids) if variant.aux_ids else None,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(
                name_or_path=str(target_dir), architectures=target["architectures"]
            ),
        ),
    )
    torch.manual_seed(seed)
    model = Eagle3DraftModel(config)
    if draft_vocab != vocab:
        generator = torch.Generator().manual_seed(seed)
        chosen = torch.randperm(vocab, generator=generator)[:draft_vocab].sort().values
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[chosen] = True
        model.load_vocab_mappings(t2d, chosen - torch.arange(draft_vocab))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.05)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(str(directory))
    return model


def make_demo(out: Path) -> tuple[Path, Path]:
    """A 6-layer-hidden-32 target config and a 1-layer drafter for it, in `out`."""
    target, drafter = out / "target", out / "drafter"
    try:
        import speculators  # noqa: F401
    except ImportError:
        shutil.copytree(BUNDLED, out, dirs_exist_ok=True)
        return target, drafter
    import torch

    write_target(target, layers=6, hidden=32, vocab=128)
    build_drafter(drafter, target, Variant(draft_vocab_size=64), dtype=torch.float16)
    return target, drafter


def drafter_origin() -> str:
    """How make_demo makes its drafter here: built with speculators, or the bundled copy."""
    try:
        import speculators  # noqa: F401
    except ImportError:
        return (
            "copied the bundled speculators EAGLE-3 drafter (made by speculators 0.9.0; "
            "speculators is not installed here, so nothing was built)"
        )
    return "built a speculators EAGLE-3 drafter with speculators' own Eagle3DraftModel"
