"""sglang_ext_tools.fixtures.make_speed_fixtures at tiny scale on CPU: every stage runs, the
widened target keeps the small target's logits (vocabulary zero-padded, argmax never on a
padded id), the drafters get a bigger draft vocabulary with unchanged proposals, and the
nbr-false drafter converts with no differences."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

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
        "base",
        "drafter-nbr-true",
        "drafter-nbr-false",
        "widen-target",
        "widen-drafters",
    }
    base = stages["base"]
    assert base["small_target"]["num_layers"] == 6
    assert base["distill"]["new_tokens"] == 32 and base["distill"]["train_tokens"] == 16 * 64
    # prompts from files the target never trained on (not from the text it recites)
    assert base["distill"]["source"] == "split"
    assert base["distill"]["prompt_stream_tokens"] != base["data"]["train_tokens"]
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
        # the MLP zero-padded to the published width (TINY: 128), not kept at the trained one
        small = json.loads((out / f"small-drafter-{tag}" / "config.json").read_text())
        assert small["transformer_layer_config"]["intermediate_size"] < 128
        assert cfg["transformer_layer_config"]["intermediate_size"] == 128
        assert drafters[tag]["intermediate_size"] == 128
        assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(out / "target-8b")
    converted = json.loads((out / "drafter-8b-nbr-false-sglang" / "config.json").read_text())
    assert converted["architectures"] == ["LlamaForCausalLMEagle3"]
    # SGLang's llama rule captures id + 1, so speculators' [1, 5, 8] is written as [0, 4, 7].
    assert converted["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 4, 7]
    notes = (out / "drafter-8b-nbr-false-sglang" / "CONVERTED.md").read_text()
    assert "No behaviour differences." in notes


def test_widened_target_has_the_big_vocabulary(speed_fixtures):
    out, stages = speed_fixtures
    stage = stages["widen-target"]
    target, check = stage["target_8b"], stage["function_check"]
    assert (target["vocab_size"], target["small_vocab_size"]) == (2048, 512)
    assert target["tie_word_embeddings"] is False
    assert target["lm_head_extra_bytes"] == (2048 - 512) * 64 * 2
    cfg = json.loads((out / "target-8b" / "config.json").read_text())
    small_cfg = json.loads((out / "small-target" / "config.json").read_text())
    assert cfg["vocab_size"] == 2048
    assert cfg["tie_word_embeddings"] == small_cfg["tie_word_embeddings"]
    # the big target's argmax over all 2048 ids never lands on a padded one
    assert check["top1_on_new_rows"] == 0 and check["min_top1_logit"] > 0
    assert check["vocab"]["new_rows"] == 1536 and check["vocab"]["max_abs_new_row_logit"] == 0
    assert check["vocab"]["positions"] == check["tokens"]
    from safetensors.torch import load_file

    tensors = {}
    for path in (out / "target-8b").glob("*.safetensors"):
        tensors.update(load_file(str(path)))
    assert tensors["lm_head.weight"].shape == (2048, 64)
    assert tensors["lm_head.weight"][512:].abs().max() == 0
    assert tensors["model.embed_tokens.weight"].shape == (2048, 64)
    tokenizer = json.loads((out / "target-8b" / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) <= 512  # the trained tokenizer, as is


def test_widened_drafters_have_the_big_draft_vocabulary(speed_fixtures):
    from safetensors.torch import load_file

    out, stages = speed_fixtures
    for tag in ("nbr-true", "nbr-false"):
        info = stages["widen-drafters"]["drafters_8b"][tag]
        assert (info["vocab_size"], info["draft_vocab_size"]) == (2048, 1024)
        assert info["small_draft_vocab_size"] == 512
        assert info["lm_head_extra_bytes"] == (1024 - 512) * 64 * 2
        cfg = json.loads((out / f"drafter-8b-{tag}" / "config.json").read_text())
        assert cfg["draft_vocab_size"] == 1024
        assert cfg["transformer_layer_config"]["vocab_size"] == 2048
        state = load_file(str(out / f"drafter-8b-{tag}" / "model.safetensors"))
        assert state["d2t"].dtype == torch.int64 and state["d2t"].shape == (1024,)
        assert state["d2t"].abs().max() == 0  # draft id i -> target id i
        assert state["t2d"].dtype == torch.bool and state["t2d"].shape == (2048,)
        assert state["t2d"][:1024].all() and not state["t2d"][1024:].any()
        assert state["lm_head.weight"].shape == (1024, 64)
        assert state["lm_head.weight"][512:].abs().max() == 0
        assert state["embed_tokens.weight"].shape == (2048, 64)
        # teacher-forced proposals of every TTT step, mapped to target ids, are the small one's
        check = info["function_check"]
        assert check["proposals_equal"] == 1.0 and check["proposals_differ"] == 0
        assert check["ttt_steps"] == 3 and check["tokens"] == 2 * 63
        assert check["top1_on_new_rows"] == 0 and check["min_top1_logit"] > 0
        assert check["max_abs_diff"] <= 1e-4 and check["logit_scale"] > 0.1
    sglang_dir = out / "drafter-8b-nbr-false-sglang"
    converted = json.loads((sglang_dir / "config.json").read_text())
    assert (converted["vocab_size"], converted["draft_vocab_size"]) == (2048, 1024)
    state = load_file(str(sglang_dir / "model.safetensors"))
    assert state["d2t"].dtype == torch.int64 and state["d2t"].shape == (1024,)
    assert "t2d" not in state  # SGLang reads d2t only


def test_padded_argmax_is_detected():
    module = importlib.import_module("sglang_ext_tools.fixtures.make_speed_fixtures")
    logits = torch.zeros(2, 3, 8)
    logits[..., :4] = torch.tensor([1.0, 3.0, 2.0, 0.5])
    fine = module.padded_argmax_stats(logits, 4)
    assert fine["top1_on_new_rows"] == 0 and fine["min_top1_logit"] == 3.0
    module.require_real_argmax(fine, "ok")
    logits[1, 2, :4] = -1.0  # every real logit negative at one position: a padded id wins
    bad = module.merge_argmax_stats(fine, module.padded_argmax_stats(logits, 4))
    assert bad["top1_on_new_rows"] == 1 and bad["min_top1_logit"] == -1.0
    assert bad["positions"] == 12
    with pytest.raises(SystemExit, match=r"at 1 of 12 positions \(min real top-1 logit -1"):
        module.require_real_argmax(bad, "target")
    logits[1, 2, :4] = 0.0  # a tie with the padded rows' 0 is refused too
    with pytest.raises(SystemExit, match="min real top-1 logit 0"):
        module.require_real_argmax(module.padded_argmax_stats(logits, 4), "target")
    unpadded = module.padded_argmax_stats(logits[..., :4], 4)
    module.require_real_argmax(unpadded, "no padding: nothing to check")


def _tiny_llama():
    """A 2-layer Llama target (vocab 64, hidden 32) with seeded random weights, for the
    caller to shape and save."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        num_hidden_layers=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_function_check_fails_loudly_on_a_negative_top_logit(tmp_path):
    """A small target whose lm_head rows are all one vector: every real logit is the same,
    negative at about half the positions, where the padded ids' 0 wins the argmax."""
    from sglang_ext_tools import widen

    module = importlib.import_module("sglang_ext_tools.fixtures.make_speed_fixtures")
    model = _tiny_llama()
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.randn(1, 32).expand(64, 32))
    model.save_pretrained(tmp_path / "small")
    big = widen.Shape(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=128)
    widen.write_widened_target(tmp_path / "small", tmp_path / "big", big, 4, [0, 2])
    chunks = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with pytest.raises(SystemExit, match=r"argmax on padded vocabulary rows at [1-9]\d* of 32"):
        module.function_check(tmp_path / "small", tmp_path / "big", chunks, "cpu")


def test_function_check_in_bf16_holds_both_models_against_fp32(tmp_path):
    """The 8B fixture's check on CUDA: a widening by 3 (1/sqrt(3) rounds in bf16) with
    identity layers and padded vocabulary rows is as close to the fp32 function as the small
    model is (fixtures.bf16_check)."""
    from sglang_ext_tools import widen

    module = importlib.import_module("sglang_ext_tools.fixtures.make_speed_fixtures")
    model = _tiny_llama()
    with torch.no_grad():  # logits far from ties, top-1 positive (the padded rows give 0)
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.save_pretrained(tmp_path / "small")
    big = widen.Shape(hidden=96, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=128)
    widen.write_widened_target(tmp_path / "small", tmp_path / "big", big, 4, [0, 2])
    chunks = torch.randint(3, 64, (8, 48), generator=torch.Generator().manual_seed(1))
    check = module.function_check(
        tmp_path / "small", tmp_path / "big", chunks, "cpu", torch.bfloat16
    )
    verdict = check["fp32_reference"]
    assert check["dtype"] == "bfloat16" and verdict["tokens"] == chunks.numel()
    assert verdict["pass"], verdict
    assert verdict["error_ratio_ci95"][1] < 1.5, verdict
    assert check["top1_on_new_rows"] == 0


def test_distill_split_files_leave_the_targets_training():
    from sglang_ext_tools.fixtures.common import distill_split
    from sglang_ext_tools.fixtures.data import Corpus

    module = importlib.import_module("sglang_ext_tools.fixtures.make_speed_fixtures")
    files = [(f"pkg/mod{i}.py", f"x = {i}\n") for i in range(200)]
    corpus = Corpus(root="/r", train=files, heldout=[("h.py", "y = 1\n")], skipped=0)
    same, none = module.set_aside_distill_files(corpus, "train")
    assert same is corpus and none is None
    kept, aside = module.set_aside_distill_files(corpus, "split")
    assert aside and all(distill_split(rel) for rel, _ in aside)
    assert not any(distill_split(rel) for rel, _ in kept.train)
    assert sorted(kept.train + aside) == sorted(files) and kept.heldout == corpus.heldout
    assert 5 <= len(aside) <= 40  # about 10 % of 200
    with pytest.raises(ValueError, match="distill_source 'heldout'"):
        module.set_aside_distill_files(corpus, "heldout")
    with pytest.raises(ValueError, match="no training file"):
        module.set_aside_distill_files(Corpus("/r", files[:0], [], 0), "split")


def test_a_cached_bundle_widens_again_to_the_same_models(speed_fixtures, tmp_path):
    """fixtures.cache: the trained small models packed on one node session and unpacked on
    the next widen to the same big target and drafters, and the merged manifest keeps the
    cached stages' own records."""
    from safetensors.torch import load_file

    from sglang_ext_tools.fixtures import cache

    module = importlib.import_module("sglang_ext_tools.fixtures.make_speed_fixtures")
    out, stages = speed_fixtures
    bundle = tmp_path / "speed-fixtures.tar"
    record = cache.pack(out, bundle)
    assert record["kind"] == "speed"
    speed_files = cache.KINDS["speed"].files
    assert set(record["stages_created_unix"]) == set(speed_files) - {"prompts.jsonl"}
    with pytest.raises(cache.CacheError, match="never overwritten"):
        cache.pack(out, bundle)

    again = tmp_path / "again"
    again.mkdir()
    (again / "pipeline.log").write_text("kept\n")
    assert cache.unpack(bundle, again) == record
    assert (again / "pipeline.log").read_text() == "kept\n"
    assert set(torch.load(again / "streams.pt", weights_only=True)) == {"heldout"}
    for stage in ("widen-target", "widen-drafters"):
        argv = ["--stage", stage, "--scale", "tiny", "--device", "cpu", "--out", str(again)]
        assert module.main(argv) == 0
    manifest = json.loads((again / "speed-fixtures.json").read_text())
    assert manifest["cache"] == record  # the manifest says the small models were carried
    merged = manifest["stages"]
    assert merged["drafter-nbr-true"] == stages["drafter-nbr-true"]  # the cached record
    for name in ("target-8b", "drafter-8b-nbr-true", "drafter-8b-nbr-false-sglang"):
        for first in sorted((out / name).glob("*.safetensors")):
            a, b = load_file(str(first)), load_file(str(again / name / first.name))
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name

    with pytest.raises(cache.CacheError, match="already has"):
        cache.unpack(bundle, again)
    with pytest.raises(cache.CacheError, match="missing"):
        cache.pack(tmp_path / "empty", tmp_path / "x.tar")


def test_drafter_steps_scale_trains_the_drafters_longer():
    """--drafter-steps-scale: the drafters' steps and time cap scaled, nothing else."""
    from sglang_ext_tools.fixtures import make_speed_fixtures as msf_

    full = msf_.SCALES["full"]
    twice = msf_.with_drafter_steps(full, 2.0)
    assert twice.drafter_train["steps"] == 2 * full.drafter_train["steps"]
    assert twice.drafter_train["time_cap"] == 2 * full.drafter_train["time_cap"]
    assert twice.target_train == full.target_train and twice.distill == full.distill
    assert msf_.with_drafter_steps(full, 1.0) is full
    tiny = msf_.SCALES["tiny"]
    assert msf_.with_drafter_steps(tiny, 3.0).drafter_train["time_cap"] is None


def _carried(speed_fixtures, tmp_path):
    """(the builder module, the built folder, a folder unpacked from its bundle), as the
    next device session has them."""
    from sglang_ext_tools.fixtures import cache

    out, _ = speed_fixtures
    bundle = tmp_path / "speed-fixtures.tar"
    cache.pack(out, bundle)
    cache.unpack(bundle, tmp_path / "again")
    module = importlib.import_module("sglang_ext_tools.fixtures.make_speed_fixtures")
    return module, out, tmp_path / "again"


def test_a_carried_drafter_trains_on_from_where_it_stopped(speed_fixtures, tmp_path):
    """A bundle carries only the held-out text; drafter-data makes the training text again
    (checked against the counts the base stage recorded) and --resume continues the carried
    drafter: it starts from its trained weights, keeps the earlier one beside it, and its
    record counts every step it has had."""
    from safetensors.torch import load_file

    module, out, again = _carried(speed_fixtures, tmp_path)
    stages = speed_fixtures[1]

    def run(*argv):
        return module.main([*argv, "--scale", "tiny", "--device", "cpu", "--out", str(again)])

    assert run("--stage", "drafter-data") == 0
    data = json.loads((again / "stage-drafter-data.json").read_text())
    assert data["heldout_continuations_reproduced"] == 1.0  # fp32 on CPU: the same text
    for name in ("streams.pt", "distill.pt"):  # the training text as the base stage made it
        a, b = torch.load(out / name), torch.load(again / name)
        assert all(torch.equal(a[k], b[k]) for k in ("train", "heldout")), name

    first = stages["drafter-nbr-true"]["small_drafter_nbr-true"]
    steps = first["train"]["steps_done"]
    assert run("--stage", "drafter", "--nbr", "true", "--resume", "--drafter-steps-scale", "2") == 0
    record = json.loads((again / "stage-drafter-nbr-true.json").read_text())
    resumed = record["small_drafter_nbr-true"]
    assert resumed["resumed_from"]["steps_total"] == steps
    assert resumed["resumed_from"]["reference_tau"] == first["reference"]["tau"]
    assert resumed["steps_total"] == steps + resumed["train"]["steps_done"] == 3 * steps
    # it started where the carried drafter stopped, not from a fresh initialisation
    assert resumed["train"]["first_loss"] < 0.5 * first["train"]["first_loss"]
    kept = again / f"small-drafter-nbr-true-steps{steps}"
    a = load_file(str(out / "small-drafter-nbr-true" / "model.safetensors"))
    b = load_file(str(kept / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # the earlier drafter, kept as it was

    # a second session continues the continued one; its record nests the first
    assert run("--stage", "drafter", "--nbr", "true", "--resume") == 0
    twice = json.loads((again / "stage-drafter-nbr-true.json").read_text())
    twice = twice["small_drafter_nbr-true"]
    assert twice["resumed_from"]["steps_total"] == 3 * steps
    assert twice["resumed_from"]["resumed_from"]["steps_total"] == steps
    assert twice["steps_total"] == 4 * steps
    # the pipeline then widens the continued drafter, as it widens a carried one
    assert run("--stage", "widen-target") == 0 and run("--stage", "widen-drafters") == 0


def test_training_text_from_another_corpus_is_refused_by_field(speed_fixtures, tmp_path):
    module, _, again = _carried(speed_fixtures, tmp_path)
    base = json.loads((again / "stage-base.json").read_text())
    base["data"]["train_tokens"] += 1
    (again / "stage-base.json").write_text(json.dumps(base))
    argv = ["--scale", "tiny", "--device", "cpu", "--out", str(again)]
    with pytest.raises(SystemExit, match="data.train_tokens .* not the text the carried"):
        module.main(["--stage", "drafter-data", *argv])
    with pytest.raises(SystemExit, match="2"):  # argparse: --resume belongs to one stage
        module.main(["--stage", "widen-drafters", "--resume", *argv])
    (again / "small-drafter-nbr-true-steps10").mkdir()
    with pytest.raises(SystemExit, match="never overwritten"):
        module.main(["--stage", "drafter", "--nbr", "true", "--resume", *argv])


def test_drafter_lr_scale_changes_only_the_drafters_peak_rate():
    from sglang_ext_tools.fixtures import make_speed_fixtures as msf_

    full = msf_.SCALES["full"]
    low = msf_.with_drafter_lr(full, 0.3)
    assert low.drafter_train == {**full.drafter_train, "lr": full.drafter_train["lr"] * 0.3}
    assert low.target_train == full.target_train and msf_.with_drafter_lr(full, 1.0) is full
    with pytest.raises(SystemExit):
        msf_.main(["--stage", "drafter", "--out", "/nonexistent", "--drafter-lr-scale", "0"])


def test_drafter_mlp_scale_widens_only_the_trained_mlp():
    """--drafter-mlp-scale: the small drafter's MLP width; the served drafter is padded to the
    published width whatever it is, so a width beyond that is refused."""
    from sglang_ext_tools.fixtures import make_speed_fixtures as msf_

    full = msf_.SCALES["full"]
    wide = msf_.with_drafter_mlp(full, 4.0)
    assert wide.drafter_train == {**full.drafter_train, "intermediate": 4 * 1536}
    assert wide.target == full.target and msf_.with_drafter_mlp(full, 1.0) is full
    with pytest.raises(SystemExit, match="15360 does not fit the served drafter's 14336"):
        msf_.with_drafter_mlp(full, 10.0)
    with pytest.raises(SystemExit):
        msf_.main(["--stage", "drafter", "--out", "/nonexistent", "--drafter-mlp-scale", "0"])


def test_a_wider_mlp_trains_widens_and_is_not_resumed_as_another_width(speed_fixtures, tmp_path):
    """A fresh drafter with a wider MLP beside a carried one (kept aside, never overwritten)
    widens to the same served shape (its proposals checked), and --resume refuses it at
    another width before moving anything."""
    module, _, again = _carried(speed_fixtures, tmp_path)

    def run(*argv):
        return module.main([*argv, "--scale", "tiny", "--device", "cpu", "--out", str(again)])

    assert run("--stage", "drafter-data") == 0
    assert run("--stage", "drafter", "--nbr", "true", "--drafter-mlp-scale", "2") == 0
    small = json.loads((again / "small-drafter-nbr-true" / "config.json").read_text())
    assert small["transformer_layer_config"]["intermediate_size"] == 2 * 64
    # the carried drafter it replaced stays beside it, and the record says which it was
    steps = speed_fixtures[1]["drafter-nbr-true"]["small_drafter_nbr-true"]["train"]["steps_done"]
    kept = json.loads((again / f"small-drafter-nbr-true-steps{steps}" / "config.json").read_text())
    assert kept["transformer_layer_config"]["intermediate_size"] == 64
    record = json.loads((again / "stage-drafter-nbr-true.json").read_text())
    assert record["small_drafter_nbr-true"]["replaced"]["steps_total"] == steps
    assert run("--stage", "widen-target") == 0 and run("--stage", "widen-drafters") == 0
    stages = json.loads((again / "speed-fixtures.json").read_text())["stages"]
    big = stages["widen-drafters"]["drafters_8b"]["nbr-true"]
    assert big["intermediate_size"] == 128 and big["function_check"]["proposals_equal"] > 0.99
    before = sorted(p.name for p in again.iterdir())
    with pytest.raises(SystemExit, match="intermediate_size 128, this run's drafter 64"):
        run("--stage", "drafter", "--nbr", "true", "--resume")
    assert sorted(p.name for p in again.iterdir()) == before


def test_continuation_agreement_counts_the_text_before_each_parting():
    from sglang_ext_tools.fixtures.make_speed_fixtures import continuation_agreement

    old = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
    new = torch.tensor([[1, 2, 0, 4], [5, 6, 7, 8], [0, 9, 9, 9]])
    got = continuation_agreement(new, old)
    assert got == {"positions_equal": 0.8333, "before_first_parting": 0.5,
                   "identical": 0.3333, "sequences": 3}  # fmt: skip
