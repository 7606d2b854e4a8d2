"""EAGLE-3 fc fusion is decided by the forward mode, not by tensor width; a width that fits
neither path fails with both widths and the likely causes; the target's aux capture is planned
and verified at startup (SGLang-format drafters: what stock SGLang already serves).

Before: `LlamaModel.forward` fused only when `hidden_states.shape[-1] != embeds.shape[-1]`, so
target features of exactly one layer (aux capture not active) were silently not fused and the
drafter ran at accept length 1.0; aux ids that collapse on a small target crashed the scheduler
on the first request. No server, no GPU: drafters on CPU with reference attention.
"""

from __future__ import annotations

import sys

import pytest
import torch
from eagle3_behaviour import (
    HIDDEN,
    FcSpy,
    build_drafter,
    configure_capture,
    error_text,
    mla_drafter,
    record_capture_ids,
    serving,
    sglang_target,
    write_sglang_drafter,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang_cpu import forward_batch

register_cpu_ci(est_time=30, suite="stage-a-test-cpu")

FEATURES = 3 * HIDDEN  # three aux layers of a target as wide as the drafter
T = 5


@pytest.fixture
def drafter(sglang_env, tmp_path):
    """An SGLang-format EAGLE-3 drafter, built by SGLang's registry class, fc spied on."""
    model = build_drafter(write_sglang_drafter(tmp_path / "drafter"), load=False)
    model.model.fc = FcSpy(model.model.fc)
    return model


def run(model, mode: str, width: int, tokens: int = T):
    ids = torch.arange(tokens)
    with torch.no_grad():
        return model.model(ids, ids, forward_batch(mode, torch.randn(tokens, width)))


@pytest.mark.parametrize("mode", ["EXTEND", "MIXED", "DRAFT_EXTEND_V2"])
def test_target_features_are_fused_in_every_extend_mode(drafter, mode):
    out, aux = run(drafter, mode, FEATURES)
    assert drafter.model.fc.calls == 1
    assert out.shape == aux[0].shape == (T, HIDDEN)


def test_draft_decode_never_fuses_the_drafters_own_state(drafter):
    run(drafter, "DECODE", HIDDEN)
    assert drafter.model.fc.calls == 0


def test_one_target_layer_is_an_error_not_a_silent_skip(drafter):
    """The width of one target layer equals the drafter's: stock SGLang skipped fc here."""
    with pytest.raises(Exception) as info:
        run(drafter, "EXTEND", HIDDEN)
    text = error_text(info)
    assert text.startswith("FusionError: ")
    assert "target features are 64 wide (exactly one target layer: aux capture is not " \
        "active)" in text
    assert "its fc expects 3 x 64 = 192" in text
    assert "--speculative-algorithm EAGLE3" in text
    assert "set_eagle3_layers_to_capture" in text
    assert drafter.model.fc.calls == 0


def test_two_target_layers_are_named(drafter):
    with pytest.raises(Exception, match=r"128 wide \(2 target layers\)") as info:
        run(drafter, "DRAFT_EXTEND_V2", 2 * HIDDEN)
    assert type(info.value).__name__ == "FusionError"


def test_draft_decode_with_target_width_is_an_error(drafter):
    with pytest.raises(Exception, match="a draft decode step carries hidden states 192 wide"):
        run(drafter, "DECODE", FEATURES)


def test_idle_batches_follow_the_prepared_width(drafter):
    run(drafter, "IDLE", FEATURES, tokens=0)
    assert drafter.model.fc.calls == 1
    run(drafter, "IDLE", HIDDEN, tokens=0)
    assert drafter.model.fc.calls == 1


def test_mla_drafter_fuses_by_forward_mode(sglang_env):
    model = mla_drafter()
    ids = torch.arange(4)
    with torch.no_grad():
        model.model(ids, ids, forward_batch("EXTEND", torch.randn(4, FEATURES)))
        assert model.model.midlayer.seen == HIDDEN and model.model.fc_spy.calls == 1
        model.model(ids, ids, forward_batch("DECODE", torch.randn(4, HIDDEN)))
        assert model.model.fc_spy.calls == 1
        with pytest.raises(Exception, match=r"3 x 64 = 192") as info:
            model.model(ids, ids, forward_batch("EXTEND", torch.randn(4, HIDDEN)))
    assert type(info.value).__name__ == "FusionError"


def test_eagle_algorithm_with_an_eagle3_drafter_is_refused(sglang_env, tmp_path):
    """Under EAGLE the target captures no aux layers: refused when the drafter is built."""
    directory = write_sglang_drafter(tmp_path / "drafter")
    with serving(speculative_algorithm="EAGLE"):
        for build in (lambda: build_drafter(directory, load=False), mla_drafter):
            with pytest.raises(Exception, match="needs --speculative-algorithm EAGLE3") as info:
                build()
            assert type(info.value).__name__ == "FusionError"
    with serving(speculative_algorithm="EAGLE3"):
        build_drafter(directory, load=False)


# -- the target's capture, configured by SGLang at startup ----------------------------------


def test_sglang_format_ids_are_passed_through_and_verified(sglang_env, tmp_path):
    directory = write_sglang_drafter(tmp_path / "drafter", aux_ids=(1, 3, 4))
    target = sglang_target(6)
    seen = record_capture_ids(target)
    with serving(speculative_draft_model_path=str(directory)):
        configure_capture(target, [1, 3, 4])
    assert seen["ids"] == [1, 3, 4]
    assert target.model.layers_to_capture == [2, 4, 5]  # llama.py: state entering id + 1


def test_collapsing_default_ids_fail_at_startup(sglang_env, tmp_path):
    """No aux ids on a 4-layer target: SGLang's default [2, L//2, L-3] captures 2 distinct
    layers for a 3-layer fc (stock SGLang: a matmul shape error on the first request)."""
    directory = write_sglang_drafter(tmp_path / "drafter", aux_ids=None)
    with serving(speculative_draft_model_path=str(directory)):
        with pytest.raises(Exception) as info:
            configure_capture(sglang_target(4), None)
    text = error_text(info)
    assert text.startswith("DrafterConfigError: ")
    assert "collapse to 2 distinct layers" in text


def test_ids_beyond_the_target_fail_at_startup(sglang_env, tmp_path):
    directory = write_sglang_drafter(tmp_path / "drafter", aux_ids=(1, 3, 7))
    with serving(speculative_draft_model_path=str(directory)):
        with pytest.raises(Exception, match=r"aux layers \[8\] are outside the target's 6 "):
            configure_capture(sglang_target(6), [1, 3, 7])


def test_no_drafter_configured_leaves_capture_to_the_target(sglang_env):
    target = sglang_target(8)
    with serving(speculative_draft_model_path=None):
        configure_capture(target, [1, 3, 5])
    assert target.model.layers_to_capture == [2, 4, 6]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
