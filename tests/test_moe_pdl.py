"""The diagnostic switch that launches SGLang's Triton fused MoE without PDL
(sglang_ext.serving.moe_pdl, ``SGLANG_EXT_MOE_PDL=0``)."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

from sglang_ext.serving import moe_pdl

sglang = pytest.importorskip("sglang")


@pytest.fixture
def moe_module():
    module = importlib.import_module(moe_pdl.MODULE)
    original = getattr(module, moe_pdl.ATTRIBUTE)
    yield module
    setattr(module, moe_pdl.ATTRIBUTE, original)


def test_off_by_default_leaves_sglang_alone(monkeypatch, moe_module):
    monkeypatch.delenv(moe_pdl.ENV_VAR, raising=False)
    before = getattr(moe_module, moe_pdl.ATTRIBUTE)
    assert moe_pdl.install() == []
    assert getattr(moe_module, moe_pdl.ATTRIBUTE) is before
    monkeypatch.setenv(moe_pdl.ENV_VAR, "1")
    assert moe_pdl.install() == []
    assert getattr(moe_module, moe_pdl.ATTRIBUTE) is before


def test_switch_rebinds_only_the_moe_modules_check(monkeypatch, moe_module):
    from sglang.kernels.jit.utils import arch

    monkeypatch.setenv(moe_pdl.ENV_VAR, "0")
    assert moe_pdl.install() == [f"{moe_pdl.MODULE}.is_arch_support_pdl"]
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


def test_the_plugin_applies_it_in_a_fresh_process():
    """What a server process does: the plugin's registration, with the switch in its env."""
    code = (
        "import importlib, os; os.environ['SGLANG_EXT_MOE_PDL'] = '0'\n"
        "from sglang_ext import plugin\n"
        "targets = plugin._register()\n"
        f"m = importlib.import_module({moe_pdl.MODULE!r})\n"
        "print(m.is_arch_support_pdl(), any(t.endswith('is_arch_support_pdl') for t in targets))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["False", "True"]
