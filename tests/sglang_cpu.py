"""SGLang's drafter classes on CPU, without a server.

A real SGLang server cannot start on a CPU-only machine (sgl_kernel needs libcuda), and its
attention needs a ForwardBatch and a backend, none of which runs on CPU. These helpers bring up
just enough of SGLang (server args, a one-rank gloo process group) to build its model classes,
whose norms, linear layers, rotary embedding and MLP run on CPU in fp32, and replace each
RadixAttention with `ReferenceAttention`, a plain causal attention with SGLang's sliding-window
convention. The full path, with SGLang's real attention backends, is covered by tests/gpu/.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

import torch
from torch import nn

_READY = False


def init_sglang_cpu(model_path: str) -> None:
    """`model_path`: any model directory with a config.json (ServerArgs reads it)."""
    global _READY
    if _READY:
        return
    from sglang.srt import runtime_context
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.layers.rotary_embedding import base as rotary_base
    from sglang.srt.server_args import ServerArgs

    rotary_base._is_cpu = True  # otherwise SGLang's rotary embedding imports vllm
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    runtime_context.get_context().set_server_args(ServerArgs(model_path=model_path, device="cpu"))
    init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{port}",
    )
    parallel = runtime_context.get_parallel()
    if hasattr(type(parallel), "override_permanently"):  # 0.5.23; 0.5.17 reads the groups
        parallel.override_permanently(tp_rank=0, pp_rank=0)
    initialize_model_parallel(backend="gloo")
    _READY = True


class ReferenceAttention(nn.Module):
    """Causal (optionally windowed) attention over one sequence, standing in for RadixAttention.

    SGLang's window convention: a query attends to keys at distance <= sliding_window_size
    (``window_left``); -1 or None means full attention.
    """

    def __init__(self, radix):
        super().__init__()
        self.num_heads = radix.tp_q_head_num
        self.num_kv_heads = radix.tp_k_head_num
        self.head_dim = radix.head_dim
        self.scaling = radix.scaling
        self.sliding_window_size = radix.sliding_window_size

    def forward(self, q, k, v, forward_batch, **_):
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim).transpose(0, 1)
        k = k.view(t, self.num_kv_heads, self.head_dim).transpose(0, 1)
        v = v.view(t, self.num_kv_heads, self.head_dim).transpose(0, 1)
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
        i = torch.arange(t)[:, None]
        j = torch.arange(t)[None, :]
        allowed = j <= i
        window = self.sliding_window_size
        if window is not None and window >= 0:
            allowed = allowed & (i - j <= window)
        scores = (q @ k.transpose(-1, -2)) * self.scaling
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return out.transpose(0, 1).reshape(t, self.num_heads * self.head_dim)


def use_reference_attention(model) -> None:
    for layer in model.model.layers:
        layer.self_attn.attn = ReferenceAttention(layer.self_attn.attn)


def forward_batch(mode: str, hidden_states: torch.Tensor):
    """The fields of a ForwardBatch that the drafter's own forward reads (attention is the
    ReferenceAttention above, which reads none)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(
        forward_mode=getattr(ForwardMode, mode),
        spec_info=SimpleNamespace(hidden_states=hidden_states),
        mm_input_embeds=None,
        contains_mm_inputs=lambda: False,
    )
