"""``sglang-ext bench``: SGLang's serving benchmark plus what it lacks: exact accept length,
per-position acceptance, a no-speculation baseline comparison, a plot, and loud warnings.

Requests go through SGLang's own benchmark client (``sglang.benchmark.serving``, the module
behind ``python -m sglang.bench_serving``; same API in 0.5.17 and 0.5.23): its request
functions ``async_request_sglang_generate`` (native ``/generate``, ``--api generate``) and
``async_request_openai_completions`` (``/v1/completions``, ``--api openai``), its
``RequestFuncInput``/``RequestFuncOutput``, its timing (TTFT, latency). SGLang keeps only
``spec_accept_length`` per request; this module keeps the whole response (see
``_TeeSession``) and reads from it:

- ``/generate`` ``meta_info``: the ``spec_*`` keys added by ``sglang_ext.metrics.hook`` when the
  plugin is loaded, else SGLang's own (``spec_verify_ct``, ``spec_num_correct_drafts`` /
  ``spec_accepted_drafts``, ``spec_num_proposed_drafts`` / ``spec_proposed_drafts``,
  ``spec_accept_length``, ``spec_correct_drafts_histogram`` / ``spec_accept_histogram``);
- ``/v1/completions`` with ``return_spec_tokens_details: true``: 0.5.23's
  ``sglext.spec_tokens_details``; 0.5.17 reports no acceptance there (the bench says so).

TPOT = (latency - TTFT) / (completion_tokens - 1), streaming only. Importing this module is
cheap: SGLang's benchmark (torch, transformers) is imported when a run starts.

Exit codes (README "Exit codes"): 0 ok; 1 some requests failed, or ``--min-accept-length``
not met (or acceptance not reported while it was required); 2 usage error / server
unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import json
import math
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sglang_ext.cli import exit_codes
from sglang_ext.cli.arg_types import int_at_least, positive_int
from sglang_ext.cli.bench_report import (
    RequestResult,
    _result_json,
    acceptance_warnings,
    banner,
    build_report,
    compare,
    format_comparison,
    format_requests_table,
    format_summary,
    make_result,
    output_agreement,
    speedup_interval,
    summarize,
    write_plot,
)

DEFAULT_URL = "http://127.0.0.1:30000"
SERVER_INFO_KEYS = (
    "version", "model_path", "served_model_name", "speculative_algorithm",
    "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
    "speculative_num_draft_tokens", "enable_metrics",
)  # fmt: skip


class BenchError(exit_codes.UsageError):
    """A user-facing error (bad prompt file, unreachable server...): exit 2."""


# ---------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class Prompt:
    text: str | None = None
    input_ids: tuple[int, ...] | None = None

    def describe(self, width: int = 40) -> str:
        if self.text is not None:
            s = self.text.replace("\n", " ")
            return s if len(s) <= width else s[: width - 3] + "..."
        return f"<{len(self.input_ids or ())} input ids>"


def parse_prompt_lines(lines: Iterable[str], source: str = "<prompts>") -> list[Prompt]:
    """JSONL, each line ``{"prompt": "..."}`` or ``{"input_ids": [...]}``; blank lines are
    skipped, anything else raises BenchError naming source and line."""
    prompts: list[Prompt] = []
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise BenchError(f"{where}: invalid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise BenchError(f"{where}: expected a JSON object")
        if ("prompt" in obj) == ("input_ids" in obj):
            raise BenchError(f"{where}: need exactly one of 'prompt' or 'input_ids'")
        if "prompt" in obj:
            if not isinstance(obj["prompt"], str) or not obj["prompt"]:
                raise BenchError(f"{where}: 'prompt' must be a non-empty string")
            prompts.append(Prompt(text=obj["prompt"]))
            continue
        ids = obj["input_ids"]
        if not isinstance(ids, list) or not ids or not all(type(x) is int and x >= 0 for x in ids):
            raise BenchError(f"{where}: 'input_ids' must be a non-empty list of ints >= 0")
        prompts.append(Prompt(input_ids=tuple(ids)))
    if not prompts:
        raise BenchError(f"{source}: no prompts")
    return prompts


def load_prompts(path: str | None) -> tuple[list[Prompt], str]:
    """Prompts from a JSONL file, or the bundled held-out set. Returns (prompts, source)."""
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise BenchError(f"cannot read prompt file {path}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise BenchError(
                f"prompt file {path}: expected UTF-8 JSONL, found byte {e.object[e.start]:#04x} "
                f"at offset {e.start}"
            ) from None
        return parse_prompt_lines(text.splitlines(), path), path
    bundled = Path(__file__).parents[1] / "data" / "heldout_prompts.jsonl"  # sglang_ext/data
    lines = bundled.read_text(encoding="utf-8").splitlines()
    return parse_prompt_lines(lines, str(bundled)), "bundled:sglang_ext/data/heldout_prompts.jsonl"


def select_prompts(prompts: Sequence[Prompt], n: int | None) -> list[Prompt]:
    """The first ``n`` prompts, cycling when ``n`` exceeds the set (all when None)."""
    return list(prompts) if n is None else [prompts[k % len(prompts)] for k in range(n)]


# ------------------------------------------------- requests, through SGLang's benchmark client


@dataclass
class RequestSpec:
    api: str  # "generate" | "openai"
    url: str
    max_new_tokens: int
    temperature: float = 0.0
    ignore_eos: bool = False
    stream: bool = True
    model: str | None = None
    timeout: float = 600.0


def build_body(spec: RequestSpec, prompt: Prompt) -> tuple[str, dict[str, Any]]:
    """(endpoint URL, the JSON fields this bench sets); SGLang's request function adds its
    defaults under them (``extra_request_body``)."""
    base = spec.url.rstrip("/")
    ids = list(prompt.input_ids) if prompt.input_ids is not None else None
    if spec.api == "generate":
        sampling = {
            "temperature": spec.temperature,
            "max_new_tokens": spec.max_new_tokens,
            "ignore_eos": spec.ignore_eos,
        }
        body = {"input_ids": ids} if ids else {"text": prompt.text}
        return base + "/generate", {**body, "sampling_params": sampling, "stream": spec.stream}
    body = {
        "prompt": ids if ids else prompt.text,
        "max_tokens": spec.max_new_tokens,
        "temperature": spec.temperature,
        "stream": spec.stream,
        "ignore_eos": spec.ignore_eos,
        "return_spec_tokens_details": True,
    }
    if spec.stream:
        body["stream_options"] = {"include_usage": True}
    if spec.model:
        body["model"] = spec.model
    return base + "/v1/completions", body


def normalise_openai(obj: Mapping[str, Any], acc: dict[str, Any]) -> None:
    """Fold one /v1/completions response (or stream chunk) into ``acc``
    (keys: text, usage, spec_tokens_details, finish_reason)."""
    for ch in obj.get("choices") or ():
        acc["text"] = acc.get("text", "") + (ch.get("text") or "")
        if ch.get("finish_reason"):
            acc["finish_reason"] = ch["finish_reason"]
    if obj.get("usage"):
        acc["usage"] = obj["usage"]
    details = (obj.get("sglext") or {}).get("spec_tokens_details")
    if details is not None:
        acc["spec_tokens_details"] = details


def _parse_body_line(line: bytes) -> Any:
    """The JSON object of one response line (SSE ``data:`` or a whole body), else None."""
    line = line.strip()
    line = line[5:].strip() if line.startswith(b"data:") else line
    try:
        return json.loads(line) if line.startswith((b"{", b"[")) else None
    except ValueError:
        return None


def carries_tokens(obj: Any) -> bool:
    """Whether a response object (a stream chunk) brings output tokens: ``text`` or, from a
    server started with ``--skip-tokenizer-init``, ``output_ids`` (/generate), or a choice's
    text or delta (/v1/completions)."""
    if isinstance(obj, list):
        return any(carries_tokens(o) for o in obj)
    if not isinstance(obj, dict):
        return False
    if obj.get("text") or obj.get("output_ids"):
        return True
    for choice in obj.get("choices") or []:
        if isinstance(choice, dict) and (
            choice.get("text") or (choice.get("delta") or {}).get("content")
        ):
            return True
    return False


@dataclass
class _Capture:
    status: int | None = None
    objects: list[Any] = field(default_factory=list)
    # perf_counter() when the request was sent and when the first chunk with tokens came:
    # SGLang's request function times the first token only from a chunk's "text", which a
    # --skip-tokenizer-init server (bench_speed's) never sends
    sent_at: float | None = None
    first_token_at: float | None = None

    @property
    def ttft(self) -> float | None:
        if self.sent_at is None or self.first_token_at is None:
            return None
        return self.first_token_at - self.sent_at


_CAPTURE: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar(
    "sglang_ext_bench_capture", default=None
)


class _TeeSession:
    """SGLang's request functions keep ``spec_accept_length`` of a response and drop the
    rest. This session (handed to them in place of ``serving._create_bench_client_session()``'s)
    records every JSON line of each response into the running request's ``_Capture``, and
    hides from SGLang's parser the OpenAI chunks with ``choices: []`` (the ``sglext`` and usage
    chunks, which it would index as ``choices[0]``)."""

    def __init__(self, session: Any, capture: _Capture):
        self._session, self._capture = session, capture

    async def __aenter__(self) -> _TeeSession:
        await self._session.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._session.__aexit__(*exc)

    @contextlib.asynccontextmanager
    async def post(self, **kwargs: Any):
        async with self._session.post(**kwargs) as response:
            self._capture.status = response.status
            yield _TeeResponse(response, self._capture)


class _TeeResponse:
    def __init__(self, response: Any, capture: _Capture):
        self._response, self._capture = response, capture
        self.status, self.reason = response.status, response.reason

    async def text(self) -> str:
        return await self._response.text()

    @property
    def content(self):
        return self._lines()

    async def _lines(self):
        async for line in self._response.content:
            obj = _parse_body_line(line)
            if obj is not None:
                self._capture.objects.append(obj)
                if self._capture.first_token_at is None and carries_tokens(obj):
                    self._capture.first_token_at = time.perf_counter()
            if not (isinstance(obj, dict) and obj.get("choices") == []):
                yield line


def _sglang_serving(spec: RequestSpec):
    """SGLang's benchmark module, its globals set from ``spec`` (lazy import: torch)."""
    from sglang.benchmark import serving

    serving.set_global_args(
        argparse.Namespace(
            disable_stream=not spec.stream,
            disable_ignore_eos=not spec.ignore_eos,
            temperature=spec.temperature,
            top_p=1.0,
            return_logprob=False,
            return_routed_experts=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            token_ids_logprob=None,
            header=None,
            cache_report=False,
        )
    )
    return serving


async def _request(serving, spec: RequestSpec, prompt: Prompt, index: int, npos: int | None):
    """One request through SGLang's request function; errors are captured, not raised."""
    url, body = build_body(spec, prompt)
    func = serving.ASYNC_REQUEST_FUNCS["sglang" if spec.api == "generate" else "sglang-oai"]
    # SGLang's function sets the prompt itself ("text" / "input_ids" by type, or "prompt").
    key = "prompt" if spec.api == "openai" else ("text" if "text" in body else "input_ids")
    request = serving.RequestFuncInput(
        prompt=body.pop(key), api_url=url, prompt_len=0, output_len=spec.max_new_tokens,
        model=spec.model or "", lora_name=None, image_data=None, extra_request_body=body,
    )  # fmt: skip
    capture = _Capture()
    token = _CAPTURE.set(capture)
    capture.sent_at = time.perf_counter()
    try:
        out = await asyncio.wait_for(func(request), spec.timeout)
    except TimeoutError:
        return RequestResult(index=index, ok=False, error=f"timed out after {spec.timeout} s")
    finally:
        _CAPTURE.reset(token)
    objs = capture.objects
    errors = [o["error"] for o in objs if isinstance(o, dict) and o.get("error")]
    if not out.success or errors:
        status = capture.status
        if status and status != 200:  # SGLang's error: "<reason>: <body>"
            error = f"HTTP {status} from {url}: {out.error.strip()[:500]}"
        elif errors:
            error = f"server error from {url}: {errors[0]}"
        else:  # SGLang's error: the traceback; its last line names the cause
            cause = (out.error.strip().splitlines() or ["?"])[-1]
            error = f"cannot complete request to {url}: {cause}"
        return RequestResult(index=index, ok=False, error=error)
    if spec.api == "generate":
        response = objs[-1] if objs else {}
        response = (response[0] if response else {}) if isinstance(response, list) else response
        if "meta_info" not in response:
            err = f"unexpected /generate response (no meta_info): {str(response)[:200]}"
            return RequestResult(index=index, ok=False, error=err)
    else:
        response = {}
        for o in objs:
            normalise_openai(o, response)
    ttft = (out.ttft or capture.ttft) if spec.stream else None
    return make_result(index, response, out.latency, ttft, npos)


class Progress:
    """tqdm if installed, else a plain stderr bar (a line per 10% when not a TTY)."""

    def __init__(self, total: int, desc: str, enabled=True, stream=None, use_tqdm=True):
        self.total, self.desc, self.n, self._last = total, desc, 0, -1
        self.stream, self.enabled = stream or sys.stderr, enabled and total > 0
        self._lock, self._tqdm = threading.Lock(), None
        if self.enabled and use_tqdm:
            with contextlib.suppress(ImportError):
                from tqdm import tqdm

                self._tqdm = tqdm(total=total, desc=desc, file=self.stream, leave=True)

    def update(self, extra: str = "") -> None:
        if not self.enabled:
            return
        with self._lock:
            self.n += 1
            if self._tqdm is not None:
                self._tqdm.update(1)
                if extra:
                    self._tqdm.set_postfix_str(extra, refresh=False)
                return
            tty = getattr(self.stream, "isatty", lambda: False)()
            if tty:
                filled = int(30 * self.n / self.total)
                bar = f"[{'#' * filled}{'.' * (30 - filled)}]"
                end = "\n" if self.n == self.total else ""
                self.stream.write(f"\r{self.desc} {bar} {self.n}/{self.total} {extra}{end}")
            elif (decile := 10 * self.n // self.total) != self._last or self.n == self.total:
                self._last = decile
                self.stream.write(f"{self.desc}: {self.n}/{self.total} {extra}\n")
            self.stream.flush()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()


def _acceptance_note(r: RequestResult) -> str:
    """The progress bar's note for a finished request: its accept length, if any."""
    al = r.acceptance.accept_length if r.ok else None
    return "" if al is None else f"acc_len={al:.2f}"


@contextlib.contextmanager
def _tee_sessions(serving):
    """SGLang's client sessions, each wrapped in a _TeeSession while a request runs."""
    make_session = serving._create_bench_client_session

    def session():  # the running request's capture, else SGLang's own session
        capture = _CAPTURE.get()
        return make_session() if capture is None else _TeeSession(make_session(), capture)

    serving._create_bench_client_session = session
    try:
        yield
    finally:
        serving._create_bench_client_session = make_session


async def _run(spec, prompts, concurrency, warmup, progress, desc, npos):
    serving = _sglang_serving(spec)
    with _tee_sessions(serving):
        for k in range(warmup):
            await _request(serving, spec, prompts[k % len(prompts)], -1 - k, npos)
        bar, limit = Progress(len(prompts), desc, enabled=progress), asyncio.Semaphore(concurrency)

        async def one(k: int, prompt: Prompt) -> RequestResult:
            async with limit:
                r = await _request(serving, spec, prompt, k, npos)
            bar.update(_acceptance_note(r))
            return r

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(k, p) for k, p in enumerate(prompts)))
        wall = time.perf_counter() - t0
        bar.close()
        return list(results), wall


def busy_seconds(results: Sequence[RequestResult]) -> float | None:
    """The seconds a server spent answering: the sum of its requests' latencies (in paired
    order the other server's requests fill the gaps between them)."""
    lat = [r.latency_s for r in results if r.ok and r.latency_s is not None]
    return sum(lat) if lat else None


async def _run_paired(spec, bspec, prompts, warmup, progress, npos):
    """Both servers, one request at a time, prompt by prompt: k even sends the prompt to the
    speculative server first, k odd to the baseline first (ABBA), so each pair's two
    requests run back to back and a machine that drifts over the run (clocks, neighbours)
    moves both sides of a pair alike."""
    serving = _sglang_serving(spec)
    with _tee_sessions(serving):
        for k in range(warmup):
            prompt = prompts[k % len(prompts)]
            await _request(serving, spec, prompt, -1 - k, npos)
            await _request(serving, bspec, prompt, -1 - k, None)
        bar = Progress(2 * len(prompts), "paired", enabled=progress)
        results: list[RequestResult] = []
        base_results: list[RequestResult] = []
        sides = ((spec, npos, results), (bspec, None, base_results))
        for k, prompt in enumerate(prompts):
            for side_spec, side_npos, sink in sides if k % 2 == 0 else sides[::-1]:
                r = await _request(serving, side_spec, prompt, k, side_npos)
                sink.append(r)
                bar.update(_acceptance_note(r))
        bar.close()
        return results, base_results


def run_benchmark(
    spec: RequestSpec,
    prompts: Sequence[Prompt],
    concurrency: int,
    warmup: int = 0,
    progress: bool = True,
    desc: str = "bench",
    num_positions: int | None = None,
) -> tuple[list[RequestResult], float]:
    """Warm up (sequential, discarded), then send all prompts, ``concurrency`` at a time.
    Returns (results in prompt order, wall seconds of the timed part)."""
    coro = _run(spec, prompts, max(1, concurrency), warmup, progress, desc, num_positions)
    with contextlib.redirect_stdout(sys.stderr):  # SGLang prints failed requests' tracebacks
        return asyncio.run(coro)


def run_paired_benchmark(
    spec: RequestSpec,
    baseline: RequestSpec,
    prompts: Sequence[Prompt],
    warmup: int = 0,
    progress: bool = True,
    num_positions: int | None = None,
) -> tuple[list[RequestResult], list[RequestResult]]:
    """Concurrency 1 against both servers in paired order (``_run_paired``); warm-up: each
    server ``warmup`` requests, discarded. Returns both servers' results in prompt order."""
    coro = _run_paired(spec, baseline, prompts, warmup, progress, num_positions)
    with contextlib.redirect_stdout(sys.stderr):
        return asyncio.run(coro)


def probe_server(url: str, timeout: float) -> dict[str, Any]:
    """Check ``/health``, read the speculative settings from ``/server_info``
    (``/get_server_info`` on older servers). Raises BenchError if unreachable."""
    base = url.rstrip("/")
    try:
        urllib.request.urlopen(base + "/health", timeout=timeout).close()
    except (urllib.error.URLError, OSError) as e:
        raise BenchError(
            f"server at {url} is not reachable or not healthy ({e}). Start it with "
            "`python -m sglang.launch_server ...` or pass the right --url."
        ) from None
    info: dict[str, Any] = {"url": url}
    for path in ("/server_info", "/get_server_info"):
        try:
            with urllib.request.urlopen(base + path, timeout=timeout) as resp:
                raw = json.loads(resp.read() or b"null")
        except (urllib.error.URLError, OSError, ValueError):
            continue
        if isinstance(raw, dict):
            return info | {k: raw[k] for k in SERVER_INFO_KEYS if k in raw}
    return info


# ---------------------------------------------------------------------------------------- CLI


def _finite_at_least(low: float, strict: bool = False):
    """An argparse type: a finite number >= ``low`` (> ``low`` where ``strict``)."""

    def parse(s: str) -> float:
        value = float(s)
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(
                f"expected a finite number {'>' if strict else '>='} {low:g}, got {s!r}"
            )
        return value

    return parse


def server_url(text: str) -> str:
    """A server base URL: http(s)://HOST[:PORT][/PREFIX] (argparse type: a usage error)."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a server URL: it holds whitespace or a control character"
        )
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a server URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a server URL; expected http://HOST:PORT, e.g. {DEFAULT_URL}"
        )
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sglang-ext bench",
        description="Throughput + speculative acceptance benchmark against a running SGLang "
        "server (native /generate or OpenAI /v1/completions), on SGLang's benchmark client.",
    )
    add = p.add_argument
    add("--url", type=server_url, default=DEFAULT_URL,
        help=f"server base URL (default {DEFAULT_URL})")  # fmt: skip
    add("--api", choices=("generate", "openai"), default="generate",
        help="native /generate (exact acceptance) or OpenAI /v1/completions")  # fmt: skip
    add("--model", default=None, help="model name for --api openai (optional)")
    add("--prompts", metavar="FILE.jsonl", help='JSONL, one {"prompt": ...} or '
        '{"input_ids": [...]} per line (default: bundled held-out set)')  # fmt: skip
    add("--num-requests", type=positive_int, help="timed requests (cycles the prompts)")
    add("--concurrency", type=positive_int, default=1, help="1 = single stream")
    add("--max-new-tokens", type=positive_int, default=256,
        help="tokens generated per request (default 256)")  # fmt: skip
    add("--temperature", type=_finite_at_least(0.0), default=0.0,
        help="sampling temperature (default 0: greedy)")  # fmt: skip
    add("--ignore-eos", action="store_true", help="generate exactly --max-new-tokens tokens")
    add("--warmup", type=int_at_least(0), default=2, metavar="K", help="untimed, per server")
    add("--no-stream", dest="stream", action="store_false", help="no TTFT/TPOT")
    add("--timeout", type=_finite_at_least(0.0, strict=True), default=600.0,
        help="per-request timeout, seconds")  # fmt: skip
    add("--baseline-url", type=server_url,
        help="no-speculation server to run the same prompts against")  # fmt: skip
    add("--order", choices=ORDERS, default=None,
        help="with --baseline-url: 'paired' alternates the servers prompt by prompt (the "
        "default at concurrency 1), 'phases' runs every prompt on one server, then on the "
        "other (the only order at concurrency > 1)")  # fmt: skip
    add("--out", metavar="REPORT.json", help="write a JSON report (never over an existing file)")
    add("--plot", metavar="FILE.png",
        help="acceptance per position + accept-length histogram (never over an existing file)")
    add("--per-request", action="store_true", help="print a per-request table")
    add("--no-progress", dest="progress", action="store_false", help="no progress display")
    add("--min-accept-length", type=_finite_at_least(0.0),
        help="exit 1 if the exact accept length is below")  # fmt: skip
    return p


ORDERS = ("paired", "phases")


def resolve_order(order: str | None, concurrency: int, baseline_url: str | None) -> str | None:
    """The request order of a run with a baseline (None without one): ``paired`` by default
    at concurrency 1, ``phases`` above it (pairs of one request each exist only at 1)."""
    if baseline_url is None:
        if order is not None:
            raise BenchError(f"--order {order} needs --baseline-url")
        return None
    if order == "paired" and concurrency > 1:
        raise BenchError(
            f"--order paired runs one request at a time; got --concurrency {concurrency} "
            "(use --order phases, or --concurrency 1)"
        )
    return order or ("paired" if concurrency == 1 else "phases")


def check_destinations(args: argparse.Namespace) -> None:
    """``--out`` and ``--plot`` are checked before any request: a file that exists is never
    written over (the prompt file least of all), the two must differ, and each one's folder
    must exist and be writable, so a run's results are not lost at its end."""
    named = [(flag, getattr(args, dest)) for flag, dest in (("--out", "out"), ("--plot", "plot"))]
    named = [(flag, Path(path)) for flag, path in named if path]
    if len(named) == 2 and named[0][1].resolve() == named[1][1].resolve():
        raise exit_codes.Refused(f"--out and --plot name the same file {named[0][1]}")
    for flag, path in named:
        if args.prompts and path.resolve() == Path(args.prompts).resolve():
            raise exit_codes.Refused(
                f"{flag} {path}: that is the --prompts file; not overwriting it"
            )
        if path.exists() or path.is_symlink():
            raise exit_codes.Refused(f"{flag} {path}: exists; not overwriting it")
        folder = path.parent
        if not folder.is_dir():
            raise exit_codes.UsageError(f"{flag} {path}: its folder {folder} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise exit_codes.UsageError(f"{flag} {path}: its folder {folder} is not writable")


def _write_new(flag: str, path: str, text: str) -> None:
    """Write a file that must not exist yet (created exclusively: never over another)."""
    try:
        with open(path, "x", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise exit_codes.UsageError(f"{flag} {path}: cannot write it ({e.strerror or e})") from None


def _num_positions(server: Mapping[str, Any] | None) -> int | None:
    v = (server or {}).get("speculative_num_steps")
    return v if isinstance(v, int) and v > 0 else None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = sys.stdout
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            error = exit_codes.UsageError("--plot needs matplotlib (pip install matplotlib)")
            return exit_codes.fail("bench", error)
    try:
        check_destinations(args)
        order = resolve_order(args.order, args.concurrency, args.baseline_url)
        prompts, source = load_prompts(args.prompts)
        prompts = select_prompts(prompts, args.num_requests)
        probe_timeout = min(args.timeout, 30.0)
        server = probe_server(args.url, probe_timeout)
        base_server = probe_server(args.baseline_url, probe_timeout) if args.baseline_url else None
    except exit_codes.UsageError as e:
        return exit_codes.fail("bench", e)
    if server.get("speculative_algorithm") in (None, "", "NONE") and "version" in server:
        print(f"note: {args.url} reports no speculative algorithm", file=sys.stderr)
    spec = RequestSpec(
        api=args.api,
        url=args.url,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        stream=args.stream,
        model=args.model,
        timeout=args.timeout,
    )
    run = (args.concurrency, args.warmup, args.progress)
    bspec = RequestSpec(**{**asdict(spec), "url": args.baseline_url}) if args.baseline_url else None
    if order == "paired":
        results, base_results = run_paired_benchmark(
            spec, bspec, prompts, args.warmup, args.progress, _num_positions(server)
        )
        wall, bwall = busy_seconds(results), busy_seconds(base_results)
    else:
        results, wall = run_benchmark(spec, prompts, *run, "speculative", _num_positions(server))
        if bspec is not None:
            base_results, bwall = run_benchmark(bspec, prompts, *run, "baseline")
    basis = "busy" if order == "paired" else "wall"
    summary = summarize(results, wall, basis)
    warnings = acceptance_warnings(summary, args.api)
    baseline = comparison = None
    if bspec is not None:
        bsum = summarize(base_results, bwall, basis)
        comparison = compare(summary, bsum)
        comparison["outputs"] = output_agreement(results, base_results)
        # Paired by prompt, the speedup's interval holds at concurrency 1 only (there the
        # requests' latencies make up the run's time).
        if args.concurrency == 1:
            comparison["speedup_interval"] = speedup_interval(results, base_results)
        baseline = {"server": base_server, "summary": bsum,
                    "requests": [_result_json(r) for r in base_results]}  # fmt: skip
    s = server.get
    print(
        f"server {args.url}  api={args.api}  prompts={source}  n={len(prompts)}  "
        f"concurrency={args.concurrency}  max_new_tokens={args.max_new_tokens}  "
        f"{f'order={order}  ' if order else ''}"
        f"spec={s('speculative_algorithm')} steps={s('speculative_num_steps')} "
        f"topk={s('speculative_eagle_topk')} draft_tokens={s('speculative_num_draft_tokens')}",
        file=out,
    )
    if args.per_request:
        print(format_requests_table(results), file=out)
    print(format_summary(summary, "speculative" if args.baseline_url else "results"), file=out)
    if baseline is not None:
        print(format_summary(baseline["summary"], "baseline"), file=out)
        print(format_comparison(summary, baseline["summary"], comparison), file=out)
        o = comparison["outputs"]
        print(f"  identical outputs: {o['identical']}/{o['compared']}", file=out)
    for r in results:
        if not r.ok:
            print(f"request {r.index} failed: {r.error}", file=sys.stderr)
    if warnings:
        print(banner(warnings), file=out)
    config = {k: v for k, v in vars(args).items() if k != "progress"}
    config |= {"prompt_source": source, "num_prompts": len(prompts), "order": order}
    if args.out:
        report = build_report(
            config=config,
            server=server,
            results=results,
            summary=summary,
            warnings=warnings,
            baseline=baseline,
            comparison=comparison,
        )
        try:
            _write_new("--out", args.out, json.dumps(report, indent=2) + "\n")
        except exit_codes.UsageError as e:
            return exit_codes.fail("bench", e)
        print(f"report written to {args.out}", file=out)
    if args.plot:
        try:
            write_plot(args.plot, summary, results)
        except OSError as e:
            return exit_codes.fail(
                "bench", exit_codes.UsageError(f"--plot {args.plot}: cannot write it ({e})")
            )
        print(f"plot written to {args.plot}", file=out)
    rc = 1 if summary["num_failed"] or (baseline and baseline["summary"]["num_failed"]) else 0
    al = summary["acceptance"]["accept_length"]
    if args.min_accept_length is not None and (al is None or al < args.min_accept_length):
        shown = al if al is None else round(al, 3)
        print(f"FAIL: accept length {shown} < --min-accept-length {args.min_accept_length}",
              file=sys.stderr)  # fmt: skip
        rc = 1
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
