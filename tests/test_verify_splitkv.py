"""The opt-in split-KV verify hook (sglang_ext.serving.verify_splitkv) and the kernel it enables.

The kernel is SGLang's own; what we check here is that it computes the same attention as the
kernel it replaces. Both run under Triton's interpreter on CPU, in a subprocess, because
``TRITON_INTERPRET`` must be set before the kernels are defined."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from sglang_ext.serving import verify_splitkv

COMPARE = textwrap.dedent(
    """
    import json, os
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang.kernels.ops.attention.verify_splitkv import verify_splitkv_fwd

    torch.manual_seed(0)
    hq, hkv, d, L = 8, 2, 128, 6          # GQA 4 and head_dim 128 as in the 8B target
    prefixes = [100, 37]                  # two requests with different cached lengths
    bs, n = len(prefixes), sum(prefixes) + 10
    k_buf, v_buf = torch.randn(n, hkv, d), torch.randn(n, hkv, d)
    q, k, v = torch.randn(bs * L, hq, d), torch.randn(bs * L, hkv, d), torch.randn(bs * L, hkv, d)
    qo_indptr = torch.arange(0, bs * L + 1, L, dtype=torch.int32)
    kv_indptr = torch.tensor([0, prefixes[0], sum(prefixes)], dtype=torch.int32)
    kv_indices = torch.randperm(n)[: sum(prefixes)].to(torch.int64)
    scale = d ** -0.5
    chain = [torch.cat([torch.ones(L, p, dtype=torch.bool),
                        torch.ones(L, L, dtype=torch.bool).tril()], 1) for p in prefixes]
    mask = torch.cat([m.reshape(-1) for m in chain])
    mask_indptr = torch.tensor([0, chain[0].numel(), mask.numel()], dtype=torch.int64)

    split, extend = torch.zeros_like(q), torch.zeros_like(q)
    ran = verify_splitkv_fwd(q, k, v, split, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
                             None, True, None, L, 1.0, 1.0, scale)
    extend_attention_fwd(q, k, v, extend, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
                         mask, True, mask_indptr, L, 1.0, 1.0, scale)
    ref = torch.zeros_like(q)
    for b, p in enumerate(prefixes):
        idx = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
        keys = torch.cat([k_buf[idx], k[b * L:(b + 1) * L]])
        values = torch.cat([v_buf[idx], v[b * L:(b + 1) * L]])
        for h in range(hq):
            g = h // (hq // hkv)
            s = (q[b * L:(b + 1) * L, h] @ keys[:, g].T * scale).masked_fill(~chain[b], -1e30)
            ref[b * L:(b + 1) * L, h] = s.softmax(-1) @ values[:, g]
    print(json.dumps({"ran": bool(ran), "scale": ref.abs().max().item(),
                      "split_vs_ref": (split - ref).abs().max().item(),
                      "split_vs_extend": (split - extend).abs().max().item(),
                      "extend_vs_ref": (extend - ref).abs().max().item()}))
    """
)


def test_split_kv_verify_matches_the_extend_kernel_and_a_reference():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", COMPARE], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ran"] is True  # can_handle accepted the chain case
    assert out["scale"] > 0.1
    assert out["split_vs_ref"] < 1e-5
    assert out["extend_vs_ref"] < 1e-5
    assert out["split_vs_extend"] < 1e-5


def test_hook_enables_split_kv_for_chains_only():
    chain = SimpleNamespace(topk=1, use_verify_splitkv=False)
    tree = SimpleNamespace(topk=4, use_verify_splitkv=False)
    verify_splitkv.after_triton_backend_init(None, chain)
    verify_splitkv.after_triton_backend_init(None, tree)
    assert chain.use_verify_splitkv is True
    assert tree.use_verify_splitkv is False


def test_sglang_switch_off_wins(monkeypatch):
    monkeypatch.setenv("SGLANG_ENABLE_SPLITKV_VERIFY", "0")
    chain = SimpleNamespace(topk=1, use_verify_splitkv=False)
    verify_splitkv.after_triton_backend_init(None, chain)
    assert chain.use_verify_splitkv is False


def test_install_is_opt_in_and_targets_the_installed_backend(monkeypatch):
    registered = []
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setattr(HookRegistry, "register", lambda *a: registered.append(a))
    monkeypatch.delenv(verify_splitkv.ENV_VAR, raising=False)
    assert verify_splitkv.install() == [] and registered == []
    monkeypatch.setenv(verify_splitkv.ENV_VAR, "1")
    assert verify_splitkv.install() == [verify_splitkv.TARGET]
    assert registered[0][0] == verify_splitkv.TARGET
    assert callable(pkgutil.resolve_name(verify_splitkv.TARGET))
    with pytest.raises(AttributeError):
        pkgutil.resolve_name(verify_splitkv.TARGET.replace("TritonAttnBackend", "NoBackend"))
