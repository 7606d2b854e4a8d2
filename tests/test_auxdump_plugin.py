"""The GPU suite's aux-dump test plugin (tests/gpu/auxdump) on CPU: SGLang finds it through
its dist-info, and on a draft extend it saves what the target-feature check matches against
(input ids = prompt[1:] + the prefill's token, the features before fc)."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest
import torch
from sglang_cpu import forward_batch
from test_fusion import llama_drafter

AUXDUMP = Path(__file__).resolve().parent / "gpu" / "auxdump"


def test_the_plugin_is_an_sglang_entry_point_on_its_folder():
    found = [
        ep
        for dist in importlib.metadata.distributions(path=[str(AUXDUMP)])
        for ep in dist.entry_points
        if ep.group == "sglang.srt.plugins"
    ]
    assert [ep.value for ep in found] == ["sglang_ext_auxdump:register"]


def test_a_draft_extend_is_dumped_and_matches_its_prompt(
    sglang_env, drafter, tmp_path, monkeypatch
):
    from sglang_ext.models import llama_eagle3

    monkeypatch.syspath_prepend(str(AUXDUMP))
    monkeypatch.setenv("SGLANG_EXT_AUX_DUMP", str(tmp_path / "dump"))
    monkeypatch.setattr(llama_eagle3.Eagle3Model, "forward", llama_eagle3.Eagle3Model.forward)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # no CUDA here
    sys.modules.pop("sglang_ext_auxdump", None)
    import sglang_ext_auxdump

    sglang_ext_auxdump.register()
    model = llama_drafter(drafter("default")[0])
    prompt = list(range(3, 23))  # 20 tokens
    ids = torch.tensor(prompt[1:] + [7])  # the draft extend after the prefill
    features = torch.randn(len(prompt), 192)
    with torch.no_grad():
        model.model(ids, torch.arange(len(prompt)), forward_batch("DRAFT_EXTEND_V2", features))
        model.model(ids[:4], torch.arange(4), forward_batch("DRAFT_EXTEND_V2", features[:4]))
    dumps = sorted((tmp_path / "dump").glob("aux-*.pt"))  # the drafter side
    assert len(dumps) == 1  # the 4-row extend (after a verify) is not kept
    saved = torch.load(dumps[0])
    assert saved["input_ids"][: len(prompt) - 1].tolist() == prompt[1:]  # the suite's match
    torch.testing.assert_close(saved["features"], features)
    assert saved["forward_mode"] == "DRAFT_EXTEND_V2"


@pytest.fixture(autouse=True)
def _forget_the_module():
    yield
    sys.modules.pop("sglang_ext_auxdump", None)


def test_the_target_prefill_is_dumped_with_its_prompt(sglang_env, tmp_path, monkeypatch):
    """The target side (the drafter's extend can run inside a CUDA graph, where its Python
    forward never runs): an eager EXTEND whose aux states are wider than the hidden state."""
    from types import SimpleNamespace

    from sglang.srt.layers import logits_processor
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_ext.models import llama_eagle3

    calls = []
    monkeypatch.setattr(
        logits_processor.LogitsProcessor, "forward", lambda self, *a, **k: calls.append(a)
    )
    monkeypatch.setattr(llama_eagle3.Eagle3Model, "forward", llama_eagle3.Eagle3Model.forward)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.syspath_prepend(str(AUXDUMP))
    monkeypatch.setenv("SGLANG_EXT_AUX_DUMP", str(tmp_path / "dump"))
    sys.modules.pop("sglang_ext_auxdump", None)
    import sglang_ext_auxdump

    sglang_ext_auxdump.register()
    forward = logits_processor.LogitsProcessor.forward
    prompt = torch.arange(3, 23)
    hidden = torch.randn(20, 64)
    aux = [torch.randn(20, 64) for _ in range(3)]
    extend = SimpleNamespace(forward_mode=ForwardMode.EXTEND)
    forward(None, prompt, hidden, None, extend, aux_hidden_states=aux)
    forward(None, prompt, hidden, None, extend, aux_hidden_states=[hidden])  # a drafter's
    forward(None, prompt, hidden, None, SimpleNamespace(forward_mode=ForwardMode.DECODE), aux)
    assert len(calls) == 3  # every call reaches SGLang's own forward
    dumps = sorted((tmp_path / "dump").glob("target-*.pt"))
    assert len(dumps) == 1
    saved = torch.load(dumps[0])
    assert saved["input_ids"].tolist() == prompt.tolist()
    torch.testing.assert_close(saved["features"], torch.cat(aux, dim=-1))
