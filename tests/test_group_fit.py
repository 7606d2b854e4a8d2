"""group_fit: a bench group that cannot fit one GPU is refused before any server starts."""

import json

import pytest

from sglang_ext_tools import bench_speed as bs
from sglang_ext_tools import group_fit

GIB = 1 << 30
# the seed's rank shape (seed-shape-2026-12-06-traced-…-wide-target-config's geometry)
MLA = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "hidden_size": 4096}  # fmt: skip
H100_MIB, H200_MIB = 81559, 143771


def _model(path, config, weight_bytes):
    """A model directory: config.json and one sparse weight file of ``weight_bytes``."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    with (path / "model.safetensors").open("wb") as f:
        f.truncate(weight_bytes)
    return path


def test_kv_bytes_per_token_mla_and_gqa():
    # MLA keeps latent + rope key per layer: 576 x 61 x 2 bytes (SGLang logged 1.07 GiB for
    # 16,384 tokens on 2026-12-06)
    assert group_fit.kv_bytes_per_token(MLA) == 576 * 61 * 2
    assert group_fit.kv_bytes_per_token(MLA) * 16384 / GIB == pytest.approx(1.07, abs=0.01)
    assert group_fit.kv_bytes_per_token(LLAMA_8B) == 2 * 8 * 128 * 32 * 2
    assert group_fit.kv_bytes_per_token({"hidden_size": 64}) is None


def test_server_bytes_sums_weights_kv_and_overhead(tmp_path):
    target = _model(tmp_path / "t", MLA, int(25.3 * GIB))
    drafter = _model(tmp_path / "d", {}, int(0.9 * GIB))
    est = group_fit.server_bytes(target, drafter, 16384)
    assert est["target_weights"] == 25.3 and est["drafter_weights"] == 0.9
    assert est["kv_cache"] == pytest.approx(1.07, abs=0.01)
    assert est["total"] == pytest.approx(25.3 + 0.9 + 1.07 + group_fit.OVERHEAD_GIB, abs=0.01)
    assert group_fit.server_bytes(target, None, 16384)["drafter_weights"] == 0
    assert "max-total-tokens" in group_fit.server_bytes(target, drafter, None)["skipped"]
    empty = tmp_path / "dummy"
    empty.mkdir()
    assert "no weight files" in group_fit.server_bytes(empty, None, 16384)["skipped"]
    # what SGLang loads: a safetensors file beside a pickle of the same weights counts once
    with (tmp_path / "t" / "pytorch_model.bin").open("wb") as f:
        f.truncate(int(25.3 * GIB))
    assert group_fit.server_bytes(target, drafter, 16384)["target_weights"] == 25.3


def _sizes(names, total):
    return {n: {"total": total} for n in names}


def test_the_2026_12_06_h100_group_is_refused_and_two_fit():
    """Three rank-shape servers (~28.3 GiB each) on an H100, as the eighth run started them:
    refused, naming each server and the --at-once that fits; two fit; four fit an H200."""
    three = [["nospec", "spec-5-1-6", "spec-5-1-6-pg"]]
    out = group_fit.check(three, _sizes(three[0], 28.3), H100_MIB, 0.9)
    assert "spec-5-1-6-pg 28.3" in out["refused"] and "--at-once 2 fits" in out["refused"]
    assert out["groups"] == [{"servers": three[0], "gib": 84.9}]
    two = [["nospec", "spec-3-1-4"]]
    assert "refused" not in group_fit.check(two, _sizes(two[0], 28.3), H100_MIB, 0.9)
    four = [["nospec", "spec-5-1-6", "b", "c"]]
    assert "refused" not in group_fit.check(four, _sizes(four[0], 28.3), H200_MIB, 0.9)
    huge = group_fit.check(two, _sizes(two[0], 60.0), H100_MIB, 0.9)
    assert "not even the baseline and one server fit" in huge["refused"]


def test_the_bound_is_mem_fraction_of_the_gpu_not_all_of_it():
    """2026-12-06, fourteenth session: the estimate of three rank-shape servers (the run's
    group_fit record) was 78.36 GiB on an H100's 79.65. Against the whole GPU that fitted,
    and SGLang refused two of the three at --mem-fraction 0.9 (its KV-cache check asked for
    0.958 and 0.961). Against 0.9 of the GPU (71.7 GiB) the group is refused, and pairs fit."""
    sizes = {"nospec": {"total": 25.66}, "spec-5-1-6": {"total": 26.35}, "b": {"total": 26.35}}
    group = [list(sizes)]
    assert "refused" not in group_fit.check(group, sizes, H100_MIB, 1.0)  # the old rule
    out = group_fit.check(group, sizes, H100_MIB, 0.9)
    assert out["bound_gib"] == pytest.approx(71.68, abs=0.01)
    assert "over 71.7 GiB: --mem-fraction 0.9 of a 79.6 GiB GPU" in out["refused"]
    assert "--at-once 2 fits" in out["refused"]
    pairs = [["nospec", "spec-5-1-6"], ["nospec", "b"]]
    assert "refused" not in group_fit.check(pairs, sizes, H100_MIB, 0.9)
    # the seventh run's four servers on an H200 (they all started) pass the same bound
    four = {**sizes, "c": {"total": 26.35}}
    assert "refused" not in group_fit.check([list(four)], four, H200_MIB, 0.9)


def test_no_check_without_gpu_or_estimates():
    names = [["nospec", "spec"]]
    assert "NVML" in group_fit.check(names, _sizes(names[0], 99.0), None, 0.9)["skipped"]
    sizes = {"nospec": {"skipped": "no weight files in T"}, "spec": {"total": 99.0}}
    out = group_fit.check(names, sizes, H100_MIB, 0.9)
    assert out["skipped"] == "no weight files in T" and "refused" not in out


@pytest.fixture
def rank_shape_on_h100(tmp_path, monkeypatch):
    """bench_speed's arguments for the rank-shape pair (its weight files' sizes, sparse) on
    an H100 that starts no server: --target, --drafter, --prompts."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input_ids": [k + 1]}) + "\n" for k in range(4)))
    # the rank shape's weight files (the fourteenth session's group_fit record)
    target = _model(tmp_path / "target", MLA, int(23.58 * GIB))
    drafter = _model(tmp_path / "drafter", {"draft_vocab_size": 32000}, int(0.69 * GIB))
    monkeypatch.setattr(bs, "gpu_info", lambda: {"name": "H100", "memory_total_mib": H100_MIB})
    monkeypatch.setattr(bs, "start_all", lambda *a: pytest.fail("a server was started"))
    return ["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts)]


def test_bench_refuses_a_group_that_does_not_fit_before_starting_any(
    rank_shape_on_h100, tmp_path, capsys
):
    argv = [*rank_shape_on_h100, "--settings", "3,1,4", "5,1,6", "--mem-fraction", "0.9",
            "--at-once", "3", "--max-total-tokens", "16384",
            "--out-json", str(tmp_path / "r.json")]  # fmt: skip
    assert bs.main(argv) == 2
    err = capsys.readouterr().err
    assert "error: --at-once 3: group ['nospec', 'spec-3-1-4', 'spec-5-1-6']" in err
    assert "--at-once 2 fits" in err and not (tmp_path / "r.json").exists()
    # the dry run shows the same estimate and exits non-zero
    assert bs.main([*argv, "--dry-run"]) == 2
    dry = json.loads(capsys.readouterr().out)
    assert dry["group_fit"]["servers"]["spec-3-1-4"]["total"] == pytest.approx(26.34, abs=0.01)
    # two at a time fit: the dry run passes
    assert bs.main([*argv[:-2], "--at-once", "2", "--dry-run"]) == 0


def test_at_once_fit_lowers_at_once_until_every_group_fits(rank_shape_on_h100, monkeypatch, capsys):
    """--at-once-fit: the H100 fallback of a run sized for an H200 regroups instead of
    refusing, and the result says from what and why."""
    base = [*rank_shape_on_h100, "--settings", "3,1,4", "5,1,6", "--mem-fraction", "0.9",
            "--max-total-tokens", "16384", "--dry-run", "--at-once-fit"]  # fmt: skip
    for at_once in (["--at-once", "3"], []):  # given, and all at once (the default)
        assert bs.main([*base, *at_once]) == 0
        dry = json.loads(capsys.readouterr().out)
        assert dry["groups"] == [["nospec", "spec-3-1-4"], ["nospec", "spec-5-1-6"]]
        assert dry["group_fit"]["lowered"]["from"] == 3 and dry["group_fit"]["lowered"]["to"] == 2
        assert "--at-once 2 fits" in dry["group_fit"]["lowered"]["because"]
    # where not even two fit, it still refuses
    monkeypatch.setattr(bs, "gpu_info", lambda: {"name": "small", "memory_total_mib": 40000})
    assert bs.main(base) == 2
    assert "not even the baseline and one server fit" in capsys.readouterr().err


def test_prefill_graph_counts_per_server(tmp_path):
    target = _model(tmp_path / "t", MLA, int(23.58 * GIB))
    plain = group_fit.server_bytes(target, None, 16384)
    graph = group_fit.server_bytes(target, None, 16384, prefill_graph=True)
    assert "prefill_graph" not in plain
    assert graph["total"] == pytest.approx(plain["total"] + group_fit.PREFILL_GRAPH_GIB, abs=0.01)
    # which server commands capture it: --prefill-graph's flag, or a variant's own after it
    # (the last wins, in either spelling); no flag at all is SGLang 0.5.23's default
    flag, off, on = "--cuda-graph-backend-prefill", "disabled", "breakable"
    assert bs.captures_prefill_graph(["--max-total-tokens", "16384", flag, on])
    assert not bs.captures_prefill_graph([flag, off, "--max-total-tokens", "16384"])
    assert bs.captures_prefill_graph([flag, off, flag, on])
    assert bs.captures_prefill_graph([flag, off, f"{flag}={on}"])
    assert not bs.captures_prefill_graph([flag, on, f"{flag}={off}"])
    assert bs.captures_prefill_graph(["--max-total-tokens", "16384"])


def _seed_shape_dry_run(model_args: list, capsys, *settings_and_variants: str) -> dict:
    """bench_speed's dry run as the seed-shape pipeline calls it with every server on the
    prefill graph (--at-once 4, lowered by --at-once-fit where the group does not fit)."""
    argv = [*model_args, "--settings", *settings_and_variants, "--mem-fraction", "0.9",
            "--max-total-tokens", "16384", "--prefill-graph", "breakable", "--at-once", "4",
            "--at-once-fit", "--dry-run"]  # fmt: skip
    assert bs.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_the_fourteenth_sessions_h100_command_regroups_into_pairs(rank_shape_on_h100, capsys):
    """The command that lost both 5/1/6 servers on 2026-12-06 (every server with the prefill
    graph, a twin of 5/1/6, --at-once 4 lowered by --at-once-fit): its dry run now plans the
    pairs that fit, and a pg variant alone is counted with its graph."""
    dry = _seed_shape_dry_run(
        rank_shape_on_h100, capsys, "3,1,4", "5,1,6", "--variant", "b@5,1,6:SGLANG_EXT_INSTANCE=b"
    )
    assert dry["groups"] == [
        ["nospec", "spec-3-1-4"], ["nospec", "spec-5-1-6"], ["nospec", "spec-5-1-6-b"]
    ]  # fmt: skip
    assert all("prefill_graph" in s for s in dry["group_fit"]["servers"].values())
    argv = [*rank_shape_on_h100, "--settings", "5,1,6", "--variant",
            "pg@5,1,6:--cuda-graph-backend-prefill=breakable", "--mem-fraction", "0.9",
            "--max-total-tokens", "16384", "--at-once", "2", "--dry-run"]  # fmt: skip
    assert bs.main(argv) == 0
    servers = json.loads(capsys.readouterr().out)["group_fit"]["servers"]
    assert "prefill_graph" in servers["spec-5-1-6-pg"] and "prefill_graph" not in servers["nospec"]


def test_the_fifteenth_sessions_registered_command_plans_three_pairs_or_one_group(
    rank_shape_on_h100, monkeypatch, capsys
):
    """#24's next registered run (docs/next-device-sessions.md, after the tenth): 5/1/6, a server on
    caches of its own and one with the fused MoE's PDL off. On an H100 three pairs with the
    baseline; on an H200 one group of four. Each variant carries its env and nothing else."""
    variants = ["--variant", "nopdl@5,1,6:SGLANG_EXT_MOE_PDL=0",
                "--variant", "fresh@5,1,6:SGLANG_CACHE_DIR=/tmp/sgl-fresh"
                "+SGLANG_JIT_CACHE_DIR=/tmp/sgl-fresh/jit"
                "+TRITON_CACHE_DIR=/tmp/sgl-fresh/triton"]  # fmt: skip
    dry = _seed_shape_dry_run(rank_shape_on_h100, capsys, "5,1,6", *variants)
    # nopdl second: a lease cut to two pairs keeps the warm-cache server without PDL
    assert dry["groups"] == [
        ["nospec", "spec-5-1-6"], ["nospec", "spec-5-1-6-nopdl"], ["nospec", "spec-5-1-6-fresh"]
    ]  # fmt: skip
    env = {s["name"]: s["env"] for s in dry["servers"]}
    assert env["spec-5-1-6-nopdl"].get("SGLANG_EXT_MOE_PDL") == "0"
    assert env["spec-5-1-6-fresh"]["TRITON_CACHE_DIR"] == "/tmp/sgl-fresh/triton"
    assert "SGLANG_EXT_MOE_PDL" not in env["spec-5-1-6-fresh"]
    assert not any(k.endswith("CACHE_DIR") for k in env["spec-5-1-6"])

    def flags(name):  # the server's command less its port
        cmd = next(s["command"] for s in dry["servers"] if s["name"] == name)
        port = cmd.index("--port")
        return cmd[:port] + cmd[port + 2 :]

    assert flags("spec-5-1-6-nopdl") == flags("spec-5-1-6") == flags("spec-5-1-6-fresh")
    monkeypatch.setattr(bs, "gpu_info", lambda: {"name": "H200", "memory_total_mib": H200_MIB})
    dry = _seed_shape_dry_run(rank_shape_on_h100, capsys, "5,1,6", *variants)
    assert dry["groups"] == [["nospec", "spec-5-1-6", "spec-5-1-6-nopdl", "spec-5-1-6-fresh"]]


def test_the_twenty_fifth_sessions_h200_command_plans_three_groups(
    rank_shape_on_h100, monkeypatch, capsys
):
    """#24's next registered run (docs/next-device-sessions.md, twenty-fifth session): the
    trained pipeline's settings and pair with three `join` variants. On an H200: each
    variant in its plain server's group, `join@nospec` beside the plugin/stock pair."""
    monkeypatch.setattr(bs, "gpu_info", lambda: {"name": "H200", "memory_total_mib": H200_MIB})
    drafter = rank_shape_on_h100[3]
    dry = _seed_shape_dry_run(
        rank_shape_on_h100, capsys, "3,1,4", "5,1,6", "3,4,5", "--drafter-nbr-false", drafter,
        "--drafter-nbr-false-sglang", drafter, "--compare-setting", "3,1,4",
        "--variant", "join@nospec:SGLANG_EXT_MOE_SHARED_STREAM=join",
        "--variant", "join@5,1,6:SGLANG_EXT_MOE_SHARED_STREAM=join",
        "--variant", "join@3,4,5:SGLANG_EXT_MOE_SHARED_STREAM=join")  # fmt: skip
    assert dry["groups"] == [
        ["nospec", "spec-3-1-4", "spec-5-1-6", "spec-5-1-6-join"],
        ["nospec", "spec-3-4-5", "spec-3-4-5-join"],
        ["nospec", "nbrfalse-plugin-3-1-4", "nbrfalse-stock-3-1-4", "nospec-join"],
    ]  # fmt: skip
    env = {s["name"]: s.get("env", {}) for s in dry["servers"]}
    assert all(env[n]["SGLANG_EXT_MOE_SHARED_STREAM"] == "join" for n in env if "join" in n)
    assert not any("SGLANG_EXT_MOE_SHARED_STREAM" in env[n] for n in env if "join" not in n)


def test_the_twenty_sixth_sessions_h100_trained_command_plans_three_pairs(
    rank_shape_on_h100, capsys
):
    """#24's next registered run where no H200 comes (docs/next-device-sessions.md,
    twenty-sixth session): the trained pipeline on an H100 with 5/1/6, `join` 5/1/6 and
    `join@nospec`, no plugin/stock pair. Three pairs with the baseline, as the tenth run's."""
    dry = _seed_shape_dry_run(
        rank_shape_on_h100, capsys, "5,1,6",
        "--variant", "join@5,1,6:SGLANG_EXT_MOE_SHARED_STREAM=join",
        "--variant", "join@nospec:SGLANG_EXT_MOE_SHARED_STREAM=join")  # fmt: skip
    # the variants in the order given: a lease cut before the last pair keeps `join` 5/1/6,
    # whose η over the stock baseline is #24's reading
    assert dry["groups"] == [
        ["nospec", "spec-5-1-6"], ["nospec", "spec-5-1-6-join"], ["nospec", "nospec-join"]
    ]  # fmt: skip


def test_the_twenty_seventh_sessions_h100_batch_command_plans_three_pairs(
    rank_shape_on_h100, capsys
):
    """The H100 branch registered by the twenty-seventh session (docs/next-device-sessions.md):
    trained 3/1/4, `join` 3/1/4 and `join@nospec` at batches 1, 4 and 16, profiled after the
    rounds. Three pairs with the baseline, `join` 3/1/4 first after the plain server."""
    dry = _seed_shape_dry_run(
        rank_shape_on_h100, capsys, "3,1,4", "--batches", "1", "4", "16", "--rounds", "3",
        "--profile", "--variant", "join@3,1,4:SGLANG_EXT_MOE_SHARED_STREAM=join",
        "--variant", "join@nospec:SGLANG_EXT_MOE_SHARED_STREAM=join")  # fmt: skip
    assert dry["groups"] == [
        ["nospec", "spec-3-1-4"], ["nospec", "spec-3-1-4-join"], ["nospec", "nospec-join"]
    ]  # fmt: skip
