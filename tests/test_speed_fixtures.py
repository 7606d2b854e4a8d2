"""sglang_ext_tools.fixtures.make_speed_fixtures at tiny scale on CPU: every stage runs, the
widened target keeps the small target's logits, and the nbr-false drafter converts with no
differences."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def speed_fixtures(tmp_path_factory):
    module = importlib.import_module("sglang_ext_tools.fixtures.make_speed_fixtures")
    out = tmp_path_factory.mktemp("speed")
    argv = ["--stage", "all", "--scale", "tiny", "--device", "cpu", "--out", str(out)]
    assert module.main(argv) == 0
    return out, json.loads((out / "speed-fixtures.json").read_text())["stages"]


def test_all_stages_write_their_reports(speed_fixtures):
    out, stages = speed_fixtures
    assert set(stages) == {
        "base", "drafter-nbr-true", "drafter-nbr-false", "widen-target", "widen-drafters"
    }
    base = stages["base"]
    assert base["small_target"]["num_layers"] == 6
    assert base["distill"]["new_tokens"] == 32 and base["distill"]["train_tokens"] == 16 * 64
    for tag in ("true", "false"):
        drafter = stages[f"drafter-nbr-{tag}"][f"small_drafter_nbr-{tag}"]
        assert drafter["norm_before_residual"] is (tag == "true")
        assert drafter["aux_layer_ids"] == [1, 3, 5]
        assert drafter["layer_types"] == ["full_attention"]
        assert drafter["train"]["ttt_steps"] == 3
        assert drafter["reference"]["tau"] >= 1.0


def test_widened_target_keeps_the_small_targets_predictions(speed_fixtures):
    _, stages = speed_fixtures
    check = stages["widen-target"]["function_check"]
    assert check["big_vs_small"]["top1_agreement"] == 1.0
    assert check["big_vs_small"]["max_abs_diff"] <= 1e-4
    assert check["logit_scale"] > 0.1
    target = stages["widen-target"]["target_8b"]
    assert target["num_layers"] == 10 and target["shape"]["hidden"] == 64


def test_drafters_are_widened_and_the_plain_one_converts_exactly(speed_fixtures):
    out, stages = speed_fixtures
    drafters = stages["widen-drafters"]["drafters_8b"]
    assert drafters["nbr-true"]["aux_ids"] == drafters["nbr-false"]["aux_ids"] == [1, 5, 8]
    for tag, nbr in (("nbr-true", True), ("nbr-false", False)):
        cfg = json.loads((out / f"drafter-8b-{tag}" / "config.json").read_text())
        assert cfg["norm_before_residual"] is nbr
        assert cfg["transformer_layer_config"]["hidden_size"] == 64
        assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(out / "target-8b")
    converted = json.loads((out / "drafter-8b-nbr-false-sglang" / "config.json").read_text())
    assert converted["architectures"] == ["LlamaForCausalLMEagle3"]
    # SGLang's llama rule captures id + 1, so speculators' [1, 5, 8] is written as [0, 4, 7].
    assert converted["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 4, 7]
    notes = (out / "drafter-8b-nbr-false-sglang" / "CONVERTED.md").read_text()
    assert "No behaviour differences." in notes
