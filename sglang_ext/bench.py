"""``sglang-ext bench``: throughput AND acceptance benchmark against a running SGLang server.

Prints, per run, tokens/s and TPOT next to the speculative accept length (two
definitions), accept rate and per-position acceptance, and shouts when acceptance is
missing or ~1.0 (speculation that accepts nothing is pure overhead).

Endpoints:

- native ``POST /generate`` (``--api generate``, default): ``text`` or ``input_ids``,
  ``sampling_params`` {temperature, max_new_tokens, ignore_eos}; acceptance from
  ``meta_info``: the ``spec_*`` keys added by ``sglang_ext.metrics`` when the plugin is
  loaded, else SGLang's own (0.5.17 and 0.5.23: ``spec_verify_ct``,
  ``spec_num_correct_drafts`` / ``spec_accepted_drafts``, ``spec_num_proposed_drafts`` /
  ``spec_proposed_drafts``, ``spec_accept_length``, ``spec_accept_rate``,
  ``spec_correct_drafts_histogram`` / ``spec_accept_histogram``).
- OpenAI ``POST /v1/completions`` (``--api openai``): sends
  ``return_spec_tokens_details: true``; SGLang 0.5.23 answers with
  ``sglext.spec_tokens_details`` (same ``spec_*`` names), 0.5.17 reports no acceptance on
  this endpoint (the bench says so loudly).

Streaming (default) gives TTFT and TPOT = (latency - TTFT) / (completion_tokens - 1);
with ``--no-stream`` TPOT is not measurable and is left empty.

Stdlib only (urllib + threads). ``tqdm`` is used for the progress bar if installed;
``matplotlib`` only for ``--plot``. Never imports sglang or torch.

Exit codes (README "Exit codes"): 0 ok; 1 some requests failed, or ``--min-accept-length``
not met (or acceptance not reported while it was required); 2 usage error / server
unreachable.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPORT_SCHEMA = "sglang_ext.bench/1"
DEFAULT_URL = "http://127.0.0.1:30000"
# Below these, speculation is not paying for itself / the drafter is broken.
SUSPICIOUS_ACCEPT_LENGTH = 1.1
SUSPICIOUS_ACCEPT_RATE = 0.05

_FALLBACK_PROMPTS = (
    "Explain the difference between a process and a thread in an operating system.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Summarize the causes of the French Revolution in five bullet points.",
    "What is speculative decoding in large language model inference?",
    "Translate into French: The weather is nice today, let's go for a walk.",
    "Write a short story about a robot who learns to paint.",
    "List ten uses of a paperclip other than holding paper.",
    "Describe how a hash table handles collisions.",
)


class BenchError(Exception):
    """A user-facing error (bad prompt file, unreachable server...)."""


# --------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------


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
    """Parse JSONL: each line ``{"prompt": "..."}`` or ``{"input_ids": [...]}``.

    Blank lines are skipped. Anything else raises BenchError naming source and line.
    """
    prompts: list[Prompt] = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise BenchError(f"{source}:{lineno}: invalid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise BenchError(f"{source}:{lineno}: expected a JSON object")
        has_p, has_ids = "prompt" in obj, "input_ids" in obj
        if has_p == has_ids:
            raise BenchError(f"{source}:{lineno}: need exactly one of 'prompt' or 'input_ids'")
        if has_p:
            if not isinstance(obj["prompt"], str) or not obj["prompt"]:
                raise BenchError(f"{source}:{lineno}: 'prompt' must be a non-empty string")
            prompts.append(Prompt(text=obj["prompt"]))
        else:
            ids = obj["input_ids"]
            if (
                not isinstance(ids, list)
                or not ids
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in ids)
            ):
                raise BenchError(
                    f"{source}:{lineno}: 'input_ids' must be a non-empty list of ints >= 0"
                )
            prompts.append(Prompt(input_ids=tuple(ids)))
    if not prompts:
        raise BenchError(f"{source}: no prompts")
    return prompts


def load_prompts(path: str | None) -> tuple[list[Prompt], str]:
    """Prompts from a JSONL file, or the bundled default set. Returns (prompts, source)."""
    if path:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise BenchError(f"cannot read prompt file {path}: {e.strerror or e}") from None
        return parse_prompt_lines(text.splitlines(), str(p)), str(p)
    bundled = Path(__file__).parent / "data" / "heldout_prompts.jsonl"
    if bundled.is_file():
        return (
            parse_prompt_lines(bundled.read_text(encoding="utf-8").splitlines(), str(bundled)),
            "bundled:sglang_ext/data/heldout_prompts.jsonl",
        )
    return [Prompt(text=t) for t in _FALLBACK_PROMPTS], "builtin"


def select_prompts(prompts: Sequence[Prompt], n: int | None) -> list[Prompt]:
    """The first ``n`` prompts, cycling when ``n`` exceeds the set (all when None)."""
    if n is None:
        return list(prompts)
    return [prompts[k % len(prompts)] for k in range(n)]


# --------------------------------------------------------------------------------------
# Acceptance extraction (pure)
# --------------------------------------------------------------------------------------


def _first(d: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        v = d.get(k)
        if v is not None:
            return v
    return None


def per_position_from_histogram(
    histogram: Sequence[int], num_positions: int | None = None
) -> tuple[list[int], list[int]]:
    """accepted_i = steps that accepted more than i drafts; proposed_i = all steps.

    Same definition as ``sglang_ext.metrics`` (kept here so the client imports no server
    code)."""
    n = max(num_positions or 0, len(histogram) - 1, 0)
    steps = sum(int(c) for c in histogram)
    accepted = [0] * n
    running = 0
    for pos in range(n - 1, -1, -1):
        if pos + 1 < len(histogram):
            running += int(histogram[pos + 1])
        accepted[pos] = running
    return accepted, [steps] * n


@dataclass
class Acceptance:
    source: str | None = None  # "sglang_ext", "sglang", "sglang_estimated" or None
    verify_steps: int | None = None
    accepted_draft_tokens: int | None = None
    proposed_draft_tokens: int | None = None
    accept_length: float | None = None  # (accepted + verify) / verify
    sglang_accept_length: float | None = None  # completion_tokens / verify
    accept_rate: float | None = None
    accepted_per_position: list[int] | None = None
    proposed_per_position: list[int] | None = None
    accept_per_position: list[float | None] | None = None


def extract_acceptance(
    info: Mapping[str, Any] | None,
    completion_tokens: int | None,
    num_positions: int | None = None,
) -> Acceptance:
    """Acceptance figures from a meta_info dict (native) or ``spec_tokens_details`` dict
    (OpenAI, SGLang 0.5.23). Prefers the ``sglang_ext`` keys, falls back to SGLang's own
    (0.5.17 aliases included); if only ``spec_verify_ct`` is there, estimates accepted
    drafts as completion - 1 - verify (source ``sglang_estimated``)."""
    if not info:
        return Acceptance()
    verify = info.get("spec_verify_ct")
    if not verify:
        return Acceptance()
    verify = int(verify)
    out = Acceptance(verify_steps=verify)
    accepted = _first(
        info,
        "spec_accepted_draft_tokens",  # sglang_ext
        "spec_num_correct_drafts",  # SGLang 0.5.17 / 0.5.23
        "spec_accepted_drafts",  # SGLang 0.5.17 backward-compat alias
    )
    if "spec_accept_length_exact" in info:
        out.source = "sglang_ext"
    elif accepted is not None:
        out.source = "sglang"
    elif completion_tokens:
        accepted = max(int(completion_tokens) - 1 - verify, 0)
        out.source = "sglang_estimated"
    else:
        return Acceptance(verify_steps=verify)
    out.accepted_draft_tokens = int(accepted)
    out.accept_length = (out.accepted_draft_tokens + verify) / verify
    proposed = _first(
        info, "spec_proposed_draft_tokens", "spec_num_proposed_drafts", "spec_proposed_drafts"
    )
    if proposed:
        out.proposed_draft_tokens = int(proposed)
        out.accept_rate = out.accepted_draft_tokens / out.proposed_draft_tokens
    elif info.get("spec_accept_rate") is not None:
        out.accept_rate = float(info["spec_accept_rate"])
    if info.get("spec_accept_length") is not None:
        out.sglang_accept_length = float(info["spec_accept_length"])
    elif completion_tokens is not None:
        out.sglang_accept_length = int(completion_tokens) / verify
    acc_pp = info.get("spec_accepted_per_position")
    prop_pp = info.get("spec_proposed_per_position")
    if acc_pp is not None and prop_pp is not None and len(acc_pp) == len(prop_pp):
        out.accepted_per_position = [int(x) for x in acc_pp]
        out.proposed_per_position = [int(x) for x in prop_pp]
    else:
        hist = _first(info, "spec_correct_drafts_histogram", "spec_accept_histogram")
        if hist:
            out.accepted_per_position, out.proposed_per_position = per_position_from_histogram(
                hist, num_positions
            )
    if out.accepted_per_position is not None:
        out.accept_per_position = [
            (a / p if p else None)
            for a, p in zip(out.accepted_per_position, out.proposed_per_position, strict=True)
        ]
    return out


# --------------------------------------------------------------------------------------
# Per-request result and summary (pure)
# --------------------------------------------------------------------------------------


@dataclass
class RequestResult:
    index: int
    ok: bool
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    tok_per_s: float | None = None
    finish_reason: str | None = None
    acceptance: Acceptance = field(default_factory=Acceptance)
    text: str | None = None


def make_result(
    index: int,
    response: Mapping[str, Any],
    latency_s: float,
    ttft_s: float | None,
    num_positions: int | None = None,
) -> RequestResult:
    """Build a RequestResult from a parsed response in normalised form: ``{"text",
    "meta_info"}`` for /generate, ``{"text", "usage", "spec_tokens_details",
    "finish_reason"}`` for /v1/completions."""
    meta = response.get("meta_info")
    usage = response.get("usage") or {}
    if meta is not None:
        completion = meta.get("completion_tokens")
        prompt_tokens = meta.get("prompt_tokens")
        fr = meta.get("finish_reason")
        finish = fr.get("type") if isinstance(fr, Mapping) else fr
        spec_info: Mapping[str, Any] | None = meta
    else:
        completion = usage.get("completion_tokens")
        prompt_tokens = usage.get("prompt_tokens")
        finish = response.get("finish_reason")
        spec_info = response.get("spec_tokens_details")
        if isinstance(spec_info, list):
            spec_info = spec_info[0] if spec_info else None
    completion = int(completion) if completion is not None else None
    tpot = None
    if ttft_s is not None and completion and completion > 1:
        tpot = max(latency_s - ttft_s, 0.0) / (completion - 1)
    return RequestResult(
        index=index,
        ok=True,
        prompt_tokens=int(prompt_tokens) if prompt_tokens is not None else None,
        completion_tokens=completion,
        latency_s=latency_s,
        ttft_s=ttft_s,
        tpot_s=tpot,
        tok_per_s=(completion / latency_s) if completion and latency_s > 0 else None,
        finish_reason=finish,
        acceptance=extract_acceptance(spec_info, completion, num_positions),
        text=response.get("text"),
    )


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _pct(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


ACCEPT_LENGTH_HIST_EDGES = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)


def accept_length_histogram(values: Sequence[float]) -> list[dict[str, Any]]:
    """Counts of per-request accept lengths in [edge_k, edge_k+1) bins (last bin open)."""
    edges = ACCEPT_LENGTH_HIST_EDGES
    counts = [0] * len(edges)
    for v in values:
        k = 0
        for j, e in enumerate(edges):
            if v >= e - 1e-9:
                k = j
        counts[k] += 1
    return [
        {"lo": edges[k], "hi": edges[k + 1] if k + 1 < len(edges) else None, "count": counts[k]}
        for k in range(len(edges))
    ]


def summarize(results: Sequence[RequestResult], wall_s: float | None) -> dict[str, Any]:
    """Aggregate figures of one run. Pooled acceptance = sums of counts, then ratios
    (the way SGLang's scheduler aggregates); per-request means are reported too."""
    ok = [r for r in results if r.ok]
    toks = [r.completion_tokens or 0 for r in ok]
    lat = [r.latency_s for r in ok if r.latency_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tps = [r.tok_per_s for r in ok if r.tok_per_s is not None]
    acc = [r.acceptance for r in ok if r.acceptance.accept_length is not None]
    sources = sorted({a.source for a in acc if a.source})
    verify = sum(a.verify_steps or 0 for a in acc)
    accepted = sum(a.accepted_draft_tokens or 0 for a in acc)
    proposed_known = [a for a in acc if a.proposed_draft_tokens]
    proposed = sum(a.proposed_draft_tokens for a in proposed_known)
    comp_acc = sum(r.completion_tokens or 0 for r in ok if r.acceptance.accept_length is not None)
    pp_acc: list[int] = []
    pp_prop: list[int] = []
    for a in acc:
        if a.accepted_per_position is None:
            continue
        n = len(a.accepted_per_position)
        if len(pp_acc) < n:
            pp_acc += [0] * (n - len(pp_acc))
            pp_prop += [0] * (n - len(pp_prop))
        for k in range(n):
            pp_acc[k] += a.accepted_per_position[k]
            pp_prop[k] += a.proposed_per_position[k]
    accept_lengths = [a.accept_length for a in acc]
    summary: dict[str, Any] = {
        "num_requests": len(results),
        "num_ok": len(ok),
        "num_failed": len(results) - len(ok),
        "completion_tokens_total": sum(toks),
        "wall_s": wall_s,
        "output_tok_per_s": (sum(toks) / wall_s) if wall_s else None,
        "mean_request_tok_per_s": _mean(tps),
        "latency_s": {
            "mean": _mean(lat),
            "p50": _pct(lat, 0.5),
            "p90": _pct(lat, 0.9),
            "p99": _pct(lat, 0.99),
        },
        "ttft_s": {"mean": _mean(ttft), "p50": _pct(ttft, 0.5)},
        "tpot_s": {"mean": _mean(tpot), "p50": _pct(tpot, 0.5), "p90": _pct(tpot, 0.9)},
        "acceptance": {
            "available": bool(acc),
            "num_requests_with_acceptance": len(acc),
            "sources": sources,
            "verify_steps": verify,
            "accepted_draft_tokens": accepted,
            "proposed_draft_tokens": proposed if proposed_known else None,
            "accept_length": ((accepted + verify) / verify) if verify else None,
            "sglang_accept_length": (comp_acc / verify) if verify else None,
            "mean_request_accept_length": _mean(accept_lengths),
            "accept_rate": (
                sum(a.accepted_draft_tokens for a in proposed_known) / proposed
                if proposed
                else None
            ),
            "accept_per_position": [
                (a / p if p else None) for a, p in zip(pp_acc, pp_prop, strict=True)
            ]
            or None,
            "accepted_per_position": pp_acc or None,
            "proposed_per_position": pp_prop or None,
            "accept_length_histogram": accept_length_histogram(accept_lengths)
            if accept_lengths
            else None,
        },
    }
    return summary


def compare(spec: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """Speedup = spec output tok/s / baseline output tok/s; TPOT speedup = baseline mean
    TPOT / spec mean TPOT; eta = speedup / accept length (fraction of the ideal speedup
    that the accept length would allow, which is reached only if drafting and verifying
    cost nothing)."""
    s_tps, b_tps = spec.get("output_tok_per_s"), base.get("output_tok_per_s")
    speedup = (s_tps / b_tps) if s_tps and b_tps else None
    s_tpot = (spec.get("tpot_s") or {}).get("mean")
    b_tpot = (base.get("tpot_s") or {}).get("mean")
    tpot_speedup = (b_tpot / s_tpot) if s_tpot and b_tpot else None
    al = (spec.get("acceptance") or {}).get("accept_length")
    return {
        "speedup": speedup,
        "tpot_speedup": tpot_speedup,
        "accept_length": al,
        "eta": (speedup / al) if speedup is not None and al else None,
        "eta_tpot": (tpot_speedup / al) if tpot_speedup is not None and al else None,
    }


def output_agreement(
    spec: Sequence[RequestResult], base: Sequence[RequestResult]
) -> dict[str, int]:
    """How many prompts produced identical text on both servers (greedy decoding should,
    up to numerics; a large mismatch hints at a wrong target or broken verification)."""
    same = total = 0
    by_index = {r.index: r for r in base if r.ok}
    for r in spec:
        b = by_index.get(r.index)
        if r.ok and b is not None and r.text is not None and b.text is not None:
            total += 1
            same += r.text == b.text
    return {"compared": total, "identical": same}


def acceptance_warnings(summary: Mapping[str, Any], api: str) -> list[str]:
    """Loud messages for missing or broken acceptance."""
    acc = summary.get("acceptance") or {}
    if summary.get("num_ok", 0) == 0:
        return []
    if not acc.get("available"):
        hint = (
            " SGLang 0.5.17 does not report acceptance on /v1/completions; use --api generate."
            if api == "openai"
            else ""
        )
        return [
            "ACCEPTANCE NOT REPORTED by the server: cannot tell whether speculative decoding "
            "works (is it enabled? is this the speculative server?)." + hint
        ]
    out = []
    al, ar = acc.get("accept_length"), acc.get("accept_rate")
    if al is not None and al < SUSPICIOUS_ACCEPT_LENGTH:
        out.append(
            f"ACCEPT LENGTH {al:.2f}: the drafter accepts (almost) nothing; speculation is pure "
            "overhead. Check drafter weights loading, aux hidden-state capture / fusion, aux "
            "layer ids, and that the drafter was trained for this target."
        )
    elif ar is not None and ar < SUSPICIOUS_ACCEPT_RATE:
        out.append(f"ACCEPT RATE {ar:.3f} is below {SUSPICIOUS_ACCEPT_RATE}: drafter suspicious.")
    if "sglang_estimated" in (acc.get("sources") or []):
        out.append("accepted drafts estimated from completion_tokens (server did not report them).")
    return out


# --------------------------------------------------------------------------------------
# Formatting (pure)
# --------------------------------------------------------------------------------------


def _f(x: Any, fmt: str = "{:.2f}", none: str = "-") -> str:
    if x is None:
        return none
    return fmt.format(x)


def format_summary(summary: Mapping[str, Any], title: str = "speculative") -> str:
    acc = summary["acceptance"]
    lat, tpot, ttft = summary["latency_s"], summary["tpot_s"], summary["ttft_s"]
    rows = [
        ("requests ok / failed", f"{summary['num_ok']} / {summary['num_failed']}"),
        ("completion tokens", str(summary["completion_tokens_total"])),
        ("output tok/s (total / wall)", _f(summary["output_tok_per_s"], "{:.1f}")),
        ("mean per-request tok/s", _f(summary["mean_request_tok_per_s"], "{:.1f}")),
        (
            "latency s mean / p50 / p99",
            f"{_f(lat['mean'], '{:.3f}')} / {_f(lat['p50'], '{:.3f}')} / "
            f"{_f(lat['p99'], '{:.3f}')}",
        ),
        ("TTFT ms mean", _f(_ms(ttft["mean"]), "{:.1f}")),
        (
            "TPOT ms mean / p50 / p90",
            f"{_f(_ms(tpot['mean']), '{:.2f}')} / {_f(_ms(tpot['p50']), '{:.2f}')} / "
            f"{_f(_ms(tpot['p90']), '{:.2f}')}",
        ),
    ]
    if acc["available"]:
        rows += [
            ("ACCEPT LENGTH (exact)", _f(acc["accept_length"], "{:.3f}")),
            (
                "  = (accepted+verify)/verify",
                f"{acc['accepted_draft_tokens']} accepted drafts, "
                f"{acc['verify_steps']} verify steps",
            ),
            (
                "sglang accept length",
                _f(acc["sglang_accept_length"], "{:.3f}")
                + "  (completion/verify; counts the prefill token)",
            ),
            (
                "ACCEPT RATE",
                _f(acc["accept_rate"], "{:.3f}")
                + (
                    f"  ({acc['proposed_draft_tokens']} proposed)"
                    if acc["proposed_draft_tokens"]
                    else ""
                ),
            ),
            (
                "per-position acceptance",
                " ".join(_f(x, "{:.2f}") for x in acc["accept_per_position"])
                if acc["accept_per_position"]
                else "- (not reported)",
            ),
            ("acceptance source", ",".join(acc["sources"])),
        ]
    else:
        rows.append(("ACCEPTANCE", "NOT REPORTED"))
    width = max(len(k) for k, _ in rows)
    lines = [f"== {title} =="]
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    return "\n".join(lines)


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000.0


def format_requests_table(results: Sequence[RequestResult]) -> str:
    head = (
        f"{'#':>4} {'tokens':>6} {'lat s':>7} {'TPOT ms':>8} {'tok/s':>7} {'acc len':>7} "
        f"{'sg len':>6} {'rate':>5}  per-position"
    )
    lines = [head]
    for r in results:
        if not r.ok:
            lines.append(f"{r.index:>4} FAILED: {r.error}")
            continue
        a = r.acceptance
        pp = (
            " ".join(_f(x, "{:.2f}") for x in a.accept_per_position)
            if a.accept_per_position
            else "-"
        )
        lines.append(
            f"{r.index:>4} {_f(r.completion_tokens, '{}'):>6} {_f(r.latency_s, '{:.3f}'):>7} "
            f"{_f(_ms(r.tpot_s), '{:.2f}'):>8} {_f(r.tok_per_s, '{:.1f}'):>7} "
            f"{_f(a.accept_length, '{:.2f}'):>7} {_f(a.sglang_accept_length, '{:.2f}'):>6} "
            f"{_f(a.accept_rate, '{:.2f}'):>5}  {pp}"
        )
    return "\n".join(lines)


def format_comparison(
    spec: Mapping[str, Any], base: Mapping[str, Any], cmp: Mapping[str, Any]
) -> str:
    rows = [
        ("", "speculative", "baseline"),
        (
            "output tok/s",
            _f(spec["output_tok_per_s"], "{:.1f}"),
            _f(base["output_tok_per_s"], "{:.1f}"),
        ),
        (
            "mean per-request tok/s",
            _f(spec["mean_request_tok_per_s"], "{:.1f}"),
            _f(base["mean_request_tok_per_s"], "{:.1f}"),
        ),
        (
            "TPOT ms mean",
            _f(_ms(spec["tpot_s"]["mean"]), "{:.2f}"),
            _f(_ms(base["tpot_s"]["mean"]), "{:.2f}"),
        ),
        ("accept length (exact)", _f(spec["acceptance"]["accept_length"], "{:.3f}"), "1 (none)"),
        ("accept rate", _f(spec["acceptance"]["accept_rate"], "{:.3f}"), "-"),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = ["== speculative vs baseline =="]
    lines += [f"  {a.ljust(w0)}  {b.rjust(w1)}  {c}" for a, b, c in rows]
    lines.append(
        f"  SPEEDUP (tok/s) {_f(cmp['speedup'], '{:.2f}x')}   TPOT speedup "
        f"{_f(cmp['tpot_speedup'], '{:.2f}x')}   eta = speedup / accept length = "
        f"{_f(cmp['eta'], '{:.2f}')}"
    )
    return "\n".join(lines)


def banner(messages: Sequence[str]) -> str:
    if not messages:
        return ""
    bar = "!" * 78
    return "\n".join([bar, *(f"!!! {m}" for m in messages), bar])


def build_report(
    *,
    config: Mapping[str, Any],
    server: Mapping[str, Any] | None,
    results: Sequence[RequestResult],
    summary: Mapping[str, Any],
    warnings: Sequence[str],
    baseline: Mapping[str, Any] | None = None,
    comparison: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "schema": REPORT_SCHEMA,
        "created_unix": round(time.time(), 3),
        "config": dict(config),
        "server": dict(server) if server else None,
        "summary": dict(summary),
        "requests": [_result_json(r) for r in results],
        "warnings": list(warnings),
        "baseline": dict(baseline) if baseline else None,
        "comparison": dict(comparison) if comparison else None,
    }


def _result_json(r: RequestResult) -> dict[str, Any]:
    d = asdict(r)
    d.pop("text", None)
    return d


# --------------------------------------------------------------------------------------
# HTTP client (I/O)
# --------------------------------------------------------------------------------------


class HttpError(Exception):
    pass


def _post(url: str, body: Mapping[str, Any], timeout: float):
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="POST"
    )
    return _open(req, timeout)


def _open(req: urllib.request.Request, timeout: float):
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        try:
            detail = e.read().decode("utf-8", "replace")[:500]
        except Exception:
            detail = ""
        raise HttpError(f"HTTP {e.code} from {req.full_url}: {detail}") from None
    except urllib.error.URLError as e:
        raise HttpError(f"cannot reach {req.full_url}: {e.reason}") from None
    except (TimeoutError, ConnectionError, OSError) as e:
        raise HttpError(f"cannot reach {req.full_url}: {e}") from None


def get_json(url: str, timeout: float) -> Any:
    with _open(urllib.request.Request(url, method="GET"), timeout) as resp:
        return json.loads(resp.read() or b"null")


SERVER_INFO_KEYS = (
    "version",
    "model_path",
    "served_model_name",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "enable_metrics",
)


def probe_server(url: str, timeout: float) -> dict[str, Any]:
    """Check the server answers (``/health``) and read its speculative settings from
    ``/server_info`` (``/get_server_info`` on older servers). Raises BenchError if
    unreachable."""
    base = url.rstrip("/")
    try:
        with _open(urllib.request.Request(base + "/health", method="GET"), timeout) as r:
            r.read()
    except HttpError as e:
        raise BenchError(
            f"server at {url} is not reachable or not healthy ({e}). Start it with "
            "`python -m sglang.launch_server ...` or pass the right --url."
        ) from None
    info: dict[str, Any] = {"url": url}
    for path in ("/server_info", "/get_server_info"):
        try:
            raw = get_json(base + path, timeout)
        except (HttpError, ValueError):
            continue
        if isinstance(raw, dict):
            for k in SERVER_INFO_KEYS:
                if k in raw:
                    info[k] = raw[k]
            break
    return info


def _iter_sse(resp) -> Iterable[tuple[float, Any]]:
    """Yield (arrival time, parsed JSON) for each ``data:`` line until ``[DONE]``."""
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        yield time.perf_counter(), json.loads(payload)


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
    """(endpoint URL, JSON body) for one request."""
    base = spec.url.rstrip("/")
    if spec.api == "generate":
        body: dict[str, Any] = {
            "sampling_params": {
                "temperature": spec.temperature,
                "max_new_tokens": spec.max_new_tokens,
                "ignore_eos": spec.ignore_eos,
            },
            "stream": spec.stream,
        }
        if prompt.input_ids is not None:
            body["input_ids"] = list(prompt.input_ids)
        else:
            body["text"] = prompt.text
        return base + "/generate", body
    body = {
        "prompt": list(prompt.input_ids) if prompt.input_ids is not None else prompt.text,
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
    sglext = obj.get("sglext") or {}
    if sglext.get("spec_tokens_details") is not None:
        acc["spec_tokens_details"] = sglext["spec_tokens_details"]


def run_one(spec: RequestSpec, prompt: Prompt, index: int, num_positions: int | None = None):
    """Send one request; returns a RequestResult (errors are captured, not raised)."""
    url, body = build_body(spec, prompt)
    t0 = time.perf_counter()
    ttft = None
    try:
        with _post(url, body, spec.timeout) as resp:
            if spec.stream:
                final: dict[str, Any] = {}
                for t, obj in _iter_sse(resp):
                    if isinstance(obj, dict) and obj.get("error"):
                        raise HttpError(f"server error: {obj['error']}")
                    if spec.api == "generate":
                        if ttft is None and (obj.get("text") or obj.get("output_ids")):
                            ttft = t - t0
                        final = obj
                    else:
                        if ttft is None and any(
                            (c.get("text") or "") for c in obj.get("choices") or ()
                        ):
                            ttft = t - t0
                        normalise_openai(obj, final)
                response = final
            else:
                raw = json.loads(resp.read())
                if spec.api == "generate":
                    response = raw[0] if isinstance(raw, list) else raw
                else:
                    response = {}
                    normalise_openai(raw, response)
        latency = time.perf_counter() - t0
        if spec.api == "generate" and "meta_info" not in response:
            raise HttpError(f"unexpected /generate response (no meta_info): {str(response)[:200]}")
        return make_result(index, response, latency, ttft, num_positions)
    except (HttpError, ValueError, OSError) as e:
        return RequestResult(index=index, ok=False, error=str(e), latency_s=None)


class Progress:
    """tqdm if installed, else a plain stderr bar (a line per 10% when not a TTY)."""

    def __init__(
        self, total: int, desc: str, enabled: bool = True, stream=None, use_tqdm: bool = True
    ):
        self.total, self.desc, self.n = total, desc, 0
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()
        self._tqdm = None
        self.enabled = enabled and total > 0
        self._last_decile = -1
        if self.enabled and use_tqdm:
            try:
                from tqdm import tqdm  # optional

                self._tqdm = tqdm(total=total, desc=desc, file=self.stream, leave=True)
            except Exception:
                self._tqdm = None

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
            frac = self.n / self.total
            if getattr(self.stream, "isatty", lambda: False)():
                filled = int(30 * frac)
                self.stream.write(
                    f"\r{self.desc} [{'#' * filled}{'.' * (30 - filled)}] "
                    f"{self.n}/{self.total} {extra}"
                )
                if self.n == self.total:
                    self.stream.write("\n")
            else:
                decile = int(frac * 10)
                if decile != self._last_decile or self.n == self.total:
                    self._last_decile = decile
                    self.stream.write(f"{self.desc}: {self.n}/{self.total} {extra}\n")
            self.stream.flush()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()


def run_benchmark(
    spec: RequestSpec,
    prompts: Sequence[Prompt],
    concurrency: int,
    warmup: int = 0,
    progress: bool = True,
    desc: str = "bench",
    num_positions: int | None = None,
    runner: Callable[..., RequestResult] = run_one,
) -> tuple[list[RequestResult], float]:
    """Warm up (sequential, discarded), then send all prompts with ``concurrency`` threads.
    Returns (results in prompt order, wall seconds of the timed part)."""
    for k in range(warmup):
        runner(spec, prompts[k % len(prompts)], -1 - k, num_positions)
    bar = Progress(len(prompts), desc, enabled=progress)
    results: list[RequestResult | None] = [None] * len(prompts)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futs = {pool.submit(runner, spec, p, k, num_positions): k for k, p in enumerate(prompts)}
        for fut in concurrent.futures.as_completed(futs):
            r = fut.result()
            results[futs[fut]] = r
            al = r.acceptance.accept_length if r.ok else None
            bar.update("" if al is None else f"acc_len={al:.2f}")
    wall = time.perf_counter() - t0
    bar.close()
    return [r for r in results if r is not None], wall


def write_plot(path: str, summary: Mapping[str, Any], results: Sequence[RequestResult]) -> None:
    import matplotlib  # lazy, optional

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = summary["acceptance"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    pp = acc.get("accept_per_position") or []
    axes[0].bar(range(len(pp)), [x or 0.0 for x in pp], color="tab:blue")
    axes[0].set_xlabel("draft position")
    axes[0].set_ylabel("acceptance rate")
    axes[0].set_ylim(0, 1)
    axes[0].set_title(
        "per-position acceptance"
        + (f" (accept length {acc['accept_length']:.2f})" if acc.get("accept_length") else "")
    )
    lens = [r.acceptance.accept_length for r in results if r.ok and r.acceptance.accept_length]
    axes[1].hist(lens or [0], bins=20, color="tab:orange")
    axes[1].set_xlabel("accept length per request (exact)")
    axes[1].set_ylabel("requests")
    axes[1].set_title("accept length histogram")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def _positive_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _nonneg_int(s: str) -> int:
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sglang-ext bench",
        description="Throughput + speculative acceptance benchmark against a running SGLang "
        "server (native /generate or OpenAI /v1/completions).",
    )
    p.add_argument("--url", default=DEFAULT_URL, help=f"server base URL (default {DEFAULT_URL})")
    p.add_argument("--api", choices=("generate", "openai"), default="generate")
    p.add_argument("--model", default=None, help="model name for --api openai (optional)")
    p.add_argument(
        "--prompts",
        default=None,
        metavar="FILE.jsonl",
        help='JSONL, one {"prompt": ...} or {"input_ids": [...]} per line '
        "(default: bundled held-out set)",
    )
    p.add_argument(
        "--num-requests",
        type=_positive_int,
        default=None,
        help="number of timed requests (cycles the prompts; default: all)",
    )
    p.add_argument(
        "--concurrency",
        type=_positive_int,
        default=1,
        help="concurrent requests (1 = single stream)",
    )
    p.add_argument("--max-new-tokens", type=_positive_int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument(
        "--ignore-eos", action="store_true", help="generate exactly --max-new-tokens tokens"
    )
    p.add_argument(
        "--warmup",
        type=_nonneg_int,
        default=2,
        metavar="K",
        help="untimed warm-up requests per server (default 2)",
    )
    p.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="non-streaming requests (no TTFT/TPOT)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    p.add_argument(
        "--baseline-url", default=None, help="no-speculation server to run the same prompts against"
    )
    p.add_argument("--out", default=None, metavar="REPORT.json", help="write a JSON report")
    p.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="per-position acceptance + accept-length histogram (needs matplotlib)",
    )
    p.add_argument("--per-request", action="store_true", help="print a per-request table")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument(
        "--min-accept-length",
        type=float,
        default=None,
        help="exit 1 if the exact accept length is below this (or not reported)",
    )
    return p


def _num_positions(server: Mapping[str, Any] | None) -> int | None:
    if not server:
        return None
    v = server.get("speculative_num_steps")
    return int(v) if isinstance(v, int) and v > 0 else None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = sys.stdout
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("error: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
    try:
        prompts, source = load_prompts(args.prompts)
        prompts = select_prompts(prompts, args.num_requests)
        server = probe_server(args.url, min(args.timeout, 30.0))
        base_server = (
            probe_server(args.baseline_url, min(args.timeout, 30.0)) if args.baseline_url else None
        )
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
    npos = _num_positions(server)
    results, wall = run_benchmark(
        spec, prompts, args.concurrency, args.warmup, args.progress, "speculative", npos
    )
    summary = summarize(results, wall)
    warnings = acceptance_warnings(summary, args.api)
    baseline = comparison = None
    base_results: list[RequestResult] = []
    if args.baseline_url:
        bspec = RequestSpec(**{**asdict(spec), "url": args.baseline_url})
        base_results, bwall = run_benchmark(
            bspec, prompts, args.concurrency, args.warmup, args.progress, "baseline"
        )
        bsum = summarize(base_results, bwall)
        comparison = compare(summary, bsum)
        comparison["outputs"] = output_agreement(results, base_results)
        baseline = {
            "server": base_server,
            "summary": bsum,
            "requests": [_result_json(r) for r in base_results],
        }
    # ---- print
    print(
        f"server {args.url}  api={args.api}  prompts={source}  n={len(prompts)}  "
        f"concurrency={args.concurrency}  max_new_tokens={args.max_new_tokens}  "
        f"spec={server.get('speculative_algorithm')} steps={server.get('speculative_num_steps')}"
        f" topk={server.get('speculative_eagle_topk')} "
        f"draft_tokens={server.get('speculative_num_draft_tokens')}",
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
    config = {k: v for k, v in vars(args).items() if k not in ("progress",)} | {
        "prompt_source": source,
        "num_prompts": len(prompts),
    }
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
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"report written to {args.out}", file=out)
    if args.plot:
        write_plot(args.plot, summary, results)
        print(f"plot written to {args.plot}", file=out)
    rc = 0
    if summary["num_failed"] or (baseline and baseline["summary"]["num_failed"]):
        rc = 1
    if args.min_accept_length is not None:
        al = summary["acceptance"]["accept_length"]
        if al is None or al < args.min_accept_length:
            print(
                f"FAIL: accept length {al if al is None else round(al, 3)} < "
                f"--min-accept-length {args.min_accept_length}",
                file=sys.stderr,
            )
            rc = 1
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
