"""tune_moe's CPU parts: the shape from a config, the search space, the table SGLang reads
and where it goes (held against SGLang's own lookup), and the refusals."""

from __future__ import annotations

import json

import pytest

from sglang_ext_tools import tune_moe

KIMI_RANK = {
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "n_routed_experts": 32,
    "moe_intermediate_size": 256,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 1,
}


def test_shape_from_a_deepseek_config_counts_its_moe_layers():
    shape = tune_moe.MoeShape.from_config(KIMI_RANK)
    assert shape == tune_moe.MoeShape(32, 256, 7168, 8, 60)
    assert tune_moe.MoeShape.from_config(KIMI_RANK, tp=2).intermediate == 128


def test_shape_refuses_a_dense_config_naming_the_fields():
    with pytest.raises(ValueError, match="n_routed_experts, moe_intermediate_size"):
        tune_moe.MoeShape.from_config({"hidden_size": 4096, "num_experts_per_tok": 2})
    with pytest.raises(ValueError, match="does not split over tp 3"):
        tune_moe.MoeShape.from_config(KIMI_RANK, tp=3)


def test_candidates_fit_shared_memory_and_quick_is_a_subset():
    full = tune_moe.candidate_configs()
    quick = tune_moe.candidate_configs(quick=True)
    for cfg in full:
        smem = (cfg["BLOCK_SIZE_M"] + cfg["BLOCK_SIZE_N"]) * cfg["BLOCK_SIZE_K"] * 2
        assert smem * cfg["num_stages"] <= tune_moe.SMEM_BYTES
    assert all(cfg in full for cfg in quick)
    assert 20 <= len(quick) < len(full)


def test_table_keeps_the_search_and_fills_larger_counts_with_the_default():
    best = {1: {"BLOCK_SIZE_M": 16, "num_stages": 4}, 4: {"BLOCK_SIZE_M": 32, "num_stages": 3}}
    table = tune_moe.config_table(best, lambda m: {"BLOCK_SIZE_M": 64, "M": m}, fill=(2, 64))
    assert list(table) == ["1", "4", "64"]  # a fill count inside the search stays out
    assert table["4"] == best[4]
    assert table["64"] == {"BLOCK_SIZE_M": 64, "M": 64}


def test_written_table_is_what_sglang_looks_up(tmp_path, monkeypatch):
    cfg_mod = pytest.importorskip(
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config"
    )
    import triton

    def default(m):
        return cfg_mod.get_default_config(m, 32, 256, 7168, 8, None, False, None)

    monkeypatch.setattr(cfg_mod, "get_device_name", lambda device_id=0: "NVIDIA H200")
    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(tmp_path))
    best = {4: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}}
    cfg_mod.get_moe_configs.cache_clear()
    with tune_moe.sglang_context():
        table = tune_moe.config_table(best, default)
        path = tune_moe.config_path(
            tmp_path, triton.__version__, cfg_mod.get_config_file_name(32, 256, None)
        )
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(table))
        found = cfg_mod.get_moe_configs(32, 256, None)
        prefill_default = default(256)
    cfg_mod.get_moe_configs.cache_clear()
    assert path.name == "E=32,N=256,device_name=NVIDIA_H200.json"
    assert found == {int(m): c for m, c in table.items()}
    assert found[4] == best[4]
    # prefill (M 256) gets exactly what SGLang runs there without the file
    assert found[256] == prefill_default


def test_refuses_a_directory_that_is_not_empty(tmp_path, capsys):
    (tmp_path / "keep.json").write_text("{}")
    rc = tune_moe.main(
        [
            "--experts",
            "32",
            "--intermediate",
            "256",
            "--hidden",
            "7168",
            "--topk",
            "8",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 2
    assert f"{tmp_path}: exists and is not an empty directory" in capsys.readouterr().err
    assert (tmp_path / "keep.json").read_text() == "{}"


def test_needs_a_shape(tmp_path, capsys):
    assert tune_moe.main(["--experts", "32", "--out", str(tmp_path / "new")]) == 2
    assert "give --model, or all of" in capsys.readouterr().err


def test_reads_the_shape_from_the_model_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(KIMI_RANK))
    args = tune_moe.parse_args(["--model", str(tmp_path), "--out", str(tmp_path / "o")])
    assert tune_moe.shape_from_args(args).layers == 60


def test_search_keeps_the_fastest_per_count_skips_refused_configs_and_stops_in_time():
    default = {"BLOCK_SIZE_M": 16, "name": "default"}
    fast_small = {"BLOCK_SIZE_M": 16, "name": "fast_small"}
    refused = {"BLOCK_SIZE_M": 64, "name": "refused"}
    fast_large = {"BLOCK_SIZE_M": 32, "name": "fast_large"}
    late = {"BLOCK_SIZE_M": 32, "name": "late"}
    cost = {  # ms per (config, token count)
        ("default", 1): 0.05, ("default", 8): 0.12,
        ("fast_small", 1): 0.03, ("fast_small", 8): 0.13,
        ("fast_large", 1): 0.06, ("fast_large", 8): 0.07,
        ("late", 1): 0.001, ("late", 8): 0.001,
    }  # fmt: skip
    ticks = iter(range(100))

    def timed_ms(cfg, m):
        if cfg["name"] == "refused":
            raise RuntimeError("out of shared memory")
        return cost[cfg["name"], m]

    results = tune_moe.search(
        [1, 8],
        [fast_small, refused, fast_large, late],
        timed_ms,
        lambda m: default,
        time_limit=3.5,
        clock=lambda: next(ticks),  # one tick a config: the limit leaves out the fourth
    )
    assert results[1]["best"]["name"] == "fast_small" and results[1]["best_ms"] == 0.03
    assert results[8]["best"]["name"] == "fast_large" and results[8]["default_ms"] == 0.12
    assert results[1]["configs_timed"] == results[8]["configs_timed"] == 2
    assert results[8]["best"] is not fast_large  # a copy: the table never aliases a candidate
    # every candidate's time at each count, for setting two timing modes side by side
    assert [(t["config"]["name"], t["ms"]) for t in results[8]["timed"]] == [
        ("fast_small", 0.13), ("fast_large", 0.07)
    ]  # fmt: skip


def test_fused_experts_python_path_runs_inside_the_context(monkeypatch):
    """What the tuner times, SGLang's ``fused_experts_impl``, run through on CPU with its
    three kernel launches replaced (block alignment, the grouped GEMM, the top-k sum): every
    config and parallel read on the way is answered by ``sglang_context``. On the H200
    (2026-12-03) each call stopped at ``get_parallel().tp_group``; so does this test without
    the context's one rank."""
    fm = pytest.importorskip("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe")
    import torch
    from sglang.srt.layers.moe.moe_runner.triton_utils import override_config

    launched = []

    def align(topk_ids, block, experts, *args, **kwargs):
        padded = -(-topk_ids.numel() // block) * block
        return (
            torch.arange(padded, dtype=torch.int32),
            torch.zeros(padded // block, dtype=torch.int32),
            torch.tensor([padded], dtype=torch.int32),
        )

    def gemm(a, b, bias, c, *args, **kwargs):
        launched.append(tuple(b.shape))
        c.zero_()

    def topk_sum(x, out, *args, **kwargs):
        out.copy_(x.sum(dim=1))

    monkeypatch.setattr(fm, "moe_align_block_size", align)
    monkeypatch.setattr(fm, "invoke_fused_moe_kernel", gemm)
    monkeypatch.setattr(fm, "moe_sum_reduce_triton", topk_sum)
    shape = tune_moe.MoeShape(experts=8, intermediate=32, hidden=64, topk=2, layers=1)
    x = torch.randn(4, shape.hidden, dtype=torch.bfloat16)
    w1 = torch.zeros(shape.experts, 2 * shape.intermediate, shape.hidden, dtype=torch.bfloat16)
    w2 = torch.zeros(shape.experts, shape.hidden, shape.intermediate, dtype=torch.bfloat16)
    ids = torch.rand(4, shape.experts).topk(shape.topk, dim=-1).indices.to(torch.int32)
    weights = torch.full((4, shape.topk), 0.5)
    with tune_moe.sglang_context():
        config = tune_moe.default_config_for(shape)(4)
        with override_config(config):
            out = fm.fused_experts_impl(x, w1, w2, weights, ids)
    assert out.shape == x.shape
    assert launched == [tuple(w1.shape), tuple(w2.shape)]


def test_shared_experts_width_comes_from_the_config_and_splits_over_tp():
    config = {**KIMI_RANK, "n_shared_experts": 1}
    assert tune_moe.MoeShape.from_config(config).shared == 256
    assert tune_moe.MoeShape.from_config(config, tp=2).shared == 128
    assert tune_moe.MoeShape.from_config(KIMI_RANK).shared == 0


class _Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits {other.name}")


class _Cuda:
    """torch.cuda's stream calls, recorded: which stream each branch ran on."""

    def __init__(self, log):
        self.log, self.main = log, _Stream("main", log)
        self.now = self.main

    def current_stream(self):
        return self.now

    def stream(self, stream):
        cuda = self

        class _On:
            def __enter__(self):
                cuda.before, cuda.now = cuda.now, stream

            def __exit__(self, *exc):
                cuda.now = cuda.before

        return _On()


def test_beside_forks_runs_routed_then_shared_on_the_side_stream_and_joins():
    """SGLang 0.5.23's order for a DeepSeek MoE layer in a captured graph: the side stream
    waits for the main one, the routed experts are issued on main, the shared MLP after them
    on the side stream, and main waits for the side stream before the layer's sum."""
    log = []
    cuda = _Cuda(log)
    side = _Stream("side", log)
    both = tune_moe.beside(
        lambda: log.append(f"routed on {cuda.current_stream().name}"),
        lambda: log.append(f"shared on {cuda.current_stream().name}"),
        side,
        cuda,
    )
    both()
    assert log == ["side waits main", "routed on main", "shared on side", "main waits side"]
    assert cuda.current_stream() is cuda.main


def test_shared_mlp_is_gate_up_silu_and_mul_down():
    """The activation is the one handed in (SGLang's fused kernel on the GPU; its math here),
    written into the buffer shared_mlp gives it."""
    torch = pytest.importorskip("torch")
    x = torch.randn(3, 8)
    gate_up, down = torch.randn(2 * 4, 8), torch.randn(8, 4)

    def silu_and_mul(h, out):
        out.copy_(torch.nn.functional.silu(h[:, :4]) * h[:, 4:])

    h = x @ gate_up.T
    expected = (torch.nn.functional.silu(h[:, :4]) * h[:, 4:]) @ down.T
    torch.testing.assert_close(tune_moe.shared_mlp(x, gate_up, down, silu_and_mul), expected)


def test_beside_shared_is_refused_for_a_model_without_shared_experts(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(KIMI_RANK))
    argv = ["--model", str(tmp_path), "--out", str(tmp_path / "o"), "--beside-shared"]
    assert tune_moe.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}/config.json gives no shared experts" in err
    assert not (tmp_path / "o").exists()


def test_routed_inputs_send_each_token_to_distinct_experts_and_shared_weights_fit():
    """The inputs the tuner and moe_mode time: int32 ids of topk distinct experts a token,
    weights summing to one; the shared MLP's weights shaped for ``shared_mlp``."""
    pytest.importorskip("sglang")
    import torch

    shape = tune_moe.MoeShape(experts=32, intermediate=256, hidden=64, topk=8, layers=1, shared=16)
    x, out = tune_moe.routed_inputs(shape, 6, "cpu")
    assert x.shape == (6, 64) and x.dtype == torch.bfloat16
    assert out.topk_ids.dtype == torch.int32 and out.topk_ids.shape == (6, 8)
    assert all(len(set(row.tolist())) == 8 for row in out.topk_ids)
    assert int(out.topk_ids.max()) < 32
    assert torch.allclose(out.topk_weights.sum(-1), torch.ones(6))
    gate_up, down = tune_moe.shared_weights(shape, "cpu")
    assert gate_up.shape == (32, 64) and down.shape == (64, 16)


def test_from_report_serves_exactly_the_config_a_tuning_picked(tmp_path, monkeypatch, capsys):
    """--from-report: nothing timed; the report's best per token count under --out where
    SGLang looks on that card (its device name stood in: a CPU has none), and the report
    copied with what rebuilt it."""
    pytest.importorskip("sglang")
    pytest.importorskip("triton")
    from pathlib import Path

    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as cfg

    monkeypatch.setattr(cfg, "get_device_name", lambda: "NVIDIA H100 80GB HBM3")
    src = (
        Path(__file__).parent
        / "gpu"
        / "results"
        / ("seed-shape-2026-12-06-draws-nvidia-h100-sglang0.5.23-tune-moe.json")
    )
    report = json.loads(src.read_text())
    out, js = tmp_path / "cfg", tmp_path / "tune-moe.json"
    argv = ["--from-report", str(src), "--out", str(out), "--json", str(js)]
    assert tune_moe.main(argv) == 0
    (path,) = out.glob("configs/triton_*/*.json")
    assert path.name == Path(report["config_file"]).name
    table = json.loads(path.read_text())
    assert all(table[m] == r["best"] for m, r in report["tokens"].items())
    copied = json.loads(js.read_text())
    assert copied["tokens"] == report["tokens"] and copied["gpu"] == report["gpu"]
    assert copied["rebuilt"]["from"] == str(src) and copied["rebuilt"]["config_file"] == str(path)
    # never over a kept config or report; a file that is no report is named
    assert tune_moe.main(argv) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert tune_moe.main(["--from-report", str(src), "--out", str(tmp_path / "n"),
                          "--json", str(js)]) == 2  # fmt: skip
    assert "exists; not overwriting it" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert tune_moe.main(["--from-report", str(bad), "--out", str(tmp_path / "m")]) == 2
    assert f"--from-report {bad}: not a tune_moe report" in capsys.readouterr().err
