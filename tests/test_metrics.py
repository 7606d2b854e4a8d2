"""Unit tests for sglang_ext.metrics.hook (CPU only, no server).

Data: ``tests/data/recorded_requests_synthetic_drafter_health.jsonl`` holds 30 requests of a
healthy chain drafter (S=3, speculative_num_draft_tokens=4) followed by 25 of a random one.
They are SYNTHETIC: simulated per verify step with depth-dependent acceptance
probabilities (healthy ~0.7-0.88 at position 0; random: accidental hits at p=0.002), then
summarised into exactly the per-request counters SGLang carries to the tokenizer manager
(``spec_verify_ct``, ``spec_num_correct_drafts``, ``spec_correct_drafts_histogram``,
``completion_tokens`` capped at max_new_tokens). ``accepted_per_step`` keeps the raw steps.
No GPU was available to record them from a live server.
"""

from __future__ import annotations

import ast
import inspect
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_ext import compat
from sglang_ext.metrics import acceptance, acceptance_prometheus, drafter_health
from sglang_ext.metrics import hook as m

DATA = Path(__file__).parent / "data" / "recorded_requests_synthetic_drafter_health.jsonl"


def _sglang_0517_root() -> Path | None:
    """Where SGLang 0.5.17's sources are: $SGLANG_0517_SRC, else the installed SGLang where it
    is 0.5.17 (CI's second venv), else none (the hook-target tests skip)."""
    if os.environ.get("SGLANG_0517_SRC"):
        return Path(os.environ["SGLANG_0517_SRC"])
    if compat.version_tuple(compat.sglang_version()) == (0, 5, 17):
        import importlib.util

        return Path(importlib.util.find_spec("sglang").origin).parent.parent
    return None


SGLANG_0517_SRC = _sglang_0517_root()
HAS_0517_SRC = SGLANG_0517_SRC is not None and (SGLANG_0517_SRC / "sglang").is_dir()
S = 3
NUM_DRAFT_TOKENS = 4


def load_requests() -> list[dict]:
    with DATA.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def to_record(r: dict) -> dict:
    return acceptance.build_record(
        rid=r["rid"],
        prompt_tokens=r["prompt_tokens"],
        completion_tokens=r["completion_tokens"],
        verify_steps=r["spec_verify_ct"],
        accepted_draft_tokens=r["spec_num_correct_drafts"],
        histogram=r["spec_correct_drafts_histogram"],
        num_draft_tokens=r["speculative_num_draft_tokens"],
        num_steps=r["speculative_num_steps"],
        topk=r["speculative_eagle_topk"],
        drafter="/models/drafter",
        finish_reason=r["finish_reason"],
    )


@pytest.fixture(scope="module")
def requests_data() -> list[dict]:
    return load_requests()


# ------------------------------------------------------------------ arithmetic


def test_accept_length_hand_computed():
    # 6 verify steps accepting 0,1,1,3,3,3 drafts -> 11 accepted, 17 tokens committed.
    assert acceptance.accept_length(11, 6) == pytest.approx(17 / 6)
    assert acceptance.accept_length(0, 5) == 1.0
    assert acceptance.accept_length(3 * 7, 7) == 4.0  # all 3 drafts every step -> S + 1
    assert acceptance.accept_length(0, 0) is None


def test_sglang_accept_length_is_inflated_by_prefill_token():
    # Random drafter, 3 verify steps: 1 prefill token + 3 bonus tokens = 4 completion tokens.
    assert acceptance.accept_length(0, 3) == 1.0
    assert acceptance.sglang_accept_length(4, 3) == pytest.approx(4 / 3)
    # Long request: the inflation vanishes.
    assert acceptance.sglang_accept_length(1001, 1000) == pytest.approx(1.001)
    assert acceptance.sglang_accept_length(5, 0) is None


def test_draft_tokens_per_step_and_accept_rate():
    assert acceptance.draft_tokens_per_step(4, 3) == 3  # chain: num_draft_tokens - 1 == num_steps
    assert acceptance.draft_tokens_per_step(None, 5) == 5
    assert acceptance.draft_tokens_per_step(None, None) == 0
    assert acceptance.draft_tokens_per_step(8, 3) == 7  # tree topk>1: non-root tree nodes
    assert acceptance.proposed_draft_tokens(6, 3) == 18
    assert acceptance.accept_rate(11, 18) == pytest.approx(11 / 18)
    assert acceptance.accept_rate(0, 0) is None


def test_per_position_hand_computed():
    steps = [0, 1, 1, 3, 3, 3]
    acc, prop = acceptance.per_position_from_steps(steps, 3)
    assert acc == [5, 3, 3]
    assert prop == [6, 6, 6]
    hist = acceptance.histogram_from_steps(steps)
    assert hist == [1, 2, 0, 3]
    assert acceptance.per_position_from_histogram(hist, 3) == (acc, prop)
    assert acceptance.rates(acc, prop) == pytest.approx([5 / 6, 0.5, 0.5])
    # Short histogram (nothing beyond 1 accepted) still gives S positions.
    assert acceptance.per_position_from_histogram([4, 2], 3) == ([2, 0, 0], [6, 6, 6])
    # Random drafter: nothing accepted anywhere.
    assert acceptance.per_position_from_histogram([9], 3) == ([0, 0, 0], [9, 9, 9])
    with pytest.raises(ValueError):
        acceptance.per_position_from_steps([4], 3)


def test_histogram_matches_sglang_req_method(requests_data):
    """Our histogram layout equals SGLang's own Req.update_spec_correct_drafts_histogram."""
    from sglang.srt.managers.schedule_batch import Req

    for r in requests_data:
        fake_req = SimpleNamespace(spec_correct_drafts_histogram=[])
        for a in r["accepted_per_step"]:
            Req.update_spec_correct_drafts_histogram(fake_req, a)
        assert fake_req.spec_correct_drafts_histogram == acceptance.histogram_from_steps(
            r["accepted_per_step"]
        )
        assert fake_req.spec_correct_drafts_histogram == r["spec_correct_drafts_histogram"]


def test_recorded_data_is_internally_consistent(requests_data):
    assert len(requests_data) == 55
    assert [r["phase"] for r in requests_data] == ["healthy"] * 30 + ["random"] * 25
    for r in requests_data:
        steps = r["accepted_per_step"]
        assert r["spec_verify_ct"] == len(steps) == sum(r["spec_correct_drafts_histogram"])
        assert r["spec_num_correct_drafts"] == sum(steps)
        # First token from prefill + (accepted + bonus) per step, capped by max_new_tokens.
        assert r["completion_tokens"] <= 1 + len(steps) + sum(steps)


def test_per_position_from_histogram_equals_definition_on_recorded(requests_data):
    for r in requests_data:
        by_steps = acceptance.per_position_from_steps(r["accepted_per_step"], S)
        by_hist = acceptance.per_position_from_histogram(r["spec_correct_drafts_histogram"], S)
        assert by_hist == by_steps
        # Sum over positions of accepted == accepted drafts (each accepted draft sits at
        # exactly one position).
        assert sum(by_hist[0]) == r["spec_num_correct_drafts"]
        # Chain: acceptance never increases with depth.
        assert all(x >= y for x, y in zip(by_hist[0], by_hist[0][1:], strict=False))


def test_build_record_values_and_inconsistency():
    rec = acceptance.build_record(
        rid="r1",
        prompt_tokens=12,
        completion_tokens=18,
        verify_steps=6,
        accepted_draft_tokens=11,
        histogram=[1, 2, 0, 3],
        num_draft_tokens=4,
        num_steps=3,
        topk=1,
        drafter="/d",
    )
    assert rec["proposed_draft_tokens"] == 18
    assert rec["accept_length"] == pytest.approx(2.8333, abs=1e-4)
    assert rec["sglang_accept_length"] == pytest.approx(3.0)
    assert rec["accept_rate"] == pytest.approx(0.6111, abs=1e-4)
    assert rec["accepted_per_position"] == [5, 3, 3]
    assert rec["proposed_per_position"] == [6, 6, 6]
    assert rec["accept_per_position"] == pytest.approx([0.8333, 0.5, 0.5], abs=1e-4)
    with pytest.raises(ValueError, match="histogram total"):
        acceptance.build_record(
            rid="x",
            prompt_tokens=1,
            completion_tokens=5,
            verify_steps=4,
            accepted_draft_tokens=0,
            histogram=[3],
            num_draft_tokens=4,
            num_steps=3,
        )
    with pytest.raises(ValueError, match="histogram mass"):
        acceptance.build_record(
            rid="x",
            prompt_tokens=1,
            completion_tokens=5,
            verify_steps=3,
            accepted_draft_tokens=0,
            histogram=[2, 1],
            num_draft_tokens=4,
            num_steps=3,
        )
    # Without histogram: totals only.
    rec = acceptance.build_record(
        rid="y",
        prompt_tokens=1,
        completion_tokens=5,
        verify_steps=4,
        accepted_draft_tokens=0,
        histogram=None,
        num_draft_tokens=4,
        num_steps=3,
    )
    assert rec["accept_per_position"] is None and rec["accept_length"] == 1.0
    extras = acceptance.meta_info_extras(rec)
    assert "spec_accept_per_position" not in extras
    assert extras["spec_accept_length_exact"] == 1.0


# ------------------------------------------------------------------ consistency with SGLang


def test_summed_per_request_counts_equal_sglang_scheduler_aggregate(requests_data):
    """Drive SGLang's real SchedulerMetricsReporter.update_spec_metrics with the same verify
    steps batched like a decode loop would (up to 8 running requests), then apply the
    formulas of its decode log line; compare with our per-request records summed up."""
    from sglang.srt.managers.scheduler_components.metrics_reporter import (
        SchedulerMetricsReporter,
    )

    counters = SimpleNamespace(
        spec_num_accept_tokens=0,
        spec_num_correct_drafts=0,
        spec_num_forward_ct=0,
        spec_num_block_accept_tokens=0,
        spec_num_cap_tokens=0,
        num_generated_tokens=0,
    )
    params = inspect.signature(SchedulerMetricsReporter.update_spec_metrics).parameters
    pending = [list(r["accepted_per_step"]) for r in requests_data]
    running: list[list[int]] = []
    while pending or running:
        while pending and len(running) < 8:
            running.append(pending.pop(0))
        batch = [steps.pop(0) for steps in running]
        kwargs = {"bs": len(batch), "num_correct_drafts": sum(batch)}
        if "num_accept_tokens" in params:  # 0.5.23 signature
            kwargs["num_accept_tokens"] = sum(batch) + len(batch)
        SchedulerMetricsReporter.update_spec_metrics(counters, **kwargs)
        running = [s for s in running if s]
    # Formulas from SchedulerMetricsReporter's decode log ("accept len", "accept rate").
    sg_len = counters.spec_num_accept_tokens / counters.spec_num_forward_ct
    sg_rate = (counters.spec_num_accept_tokens - counters.spec_num_forward_ct) / (
        counters.spec_num_forward_ct * (NUM_DRAFT_TOKENS - 1)
    )

    records = [to_record(r) for r in requests_data]
    agg = acceptance.sglang_aggregate(records, NUM_DRAFT_TOKENS, S)
    assert agg["spec_num_forward_ct"] == counters.spec_num_forward_ct
    assert agg["spec_num_accept_tokens"] == counters.spec_num_accept_tokens
    assert agg["accept_length"] == pytest.approx(sg_len)
    assert agg["accept_rate"] == pytest.approx(sg_rate)
    # Per-position counts sum to the same accepted / proposed totals.
    total_acc = sum(sum(r["accepted_per_position"]) for r in records)
    total_prop = sum(sum(r["proposed_per_position"]) for r in records)
    assert total_acc == counters.spec_num_accept_tokens - counters.spec_num_forward_ct
    assert total_prop == counters.spec_num_forward_ct * (NUM_DRAFT_TOKENS - 1)
    assert sum(r["proposed_draft_tokens"] for r in records) == total_prop
    pooled = acceptance.pooled_per_position(records)
    assert sum(p * counters.spec_num_forward_ct for p in pooled) == pytest.approx(total_acc)


# ------------------------------------------------------------------ log line, JSONL


def test_log_line_round_trip_and_format(requests_data):
    rec = to_record(requests_data[0])
    line = acceptance.format_log_line(rec)
    assert line.startswith("sglang_ext.acceptance {")
    assert "\n" not in line
    assert acceptance.parse_log_line(line) == rec
    # SGLang's formatter prepends a timestamp.
    assert acceptance.parse_log_line("[2025-01-01 00:00:00] " + line) == rec
    for key in (
        "rid",
        "prompt_tokens",
        "completion_tokens",
        "verify_steps",
        "proposed_draft_tokens",
        "accepted_draft_tokens",
        "accept_length",
        "sglang_accept_length",
        "accept_rate",
        "accept_per_position",
        "drafter",
    ):
        assert key in rec
    with pytest.raises(ValueError):
        acceptance.parse_log_line("something else {}")


def test_recorder_logs_one_parseable_line_per_request(requests_data, caplog, tmp_path):
    rec = m.AcceptanceRecorder(m.MetricsConfig())
    caplog.set_level(logging.INFO, logger=m.LOGGER_NAME)
    for r in requests_data[:5]:
        rec.record(to_record(r))
    lines = [x.getMessage() for x in caplog.records if x.name == m.LOGGER_NAME]
    acc_lines = [x for x in lines if x.startswith(acceptance.LOG_PREFIX + " {")]
    assert len(acc_lines) == 5
    rids = [acceptance.parse_log_line(x)["rid"] for x in acc_lines]
    assert rids == [r["rid"] for r in requests_data[:5]]
    caplog.clear()
    quiet = m.AcceptanceRecorder(m.MetricsConfig(log_requests=False))
    quiet.record(to_record(requests_data[0]))
    prefix = acceptance.LOG_PREFIX + " {"
    assert not [x for x in caplog.records if x.getMessage().startswith(prefix)]


def test_jsonl_sink(requests_data, tmp_path):
    path = tmp_path / "sub" / "acc.jsonl"
    cfg = m.MetricsConfig.from_env({m.ENV_JSONL: str(path)})
    rec = m.AcceptanceRecorder(cfg)
    records = [to_record(r) for r in requests_data[:3]]
    for r in records:
        rec.record(r)
    # A second process/sink appending to the same file.
    other = m.JsonlSink(str(path))
    other.write(records[0])
    other.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 4
    objs = [json.loads(x) for x in lines]
    for obj, r in zip(objs, records + records[:1], strict=True):
        ts = obj.pop("ts")
        assert isinstance(ts, float)
        assert obj == r


def test_config_from_env():
    cfg = m.MetricsConfig.from_env({})
    assert cfg == m.MetricsConfig()
    assert (cfg.alarm_window, cfg.alarm_min_tokens, cfg.alarm_accept_rate) == (20, 32, 0.05)
    assert cfg.enabled and cfg.log_requests and cfg.jsonl_path is None
    cfg = m.MetricsConfig.from_env(
        {
            "SGLANG_EXT_METRICS": "0",
            "SGLANG_EXT_ALARM_WINDOW": "5",
            "SGLANG_EXT_ALARM_MIN_TOKENS": "8",
            "SGLANG_EXT_ALARM_ACCEPT_RATE": "0.1",
            "SGLANG_EXT_ACCEPTANCE_LOG": "off",
            "SGLANG_EXT_ACCEPTANCE_FLUSH_S": "0",
        }
    )
    assert not cfg.enabled and not cfg.log_requests
    assert (cfg.alarm_window, cfg.alarm_min_tokens, cfg.alarm_accept_rate) == (5, 8, 0.1)
    assert (cfg.flush_interval_s, m.MetricsConfig().flush_interval_s) == (0.0, 0.25)
    for env, name in (
        ({"SGLANG_EXT_ALARM_WINDOW": "abc"}, "SGLANG_EXT_ALARM_WINDOW"),
        ({"SGLANG_EXT_ALARM_WINDOW": "0"}, "SGLANG_EXT_ALARM_WINDOW"),
        ({"SGLANG_EXT_ALARM_ACCEPT_RATE": "2"}, "SGLANG_EXT_ALARM_ACCEPT_RATE"),
        ({"SGLANG_EXT_METRICS": "maybe"}, "SGLANG_EXT_METRICS"),
        ({"SGLANG_EXT_ACCEPTANCE_FLUSH_S": "-1"}, "SGLANG_EXT_ACCEPTANCE_FLUSH_S"),
        ({"SGLANG_EXT_ACCEPTANCE_FLUSH_S": "soon"}, "SGLANG_EXT_ACCEPTANCE_FLUSH_S"),
    ):
        with pytest.raises(ValueError, match=name):
            m.MetricsConfig.from_env(env)


# ------------------------------------------------------------------ Prometheus


LABELS = {"model_name": "meta-llama/Llama-3.1-8B-Instruct", "engine_type": "unified"}


def stub_spec() -> SimpleNamespace:
    """The resolved speculative settings a tokenizer process sees (chain S steps)."""
    return SimpleNamespace(
        speculative_algorithm="EAGLE3",
        speculative_num_steps=S,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=NUM_DRAFT_TOKENS,
        speculative_draft_model_path="/models/drafter",
    )


def _metrics(registry=None):
    from prometheus_client import CollectorRegistry

    registry = registry or CollectorRegistry()
    return acceptance_prometheus.AcceptanceMetrics(list(LABELS), registry=registry), registry


def test_prometheus_names_labels_buckets():
    metrics, reg = _metrics()
    rec = acceptance.build_record(
        rid="r1",
        prompt_tokens=12,
        completion_tokens=18,
        verify_steps=6,
        accepted_draft_tokens=11,
        histogram=[1, 2, 0, 3],
        num_draft_tokens=4,
        num_steps=3,
    )
    metrics.observe(rec, LABELS)
    metrics.set_health(LABELS, unhealthy=False, rolling_rate=0.61)
    metrics.add_hook_seconds(LABELS, 0.25)
    metrics.add_hook_seconds(LABELS, -1.0)  # a clock step back never lowers a counter
    assert reg.get_sample_value("sglang:spec_ext_metrics_hook_seconds_total", LABELS) == 0.25
    families = {f.name: f for f in reg.collect()}
    expected = {
        "sglang:spec_ext_accept_length": "histogram",
        "sglang:spec_ext_accept_rate": "histogram",
        "sglang:spec_ext_proposed_draft_tokens": "counter",
        "sglang:spec_ext_accepted_draft_tokens": "counter",
        "sglang:spec_ext_drafter_unhealthy": "gauge",
        "sglang:spec_ext_rolling_accept_rate": "gauge",
        "sglang:spec_ext_metrics_hook_seconds": "counter",
    }
    for name, typ in expected.items():
        assert name in families, name
        assert families[name].type == typ
        assert name.startswith("sglang:")
    for f in families.values():
        for s in f.samples:
            extra = {"le"} if s.name.endswith("_bucket") else set()
            if f.name in (
                "sglang:spec_ext_proposed_draft_tokens",
                "sglang:spec_ext_accepted_draft_tokens",
            ) and s.name.endswith("_total"):
                extra = {"position"}
            if s.name.endswith("_created"):
                extra = extra | ({"position"} if "position" in s.labels else set())
            assert set(s.labels) == set(LABELS) | extra, (s.name, s.labels)
    les = [
        float(s.labels["le"])
        for s in families["sglang:spec_ext_accept_length"].samples
        if s.name.endswith("_bucket")
    ]
    assert les == [*acceptance_prometheus.ACCEPT_LENGTH_BUCKETS, float("inf")]
    les = [
        float(s.labels["le"])
        for s in families["sglang:spec_ext_accept_rate"].samples
        if s.name.endswith("_bucket")
    ]
    assert les == [*acceptance_prometheus.ACCEPT_RATE_BUCKETS, float("inf")]
    g = reg.get_sample_value
    assert g("sglang:spec_ext_accept_length_count", LABELS) == 1
    assert g("sglang:spec_ext_accept_length_sum", LABELS) == pytest.approx(2.8333, abs=1e-4)
    assert g("sglang:spec_ext_accept_length_bucket", {**LABELS, "le": "2.75"}) == 0
    assert g("sglang:spec_ext_accept_length_bucket", {**LABELS, "le": "3.0"}) == 1
    assert g("sglang:spec_ext_drafter_unhealthy", LABELS) == 0
    assert g("sglang:spec_ext_rolling_accept_rate", LABELS) == pytest.approx(0.61)


def test_prometheus_counters_increment_per_position(requests_data):
    metrics, reg = _metrics()
    records = [to_record(r) for r in requests_data]
    for r in records:
        metrics.observe(r, LABELS)
    for pos in range(S):
        lab = {**LABELS, "position": str(pos)}
        acc = reg.get_sample_value("sglang:spec_ext_accepted_draft_tokens_total", lab)
        prop = reg.get_sample_value("sglang:spec_ext_proposed_draft_tokens_total", lab)
        assert acc == sum(r["accepted_per_position"][pos] for r in records)
        assert prop == sum(r["spec_verify_ct"] for r in requests_data)
    assert reg.get_sample_value("sglang:spec_ext_accept_rate_count", LABELS) == 55
    # Random drafter requests land in the lowest accept-length bucket.
    n_random_exact_1 = sum(1 for r in records if r["accept_length"] <= 1.0)
    assert (
        reg.get_sample_value("sglang:spec_ext_accept_length_bucket", {**LABELS, "le": "1.0"})
        == n_random_exact_1
    )
    assert n_random_exact_1 >= 20
    # Missing label values become "", never a crash (labels are SGLang's, may grow).
    metrics.observe(records[0], {"model_name": "x"})


def test_prometheus_multiprocess_mode(tmp_path, requests_data):
    """Create metrics lazily in a child process with PROMETHEUS_MULTIPROC_DIR set (as
    SGLang does), then read them the way SGLang's /metrics endpoint does."""
    from prometheus_client import CollectorRegistry, multiprocess

    rec = to_record(requests_data[0])
    code = (
        "import json, sys\n"
        "from sglang_ext.metrics import hook as m\n"
        "rec = json.loads(sys.argv[1])\n"
        f"labels = {LABELS!r}\n"
        "r = m.AcceptanceRecorder(m.MetricsConfig(log_requests=False))\n"
        "r.record(rec, labels)\n"
        "r.record(rec, labels)\n"
        "assert 'prometheus_client' in sys.modules\n"
    )
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", code, json.dumps(rec)], env=env, check=True, timeout=120)
    assert any(tmp_path.iterdir()), "no multiprocess files written"
    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg, path=str(tmp_path))
    assert reg.get_sample_value("sglang:spec_ext_accept_length_count", LABELS) == 2
    lab0 = {**LABELS, "position": "0"}
    assert (
        reg.get_sample_value("sglang:spec_ext_accepted_draft_tokens_total", lab0)
        == 2 * rec["accepted_per_position"][0]
    )
    # Window not full after 2 requests -> health gauge says healthy.
    assert reg.get_sample_value("sglang:spec_ext_drafter_unhealthy", LABELS) == 0


def test_metrics_module_does_not_import_heavy_deps_at_import():
    code = (
        "import sys\n"
        "import sglang_ext.metrics.hook, sglang_ext.cli.bench\n"
        "bad = [x for x in ('sglang', 'torch', 'prometheus_client') if x in sys.modules]\n"
        "assert not bad, bad\n"
    )
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


# ------------------------------------------------------------------ alarm


def _feed(alarm, records):
    events = []
    for k, r in enumerate(records):
        ev = alarm.observe(r["accept_rate"], r["completion_tokens"])
        if ev is not None:
            events.append((k, ev))
    return events


def test_alarm_fires_once_within_window_and_rearms(requests_data):
    records = [to_record(r) for r in requests_data]
    healthy, random_ = records[:30], records[30:]
    alarm = drafter_health.DrafterHealthAlarm(window=20, min_tokens=32, threshold=0.05)
    assert _feed(alarm, healthy) == []
    assert alarm.window_full and not alarm.unhealthy
    assert alarm.rolling_accept_rate > 0.3

    events = _feed(alarm, random_)
    assert [e.kind for _, e in events] == ["unhealthy"], events
    k, ev = events[0]
    eligible_random_seen = sum(1 for r in random_[: k + 1] if r["completion_tokens"] >= 32)
    assert eligible_random_seen <= 20  # fires within N eligible requests of the switch
    assert ev.rolling_accept_rate < 0.05
    assert alarm.unhealthy and alarm.episodes == 1

    # Still broken: no second warning.
    assert _feed(alarm, random_) == []
    # Recovery (drafter reloaded): one "recovered" event, alarm re-armed.
    events = _feed(alarm, healthy)
    assert [e.kind for _, e in events] == ["recovered"]
    assert not alarm.unhealthy
    # Broken again: fires again (new episode).
    events = _feed(alarm, random_)
    assert [e.kind for _, e in events] == ["unhealthy"]
    assert alarm.episodes == 2


def test_alarm_needs_full_window_of_long_requests(requests_data):
    records = [to_record(r) for r in requests_data]
    random_ = records[30:]
    alarm = drafter_health.DrafterHealthAlarm(window=20, min_tokens=32, threshold=0.05)
    eligible = [r for r in random_ if r["completion_tokens"] >= 32]
    short = [r for r in random_ if r["completion_tokens"] < 32]
    assert short, "data should contain short requests"
    # Short requests never count, however many.
    assert _feed(alarm, short * 30) == []
    assert alarm.rolling_accept_rate is None
    # 19 eligible broken requests: window not full -> no alarm yet; the 20th fires.
    assert _feed(alarm, eligible[:19]) == []
    ev = alarm.observe(eligible[19]["accept_rate"], eligible[19]["completion_tokens"])
    assert ev is not None and ev.kind == "unhealthy"


def test_request_counts_follow_the_definitions(requests_data):
    """The hook's flat request_counts gives what the definitions give, request by request."""
    for r in requests_data:
        hist = r["spec_correct_drafts_histogram"]
        V, A = r["spec_verify_ct"], r["spec_num_correct_drafts"]
        D, S_ = r["speculative_num_draft_tokens"], r["speculative_num_steps"]
        c = acceptance.request_counts(
            verify_steps=V, accepted_draft_tokens=A, histogram=hist, num_draft_tokens=D,
            num_steps=S_,
        )  # fmt: skip
        per_step = acceptance.draft_tokens_per_step(D, S_)
        acc, prop = acceptance.per_position_from_histogram(hist, S_)
        assert c["draft_tokens_per_step"] == per_step
        assert c["proposed_draft_tokens"] == acceptance.proposed_draft_tokens(V, per_step)
        assert c["accept_length"] == round(acceptance.accept_length(A, V), 4)
        assert c["accept_rate"] == round(acceptance.accept_rate(A, V * per_step), 4)
        assert (c["accepted_per_position"], c["proposed_per_position"]) == (acc, prop)
        assert c["accept_per_position"] == [round(x, 4) for x in acceptance.rates(acc, prop)]
        assert acc == acceptance.per_position_from_steps(r["accepted_per_step"], S_)[0]
    with pytest.raises(ValueError, match="histogram mass 4 != accepted drafts 5"):
        acceptance.request_counts(
            verify_steps=3, accepted_draft_tokens=5, histogram=[1, 0, 2], num_draft_tokens=4,
            num_steps=3,
        )  # fmt: skip


def test_recorder_queues_for_the_flusher_and_loses_nothing(requests_data, caplog, tmp_path):
    """submit() only queues: nothing is logged, written or counted until the flush, which
    hands over every record in order (log lines, JSONL, Prometheus, the one alarm) and counts
    its own CPU time with the hook's; a short interval drains by itself."""
    import time

    from prometheus_client import CollectorRegistry

    caplog.set_level(logging.INFO, logger=m.LOGGER_NAME)
    records = [to_record(r) for r in requests_data]

    def split(r):
        record = to_record(r)
        fields = {k: record[k] for k in ("rid", "prompt_tokens", "completion_tokens")}
        fields.update(topk=record["topk"], drafter=record["drafter"])
        fields.update(finish_reason=record["finish_reason"])
        return record, fields

    def lines():
        prefix = acceptance.LOG_PREFIX + " {"
        return [x.getMessage() for x in caplog.records if x.getMessage().startswith(prefix)]

    reg = CollectorRegistry()
    path = tmp_path / "a.jsonl"
    slow = m.AcceptanceRecorder(
        m.MetricsConfig(jsonl_path=str(path), flush_interval_s=60.0), prom_registry=reg
    )
    parts = [split(r) for r in requests_data]
    for counts, fields in parts:
        slow.submit(counts, fields, LABELS, time.thread_time())
    assert lines() == [] and not path.exists()
    assert reg.get_sample_value("sglang:spec_ext_accept_length_count", LABELS) is None
    slow.flush()
    rids = [r["rid"] for r in records]
    assert [acceptance.parse_log_line(x)["rid"] for x in lines()] == rids
    assert [json.loads(x)["rid"] for x in path.read_text().splitlines()] == rids
    assert reg.get_sample_value("sglang:spec_ext_accept_length_count", LABELS) == len(records)
    assert len([x for x in caplog.records if x.levelno == logging.WARNING]) == 1
    assert reg.get_sample_value("sglang:spec_ext_metrics_hook_seconds_total", LABELS) > 0

    caplog.clear()
    fast = m.AcceptanceRecorder(m.MetricsConfig(flush_interval_s=0.02))
    for counts, fields in parts:
        fast.submit(counts, fields, None, time.thread_time())
    deadline = time.monotonic() + 5.0
    while len(lines()) < len(records) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [acceptance.parse_log_line(x)["rid"] for x in lines()] == rids


def test_recorder_warns_once_with_likely_causes(requests_data, caplog):
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    rec = m.AcceptanceRecorder(m.MetricsConfig(log_requests=False), prom_registry=reg)
    caplog.set_level(logging.INFO, logger=m.LOGGER_NAME)
    records = [to_record(r) for r in requests_data]
    for r in records:
        rec.record(r, LABELS)
    warnings = [x for x in caplog.records if x.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    for needle in ("weights not loaded", "fusion", "off by one", "another target", "/models/"):
        assert needle in msg, needle
    assert reg.get_sample_value("sglang:spec_ext_drafter_unhealthy", LABELS) == 1
    assert 0 < reg.get_sample_value("sglang:spec_ext_rolling_accept_rate", LABELS) < 0.05
    for r in records[:30]:
        rec.record(r, LABELS)
    assert reg.get_sample_value("sglang:spec_ext_drafter_unhealthy", LABELS) == 0
    assert len([x for x in caplog.records if x.levelno == logging.WARNING]) == 1


# ------------------------------------------------------------------ install / hook targets


def test_install_registers_resolvable_targets(monkeypatch):
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    monkeypatch.delenv("SGLANG_EXT_METRICS", raising=False)
    HookRegistry.reset()
    try:
        targets = m.install()
        assert targets == [m.CALC_SPEC_METRICS_TARGET]
        for t in targets:
            assert callable(pkgutil.resolve_name(t))
            hooks = HookRegistry._hooks[t]
            assert [(ht, h) for ht, h, _ in hooks] == [
                (HookType.AFTER, m.after_calculate_spec_decoding_metrics)
            ]
        # Idempotent: a second call does not double-register (double counting).
        assert m.install() == targets
        assert len(HookRegistry._hooks[targets[0]]) == 1
    finally:
        HookRegistry.reset()


def test_install_disabled_and_errors(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.reset()
    try:
        monkeypatch.setenv("SGLANG_EXT_METRICS", "0")
        assert m.install() == []
        assert not HookRegistry._hooks
        monkeypatch.setenv("SGLANG_EXT_METRICS", "1")
        monkeypatch.setenv("SGLANG_EXT_ALARM_WINDOW", "-3")
        with pytest.raises(RuntimeError, match="SGLANG_EXT_ALARM_WINDOW"):
            m.install()
        monkeypatch.delenv("SGLANG_EXT_ALARM_WINDOW")
        bogus = "sglang.srt.managers.tokenizer_manager.TokenizerManager._no_such_method"
        monkeypatch.setattr(
            m, "hook_specs", lambda: [(bogus, "AFTER", m.after_calculate_spec_decoding_metrics)]
        )
        with pytest.raises(RuntimeError, match="_no_such_method"):
            m.install()
        assert not HookRegistry._hooks
    finally:
        HookRegistry.reset()


def _src_0517(module: str) -> Path:
    return SGLANG_0517_SRC.joinpath(*module.split(".")).with_suffix(".py")


def _find_class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} not found")


@pytest.mark.skipif(not HAS_0517_SRC, reason="SGLang 0.5.17 sources not present")
def test_hook_targets_exist_in_sglang_0517_source():
    for target, _, _ in m.hook_specs():
        module, cls_name, meth = target.rsplit(".", 2)
        path = _src_0517(module)
        assert path.is_file(), f"{target}: {path} missing in 0.5.17"
        tree = ast.parse(path.read_text())
        cls = _find_class(tree, cls_name)
        methods = {
            n.name: n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert meth in methods, f"{target}: {cls_name}.{meth} missing in 0.5.17"
        args = [a.arg for a in methods[meth].args.args]
        assert args == ["self", "meta_info", "recv_obj", "i"], args
        # Called once per finished request from _handle_batch_output.
        body = ast.get_source_segment(path.read_text(), methods["_handle_batch_output"])
        assert "self._calculate_spec_decoding_metrics(meta_info, recv_obj, i)" in body


def test_hook_target_signature_in_installed_sglang():
    import pkgutil

    for target, _, _ in m.hook_specs():
        fn = pkgutil.resolve_name(target)
        assert list(inspect.signature(fn).parameters) == ["self", "meta_info", "recv_obj", "i"]
        from sglang.srt.managers.tokenizer_manager import TokenizerManager

        src = inspect.getsource(TokenizerManager._handle_batch_output)
        assert "self._calculate_spec_decoding_metrics(meta_info, recv_obj, i)" in src


READ_FIELDS = (
    "rids",
    "finished_reasons",
    "prompt_tokens",
    "completion_tokens",
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_correct_drafts_histogram",
)


@pytest.mark.skipif(not HAS_0517_SRC, reason="SGLang 0.5.17 sources not present")
def test_batch_output_fields_exist_in_both_versions():
    from sglang.srt.managers import io_struct

    for cls_name in ("BatchStrOutput", "BatchTokenIDOutput"):
        fields = set(getattr(io_struct, cls_name).__struct_fields__)
        assert set(READ_FIELDS) <= fields, (cls_name, set(READ_FIELDS) - fields)
    tree = ast.parse(_src_0517("sglang.srt.managers.io_struct").read_text())
    base = {
        t.target.id for t in _find_class(tree, "BaseBatchReq").body if isinstance(t, ast.AnnAssign)
    }
    for cls_name in ("BatchStrOutput", "BatchTokenIDOutput"):
        own = {
            t.target.id for t in _find_class(tree, cls_name).body if isinstance(t, ast.AnnAssign)
        }
        assert set(READ_FIELDS) <= own | base, (cls_name, set(READ_FIELDS) - (own | base))
    # The per-step histogram update exists (same name) in 0.5.17's Req.
    tree = ast.parse(_src_0517("sglang.srt.managers.schedule_batch").read_text())
    req = _find_class(tree, "Req")
    assert "update_spec_correct_drafts_histogram" in {
        n.name for n in req.body if isinstance(n, ast.FunctionDef)
    }


def test_hook_on_real_tokenizer_manager_method(monkeypatch, requests_data, caplog):
    """Apply the hook with SGLang's HookRegistry onto the real
    TokenizerManager._calculate_spec_decoding_metrics and call it with a stub manager and a
    stub BatchStrOutput carrying the recorded counters. SGLang's own body computes its
    meta_info keys; ours must be added next to them and agree with them."""
    from prometheus_client import CollectorRegistry
    from sglang.srt.managers import tokenizer_manager as tm_mod
    from sglang.srt.plugins.hook_registry import HookRegistry

    TM = tm_mod.TokenizerManager
    # SGLang's own body: an earlier module that registered the plugin may have left it hooked.
    original = inspect.unwrap(TM.__dict__["_calculate_spec_decoding_metrics"])
    monkeypatch.setattr(TM, "_calculate_spec_decoding_metrics", original)  # restored later
    spec = stub_spec()
    # 0.5.23's body reads get_spec(); the runtime context is not published in a unit test.
    monkeypatch.setattr(tm_mod, "get_spec", lambda: spec, raising=False)
    reg = CollectorRegistry()
    monkeypatch.setattr(
        m,
        "_RECORDER",
        m.AcceptanceRecorder(m.MetricsConfig(), prom_registry=reg),
    )
    HookRegistry.reset()
    try:
        assert m.install() == [m.CALC_SPEC_METRICS_TARGET]
        monkeypatch.setattr(
            m,
            "_RECORDER",
            m.AcceptanceRecorder(m.MetricsConfig(), prom_registry=reg),
        )
        HookRegistry.apply_hooks()
        assert TM._calculate_spec_decoding_metrics is not original
    finally:
        HookRegistry.reset()

    rows = requests_data[:2] + requests_data[30:31]
    recv = SimpleNamespace(
        rids=[r["rid"] for r in rows],
        finished_reasons=[{"type": r["finish_reason"]} for r in rows],
        prompt_tokens=[r["prompt_tokens"] for r in rows],
        completion_tokens=[r["completion_tokens"] for r in rows],
        spec_verify_ct=[r["spec_verify_ct"] for r in rows],
        spec_num_correct_drafts=[r["spec_num_correct_drafts"] for r in rows],
        spec_num_block_accept_tokens=None,
        spec_num_cap_tokens=None,
        spec_correct_drafts_histogram=[r["spec_correct_drafts_histogram"] for r in rows],
        spec_cap_lens_histogram=None,
    )
    stub_tm = SimpleNamespace(
        server_args=spec,
        enable_metrics=True,
        metrics_collector=SimpleNamespace(labels=dict(LABELS)),
        rid_to_state={
            r["rid"]: SimpleNamespace(obj=SimpleNamespace(custom_labels=None, priority=None))
            for r in rows
        },
    )
    caplog.set_level(logging.INFO, logger=m.LOGGER_NAME)
    for i, r in enumerate(rows):
        meta = {"id": r["rid"]}
        TM._calculate_spec_decoding_metrics(stub_tm, meta, recv, i)
        # SGLang's own keys are there and untouched ...
        assert meta["spec_verify_ct"] == r["spec_verify_ct"]
        assert meta["spec_accept_length"] == pytest.approx(
            r["completion_tokens"] / r["spec_verify_ct"]
        )
        # ... ours next to them, consistent with SGLang's definitions.
        acc, prop = acceptance.per_position_from_steps(r["accepted_per_step"], S)
        assert meta["spec_accepted_per_position"] == acc
        assert meta["spec_proposed_per_position"] == prop
        assert meta["spec_accepted_draft_tokens"] == meta["spec_num_correct_drafts"]
        assert meta["spec_proposed_draft_tokens"] == meta["spec_num_proposed_drafts"]
        assert meta["spec_accept_length_exact"] == pytest.approx(
            (r["spec_num_correct_drafts"] + r["spec_verify_ct"]) / r["spec_verify_ct"], abs=1e-4
        )
        assert len(meta["spec_accept_per_position"]) == S
    # meta_info is filled in the hook; the rest waits for the flusher (default 0.25 s)
    m.get_recorder().flush()
    lines = [
        acceptance.parse_log_line(x.getMessage())
        for x in caplog.records
        if x.getMessage().startswith(acceptance.LOG_PREFIX + " {")
    ]
    assert [x["rid"] for x in lines] == [r["rid"] for r in rows]
    assert lines[0]["drafter"] == "/models/drafter"
    assert lines[0]["algorithm"] == "EAGLE3"
    assert reg.get_sample_value("sglang:spec_ext_accept_length_count", LABELS) == 3
    # what the hook cost, counted by the hook itself: positive, and far below a second
    spent = reg.get_sample_value("sglang:spec_ext_metrics_hook_seconds_total", LABELS)
    assert 0 < spent < 1.0

    # A request that finished at prefill (no verify step): nothing added, nothing logged.
    recv0 = SimpleNamespace(**{**vars(recv), "spec_verify_ct": [0, 0, 0]})
    meta = {}
    TM._calculate_spec_decoding_metrics(stub_tm, meta, recv0, 0)
    assert "spec_accept_length_exact" not in meta


def test_hook_never_raises_into_sglang(caplog):
    caplog.set_level(logging.INFO, logger=m.LOGGER_NAME)
    broken = SimpleNamespace(
        rids=["a"],
        spec_verify_ct=[3],
        spec_num_correct_drafts=[99],  # contradicts histogram and anything else
        spec_correct_drafts_histogram=["x"],
        completion_tokens=[4],
    )
    assert m.after_calculate_spec_decoding_metrics(None, object(), {}, broken, 0) is None


def test_hook_counts_its_cpu_time_not_the_time_it_waits(monkeypatch):
    """The hook's own cost counter is the thread's CPU time: a hook call that blocks (here a
    50 ms sleep inside the record, as a GIL wait or a slow log write would) adds almost
    nothing, while the CPU work it does is counted."""
    import time

    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    recorder = m.AcceptanceRecorder(
        m.MetricsConfig(log_requests=False, flush_interval_s=0), prom_registry=reg
    )
    monkeypatch.setattr(m, "_RECORDER", recorder)
    spec = stub_spec()
    tm = SimpleNamespace(
        server_args=spec,
        enable_metrics=True,
        metrics_collector=SimpleNamespace(labels=dict(LABELS)),
        rid_to_state={},
    )
    recv = SimpleNamespace(
        rids=["r0", "r1"],
        finished_reasons=[{"type": "length"}] * 2,
        prompt_tokens=[10, 10],
        completion_tokens=[12, 12],
        spec_verify_ct=[6, 6],
        spec_num_correct_drafts=[6, 6],
        spec_correct_drafts_histogram=[[2, 2, 2, 0]] * 2,
    )
    metric = "sglang:spec_ext_metrics_hook_seconds_total"
    original = recorder.record

    def blocking_record(record, labels):
        time.sleep(0.05)
        return original(record, labels)

    monkeypatch.setattr(recorder, "record", blocking_record)
    wall = time.perf_counter()
    m.after_calculate_spec_decoding_metrics(None, tm, {}, recv, 0)
    wall = time.perf_counter() - wall
    blocked = reg.get_sample_value(metric, LABELS)
    assert wall >= 0.05
    assert 0 < blocked < 0.02, blocked

    def busy_record(record, labels):
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        return original(record, labels)

    monkeypatch.setattr(recorder, "record", busy_record)
    m.after_calculate_spec_decoding_metrics(None, tm, {}, recv, 1)
    assert reg.get_sample_value(metric, LABELS) - blocked >= 0.05
