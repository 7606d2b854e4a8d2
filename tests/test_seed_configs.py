"""The seed's configurations, refused at startup with both widths named: a drafter whose
eagle_config switches the target's capture off (use_aux_hidden_state: false), so the target
hands over its final hidden state alone, as wide as the drafter; and one whose eagle_config
names one aux layer while its fc reads three. Stock SGLang serves both with fc silently
skipped (spec_aux_hidden_state.py reads use_aux_hidden_state; llama_eagle3.py fuses only
when the widths differ)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sglang_ext.cli import doctor
from sglang_ext.drafter.config_fields import DrafterConfigError
from sglang_ext.drafter.speculators_format import load_drafter_spec

sys.path.insert(0, str(Path(__file__).parent / "behaviour"))
from eagle3_behaviour import HIDDEN, write_sglang_drafter  # noqa: E402


@pytest.fixture(scope="module")
def registered(sglang_env):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_ext import plugin

    plugin.register()
    HookRegistry.apply_hooks()
    return plugin


def nocapture_drafter(directory: Path) -> Path:
    write_sglang_drafter(directory)
    config = json.loads((directory / "config.json").read_text())
    config["eagle_config"]["use_aux_hidden_state"] = False
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_spec_reads_use_aux_hidden_state(tmp_path):
    assert load_drafter_spec(write_sglang_drafter(tmp_path / "on")).use_aux_hidden_state
    assert not load_drafter_spec(nocapture_drafter(tmp_path / "off")).use_aux_hidden_state


def test_doctor_names_both_widths_and_predicts_the_silent_skip(tmp_path, target_dir):
    report = doctor.diagnose(nocapture_drafter(tmp_path / "d"), target=target_dir).to_json()
    assert report["verdict"] == "ERROR"
    [error] = [e for e in report["errors"] if "use_aux_hidden_state is false" in e]
    assert f"{HIDDEN} wide" in error and f"3 x {HIDDEN} = {3 * HIDDEN}" in error
    assert "fusion silently skipped" in report["stock_sglang"]["summary"]


def test_plugin_drafter_refuses_at_startup(registered, sglang_env, tmp_path):
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.utils.hf_transformers_utils import get_config

    directory = nocapture_drafter(tmp_path / "d")
    config = get_config(str(directory), trust_remote_code=False)
    cls, _ = ModelRegistry.resolve_model_cls(config.architectures)
    assert cls.__module__.startswith("sglang_ext.")
    with pytest.raises(DrafterConfigError) as info:
        cls(config)
    message = str(info.value)
    assert "use_aux_hidden_state is false" in message
    assert f"{HIDDEN} wide" in message and f"= {3 * HIDDEN}" in message
