"""sglang_ext_tools.fixtures.make_mla_fixtures at tiny scale on CPU: the deepened MLA + MoE
target (widened by spare dimensions, marker layers around every captured id) computes what the
trained one computes, the deep drafter computes what the small one computes and drowns in the
marker one id off, and the seed's configuration is what stock SGLang serves silently unfused
and the plugin refuses, naming both widths."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from sglang_ext.cli import doctor

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    return importlib.import_module("sglang_ext_tools.fixtures.make_mla_fixtures")


@pytest.fixture(scope="module")
def mla_script():
    return _load_script()


@pytest.fixture(scope="module")
def mla_fixtures(mla_script, tmp_path_factory):
    out = tmp_path_factory.mktemp("mla")
    argv = ["--stage", "all", "--scale", "tiny", "--device", "cpu", "--out", str(out)]
    assert mla_script.main(argv) == 0
    return out, json.loads((out / "mla-fixtures.json").read_text())["stages"]


def test_deepen_places_layers_and_zeroes_only_residual_writes(mla_script):
    small = {
        "model.embed_tokens.weight": torch.ones(4, 2),
        "model.layers.0.mlp.down_proj.weight": torch.ones(2, 2),
        "model.layers.1.self_attn.o_proj.weight": torch.full((2, 2), 2.0),
        "model.layers.1.self_attn.q_a_proj.weight": torch.full((2, 2), 3.0),
        "model.layers.1.mlp.experts.0.down_proj.weight": torch.full((2, 2), 4.0),
        "model.layers.1.mlp.shared_experts.down_proj.weight": torch.full((2, 2), 5.0),
        "model.layers.1.mlp.gate.weight": torch.full((2, 2), 6.0),
    }
    deep = mla_script.deepen_state_dict(small, 2, (0, 2), 4, template_layer=1)
    assert torch.equal(
        deep["model.layers.2.self_attn.o_proj.weight"],
        small["model.layers.1.self_attn.o_proj.weight"],
    )
    for j in (1, 3):  # identity blocks: residual writes zero, the rest copied
        assert not deep[f"model.layers.{j}.self_attn.o_proj.weight"].any()
        assert not deep[f"model.layers.{j}.mlp.experts.0.down_proj.weight"].any()
        assert not deep[f"model.layers.{j}.mlp.shared_experts.down_proj.weight"].any()
        assert torch.equal(deep[f"model.layers.{j}.mlp.gate.weight"], torch.full((2, 2), 6.0))
        assert torch.equal(
            deep[f"model.layers.{j}.self_attn.q_a_proj.weight"], torch.full((2, 2), 3.0)
        )
    assert (
        "model.layers.0.mlp.down_proj.weight" in deep
        and "model.layers.4.mlp.gate.weight" not in deep
    )
    with pytest.raises(ValueError, match="increasing"):
        mla_script.deepen_state_dict(small, 2, (0, 0), 4, template_layer=1)
    with pytest.raises(ValueError, match="below 4"):
        mla_script.deepen_state_dict(small, 2, (0, 4), 4, template_layer=1)


def test_deep_target_computes_what_the_trained_target_computes(mla_fixtures):
    out, stages = mla_fixtures
    check = stages["deepen"]["function_check"]
    assert check["dtype"] == "float32"
    # fp32 sums the widened mean square in another order and the flag moves it by < 2^-24:
    # not bit-exact in fp32, far below bf16 (bf16: test_marker_pairs_cancel_exactly_in_bf16)
    assert check["max_abs_diff"] < 1e-4 and check["top1_agreement"] == 1.0, check
    config = json.loads((out / "deep-target" / "config.json").read_text())
    assert config["num_hidden_layers"] == 18 and config["model_type"] == "deepseek_v3"
    small = stages["base"]["small_target"]["hidden_size"]
    assert config["hidden_size"] == small * 4
    assert config["q_lora_rank"] and config["kv_lora_rank"] and config["n_routed_experts"] == 4


def test_deep_drafter_is_servable_on_the_deep_target(mla_fixtures, mla_script):
    out, stages = mla_fixtures
    scale = mla_script.TINY
    ids = stages["deepen"]["deep_drafter"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == list(scale.deep_ids) == [3, 9, 15]
    report = doctor.diagnose(out / "deep-drafter", target=out / "deep-target").to_json()
    assert report["verdict"] == "OK", report["errors"]
    assert report["aux_layers"]["captured_layers"] == ids


def test_seed_configuration_stock_skips_fc_plugin_refuses_naming_both_widths(mla_fixtures):
    out, stages = mla_fixtures
    hidden = stages["deepen"]["deep_target"]["hidden_size"]
    config = json.loads((out / "seed-drafter" / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [14]
    assert config["num_aux_hidden_states"] == 3
    report = doctor.diagnose(out / "seed-drafter", target=out / "deep-target").to_json()
    assert report["verdict"] == "ERROR"
    widths = [e for e in report["errors"] if e.startswith("widths:")]
    assert widths and f"{hidden} features" in widths[0] and f"= {3 * hidden}" in widths[0]
    assert "fusion silently skipped" in report["stock_sglang"]["summary"]


def test_served_geometry_fits_sglang_triton_mla_decode(mla_script):
    mla_script.check_served_geometry(mla_script.FULL.target)
    with pytest.raises(SystemExit, match="= 80"):  # the 2026-11-30 fixture's 64 + 16
        mla_script.check_served_geometry({"kv_lora_rank": 64, "qk_rope_head_dim": 16})


# -- off-by-one exposure --------------------------------------------------------------------


def test_neighbours_of_every_captured_layer_carry_the_marker(mla_fixtures, mla_script):
    """In the deep target the state entering each captured layer is the small model's state
    (spare dimensions: the flag, no marker), and the states entering the layers before and
    after it carry the marker on top of it, so a drafter served one id off sees other
    features; the build's own check (bf16-exact on CUDA) passed."""
    from sglang_ext_tools import reference as ref

    out, stages = mla_fixtures
    deepen = stages["deepen"]
    assert deepen["marker_check"]["pass"], deepen["marker_check"]
    ids = deepen["deep_drafter"]["eagle_aux_hidden_state_layer_ids"]
    values = deepen["deep_target"]["markers"]
    small_width, marker = values["small_hidden"], values["marker"]
    prompt = json.loads((out / "prompts.jsonl").read_text().splitlines()[0])["input_ids"]
    x = torch.tensor([prompt])
    deep = ref.load_target(out / "deep-target")
    small = ref.load_target(out / "small-target")
    with torch.no_grad():
        _, hidden = ref.collect_hidden_states(deep, x)
        _, small_hidden = ref.collect_hidden_states(small, x)
    assert len(hidden) == 18 + 1
    for small_id, k in zip(mla_script.TINY.aux_ids, ids, strict=True):
        here = hidden[k][0]
        torch.testing.assert_close(here[:, :small_width], small_hidden[small_id][0])
        assert torch.all(here[:, small_width] == values["flag"])
        assert here[:, small_width + 1 :].abs().max() <= marker * mla_script.FP32_TRACE
        for neighbour in (k - 1, k + 1):
            spare = hidden[neighbour][0][:, small_width + 1 :]
            assert torch.allclose(spare.abs(), torch.full_like(spare, marker)), (k, neighbour)
            assert torch.equal(hidden[neighbour][0][:, :small_width], here[:, :small_width])


def test_the_deep_drafter_computes_the_small_one_and_drowns_one_id_off(mla_fixtures, mla_script):
    """fc of the deep drafter on the deep target's captured states equals the small drafter's
    fc on the small target's (the marker columns read zeros there); on the states one id off
    the marker part (the negated mean feature) is FC_RATIO times the trained features' size.
    And the deep
    pair's reference continuation is the small pair's."""
    from sglang_ext_tools import reference as ref

    out, stages = mla_fixtures
    ids = stages["deepen"]["deep_drafter"]["eagle_aux_hidden_state_layer_ids"]
    small_ids = list(mla_script.TINY.aux_ids)
    prompt = json.loads((out / "prompts.jsonl").read_text().splitlines()[0])["input_ids"]
    deep_t, small_t = ref.load_target(out / "deep-target"), ref.load_target(out / "small-target")
    deep_d, small_d = (
        ref.load_drafter(out / "deep-drafter"),
        ref.load_drafter(out / "small-drafter"),
    )
    with torch.no_grad():
        deep_h = ref.aux_hidden_states(deep_t, prompt, sorted({*ids, *(k + 1 for k in ids)}))
        small_h = ref.aux_hidden_states(small_t, prompt, small_ids)
        fc_deep = deep_d.fc(torch.cat([deep_h[k] for k in ids], -1))
        fc_small = small_d.fc(torch.cat([small_h[k] for k in small_ids], -1))
        fc_off = deep_d.fc(torch.cat([deep_h[k + 1] for k in ids], -1))
    width = fc_small.shape[-1]  # the drafter is widened with the target: new rows zero
    torch.testing.assert_close(fc_deep[:, :width], fc_small, atol=1e-5, rtol=1e-4)
    assert not fc_deep[:, width:].any()  # the drafter's own widened rows compute nothing
    ratio = ((fc_off - fc_deep).norm(dim=-1) / fc_deep.norm(dim=-1)).median().item()
    assert ratio > 2.0, ratio  # FC_RATIO times the median trained size
    r = mla_script.TINY.reference
    deep = ref.evaluate_tau(
        deep_t, deep_d, [prompt], num_steps=3, max_new_tokens=r["max_new_tokens"]
    )
    small = ref.evaluate_tau(
        small_t, small_d, [prompt], num_steps=3, max_new_tokens=r["max_new_tokens"]
    )
    assert deep["per_prompt"][0]["tokens"] == small["per_prompt"][0]["tokens"]
    assert deep["tau"] == small["tau"]


def test_shifted_drafters_carry_shifted_ids_and_are_servable(mla_fixtures):
    out, stages = mla_fixtures
    deep = stages["deepen"]["deep_drafter"]["eagle_aux_hidden_state_layer_ids"]
    shifted = stages["deepen"]["shifted_drafters"]
    base_cfg = json.loads((out / "deep-drafter" / "config.json").read_text())
    for key, shift, expect in (("plus1", 1, [4, 10, 16]), ("minus1", -1, [2, 8, 14])):
        entry = shifted[key]
        assert entry == {
            "dir": f"deep-drafter-{key}",
            "eagle_aux_hidden_state_layer_ids": expect,
            "shift": shift,
        }
        assert expect == [k + shift for k in deep]
        config = json.loads((out / entry["dir"] / "config.json").read_text())
        assert config["eagle_aux_hidden_state_layer_ids"] == expect
        # otherwise identical to the trained deep drafter
        assert {k: v for k, v in config.items() if k != "eagle_aux_hidden_state_layer_ids"} == {
            k: v for k, v in base_cfg.items() if k != "eagle_aux_hidden_state_layer_ids"
        }
        assert (out / entry["dir"] / "model.safetensors").read_bytes() == (
            out / "deep-drafter" / "model.safetensors"
        ).read_bytes()
        # the plugin accepts both
        report = doctor.diagnose(out / entry["dir"], target=out / "deep-target").to_json()
        assert report["verdict"] == "OK", report["errors"]
        assert report["aux_layers"]["captured_layers"] == expect


def test_layouts_put_markers_around_every_captured_id(mla_script):
    from sglang_ext_tools.fixtures import markers

    for scale in (mla_script.FULL, mla_script.TINY):
        mla_script.deep_aux_ids(scale)  # checks the layout
    assert mla_script.deep_aux_ids(mla_script.FULL) == [3, 30, 50]
    # the GPU suite's MLA tau equivalence (like for like) runs on 64 held-out prompts; the
    # free-running reference (recorded beside it) on a subset of them
    assert mla_script.FULL.num_prompts >= 64
    assert mla_script.FULL.num_prompts >= mla_script.FULL.reference["prompts"]
    # the 2026-12-01 layout (small layers adjacent to ids 1, 30, 50) has no room for markers
    old = mla_script.dataclasses.replace(
        mla_script.FULL, placement=(0, 1, 29, 30, 49, 50), deep_ids=(1, 30, 50)
    )
    with pytest.raises(markers.MarkerError, match="captured id 1"):
        mla_script.deep_aux_ids(old)


def test_widen_stage_keeps_what_the_deep_pair_computes(mla_fixtures, mla_script):
    """--stage widen (the seed-shape speed fixtures) at the tiny scale's rank shape: the wide
    target's logits and the wide pair's reference tau are the deep pair's (fp32 on CPU)."""
    out, _ = mla_fixtures
    argv = ["--stage", "widen", "--scale", "tiny", "--device", "cpu", "--out", str(out)]
    assert mla_script.main(argv) == 0
    stage = json.loads((out / "mla-fixtures.json").read_text())["stages"]["widen"]
    rank = mla_script.TINY.rank
    target_cfg = json.loads((out / "wide-target" / "config.json").read_text())
    assert (target_cfg["hidden_size"], target_cfg["q_lora_rank"]) == (rank.hidden, rank.q_lora)
    assert target_cfg["moe_intermediate_size"] == rank.moe_intermediate
    latent = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    assert [target_cfg[k] for k in latent] == [rank.kv_lora, rank.rope, rank.nope, rank.v]
    assert stage["wide_target"]["softmax_q_factor"] == pytest.approx(2**0.5)
    assert target_cfg["n_routed_experts"] == 4 * rank.expert_split  # the experts split
    assert target_cfg["num_experts_per_tok"] == 2 * rank.expert_split
    drafter_cfg = json.loads((out / "wide-drafter" / "config.json").read_text())
    layer = drafter_cfg["transformer_layer_config"]
    deep_ids = json.loads((out / "deep-drafter" / "config.json").read_text())[
        "eagle_aux_hidden_state_layer_ids"
    ]
    assert drafter_cfg["eagle_aux_hidden_state_layer_ids"] == deep_ids
    assert layer["hidden_size"] == rank.hidden
    assert layer["num_attention_heads"] * layer["head_dim"] == mla_script.TINY.rank_drafter.q
    check = stage["function_check"]
    assert check["top1_agreement"] == 1.0 and check["max_abs_diff"] < 1e-3, check
    tau = stage["reference_tau"]
    assert tau["identical_outputs"] == tau["prompts"], tau
    assert tau["wide"] == pytest.approx(tau["deep"], abs=1e-4), tau


def test_no_reference_skips_only_the_suites_reference_tau(mla_fixtures, mla_script, tmp_path):
    """The seed-shape pipeline builds with --no-reference (~64 s of device time): the drafter
    is trained and recorded as before, its free-running reference is not run."""
    out, stages = mla_fixtures
    assert stages["drafter"]["small_drafter"]["reference"]  # the default runs it
    copy = tmp_path / "mla"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "reference")
    argv = ["--stage", "drafter", "--scale", "tiny", "--device", "cpu", "--out", str(copy)]
    assert mla_script.main([*argv, "--no-reference"]) == 0
    drafter = json.loads((copy / "stage-drafter.json").read_text())["small_drafter"]
    assert drafter["reference"] == {} and not (copy / "reference").exists()
    assert drafter["train"] and (copy / "small-drafter" / "config.json").exists()


def test_no_wide_tau_keeps_the_widen_stages_logit_check(mla_fixtures, mla_script, tmp_path):
    """The seed-shape pipeline widens with --no-wide-tau (209 s of the H200 on 2026-12-02):
    the wide pair is written and its logits checked as before; the reference tau says it was
    skipped rather than being absent."""
    out, _ = mla_fixtures
    copy = tmp_path / "mla"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("wide-*"))
    argv = ["--stage", "widen", "--scale", "tiny", "--device", "cpu", "--out", str(copy)]
    assert mla_script.main([*argv, "--no-wide-tau"]) == 0
    stage = json.loads((copy / "stage-widen.json").read_text())
    assert stage["reference_tau"] == {"skipped": "--no-wide-tau"}
    check = stage["function_check"]
    assert check["top1_agreement"] == 1.0 and check["max_abs_diff"] < 1e-3, check
    assert (copy / "wide-target" / "config.json").exists()
    assert (copy / "wide-drafter" / "config.json").exists()


def test_kimi_rank_drafter_widths_keep_the_small_drafters_head_dim():
    from sglang_ext_tools import widen, widen_mla

    small = widen.Shape(hidden=384, heads=8, kv_heads=8, head_dim=32, intermediate=1024)
    big = widen_mla.KIMI_K25_TP8_DRAFTER.shape(small)
    assert (big.hidden, big.head_dim, big.intermediate) == (7168, 32, 2304)
    assert big.heads * big.head_dim == 1024 and big.kv_heads * big.head_dim == 1024
    widen.Widening(small, big)  # a valid widening (no WidenError)
    with pytest.raises(widen.WidenError, match="head_dim"):
        widen_mla.DrafterRankWidths(7168, 1000, 1024, 2304).shape(small)


def test_marker_pairs_cancel_exactly_in_bf16(mla_fixtures, mla_script):
    """The served numeric class: the writer's and the eraser's bf16 outputs are exact
    negatives (the latent both read rounds to one value), so the captured states carry no
    trace of the marker at all; fp32 (the build's CPU check) keeps a FP32_TRACE one."""
    from sglang_ext_tools.fixtures import markers
    from sglang_ext_tools.fixtures.data import heldout_chunks

    out, stages = mla_fixtures
    recorded = dict(stages["deepen"]["deep_target"]["markers"])
    recorded.pop("marker_dims")
    values = markers.MarkerValues(**recorded)
    streams = torch.load(out / "streams.pt")
    chunks = heldout_chunks(streams["heldout"], mla_script.TINY.seq_len, 2)
    ids = list(mla_script.TINY.deep_ids)
    found = mla_script.marker_check(
        out / "deep-target", ids, values, chunks, "cpu", dtype=torch.bfloat16
    )
    assert found["pass"] and found["allowed_trace"] == 0.0, found
    assert found["worst"]["trace"] == found["worst"]["either_side"] == 0.0, found


# Every folder deepen and widen write that holds weights.
BUILT_MODELS = (
    "deep-target",
    "deep-drafter",
    "deep-drafter-plus1",
    "deep-drafter-minus1",
    "seed-drafter",
    "seed-nocapture-drafter",
    "wide-target",
    "wide-drafter",
)


def test_a_cached_bundle_deepens_and_widens_again_to_the_same_models(
    mla_fixtures, mla_script, tmp_path
):
    """fixtures.cache, kind mla: the trained small target and drafter packed on one node
    session and unpacked on the next give, through deepen and widen alone (seed-unpack), the
    same deep, shifted, seed and wide models bit for bit; the merged manifest keeps the
    cached stages' own records and says they came from a bundle."""
    from safetensors.torch import load_file

    from sglang_ext_tools.fixtures import cache

    out, stages = mla_fixtures
    original = tmp_path / "original"  # widen as the pipeline runs it (other tests widen `out`)
    shutil.copytree(out, original, ignore=shutil.ignore_patterns("wide-*"))
    tiny = ["--scale", "tiny", "--device", "cpu"]
    widen_argv = ["--stage", "widen", *tiny, "--no-wide-tau"]
    assert mla_script.main([*widen_argv, "--out", str(original)]) == 0

    bundle = tmp_path / "mla-fixtures.tar"
    record = cache.pack(out, bundle, "mla")
    assert record["kind"] == "mla"
    assert set(record["stages_created_unix"]) == {"stage-base.json", "stage-drafter.json"}
    again = tmp_path / "again"
    assert cache.unpack(bundle, again, "mla") == record
    assert not (again / "distill.pt").exists() and not (again / "deep-target").exists()
    assert set(torch.load(again / "streams.pt", weights_only=True)) == {"heldout"}
    for stage in (["--stage", "deepen", *tiny], widen_argv):
        assert mla_script.main([*stage, "--out", str(again)]) == 0
    manifest = json.loads((again / "mla-fixtures.json").read_text())
    assert manifest["cache"] == record  # the manifest says the small models were carried
    merged = manifest["stages"]
    assert set(merged) == {"base", "drafter", "deepen", "widen"}
    assert merged["base"] == stages["base"] and merged["drafter"] == stages["drafter"]
    for name in BUILT_MODELS:
        files = sorted(p.name for p in (original / name).glob("*.safetensors"))
        assert files and files == sorted(p.name for p in (again / name).glob("*.safetensors"))
        for file in files:
            a, b = load_file(str(original / name / file)), load_file(str(again / name / file))
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name

    with pytest.raises(cache.CacheError, match="already has"):
        cache.unpack(bundle, again)
    with pytest.raises(cache.CacheError, match=r"a 'mla' bundle \(cache.json\), expected 'speed'"):
        cache.unpack(bundle, tmp_path / "speed", "speed")
    with pytest.raises(cache.CacheError, match="never overwritten"):
        cache.pack(out, bundle, "mla")


def test_a_bundle_that_lacks_what_the_later_stages_read_is_refused(mla_fixtures, tmp_path):
    """Each refusal names the missing file; nothing is written where it was refused."""
    import tarfile

    from sglang_ext_tools.fixtures import cache

    out, _ = mla_fixtures
    partial = tmp_path / "partial"
    shutil.copytree(out / "small-target", partial / "small-target")
    with pytest.raises(cache.CacheError, match=r"trained mla-fixture folder .*'small-drafter'"):
        cache.pack(partial, tmp_path / "partial.tar", "mla")
    assert not (tmp_path / "partial.tar").exists()
    with pytest.raises(cache.CacheError, match="'small-drafter-nbr-true'"):
        cache.pack(out, tmp_path / "speed.tar", "speed")  # an mla folder is no speed one
    with pytest.raises(cache.CacheError, match="bundle kind 'dsv3'"):
        cache.pack(out, tmp_path / "dsv3.tar", "dsv3")
    shutil.copytree(out / "small-drafter", partial / "small-drafter")
    for name in cache.KINDS["mla"].files:
        shutil.copy(out / name, partial / name)
    torch.save({"train": torch.zeros(4, dtype=torch.int32)}, partial / "streams.pt")
    with pytest.raises(cache.CacheError, match=r"streams.pt: no 'heldout' entry"):
        cache.pack(partial, tmp_path / "partial.tar", "mla")  # fails half-way through the tar
    assert sorted(p.name for p in tmp_path.glob("partial.tar*")) == []

    def bundle(name: str, record: dict | None, with_streams: bool) -> Path:
        path = tmp_path / name
        with tarfile.open(path, "w") as tar:
            for member in ("small-target", "small-drafter", *cache.KINDS["mla"].files):
                tar.add(out / member, arcname=member)
            if with_streams:
                tar.add(out / "streams.pt", arcname="streams.pt")
            if record is not None:
                (tmp_path / "cache.json").write_text(json.dumps(record))
                tar.add(tmp_path / "cache.json", arcname="cache.json")
        return path

    dst = tmp_path / "dst"
    missing_streams = r"complete mla-fixture bundle, missing \['streams.pt'\]"
    with pytest.raises(cache.CacheError, match=missing_streams):
        cache.unpack(bundle("no-streams.tar", {"kind": "mla"}, False), dst)
    with pytest.raises(cache.CacheError, match="no cache.json"):
        cache.unpack(bundle("no-record.tar", None, True), dst)
    with pytest.raises(cache.CacheError, match="bundle kind 'dsv3'"):
        cache.unpack(bundle("unknown.tar", {"kind": "dsv3"}, True), dst)
    # a record without a kind: packed before kinds were recorded, so a speed bundle
    with pytest.raises(cache.CacheError, match="speed-fixture bundle, missing"):
        cache.unpack(bundle("old.tar", {"packed": "2026-12-03"}, True), dst)
    assert not dst.exists()


@pytest.fixture(scope="module")
def trained_mla(mla_script, tmp_path_factory):
    out = tmp_path_factory.mktemp("mla-cpu")
    argv = ["--stage", "all", "--scale", "cpu", "--device", "cpu", "--out", str(out)]
    assert mla_script.main(argv) == 0
    return out


def test_a_trained_drafter_one_id_off_collapses_to_the_no_features_floor(trained_mla):
    """What the GPU suite's off-by-one test asks of SGLang, on the offline reference: a drafter
    trained on CPU, teacher-forced on its own greedy text (24 prompts x 64 tokens) with its ids
    shifted by +1 and -1, loses at least 75 % of what its features add over the same drafter
    with fc zeroed (the paired interval of the share lost starts at 0.75 or above); the features
    are worth something to begin with (trained vs floor, interval above 1.1). When this test
    was written: trained 3.03, no features 2.13, either shift 1.17 (share lost 2.06, interval
    [1.57, 3.00]): one id off, the drafter drafts almost nothing that is accepted."""
    from sglang_ext_tools import reference as ref
    from sglang_ext_tools import tau_compare

    out = trained_mla
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").open()][:24]
    target = ref.load_target(out / "deep-target")
    trained = ref.load_drafter(out / "deep-drafter")
    free = ref.evaluate_tau(
        target, trained, [p["input_ids"] for p in prompts], num_steps=3, max_new_tokens=64
    )
    text = [{"output_ids": row["tokens"]} for row in free["per_prompt"]]
    floor = ref.load_drafter(out / "deep-drafter")
    with torch.no_grad():
        floor.fc.weight.zero_()
    drafters = {
        "trained": trained,
        "no_features": floor,
        **{s: ref.load_drafter(out / f"deep-drafter-{s}") for s in ("plus1", "minus1")},
    }
    rows = ref.teacher_forced_rows_shared(target, drafters, prompts, text, num_steps=3)
    counts = {k: [tau_compare.reference_counts(r) for r in v] for k, v in rows.items()}
    worth = tau_compare.non_inferiority(counts["trained"], counts["no_features"], 1.1)
    assert worth["pass"], worth
    for shift in ("plus1", "minus1"):
        found = tau_compare.collapse(counts[shift], counts["trained"], counts["no_features"])
        assert found["pass"], (shift, found)
