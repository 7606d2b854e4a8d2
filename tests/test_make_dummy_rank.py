"""`fixtures.make_dummy_rank`: the config-only rank shape is the shape the seed-shape runs
served (the committed target config, the widened drafter's widths in the fixture manifest),
so a dummy-weight server runs the trained servers' one-token MoE launch."""

import json
from pathlib import Path

from sglang_ext_tools.fixtures import make_dummy_8b, make_dummy_rank

RESULTS = Path(__file__).resolve().parent / "gpu" / "results"
SERVED_TARGET = RESULTS / "seed-shape-2026-12-06-wide-target-config.json"
MANIFEST = RESULTS / "mla-fixtures-2026-12-06-draws-nvidia-h100-seed-shape.json"


def test_target_is_the_served_rank_shape():
    served = json.loads(SERVED_TARGET.read_text())
    served.pop("transformers_version")
    assert make_dummy_rank.RANK_TARGET == served


def test_drafter_has_the_widened_fixture_drafters_widths():
    wide = json.loads(MANIFEST.read_text())["stages"]["widen"]["wide_drafter"]
    shape, d = wide["shape"], make_dummy_rank.RANK_DRAFTER
    assert (d["hidden_size"], d["num_attention_heads"], d["num_key_value_heads"]) == (
        shape["hidden"],
        shape["heads"],
        shape["kv_heads"],
    )
    assert (d["head_dim"], d["intermediate_size"]) == (shape["head_dim"], shape["intermediate"])
    vocabs = (wide["vocab_size"], wide["draft_vocab_size"])
    assert (d["vocab_size"], d["draft_vocab_size"]) == vocabs
    # SGLang-format ids are one less than speculators' (llama_eagle3 captures id + 1)
    assert tuple(wide["aux_ids"]) == make_dummy_rank.SPECULATORS_AUX_IDS
    sglang_ids = d["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert [i + 1 for i in sglang_ids] == list(make_dummy_rank.SPECULATORS_AUX_IDS)
    target = make_dummy_rank.RANK_TARGET
    assert d["max_position_embeddings"] >= target["max_position_embeddings"]
    assert d["vocab_size"] == target["vocab_size"]


def test_writes_config_only_folders_and_prompts_inside_the_vocabulary(tmp_path):
    assert make_dummy_rank.main(tmp_path) == 0
    for name in ("target", "drafter"):
        assert [p.name for p in (tmp_path / name).iterdir()] == ["config.json"]
    target = json.loads((tmp_path / "target" / "config.json").read_text())
    assert target == make_dummy_rank.RANK_TARGET
    prompts = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 16
    assert all(3 <= t < target["vocab_size"] for p in prompts for t in p["input_ids"])


def test_8b_maker_unchanged_by_the_shared_writer(tmp_path):
    assert make_dummy_8b.main(tmp_path) == 0
    drafter = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert drafter["draft_vocab_size"] == 32000 and drafter["hidden_size"] == 4096
    first = json.loads((tmp_path / "prompts.jsonl").read_text().splitlines()[0])["input_ids"]
    assert len(first) == 200 and max(first) < 32000
