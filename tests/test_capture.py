"""The target captures exactly the layers the drafter was trained on, checked before serving,
on SGLang's real target classes built on CPU (tiny configs), through the plugin's hook around
SGLang's `configure_aux_hidden_state_capture`.

The plugin calls the target's own `set_eagle3_layers_to_capture` (which switches capture on and
may set per-layer flags), then sets the planned list where the class keeps it and reads it
back: a class whose id rule differs from llama's (the deepseek family, GLM-5/GLM-4.7-Flash,
gpt_oss) needs no entry in a rule table, and a capture that cannot be read back is an error.
"""

from __future__ import annotations

import importlib
import json
from types import SimpleNamespace

import pytest
import torch
from builders import sglang_format_drafter
from mla_drafters import GEOMETRY

from sglang_ext import compat
from sglang_ext.demo import Variant, build_drafter, write_target
from sglang_ext.drafter.config_fields import DrafterConfigError

# The tiny MLA drafter's geometry as a target: any layer count, plus MoE.
MLA = {k: v for k, v in GEOMETRY.items() if k != "num_hidden_layers"} | dict(
    moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1
)

# architecture -> (SGLang module, transformers config class, extra config fields)
TARGETS = {
    "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV3Config", MLA),
    # previously matched by neither the module nor the model_type table
    "GlmMoeDsaForCausalLM": ("glm4_moe", "GlmMoeDsaConfig", MLA),
    "Glm4MoeLiteForCausalLM": ("glm4_moe_lite", "Glm4MoeLiteConfig", MLA),
    "MistralLarge3ForCausalLM": ("mistral_large_3", "DeepseekV3Config", MLA),
    "GptOssForCausalLM": (
        "gpt_oss",
        "GptOssConfig",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            swiglu_limit=7.0,  # as published configs; transformers 5.12 has no default
            max_position_embeddings=4096,
        ),
    ),
    "LlamaForCausalLM": (
        "llama",
        "LlamaConfig",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        ),
    ),
    "Qwen3MoeForCausalLM": (
        "qwen3_moe",
        "Qwen3MoeConfig",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            max_position_embeddings=512,
        ),
    ),
}


@pytest.fixture(scope="module")
def targets(sglang_env):
    """target(architecture, layers) -> SGLang's real target model, built on CPU.

    A server resolves the boundary reduction and the MoE ranks before it builds a target
    (0.5.23: arg_groups/boundary_reduction.py, the rank bundle); state them for this process.
    """
    from sglang.srt import runtime_context

    context = runtime_context.get_context()
    # 0.5.23 has the leaf; 0.5.17's exec.comm has none (its AttributeError names the namespace)
    previous = None
    if hasattr(runtime_context, "get_exec"):
        previous = getattr(runtime_context.get_exec().comm, "boundary_reduction", None)
    if previous is not None:
        context.override("sglang_ext tests", boundary_reduction="ar")
        parallel = runtime_context.get_parallel()
        parallel.override_permanently(moe_ep_rank=0, moe_tp_rank=0)
    from sglang.srt.layers import dp_attention

    dp_state = {k: getattr(dp_attention, k, None) for k in ("_ATTN_DP_RANK", "_ATTN_DP_SIZE")}
    if "_ATTN_DP_RANK" in vars(dp_attention) and dp_state["_ATTN_DP_RANK"] is None:  # 0.5.17
        # its DeepSeek layers ask the module for the attention-DP rank, set by
        # initialize_dp_attention at startup; one rank without DP attention is 0 of 1
        dp_attention._ATTN_DP_RANK, dp_attention._ATTN_DP_SIZE = 0, 1

    def build(architecture: str, layers: int):
        import transformers

        module, config_name, fields = TARGETS[architecture]
        if fields is MLA:  # dense layers only: SGLang's MoE kernels do not run on CPU
            fields = dict(fields, first_k_dense_replace=layers)
        config = getattr(transformers, config_name)(num_hidden_layers=layers, **fields)
        config.architectures = [architecture]
        if fields.get("first_k_dense_replace") and not hasattr(config, "moe_layer_freq"):
            config.moe_layer_freq = 1
        cls = getattr(importlib.import_module(f"sglang.srt.models.{module}"), architecture)
        return cls(config)

    yield build
    if previous is not None:
        context.override("sglang_ext tests", boundary_reduction=previous)
    for name, value in dp_state.items():
        if name in vars(dp_attention):
            setattr(dp_attention, name, value)


def configure_capture(model, ids):
    """SGLang's own startup step, with the plugin's hook around it (as HookRegistry applies it;
    registration itself is tested in test_plugin.py, and registering here would leave SGLang
    patched for the modules that test its stock behaviour)."""
    import inspect

    from sglang.srt.model_executor.model_runner_components import attention_backend_setup

    from sglang_ext.plugin import configure_capture_hook

    configure_capture_hook(
        inspect.unwrap(attention_backend_setup.configure_aux_hidden_state_capture),
        model=model,
        eagle_use_aux_hidden_state=True,
        eagle_aux_hidden_state_layer_ids=ids,
        dflash_use_aux_hidden_state=False,
        dflash_target_layer_ids=None,
        is_dspark=False,
    )


@pytest.fixture
def serve(monkeypatch):
    def with_drafter(draft_dir):
        monkeypatch.setattr(
            compat,
            "server_args",
            lambda: SimpleNamespace(
                speculative_draft_model_path=str(draft_dir), speculative_algorithm="EAGLE3"
            ),
        )

    return with_drafter


@pytest.fixture(scope="module")
def speculators_drafter(tmp_path_factory):
    """speculators_drafter(aux_ids, target_layers) -> a speculators drafter directory."""
    cache = {}

    def get(aux_ids: tuple[int, ...], layers: int):
        key = (aux_ids, layers)
        if key not in cache:
            root = tmp_path_factory.mktemp("capture")
            target_dir = write_target(root / "target", layers=layers)
            build_drafter(root / "drafter", target_dir, Variant(aux_ids=aux_ids))
            cache[key] = root / "drafter"
        return cache[key]

    return get


@pytest.mark.parametrize(
    "architecture", ["DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM", "Glm4MoeLiteForCausalLM"]
)
@pytest.mark.parametrize("aux", [(3, 5, 6), (2, 4, 5), (1, 3, 4), (0, 3, 6)])
def test_deepseek_style_targets_capture_the_trained_layers(
    targets, serve, speculators_drafter, architecture, aux
):
    """Their class adds 1 only when the first id is 1 (deepseek_v2.py, glm4_moe_lite.py:
    set_eagle3_layers_to_capture). GLM-5 (GlmMoeDsa, a DeepseekV2 subclass in glm4_moe.py) and
    GLM-4.7-Flash (glm4_moe_lite) matched neither rule table before and were refused."""
    serve(speculators_drafter(aux, 8))
    target = targets(architecture, 8)
    configure_capture(target, list(aux))  # speculators ids, as the translated config has them
    assert target.capture_aux_hidden_states is True
    assert target.model.layers_to_capture == list(aux)


def test_gpt_oss_captures_the_final_state(targets, serve, speculators_drafter):
    """gpt_oss.py's forward captures boundary L (after its last decoder layer) when L is in
    `layers_to_capture`; speculators id L names that state. Refused for every target before."""
    serve(speculators_drafter((1, 2, 4), 4))
    target = targets("GptOssForCausalLM", 4)
    configure_capture(target, [1, 2, 4])
    assert target.model.layers_to_capture == [1, 2, 4]


def test_the_final_state_is_refused_where_the_forward_never_captures_it(
    targets, serve, speculators_drafter
):
    serve(speculators_drafter((1, 2, 4), 4))
    with pytest.raises(DrafterConfigError, match="final hidden state") as info:
        configure_capture(targets("LlamaForCausalLM", 4), [1, 2, 4])
    assert "LlamaForCausalLM" in str(info.value)


def test_per_layer_flags_follow_the_plan(targets, serve, speculators_drafter):
    """qwen3_moe.py's forward reads a per-layer `_is_layer_to_capture` flag, not the list."""
    serve(speculators_drafter((1, 3, 4), 6))
    target = targets("Qwen3MoeForCausalLM", 6)
    configure_capture(target, [1, 3, 4])
    flagged = [i for i, layer in enumerate(target.model.layers)
               if getattr(layer, "_is_layer_to_capture", False)]  # fmt: skip
    assert flagged == [1, 3, 4] and target.model.layers_to_capture == [1, 3, 4]


def target_config(directory, architecture, layers, model_type):
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "num_hidden_layers": layers,
        "hidden_size": 64,
        "vocab_size": 256,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_sglang_format_ids_follow_the_targets_own_rule(targets, serve, tmp_path):
    """SGLang-format ids are in SGLang's convention for the target's class: what its own method
    derives is served (as stock does), and only checked. GlmMoeDsa was held to llama's rule.
    doctor predicts the same layers from the target's config.json."""
    from sglang_ext.cli.doctor import diagnose

    draft = sglang_format_drafter(tmp_path / "d", [3, 5, 6])
    serve(draft)
    target = targets("GlmMoeDsaForCausalLM", 8)
    configure_capture(target, [3, 5, 6])
    assert target.model.layers_to_capture == [3, 5, 6]
    config = target_config(tmp_path / "t", "GlmMoeDsaForCausalLM", 8, "glm_moe_dsa")
    assert diagnose(draft, config).aux_layers["captured_layers"] == [3, 5, 6]


def test_one_capture_rule_for_doctor_convert_and_the_spec(speculators_drafter, tmp_path):
    """The target's capture rule is resolved once, on TargetInfo (architecture first, then
    model_type): doctor's SGLang ids and convert's come from that rule, not from a second
    lookup by model_type alone, which gave llama's +1 rule to a DeepSeek-family class whose
    model_type is not in the table (here MistralLarge3 with an unlisted model_type)."""
    from sglang_ext.cli.convert import convert
    from sglang_ext.cli.doctor import diagnose
    from sglang_ext.drafter.aux_capture import TargetInfo

    draft = speculators_drafter((3, 5, 6), 8)
    config = target_config(tmp_path / "t", "MistralLarge3ForCausalLM", 8, "mistral_large_3_text")
    assert TargetInfo.from_path(config).capture_rule == "plus_one_if_first_is_one"
    aux = diagnose(draft, config).aux_layers
    assert aux["capture_rule"] == "plus_one_if_first_is_one"
    # deepseek_v2's rule keeps ids not starting with 1 as given: [3, 5, 6], not [2, 4, 5]
    assert aux["captured_layers"] == [3, 5, 6] and aux["sglang_ids"] == [3, 5, 6]
    convert(draft, tmp_path / "converted", target=config, force=True)
    written = json.loads((tmp_path / "converted" / "config.json").read_text())
    ids = written.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
    assert ids == [3, 5, 6], written


@pytest.mark.parametrize("architecture", sorted(set(TARGETS) - {"Qwen3MoeForCausalLM"}))
def test_doctors_id_rules_are_the_classes_own(targets, architecture):
    """doctor (no SGLang import) predicts SGLang-format ids with a rule table; each rule against
    the real class's set_eagle3_layers_to_capture."""
    from sglang_ext.drafter.aux_capture import capture_rule_for, captured_layers_from_sglang_ids

    layers = 8
    rule = capture_rule_for(architecture=architecture)
    for ids in ([1, 3, 5], [2, 4, 6], [0, 2, 3], [3, 5, 8], None):
        target = targets(architecture, layers)
        type(target).set_eagle3_layers_to_capture(target, ids)
        expected = captured_layers_from_sglang_ids(ids, rule, layers)
        assert target.model.layers_to_capture == expected, (architecture, ids)


def test_doctor_predicts_the_final_state_capture(speculators_drafter, tmp_path):
    from sglang_ext.cli.doctor import diagnose

    draft = speculators_drafter((1, 2, 4), 4)
    gpt_oss = diagnose(draft, target_config(tmp_path / "g", "GptOssForCausalLM", 4, "gpt_oss"))
    assert gpt_oss.aux_layers["captured_layers"] == [1, 2, 4]
    assert not gpt_oss.errors
    llama = diagnose(draft, target_config(tmp_path / "l", "LlamaForCausalLM", 4, "llama"))
    assert any("final hidden state" in error for error in llama.errors)


def test_sglang_format_ids_that_collapse_are_refused(targets, serve, tmp_path):
    serve(sglang_format_drafter(tmp_path / "d", [0, 0, 3]))
    with pytest.raises(DrafterConfigError, match="collapse to 2 distinct layers"):
        configure_capture(targets("DeepseekV3ForCausalLM", 8), [0, 0, 3])


class TextWrapper(torch.nn.Module):
    """A wrapper class keeping its language model under a name the plugin does not know, as a
    new multimodal class might: SGLang's call works, nothing can read the capture back."""

    def __init__(self, inner):
        super().__init__()
        self.text_model = inner
        self.config = inner.config

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.text_model.set_eagle3_layers_to_capture(layer_ids)


def test_a_capture_that_cannot_be_verified_is_an_error(targets, serve, speculators_drafter):
    """Before: a warning, leaving only the per-batch width check."""
    serve(speculators_drafter((1, 3, 4), 6))
    wrapper = TextWrapper(targets("LlamaForCausalLM", 6))
    with pytest.raises(DrafterConfigError, match="TextWrapper") as info:
        configure_capture(wrapper, [1, 3, 4])
    assert "layers_to_capture" in str(info.value)


def test_a_capture_left_switched_off_is_an_error(targets, serve, speculators_drafter):
    """The layers are right, but the forward would not return them."""
    serve(speculators_drafter((1, 3, 4), 6))
    target = targets("LlamaForCausalLM", 6)
    target.set_eagle3_layers_to_capture = lambda ids: None  # a class that forgets the switch
    with pytest.raises(DrafterConfigError, match="capture_aux_hidden_states is False"):
        configure_capture(target, [1, 3, 4])
