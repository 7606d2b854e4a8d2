"""`sglang-ext tune`: which speculative setting to serve, predicted from what a served run
accepted and what each setting's verify cycle costs.

A setting's speedup over no speculation is ``tau / cycle_cost``: tau = tokens per verify
cycle (accepted drafts + 1), cycle_cost = one cycle's time in decode steps of the target
without speculation (a zero-acceptance probe measures it: a drafter that is never right,
so every cycle emits one token, timed against no speculation). tau per setting is

- **measured** where the acceptance records (the plugin's JSONL, one record per finished
  request) hold that setting;
- **predicted** for a chain (topk 1, S steps, S + 1 draft tokens) from a served chain's
  per-position acceptance ``a_j`` = P(draft j accepted): ``tau(S) = 1 + a_1 + ... + a_S``;
  past the deepest measured position each ``a_j`` is the previous one times the last
  measured conditional rate ``a_d / a_(d-1)``;
- **not predicted** for a tree setting without records of it: a chain's records do not say
  what the extra branches would accept. Serve it once (the plugin records it) and run again.

The recommendation is the setting with the highest speedup among those with a tau. From a
bench_speed probe, the speedup is of whole requests of the probe's length (``--output-tokens``
for another): each request's first token apart from its cycles (:mod:`sglang_ext.cli.
request_time`), since a tok/s probe holds it once where a served run weighs it tau-fold;
``decode_speedup`` is tau / cycle, the long-output limit.

Cycle costs come from a ``{"settings": [...]}`` file or straight from a
``sglang_ext_tools.bench_speed`` result (its ``rows`` at batch 1 carry
``cycle_cost_decode_steps``: run it with dummy weights for a zero-acceptance probe).
``--against`` another bench_speed result checks the advice against what was measured: the
predicted ranking of the settings both have against the measured one at batch 1, and each
predicted speedup's relative error (the setting advisor's acceptance test: same ranking,
every error within 10 %).
An MoE target probed on dummy weights (``--load-format dummy``) routes every token to the
same experts, so its probe misses what verifying several tokens reads in experts; with
``--target-config`` (the target's config.json, ``--tp`` its tensor parallelism) each
setting's cost gains that fan-out (:mod:`sglang_ext.cli.moe_fanout`), shown per row.
Imports nothing of SGLang; reads only the files it is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_ext.cli import exit_codes
from sglang_ext.cli.moe_fanout import FanoutConfigError, MoeFanout
from sglang_ext.cli.request_time import RequestTime, from_probe
from sglang_ext.metrics.acceptance import pooled_per_position, sglang_aggregate


class TuneInputError(exit_codes.InputError):
    """An acceptance or cost file that cannot be read as one (names file, line, field)."""


@dataclass(frozen=True, order=True)
class Setting:
    steps: int
    topk: int
    draft_tokens: int

    @property
    def label(self) -> str:
        return f"{self.steps}/{self.topk}/{self.draft_tokens}"

    @property
    def is_chain(self) -> bool:
        return self.topk == 1 and self.draft_tokens == self.steps + 1


def _field(row: Mapping[str, Any], name: str, where: str) -> int:
    value = row.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TuneInputError(f"{where}: field {name!r} must be a positive integer, found {value!r}")
    return value


def read_records(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The plugin's acceptance records (SGLANG_EXT_ACCEPTANCE_JSONL), from every file."""
    records = []
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise TuneInputError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TuneInputError(f"{path}:{number}: not a JSON record ({exc.msg})") from exc
            for name in ("verify_steps", "accepted_draft_tokens", "accepted_per_position"):
                if name not in record:
                    raise TuneInputError(f"{path}:{number}: record has no {name!r}")
            records.append(record)
    if not records:
        raise TuneInputError(f"{', '.join(map(str, paths))}: no acceptance records")
    return records


def setting_of(record: Mapping[str, Any]) -> Setting:
    """A record's setting: depth = its per-position entries, draft tokens = per step + 1."""
    per_step = int(record.get("draft_tokens_per_step") or len(record["accepted_per_position"]))
    return Setting(len(record["accepted_per_position"]), int(record.get("topk") or 1), per_step + 1)


def measured(records: Iterable[Mapping[str, Any]]) -> dict[Setting, dict[str, Any]]:
    """tau (pooled over requests) and per-position acceptance, per setting in the records."""
    groups: dict[Setting, list[Mapping[str, Any]]] = {}
    for record in records:
        groups.setdefault(setting_of(record), []).append(record)
    out = {}
    for setting, rows in groups.items():
        out[setting] = {
            "requests": len(rows),
            "tau": sglang_aggregate(rows, None, None)["accept_length"],
            "per_position": pooled_per_position(rows),
        }
    return out


def chain_tau(per_position: Sequence[float | None], steps: int) -> float:
    """tau of a chain of ``steps`` drafts from cumulative per-position acceptance."""
    known = [p for p in per_position if p is not None]
    if not known:
        raise TuneInputError("the chain records have no per-position acceptance")
    rates = list(known[:steps])
    ratio = known[-1] / known[-2] if len(known) >= 2 and known[-2] > 0 else known[-1]
    while len(rates) < steps:
        rates.append(rates[-1] * min(ratio, 1.0))
    return 1.0 + sum(rates)


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise TuneInputError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    except json.JSONDecodeError as exc:
        raise TuneInputError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from exc


def read_costs(path: Path) -> dict[Setting, float]:
    """Cycle costs in decode steps from a file: {"settings": [{"steps", "topk",
    "draft_tokens", "cycle_cost"}, ...], "target_weights": "dummy" | "trained" (optional)}
    (other keys, e.g. where they were measured, ignored), or a bench_speed result."""
    return read_costs_from(read_json(path), str(path))


# bench_speed's name for the plugin-served main drafter (sglang_ext_tools/bench_speed.MAIN).
BENCH_MAIN_DRAFTER = "speculators (plugin)"
CHECK_TOLERANCE = 0.10


def bench_rows(data: Any, path: str, batch: int = 1) -> dict[Setting, Mapping[str, Any]]:
    """A bench_speed result's rows of the main drafter at ``batch``, by setting."""
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise TuneInputError(f"{path}: expected a bench_speed result with a list under 'rows'")
    out = {}
    for index, row in enumerate(rows):
        if row.get("batch") != batch or row.get("drafter") != BENCH_MAIN_DRAFTER:
            continue
        where = f"{path}: rows[{index}]"
        out[Setting(*(_field(row, k, where) for k in ("steps", "topk", "draft_tokens")))] = row
    if not out:
        raise TuneInputError(
            f"{path}: no rows of {BENCH_MAIN_DRAFTER!r} at batch {batch} (a bench_speed result)"
        )
    return out


DUMMY_LOAD = re.compile(r"--load-format[= ]dummy\b")


@dataclass(frozen=True)
class Costs:
    """Cycle costs per setting, and whether they were probed on dummy target weights (None:
    the file does not say)."""

    by_setting: dict[Setting, float]
    dummy_target: bool | None
    # a bench_speed probe's split of a request into its first token and its cycles
    # (sglang_ext.cli.request_time); None: the costs are whole cycles, F = 0
    request: RequestTime | None = None

    @property
    def has_fanout(self) -> bool:
        """Probed on the trained target (e.g. with ``sglang-ext probe-drafter``'s twin): the
        MoE verify fan-out is in the costs already, so no model of it is added."""
        return self.dummy_target is False


def is_bench_result(data: Any) -> bool:
    # bench_speed results carry "rows" (and a "settings" list of [steps, topk, draft] too)
    return isinstance(data, dict) and isinstance(data.get("rows"), list)


def read_costs_from(data: Any, path: str = "<costs>") -> dict[Setting, float]:
    return read_cost_file(data, path).by_setting


def read_cost_file(data: Any, path: str = "<costs>", split_first_token: bool = True) -> Costs:
    """The costs in a file; from a bench_speed probe, with each request's first token taken
    out of its cycles where the probe allows it (``split_first_token``; see request_time),
    else each row's whole cycle, ``tau x nospec tok/s / spec tok/s``."""
    dummy, request = None, None
    if is_bench_result(data):
        extra = data.get("server_extra_args") or ""
        extra = " ".join(map(str, extra)) if isinstance(extra, list) else str(extra)
        dummy = bool(DUMMY_LOAD.search(extra))
        rows = bench_rows(data, path)
        request, cycles = (
            from_probe(data, {s.label: row for s, row in rows.items()})
            if split_first_token
            else (None, {})
        )
        data = {  # a bench_speed result: each row's cycle, its first token's part taken out
            "settings": [
                {
                    "steps": s.steps,
                    "topk": s.topk,
                    "draft_tokens": s.draft_tokens,
                    "cycle_cost": cycles.get(s.label, row.get("cycle_cost_decode_steps")),
                }
                for s, row in rows.items()
            ]
        }
    rows = data.get("settings") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise TuneInputError(f"{path}: expected a non-empty list under 'settings'")
    if dummy is None and isinstance(data.get("target_weights"), str):
        dummy = data["target_weights"] == "dummy"
    costs = {}
    for index, row in enumerate(rows):
        where = f"{path}: settings[{index}]"
        if not isinstance(row, Mapping):
            raise TuneInputError(
                f"{where}: expected an object with steps, topk, draft_tokens "
                f"and cycle_cost, found {row!r}"
            )
        setting = Setting(*(_field(row, k, where) for k in ("steps", "topk", "draft_tokens")))
        cost = row.get("cycle_cost")
        if not isinstance(cost, (int, float)) or isinstance(cost, bool) or cost < 1.0:
            raise TuneInputError(
                f"{where}: 'cycle_cost' must be a number >= 1 (decode steps per verify "
                f"cycle; a cycle cannot cost less than the step it verifies), found {cost!r}"
            )
        costs[setting] = float(cost)
    return Costs(costs, dummy, request)


def advise(
    found: Mapping[Setting, Mapping[str, Any]],
    costs: Mapping[Setting, float],
    fanout: MoeFanout | None = None,
    request: RequestTime | None = None,
) -> dict:
    """One row per costed setting (tau measured, predicted or None), best first; ``fanout``
    adds an MoE target's verify fan-out to costs probed on dummy weights; ``request``: the
    speedup is of whole requests of its length (first token included), else per cycle."""
    chains = [s for s in found if s.is_chain]
    base = max(chains, key=lambda s: s.steps) if chains else None
    rows = []
    for setting, probed in costs.items():
        extra = fanout.extra_decode_steps(setting.draft_tokens) if fanout else 0.0
        cost = probed + extra
        if setting in found and found[setting]["tau"] is not None:
            tau, source = found[setting]["tau"], f"measured ({found[setting]['requests']} requests)"
        elif setting.is_chain and base is not None:
            tau = chain_tau(found[base]["per_position"], setting.steps)
            source = f"predicted from chain {base.label}"
        else:
            tau, source = None, "not predicted: serve it once (no records of this tree)"
        if tau is None:
            speedup = None
        elif request is not None:
            speedup = request.speedup(setting.label, tau, cost)
        else:
            speedup = tau / cost
        rows.append(
            {
                "setting": setting.label,
                "tau": tau,
                "cycle_cost": cost,
                "speedup": speedup,
                "decode_speedup": tau / cost if tau is not None else None,
                "eta": 1.0 / cost,
                "tau_source": source,
                "probe_cost": probed,
                "moe_fanout": round(extra, 4),
            }
        )
    rows.sort(key=lambda r: (r["speedup"] is None, -(r["speedup"] or 0.0), r["setting"]))
    best = next((r for r in rows if r["speedup"] is not None), None)
    out = {"rows": rows, "recommended": best["setting"] if best else None}
    if request is not None:
        out["request"] = {
            "output_tokens": request.tokens,
            "decode_step_ms": round(request.step_ms, 4),
            "nospec_first_token_ms": round(request.nospec_first_ms, 3),
            "first_token_ms": {k: round(v, 3) for k, v in request.first_ms.items()},
            "source": request.source,
        }
    return out


def check_against(advice: Mapping[str, Any], measured_rows: Mapping[Setting, Mapping]) -> dict:
    """The advice against a measured matrix (bench_speed rows at batch 1): for the settings
    with both a predicted and a measured speedup, whether the predicted order is the measured
    one and how far each prediction is (relative error)."""
    pairs = []
    for row in advice["rows"]:
        setting = Setting(*map(int, row["setting"].split("/")))
        got = measured_rows.get(setting)
        if row["speedup"] is None or got is None or got.get("speedup") is None:
            continue
        pairs.append((row["setting"], row["speedup"], float(got["speedup"])))
    if not pairs:
        raise TuneInputError("no setting has both a predicted and a measured speedup")
    predicted = [name for name, _, _ in sorted(pairs, key=lambda p: -p[1])]
    measured_ = [name for name, _, _ in sorted(pairs, key=lambda p: -p[2])]
    errors = {name: round(pred / meas - 1.0, 4) for name, pred, meas in pairs}
    worst = max(abs(e) for e in errors.values())
    return {
        "settings": len(pairs),
        "predicted_order": predicted,
        "measured_order": measured_,
        "rank_match": predicted == measured_,
        "relative_error": errors,
        "max_abs_relative_error": round(worst, 4),
        "tolerance": CHECK_TOLERANCE,
        "pass": predicted == measured_ and worst <= CHECK_TOLERANCE,
    }


def render(advice: Mapping[str, Any]) -> str:
    lines = [
        f"{'setting':<10} {'tau':>6} {'cycle':>6} {'speedup':>8} {'decode':>7} {'eta':>5}"
        "  tau from",
    ]
    for r in advice["rows"]:
        tau = f"{r['tau']:.3f}" if r["tau"] is not None else "-"
        speed = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        decode = r.get("decode_speedup")
        decode = f"{decode:.2f}x" if decode is not None else "-"
        lines.append(
            f"{r['setting']:<10} {tau:>6} {r['cycle_cost']:>6.3f} {speed:>8} {decode:>7} "
            f"{r['eta']:>5.2f}  {r['tau_source']}"
        )
    request = advice.get("request")
    if request:
        lines.append(
            f"speedup: whole requests of {request['output_tokens']} output tokens, each with "
            f"its first token ({request['nospec_first_token_ms']:.0f} ms without speculation, "
            f"decode step {request['decode_step_ms']:.2f} ms; from {request['source']}); "
            "decode: tau / cycle, the long-output limit"
        )
    else:
        lines.append(
            "speedup: tau / cycle (the probe has no first-token time: requests' fixed part "
            "is in its cycles, which then run high where tau is high)"
        )
    note = advice.get("costs_note")
    if note:
        lines.append(note)
    best = advice["recommended"]
    if best is None:
        lines.append("no setting has a tau: serve a chain with the plugin and pass its records")
    else:
        row = next(r for r in advice["rows"] if r["setting"] == best)
        lines.append(
            f"recommended: {best} (steps/topk/draft tokens): predicted {row['speedup']:.2f}x = "
            f"tau {row['tau']:.3f} / cycle cost {row['cycle_cost']:.3f} decode steps"
        )
    check = advice.get("check")
    if check:
        lines.append(
            f"against the measured matrix ({check['settings']} settings at batch 1): ranking "
            f"{'matches' if check['rank_match'] else 'differs'} (predicted "
            f"{' > '.join(check['predicted_order'])}, measured "
            f"{' > '.join(check['measured_order'])}); largest error "
            f"{100 * check['max_abs_relative_error']:.1f} % (tolerance "
            f"{100 * check['tolerance']:.0f} %): {'pass' if check['pass'] else 'FAIL'}"
        )
    return "\n".join(lines)


def fanout_for(costs: Costs, config_path: Path | None, tp: int) -> tuple[MoeFanout | None, str]:
    """The fan-out to add (None: none) and one line saying why."""
    if config_path is None:
        if costs.has_fanout:
            return None, ""
        return None, (
            "costs probed on dummy target weights: an MoE target's verify fan-out is not in "
            "them (pass --target-config)"
            if costs.dummy_target
            else ""
        )
    fanout = MoeFanout.from_config(read_json(config_path), str(config_path), tp)
    if fanout is None:
        return None, f"{config_path}: a dense target; no verify fan-out"
    if costs.has_fanout:
        return None, "costs probed on the trained target: its fan-out is in them already"
    said = "" if costs.dummy_target else " (assumed: the cost file does not say)"
    return fanout, (
        f"cycle = probed cost on dummy target weights{said} + MoE verify fan-out: "
        f"{fanout.experts} experts, top-{fanout.experts_per_token}, {fanout.moe_layers} MoE "
        f"layers; n tokens read N(1-(1-k/N)^n) experts per layer (sglang_ext.cli.moe_fanout)"
    )


def main(args) -> int:
    try:
        costs = read_cost_file(read_json(args.costs), str(args.costs))
        fanout, note = fanout_for(
            costs, getattr(args, "target_config", None), getattr(args, "tp", 1)
        )
        request = costs.request
        tokens = getattr(args, "output_tokens", None)
        if request is not None and tokens is not None:
            request = request.at(tokens)
        advice = advise(measured(read_records(args.acceptance)), costs.by_setting, fanout, request)
        if note:
            advice["costs_note"] = note
        against = getattr(args, "against", None)
        if against is not None:
            advice["check"] = check_against(advice, bench_rows(read_json(against), str(against)))
    except (TuneInputError, FanoutConfigError) as exc:
        return exit_codes.fail("tune", exc)
    exit_codes.emit(json.dumps(advice, indent=2) if args.json else render(advice))
    return exit_codes.OK
