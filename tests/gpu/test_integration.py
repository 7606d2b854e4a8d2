"""End to end on a GPU: real SGLang servers, a trained target and a speculators-trained drafter.

Run on a GPU node after building the fixtures (sglang_ext_tools/fixtures/make_fixtures.py, and
sglang_ext_tools/fixtures/make_mla_fixtures.py for the seed case in test_seed_case.py):

    SGLANG_EXT_FIXTURES=/tmp/fixtures python -m pytest -m gpu tests/gpu -x -q

The servers and shared measurements live in suite.py (fixture `cluster`, via conftest.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error

import pytest
from harness import busy_cores, timed_tokens_per_s
from suite import (
    ALARM_JSONL,
    ALONE_KEEP,
    FIXTURES,
    JSONL,
    LOG_DIR,
    MAX_NEW_TOKENS,
    PATCHED_SITE,
    RESULTS,
    TAU_NEW_TOKENS,
    TAU_PROMPTS,
    TP1_OUTPUTS,
    equivalence,
    free_running,
    like_for_like,
    load_prompts,
    lossless_verdict,
    prometheus_value,
    record_like_for_like,
    reference,
    score,
    served_tau,
    settle_acceptance,
)

from sglang_ext_tools import lossless, tau_compare
from sglang_ext_tools.stats import bootstrap_ci, bootstrap_ratio_ci

# -- 1. serves -------------------------------------------------------------------------------


def test_plugin_loads_the_speculators_drafter_and_serves(cluster):
    server = cluster["plugin"]
    assert server.status == "ready", server.log_text()[-4000:]
    log = server.log_text()
    assert "sglang_ext: EAGLE-3 drafter" in log and "speculators format" in log
    assert "sglang_ext: loaded" in log


# -- 2. lossless, 3. acceptance fidelity ---------------------------------------------------


@pytest.fixture(scope="module")
def plugin_outputs(cluster, llama_baseline):
    """The plugin's outputs on the lossless prompts, concurrency 1 (as the baseline)."""
    outputs = cluster["plugin"].generate_many(llama_baseline["ids"], MAX_NEW_TOKENS, concurrency=1)
    TP1_OUTPUTS["llama"] = {"prompts": llama_baseline["prompts"], "outputs": outputs}
    return outputs


@pytest.fixture(scope="module")
def plugin_tau_outputs(cluster):
    """The plugin's outputs on the tau prompts (TAU_PROMPTS x TAU_NEW_TOKENS, concurrency 1)."""
    prompts = load_prompts()[:TAU_PROMPTS]
    outputs = cluster["plugin"].generate_many(
        [p["input_ids"] for p in prompts], TAU_NEW_TOKENS, concurrency=1
    )
    return prompts, outputs


def test_lossless_every_token_teacher_forced(llama_baseline, plugin_outputs):
    result = lossless_verdict(llama_baseline, plugin_outputs, "plugin")
    result.update(setting="3/1/4", tau_served=round(served_tau(plugin_outputs), 4))
    assert result["tokens_checked"] >= 8000, result
    assert result["pass"], f"tokens above the tie tolerance: {result['failures']}"


def test_a_planted_runner_up_fails_the_lossless_rule(llama_baseline):
    """The rule must catch a bug: the no-speculation output with one token replaced by its
    runner-up at the clear margin (lossless.clear_margin: 4 x the tolerance, at least 1 nat),
    scored the same way."""
    base = llama_baseline
    margin = lossless.clear_margin(base["tolerance"]["tolerance"])
    candidates = (
        (prompt, lossless.plant_runner_up(output["output_ids"], rows, margin))
        for prompt, output, rows in zip(base["prompts"], base["c1"], base["rows_c1"], strict=True)
    )
    prompt, planted = next(((p, c) for p, c in candidates if c), (None, None))
    assert planted, f"no output token leads its runner-up by {margin}"
    position, bad = planted
    rows = score(base["server"], prompt["input_ids"], bad)
    result = lossless.verdict({prompt["id"]: lossless.gaps(rows)}, base["tolerance"])
    RESULTS["lossless_planted"] = {
        "prompt": prompt["id"],
        "position": position,
        "min_margin": margin,
        "verdict_pass": result["pass"],
        "first_failure": next(iter(result["failures"].values()), [None])[0],
        "tokens_at_clear_margin": result["tokens_at_clear_margin"],
    }
    assert not result["pass"]
    # The planted token is caught where it was planted. The tokens after it are the original
    # continuation scored on a changed prefix, so some of them may fail too (2026-12-01, 4th
    # run: planted at position 0, caught there at gap 2.875, and more than one token reached
    # the clear margin, which the old `== 1` assertion rejected).
    assert result["tokens_at_clear_margin"] >= 1, result
    assert result["failures"][prompt["id"]][0][0] == position, result


def test_acceptance_equivalent_to_the_reference_like_for_like(plugin_tau_outputs):
    """Served tau vs the offline reference teacher-forced on the served text (bf16, this
    GPU): the same tokens verified on both sides, so the comparison is per prompt and per
    draft position. Pass iff the 95 % paired interval of the ratio is inside [0.95, 1.05].
    The free-running reference (its own continuation) is recorded beside it."""
    prompts, outputs = plugin_tau_outputs
    rows = like_for_like(FIXTURES / "llama-target", FIXTURES / "llama-drafter", prompts, outputs, 3)
    result = record_like_for_like("llama", outputs, rows, 3)
    RESULTS["acceptance"] = {
        "tau_served": round(served_tau(outputs), 4),
        "prompts": len(outputs),
        "max_new_tokens": TAU_NEW_TOKENS,
        "definition": "(accepted draft tokens + verify steps) / verify steps",
        "like_for_like": result,
        # recorded: the fixtures' free-running reference (its own continuation per prompt)
        "free_running": free_running(prompts, outputs, reference("llama-drafter")),
    }
    assert RESULTS["like_for_like"]["llama"]["identical_text"]
    assert result["pass"], result


# -- 4. stock SGLang, same checkpoint ----------------------------------------------------------


def test_stock_sglang_fails_on_speculators_and_underperforms_converted(cluster, plugin_tau_outputs):
    stock = cluster["stock_speculators"]
    log = stock.log_text()
    found = re.search(r"(ValueError: Unrecognized model[^\n]*)", log)
    RESULTS["stock"] = {
        "speculators_dir": {
            "status": stock.status,
            "error": found.group(1) if found else log[-600:],
        }
    }
    assert stock.status.startswith("exited")
    assert found and "model_type" in found.group(1)
    converted = cluster["stock_converted"]
    assert converted.status == "ready", converted.log_text()[-3000:]
    prompts, plugin = plugin_tau_outputs
    outputs = converted.generate_many(
        [p["input_ids"] for p in prompts], TAU_NEW_TOKENS, concurrency=1
    )
    comparison = tau_compare.non_inferiority(
        [tau_compare.served_counts(o) for o in plugin],
        [tau_compare.served_counts(o) for o in outputs],
        floor=1.0,
    )
    RESULTS["stock"].update(
        converted_tau=comparison["tau_b"],
        plugin_tau=comparison["tau_a"],
        plugin_vs_converted=comparison,
        converted_tau_definition="(completion_tokens - 1 - verify steps + verify steps) / "
        "verify steps: stock has no per-request accepted count (tau_compare.served_counts)",
        converted_differences=RESULTS.get("converted_differences"),
    )
    # The converted copy loses speculators math stock SGLang lacks (norm_before_residual):
    # the plugin accepts at least as much, by the interval's lower end.
    assert comparison["pass"], comparison


# -- 5. fusion guard ---------------------------------------------------------------------------


def test_fusion_guard_fails_at_startup_where_stock_crashes_on_first_request(cluster):
    guard, stock = cluster["guard_plugin"], cluster["guard_stock"]
    log = guard.log_text()
    assert guard.status.startswith("exited"), log[-3000:]
    match = re.search(r"(DrafterConfigError: [^\n]*(?:\n  - [^\n]*)*)", log)
    assert match and "collapse to 2 distinct layers" in match.group(1)
    stock_result = {"status": stock.status}
    if stock.status == "ready":
        try:
            stock.generate([1, 2, 3, 4, 5, 6, 7, 8], 16)
            stock_result["first_request"] = "succeeded"
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            stock_result["first_request"] = f"failed: {exc!r}"
        time.sleep(3)
        crash = re.search(r"(mat1 and mat2 shapes cannot be multiplied[^\n]*)", stock.log_text())
        stock_result["scheduler_error"] = crash.group(1) if crash else None
        stock_result["alive_after"] = stock.alive()
    else:
        # Stock died before /health_generate answered. SGLang's launcher sends its own warmup
        # generate request once the HTTP server is up: that request is the first request,
        # and the scheduler dies on it. Record where, and what it said.
        log = stock.log_text()
        crash = re.search(r"(mat1 and mat2 shapes cannot be multiplied[^\n]*)", log)
        stock_result["startup_error"] = stock.startup_error()
        stock_result["scheduler_error"] = crash.group(1) if crash else None
        stock_result["died_at_warmup_request"] = bool(
            re.search(r"warmup|/generate", log[: crash.start()] if crash else log, re.I)
        )
        stock_result["log_tail"] = stock.log_tail(12)
    RESULTS["fusion_guard"] = {
        "plugin": {"status": guard.status, "error": match.group(1)},
        "stock": stock_result,
    }
    # What the same flags do to stock SGLang: the drafter's fc meets 2 captured layers, not
    # 3, on the first forward that fuses (SGLang's warmup or the first user request).
    assert stock_result["scheduler_error"], stock.log_text()[-3000:]


# -- throughput, bench, metrics ---------------------------------------------------------------


# 128 since the fourth run of 2026-12-01 (256 before): the suite outgrew one device session.
BENCH_NEW_TOKENS = 128


def _paired_latencies(cluster, prompts, first) -> tuple[dict[str, list[float]], list[dict]]:
    """Each server's latency per prompt in the bench's paired order (the servers alternate
    prompt by prompt, ABBA: ``first`` opens prompt 0, the other prompt 1, ...), each request
    streamed as the bench streams it; and the plugin's outputs (the last event of each)."""
    other = "nospec" if first == "plugin" else "plugin"
    latency, outputs = {"plugin": [], "nospec": []}, []
    for k, ids in enumerate(prompts):
        for name in (first, other) if k % 2 == 0 else (other, first):
            start = time.perf_counter()
            out = cluster[name].generate_streamed(ids, BENCH_NEW_TOKENS)
            latency[name].append(time.perf_counter() - start)
            if name == "plugin":
                outputs.append(out)
    return latency, outputs


@pytest.mark.alone
def test_bench_client_against_baseline(cluster, tmp_path):
    """`sglang-ext bench` against the suite's own timing of the same 16 prompts on the same
    two servers (only the timed ones up: suite.ALONE_KEEP; idle servers sleep,
    launch.BASE_FLAGS). The bench alternates the servers prompt by prompt at concurrency 1
    (--order paired, its default); the suite times them with its own client in the same
    order and streamed like the bench's requests, once before the bench and once after it
    starting from the other server.
    Checked: every request of the bench ran its 128 tokens; the speedup the bench prints is
    the one its own per-request timings give (within 3 %; in paired order each server's time
    is the sum of its latencies) and comes with its interval; the bench's speedup over the
    suite's, paired by prompt, is not shown to differ by more than 10 % (its 95 % interval
    reaches [1/1.1, 1.1]; stats.speedup_agreement); its accept length is the served one.
    Earlier rules: to the seventh run, the bench's point speedup inside the suite's interval
    widened by 10 % (its own sampling noise left out: failed at 0.914 against [0.540,
    0.901]); in the eighth, both clients ran one server's prompts, then the other's, beside
    five spinning idle schedulers, and the plugin's latency for the same prompt and the same
    verify steps moved by up to 1.6x within seconds (lag-1 autocorrelation 0.85): the bench
    read 0.81 [0.76, 0.87] of the suite."""
    from sglang_ext_tools.stats import speedup_agreement

    running = cluster.only(ALONE_KEEP)
    prompts = [p["input_ids"] for p in load_prompts()[:16]]
    cores: dict = {}  # the node's busy cores during each pass: what ran beside the timing
    with busy_cores(cores, "suite_before"):
        before, served = _paired_latencies(cluster, prompts, "plugin")
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        "-m",
        "sglang_ext.cli",
        "bench",
        "--url",
        cluster["plugin"].url,
        "--baseline-url",
        cluster["nospec"].url,
        "--prompts",
        str(FIXTURES / "prompts.jsonl"),
        "--num-requests",
        str(len(prompts)),
        "--max-new-tokens",
        str(BENCH_NEW_TOKENS),
        "--ignore-eos",
        "--order",
        "paired",
        "--out",
        str(out),
    ]
    with busy_cores(cores, "bench"):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    (LOG_DIR / "bench-stdout.txt").write_text(proc.stdout + "\n" + proc.stderr)
    with busy_cores(cores, "suite_after"):
        after, _ = _paired_latencies(cluster, prompts, "nospec")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    RESULTS["bench"] = {
        "command": " ".join(cmd),
        "stdout_tail": proc.stdout[-2500:],
        "summary": report.get("summary"),
        "comparison": report.get("comparison"),
    }
    spec_rows = sorted(report["requests"], key=lambda r: r["index"])
    base_rows = sorted(report["baseline"]["requests"], key=lambda r: r["index"])
    assert (
        [r["index"] for r in spec_rows]
        == [r["index"] for r in base_rows]
        == list(range(len(prompts)))
    ), RESULTS["bench"]
    tokens = [r["completion_tokens"] for r in spec_rows + base_rows]
    bench_pairs = [
        (s["latency_s"], b["latency_s"]) for s, b in zip(spec_rows, base_rows, strict=True)
    ]
    suite_pairs = [
        (
            (before["plugin"][k] + after["plugin"][k]) / 2,
            (before["nospec"][k] + after["nospec"][k]) / 2,
        )
        for k in range(len(prompts))
    ]
    bench_speedup = report["comparison"]["speedup"]
    interval = report["comparison"].get("speedup_interval") or {}
    agreement = speedup_agreement(bench_pairs, suite_pairs, tolerance=0.10)
    suite_speedup = sum(b for _, b in suite_pairs) / sum(s for s, _ in suite_pairs)
    bench_tau = report["summary"]["acceptance"]["accept_length"]
    suite_tau = served_tau(served)
    RESULTS["bench"].update(
        suite_speedup=round(suite_speedup, 4),
        suite_speedup_ci95=bootstrap_ratio_ci(
            [b for _, b in suite_pairs], [s for s, _ in suite_pairs]
        ),
        bench_speedup=round(bench_speedup, 4),
        bench_speedup_ci95=interval.get("ci95"),
        bench_vs_suite=agreement,
        latencies_s={
            "bench": [[round(s, 4), round(b, 4)] for s, b in bench_pairs],
            "suite_before": [
                [round(s, 4), round(b, 4)]
                for s, b in zip(before["plugin"], before["nospec"], strict=True)
            ],
            "suite_after": [
                [round(s, 4), round(b, 4)]
                for s, b in zip(after["plugin"], after["nospec"], strict=True)
            ],
        },
        suite_pass_speedups={
            name: round(sum(lat["nospec"]) / sum(lat["plugin"]), 4)
            for name, lat in (("before", before), ("after", after))
        },
        busy_cores=cores,
        bench_tau=round(bench_tau, 4),
        suite_tau=round(suite_tau, 4),
        servers_running=running,
    )
    assert "speedup" in proc.stdout.lower() and "order=paired" in proc.stdout
    assert set(tokens) == {BENCH_NEW_TOKENS}, f"completion tokens {sorted(set(tokens))}"
    assert interval.get("pairs") == len(prompts), interval
    assert interval["ci95"][0] <= interval["point"] <= interval["ci95"][1], interval
    assert abs(bench_speedup / interval["point"] - 1) <= 0.03, RESULTS["bench"]
    assert agreement["agree"], RESULTS["bench"]
    # Greedy at concurrency 1 repeats itself: the bench's accept length is the served one.
    assert abs(bench_tau / suite_tau - 1) <= 0.01, RESULTS["bench"]


def test_per_request_metrics_log_and_prometheus(cluster):
    from sglang_ext.metrics import acceptance as metrics

    server = cluster["plugin"]
    settle_acceptance()
    log_lines = [
        metrics.parse_log_line(line)
        for line in server.log_text().splitlines()
        if "sglang_ext.acceptance {" in line
    ]
    records = [json.loads(line) for line in JSONL.read_text().splitlines() if line.strip()]
    text = server.metrics_text()
    verify_total = prometheus_value(text, "sglang:spec_verify_calls_total")
    tokens_total = prometheus_value(text, "sglang:generation_tokens_total")
    hook_seconds = prometheus_value(text, "sglang:spec_ext_metrics_hook_seconds_total")
    summed_verify = sum(r["verify_steps"] for r in records)
    summed_tokens = sum(r["completion_tokens"] for r in records)
    RESULTS["metrics"] = {
        "log_lines": len(log_lines),
        "jsonl_records": len(records),
        "per_request_sum_matches_aggregate": summed_verify == verify_total
        and summed_tokens == tokens_total,
        "summed_verify_steps": summed_verify,
        "sglang_spec_verify_calls_total": verify_total,
        "summed_completion_tokens": summed_tokens,
        "sglang_generation_tokens_total": tokens_total,
        "hook_seconds_total": hook_seconds,
        "prometheus_series": sorted(
            {line.split("{")[0] for line in text.splitlines() if line.startswith("sglang:spec_ext")}
        ),
    }
    assert len(log_lines) == len(records) > 0
    assert "sglang:spec_ext_accept_length_bucket" in text
    assert "sglang:spec_ext_accepted_draft_tokens_total" in text
    assert RESULTS["metrics"]["per_request_sum_matches_aggregate"]
    assert hook_seconds > 0, "the hook's own time counter did not move"


def test_random_drafter_triggers_the_alarm(cluster):
    server = cluster["random"]
    assert server.status == "ready", server.log_text()[-3000:]
    prompts = [p["input_ids"] for p in load_prompts()[:30]]
    for ids in prompts:  # sequential: the alarm's position in the stream is well defined
        server.generate(ids, 64)
    settle_acceptance()
    log = server.log_text().splitlines()
    seen, fired_after = 0, None
    for line in log:
        if "sglang_ext.acceptance {" in line:
            seen += 1
        if "SPECULATIVE DRAFTER LOOKS BROKEN" in line:
            fired_after = seen
            break
    text = server.metrics_text()
    RESULTS.setdefault("metrics", {})
    RESULTS["metrics"]["alarm_after_requests"] = fired_after
    RESULTS["metrics"]["random_drafter_unhealthy_gauge"] = prometheus_value(
        text, "sglang:spec_ext_drafter_unhealthy"
    )
    records = [json.loads(line) for line in ALARM_JSONL.read_text().splitlines() if line]
    RESULTS["metrics"]["random_drafter_accept_rate"] = round(
        sum(r["accepted_draft_tokens"] for r in records)
        / max(1, sum(r["proposed_draft_tokens"] for r in records)),
        4,
    )
    assert fired_after is not None and fired_after <= 20 + 1  # +1: SGLang's warmup request


@pytest.mark.alone
def test_metrics_overhead_at_concurrency_32(cluster):
    """What the acceptance metrics cost at concurrency 32, two ways, with only the timed
    servers up (suite.ALONE_KEEP), none of them busy.

    Direct: the hook counts its own CPU time (sglang:spec_ext_metrics_hook_seconds_total); over
    the metrics-on rounds it must stay below 1 % of their wall time (the tokenizer manager's
    share spent in the hook). End to end: our metrics on vs off, both servers with SGLang's
    --enable-metrics (until the sixth run the off server had SGLang's off too, so the ratio,
    0.912 and 0.924, carried SGLang's own metrics' cost as well), 12 paired rounds (ABBA);
    rounds of ~3 s vary by up to +-30 % on this node (2026-12-01: 3,870-6,750 tok/s), so the
    interval cannot show a 3 % difference either way;
    it must not lie wholly below 0.97 (evidence of a cost above 3 %).

    The fifth run (2026-12-01) read 1.76 % (0.34 ms of CPU per request at 51 requests/s), the
    sixth 1.36 % (0.36 ms at 37/s): per request the hook ran with cold caches. Now it queues
    and a flusher writes in batches: 0.355x per request side by side with cold caches on CI's
    CPU (sglang_ext_tools.bench_metrics_hook), which predicts ~0.13 ms, 0.5-0.65 % here."""
    running = cluster.only(ALONE_KEEP)
    prompts = [p["input_ids"] for p in load_prompts()] * 2
    for name in ("plugin", "plugin_nometrics"):  # warm-up, not counted: the 2026-12-01 run's
        timed_tokens_per_s(cluster[name], prompts, 128, 32)  # first rounds ran at 1/3 speed
    hook_metric = "sglang:spec_ext_metrics_hook_seconds_total"
    settle_acceptance()  # the warm-up's hook seconds are counted before the first reading
    hook_before = prometheus_value(cluster["plugin"].metrics_text(), hook_metric)
    on, off, on_wall = [], [], 0.0
    for round_index in range(12):
        order = ("off", "on") if round_index % 2 == 0 else ("on", "off")
        for name in order:
            server = cluster["plugin"] if name == "on" else cluster["plugin_nometrics"]
            timed = timed_tokens_per_s(server, prompts, 128, 32)
            (on if name == "on" else off).append(timed["tok_s"])
            on_wall += timed["wall_s"] if name == "on" else 0.0
    settle_acceptance()
    hook_seconds = prometheus_value(cluster["plugin"].metrics_text(), hook_metric) - hook_before
    pairs = list(zip(on, off, strict=True))
    ci = bootstrap_ci(pairs, lambda p: sum(a for a, _ in p) / sum(b for _, b in p))
    RESULTS.setdefault("metrics", {})
    RESULTS["metrics"]["overhead_ratio"] = round(sum(on) / sum(off), 4)
    RESULTS["metrics"]["overhead_ratio_ci95"] = ci
    RESULTS["metrics"]["overhead_rounds_tok_s"] = {"metrics_on": on, "metrics_off": off}
    RESULTS["metrics"]["hook_seconds"] = round(hook_seconds, 6)
    RESULTS["metrics"]["hook_share_of_wall"] = round(hook_seconds / on_wall, 6)
    RESULTS["metrics"]["on_rounds_wall_s"] = round(on_wall, 3)
    RESULTS["metrics"]["overhead_servers_running"] = running
    assert hook_seconds > 0, RESULTS["metrics"]  # the counter moved: the hook ran
    assert hook_seconds / on_wall < 0.01, RESULTS["metrics"]
    assert ci[1] >= 0.97, RESULTS["metrics"]


# -- variants, patched SGLang, TP=2 --------------------------------------------------------------


@pytest.mark.parametrize(
    "name, target, drafter",
    # The random-weight dsv3 variant gave way to the trained MLA + MoE seed case.
    [
        ("three_layer", "llama-target", "llama-drafter-3layer"),
        ("qwen3", "qwen3-target", "qwen3-drafter"),
    ],
)
def test_variants_serve_equivalent_to_their_reference(cluster, name, target, drafter):
    server = cluster[name]
    RESULTS.setdefault("variants", {})[name] = {"status": server.status}
    assert server.status == "ready", server.log_text()[-3000:]
    prompts = load_prompts()[:TAU_PROMPTS]
    outputs = server.generate_many([p["input_ids"] for p in prompts], TAU_NEW_TOKENS, 1)
    rows = like_for_like(FIXTURES / target, FIXTURES / drafter, prompts, outputs, 3)
    result = record_like_for_like(name, outputs, rows, 3)
    RESULTS["variants"][name] = {"status": server.status, "tau_equivalence": result}
    assert result["pass"], result


@pytest.mark.skipif(not PATCHED_SITE, reason="SGLANG_EXT_PATCHED_SITE not set")
def test_patched_sglang_without_plugin_matches_plugin(cluster, llama_baseline, plugin_outputs):
    """The upstream series applied to SGLang, without the plugin: lossless by the same
    rule, and tau equivalent to the plugin's on the same prompts."""
    server = cluster["patched"]
    RESULTS["patched"] = {"status": server.status}
    assert server.status == "ready", server.log_text()[-3000:]
    outputs = server.generate_many(llama_baseline["ids"], MAX_NEW_TOKENS, concurrency=1)
    verdict = lossless_verdict(llama_baseline, outputs, "patched")
    tau = equivalence(
        "patched_vs_plugin",
        [tau_compare.served_counts(o) for o in outputs],
        [tau_compare.served_counts(o) for o in plugin_outputs],
    )
    RESULTS["patched"] = {
        "site": PATCHED_SITE,
        "lossless_pass": verdict["pass"],
        "tokens_checked": verdict["tokens_checked"],
        "tau": tau,
    }
    assert verdict["tokens_checked"] >= 8000, verdict
    assert verdict["pass"], verdict["failures"]
    assert tau["pass"], tau
