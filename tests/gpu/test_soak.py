"""Under load, once per run: 64 concurrent streaming clients on the plugin server for three
minutes, one request in ten disconnected by its client mid-stream. No server error, exactly
one acceptance record per finished request (what an aborted one gets is recorded), the
records' sums equal SGLang's own counters over the same window, GPU memory flat after
warm-up. Runs after every other TP=1 test, the timed ones included (marker `late`, see
conftest.py)."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time

import pytest
from harness import soak_seconds
from suite import JSONL, RESULTS, load_prompts, prometheus_value, settle_acceptance

from sglang_ext_tools.launch import greedy_payload

# 2026-12-01: 180 s ran 4,750 requests and the whole suite ended 8 s inside its limit; 120 s
# from then until 2026-12-02; now three minutes where the device time allows
# (harness.soak_seconds).
STREAMS, ABORT_FRACTION, WARMUP_S = 64, 0.1, 30
MEMORY_SLACK_MIB = 256  # allocator rounding; a leak grows with the request count


def stream(server, rid: str, ids: list[int], max_new_tokens: int, abort_after: int | None):
    chunks, last = 0, None
    with contextlib.closing(
        server.stream_events({"rid": rid, **greedy_payload(ids, max_new_tokens)})
    ) as events:
        for last in events:  # noqa: B007 - the last event is read after the loop
            chunks += 1
            if abort_after is not None and chunks >= abort_after:
                return {"rid": rid, "aborted": True, "chunks": chunks}
    return {
        "rid": rid,
        "aborted": False,
        "completion_tokens": last["meta_info"]["completion_tokens"],
        "finish_reason": last["meta_info"].get("finish_reason"),
    }


def gpu_memory_used_mib() -> int:
    import pynvml
    import torch

    pynvml.nvmlInit()
    try:
        uuid = str(torch.cuda.get_device_properties(0).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(
            uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        )
        return pynvml.nvmlDeviceGetMemoryInfo(handle).used // 2**20
    finally:
        pynvml.nvmlShutdown()


def records_by_rid() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for line in JSONL.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            out.setdefault(str(record.get("rid")), []).append(record)
    return out


@pytest.mark.late
def test_soak_64_streams_with_client_aborts(cluster):
    cluster.join_background()  # no server may be starting while GPU memory is watched
    server = cluster["plugin"]
    assert server.status == "ready", server.log_text()[-3000:]
    prompts = [p["input_ids"] for p in load_prompts()]
    log_offset = len(server.log_text())
    before = server.metrics_text()
    results: list[dict] = []
    errors: list[str] = []
    memory: list[tuple[float, int]] = []
    soak_s = soak_seconds()
    start = time.time()
    deadline = start + soak_s
    lock = threading.Lock()

    def client(index: int) -> None:
        rng = random.Random(index)
        n = 0
        while time.time() < deadline:
            rid = f"soak-{index}-{n}"
            n += 1
            abort_after = rng.randint(2, 20) if rng.random() < ABORT_FRACTION else None
            try:
                out = stream(server, rid, rng.choice(prompts), rng.randint(32, 256), abort_after)
            except Exception as exc:  # noqa: BLE001 - every client error is a finding
                with lock:
                    errors.append(f"{rid}: {exc!r}")
                continue
            with lock:
                results.append(out)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(STREAMS)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        memory.append((round(time.time() - start, 1), gpu_memory_used_mib()))
        time.sleep(10)
    for thread in threads:
        thread.join()
    time.sleep(8)  # aborted requests settle: SGLang polls for disconnects every few seconds
    settle_acceptance()
    after = server.metrics_text()
    log = server.log_text()[log_offset:]
    records = records_by_rid()
    finished = [r for r in results if not r["aborted"]]
    aborted = [r for r in results if r["aborted"]]
    soak_records = {rid: recs for rid, recs in records.items() if rid.startswith("soak-")}
    finished_counts = [len(soak_records.get(r["rid"], [])) for r in finished]
    aborted_counts = [len(soak_records.get(r["rid"], [])) for r in aborted]
    flat = [rec for recs in soak_records.values() for rec in recs]

    def delta(name: str) -> float:
        return prometheus_value(after, name) - prometheus_value(before, name)

    verify_delta = delta("sglang:spec_verify_calls_total")
    tokens_delta = delta("sglang:generation_tokens_total")
    summed_verify = sum(r["verify_steps"] for r in flat)
    summed_tokens = sum(r["completion_tokens"] for r in flat)
    warm = [m for t, m in memory if t >= WARMUP_S]
    RESULTS["soak"] = {
        "seconds": soak_s,
        "streams": STREAMS,
        "abort_fraction": ABORT_FRACTION,
        "requests": len(results),
        "finished": len(finished),
        "aborted_by_client": len(aborted),
        "client_errors": errors[:10],
        "client_error_count": len(errors),
        "finished_with_one_record": sum(c == 1 for c in finished_counts),
        "finished_record_counts": sorted(set(finished_counts)),
        "aborted_with_a_record": sum(c == 1 for c in aborted_counts),
        "aborted_with_no_record": sum(c == 0 for c in aborted_counts),
        "aborted_record_counts": sorted(set(aborted_counts)),
        "aborted_finish_reasons": sorted(
            {
                str(rec.get("finish_reason"))
                for r in aborted
                for rec in soak_records.get(r["rid"], [])
            }
        ),
        "summed_verify_steps": summed_verify,
        "sglang_spec_verify_calls_delta": verify_delta,
        "summed_completion_tokens": summed_tokens,
        "sglang_generation_tokens_delta": tokens_delta,
        "sums_match": summed_verify == verify_delta and summed_tokens == tokens_delta,
        "server_tracebacks": log.count("Traceback"),
        "server_alive": server.alive(),
        "gpu_memory_mib": memory,
        "gpu_memory_growth_after_warmup_mib": (max(warm) - warm[0]) if warm else None,
    }
    soak = RESULTS["soak"]
    assert server.alive() and not soak["server_tracebacks"], log[-3000:]
    assert not errors, soak
    assert finished and aborted, soak
    assert soak["finished_with_one_record"] == len(finished), soak
    assert max(aborted_counts, default=0) <= 1, soak
    assert soak["sums_match"], soak
    assert warm and soak["gpu_memory_growth_after_warmup_mib"] <= MEMORY_SLACK_MIB, soak
