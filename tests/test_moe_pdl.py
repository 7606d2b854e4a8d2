"""The diagnostic switch that launches SGLang's Triton fused MoE without PDL
(sglang_ext.serving.moe_pdl, ``SGLANG_EXT_MOE_PDL=0``)."""

from __future__ import annotations

import importlib
import inspect

import pytest

from sglang_ext.serving import moe_pdl
from tests.plugin_process import run_with_plugin

sglang = pytest.importorskip("sglang")


def skip_without_pdl(module) -> None:
    """0.5.17's fused MoE has no PDL check to rebind (it launches without PDL)."""
    if not hasattr(module, moe_pdl.ATTRIBUTE):
        pytest.skip(f"{moe_pdl.MODULE} has no {moe_pdl.ATTRIBUTE} in SGLang {sglang.__version__}")


@pytest.fixture
def moe_module():
    module = importlib.import_module(moe_pdl.MODULE)
    skip_without_pdl(module)
    original = getattr(module, moe_pdl.ATTRIBUTE)
    yield module
    setattr(module, moe_pdl.ATTRIBUTE, original)


def test_off_by_default_leaves_sglang_alone(monkeypatch, moe_module):
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.delenv(moe_pdl.ENV_VAR, raising=False)
    assert moe_pdl.install() == []
    monkeypatch.setenv(moe_pdl.ENV_VAR, "1")
    assert moe_pdl.install() == []
    assert moe_pdl.TARGET not in HookRegistry._hooks


def test_switch_rebinds_only_the_moe_modules_check(monkeypatch, moe_module):
    from sglang.kernels.jit.utils import arch
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setenv(moe_pdl.ENV_VAR, "0")
    try:
        assert moe_pdl.install() == [moe_pdl.TARGET]
        assert moe_pdl.before_load_model in [
            hook for _, hook, _ in HookRegistry._hooks[moe_pdl.TARGET]
        ]
    finally:
        HookRegistry._hooks.pop(moe_pdl.TARGET, None)
    assert moe_module.is_arch_support_pdl is arch.is_arch_support_pdl  # nothing before the load
    moe_pdl.before_load_model(object())  # what the model process runs as it starts loading
    assert moe_module.is_arch_support_pdl() is False
    # the defining module (and with it every other PDL user) keeps SGLang's own check
    assert arch.is_arch_support_pdl is not moe_module.is_arch_support_pdl


def test_the_moe_launchers_read_the_rebound_name_at_call_time(moe_module):
    """The switch works only while SGLang's launchers look the check up in their module's
    globals when they launch; an upstream move of that call fails here, not on the GPU."""
    for launcher in ("invoke_fused_moe_kernel", "moe_sum_reduce_triton"):
        source = inspect.getsource(getattr(moe_module, launcher))
        assert "is_arch_support_pdl()" in source, launcher
        assert "launch_pdl" in source, launcher


def test_a_value_other_than_0_or_1_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(moe_pdl.ENV_VAR, "off")
    with pytest.raises(ValueError, match=r"SGLANG_EXT_MOE_PDL: expected 0 .* found 'off'"):
        moe_pdl.install()


def test_a_sglang_without_the_check_fails_the_load_naming_it(monkeypatch):
    """Where the MoE module has no PDL check (0.5.17, or an upstream move), the model's load
    stops with the module, the name and the variable; nothing is rebound."""
    module = importlib.import_module(moe_pdl.MODULE)
    monkeypatch.delattr(module, moe_pdl.ATTRIBUTE, raising=False)
    with pytest.raises(AttributeError) as caught:
        moe_pdl.before_load_model(object())
    assert str(caught.value) == (
        f"{moe_pdl.MODULE}.{moe_pdl.ATTRIBUTE}: not found; {moe_pdl.ENV_VAR}=0 cannot apply"
    )
    assert not hasattr(module, moe_pdl.ATTRIBUTE)


def test_the_plugin_applies_it_in_a_fresh_process():
    """What a server process does: the plugin's registration with the switch in its env,
    SGLang's hooks applied, then the model's load, stood in for by a ModelRunner whose own
    load_model is a no-op."""
    skip_without_pdl(importlib.import_module(moe_pdl.MODULE))
    words = run_with_plugin(
        {"SGLANG_EXT_MOE_PDL": "0"},
        "import importlib\nmr.ModelRunner.load_model = lambda self: None\n"
        f"m = importlib.import_module({moe_pdl.MODULE!r})",
        "before = m.is_arch_support_pdl is not None and m.is_arch_support_pdl.__name__\n"
        "mr.ModelRunner.load_model(object.__new__(mr.ModelRunner))\n"
        "print(before, m.is_arch_support_pdl(), targets[-1].endswith('ModelRunner.load_model'))",
    )
    assert words[-3:] == ["is_arch_support_pdl", "False", "True"]
