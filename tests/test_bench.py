"""Tests for sglang_ext.cli.bench (CPU only).

Response data: ``tests/data/recorded_requests_synthetic_bench_responses.jsonl``. These are
SYNTHETIC responses, built from the synthetic per-request counters in
``recorded_requests_synthetic_drafter_health.jsonl`` with the exact meta_info layout that
SGLang's ``TokenizerManager._calculate_spec_decoding_metrics`` produces in 0.5.17 (with its
backward-compat aliases ``spec_accepted_drafts`` / ``spec_proposed_drafts`` /
``spec_accept_histogram``) and 0.5.23 (without), the ``sglext.spec_tokens_details`` block of
0.5.23's /v1/completions, and the keys added by sglang_ext.metrics.hook. Not captured from a live
server (no GPU here).

The HTTP test at the end replays those bodies from a tiny local ``http.server``: it tests
the client's I/O (request bodies, SSE parsing, error handling) only. It is NOT an
integration test of SGLang.
"""

from __future__ import annotations

import http.server
import io
import json
import re
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from sglang_ext.cli import bench as b
from sglang_ext.cli import bench_report as report

DATA = Path(__file__).parent / "data" / "recorded_requests_synthetic_bench_responses.jsonl"
HEALTH = Path(__file__).parent / "data" / "recorded_requests_synthetic_drafter_health.jsonl"


@pytest.fixture(scope="module")
def recorded() -> list[dict]:
    with DATA.open() as f:
        return [json.loads(x) for x in f if x.strip()]


def pick(recorded, style, api, rid=None):
    out = [
        r
        for r in recorded
        if r["style"] == style and r["api"] == api and (rid is None or r["rid"] == rid)
    ]
    assert out, (style, api, rid)
    return out


# ------------------------------------------------------------------ prompts


def test_parse_prompt_lines_valid():
    lines = [
        '{"prompt": "hello"}',
        "",
        '  {"input_ids": [1, 2, 3]}  ',
        json.dumps({"prompt": "multi\nline"}),
    ]
    ps = b.parse_prompt_lines(lines, "f.jsonl")
    assert ps == [
        b.Prompt(text="hello"),
        b.Prompt(input_ids=(1, 2, 3)),
        b.Prompt(text="multi\nline"),
    ]
    assert ps[1].describe() == "<3 input ids>"


@pytest.mark.parametrize(
    "line, msg",
    [
        ("{not json", "f.jsonl:2: invalid JSON"),
        ('["a"]', "f.jsonl:2: expected a JSON object"),
        ('{"prompt": "a", "input_ids": [1]}', "exactly one"),
        ('{"text": "a"}', "exactly one"),
        ('{"prompt": ""}', "non-empty string"),
        ('{"input_ids": []}', "non-empty list"),
        ('{"input_ids": [1, -2]}', "non-empty list"),
        ('{"input_ids": [true]}', "non-empty list"),
        ('{"input_ids": "1 2"}', "non-empty list"),
    ],
)
def test_parse_prompt_lines_errors(line, msg):
    with pytest.raises(b.BenchError, match=msg):
        b.parse_prompt_lines(['{"prompt": "ok"}', line], "f.jsonl")


def test_parse_prompt_lines_empty():
    with pytest.raises(b.BenchError, match="no prompts"):
        b.parse_prompt_lines(["", "  "], "f.jsonl")


def test_load_prompts_file_default_and_missing(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n{"input_ids": [5, 6]}\n')
    ps, src = b.load_prompts(str(f))
    assert len(ps) == 2 and src == str(f)
    ps, src = b.load_prompts(None)
    assert src.startswith("bundled:") and len(ps) >= 16
    assert all(p.text for p in ps)
    with pytest.raises(b.BenchError, match="cannot read prompt file"):
        b.load_prompts(str(tmp_path / "missing.jsonl"))


def test_select_prompts_cycles():
    ps = [b.Prompt(text=str(k)) for k in range(3)]
    assert [p.text for p in b.select_prompts(ps, 7)] == ["0", "1", "2", "0", "1", "2", "0"]
    assert b.select_prompts(ps, None) == ps
    assert [p.text for p in b.select_prompts(ps, 2)] == ["0", "1"]


# ------------------------------------------------------------------ acceptance extraction

# healthy-01: V=83 verify steps, A=116 accepted drafts, 200 completion tokens, S=3,
# histogram [25, 21, 16, 21] -> per position accepted [58, 37, 21] of 83.
H01 = dict(V=83, A=116, C=200, acc_pp=[58, 37, 21])


@pytest.mark.parametrize(
    "style, api, source",
    [
        ("sglang-0.5.23", "generate", "sglang"),
        ("sglang-0.5.17", "generate", "sglang"),
        ("sglang-0.5.23+sglang_ext", "generate", "sglang_ext"),
        ("sglang-0.5.17+sglang_ext", "generate", "sglang_ext"),
        ("sglang-0.5.23", "openai", "sglang"),
    ],
)
def test_extract_acceptance_all_styles_agree(recorded, style, api, source):
    (row,) = pick(recorded, style, api, "healthy-01")
    res = report.make_result(0, _normalise(row), latency_s=2.0, ttft_s=0.05, num_positions=3)
    a = res.acceptance
    assert a.source == source
    assert res.completion_tokens == H01["C"]
    assert a.verify_steps == H01["V"]
    assert a.accepted_draft_tokens == H01["A"]
    assert a.proposed_draft_tokens == 3 * H01["V"]
    assert a.accept_length == pytest.approx((H01["A"] + H01["V"]) / H01["V"])  # 2.3976
    assert a.sglang_accept_length == pytest.approx(H01["C"] / H01["V"])  # 2.4096
    assert a.accept_rate == pytest.approx(H01["A"] / (3 * H01["V"]))
    assert a.accepted_per_position == H01["acc_pp"]
    assert a.proposed_per_position == [H01["V"]] * 3
    assert a.accept_per_position == pytest.approx([x / H01["V"] for x in H01["acc_pp"]])
    assert res.tok_per_s == pytest.approx(100.0)
    assert res.tpot_s == pytest.approx((2.0 - 0.05) / 199)


def _normalise(row):
    if row["api"] == "generate":
        return row["response"]
    acc: dict = {}
    b.normalise_openai(row["response"], acc)
    return acc


def test_extract_acceptance_0517_aliases_only():
    info = {
        "spec_verify_ct": 10,
        "spec_accepted_drafts": 12,
        "spec_proposed_drafts": 30,
        "spec_accept_histogram": [3, 2, 3, 2],
    }
    a = report.extract_acceptance(info, 23, 3)
    assert a.source == "sglang"
    assert a.accept_length == pytest.approx(2.2)
    assert a.accept_rate == pytest.approx(0.4)
    assert a.sglang_accept_length == pytest.approx(2.3)
    assert a.accepted_per_position == [7, 5, 2]


def test_extract_acceptance_estimated_and_missing():
    a = report.extract_acceptance({"spec_verify_ct": 10, "spec_accept_length": 2.5}, 25)
    assert a.source == "sglang_estimated"
    assert a.accepted_draft_tokens == 14 and a.accept_length == pytest.approx(2.4)
    assert report.extract_acceptance({}, 25).accept_length is None
    assert report.extract_acceptance({"spec_verify_ct": 0}, 25).accept_length is None
    assert report.extract_acceptance(None, 25).source is None


def test_openai_0517_reports_no_acceptance(recorded):
    (row,) = pick(recorded, "sglang-0.5.17", "openai", "healthy-01")
    res = report.make_result(0, _normalise(row), 1.0, None)
    assert res.acceptance.accept_length is None
    assert res.completion_tokens == 200 and res.tpot_s is None
    summary = report.summarize([res], 1.0)
    w = report.acceptance_warnings(summary, "openai")
    assert len(w) == 1 and "NOT REPORTED" in w[0] and "--api generate" in w[0]


def test_per_position_from_histogram_matches_metrics_module():
    from sglang_ext.metrics import acceptance as metrics

    for hist in ([25, 21, 16, 21], [9], [4, 2], [0, 0, 0, 5], [1, 0, 0, 0, 2]):
        assert report.per_position_from_histogram(hist, 3) == metrics.per_position_from_histogram(
            hist, 3
        )


# ------------------------------------------------------------------ summary, compare


def _results(recorded, style):
    rows = pick(recorded, style, "generate")
    return [
        report.make_result(k, r["response"], latency_s=1.0 + k, ttft_s=0.1, num_positions=3)
        for k, r in enumerate(rows)
    ]


def test_summarize_pooled_acceptance(recorded):
    res = _results(recorded, "sglang-0.5.23")
    res.append(report.RequestResult(index=99, ok=False, error="boom"))
    s = report.summarize(res, wall_s=10.0)
    rows = [r["response"]["meta_info"] for r in pick(recorded, "sglang-0.5.23", "generate")]
    V = sum(m["spec_verify_ct"] for m in rows)
    A = sum(m["spec_num_correct_drafts"] for m in rows)
    C = sum(m["completion_tokens"] for m in rows)
    acc = s["acceptance"]
    assert s["num_ok"] == 4 and s["num_failed"] == 1
    assert s["completion_tokens_total"] == C
    assert s["output_tok_per_s"] == pytest.approx(C / 10.0)
    assert acc["available"] and acc["sources"] == ["sglang"]
    assert acc["accept_length"] == pytest.approx((A + V) / V)
    assert acc["sglang_accept_length"] == pytest.approx(C / V)
    assert acc["accept_rate"] == pytest.approx(A / (3 * V))
    assert sum(acc["accepted_per_position"]) == A
    assert acc["proposed_per_position"] == [V] * 3
    assert sum(h["count"] for h in acc["accept_length_histogram"]) == 4
    # The random-drafter request (accept length 1.0) lands in the first bin.
    assert acc["accept_length_histogram"][0]["count"] == 1
    assert s["latency_s"]["p50"] == pytest.approx(2.5)
    # Styles agree on the pooled figures.
    s17 = report.summarize(_results(recorded, "sglang-0.5.17"), 10.0)["acceptance"]
    sx = report.summarize(_results(recorded, "sglang-0.5.23+sglang_ext"), 10.0)["acceptance"]
    for k in ("accept_length", "accept_rate", "accepted_per_position", "sglang_accept_length"):
        assert s17[k] == pytest.approx(acc[k]) and sx[k] == pytest.approx(acc[k])


def test_compare_speedup_and_eta():
    spec = {
        "output_tok_per_s": 90.0,
        "tpot_s": {"mean": 0.010},
        "acceptance": {"accept_length": 3.6},
    }
    base = {"output_tok_per_s": 30.0, "tpot_s": {"mean": 0.032}}
    c = report.compare(spec, base)
    assert c["speedup"] == pytest.approx(3.0)
    assert c["tpot_speedup"] == pytest.approx(3.2)
    assert c["eta"] == pytest.approx(3.0 / 3.6)
    assert c["eta_tpot"] == pytest.approx(3.2 / 3.6)
    # The incident: 24.8 tok/s speculative vs 30 baseline, accept length 1.0.
    bad = report.compare(
        {"output_tok_per_s": 24.8, "tpot_s": {}, "acceptance": {"accept_length": 1.0}}, base
    )
    assert bad["speedup"] == pytest.approx(24.8 / 30) and bad["eta"] == pytest.approx(0.8267, 1e-3)
    none = report.compare({"output_tok_per_s": None, "acceptance": {}}, base)
    assert none["speedup"] is None and none["eta"] is None


def _timed(index, tokens, latency, ok=True):
    return report.RequestResult(index=index, ok=ok, completion_tokens=tokens, latency_s=latency)


def test_speedup_interval_pairs_by_prompt_and_brackets_the_point():
    # Speculative twice as fast on every prompt: the interval collapses onto 2.
    spec = [_timed(k, 128, 0.1 * (k + 1)) for k in range(8)]
    base = [_timed(k, 128, 0.2 * (k + 1)) for k in reversed(range(8))]  # order must not matter
    exact = report.speedup_interval(spec, base)
    assert exact["point"] == pytest.approx(2.0) and exact["pairs"] == 8
    assert exact["ci95"] == [pytest.approx(2.0), pytest.approx(2.0)]
    # Per-prompt ratios spread around 1.5: the point is the pooled ratio, inside the interval,
    # and the interval spans the spread but not the extremes' whole range.
    ratios = [1.2, 1.8, 1.4, 1.6, 1.3, 1.7, 1.5, 1.5, 1.25, 1.75]
    spec = [_timed(k, 64, 1.0) for k in range(10)]
    base = [_timed(k, 64, r) for k, r in enumerate(ratios)]
    ci = report.speedup_interval(spec, base)
    assert ci["point"] == pytest.approx(1.5)
    assert 1.2 < ci["ci95"][0] < 1.5 < ci["ci95"][1] < 1.8
    # Token counts enter the rates: 2x the tokens in the same time is 2x the speedup.
    spec = [_timed(k, 256, 1.0) for k in range(6)]
    base = [_timed(k, 128, 1.0) for k in range(6)]
    assert report.speedup_interval(spec, base)["point"] == pytest.approx(2.0)
    # Failed requests and prompts the other side lacks drop out; under 4 pairs: no interval.
    spec = [_timed(0, 8, 1.0), _timed(1, 8, 1.0, ok=False), _timed(2, 8, 1.0), _timed(9, 8, 1.0)]
    base = [_timed(k, 8, 1.0) for k in range(4)]
    assert report.speedup_interval(spec, base) is None


def test_comparison_prints_the_speedup_interval():
    summary = {
        "output_tok_per_s": 90.0,
        "mean_request_tok_per_s": 91.0,
        "tpot_s": {"mean": None},
        "acceptance": {"accept_length": 3.0, "accept_rate": 0.6},
    }
    base = {"output_tok_per_s": 30.0, "mean_request_tok_per_s": 31.0, "tpot_s": {"mean": None}}
    cmp = report.compare(summary, base)
    assert "[" not in report.format_comparison(summary, base, cmp).splitlines()[-1]
    cmp["speedup_interval"] = {"point": 3.0, "ci95": [2.71, 3.34], "pairs": 16, "draws": 2000}
    line = report.format_comparison(summary, base, cmp).splitlines()[-1]
    assert "SPEEDUP (tok/s) 3.00x [2.71, 3.34] (95 %, 16 prompts paired)" in line


def test_warnings_for_broken_and_healthy(recorded):
    rows = pick(recorded, "sglang-0.5.23", "generate")
    random_row = [r for r in rows if r["rid"].startswith("random")]
    healthy = [r for r in rows if r["rid"].startswith("healthy")]
    s_bad = report.summarize([report.make_result(0, random_row[0]["response"], 1.0, 0.1)], 1.0)
    w = report.acceptance_warnings(s_bad, "generate")
    assert len(w) == 1 and w[0].startswith("ACCEPT LENGTH 1.00")
    s_ok = report.summarize(
        [report.make_result(k, r["response"], 1.0, 0.1) for k, r in enumerate(healthy)], 1
    )
    assert report.acceptance_warnings(s_ok, "generate") == []
    (nospec,) = pick(recorded, "sglang-0.5.23-nospec", "generate")
    s_none = report.summarize([report.make_result(0, nospec["response"], 1.0, 0.1)], 1.0)
    assert "NOT REPORTED" in report.acceptance_warnings(s_none, "generate")[0]
    text = report.banner(w)
    lines = text.splitlines()
    assert len(lines) == 3 and lines[1].startswith("!!! ACCEPT LENGTH 1.00")
    assert set(lines[0]) == {"!"} == set(lines[2])
    meta = {"meta_info": {"completion_tokens": 25, "spec_verify_ct": 10}}
    est = report.summarize([report.make_result(0, meta, 1, 0)], 1.0)
    assert any("estimated" in x for x in report.acceptance_warnings(est, "generate"))


def test_format_summary_and_tables(recorded):
    res = _results(recorded, "sglang-0.5.23+sglang_ext")
    s = report.summarize(res, 10.0)
    text = report.format_summary(s, "speculative")
    assert "ACCEPT LENGTH (exact)" in text
    assert f"{s['acceptance']['accept_length']:.3f}" in text
    assert "sglang accept length" in text and "ACCEPT RATE" in text
    assert "per-position acceptance" in text
    table = report.format_requests_table([*res, report.RequestResult(index=7, ok=False, error="x")])
    assert len(table.splitlines()) == 6 and "FAILED: x" in table
    (nospec,) = pick(recorded, "sglang-0.5.23-nospec", "generate")
    s0 = report.summarize([report.make_result(0, nospec["response"], 1.0, 0.1)], 1.0)
    assert "NOT REPORTED" in report.format_summary(s0)
    cmp = report.compare(s, s0)
    text = report.format_comparison(s, s0, cmp)
    assert "SPEEDUP" in text and "eta = speedup / accept length" in text


REPORT_SCHEMA = {
    "type": "object",
    "required": [
        "schema",
        "config",
        "server",
        "summary",
        "requests",
        "warnings",
        "baseline",
        "comparison",
    ],
    "properties": {
        "schema": {"const": "sglang_ext.bench/1"},
        "summary": {
            "type": "object",
            "required": ["num_ok", "num_failed", "output_tok_per_s", "tpot_s", "acceptance"],
            "properties": {
                "acceptance": {
                    "type": "object",
                    "required": [
                        "available",
                        "accept_length",
                        "sglang_accept_length",
                        "accept_rate",
                        "accept_per_position",
                    ],
                }
            },
        },
        "requests": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "ok", "completion_tokens", "latency_s", "acceptance"],
                "not": {"required": ["text"]},
            },
        },
        "comparison": {
            "type": ["object", "null"],
            "properties": {"speedup": {}, "eta": {}},
        },
    },
}


def test_report_json_schema(recorded):
    jsonschema = pytest.importorskip("jsonschema")
    res = _results(recorded, "sglang-0.5.23")
    s = report.summarize(res, 10.0)
    rep = report.build_report(
        config={"url": "u"},
        server={"url": "u", "speculative_algorithm": "EAGLE3"},
        results=res,
        summary=s,
        warnings=report.acceptance_warnings(s, "generate"),
    )
    rep = json.loads(json.dumps(rep))  # JSON-serialisable
    jsonschema.validate(rep, REPORT_SCHEMA)
    assert rep["requests"][0]["acceptance"]["accepted_per_position"] is not None
    bad = dict(rep)
    del bad["summary"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, REPORT_SCHEMA)


def test_progress_plain_stderr():
    buf = io.StringIO()
    p = b.Progress(20, "spec", stream=buf, use_tqdm=False)
    for _ in range(20):
        p.update("acc_len=2.00")
    p.close()
    lines = buf.getvalue().splitlines()
    assert lines[-1].startswith("spec: 20/20") and 10 <= len(lines) <= 12


# ------------------------------------------------------------------ CLI


def test_cli_parsing():
    p = b.build_parser()
    a = p.parse_args([])
    assert (a.url, a.api, a.concurrency, a.max_new_tokens, a.warmup, a.stream) == (
        "http://127.0.0.1:30000",
        "generate",
        1,
        256,
        2,
        True,
    )
    assert a.num_requests is None and a.baseline_url is None and a.min_accept_length is None
    a = p.parse_args(
        [
            "--url=http://h:1",
            "--api",
            "openai",
            "--model",
            "m",
            "--prompts",
            "p.jsonl",
            "--num-requests",
            "50",
            "--concurrency",
            "8",
            "--max-new-tokens",
            "64",
            "--warmup",
            "0",
            "--no-stream",
            "--baseline-url",
            "http://h:2",
            "--out",
            "r.json",
            "--plot",
            "x.png",
            "--per-request",
            "--no-progress",
            "--min-accept-length",
            "2.5",
            "--ignore-eos",
            "--timeout",
            "30",
        ]
    )
    assert a.api == "openai" and a.concurrency == 8 and not a.stream and not a.progress
    assert a.min_accept_length == 2.5 and a.ignore_eos and a.timeout == 30.0
    for bad in (["--concurrency", "0"], ["--api", "grpc"], ["--warmup", "-1"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)


def test_build_body():
    spec = b.RequestSpec(api="generate", url="http://h:1/", max_new_tokens=8)
    url, body = b.build_body(spec, b.Prompt(input_ids=(1, 2)))
    assert url == "http://h:1/generate"
    assert body["input_ids"] == [1, 2] and "text" not in body
    assert body["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": False}
    spec = b.RequestSpec(api="openai", url="http://h:1", max_new_tokens=8, model="m")
    url, body = b.build_body(spec, b.Prompt(text="hi"))
    assert url == "http://h:1/v1/completions"
    assert body["prompt"] == "hi" and body["max_tokens"] == 8 and body["model"] == "m"
    assert body["return_spec_tokens_details"] is True
    assert body["stream_options"] == {"include_usage": True}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_main_unreachable_server(capsys):
    rc = b.main(["--url", f"http://127.0.0.1:{_free_port()}", "--no-progress", "--timeout", "5"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "not reachable" in err and "--url" in err


def test_main_bad_prompt_file(tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": 3}\n')
    assert b.main(["--prompts", str(f), "--no-progress"]) == 2
    assert "p.jsonl:1" in capsys.readouterr().err


def test_main_plot_without_matplotlib(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    assert b.main(["--plot", str(tmp_path / "x.png")]) == 2
    assert "matplotlib" in capsys.readouterr().err


# ------------------------------------------------------------------ client I/O (local stub)


class _Replay(http.server.BaseHTTPRequestHandler):
    """Replays recorded response bodies. Client I/O test only; not SGLang."""

    responses: dict = {}
    server_info: dict = {}
    seen: list = []
    delay_s: float = 0.0  # per request, before the response: a server's "latency"
    slowdown = staticmethod(lambda: 1.0)  # the machine's state now: multiplies delay_s
    arrivals: list = []  # (server name, time): shared by servers to see the order
    name = ""
    ids_only = False  # stream chunks as a --skip-tokenizer-init server does: output_ids, no text
    chunk_gap_s = 0.0  # between a stream's chunks: the decode time after the first token

    def log_message(self, *a):  # quiet
        pass

    def _send_json(self, obj, code=200):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send_json({})
        elif self.path == "/server_info":
            self._send_json(self.server_info)
        else:
            self._send_json({"detail": "not found"}, 404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, body))
        key = "generate" if self.path == "/generate" else "openai"
        if self.path not in ("/generate", "/v1/completions"):
            return self._send_json({"detail": "not found"}, 404)
        prompt = body.get("text") or body.get("prompt") or ""
        if prompt == "FAIL":
            return self._send_json({"error": {"message": "bad request"}}, 400)
        rows = self.responses[key]
        resp = rows[len(type(self).seen) % len(rows)]
        type(self).arrivals.append((self.name, time.monotonic()))
        time.sleep(self.delay_s * self.slowdown())
        if not body.get("stream"):
            return self._send_json(resp)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for n, chunk in enumerate(_stream_chunks(key, resp, self.ids_only)):
            if n:
                time.sleep(self.chunk_gap_s)
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")


def _stream_chunks(key, resp, ids_only=False):
    if key == "generate":
        meta = resp["meta_info"]
        partial = {
            k: v for k, v in meta.items() if not k.startswith("spec_") and k != "e2e_latency"
        }
        if ids_only:  # --skip-tokenizer-init: token ids, no text
            n = meta["completion_tokens"]
            yield {"output_ids": [7], "meta_info": {**partial, "completion_tokens": 1}}
            yield {"output_ids": list(range(7, 7 + n)), "meta_info": meta}
            return
        yield {"text": resp["text"][:3], "meta_info": {**partial, "completion_tokens": 1}}
        yield resp
    else:
        ch = resp["choices"][0]
        yield {"id": resp["id"], "choices": [{"index": 0, "text": ch["text"][:3]}]}
        yield {
            "id": resp["id"],
            "choices": [{"index": 0, "text": ch["text"][3:], "finish_reason": ch["finish_reason"]}],
        }
        if "sglext" in resp:
            yield {"id": resp["id"], "choices": [], "sglext": resp["sglext"]}
        yield {"id": resp["id"], "choices": [], "usage": resp["usage"]}


def _serve(responses, server_info, delay_s=0.0, **attrs):
    handler = type(
        "H",
        (_Replay,),
        {
            "responses": responses,
            "server_info": server_info,
            "seen": [],
            "delay_s": delay_s,
            **{k: staticmethod(v) if callable(v) else v for k, v in attrs.items()},
        },
    )
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    return srv, handler, f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.fixture
def stub_servers(recorded):
    spec_rows = {
        "generate": [r["response"] for r in pick(recorded, "sglang-0.5.23+sglang_ext", "generate")],
        "openai": [r["response"] for r in pick(recorded, "sglang-0.5.23", "openai")],
    }
    base_rows = {
        "generate": [r["response"] for r in pick(recorded, "sglang-0.5.23-nospec", "generate")],
        "openai": [r["response"] for r in pick(recorded, "sglang-0.5.17", "openai")],
    }
    info = {
        "version": "0.5.23",
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "speculative_draft_model_path": "/models/drafter",
        "unrelated": 1,
    }
    s1, h1, u1 = _serve(spec_rows, info)
    s2, h2, u2 = _serve(base_rows, {"version": "0.5.23", "speculative_algorithm": None})
    yield (u1, h1), (u2, h2)
    for s in (s1, s2):
        s.shutdown()
        s.server_close()


@pytest.mark.parametrize("api", ["generate", "openai"])
@pytest.mark.parametrize("stream", [True, False])
def test_client_io_against_local_replay_server(stub_servers, tmp_path, capsys, api, stream):
    (url, h1), (burl, h2) = stub_servers
    out = tmp_path / "report.json"
    argv = [
        "--url",
        url,
        "--baseline-url",
        burl,
        "--api",
        api,
        "--num-requests",
        "6",
        "--concurrency",
        "3",
        "--warmup",
        "1",
        "--max-new-tokens",
        "64",
        "--out",
        str(out),
        "--no-progress",
        "--per-request",
    ]
    if not stream:
        argv.append("--no-stream")
    rc = b.main(argv)
    text = capsys.readouterr().out
    assert rc == 0, text
    # Warm-up + timed requests reached each server, with the right body.
    assert len(h1.seen) == 7 and len(h2.seen) == 7
    path, body = h1.seen[-1]
    assert path == ("/generate" if api == "generate" else "/v1/completions")
    assert body["stream"] is stream
    rep = json.loads(out.read_text())
    assert rep["server"]["speculative_num_steps"] == 3 and "unrelated" not in rep["server"]
    acc = rep["summary"]["acceptance"]
    assert acc["available"] and rep["summary"]["num_ok"] == 6
    assert len(acc["accept_per_position"]) == 3
    assert rep["baseline"]["summary"]["acceptance"]["available"] is False
    assert rep["comparison"]["speedup"] is not None and rep["comparison"]["eta"] is not None
    for r in rep["requests"]:
        assert (r["tpot_s"] is not None) is stream
        assert r["ttft_s"] is None or r["ttft_s"] <= r["latency_s"]
    assert "ACCEPT LENGTH (exact)" in text and "SPEEDUP" in text
    if api == "openai":
        assert acc["sources"] == ["sglang"]
    else:
        assert acc["sources"] == ["sglang_ext"]


def test_ttft_of_a_server_that_streams_token_ids(recorded, tmp_path):
    """bench_speed's servers run --skip-tokenizer-init: their chunks carry output_ids and no
    text, where SGLang's request function looks for the first token. The first token's time
    is taken from the first chunk that brings tokens, so a request's TTFT and TPOT exist:
    the decode time is what follows the first chunk (chunk_gap_s here)."""
    replayed = pick(recorded, "sglang-0.5.23+sglang_ext", "generate")
    rows = {"generate": [r["response"] for r in replayed]}
    srv, _, url = _serve(rows, {"version": "0.5.23"}, ids_only=True, chunk_gap_s=0.3)
    try:
        out = tmp_path / "r.json"
        argv = ["--url", url, "--num-requests", "2", "--concurrency", "1", "--warmup", "0",
                "--max-new-tokens", "64", "--out", str(out), "--no-progress",
                "--per-request"]  # fmt: skip
        assert b.main(argv) == 0
    finally:
        srv.shutdown()
        srv.server_close()
    for r in json.loads(out.read_text())["requests"]:
        assert r["ttft_s"] is not None and r["tpot_s"] is not None
        assert r["latency_s"] - r["ttft_s"] >= 0.29  # the gap after the first chunk
        assert r["ttft_s"] < 0.29


def test_carries_tokens():
    assert b.carries_tokens({"output_ids": [1]}) and b.carries_tokens({"text": "a"})
    assert b.carries_tokens({"choices": [{"text": "a"}]})
    assert b.carries_tokens({"choices": [{"delta": {"content": "a"}}]})
    assert b.carries_tokens([{"output_ids": [1]}])
    for empty in ({"output_ids": [], "meta_info": {}}, {"text": ""}, {"choices": []}, None, 3):
        assert not b.carries_tokens(empty)


def test_speedup_interval_at_concurrency_1_matches_the_printed_speedup(recorded, tmp_path, capsys):
    """The GPU bench test's premise, with the real client: at concurrency 1 the speedup from
    the per-request timings (the interval's point) is the printed one within 3 %, the gaps
    between requests being all that separates them. Replays delayed 40 ms / 80 ms."""
    rows = [r["response"] for r in pick(recorded, "sglang-0.5.23+sglang_ext", "generate")]
    spec, _, url = _serve({"generate": rows}, {"speculative_algorithm": "EAGLE3"}, 0.04)
    base, _, burl = _serve({"generate": rows}, {"speculative_algorithm": None}, 0.08)
    try:
        out = tmp_path / "r.json"
        common = ["--num-requests", "8", "--warmup", "0", "--no-progress", "--no-stream"]
        rc = b.main(["--url", url, "--baseline-url", burl, *common, "--out", str(out)])
    finally:
        for srv in (spec, base):
            srv.shutdown()
            srv.server_close()
    text = capsys.readouterr().out
    assert rc == 0, text
    cmp = json.loads(out.read_text())["comparison"]
    interval = cmp["speedup_interval"]
    assert (
        interval["pairs"] == 8 and interval["ci95"][0] <= interval["point"] <= interval["ci95"][1]
    )
    assert cmp["speedup"] == pytest.approx(interval["point"], rel=0.03)
    assert cmp["speedup"] == pytest.approx(2.0, rel=0.15)
    lo, hi = interval["ci95"]
    assert f"[{lo:.2f}, {hi:.2f}] (95 %, 8 prompts paired)" in text
    # At concurrency > 1 the latencies overlap: no interval is claimed.
    spec, _, url = _serve({"generate": rows}, {"speculative_algorithm": "EAGLE3"}, 0.0)
    try:
        out = tmp_path / "r2.json"  # the first run's report is never written over
        rc = b.main(["--url", url, "--baseline-url", url, *common, "--concurrency", "2",
                     "--out", str(out)])  # fmt: skip
    finally:
        spec.shutdown()
        spec.server_close()
    assert rc == 0 and "speedup_interval" not in json.loads(out.read_text())["comparison"]


def _drifting_pair(recorded, order):
    """The speedup `sglang-ext bench` prints for a 40 ms speculative and an 80 ms baseline
    replay on a machine that slows down 3x over the run (both servers alike, the way a
    clock or a busy neighbour moves a node), and the order the requests arrived in."""
    rows = [r["response"] for r in pick(recorded, "sglang-0.5.23+sglang_ext", "generate")]
    t0, arrivals = time.monotonic(), []

    def slowdown():  # 1x at the start, 3x after ~1.5 s (the run takes ~1.6 s unslowed)
        return 1.0 + min(2.0, (time.monotonic() - t0) / 0.75)

    common = {"slowdown": slowdown, "arrivals": arrivals}
    info = {"speculative_algorithm": "EAGLE3"}
    spec, _, url = _serve({"generate": rows}, info, 0.02, name="spec", **common)
    base, _, burl = _serve({"generate": rows}, {}, 0.04, name="base", **common)
    try:
        argv = ["--url", url, "--baseline-url", burl, "--num-requests", "12", "--warmup", "0",
                "--no-progress", "--no-stream", *(["--order", order] if order else [])]  # fmt: skip
        assert b.main(argv) == 0
    finally:
        for srv in (spec, base):
            srv.shutdown()
            srv.server_close()
    return [name for name, _ in sorted(arrivals, key=lambda a: a[1])]


def test_paired_order_cancels_a_drifting_machine(recorded, capsys):
    """At concurrency 1 the bench alternates the servers prompt by prompt (ABBA); a machine
    that slows down over the run then moves both requests of a pair alike and the printed
    speedup stays at the servers' true 2x, where the phases order (every speculative request,
    then every baseline one) credits the drift to the speculative server. The eighth GPU run's
    bench timed the plugin 20 % slower than the suite's timing minutes around it."""
    paired = _drifting_pair(recorded, None)
    text = capsys.readouterr().out
    assert "order=paired" in text and "output tok/s (total / busy)" in text
    assert paired == ["spec", "base", "base", "spec"] * 6
    speedup = float(re.search(r"SPEEDUP \(tok/s\) ([0-9.]+)x", text).group(1))
    assert speedup == pytest.approx(2.0, rel=0.1), text  # ~1.93x: HTTP adds to both sides
    phases = _drifting_pair(recorded, "phases")
    text = capsys.readouterr().out
    assert phases == ["spec"] * 12 + ["base"] * 12 and "order=phases" in text
    assert "output tok/s (total / wall)" in text
    # ~3.0x here: the drift lands on the baseline's phase (and at least 20 % off, anywhere)
    assert float(re.search(r"SPEEDUP \(tok/s\) ([0-9.]+)x", text).group(1)) > 2.4, text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--order", "paired"], "--order paired needs --baseline-url"),
        (
            ["--order", "paired", "--baseline-url", "http://127.0.0.1:9", "--concurrency", "4"],
            "--order paired runs one request at a time; got --concurrency 4",
        ),
    ],
)
def test_order_errors_name_the_flag(argv, message, capsys):
    assert b.main(["--url", "http://127.0.0.1:9", *argv]) == 2
    assert message in capsys.readouterr().err


def test_client_io_failures_and_min_accept_length(stub_servers, tmp_path, capsys):
    (url, _), (burl, _) = stub_servers
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "FAIL"}\n{"prompt": "ok"}\n')
    rc = b.main(["--url", url, "--prompts", str(f), "--warmup", "0", "--no-progress"])
    cap = capsys.readouterr()
    assert rc == 1 and "HTTP 400" in cap.err
    # Baseline server has no acceptance -> requiring an accept length fails loudly.
    rc = b.main(["--url", burl, "--warmup", "0", "--no-progress", "--min-accept-length", "1.5"])
    cap = capsys.readouterr()
    assert rc == 1 and "ACCEPTANCE NOT REPORTED" in cap.out and "min-accept-length" in cap.err
    rc = b.main(["--url", url, "--warmup", "0", "--no-progress", "--min-accept-length", "1.5"])
    assert rc == 0


def test_plot_written(tmp_path, recorded):
    pytest.importorskip("matplotlib")
    res = _results(recorded, "sglang-0.5.23")
    p = tmp_path / "x.png"
    report.write_plot(str(p), report.summarize(res, 1.0), res)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ on SGLang's benchmark client


def test_requests_go_through_sglang_benchmark_client(stub_servers, tmp_path):
    """The bodies carry the defaults only SGLang's request functions add (``return_logprob``
    on /generate, ``best_of`` on /v1/completions), under the fields this bench sets."""
    (url, h1), _ = stub_servers
    for api in ("generate", "openai"):
        spec = b.RequestSpec(api=api, url=url, max_new_tokens=8, ignore_eos=True)
        results, _ = b.run_benchmark(spec, [b.Prompt(text="hi")], 1, progress=False)
        assert results[0].ok and results[0].acceptance.accept_length is not None
    (_, gen), (_, oai) = h1.seen[-2:]
    assert "return_logprob" in gen and gen["sampling_params"]["max_new_tokens"] == 8
    assert gen["sampling_params"]["ignore_eos"] is True and gen["text"] == "hi"
    assert oai["best_of"] == 1 and oai["return_spec_tokens_details"] is True


def test_import_is_cheap():
    """``sglang-ext --help`` must not pay for SGLang's benchmark (torch, transformers)."""
    import subprocess

    code = "import sys, sglang_ext.cli, sglang_ext.cli.bench; print(sorted(m for m in sys.modules "
    code += "if m.split('.')[0] in ('sglang', 'torch', 'transformers', 'aiohttp')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--out", "{prompts}"], "--out {prompts}: that is the --prompts file; not overwriting it"),
        (["--out", "{kept}"], "--out {kept}: exists; not overwriting it"),
        (["--plot", "{kept}"], "--plot {kept}: exists; not overwriting it"),
        (["--out", "{tmp}/r.json", "--plot", "{tmp}/r.json"],
         "--out and --plot name the same file {tmp}/r.json"),
        (["--out", "{tmp}/nodir/r.json"], "--out {tmp}/nodir/r.json: its folder {tmp}/nodir does "
         "not exist"),
    ],
)  # fmt: skip
def test_a_destination_is_refused_before_any_request(tmp_path, capsys, extra, message):
    """--out and --plot are checked before the server is even probed (the URL here serves
    nothing): a file is never written over, the prompts least of all, and a folder that is
    missing is named before the run instead of losing its results at the end."""
    if "--plot" in extra:
        pytest.importorskip("matplotlib")
    prompts, kept = tmp_path / "p.jsonl", tmp_path / "kept.json"
    prompts.write_text('{"prompt": "hi"}\n')
    kept.write_text("kept")
    names = {"prompts": prompts, "kept": kept, "tmp": tmp_path}
    argv = ["--url", f"http://127.0.0.1:{_free_port()}", "--prompts", str(prompts),
            "--no-progress", *(x.format(**names) for x in extra)]  # fmt: skip
    assert b.main(argv) == 2
    err = capsys.readouterr().err
    assert message.format(**names) in err and "not reachable" not in err, err
    assert prompts.read_text() == '{"prompt": "hi"}\n' and kept.read_text() == "kept"


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--timeout", "-1"), ("--timeout", "nan"), ("--timeout", "0"),
     ("--min-accept-length", "nan"), ("--min-accept-length", "-1"), ("--temperature", "inf"),
     ("--url", "http://127.0.0.1:1/a b"), ("--url", "http://127.0.0.1:1/\x07")],
)  # fmt: skip
def test_numbers_and_urls_that_cannot_be_meant_are_usage_errors(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        b.build_parser().parse_args([flag, value])
    assert e.value.code == 2 and flag in capsys.readouterr().err


def test_a_prompt_file_that_is_not_utf8_is_named(tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_bytes(b"\xff\xfe{}\n")
    assert b.main(["--prompts", str(f), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"prompt file {f}: expected UTF-8 JSONL, found byte 0xff at offset 0" in err
