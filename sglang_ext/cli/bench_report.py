"""What SGLang's serving benchmark lacks, for ``sglang-ext bench``: exact acceptance per
request, pooled per-position acceptance, the baseline comparison, printing, JSON report, plot.

Pure functions over parsed responses (no network); ``bench.py`` sends the requests.
Acceptance keys read: the ``spec_*`` keys added by ``sglang_ext.metrics.hook`` when the plugin is
loaded, else SGLang's own (0.5.17 and 0.5.23: ``spec_verify_ct``, ``spec_num_correct_drafts``
/ ``spec_accepted_drafts``, ``spec_num_proposed_drafts`` / ``spec_proposed_drafts``,
``spec_accept_length``, ``spec_accept_rate``, ``spec_correct_drafts_histogram`` /
``spec_accept_histogram``), in ``meta_info`` (``/generate``) or 0.5.23's
``sglext.spec_tokens_details`` (``/v1/completions``).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sglang_ext.metrics.acceptance import per_position_from_histogram as _per_position

REPORT_SCHEMA = "sglang_ext.bench/1"
# Below these, speculation is not paying for itself / the drafter is broken.
SUSPICIOUS_ACCEPT_LENGTH = 1.1
SUSPICIOUS_ACCEPT_RATE = 0.05
ACCEPT_LENGTH_HIST_EDGES = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)


# ------------------------------------------------- acceptance, per request (pure; SGLang lacks it)


def _first(d: Mapping[str, Any], *keys: str) -> Any:
    return next((d[k] for k in keys if d.get(k) is not None), None)


def per_position_from_histogram(
    histogram: Sequence[int], num_positions: int | None = None
) -> tuple[list[int], list[int]]:
    """accepted_i = steps that accepted more than i drafts; proposed_i = all steps
    (``sglang_ext.metrics.acceptance``' definition)."""
    return _per_position(histogram, num_positions or 0)


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
    info: Mapping[str, Any] | None, completion_tokens: int | None, num_positions: int | None = None
) -> Acceptance:
    """Acceptance from a meta_info dict (native) or ``spec_tokens_details`` dict (OpenAI,
    0.5.23). Prefers the ``sglang_ext`` keys, falls back to SGLang's own (0.5.17 aliases
    included); with only ``spec_verify_ct``, estimates accepted drafts as completion - 1 -
    verify (source ``sglang_estimated``)."""
    verify = int((info or {}).get("spec_verify_ct") or 0)
    if not verify:
        return Acceptance()
    out = Acceptance(verify_steps=verify)
    accepted = _first(
        info, "spec_accepted_draft_tokens", "spec_num_correct_drafts", "spec_accepted_drafts"
    )
    if "spec_accept_length_exact" in info:
        out.source = "sglang_ext"
    elif accepted is not None:
        out.source = "sglang"
    elif completion_tokens:
        accepted = max(int(completion_tokens) - 1 - verify, 0)
        out.source = "sglang_estimated"
    else:
        return out
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
    acc_pp, prop_pp = info.get("spec_accepted_per_position"), info.get("spec_proposed_per_position")
    hist = _first(info, "spec_correct_drafts_histogram", "spec_accept_histogram")
    if acc_pp is not None and prop_pp is not None and len(acc_pp) == len(prop_pp):
        out.accepted_per_position = [int(x) for x in acc_pp]
        out.proposed_per_position = [int(x) for x in prop_pp]
    elif hist:
        out.accepted_per_position, out.proposed_per_position = per_position_from_histogram(
            hist, num_positions
        )
    if out.accepted_per_position is not None:
        pairs = zip(out.accepted_per_position, out.proposed_per_position, strict=True)
        out.accept_per_position = [(a / p if p else None) for a, p in pairs]
    return out


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
    """A RequestResult from a response in normalised form: ``{"text", "meta_info"}`` for
    /generate, ``{"text", "usage", "spec_tokens_details", "finish_reason"}`` for
    /v1/completions (see ``normalise_openai``)."""
    meta = response.get("meta_info")
    if meta is not None:
        counts, spec_info = meta, meta
        fr = meta.get("finish_reason")
        finish = fr.get("type") if isinstance(fr, Mapping) else fr
    else:
        counts, finish = response.get("usage") or {}, response.get("finish_reason")
        spec_info = response.get("spec_tokens_details")
        if isinstance(spec_info, list):
            spec_info = spec_info[0] if spec_info else None
    completion, prompt_tokens = counts.get("completion_tokens"), counts.get("prompt_tokens")
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


# ----------------------------------------------------- summary, baseline comparison (pure)


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _pct(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s, k = sorted(xs), (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def accept_length_histogram(values: Sequence[float]) -> list[dict[str, Any]]:
    """Counts of per-request accept lengths in [edge_k, edge_k+1) bins (last bin open)."""
    edges = ACCEPT_LENGTH_HIST_EDGES
    counts = [0] * len(edges)
    for v in values:
        counts[max([0] + [j for j, e in enumerate(edges) if v >= e - 1e-9])] += 1
    his = [*edges[1:], None]
    return [{"lo": lo, "hi": hi, "count": c} for lo, hi, c in zip(edges, his, counts, strict=True)]


def summarize(
    results: Sequence[RequestResult], wall_s: float | None, time_basis: str = "wall"
) -> dict[str, Any]:
    """Aggregate figures of one run. Pooled acceptance = sums of counts, then ratios (the
    way SGLang's scheduler aggregates); the per-request mean is reported too. ``wall_s`` is
    the run's wall time (``time_basis`` "wall"), or in paired order the sum of this
    server's latencies ("busy": the other server's requests ran in between)."""
    ok = [r for r in results if r.ok]
    toks = sum(r.completion_tokens or 0 for r in ok)
    lat = [r.latency_s for r in ok if r.latency_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    with_acc = [r for r in ok if r.acceptance.accept_length is not None]
    acc = [r.acceptance for r in with_acc]
    verify = sum(a.verify_steps or 0 for a in acc)
    accepted = sum(a.accepted_draft_tokens or 0 for a in acc)
    known = [a for a in acc if a.proposed_draft_tokens]
    proposed = sum(a.proposed_draft_tokens for a in known)
    pp_acc: list[int] = []
    pp_prop: list[int] = []
    for a in acc:
        per_position = zip(
            a.accepted_per_position or (), a.proposed_per_position or (), strict=True
        )
        for k, (x, y) in enumerate(per_position):
            if k == len(pp_acc):
                pp_acc.append(0)
                pp_prop.append(0)
            pp_acc[k] += x
            pp_prop[k] += y
    lengths = [a.accept_length for a in acc]
    return {
        "num_requests": len(results),
        "num_ok": len(ok),
        "num_failed": len(results) - len(ok),
        "completion_tokens_total": toks,
        "wall_s": wall_s,
        "time_basis": time_basis,
        "output_tok_per_s": (toks / wall_s) if wall_s else None,
        "mean_request_tok_per_s": _mean([r.tok_per_s for r in ok if r.tok_per_s is not None]),
        "latency_s": {"mean": _mean(lat), **{f"p{q}": _pct(lat, q / 100) for q in (50, 90, 99)}},
        "ttft_s": {"mean": _mean(ttft), "p50": _pct(ttft, 0.5)},
        "tpot_s": {"mean": _mean(tpot), "p50": _pct(tpot, 0.5), "p90": _pct(tpot, 0.9)},
        "acceptance": {
            "available": bool(acc),
            "num_requests_with_acceptance": len(acc),
            "sources": sorted({a.source for a in acc if a.source}),
            "verify_steps": verify,
            "accepted_draft_tokens": accepted,
            "proposed_draft_tokens": proposed if known else None,
            "accept_length": ((accepted + verify) / verify) if verify else None,
            "sglang_accept_length": (
                sum(r.completion_tokens or 0 for r in with_acc) / verify if verify else None
            ),
            "mean_request_accept_length": _mean(lengths),
            "accept_rate": (
                sum(a.accepted_draft_tokens for a in known) / proposed if proposed else None
            ),
            "accept_per_position": [
                (a / p if p else None) for a, p in zip(pp_acc, pp_prop, strict=True)
            ]
            or None,
            "accepted_per_position": pp_acc or None,
            "proposed_per_position": pp_prop or None,
            "accept_length_histogram": accept_length_histogram(lengths) if lengths else None,
        },
    }


def compare(spec: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """speedup = spec output tok/s / baseline's; TPOT speedup = baseline mean TPOT / spec's;
    eta = speedup / accept length (the share of the ideal speedup the accept length allows,
    reached only if drafting and verifying cost nothing)."""
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


def bootstrap_interval(
    items: Sequence[Any], statistic: Callable[[Sequence[Any]], float], draws: int, seed: int
) -> tuple[float, float]:
    """95 % percentile interval of ``statistic`` over ``items`` resampled with replacement
    (``draws`` resamples, seeded: the same items give the same interval)."""
    rng = random.Random(seed)
    values = sorted(statistic([rng.choice(items) for _ in items]) for _ in range(draws))
    return values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


def speedup_interval(
    spec: Sequence[RequestResult],
    base: Sequence[RequestResult],
    draws: int = 2000,
    seed: int = 0,
) -> dict[str, Any] | None:
    """95 % interval of the speedup from the requests both servers answered, paired by prompt
    index: speedup = (spec tokens / spec latency) / (baseline tokens / baseline latency),
    summed over a bootstrap resample of the prompts. Meaningful at concurrency 1, where the
    latencies add up to the run's time; ``None`` with fewer than 4 pairs."""
    by_index = {r.index: r for r in base if r.ok and r.latency_s and r.completion_tokens}
    pairs = [
        (r.completion_tokens, r.latency_s, by_index[r.index].completion_tokens,
         by_index[r.index].latency_s)
        for r in spec
        if r.ok and r.latency_s and r.completion_tokens and r.index in by_index
    ]  # fmt: skip
    if len(pairs) < 4:
        return None

    def ratio(picks: Sequence[tuple[int, float, int, float]]) -> float:
        st, sl, bt, bl = (sum(p[k] for p in picks) for k in range(4))
        return (st / sl) / (bt / bl)

    lo, hi = bootstrap_interval(pairs, ratio, draws, seed)
    return {"point": ratio(pairs), "ci95": [lo, hi], "pairs": len(pairs), "draws": draws}


def output_agreement(spec: Sequence[RequestResult], base: Sequence[RequestResult]) -> dict:
    """Prompts that produced identical text on both servers (greedy decoding should, up to
    numerics; a large mismatch hints at a wrong target or broken verification)."""
    by_index = {r.index: r for r in base if r.ok and r.text is not None}
    pairs = [
        (r.text, by_index[r.index].text)
        for r in spec
        if r.ok and r.text is not None and r.index in by_index
    ]
    return {"compared": len(pairs), "identical": sum(a == b for a, b in pairs)}


def acceptance_warnings(summary: Mapping[str, Any], api: str) -> list[str]:
    """Loud messages for missing or broken acceptance."""
    acc = summary.get("acceptance") or {}
    if summary.get("num_ok", 0) == 0:
        return []
    if not acc.get("available"):
        hint = " SGLang 0.5.17 does not report acceptance on /v1/completions; use --api generate."
        return [
            "ACCEPTANCE NOT REPORTED by the server: cannot tell whether speculative decoding "
            "works (is it enabled? is this the speculative server?)."
            + (hint if api == "openai" else "")
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


# ------------------------------------------------------------------------- printing (pure)


def _f(x: Any, fmt: str = "{:.2f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000.0


def _pp(values: Sequence[float | None] | None, none: str = "-") -> str:
    return " ".join(_f(x) for x in values) if values else none


def _rows(rows: Sequence[tuple[str, str]], title: str) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join([f"== {title} ==", *(f"  {k.ljust(width)}  {v}" for k, v in rows)])


def format_summary(summary: Mapping[str, Any], title: str = "speculative") -> str:
    acc, lat = summary["acceptance"], summary["latency_s"]
    tpot = [_f(_ms(summary["tpot_s"][k])) for k in ("mean", "p50", "p90")]
    rows = [
        ("requests ok / failed", f"{summary['num_ok']} / {summary['num_failed']}"),
        ("completion tokens", str(summary["completion_tokens_total"])),
        (
            f"output tok/s (total / {summary.get('time_basis', 'wall')})",
            _f(summary["output_tok_per_s"], "{:.1f}"),
        ),
        ("mean per-request tok/s", _f(summary["mean_request_tok_per_s"], "{:.1f}")),
        (
            "latency s mean / p50 / p99",
            " / ".join(_f(lat[k], "{:.3f}") for k in ("mean", "p50", "p99")),
        ),
        ("TTFT ms mean", _f(_ms(summary["ttft_s"]["mean"]), "{:.1f}")),
        ("TPOT ms mean / p50 / p90", " / ".join(tpot)),
    ]
    if not acc["available"]:
        return _rows([*rows, ("ACCEPTANCE", "NOT REPORTED")], title)
    proposed = acc["proposed_draft_tokens"]
    rows += [
        ("ACCEPT LENGTH (exact)", _f(acc["accept_length"], "{:.3f}")),
        (
            "  = (accepted+verify)/verify",
            f"{acc['accepted_draft_tokens']} accepted drafts, {acc['verify_steps']} verify steps",
        ),
        (
            "sglang accept length",
            _f(acc["sglang_accept_length"], "{:.3f}")
            + "  (completion/verify; counts the prefill token)",
        ),
        (
            "ACCEPT RATE",
            _f(acc["accept_rate"], "{:.3f}") + (f"  ({proposed} proposed)" if proposed else ""),
        ),
        ("per-position acceptance", _pp(acc["accept_per_position"], "- (not reported)")),
        ("acceptance source", ",".join(acc["sources"])),
    ]
    return _rows(rows, title)


def format_requests_table(results: Sequence[RequestResult]) -> str:
    lines = [
        f"{'#':>4} {'tokens':>6} {'lat s':>7} {'TPOT ms':>8} {'tok/s':>7} {'acc len':>7} "
        f"{'sg len':>6} {'rate':>5}  per-position"
    ]
    for r in results:
        a = r.acceptance
        lines.append(
            f"{r.index:>4} FAILED: {r.error}"
            if not r.ok
            else f"{r.index:>4} {_f(r.completion_tokens, '{}'):>6} {_f(r.latency_s, '{:.3f}'):>7} "
            f"{_f(_ms(r.tpot_s)):>8} {_f(r.tok_per_s, '{:.1f}'):>7} {_f(a.accept_length):>7} "
            f"{_f(a.sglang_accept_length):>6} {_f(a.accept_rate):>5}  {_pp(a.accept_per_position)}"
        )
    return "\n".join(lines)


def format_comparison(spec: Mapping[str, Any], base: Mapping[str, Any], cmp: Mapping) -> str:
    def both(key: str, fmt: str, get=lambda s, k: s[k]) -> tuple[str, str]:
        return _f(get(spec, key), fmt), _f(get(base, key), fmt)

    rows = [
        ("", "speculative", "baseline"),
        ("output tok/s", *both("output_tok_per_s", "{:.1f}")),
        ("mean per-request tok/s", *both("mean_request_tok_per_s", "{:.1f}")),
        ("TPOT ms mean", *both("tpot_s", "{:.2f}", lambda s, k: _ms(s[k]["mean"]))),
        ("accept length (exact)", _f(spec["acceptance"]["accept_length"], "{:.3f}"), "1 (none)"),
        ("accept rate", _f(spec["acceptance"]["accept_rate"], "{:.3f}"), "-"),
    ]
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    return "\n".join(
        [
            "== speculative vs baseline ==",
            *(f"  {a.ljust(w0)}  {b.rjust(w1)}  {c}" for a, b, c in rows),
            f"  SPEEDUP (tok/s) {_f(cmp['speedup'], '{:.2f}x')}{_interval(cmp)}   TPOT speedup "
            f"{_f(cmp['tpot_speedup'], '{:.2f}x')}   eta = speedup / accept length = "
            f"{_f(cmp['eta'])}",
        ]
    )


def _interval(cmp: Mapping[str, Any]) -> str:
    ci = cmp.get("speedup_interval")
    if not ci:
        return ""
    lo, hi = ci["ci95"]
    return f" [{lo:.2f}, {hi:.2f}] (95 %, {ci['pairs']} prompts paired)"


def banner(messages: Sequence[str]) -> str:
    bar = "!" * 78
    return "\n".join([bar, *(f"!!! {m}" for m in messages), bar]) if messages else ""


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
    return {k: v for k, v in asdict(r).items() if k != "text"}


def write_plot(path: str, summary: Mapping[str, Any], results: Sequence[RequestResult]) -> None:
    """Per-position acceptance bars + histogram of per-request exact accept lengths."""
    import matplotlib  # lazy, optional

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = summary["acceptance"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    pp = acc.get("accept_per_position") or []
    axes[0].bar(range(len(pp)), [x or 0.0 for x in pp], color="tab:blue")
    axes[0].set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1))
    al = acc.get("accept_length")
    axes[0].set_title("per-position acceptance" + (f" (accept length {al:.2f})" if al else ""))
    lens = [r.acceptance.accept_length for r in results if r.ok and r.acceptance.accept_length]
    axes[1].hist(lens or [0], bins=20, color="tab:orange")
    axes[1].set(xlabel="accept length per request (exact)", ylabel="requests")
    axes[1].set_title("accept length histogram")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
