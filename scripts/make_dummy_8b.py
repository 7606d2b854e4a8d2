#!/usr/bin/env python
"""Config-only Llama-3.1-8B-shaped target + SGLang-format EAGLE-3 drafter for
``--load-format dummy`` runs (random weights: timing and profiles only, tau ~ 1), with the
same shapes as the speed fixtures (vocab 8192, drafter MLP 1536), plus random prompts.

    python scripts/make_dummy_8b.py /tmp/dummy
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 8192,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


def main(out: Path) -> int:
    (out / "target").mkdir(parents=True, exist_ok=True)
    (out / "drafter").mkdir(parents=True, exist_ok=True)
    (out / "target" / "config.json").write_text(json.dumps(LLAMA, indent=2))
    drafter = dict(
        LLAMA,
        architectures=["LlamaForCausalLMEagle3"],
        num_hidden_layers=1,
        intermediate_size=1536,
        draft_vocab_size=8192,
        eagle_config={
            "eagle_aux_hidden_state_layer_ids": [1, 15, 28],  # SGLang ids: captures 2, 16, 29
            "use_aux_hidden_state": True,
        },
    )
    (out / "drafter" / "config.json").write_text(json.dumps(drafter, indent=2))
    rng = random.Random(0)
    with (out / "prompts.jsonl").open("w") as fh:
        for _ in range(16):
            fh.write(json.dumps({"input_ids": [rng.randrange(3, 8192) for _ in range(200)]}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
