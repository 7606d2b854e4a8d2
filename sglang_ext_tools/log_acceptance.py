"""Acceptance per server, read back from a GPU run's server logs (the plugin's one
``sglang_ext.acceptance {...}`` line per finished request): the figures a run measured when
its results file did not survive (the machine went back before the suite wrote it).

    python -m sglang_ext_tools.log_acceptance SERVER_LOGS.tgz --first 16 \\
        --run-info PARTIAL_RESULTS.json --out acceptance-from-logs.json

Per server: requests (those with at least ``--min-tokens`` completion tokens: SGLang's
warmup and health checks generate fewer), tau = (accepted drafts + verify steps) / verify
steps and per-position acceptance pooled over the requests (``acceptance.pooled_per_position``),
over all of them and over the first ``--first`` (requests are logged in the order they
finished; the suite sends its prompt sets one at a time, so these are its first prompts).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sglang_ext.metrics.acceptance import (
    LOG_PREFIX,
    parse_log_line,
    pooled_per_position,
    sglang_aggregate,
)


def records(text: str) -> list[dict[str, Any]]:
    """The acceptance records of one server log, in log order."""
    return [parse_log_line(line) for line in text.splitlines() if LOG_PREFIX + " {" in line]


def summarize(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    rows = list(rows)
    pooled = sglang_aggregate(rows, None, None)  # sum(A + V) / sum(V) over the requests
    tau = pooled["accept_length"]
    return {
        "requests": len(rows),
        "verify_steps": pooled["spec_num_forward_ct"],
        "accepted_draft_tokens": pooled["spec_num_correct_drafts"],
        "tau": round(tau, 4) if tau is not None else None,
        "per_position": [
            None if p is None else round(p, 4) for p in pooled_per_position(rows)
        ],
    }


def servers(logs: dict[str, str], first: int, min_tokens: int) -> dict[str, Any]:
    out = {}
    for name, text in sorted(logs.items()):
        rows = [r for r in records(text) if r["completion_tokens"] >= min_tokens]
        if rows:
            out[name] = {"all": summarize(rows), f"first_{first}": summarize(rows[:first])}
    return out


def read_tgz(path: Path) -> dict[str, str]:
    """server name -> log text, from the suite's server-logs tarball (server-NAME.log)."""
    logs = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if member.isfile() and name.startswith("server-") and name.endswith(".log"):
                text = tar.extractfile(member).read().decode(errors="replace")
                logs[name[len("server-") : -len(".log")]] = text
    return logs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", type=Path, help="the suite's server-logs .tgz")
    parser.add_argument("--first", type=int, default=16)
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--run-info", type=Path, help="a results file of that run (gpu, versions)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.out.exists():
        print(f"log_acceptance: {args.out} exists; not overwriting it", file=sys.stderr)
        return 2
    data: dict[str, Any] = {
        "source": args.logs.name,
        "command": " ".join(["python -m sglang_ext_tools.log_acceptance", *(argv or sys.argv[1:])]),
        "written": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "definition": "tau = (accepted drafts + verify steps) / verify steps; per-position "
        "acceptance pooled over requests; requests with fewer than "
        f"{args.min_tokens} completion tokens left out (warmup, health checks)",
    }
    if args.run_info:
        info = json.loads(args.run_info.read_text())
        data["run"] = {k: info.get(k) for k in ("date", "gpu", "versions", "attention_backend")}
    data["servers"] = servers(read_tgz(args.logs), args.first, args.min_tokens)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"{args.out}: {len(data['servers'])} servers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
