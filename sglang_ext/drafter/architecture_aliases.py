"""Other projects' names for SGLang's EAGLE-3 drafter layouts, as data.

A drafter's ``architectures`` picks the class that reads it. Some published drafters carry
another project's name for the same layout: vLLM's registry
(``vllm/model_executor/models/registry.py:_SPECULATIVE_DECODING_MODELS``) serves both
``Eagle3LlamaForCausalLM`` and ``LlamaForCausalLMEagle3`` with one class, and AngelSlim-trained
drafters are published under the former, with weights in SGLang's layout (``midlayer.*``,
``fc``, ``d2t``/``t2d``). Such a name is read as SGLang's; the key table then decides, tensor
by tensor, whether the weights really are in that layout (an alias never skips the load
plan). A name whose layout differs in a way we cannot check is refused with the rename that
would make it load, and why it is not done silently.
"""

from __future__ import annotations

# published name -> (SGLang's name, where the published name comes from)
ALIASES: dict[str, tuple[str, str]] = {
    "Eagle3LlamaForCausalLM": (
        "LlamaForCausalLMEagle3",
        "vLLM's name for the same layout (AngelSlim-trained drafters)",
    ),
    "EAGLE3LlamaForCausalLM": (
        "LlamaForCausalLMEagle3",
        "TensorRT-LLM's name for the same layout",
    ),
}

# published name -> (the rename that loads it, why it is not read automatically)
RENAME_TO: dict[str, tuple[str, str]] = {
    "Eagle3Qwen2_5vlForCausalLM": (
        "LlamaForCausalLMEagle3",
        "vLLM serves it with its Llama EAGLE-3 class for a Qwen2.5-VL target, whose "
        "multimodal rope positions SGLang's LlamaForCausalLMEagle3 does not use",
    ),
    "Eagle3Qwen3vlForCausalLM": (
        "LlamaForCausalLMEagle3",
        "vLLM serves it with its Llama EAGLE-3 class for a Qwen3-VL target, whose "
        "multimodal rope positions SGLang's LlamaForCausalLMEagle3 does not use",
    ),
}


def canonical(name: str) -> str:
    """SGLang's name for `name` (unchanged when it is not an alias)."""
    return ALIASES.get(name, (name, ""))[0]


def alias_note(name: str) -> str | None:
    """A sentence saying that `name` is read as SGLang's name, or None."""
    if name not in ALIASES:
        return None
    sglang_name, origin = ALIASES[name]
    return (
        f"architectures {name!r} ({origin}) is read as SGLang's {sglang_name!r}; the "
        "checkpoint's tensors are checked against that layout's key table"
    )


def rename_hint(name: str, sglang_names: tuple[str, ...]) -> str:
    """How to make an unrecognised EAGLE-3 architecture name load, as a sentence."""
    if name in RENAME_TO:
        target, why = RENAME_TO[name]
        return (
            f"{name!r} is not read automatically ({why}); if the drafter is served for a "
            f"text-only target, rename it to {target!r} in config.json architectures"
        )
    if "eagle" in name.lower():
        return (
            f"{name!r} is not a name SGLang knows; if its weights are in SGLang's EAGLE-3 "
            f"layout, rename it to {sglang_names[0]!r} (or {sglang_names[1]!r} for an MLA "
            "drafter) in config.json architectures"
        )
    return ""
