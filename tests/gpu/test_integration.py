"""End to end on a GPU: real SGLang servers, a trained target and a speculators-trained drafter.

Run on a GPU node after building the fixtures (scripts/make_fixtures.py):

    SGLANG_EXT_FIXTURES=/tmp/fixtures python -m pytest -m gpu tests/gpu -x -q

All servers start in parallel on one GPU (small --mem-fraction-static each) and are torn down
at the end. Every run writes tests/gpu/results/integration-<date>-<gpu>.json (or into
$SGLANG_EXT_RESULTS_DIR) with the figures each test measured.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import pytest
from harness import OUTCOMES, STOCK_ENV, Server, start_all, timed_tokens_per_s

FIXTURES = Path(os.environ.get("SGLANG_EXT_FIXTURES", "/tmp/fixtures"))
RESULTS_DIR = Path(os.environ.get("SGLANG_EXT_RESULTS_DIR", Path(__file__).parent / "results"))
LOG_DIR = Path(os.environ.get("SGLANG_EXT_LOG_DIR", "/tmp/sglang-ext-logs"))
PATCHED_SITE = os.environ.get("SGLANG_EXT_PATCHED_SITE")  # dir holding a patched `sglang`
STARTUP_TIMEOUT = float(os.environ.get("SGLANG_EXT_STARTUP_TIMEOUT", "420"))
MAX_NEW_TOKENS = 256
JSONL = LOG_DIR / "acceptance-plugin.jsonl"
ALARM_JSONL = LOG_DIR / "acceptance-random.jsonl"

RESULTS: dict = {}


def gpu_info() -> dict:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def text(value):
        return value.decode() if isinstance(value, bytes) else value

    info = {
        "name": text(pynvml.nvmlDeviceGetName(handle)),
        "driver": text(pynvml.nvmlSystemGetDriverVersion()),
        "memory_total_mib": pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
        "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "mem_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        "sm_clock_now_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "count": pynvml.nvmlDeviceGetCount(),
    }
    pynvml.nvmlShutdown()
    return info


def gpu_count_safe() -> int:
    try:
        return gpu_count()
    except Exception:  # noqa: BLE001 - no torch/CUDA: the test is skipped anyway
        return 0


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def versions() -> dict:
    from importlib.metadata import version

    import torch

    out = {"python": sys.version.split()[0], "torch": torch.__version__}
    for name in (
        "sglang",
        "sglang-ext",
        "transformers",
        "speculators",
        "sglang-kernel",
        "flashinfer-python",
        "triton",
    ):
        try:
            out[name] = version(name)
        except Exception:  # noqa: BLE001 - report absence
            out[name] = None
    return out


def load_prompts() -> list[dict]:
    with (FIXTURES / "prompts.jsonl").open() as handle:
        return [json.loads(line) for line in handle if line.strip()]


def reference(name: str) -> dict[str, dict]:
    path = FIXTURES / "reference" / f"{name}.jsonl"
    with path.open() as handle:
        return {row["id"]: row for row in map(json.loads, handle) if row}


def tau_of(rows) -> float:
    accepted = sum(sum(r["accepted"]) for r in rows)
    cycles = sum(r["cycles"] for r in rows)
    return (accepted + cycles) / cycles


def served_tau(outputs: list[dict]) -> float:
    """Accept length from meta_info: (accepted draft tokens + verify steps) / verify steps.

    `spec_accepted_draft_tokens` is added by sglang_ext's metrics (and by the patch series);
    without it, (completion_tokens - 1) counts the same tokens except where the last verify
    step was cut at max_new_tokens."""
    accepted = verify = 0
    for out in outputs:
        meta = out["meta_info"]
        verify += meta["spec_verify_ct"]
        accepted += meta.get(
            "spec_accepted_draft_tokens", meta["completion_tokens"] - 1 - meta["spec_verify_ct"]
        )
    return (accepted + verify) / verify


@pytest.fixture(scope="session")
def cluster():
    if not (FIXTURES / "prompts.jsonl").exists():
        pytest.skip(f"no fixtures in {FIXTURES}: run scripts/make_fixtures.py first")
    from sglang_ext.convert import convert

    converted = LOG_DIR / "converted-llama-drafter"
    RESULTS["converted_differences"] = convert(
        FIXTURES / "llama-drafter", converted, target=FIXTURES / "llama-target", force=True
    )
    llama, drafter = str(FIXTURES / "llama-target"), str(FIXTURES / "llama-drafter")
    metrics_env = {"SGLANG_EXT_ACCEPTANCE_JSONL": str(JSONL)}
    port = iter(range(31001, 31100))
    servers = [
        Server("nospec", llama, next(port), max_bs=32),
        Server("plugin", llama, next(port), drafter, ["--enable-metrics"], metrics_env, max_bs=32),
        Server(
            "plugin_nometrics",
            llama,
            next(port),
            drafter,
            env={"SGLANG_EXT_METRICS": "0"},
            max_bs=32,
        ),
        Server("stock_speculators", llama, next(port), drafter, env=STOCK_ENV),
        Server("stock_converted", llama, next(port), str(converted), env=STOCK_ENV),
        Server(
            "guard_plugin",
            str(FIXTURES / "llama4layer-target"),
            next(port),
            str(FIXTURES / "llama4layer-sglang-drafter"),
        ),
        Server(
            "guard_stock",
            str(FIXTURES / "llama4layer-target"),
            next(port),
            str(FIXTURES / "llama4layer-sglang-drafter"),
            env=STOCK_ENV,
        ),
        Server(
            "random",
            llama,
            next(port),
            str(FIXTURES / "random-drafter"),
            ["--enable-metrics"],
            {"SGLANG_EXT_ACCEPTANCE_JSONL": str(ALARM_JSONL)},
        ),
        Server("three_layer", llama, next(port), str(FIXTURES / "llama-drafter-3layer")),
        Server(
            "qwen3", str(FIXTURES / "qwen3-target"), next(port), str(FIXTURES / "qwen3-drafter")
        ),
        Server("dsv3", str(FIXTURES / "dsv3-target"), next(port), str(FIXTURES / "dsv3-drafter")),
    ]
    if PATCHED_SITE:
        pythonpath = f"{PATCHED_SITE}:{os.environ.get('PYTHONPATH', '')}"
        servers.append(
            Server(
                "patched",
                llama,
                next(port),
                drafter,
                env={**STOCK_ENV, "PYTHONPATH": pythonpath},
                max_bs=4,
            )
        )
    if gpu_count() >= 2:
        # Throughput pairs stay together on GPU 0; the checks that only need a server move to
        # GPU 1; TP=2 spans both.
        for server in servers:
            if server.name in ("stock_speculators", "guard_plugin", "guard_stock", "random",
                               "three_layer", "qwen3", "dsv3"):
                server.gpu = 1
        servers.append(Server("tp2", llama, next(port), drafter, ["--tp-size", "2"]))
    for server in servers:
        server.log_dir = LOG_DIR
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    for path in (JSONL, ALARM_JSONL):
        path.unlink(missing_ok=True)
    started = time.time()
    statuses = start_all(servers, STARTUP_TIMEOUT)
    RESULTS["startup"] = {
        "wall_s": round(time.time() - started, 1),
        "servers": {
            s.name: {
                "status": s.status,
                "ready_after_s": s.ready_after_s,
                "command": " ".join(s.command()),
                "env": s.env,
            }
            for s in servers
        },
    }
    try:
        yield {s.name: s for s in servers}
    finally:
        for server in servers:
            server.stop()
        write_results(statuses)


def write_results(statuses) -> None:
    try:
        gpu = gpu_info()
    except Exception as exc:  # noqa: BLE001 - the file must still be written
        gpu = {"name": "unknown", "error": repr(exc)}
    found = versions()
    now = dt.datetime.now(dt.UTC)
    gpu_slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu.get("name", "gpu")).strip("-").lower()
    data = {
        "date": now.isoformat(timespec="seconds"),
        "gpu": gpu,
        "sglang_version": found.get("sglang"),
        "torch_version": found.get("torch"),
        "versions": found,
        "command": " ".join([sys.executable, "-m", "pytest", *sys.argv[1:]]),
        "flags": {
            "base": Server("x", "m", 0).command()[9:],
            "note": "per-server extras in "
            "startup.servers.*.command; attention backend: triton for every figure",
        },
        "attention_backend": "triton",
        "outcomes": dict(OUTCOMES),
        **RESULTS,
    }
    data.setdefault("tp2", {"tau_served": None, "note": "not run (fewer than 2 GPUs)"})
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"integration-{now.date().isoformat()}-{gpu_slug}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"\nresults written to {path}")


# -- 1. serves -------------------------------------------------------------------------------


def test_plugin_loads_the_speculators_drafter_and_serves(cluster):
    server = cluster["plugin"]
    assert server.status == "ready", server.log_text()[-4000:]
    log = server.log_text()
    assert "sglang_ext: EAGLE-3 drafter" in log and "speculators format" in log
    assert "sglang_ext: loaded" in log


# -- 2. lossless, 3. acceptance fidelity ---------------------------------------------------


def test_lossless_and_acceptance_fidelity(cluster):
    prompts = load_prompts()
    ids = [p["input_ids"] for p in prompts]
    base = cluster["nospec"].generate_many(ids, MAX_NEW_TOKENS)
    spec = cluster["plugin"].generate_many(ids, MAX_NEW_TOKENS)
    identical = sum(a["output_ids"] == b["output_ids"] for a, b in zip(base, spec, strict=True))
    mismatches = [
        p["id"]
        for p, a, b in zip(prompts, base, spec, strict=True)
        if a["output_ids"] != b["output_ids"]
    ]
    # The reference ran at its own max_new_tokens (fixtures.json); measure served tau there.
    manifest = json.loads((FIXTURES / "fixtures.json").read_text())
    ref_tokens = manifest["drafters"]["llama-drafter"]["reference"]["max_new_tokens"]
    ref = reference("llama-drafter")
    chosen = [p for p in prompts if p["id"] in ref]
    at_ref_length = cluster["plugin"].generate_many([p["input_ids"] for p in chosen], ref_tokens)
    served_subset = served_tau(at_ref_length)
    ref_tau = tau_of([ref[p["id"]] for p in chosen])
    served = served_tau(spec)
    RESULTS["lossless"] = {
        "prompts": len(prompts),
        "identical": identical,
        "max_new_tokens": MAX_NEW_TOKENS,
        "mismatched_ids": mismatches,
    }
    RESULTS["acceptance"] = {
        "tau_served": round(served_subset, 4),
        "tau_reference": round(ref_tau, 4),
        "relative_difference": round(abs(served_subset - ref_tau) / ref_tau, 4),
        "prompts": len(chosen),
        "max_new_tokens": ref_tokens,
        "tau_served_256_tokens": round(served, 4),
        "definition": "(accepted draft tokens + verify steps) / verify steps",
        "reference": "sglang_ext.reference chain loop, fp32, transformers target + speculators "
        "drafter modules (fixtures.json drafters.llama-drafter.reference)",
        "sglang_accept_length_256_tokens": round(
            sum(o["meta_info"]["completion_tokens"] for o in spec)
            / sum(o["meta_info"]["spec_verify_ct"] for o in spec),
            4,
        ),
    }
    assert identical == len(prompts), f"non-identical greedy outputs: {mismatches}"
    assert served_subset >= 2.0
    assert abs(served_subset - ref_tau) / ref_tau <= 0.02


# -- 4. stock SGLang, same checkpoint ----------------------------------------------------------


def test_stock_sglang_fails_on_speculators_and_underperforms_converted(cluster):
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
    prompts = [p["input_ids"] for p in load_prompts()]
    outputs = converted.generate_many(prompts, MAX_NEW_TOKENS)
    tau = sum(o["meta_info"]["completion_tokens"] - 1 for o in outputs) / sum(
        o["meta_info"]["spec_verify_ct"] for o in outputs
    )
    RESULTS["stock"]["converted_tau"] = round(tau, 4)
    RESULTS["stock"]["converted_tau_definition"] = (
        "(completion_tokens - 1) / spec_verify_ct (stock has no per-request accepted count; "
        "equals the plugin's definition except when the last verify step is truncated)"
    )
    RESULTS["stock"]["converted_differences"] = RESULTS.get("converted_differences")


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
    else:  # stock died before serving: record what it said (the next assert needs its words)
        errors = re.findall(r"(\w+Error: [^\n]*)", stock.log_text())
        stock_result["startup_error"] = errors[-1] if errors else None
    RESULTS["fusion_guard"] = {
        "plugin": {"status": guard.status, "error": match.group(1)},
        "stock": stock_result,
    }
    stock_failed = stock_result.get("first_request", "").startswith("failed") or (
        stock_result.get("scheduler_error") or stock_result.get("startup_error")
    )
    assert stock_failed, stock.log_text()[-3000:]


# -- throughput, bench, metrics ---------------------------------------------------------------


def test_speculation_is_faster_than_no_speculation(cluster):
    prompts = [p["input_ids"] for p in load_prompts()[:16]]
    rounds = {"nospec": [], "plugin": []}
    for _ in range(2):
        for name in rounds:
            rounds[name].append(timed_tokens_per_s(cluster[name], prompts, MAX_NEW_TOKENS, 1))
    spec = max(r["tok_s"] for r in rounds["plugin"])
    base = max(r["tok_s"] for r in rounds["nospec"])
    RESULTS["throughput"] = {
        "spec_tok_s": spec,
        "nospec_tok_s": base,
        "speedup": round(spec / base, 3),
        "concurrency": 1,
        "requests": len(prompts),
        "max_new_tokens": MAX_NEW_TOKENS,
        "rounds": rounds,
        "attention_backend": "triton",
    }
    assert spec > base


def test_bench_client_against_baseline(cluster, tmp_path):
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
        "16",
        "--max-new-tokens",
        str(MAX_NEW_TOKENS),
        "--ignore-eos",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    (LOG_DIR / "bench-stdout.txt").write_text(proc.stdout + "\n" + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    RESULTS["bench"] = {
        "command": " ".join(cmd),
        "stdout_tail": proc.stdout[-2500:],
        "summary": report.get("summary"),
        "comparison": report.get("comparison"),
    }
    assert "speedup" in proc.stdout.lower()


def prometheus_value(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[-1])
    return total


def test_per_request_metrics_log_and_prometheus(cluster):
    from sglang_ext import metrics

    server = cluster["plugin"]
    log_lines = [
        metrics.parse_log_line(line)
        for line in server.log_text().splitlines()
        if "sglang_ext.acceptance {" in line
    ]
    records = [json.loads(line) for line in JSONL.read_text().splitlines() if line.strip()]
    text = server.metrics_text()
    verify_total = prometheus_value(text, "sglang:spec_verify_calls_total")
    tokens_total = prometheus_value(text, "sglang:generation_tokens_total")
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
        "prometheus_series": sorted(
            {line.split("{")[0] for line in text.splitlines() if line.startswith("sglang:spec_ext")}
        ),
    }
    assert len(log_lines) == len(records) > 0
    assert "sglang:spec_ext_accept_length_bucket" in text
    assert "sglang:spec_ext_accepted_draft_tokens_total" in text
    assert RESULTS["metrics"]["per_request_sum_matches_aggregate"]


def test_random_drafter_triggers_the_alarm(cluster):
    server = cluster["random"]
    assert server.status == "ready", server.log_text()[-3000:]
    prompts = [p["input_ids"] for p in load_prompts()[:30]]
    for ids in prompts:  # sequential: the alarm's position in the stream is well defined
        server.generate(ids, 64)
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


def test_metrics_overhead_at_concurrency_32(cluster):
    """A benchmark, recorded (not a timed pass/fail): metrics on vs off, alternating rounds."""
    prompts = [p["input_ids"] for p in load_prompts()] * 2
    on, off = [], []
    for _ in range(3):
        off.append(timed_tokens_per_s(cluster["plugin_nometrics"], prompts, 128, 32)["tok_s"])
        on.append(timed_tokens_per_s(cluster["plugin"], prompts, 128, 32)["tok_s"])
    RESULTS.setdefault("metrics", {})
    RESULTS["metrics"]["overhead_ratio"] = round(statistics.median(on) / statistics.median(off), 4)
    RESULTS["metrics"]["overhead_rounds_tok_s"] = {"metrics_on": on, "metrics_off": off}


# -- variants, patched SGLang, TP=2 --------------------------------------------------------------


@pytest.mark.parametrize(
    "name, drafter",
    [("three_layer", "llama-drafter-3layer"), ("qwen3", "qwen3-drafter"), ("dsv3", "dsv3-drafter")],
)
def test_variants_serve(cluster, name, drafter):
    server = cluster[name]
    RESULTS.setdefault("variants", {})[name] = {"status": server.status}
    assert server.status == "ready", server.log_text()[-3000:]
    prompts = load_prompts()[:16]
    outputs = server.generate_many([p["input_ids"] for p in prompts], 128)
    result = {"status": server.status, "tau_served": round(served_tau(outputs), 4)}
    try:
        ref = reference(drafter)
        rows = [ref[p["id"]] for p in prompts if p["id"] in ref]
        if rows:
            result["tau_reference"] = round(tau_of(rows), 4)
            result["reference_prompts"] = len(rows)
    except FileNotFoundError:
        result["tau_reference"] = None
    RESULTS["variants"][name] = result


@pytest.mark.skipif(not PATCHED_SITE, reason="SGLANG_EXT_PATCHED_SITE not set")
def test_patched_sglang_without_plugin_matches_plugin(cluster):
    server = cluster["patched"]
    RESULTS["patched"] = {"status": server.status}
    assert server.status == "ready", server.log_text()[-3000:]
    prompts = load_prompts()
    ids = [p["input_ids"] for p in prompts]
    base = cluster["nospec"].generate_many(ids, MAX_NEW_TOKENS)
    patched = server.generate_many(ids, MAX_NEW_TOKENS)
    identical = sum(a["output_ids"] == b["output_ids"] for a, b in zip(base, patched, strict=True))
    tau = served_tau(patched)
    plugin_tau = RESULTS.get("acceptance", {}).get("tau_served_256_tokens")
    RESULTS["patched"] = {
        "site": PATCHED_SITE,
        "lossless_identical": identical,
        "prompts": len(prompts),
        "tau_served": round(tau, 4),
        "plugin_tau_served": plugin_tau,
    }
    assert identical == len(prompts)
    if plugin_tau:
        assert abs(tau - plugin_tau) / plugin_tau <= 0.01


@pytest.mark.skipif(gpu_count_safe() < 2, reason="TP=2 needs 2 GPUs")
def test_tp2_serves_with_the_same_acceptance(cluster):
    server = cluster["tp2"]
    RESULTS["tp2"] = {"status": server.status}
    assert server.status == "ready", server.log_text()[-3000:]
    prompts = load_prompts()
    outputs = server.generate_many([p["input_ids"] for p in prompts], MAX_NEW_TOKENS)
    tau = served_tau(outputs)
    single = RESULTS.get("acceptance", {}).get("tau_served_256_tokens")
    RESULTS["tp2"] = {"status": server.status, "tau_served": round(tau, 4),
                      "tp1_tau_served": single, "tp": 2, "prompts": len(prompts)}
    if single:
        RESULTS["tp2"]["relative_difference"] = round(abs(tau - single) / single, 4)
        assert abs(tau - single) / single <= 0.02
