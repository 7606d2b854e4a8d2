"""A server's decode time split into a cost per verify cycle and a cost per request.

A request's time after its first token is ``cycles x per_cycle + per_request`` (plus noise):
each verify cycle costs about the same, and whatever a request pays once after its first
token (a first decode step that is not a graph, a late draft prefill) is the intercept. A
least-squares line through each request's (verify cycles, decode seconds) gives both. Unlike
``tau x TPOT`` (variant_result's ``decode_cycle``), the slope does not move when a switch
changes the text and so the accept length, and it tells a per-cycle cost from a per-request
one: on 2026-12-06 the seed shape's 5/1/6 with SGLang's prefill graph was 0.917x its twin
after the first token, with a different tau; the fit put the whole gap in the cycle
(+1.33 ms of 10.66) and none in the request.

Two servers are compared on the prompts both finished: a bootstrap over prompts resamples
each prompt's requests (every round) of both servers together, and refits both lines.

Each request's verify count is bench_speed's ``verify_steps`` (per request, since
2026-12-06), or, for an earlier file, the server's acceptance records (``sglang-ext``'s
JSONL, one record a request in completion order) aligned to its timed rounds: the last
records, one round after another, each round's sums checked against the measurement's own
``verify`` and ``tokens`` before a count is used.

    python -m sglang_ext_tools.cycle_fit --bench B.json [--acceptance LOGS.tgz] [--out F.json]

prints every speculative server's line at batch 1: its per-cycle cost with an interval over
prompts, also in decode steps of the no-speculation TPOT its row was read against.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_ext_tools.bench_shape import bench_shape
from sglang_ext_tools.stats import bootstrap_ci

Point = tuple[float, float]  # (verify cycles, decode seconds) of one request


class AlignmentError(ValueError):
    """Acceptance records that do not match a server's timed measurements."""


def fit(points: Sequence[Point]) -> tuple[float, float] | None:
    """Least-squares (seconds per cycle, seconds per request); None when the cycle counts do
    not vary (one count fits no slope) or there are fewer than two points."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def server_points(
    measurements: Sequence[Mapping[str, Any]], server: str, rounds: Sequence[int] | None = None
) -> dict[int, list[Point]]:
    """{prompt position: [(cycles, decode s) of each round]} of one server's batch-1
    measurements that carry ``verify_steps`` (failed requests left out)."""
    out: dict[int, list[Point]] = {}
    for m in measurements:
        if m.get("server") != server or m.get("batch") != 1 or m.get("status") != "ok":
            continue
        if rounds is not None and m.get("round") not in rounds:
            continue
        verify = m.get("verify_steps")
        if not verify:
            continue
        for i, (v, d) in enumerate(zip(verify, m.get("decode_s") or [], strict=False)):
            if v and d is not None:
                out.setdefault(i, []).append((float(v), float(d)))
    return out


def attach_verify(
    measurements: Sequence[Mapping[str, Any]], server: str, records: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The server's measurements with ``verify_steps`` taken from its acceptance records.

    The server ran its timed rounds one after another, each request after the last (batch 1),
    so its last records are those rounds' requests in order. Refused (AlignmentError, naming
    the round and both sums) unless every round's records add up to the measurement's own
    verify count and tokens; a server measured at a larger batch too is refused outright."""
    own = sorted(
        (m for m in measurements if m.get("server") == server), key=lambda m: m.get("round", 0)
    )
    if any(m.get("batch") != 1 for m in own):
        raise AlignmentError(
            f"{server}: measured at batch > 1 as well; its requests' records interleave, so "
            "they cannot be aligned (bench_speed records verify_steps per request itself)"
        )
    timed = [m for m in own if m.get("status") == "ok"]
    need = sum(len(m.get("decode_s") or []) for m in timed)
    if len(records) < need:
        raise AlignmentError(
            f"{server}: {len(records)} acceptance records, {need} timed requests expected"
        )
    tail = list(records[len(records) - need :])
    out = []
    for m in timed:
        n = len(m.get("decode_s") or [])
        chunk, tail = tail[:n], tail[n:]
        verify = [int(r.get("verify_steps") or 0) for r in chunk]
        tokens = sum(int(r.get("completion_tokens") or 0) for r in chunk)
        if sum(verify) != (m.get("verify") or 0) or tokens != m.get("tokens"):
            raise AlignmentError(
                f"{server} round {m.get('round')}: records give {sum(verify)} verify cycles "
                f"and {tokens} tokens, the measurement {m.get('verify')} and {m.get('tokens')}"
            )
        out.append({**m, "verify_steps": verify})
    return out


def with_verify(
    measurements: Sequence[Mapping[str, Any]], servers: Sequence[str], records: Path | None
) -> list[dict[str, Any]]:
    """The measurements, those of ``servers`` given per-request verify counts from the
    acceptance records (``read_records``, ``attach_verify``) where they carry none."""
    out = list(measurements)  # attach_verify builds new dicts; the caller's stay as they are
    if records is None:
        return out
    for server in servers:
        own = [m for m in out if m.get("server") == server]
        if any(m.get("verify_steps") for m in own):
            continue
        by_round = {
            m.get("round"): m for m in attach_verify(own, server, read_records(records, server))
        }
        out = [by_round.get(m.get("round"), m) if m.get("server") == server else m for m in out]
    return out


def read_records(source: Path, server: str) -> list[dict[str, Any]]:
    """A server's acceptance records from a directory (``<server>.jsonl``, or under
    ``acceptance/``) or from a server-logs tarball (``acceptance/<server>.jsonl``)."""
    name = f"{server}.jsonl"
    if source.is_dir():
        for path in (source / name, source / "acceptance" / name):
            if path.is_file():
                return _parse(path.read_text(), path)
        raise FileNotFoundError(f"no {name} in the folder (nor acceptance/{name})")
    with tarfile.open(source) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.lstrip("./") == f"acceptance/{name}":
                return _parse(tar.extractfile(member).read().decode(), source)
    raise FileNotFoundError(f"no acceptance/{name} in it")


def _parse(text: str, where: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError as e:
        raise AlignmentError(f"{where}: an acceptance record is not JSON ({e})") from None


def _pooled(by_prompt: Mapping[int, Sequence[Point]], prompts: Sequence[int]) -> list[Point]:
    return [p for i in prompts for p in by_prompt[i]]


def _part_ms(
    by_prompt: Mapping[int, Sequence[Point]], prompts: Sequence[int], part: int
) -> float | None:
    """A bootstrap draw's refit: ms per cycle (part 0) or per request (part 1); None for a
    draw whose prompts all share one cycle count (no line fits it; the draw counts as 0)."""
    line = fit(_pooled(by_prompt, prompts))
    return 1000 * line[part] if line else None


def in_decode_steps(ms: float, ci: Sequence[float] | None, step_ms: float) -> tuple[float, Any]:
    """A figure in ms and its interval, in decode steps of ``step_ms``."""
    return round(ms / step_ms, 4), [round(x / step_ms, 4) for x in ci] if ci else None


def _summary(points: Sequence[Point]) -> dict[str, Any] | None:
    line = fit(points)
    if line is None:
        return None
    return {
        "ms_per_cycle": round(1000 * line[0], 3),
        "ms_per_request": round(1000 * line[1], 2),
        "requests": len(points),
    }


def compare(
    plain: Mapping[int, Sequence[Point]],
    variant: Mapping[int, Sequence[Point]],
    draws: int = 2000,
    seed: int = 0,
) -> dict[str, Any] | None:
    """Each server's line on the prompts both have, and the variant's per-cycle and
    per-request costs less the plain server's, each with a 95 % interval over prompts."""
    prompts = sorted(set(plain) & set(variant))
    if len(prompts) < 2:
        return None
    a, b = _summary(_pooled(plain, prompts)), _summary(_pooled(variant, prompts))
    if a is None or b is None:
        return None

    def difference(sample: Sequence[int], part: int) -> float:
        a, b = _part_ms(plain, sample, part), _part_ms(variant, sample, part)
        return 0.0 if a is None or b is None else b - a

    return {
        "plain": a,
        "variant": b,
        "prompts": len(prompts),
        "variant_minus_plain_ms_per_cycle": round(b["ms_per_cycle"] - a["ms_per_cycle"], 3),
        "variant_minus_plain_ms_per_cycle_ci95": bootstrap_ci(
            prompts, lambda s: difference(s, 0), draws, seed
        ),
        "variant_minus_plain_ms_per_request": round(b["ms_per_request"] - a["ms_per_request"], 2),
        "variant_minus_plain_ms_per_request_ci95": bootstrap_ci(
            prompts, lambda s: difference(s, 1), draws, seed
        ),
    }


def server_line(
    by_prompt: Mapping[int, Sequence[Point]], draws: int = 2000, seed: int = 0
) -> dict[str, Any] | None:
    """One server's line over its prompts, its per-cycle cost with a 95 % interval from a
    bootstrap over prompts."""
    prompts = sorted(by_prompt)
    got = _summary(_pooled(by_prompt, prompts))
    if got is None or len(prompts) < 2:
        return got

    def slope(sample: Sequence[int]) -> float:
        return _part_ms(by_prompt, sample, 0) or 0.0

    return {**got, "ms_per_cycle_ci95": bootstrap_ci(prompts, slope, draws, seed)}


def servers(bench: Mapping[str, Any], records: Path | None = None) -> dict[str, Any]:
    """Every speculative server's line at batch 1 in a bench_speed result, with its cost per
    cycle in decode steps of the no-speculation TPOT its row was read against. A server with
    no verify counts of its own and no records (stock SGLang writes none) is listed with the
    reason instead."""
    rows = [r for r in bench.get("rows", []) if r.get("batch") == 1 and r.get("server")]
    measurements = list(bench.get("measurements", []))
    out: dict[str, Any] = {}
    for row in rows:
        name = row["server"]
        try:
            measurements = with_verify(measurements, [name], records)
        except FileNotFoundError as e:
            out[name] = {"skipped": str(e)}
            continue
        line = server_line(server_points(measurements, name))
        if line is None:
            out[name] = {"skipped": "no per-request verify counts (or one count for all)"}
            continue
        step = row.get("nospec_tpot_ms")
        if step:
            line["decode_step_ms"] = step
            line["decode_steps_per_cycle"], line["decode_steps_per_cycle_ci95"] = in_decode_steps(
                line["ms_per_cycle"], line.get("ms_per_cycle_ci95"), step
            )
        out[name] = {"setting": [row.get("steps"), row.get("topk"), row.get("draft_tokens")],
                     **line}  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", type=Path, required=True, help="a bench_speed result")
    p.add_argument(
        "--acceptance",
        type=Path,
        help="the run's acceptance records (a folder of <server>.jsonl, or the server-logs "
        "tarball) for a result without per-request verify counts",
    )
    p.add_argument("--out", type=Path, help="write the JSON here (never over a file)")
    args = p.parse_args(argv)
    if args.out and args.out.exists():
        print(f"error: {args.out} exists; results are never overwritten", file=sys.stderr)
        return 1
    try:
        bench = json.loads(args.bench.read_text())
    except (OSError, ValueError) as e:
        print(f"error: {args.bench}: cannot read it as JSON ({e})", file=sys.stderr)
        return 1
    try:
        bench_shape(bench, args.bench.name)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        lines = servers(bench, args.acceptance)
    except (OSError, tarfile.TarError, AlignmentError) as e:
        print(f"error: {args.acceptance}: {e}", file=sys.stderr)
        return 1
    result = {"bench": args.bench.name, "gpu": bench.get("gpu"), "date": bench.get("date"),
              "servers": lines}  # fmt: skip
    text = json.dumps(result, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0 if any("ms_per_cycle" in v for v in lines.values()) else 2


if __name__ == "__main__":
    sys.exit(main())
