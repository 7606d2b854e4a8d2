"""The switch that moves SGLang's DeepSeek MoE shared expert (sglang_ext.serving.moe_shared_stream):
on the main stream (``SGLANG_EXT_MOE_SHARED_STREAM=0``), or forked and joined before the routed
up-projection (``=join``)."""

from __future__ import annotations

import contextlib
import inspect
import types

import pytest

from sglang_ext.serving import moe_shared_stream as mss
from tests.plugin_process import run_with_plugin

torch = pytest.importorskip("torch")
sglang = pytest.importorskip("sglang")


STREAM = object()  # stands in for a torch.cuda.Stream


class Experts(torch.nn.Module):
    def __init__(self, inplace=True):
        super().__init__()
        self.moe_runner_config = type("Config", (), {"inplace": inplace})()


class DualStreamMoE(torch.nn.Module):
    """What the switch looks for: a layer that can fork its shared expert."""

    def __init__(self, stream=STREAM, inplace=True):
        super().__init__()
        self.alt_stream = stream
        self.shared_experts = torch.nn.Linear(2, 2)
        self.experts = Experts(inplace)
        self._fuse_shared_experts_inside_sbo = False
        self.calls = []

    def forward_normal_dual_stream(self):
        raise AssertionError("not called here")

    def _forward_shared_experts(self, hidden):
        self.calls.append(("shared", hidden))
        return hidden + 1


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


def test_a_value_other_than_0_1_or_join_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(mss.ENV_VAR, "serial")
    with pytest.raises(ValueError, match=r"SGLANG_EXT_MOE_SHARED_STREAM: expected 0 \(the shared "
                                         r"expert on the main stream\), 1 .*, join .*; found "
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
    for value in ("0", "join"):
        monkeypatch.setenv(mss.ENV_VAR, value)
        model = Target([DualStreamMoE()])
        mss.after_load_model(None, Runner(model, draft=True))
        assert model.layers[0].alt_stream is STREAM


class FakeStream:
    """Stands in for torch.cuda.Stream (no GPU here): its waits go to the shared log."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_stream(self, other):
        self.log.append(("wait", self.name, other.name))


class FakeCuda:
    """Stands in for torch.cuda: Stream(), current_stream() and the stream() context."""

    def __init__(self):
        self.log, self.made = [], 0
        self.stack = [FakeStream(self.log, "main")]

    def Stream(self):  # noqa: N802 (torch.cuda's name)
        self.made += 1
        return FakeStream(self.log, f"side{self.made}")

    def current_stream(self):
        return self.stack[-1]

    @contextlib.contextmanager
    def stream(self, s):
        self.stack.append(s)
        yield
        self.stack.pop()


def joined_target(layers=2, capturing=True):
    """A target of dual-stream layers under =join, with a stand-in align module; each layer's
    shared expert logs the stream it ran on."""
    cuda = FakeCuda()

    def align(ids):
        cuda.log.append(("align", cuda.current_stream().name))
        return ids

    module = types.SimpleNamespace(moe_align_block_size=align)
    model = Target([DualStreamMoE() for _ in range(layers)])
    for layer in model.layers:
        original = layer._forward_shared_experts

        def shared(hidden, original=original):
            cuda.log.append(("shared", cuda.current_stream().name))
            return original(hidden)

        layer._forward_shared_experts = shared
    assert mss.join(model, "the target model", cuda, module) == layers
    fork = module.moe_align_block_size.sglang_ext_join
    fork.capturing = lambda: capturing
    return model, module, cuda


def test_join_forks_the_shared_expert_and_joins_it_after_the_alignment():
    model, module, cuda = joined_target()
    assert [m.alt_stream for m in model.layers] == [None, None]  # SGLang's serial path
    for layer in model.layers:
        assert layer._forward_shared_experts(1) == 2  # the output as computed
        assert module.moe_align_block_size("ids") == "ids"
    assert cuda.made == 1  # one second stream for every layer
    assert cuda.log == [
        ("wait", "side1", "main"), ("shared", "side1"),  # forked from the main stream
        ("align", "main"), ("wait", "main", "side1"),  # joined before the up-projection
    ] * 2  # fmt: skip


def test_join_runs_the_shared_expert_in_line_outside_a_full_graph_capture():
    model, module, cuda = joined_target(capturing=False)
    assert model.layers[0]._forward_shared_experts(1) == 2
    assert module.moe_align_block_size("ids") == "ids"
    assert cuda.log == [("shared", "main"), ("align", "main")]


def test_a_fork_no_alignment_joined_stops_the_capture_by_name():
    """Another MoE runner never calls the rebound alignment: the next layer's fork, at capture
    time, says so rather than serving an unjoined stream."""
    model, _, _ = joined_target()
    model.layers[0]._forward_shared_experts(1)
    with pytest.raises(RuntimeError, match=r"=join: the shared expert forked in layer 0 was "
                                           r"never joined: its routed experts did not reach "
                                           r"sglang\.srt\.layers\.moe\.moe_runner\.triton_utils"
                                           r"\.fused_moe\.moe_align_block_size"):  # fmt: skip
        model.layers[1]._forward_shared_experts(1)


def test_a_second_target_load_reuses_the_one_fork():
    cuda = FakeCuda()
    module = types.SimpleNamespace(moe_align_block_size=lambda ids: ids)
    mss.join(Target([DualStreamMoE()]), "the target model", cuda, module)
    first = module.moe_align_block_size
    mss.join(Target([DualStreamMoE()]), "the target model", cuda, module)
    assert module.moe_align_block_size is first and cuda.made == 1


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda m: setattr(m.experts.moe_runner_config, "inplace", False),
         r"experts\.moe_runner_config\.inplace expected True .*found False"),
        (lambda m: setattr(m, "_fuse_shared_experts_inside_sbo", True),
         r"_fuse_shared_experts_inside_sbo expected False, found True"),
    ],
)  # fmt: skip
def test_join_refuses_a_layer_whose_shared_expert_would_not_run_first(change, field):
    layer = DualStreamMoE()
    change(layer)
    module = types.SimpleNamespace(moe_align_block_size=lambda ids: ids)
    with pytest.raises(ValueError, match=rf"=join: MoE layer 1 \(DualStreamMoE\): {field}"):
        mss.join(Target([DualStreamMoE(), layer]), "the target model", FakeCuda(), module)
    assert not hasattr(module.moe_align_block_size, "sglang_ext_join")  # nothing changed

@pytest.mark.parametrize("value", ["0", "join"])
def test_a_target_without_such_a_layer_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(mss.ENV_VAR, value)
    with pytest.raises(ValueError, match=rf"SGLANG_EXT_MOE_SHARED_STREAM={value}: the target "
                                         r"model \(Target\) has no MoE layer"):  # fmt: skip
        mss.after_load_model(None, Runner(Target([torch.nn.Linear(2, 2)])))


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
        "        self.experts = torch.nn.Module()\n"
        "        self.experts.moe_runner_config = type('C', (), {'inplace': True})()\n"
        "    def forward_normal_dual_stream(self): pass\n"
        "    def _forward_shared_experts(self, h): return h\n"
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


def test_join_applies_in_a_fresh_process():
    """The same with =join: both layers on SGLang's serial path, their shared expert wrapped,
    and the triton MoE runner's alignment rebound once (a stand-in stream here: no GPU)."""
    words = run_with_plugin(
        {"SGLANG_EXT_MOE_SHARED_STREAM": "join"},
        "import torch\n"
        "torch.cuda.Stream = lambda: 'side'\n" + loads_dual_stream_layers(2),
        LOAD_TARGET + "import importlib\n"
        "fm = importlib.import_module('sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe')\n"
        "fork = fm.moe_align_block_size.sglang_ext_join\n"
        "print([m.alt_stream for m in r.model] == [None, None], fork.stream,\n"
        "      all(m._forward_shared_experts.__qualname__.endswith('forked') for m in r.model),\n"
        "      targets[-2].endswith('ModelRunner.load_model'))",
    )
    assert words[-4:] == ["True", "side", "True", "True"]


def test_sglang_joins_where_the_switch_expects():
    """=join holds only while SGLang's serial path calls the shared expert before the router
    and the routed experts, and its triton runner aligns the routed tokens through the name it
    imported, before the up-projection; an upstream move fails here, not on the GPU."""
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe
    from sglang.srt.models.deepseek_v2 import DeepseekV2MoE

    normal = inspect.getsource(DeepseekV2MoE.forward_normal)
    assert normal.index("self._forward_shared_experts(") < normal.index("self.gate(")
    assert normal.index("self.gate(") < normal.index("self.experts(")
    from sglang.srt.layers.moe.moe_runner import triton as triton_runner

    runner = inspect.getsource(fused_moe)
    assert "from .moe_align_block_size import moe_align_block_size" in runner
    assert runner.index("= moe_align_block_size(") < runner.index("invoke_fused_moe_kernel(\n")
    # both of the runner's ways in align there: its pre-permute and fused_experts
    assert "= moe_align_block_size(" in inspect.getsource(fused_moe._prepare_fused_moe_run)
    assert "_prepare_fused_moe_run(" in inspect.getsource(fused_moe.fused_experts_impl)
    assert "_prepare_fused_moe_run(" in inspect.getsource(
        triton_runner.pre_permute_standard_to_triton
    )
    assert mss.capturing() is False  # its two imports resolve; nothing is being captured here


def test_join_reports_the_forks_its_graphs_captured(caplog):
    model, module, _ = joined_target()
    for layer in model.layers:
        layer._forward_shared_experts(1)
        module.moe_align_block_size("ids")
    with caplog.at_level("INFO", logger=mss.logger.name):
        assert mss.after_init_cuda_graphs(None, Runner(model), module=module) is None
    assert "2 shared-expert forks captured in the target's CUDA graphs" in caplog.text


def test_join_with_no_fork_captured_is_refused_by_name():
    """--disable-cuda-graph, say: the shared expert would run in line, as =0, without a word."""
    model, module, _ = joined_target()
    refusal = r"=join: the target's CUDA graphs captured no MoE layer's shared expert .*; set 0"
    with pytest.raises(ValueError, match=refusal):
        mss.after_init_cuda_graphs(None, Runner(model), module=module)
    # the drafter's runner, and a call that defers the decode graphs, are not asked
    assert mss.after_init_cuda_graphs(None, Runner(model, draft=True), module=module) is None
    assert (
        mss.after_init_cuda_graphs(
            None, Runner(model), capture_decode_cuda_graph=False, module=module
        )
        is None
    )


def test_join_refuses_a_server_whose_graphs_captured_no_fork_in_a_fresh_process():
    """The plugin's second hook in a server process: ModelRunner.init_cuda_graphs stood in for
    by one that captures nothing (as --disable-cuda-graph does) stops the launch by name."""
    words = run_with_plugin(
        {"SGLANG_EXT_MOE_SHARED_STREAM": "join"},
        "import torch\n"
        "torch.cuda.Stream = lambda: 'side'\n"
        "mr.ModelRunner.init_cuda_graphs = lambda self, capture_decode_cuda_graph=True: None\n"
        + loads_dual_stream_layers(2),
        LOAD_TARGET + "try:\n"
        "    r.init_cuda_graphs()\n"
        "except ValueError as e:\n"
        "    print('refused:', 'captured no MoE' in str(e))\n"
        "print(sorted(t.rsplit('.', 1)[-1] for t in targets[-2:]))",
    )
    assert words[-3:] == ["True", "['init_cuda_graphs',", "'load_model']"]
