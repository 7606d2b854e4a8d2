"""Registration through SGLang's plugin machinery, and the two hooks the plugin installs,
exercised through SGLang's own functions and model classes (on CPU)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest
from builders import sglang_format_drafter

from sglang_ext import compat
from sglang_ext.drafter.config_fields import DrafterConfigError

ARCHS = (
    "LlamaForCausalLMEagle3",
    "Eagle3DraftModel",
    "Eagle3Speculator",
    "Eagle3DeepseekV2ForCausalLM",
)


@pytest.fixture(scope="module")
def registered(sglang_env):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_ext import plugin

    plugin.register()
    HookRegistry.apply_hooks()
    return plugin


def test_entry_point_is_declared_in_sglangs_group():
    eps = {ep.name: ep for ep in entry_points(group="sglang.srt.plugins")}
    assert eps["sglang_ext"].value == "sglang_ext.plugin:register"
    assert callable(eps["sglang_ext"].load())


def test_sglang_loader_finds_the_plugin_and_sglang_plugins_can_exclude_it(monkeypatch):
    from sglang.srt.plugins import load_plugins_by_group

    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    assert "sglang_ext" in load_plugins_by_group("sglang.srt.plugins")
    monkeypatch.setenv("SGLANG_PLUGINS", "some_other_plugin")
    assert "sglang_ext" not in load_plugins_by_group("sglang.srt.plugins")


@pytest.mark.parametrize("arch", ARCHS)
def test_model_registry_returns_plugin_classes(registered, arch):
    from sglang.srt.models.registry import ModelRegistry

    cls, resolved = ModelRegistry.resolve_model_cls([arch])
    assert resolved == arch
    assert cls.__module__.startswith("sglang_ext.models.")


def test_self_check(registered):
    result = registered.self_check()
    assert result["plugin_loaded"] and "sglang_ext" in result["entry_points"]
    assert set(result["architectures"]) == set(ARCHS)


def test_external_model_package_env_also_works():
    code = (
        "from sglang.srt.models.registry import ModelRegistry\n"
        "print(ModelRegistry.resolve_model_cls(['Eagle3DraftModel'])[0].__module__)\n"
        "print(ModelRegistry.resolve_model_cls(['LlamaForCausalLMEagle3'])[0].__module__)\n"
    )
    env = dict(os.environ, SGLANG_EXTERNAL_MODEL_PACKAGE="sglang_ext.models")
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.split()
    assert out[-2:] == ["sglang_ext.models.llama_eagle3"] * 2


def test_a_failing_plugin_fails_the_launch(monkeypatch, sglang_env):
    """SGLang's load_plugins swallows Exceptions; ours must end the process instead."""
    from sglang.srt.models.registry import ModelRegistry

    from sglang_ext import plugin

    def broken(*args, **kwargs):
        raise ImportError("simulated broken install")

    monkeypatch.setattr(ModelRegistry, "register", broken)
    with pytest.raises(SystemExit) as info:
        plugin.register()
    assert "refusing to let SGLang fall back" in str(info.value)
    assert "simulated broken install" in str(info.value)


def test_stock_get_config_rejects_speculators_dirs(sglang_env, drafter):
    """What stock SGLang does with a speculators drafter (the first silent-ish failure)."""
    from sglang.srt.utils.hf_transformers.config import get_config

    # unhooked, however many hooks earlier modules left on it (inspect.unwrap follows them all)
    stock = inspect.unwrap(get_config)
    with pytest.raises(ValueError, match="Should have a `model_type` key"):
        stock(str(drafter("default")[0]), trust_remote_code=False)


def test_hooked_get_config_translates(registered, drafter):
    from sglang.srt.utils.hf_transformers_utils import get_config

    config = get_config(str(drafter("default")[0]), trust_remote_code=False)
    assert config.architectures == ["Eagle3DraftModel"]
    assert config.eagle_config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert config.num_aux_hidden_states == 3
    # trust_remote_code=True must not make it import the drafter's config.py either
    again = get_config(str(drafter("default")[0]), trust_remote_code=True)
    assert again.architectures == ["Eagle3DraftModel"]


def test_sglang_model_config_reads_the_translated_drafter(registered, drafter):
    """SGLang's own ModelConfig (what the draft worker builds) accepts the translation."""
    from sglang.srt.configs.model_config import ModelConfig

    config = ModelConfig(model_path=str(drafter("three_layers")[0]), is_draft_model=True)
    assert config.num_hidden_layers == 3 and config.hidden_size == 64
    assert not config.is_hybrid_swa  # the window is applied by the drafter class instead


def test_hooked_get_config_fails_fast_on_a_bad_checkpoint(registered, drafter, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from sglang_ext.drafter.checkpoint_files import DrafterLoadError

    bad = tmp_path / "bad"
    shutil.copytree(drafter("default")[0], bad)
    tensors = load_file(str(bad / "model.safetensors"))
    tensors.pop("fc.weight")
    save_file(tensors, str(bad / "model.safetensors"))
    from sglang.srt.utils.hf_transformers_utils import get_config

    with pytest.raises(DrafterLoadError, match="model.fc.weight: missing"):
        get_config(str(bad), trust_remote_code=False)


# -- the capture hook, on SGLang's real target classes ------------------------------------


def sglang_target(layers: int, family: str = "llama"):
    """An object carrying SGLang's real `set_eagle3_layers_to_capture` for a target family, a
    real transformers config and SGLang's `model.layers_to_capture` slot. (SGLang's target
    models need resolved parallel/boundary settings that only a server publishes.)"""
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
    from sglang.srt.models.llama import LlamaForCausalLM
    from transformers import DeepseekV3Config, LlamaConfig

    cls, config_cls, model_type = {
        "llama": (LlamaForCausalLM, LlamaConfig, "llama"),
        "deepseek": (DeepseekV2ForCausalLM, DeepseekV3Config, "deepseek_v3"),
    }[family]
    config = config_cls(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    assert config.model_type == model_type
    stub_cls = type(
        f"{cls.__name__}Target",
        (),
        {
            "set_eagle3_layers_to_capture": cls.set_eagle3_layers_to_capture,
            "__module__": cls.__module__,
        },
    )
    stub = stub_cls()
    stub.config, stub.capture_aux_hidden_states = config, False
    stub.pp_group = SimpleNamespace(is_last_rank=True)
    stub.model = SimpleNamespace(layers_to_capture=[])
    return stub


def configure_capture(model, ids):
    from sglang.srt.model_executor.model_runner_components import attention_backend_setup

    attention_backend_setup.configure_aux_hidden_state_capture(
        model=model,
        eagle_use_aux_hidden_state=True,
        eagle_aux_hidden_state_layer_ids=ids,
        dflash_use_aux_hidden_state=False,
        dflash_target_layer_ids=None,
        is_dspark=False,
    )


def serve_with(monkeypatch, draft_dir):
    monkeypatch.setattr(
        compat,
        "server_args",
        lambda: SimpleNamespace(
            speculative_draft_model_path=str(draft_dir), speculative_algorithm="EAGLE3"
        ),
    )


def test_capture_hook_converts_speculators_ids_for_llama(registered, drafter, monkeypatch):
    serve_with(monkeypatch, drafter("default")[0])
    target = sglang_target(6)
    configure_capture(target, [1, 3, 4])  # what SGLang passes from the translated eagle_config
    # speculators id k = state entering layer k; SGLang's llama captures entering id+1
    assert target.model.layers_to_capture == [1, 3, 4]


def test_capture_hook_rejects_collapsing_default_ids(registered, tmp_path, monkeypatch):
    """Stock SGLang 0.5.17, 4-layer target, SGLang-format drafter without aux ids: the first
    request kills the scheduler (mat1 and mat2 shapes cannot be multiplied (4x512 and
    768x256)). With the plugin: a startup error naming the cause."""
    serve_with(monkeypatch, sglang_format_drafter(tmp_path))
    with pytest.raises(DrafterConfigError) as info:
        configure_capture(sglang_target(4), None)
    assert "collapse to 2 distinct layers" in str(info.value)


def test_capture_hook_converts_speculators_ids_for_deepseek(registered, tmp_path, monkeypatch):
    """DeepSeek/Kimi targets add 1 only when the first id is 1 (deepseek_v2.py). The plugin
    calls their method with llama-convention ids (k - 1), which switches capture on, then sets
    the trained layers itself and reads them back: no per-class id rule is involved."""
    from sglang_ext.demo import Variant, build_drafter, write_target

    target_dir = write_target(tmp_path / "t", layers=8)
    for aux in ((2, 4, 5), (3, 5, 6), (1, 3, 4)):
        draft = tmp_path / f"d{aux[0]}"
        build_drafter(draft, target_dir, Variant(aux_ids=aux))
        serve_with(monkeypatch, draft)
        target = sglang_target(8, "deepseek")
        seen = {}
        original = type(target).set_eagle3_layers_to_capture
        type(target).set_eagle3_layers_to_capture = lambda self, ids, _o=original, _s=seen: (
            _s.setdefault("ids", ids),
            _o(self, ids),
        )[1]
        configure_capture(target, list(aux))
        assert seen["ids"] == [k - 1 for k in aux]
        assert target.model.layers_to_capture == list(aux)


def test_capture_rules_match_sglangs_own_methods():
    """Our per-class aux-id rules against SGLang's set_eagle3_layers_to_capture code."""
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
    from sglang.srt.models.llama import LlamaForCausalLM

    from sglang_ext.drafter.aux_capture import captured_layers_from_sglang_ids

    for cls, rule in (
        (LlamaForCausalLM, "plus_one"),
        (DeepseekV2ForCausalLM, "plus_one_if_first_is_one"),
    ):
        for ids in ([1, 3, 5], [2, 4, 6], [0, 2, 3], None):
            stub = SimpleNamespace(
                pp_group=SimpleNamespace(is_last_rank=True),
                config=SimpleNamespace(num_hidden_layers=8),
                model=SimpleNamespace(layers_to_capture=[]),
            )
            cls.set_eagle3_layers_to_capture(stub, ids)
            assert stub.model.layers_to_capture == captured_layers_from_sglang_ids(ids, rule, 8)


def test_self_check_in_a_fresh_process_skips_the_in_tree_models_and_labels_other_plugins():
    """self-check once took 18 s, most of it importing every in-tree SGLang model through
    the registry, and once listed other packages' entry points as if they were its own."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = (
        "import contextlib, io, json, sys\n"
        "from sglang_ext.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    code = main(['self-check'])\n"
        "report = json.loads(out.getvalue())\n"
        "report['mixtral_imported'] = 'sglang.srt.models.mixtral' in sys.modules\n"
        "print(json.dumps({'code': code, **report}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_EXTERNAL_MODEL_PACKAGE"}
    env["PYTHONPATH"] = f"{root}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["code"] == 0 and report["plugin_loaded"] is True
    assert report["entry_points"] == {"sglang_ext": "sglang_ext.plugin:register"}
    assert "sglang_ext" not in report["other_packages_plugins"]
    # what it reports is what the process holds; 0.5.23's registry defers them, 0.5.17's cannot
    assert report["in_tree_models_imported"] is report["mixtral_imported"]
    if compat.version_tuple(report["sglang_version"]) >= (0, 5, 23):
        assert report["mixtral_imported"] is False
    assert all(v.startswith("sglang_ext.") for v in report["architectures"].values())
