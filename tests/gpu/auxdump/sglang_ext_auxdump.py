"""GPU-suite test plugin (never shipped): saves the target features that an sglang_ext
EAGLE-3 drafter receives, so a test can hold SGLang's captured hidden states against the HF
target's on the same prompt.

SGLang loads it like any plugin (entry point group ``sglang.srt.plugins``, found through the
dist-info beside this file when this folder is on PYTHONPATH) in every process it starts.
With ``SGLANG_EXT_AUX_DUMP=DIR`` set, the first ``SGLANG_EXT_AUX_DUMP_COUNT`` (8) eager
drafter forwards that fuse the target features of at least ``SGLANG_EXT_AUX_DUMP_MIN_ROWS``
(16) tokens (the draft extend after a prefill) each write ``DIR/aux-<pid>-<n>.pt``:
``input_ids`` and ``positions`` of the drafter batch and ``features``, the concatenated aux
hidden states before fc, as float32 on CPU.
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
    counter = itertools.count()
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
            n = next(counter)
            if n < limit:
                os.makedirs(directory, exist_ok=True)
                torch.save(
                    {
                        "input_ids": input_ids.detach().cpu(),
                        "positions": positions.detach().cpu(),
                        "features": features.detach().float().cpu(),
                        "forward_mode": str(forward_batch.forward_mode),
                    },
                    os.path.join(directory, f"aux-{os.getpid()}-{n}.pt"),
                )
        return forward(self, input_ids, positions, forward_batch, *args, **kwargs)

    model_class.forward = dumping_forward
