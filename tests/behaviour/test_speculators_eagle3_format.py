"""speculators-format EAGLE-3 drafters served as they are: config translation by get_config,
the architectures speculators writes, the math options SGLang had no name for, the checkpoint
keys, and speculators' aux-id convention converted for each target class.

The checkpoints are written by speculators itself (0.9.0: its Eagle3DraftModel, randomised,
saved with its own save_pretrained), and the drafter's step-0 logits are compared with
speculators' own forward, in fp32 on CPU. SGLang's attention cannot run on CPU, so attention is
evaluated by tests/sglang_cpu.py's ReferenceAttention (plain causal attention); every other
operation is SGLang's own. The GPU tests (tests/gpu) cover the full path.
"""

from __future__ import annotations

import shutil
import sys

import pytest
import torch
from builders import VARIANTS, Variant, speculators_logits, write_target
from builders import build_drafter as build_speculators_drafter
from eagle3_behaviour import (
    MODE,
    build_drafter,
    configure_capture,
    error_text,
    get_config,
    model_class,
    record_capture_ids,
    safetensors_weights,
    serving,
    sglang_target,
)
from sglang.test.ci.ci_register import register_cpu_ci

pytest.importorskip("speculators", reason="the test checkpoints are written by speculators")

register_cpu_ci(est_time=60, suite="stage-a-test-cpu")

T = 12


def served(directory, reference, *, own_embeddings: bool = False):
    """The drafter as SGLang serves it. SGLang's EAGLE worker hands over the target's
    embedding table; speculators' model holds the verifier's (what a drafter with frozen
    embeddings was trained against), and a drafter with its own must keep its."""
    shared = reference.embed_tokens.weight.detach().clone()
    if own_embeddings:
        shared = torch.zeros_like(shared)
    return build_drafter(directory, embed=shared)


def step0(model, seed: int = 1):
    from sglang_cpu import forward_batch

    config = model.config
    width = config.num_aux_hidden_states * (
        getattr(config, "target_hidden_size", None) or config.hidden_size
    )
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, width, generator=generator)
    ids = torch.randint(0, config.vocab_size, (T,), generator=generator)
    with torch.no_grad():
        normed, _ = model.model(ids, torch.arange(1, T + 1), forward_batch("EXTEND", hidden))
    return hidden, ids, normed @ model.lm_head.weight.T


# -- config ---------------------------------------------------------------------------------


def test_get_config_translates_a_speculators_directory(sglang_env, drafter):
    directory = drafter("default")[0]
    for trust_remote_code in (False, True):  # its config.py (auto_map) is never imported
        from sglang.srt.utils.hf_transformers_utils import get_config as sglang_get_config

        config = sglang_get_config(str(directory), trust_remote_code=trust_remote_code)
        assert config.architectures == ["Eagle3DraftModel"]
        assert config.eagle_config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
        assert config.num_aux_hidden_states == 3
        assert config.draft_vocab_size == 128 and config.vocab_size == 256


def test_model_config_reads_the_translated_drafter(sglang_env, drafter):
    from sglang.srt.configs.model_config import ModelConfig

    config = ModelConfig(model_path=str(drafter("three_layers")[0]), is_draft_model=True)
    assert config.num_hidden_layers == 3 and config.hidden_size == 64
    assert not config.is_hybrid_swa  # the window is applied by the drafter class instead


@pytest.mark.parametrize("architecture",
                         ["Eagle3DraftModel", "Eagle3Speculator", "LlamaForCausalLMEagle3"])
def test_registry_resolves_the_architectures_speculators_writes(sglang_env, architecture):
    assert model_class(architecture).__name__ == architecture


# The plugin also reads the whole load report from the safetensors headers in get_config; the
# upstream series checks the checkpoint when load_weights runs at startup (tested below).
PLUGIN_CHECKS_HEADERS = pytest.mark.skipif(
    MODE == "patched", reason="checkpoint checks in get_config are the plugin's own")


@PLUGIN_CHECKS_HEADERS
def test_get_config_checks_the_checkpoint_before_any_gpu_work(sglang_env, drafter, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(drafter("default")[0], bad)
    tensors = load_file(str(bad / "model.safetensors"))
    tensors.pop("fc.weight")
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(Exception) as info:
        get_config(bad)
    text = error_text(info)
    assert text.startswith("DrafterLoadError: ") and "model.fc.weight: missing" in text


@PLUGIN_CHECKS_HEADERS
def test_truncated_checkpoints_are_refused_pickle_only_ones_read(sglang_env, drafter, tmp_path):
    from safetensors.torch import load_file

    truncated = tmp_path / "truncated"
    shutil.copytree(drafter("default")[0], truncated)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[:-1000])
    with pytest.raises(Exception, match=r"truncated safetensors file: tensors need \d+"):
        get_config(truncated)
    pickled = tmp_path / "pickled"
    shutil.copytree(drafter("default")[0], pickled)
    torch.save(load_file(str(pickled / "model.safetensors")), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    # read as SGLang reads .bin files (torch.load weights_only=True): issue 22, item 2
    assert get_config(pickled).architectures


# -- numerical parity with speculators --------------------------------------------------------


# tiny_window (window 4 < the 12-token input) is tested below: served as trained or not.
@pytest.mark.parametrize("name", sorted(set(VARIANTS) - {"tiny_window"}))
def test_step0_logits_match_speculators(sglang_env, drafter, name):
    directory, reference = drafter(name)
    model = served(directory, reference, own_embeddings=VARIANTS[name].embed_requires_grad)
    hidden, ids, got = step0(model)
    want = speculators_logits(reference, hidden, ids)
    assert got.shape == want.shape
    assert want.abs().mean() > 1e-2  # a real signal, not all zeros
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_norm_before_residual_changes_the_output(sglang_env, drafter):
    """The parity above would catch a dropped norm_before_residual (speculators' default)."""
    directory, reference = drafter("default")
    model = served(directory, reference)
    hidden, ids, _ = step0(model)
    want = speculators_logits(reference, hidden, ids)
    for layer in model.model.layers:
        layer.norm_before_residual = False
    _, _, got = step0(model)
    assert (got - want).abs().max() > 1e-2


def window_served() -> bool:
    """The plugin serves the trained window from SGLang 0.5.23 on (the multi-step draft's
    window rail); the patch series and older SGLang serve it as full attention."""
    from importlib.metadata import version

    release = tuple(int(p) for p in version("sglang").split(".")[:3] if p.isdigit())
    return MODE == "plugin" and release >= (0, 5, 23)


@pytest.mark.skipif(not window_served(), reason="the per-layer window is the plugin's own, "
                    "on SGLang >= 0.5.23 (tests/test_sliding_window.py covers the rest)")
def test_sliding_window_is_served_as_trained(sglang_env, drafter):
    """speculators keeps S keys (its own included); SGLang's layer window w keeps w + 1 on
    extend, so the layer gets S - 1 and the model S (decode keeps min(keys, S))."""
    directory, reference = drafter("tiny_window")
    model = served(directory, reference)
    assert [layer.self_attn.attn.sliding_window_size for layer in model.model.layers] == [3, 3]
    assert model.get_attention_sliding_window_size() == 4
    hidden, ids, got = step0(model)
    torch.testing.assert_close(got, speculators_logits(reference, hidden, ids), atol=1e-4, rtol=0)


@pytest.mark.skipif(window_served(), reason="this SGLang serves the window as trained")
def test_sliding_window_is_served_as_full_attention_and_said_so(sglang_env, drafter, caplog):
    """SGLang < 0.5.23's EAGLE draft decode has no per-layer window (a drafter-level window
    crashed the first draft decode on an H200), so the window is served as full attention with
    a startup warning: speculators' math below the window length, its math without the window
    beyond."""
    directory, reference = drafter("tiny_window")
    with caplog.at_level("WARNING"):
        model = served(directory, reference)
    assert "trained with sliding_window=4" in caplog.text
    assert all(layer.self_attn.attn.sliding_window_size in (None, -1)
               for layer in model.model.layers)
    assert model.get_attention_sliding_window_size() is None
    hidden, ids, got = step0(model)
    assert (got - speculators_logits(reference, hidden, ids)).abs().max() > 1e-3
    saved = (reference.sliding_window_indices, reference.uses_sliding_window_attn,
             reference.uses_full_attn)
    try:  # the same speculators model with its window switched off (a shared fixture)
        reference.sliding_window_indices = []
        reference.uses_sliding_window_attn, reference.uses_full_attn = False, True
        unwindowed = speculators_logits(reference, hidden, ids)
    finally:
        (reference.sliding_window_indices, reference.uses_sliding_window_attn,
         reference.uses_full_attn) = saved
    torch.testing.assert_close(got, unwindowed, atol=1e-4, rtol=0)


def test_own_embeddings_survive_set_embed(sglang_env, drafter):
    from safetensors.torch import load_file

    directory, reference = drafter("own_embeddings")
    model = served(directory, reference, own_embeddings=True)
    expected = load_file(str(directory / "model.safetensors"))["embed_tokens.weight"]
    torch.testing.assert_close(model.model.embed_tokens.weight, expected)


def test_d2t_becomes_the_hot_token_ids(sglang_env, drafter):
    directory, reference = drafter("default")
    model = served(directory, reference)
    assert torch.equal(model.get_hot_token_id(), torch.nonzero(reference.t2d).flatten())
    directory, reference = drafter("no_d2t")
    assert served(directory, reference).get_hot_token_id() is None


# -- strict loading of speculators checkpoints ----------------------------------------------


@pytest.mark.parametrize("name", ["three_layers", "qwen3", "fc_norm", "norms_off"])
def test_every_variant_loads_with_nothing_left_random(sglang_env, drafter, name):
    """Every parameter the drafter uses comes from the checkpoint: all start as NaN. Left
    out: the embeddings (shared from the target by set_embed) and the input_layernorm of
    layers >= 1 (SGLang's layers >= 1 normalise their input with hidden_norm)."""
    directory, _ = drafter(name)
    config = get_config(directory)
    model = model_class(config.architectures[0])(config)
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(float("nan"))
    model.load_weights(safetensors_weights(directory))
    unused = {"model.embed_tokens.weight"} | {
        f"model.layers.{i}.input_layernorm.weight" for i in range(1, config.num_hidden_layers)}
    left = [n for n, p in model.named_parameters() if n not in unused and p.isnan().any()]
    assert left == []


BAD = {
    "missing_norm": (lambda t: t.pop("layers.0.hidden_norm.weight"),
                     "model.layers.0.hidden_norm.weight: missing"),
    "extra_layer": (lambda t: t.update({"layers.1.mlp.down_proj.weight": torch.zeros(64, 128)}),
                    "config has 1 draft layer"),
    "rotary_buffer": (
        lambda t: t.update({"layers.0.self_attn.rotary.inv_freq": torch.zeros(8)}),
        "layers.0.self_attn.rotary.inv_freq: unexpected tensor"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_load_weights_refuses_a_mismatching_speculators_checkpoint(sglang_env, drafter, case):
    from safetensors.torch import load_file

    directory, _ = drafter("default")
    tensors = load_file(str(directory / "model.safetensors"))
    edit, message = BAD[case]
    edit(tensors)
    with pytest.raises(Exception) as info:
        build_drafter(directory, weights=tensors.items())
    text = error_text(info)
    assert text.startswith("DrafterLoadError: ") and message in text


def test_qwen3_draft_layers_have_and_load_q_k_norms(sglang_env, drafter):
    directory, _ = drafter("qwen3")
    model = build_drafter(directory, weights=safetensors_weights(directory))
    params = dict(model.named_parameters())
    assert params["model.layers.0.self_attn.q_norm.weight"].shape == (16,)
    assert params["model.layers.0.self_attn.k_norm.weight"].shape == (16,)


# -- speculators' aux-id convention, converted for the target's class -----------------------


def test_llama_targets_capture_the_state_entering_each_speculators_id(sglang_env, drafter):
    directory = drafter("default")[0]  # eagle_aux_hidden_state_layer_ids [1, 3, 4]
    target = sglang_target(6)
    seen = record_capture_ids(target)
    with serving(speculative_draft_model_path=str(directory)):
        configure_capture(target, [1, 3, 4])  # what SGLang passes from the translated config
    assert seen["ids"] == [0, 2, 3]  # llama.py adds 1
    assert target.model.layers_to_capture == [1, 3, 4]


@pytest.mark.parametrize("aux", [(2, 4, 5), (3, 5, 6), (1, 3, 4)])
def test_deepseek_targets_capture_the_trained_layers(sglang_env, tmp_path, aux):
    """deepseek_v2.py (DeepSeek-V3, Kimi-K2.x) adds 1 only when the first id is 1, and a first
    aux layer of 1 cannot be asked for through ids at all: whatever ids switch capture on, the
    target ends up capturing exactly the trained layers (the plugin and the series get there
    differently; tests/test_capture.py pins the plugin's ids)."""
    target_dir = write_target(tmp_path / "target", layers=8)
    directory = tmp_path / "drafter"
    build_speculators_drafter(directory, target_dir, Variant(aux_ids=aux))
    target = sglang_target(8, "deepseek")
    with serving(speculative_draft_model_path=str(directory)):
        configure_capture(target, list(aux))
    assert target.model.layers_to_capture == list(aux)


def test_a_speculators_id_naming_the_final_state_is_refused(sglang_env, tmp_path):
    target_dir = write_target(tmp_path / "target", layers=6)
    directory = tmp_path / "drafter"
    build_speculators_drafter(directory, target_dir, Variant(aux_ids=(1, 3, 6)))
    with serving(speculative_draft_model_path=str(directory)):
        with pytest.raises(Exception, match="names the target's final hidden state") as info:
            configure_capture(sglang_target(6), [1, 3, 6])
    assert type(info.value).__name__ == "DrafterConfigError"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
