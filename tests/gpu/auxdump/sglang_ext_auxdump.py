"""GPU-suite test plugin (never shipped): saves the target features that an sglang_ext
EAGLE-3 drafter receives, so a test can hold SGLang's captured hidden states against the HF
target's on the same prompt.

SGLang loads it like any plugin (entry point group ``sglang.srt.plugins``, found through the
dist-info beside this file when this folder is on PYTHONPATH) in every process it starts.
With ``SGLANG_EXT_AUX_DUMP=DIR`` set, the first ``SGLANG_EXT_AUX_DUMP_COUNT`` (8) eager
drafter forwards that fuse the target features of at least ``SGLANG_EXT_AUX_DUMP_MIN_ROWS``
(16) tokens (the draft extend after a prefill) each write ``DIR/aux-<pid>-<n>.pt``:
``input_ids`` and ``positions`` of the drafter batch and ``features``, the concatenated aux
hidden states before fc, as float32 on CPU. The drafter's extend may run inside a CUDA graph
(then its Python forward never runs), so the target side is dumped too: the first
``SGLANG_EXT_AUX_DUMP_COUNT`` eager target prefills (forward mode EXTEND, at least
``MIN_ROWS`` tokens) write ``DIR/target-<pid>-<n>.pt`` with the prompt's ``input_ids`` and the
aux states the target hands to its logits processor (what SGLang passes on to the drafter).
"""

from __future__ import annotations

import itertools
import os


def register() -> None:
    directory = os.environ.get("SGLANG_EXT_AUX_DUMP")
    if not directory:
        return
    import torch

    from sglang_ext.models import llama_eagle3

    limit = int(os.environ.get("SGLANG_EXT_AUX_DUMP_COUNT", "8"))
    # A prompt's draft extend carries one row per prompt token; the extend after a verify
    # carries a few per request: only the former are kept.
    min_rows = int(os.environ.get("SGLANG_EXT_AUX_DUMP_MIN_ROWS", "16"))
    counters = {"aux": itertools.count(), "target": itertools.count()}

    def save(kind: str, tensors) -> None:
        """Write the next dump of this kind, up to ``limit``; ``tensors`` is called only
        then (no copy to the CPU once the limit is reached)."""
        n = next(counters[kind])
        if n < limit:
            os.makedirs(directory, exist_ok=True)
            torch.save(tensors(), os.path.join(directory, f"{kind}-{os.getpid()}-{n}.pt"))

    model_class = llama_eagle3.Eagle3Model
    forward = model_class.forward

    def dumping_forward(self, input_ids, positions, forward_batch, *args, **kwargs):
        features = forward_batch.spec_info.hidden_states
        if (
            not torch.cuda.is_current_stream_capturing()
            and features is not None
            and features.shape[0] >= min_rows
            and features.shape[-1] == self.fusion.target_feature_width
            and not forward_batch.forward_mode.is_decode()
        ):
            save(
                "aux",
                lambda: {
                    "input_ids": input_ids.detach().cpu(),
                    "positions": positions.detach().cpu(),
                    "features": features.detach().float().cpu(),
                    "forward_mode": forward_batch.forward_mode.name,
                },
            )
        return forward(self, input_ids, positions, forward_batch, *args, **kwargs)

    model_class.forward = dumping_forward

    from sglang.srt.layers import logits_processor

    processor = logits_processor.LogitsProcessor
    process = processor.forward

    def dumping_process(self, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs):
        aux = kwargs.get("aux_hidden_states", args[0] if args else None)
        mode = getattr(logits_metadata, "forward_mode", None)
        if (
            aux is not None
            and getattr(mode, "name", None) == "EXTEND"
            and not torch.cuda.is_current_stream_capturing()
        ):
            parts = [aux] if isinstance(aux, torch.Tensor) else list(aux)
            rows, width = parts[0].shape[0], sum(t.shape[-1] for t in parts)
            # the target's aux states are wider than its own hidden state; a drafter's are not
            if rows >= min_rows and width > hidden_states.shape[-1]:
                save(
                    "target",
                    lambda: {
                        "input_ids": input_ids.detach().cpu(),
                        "features": torch.cat(parts, dim=-1).detach().float().cpu(),
                        "forward_mode": mode.name,
                    },
                )
        return process(self, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs)

    processor.forward = dumping_process
