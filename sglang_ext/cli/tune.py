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
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_ext.cli import exit_codes
from sglang_ext.cli.moe_fanout import MoeFanout
from sglang_ext.cli.request_time import ProbeFileError, RequestTime, from_probe
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


def _is_count(value: Any, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _is_finite(value: Any) -> bool:
    """A JSON number that is one: not a bool, not NaN, not Infinity."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _field(row: Mapping[str, Any], name: str, where: str, least: int = 1) -> int:
    value = row.get(name)
    if not _is_count(value, least):
        kind = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise TuneInputError(f"{where}: field {name!r} must be {kind}, found {value!r:.60}")
    return value


def _counts(
    record: Mapping[str, Any], name: str, where: str, length: int | None = None
) -> list[int]:
    value = record.get(name)
    if (
        not isinstance(value, list)
        or not value
        or not all(_is_count(v) for v in value)
        or length not in (None, len(value))
    ):
        size = f"{length} counts" if length else "counts"
        raise TuneInputError(
            f"{where}: field {name!r} must be a list of {size} (integers >= 0), one per draft "
            f"position, found {value!r:.60}"
        )
    return value


def check_record(record: Any, where: str) -> None:
    """One acceptance record as the plugin writes it (sglang_ext.metrics.acceptance): counts
    that agree with each other, so that a corrupt line is named rather than averaged in."""
    if not isinstance(record, Mapping):
        raise TuneInputError(
            f"{where}: expected a JSON object (one acceptance record), found {record!r:.60}"
        )
    for name in ("verify_steps", "accepted_draft_tokens", "accepted_per_position"):
        if name not in record:
            raise TuneInputError(f"{where}: record has no {name!r}")
    cycles = _field(record, "verify_steps", where)
    accepted = _field(record, "accepted_draft_tokens", where, least=0)
    per_position = _counts(record, "accepted_per_position", where)
    if accepted > cycles * len(per_position):
        raise TuneInputError(
            f"{where}: field 'accepted_draft_tokens' is {accepted}, more than {cycles} "
            f"verify_steps x {len(per_position)} draft positions = {cycles * len(per_position)} "
            "could accept"
        )
    if sum(per_position) != accepted:
        raise TuneInputError(
            f"{where}: field 'accepted_per_position' sums to {sum(per_position)}, not to "
            f"accepted_draft_tokens {accepted} (each accepted draft counts at its position)"
        )
    proposed = per_position
    if record.get("proposed_per_position") is not None:
        proposed = _counts(record, "proposed_per_position", where, len(per_position))
    for position, (got, out_of) in enumerate(zip(per_position, proposed, strict=True)):
        if got > min(out_of, cycles):  # a cycle accepts a position at most once
            raise TuneInputError(
                f"{where}: field 'accepted_per_position' counts {got} accepted at position "
                f"{position}, more than the {min(out_of, cycles)} proposed there"
            )
    for name, least in (("topk", 1), ("draft_tokens_per_step", 0)):
        if record.get(name) is not None:
            _field(record, name, where, least)


def read_records(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The plugin's acceptance records (SGLANG_EXT_ACCEPTANCE_JSONL), from every file."""
    records = []
    for path in paths:
        try:
            # split as bytes: only \n and \r end a record (str.splitlines also splits at
            # U+2028, which the plugin's records may carry raw in a string)
            lines = Path(path).read_bytes().splitlines()
        except OSError as exc:
            raise TuneInputError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise TuneInputError(
                    f"{where}: not UTF-8 text (byte {exc.start}: {exc.reason}); expected the "
                    "plugin's acceptance JSONL"
                ) from exc
            except json.JSONDecodeError as exc:
                raise TuneInputError(f"{where}: not a JSON record ({exc.msg})") from exc
            check_record(record, where)
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
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise TuneInputError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise TuneInputError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); expected a JSON file"
        ) from exc
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


def _found(data: Any, key: str) -> str:
    """What a file holds instead of an object with ``key``, in a few words."""
    if not isinstance(data, dict):
        return f"{data!r:.60}"
    return f"{key!r}: {data[key]!r:.60}" if key in data else f"an object without {key!r}"


def _indexed_rows(data: Any, path: str, batch: int) -> dict[Setting, tuple[int, Mapping]]:
    """bench_rows, each row with its index in the file."""
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise TuneInputError(
            f"{path}: expected a bench_speed result with a list under 'rows', found "
            f"{_found(data, 'rows')}"
        )
    out: dict[Setting, tuple[int, Mapping]] = {}
    for index, row in enumerate(rows):
        where = f"{path}: rows[{index}]"
        if not isinstance(row, Mapping):
            raise TuneInputError(
                f"{where}: expected an object (one bench_speed measurement), found {row!r:.60}"
            )
        if row.get("batch") != batch or row.get("drafter") != BENCH_MAIN_DRAFTER:
            continue
        setting = Setting(*(_field(row, k, where) for k in ("steps", "topk", "draft_tokens")))
        if setting in out:
            first = out[setting][1]
            backends = {first.get("backend"), row.get("backend")}
            also = f" (backends {' and '.join(map(repr, sorted(map(str, backends))))})"
            raise TuneInputError(
                f"{where}: a second row of {setting.label} at batch {batch}, after "
                f"rows[{out[setting][0]}]{also if len(backends) > 1 else ''}; pass one run's "
                "result, with one row per setting (not a merged matrix)"
            )
        out[setting] = (index, row)
    if not out:
        raise TuneInputError(
            f"{path}: no rows of {BENCH_MAIN_DRAFTER!r} at batch {batch} (a bench_speed result)"
        )
    return out


def bench_rows(data: Any, path: str, batch: int = 1) -> dict[Setting, Mapping[str, Any]]:
    """A bench_speed result's rows of the main drafter at ``batch``, by setting."""
    return {setting: row for setting, (_, row) in _indexed_rows(data, path, batch).items()}


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


# what a cost file's "target_weights" may say: whether the probe's target ran on dummy weights
TARGET_WEIGHTS = {"dummy": True, "trained": False}


def _cycle_cost(cost: Any, where: str, field: str, status: Any = "ok") -> float:
    if not _is_finite(cost) or cost < 1.0:
        why = f" (the row's status: {status!r:.60})" if status not in (None, "ok") else ""
        raise TuneInputError(
            f"{where}: {field} must be a number >= 1 (decode steps per verify cycle; a cycle "
            f"cannot cost less than the step it verifies), found {cost!r:.60}{why}"
        )
    return float(cost)


def _bench_costs(data: Mapping[str, Any], path: str, split_first_token: bool) -> Costs:
    """A bench_speed result's costs: each batch-1 row's cycle, its first token's part taken
    out where the probe allows it."""
    extra = data.get("server_extra_args") or ""
    if not isinstance(extra, (str, list)):
        raise TuneInputError(
            f"{path}: field 'server_extra_args' must be a string or a list of arguments, found "
            f"{extra!r:.60}"
        )
    extra = " ".join(map(str, extra)) if isinstance(extra, list) else extra
    rows = _indexed_rows(data, path, 1)
    request, cycles = None, {}
    if split_first_token:
        try:
            request, cycles = from_probe(data, {s.label: r for s, (_, r) in rows.items()}, path)
        except ProbeFileError as exc:
            raise TuneInputError(str(exc)) from exc
    costs = {}
    for setting, (index, row) in rows.items():
        where, label = f"{path}: rows[{index}]", setting.label
        if label not in cycles:
            cost, field = row.get("cycle_cost_decode_steps"), "'cycle_cost_decode_steps'"
        elif label in request.first_ms:  # the measured split: the row's own decode cycle
            cost, field = cycles[label], "'decode_cycle_cost'"
        else:
            cost, field = cycles[label], "the cycle of 'tau' and 'spec_tok_s' less a first token"
        costs[setting] = _cycle_cost(cost, where, field, row.get("status"))
    return Costs(costs, bool(DUMMY_LOAD.search(extra)), request)


def read_cost_file(data: Any, path: str = "<costs>", split_first_token: bool = True) -> Costs:
    """The costs in a file; from a bench_speed probe, with each request's first token taken
    out of its cycles where the probe allows it (``split_first_token``; see request_time),
    else each row's whole cycle, ``tau x nospec tok/s / spec tok/s``."""
    if is_bench_result(data):
        return _bench_costs(data, path, split_first_token)
    rows = data.get("settings") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        found = _found(data, "settings")
        raise TuneInputError(
            f"{path}: expected a non-empty list under 'settings' (a cost file) or a list under "
            f"'rows' (a bench_speed result), found {found}"
        )
    weights = data.get("target_weights")
    if weights is not None and (not isinstance(weights, str) or weights not in TARGET_WEIGHTS):
        raise TuneInputError(
            f"{path}: field 'target_weights' must be {' or '.join(map(repr, TARGET_WEIGHTS))} "
            f"(what the probe's target ran on) or left out, found {weights!r:.60}"
        )
    costs: dict[Setting, float] = {}
    first: dict[Setting, int] = {}
    for index, row in enumerate(rows):
        where = f"{path}: settings[{index}]"
        if not isinstance(row, Mapping):
            raise TuneInputError(
                f"{where}: expected an object with steps, topk, draft_tokens "
                f"and cycle_cost, found {row!r:.60}"
            )
        setting = Setting(*(_field(row, k, where) for k in ("steps", "topk", "draft_tokens")))
        if setting in first:
            raise TuneInputError(
                f"{where}: the setting {setting.label} again (steps/topk/draft tokens of "
                f"settings[{first[setting]}]); give each setting one cycle_cost"
            )
        first[setting] = index
        costs[setting] = _cycle_cost(row.get("cycle_cost"), where, "'cycle_cost'")
    return Costs(costs, TARGET_WEIGHTS.get(weights))


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


def check_against(
    advice: Mapping[str, Any],
    measured_rows: Mapping[Setting, Mapping],
    path: str = "the measured matrix",
) -> dict:
    """The advice against a measured matrix (bench_speed rows at batch 1, from ``path``): for
    the settings with both a predicted and a measured speedup, whether the predicted order is
    the measured one and how far each prediction is (relative error)."""
    pairs = []
    for row in advice["rows"]:
        setting = Setting(*map(int, row["setting"].split("/")))
        got = measured_rows.get(setting)
        if row["speedup"] is None or got is None or got.get("speedup") is None:
            continue
        speedup = got["speedup"]
        if not _is_finite(speedup) or speedup <= 0:
            raise TuneInputError(
                f"{path}: the {setting.label} row at batch 1: field 'speedup' must be a "
                f"positive number (the measured speedup over no speculation), found {speedup!r:.60}"
            )
        pairs.append((row["setting"], row["speedup"], float(speedup)))
    if not pairs:
        advised = ", ".join(r["setting"] for r in advice["rows"] if r["speedup"] is not None)
        timed = ", ".join(s.label for s, r in measured_rows.items() if r.get("speedup") is not None)
        raise TuneInputError(
            f"{path}: no setting has both a predicted and a measured speedup (predicted: "
            f"{advised or 'none'}; measured at batch 1: {timed or 'none'})"
        )
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
            measured_rows = bench_rows(read_json(against), str(against))
            advice["check"] = check_against(advice, measured_rows, str(against))
    except exit_codes.InputError as exc:
        return exit_codes.fail("tune", exc)
    exit_codes.emit(json.dumps(advice, indent=2) if args.json else render(advice))
    return exit_codes.OK
