"""A bench file's shape, checked before a tool reads it: what ``bench_speed`` writes (rows,
servers, measurements, profiles, figures and their intervals), so that a file that is not one
is refused in one line naming the file, the field, what was expected and what was found,
instead of a traceback from deep inside a reading. Used by the mode verdicts' shared command
line (``server_mode_verdict.cli``), ``across_runs`` and ``cycle_fit``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the row figures the mode verdicts read (and every ``*_ci95``): numbers or null
ROW_FIGURES = (
    "speedup", "vs_setting", "decode_speedup", "tau", "eta", "eta_same_switch",
    "speedup_same_switch", "spec_tpot_ms",
)  # fmt: skip


def is_number(value: Any) -> bool:
    """A JSON number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def found(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def bench_shape(bench: Any, where: str) -> None:
    """``bench`` as bench_speed writes it: an object whose ``rows`` are objects with a
    ``server`` name, an integer ``batch`` and numeric (or null) figures, each ``*_ci95`` two
    numbers; ``servers`` objects with a ``name``; ``measurements`` objects; ``profiles`` an
    object of objects; ``gpu`` a name and ``gpu_info`` an object. What is not raises a
    ValueError naming ``where``, the field, what was expected and what was found."""

    def bad(field: str, expected: str, value: Any) -> ValueError:
        return ValueError(f"{where}: {field}: expected {expected}, found {found(value)}")

    if not isinstance(bench, Mapping):
        raise bad("the file", "a JSON object (bench_speed's --out-json)", bench)
    for key, kind, expected in (("rows", list, "a list"), ("servers", list, "a list"),
                                ("measurements", list, "a list"),
                                ("profiles", Mapping, "an object"), ("gpu", str, "a GPU name"),
                                ("gpu_info", Mapping, "an object")):  # fmt: skip
        if bench.get(key) is not None and not isinstance(bench[key], kind):
            raise bad(key, expected, bench[key])
    for i, row in enumerate(bench.get("rows") or []):
        if not isinstance(row, Mapping):
            raise bad(f"rows[{i}]", "an object", row)
        if not isinstance(row.get("server"), str):
            raise bad(f"rows[{i}].server", "a server name", row.get("server"))
        if not isinstance(row.get("batch"), int) or isinstance(row.get("batch"), bool):
            raise bad(f"rows[{i}].batch", "an integer", row.get("batch"))
        for key, value in row.items():
            if value is None:
                continue
            if key.endswith("_ci95"):
                if not (isinstance(value, list) and len(value) == 2 and all(map(is_number, value))):
                    raise bad(f"rows[{i}].{key}", "[low, high], two numbers", value)
            elif key in ROW_FIGURES and not is_number(value):
                raise bad(f"rows[{i}].{key}", "a number or null", value)
    for i, server in enumerate(bench.get("servers") or []):
        if not isinstance(server, Mapping) or not isinstance(server.get("name"), str):
            raise bad(f"servers[{i}]", "an object with a name", server)
    for i, m in enumerate(bench.get("measurements") or []):
        if not isinstance(m, Mapping):
            raise bad(f"measurements[{i}]", "an object", m)
    for name, profile in (bench.get("profiles") or {}).items():
        if not isinstance(profile, Mapping):
            raise bad(f"profiles.{name}", "an object", profile)
