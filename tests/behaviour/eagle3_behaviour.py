"""Helpers of the EAGLE-3 behavioural suite: everything goes through SGLang's own entry points.

The suite runs unchanged against (a) stock SGLang with the sglang-ext plugin and (b) SGLang
with the patch series applied and no plugin (tests/behaviour/conftest.py picks the mode). So
nothing here imports the plugin: drafters are built from a directory with SGLang's
`get_config` and the class its `ModelRegistry` resolves, the capture is configured by SGLang's
`configure_aux_hidden_state_capture`, and the server arguments those read are swapped through
SGLang's runtime context. Errors are recognised by class name (the plugin and the series raise
the same classes from different modules).
"""

from __future__ import annotations

import copy
import json
import os
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import torch

# "plugin" or "patched" (tests/behaviour/conftest.py checks the value). A few behaviours are
# the plugin's own, beyond what the upstream series proposes; their tests say why they skip.
MODE = os.environ.get("SGLANG_EXT_BEHAVIOUR", "plugin")

HIDDEN = 64
VOCAB = 256
DRAFT_VOCAB = 128


@contextmanager
def serving(**fields):
    """Serve with these ServerArgs fields (e.g. speculative_algorithm, the draft model path):
    a copy of the current server args with the fields set, published through SGLang's runtime
    context for the duration, then the original back."""
    from sglang.srt import runtime_context

    context = runtime_context.get_context()
    before = runtime_context.get_server_args()
    args = copy.copy(before)
    for name, value in fields.items():
        try:
            setattr(args, name, value)
        except (AttributeError, TypeError):  # ServerArgs is read-only once resolved (0.5.17)
            object.__setattr__(args, name, value)
    context.set_server_args(args)
    try:
        yield args
    finally:
        context.set_server_args(before)


def get_config(path):
    """SGLang's get_config, as the server calls it for a draft model."""
    from sglang.srt.utils.hf_transformers_utils import get_config as sglang_get_config

    return sglang_get_config(str(path), trust_remote_code=False)


def model_class(architecture: str):
    from sglang.srt.models.registry import ModelRegistry

    cls, resolved = ModelRegistry.resolve_model_cls([architecture])
    assert resolved == architecture
    return cls


def safetensors_weights(directory: Path):
    """(name, tensor) pairs from every safetensors file, as SGLang's loader feeds them."""
    from safetensors.torch import load_file

    for path in sorted(Path(directory).glob("*.safetensors")):
        yield from load_file(str(path)).items()


def build_drafter(directory: Path, *, load: bool = True, weights=None, embed=None):
    """The drafter SGLang builds for `directory`: get_config, the registry's class, its
    load_weights on the checkpoint's tensors (or `weights`), the target's embeddings handed
    over with set_embed, and reference attention in place of RadixAttention (CPU)."""
    from sglang_cpu import use_reference_attention

    config = get_config(directory)
    model = model_class(config.architectures[0])(config)
    if load:
        model.load_weights(safetensors_weights(directory) if weights is None else weights)
    else:
        randomize(model)
    if embed is not None:
        model.set_embed(torch.nn.Parameter(embed.detach().clone()))
    use_reference_attention(model)
    return model.eval()


def randomize(model, seed: int = 0) -> None:
    """SGLang allocates parameters uninitialised; give them finite values."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.05 + (
                1.0 if param.dim() == 1 else 0.0))


# --------------------------------------------------------------------------------------------
# SGLang-format drafters (what stock SGLang serves: lmsys-style EAGLE-3 checkpoints)


def sglang_drafter_config(aux_ids=(1, 3, 4), layers: int = 1, **extra) -> dict:
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": HIDDEN // 4,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if aux_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_ids)}
    config.update(extra)
    return config


def sglang_drafter_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """One-layer SGLang-format EAGLE-3 checkpoint tensors (legacy `midlayer.` names)."""
    generator = torch.Generator().manual_seed(seed)

    def weight(*shape):
        return torch.randn(*shape, generator=generator) * 0.05

    def norm(n):
        return 1.0 + torch.rand(n, generator=generator) * 0.5

    h, kv, inter = HIDDEN, HIDDEN // 2, 2 * HIDDEN
    chosen = torch.randperm(VOCAB, generator=generator)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[chosen] = True
    return {
        "fc.weight": weight(h, 3 * h),
        "midlayer.hidden_norm.weight": norm(h),
        "midlayer.input_layernorm.weight": norm(h),
        "midlayer.post_attention_layernorm.weight": norm(h),
        "midlayer.self_attn.q_proj.weight": weight(h, 2 * h),
        "midlayer.self_attn.k_proj.weight": weight(kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": weight(kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": weight(h, h),
        "midlayer.mlp.gate_proj.weight": weight(inter, h),
        "midlayer.mlp.up_proj.weight": weight(inter, h),
        "midlayer.mlp.down_proj.weight": weight(h, inter),
        "norm.weight": norm(h),
        "lm_head.weight": weight(DRAFT_VOCAB, h),
        "d2t": chosen - torch.arange(DRAFT_VOCAB),
        "t2d": t2d,
    }


def write_sglang_drafter(directory: Path, *, aux_ids=(1, 3, 4), tensors=None, **extra) -> Path:
    """An SGLang-format EAGLE-3 drafter directory (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(sglang_drafter_config(aux_ids, **extra)))
    if tensors is None:
        tensors = sglang_drafter_tensors()
    if tensors:
        save_file(tensors, str(directory / "model.safetensors"))
    return directory


class FcSpy(torch.nn.Module):
    """Counts the calls of a drafter's fc (the fusion)."""

    def __init__(self, fc):
        super().__init__()
        self.fc, self.calls = fc, 0

    def forward(self, x):
        self.calls += 1
        return self.fc(x)


def error_text(excinfo) -> str:
    return f"{type(excinfo.value).__name__}: {excinfo.value}"


# --------------------------------------------------------------------------------------------
# The MLA drafter (Kimi-K2.x); its attention needs a GPU backend, so the decoder layer is
# replaced by one that records the width it is handed.


class RecordingMidlayer(torch.nn.Module):
    def forward(self, positions, embeds, hidden, forward_batch, scratch):
        self.seen = hidden.shape[-1]
        return hidden, hidden


def mla_drafter(num_aux: int = 3):
    from mla_drafters import mla_config

    config = mla_config(num_aux=num_aux)
    model = model_class("Eagle3DeepseekV2ForCausalLM")(config)
    model.model.midlayer = RecordingMidlayer()
    spy = FcSpy(lambda x: (x[..., :HIDDEN], None))
    model.model.fc.forward = spy.forward
    model.model.fc_spy = spy
    return model


# --------------------------------------------------------------------------------------------
# Targets: SGLang's real set_eagle3_layers_to_capture on a stub that holds a real
# transformers config (SGLang's target models need settings only a server publishes).


def sglang_target(layers: int, family: str = "llama"):
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
    from sglang.srt.models.llama import LlamaForCausalLM
    from transformers import DeepseekV3Config, LlamaConfig

    cls, config_cls = {
        "llama": (LlamaForCausalLM, LlamaConfig),
        "deepseek": (DeepseekV2ForCausalLM, DeepseekV3Config),
    }[family]
    config = config_cls(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=4)
    config.architectures = [cls.__name__]
    stub_cls = type(f"{cls.__name__}Target", (), {
        "set_eagle3_layers_to_capture": cls.set_eagle3_layers_to_capture,
        "__module__": cls.__module__,
    })
    stub = stub_cls()
    stub.config, stub.capture_aux_hidden_states = config, False
    stub.pp_group = SimpleNamespace(is_last_rank=True)
    stub.model = SimpleNamespace(layers_to_capture=[])
    return stub


def record_capture_ids(target) -> dict:
    """Records the ids SGLang hands to the target's set_eagle3_layers_to_capture."""
    seen = {}
    original = type(target).set_eagle3_layers_to_capture

    def recording(self, ids, _original=original):
        seen["ids"] = ids
        return _original(self, ids)

    type(target).set_eagle3_layers_to_capture = recording
    return seen


def configure_capture(target, ids):
    """SGLang's startup step that makes the target capture aux hidden states (EAGLE3)."""
    from sglang.srt.model_executor.model_runner_components import attention_backend_setup

    attention_backend_setup.configure_aux_hidden_state_capture(
        model=target, eagle_use_aux_hidden_state=True, eagle_aux_hidden_state_layer_ids=ids,
        dflash_use_aux_hidden_state=False, dflash_target_layer_ids=None, is_dspark=False,
    )
