"""The switch that runs SGLang's DeepSeek MoE shared expert on the main stream
(sglang_ext.serving.moe_shared_stream, ``SGLANG_EXT_MOE_SHARED_STREAM=0``)."""

from __future__ import annotations

import inspect

import pytest

from sglang_ext.serving import moe_shared_stream as mss
from tests.plugin_process import run_with_plugin

torch = pytest.importorskip("torch")
sglang = pytest.importorskip("sglang")


STREAM = object()  # stands in for a torch.cuda.Stream


class DualStreamMoE(torch.nn.Module):
    """What the switch looks for: a layer that can fork its shared expert."""

    def __init__(self, stream=STREAM):
        super().__init__()
        self.alt_stream = stream
        self.shared_experts = torch.nn.Linear(2, 2)

    def forward_normal_dual_stream(self):
        raise AssertionError("not called here")


class Target(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)


class Runner:
    def __init__(self, model, draft=False):
        self.model, self.is_draft_worker = model, draft


def test_off_by_default_leaves_sglang_alone(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.delenv(mss.ENV_VAR, raising=False)
    assert mss.install() == []
    monkeypatch.setenv(mss.ENV_VAR, "1")
    assert mss.install() == []
    hooks = [h for _, h, _ in HookRegistry._hooks.get(mss.TARGET, [])]
    assert mss.after_load_model not in hooks


def test_a_value_other_than_0_1_or_high_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(mss.ENV_VAR, "serial")
    with pytest.raises(ValueError, match=r"SGLANG_EXT_MOE_SHARED_STREAM: expected 0 \(the shared "
                                         r"expert on the main stream\), 1 .*, high .*; found "
                                         r"'serial'"):  # fmt: skip
        mss.install()


def test_every_dual_stream_layer_of_the_target_loses_its_second_stream():
    stream = object()
    without_shared = DualStreamMoE(stream)
    without_shared.shared_experts = None  # nothing to fork: left alone
    model = Target([DualStreamMoE(stream), DualStreamMoE(stream), without_shared])
    mss.after_load_model(None, Runner(model))
    assert [m.alt_stream for m in model.layers] == [None, None, stream]


def test_the_drafter_runner_is_left_alone(monkeypatch):
    for value in ("0", "high"):
        monkeypatch.setenv(mss.ENV_VAR, value)
        model = Target([DualStreamMoE()])
        mss.after_load_model(None, Runner(model, draft=True))
        assert model.layers[0].alt_stream is STREAM


class PriorityStream:
    """Stands in for torch.cuda.Stream (no GPU here)."""

    def __init__(self, priority=0):
        self.priority = priority


def test_high_gives_every_dual_stream_layer_one_new_stream_of_the_highest_priority():
    without_shared = DualStreamMoE()
    without_shared.shared_experts = None
    model = Target([DualStreamMoE(), DualStreamMoE(), without_shared])
    made = []

    def make():
        made.append(PriorityStream(-5))
        return made[-1]

    assert mss.prioritize(model, "the target model", make) == 2
    assert len(made) == 1  # one stream for all layers, as SGLang shares its one
    assert [m.alt_stream for m in model.layers] == [made[0], made[0], STREAM]


@pytest.mark.parametrize("value", ["0", "high"])
def test_a_target_without_such_a_layer_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(mss.ENV_VAR, value)
    with pytest.raises(ValueError, match=rf"SGLANG_EXT_MOE_SHARED_STREAM={value}: the target "
                                         r"model \(Target\) has no MoE layer"):  # fmt: skip
        mss.after_load_model(None, Runner(Target([torch.nn.Linear(2, 2)])))


def test_the_highest_priority_is_asked_past_the_range():
    """PyTorch maps a priority past the device's range to its end: the request is below any
    device's highest (CUDA's greatest priority is a small negative number)."""
    src = inspect.getsource(mss.high_priority_stream)
    assert "torch.cuda.Stream(priority=-(2**10))" in src
    assert "mapped to the nearest valid priority" in inspect.getsource(torch.cuda.Stream)


def test_sglang_reads_the_stream_at_call_time():
    """The switch works only while SGLang's MoE layer picks its dual-stream path from
    ``self.alt_stream`` when it runs and its serial path runs the shared expert; an upstream
    move fails here, not on the GPU."""
    from sglang.srt.models.deepseek_v2 import DeepseekV2MoE

    assert "self.alt_stream is not None" in inspect.getsource(DeepseekV2MoE.forward)
    assert "self.forward_normal_dual_stream(" in inspect.getsource(DeepseekV2MoE.forward)
    assert "_forward_shared_experts(" in inspect.getsource(DeepseekV2MoE.forward_normal)


def loads_dual_stream_layers(n: int) -> str:
    """Setup code for run_with_plugin: ModelRunner.load_model stood in for by one that builds
    a model of ``n`` dual-stream layers."""
    return (
        "import torch\n"
        "class L(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.alt_stream = 's'\n"
        "        self.shared_experts = torch.nn.Linear(1, 1)\n"
        "    def forward_normal_dual_stream(self): pass\n"
        "def load(self):\n"
        f"    self.model = torch.nn.Sequential(*(L() for _ in range({n})))\n"
        "mr.ModelRunner.load_model = load"
    )


LOAD_TARGET = "r = object.__new__(mr.ModelRunner); r.is_draft_worker = False\n" + (
    "mr.ModelRunner.load_model(r)\n"
)


def test_the_plugin_applies_it_in_a_fresh_process():
    """What a server process does: the plugin's registration with the switch in its env,
    SGLang's hooks applied, then the target's load, stood in for by a ModelRunner whose own
    load_model builds a model with one dual-stream layer."""
    words = run_with_plugin(
        {"SGLANG_EXT_MOE_SHARED_STREAM": "0"},
        loads_dual_stream_layers(1),
        LOAD_TARGET
        + "print(r.model[0].alt_stream, targets[-1].endswith('ModelRunner.load_model'))",
    )
    assert words[-2:] == ["None", "True"]


def test_high_applies_in_a_fresh_process():
    """The same with =high: one stream for both layers, made with the priority asked (a
    stand-in stream here: no GPU), clamped as PyTorch clamps it."""
    words = run_with_plugin(
        {"SGLANG_EXT_MOE_SHARED_STREAM": "high"},
        "import torch\n"
        "class S:\n"
        "    def __init__(self, priority=0): self.priority = max(priority, -5)\n"
        "torch.cuda.Stream = S\n" + loads_dual_stream_layers(2),
        LOAD_TARGET + "a, b = (m.alt_stream for m in r.model)\n"
        "print(a is b, a.priority, targets[-1].endswith('ModelRunner.load_model'))",
    )
    assert words[-3:] == ["True", "-5", "True"]
