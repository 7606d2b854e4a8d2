"""A copy of a fused-MoE config directory (``SGLANG_MOE_CONFIG_DIR``) in which some token
counts run another count's config: ``--entry 4=6`` serves 4 tokens with the entry for 6;
``--set 4,5,6:BLOCK_SIZE_N=64`` changes fields of those counts' entries.

At the seed's rank shape, 3/1/4's verify (4 tokens) cost more than 5/1/6's (6 tokens) in
every run up to 2026-12-03's fourth. SGLang 0.5.23's MoE path differs between the two only in
the config entry the nearest-key lookup picks
(``fused_moe_triton_config.try_get_optimal_moe_config``); the tuned file of that fourth run
had block N 32 at 4 tokens and 64 at 6. A server serving 4 tokens with
6's entry (a ``bench_speed --variant`` with ``SGLANG_MOE_CONFIG_DIR`` set to the copy) tells
whether that entry is what makes the shorter verify dearer.

    python -m sglang_ext_tools.moe_config_alias --from /tmp/seed/moe-configs \\
        --out /tmp/seed/moe-configs-4as6 --entry 4=6

The run of 2026-12-03 (the fifth at that shape) tuned block N 32 for 4, 5 and 6 tokens
alike, so that copy served what the plain file did; and 5/1/6's cycle came out 0.17 decode
steps dearer than with the run before's block N 64 at 6 tokens, at the same kernel time in
the tuner (which times ``fused_experts`` alone, without the shared experts' kernels that the
server runs beside it on a second stream). ``--set`` pins the field instead of borrowing an
entry, whatever the tuner picked (served beside the tuner's block N 32 in the sixth run, block
N 64 at 4-6 tokens was 1.5 % slower after the first token):

    python -m sglang_ext_tools.moe_config_alias --from /tmp/seed/moe-configs \\
        --out /tmp/seed/moe-configs-bn64 --set 4,5,6:BLOCK_SIZE_N=64
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path

from sglang_ext_tools.tune_moe import check_out_dir


def parse_entry(text: str) -> tuple[str, str]:
    """'4=6' -> ('4', '6'): token count 4 runs the entry of 6."""
    to, sep, source = text.partition("=")
    if not sep or not to.isdigit() or not source.isdigit():
        raise ValueError(f"--entry {text!r}: expected TO=FROM token counts, like 4=6")
    return to, source


def parse_set(text: str) -> dict[str, dict[str, int]]:
    """'4,5:BLOCK_SIZE_N=64,num_stages=4' -> {'4': {...}, '5': {...}}: fields set in those
    token counts' entries (integers, as SGLang's files hold them)."""
    counts, sep, fields = text.partition(":")
    usage = f"--set {text!r}: expected COUNTS:FIELD=VALUE, like 4,5,6:BLOCK_SIZE_N=64"
    names = counts.split(",")
    if not sep or not all(n.isdigit() for n in names):
        raise ValueError(usage)
    values = {}
    for item in fields.split(","):
        key, eq, value = item.partition("=")
        if not eq or not key or not value.isdigit():
            raise ValueError(usage)
        values[key] = int(value)
    return {n: dict(values) for n in names}


def alias(
    src: Path,
    out: Path,
    entries: Mapping[str, str],
    fields: Mapping[str, Mapping[str, int]] | None = None,
) -> list[Path]:
    """Every config file under SRC/configs/ copied to OUT with entry TO replaced by (or set
    to) entry FROM's config, then FIELDS set in the entries they name (a field the entry
    lacks is refused: SGLang's kernel would not read a misspelt one); the files written.
    SRC is only read; OUT must be new or empty."""
    files = sorted((src / "configs").rglob("*.json"))
    if not files:
        raise ValueError(f"{src}: no config files under configs/ (a SGLANG_MOE_CONFIG_DIR)")
    check_out_dir(out)
    tables = {}
    for path in files:
        table = json.loads(path.read_text())
        for to, source in entries.items():
            if source not in table:
                raise ValueError(
                    f"{path}: no entry {source!r} to serve {to} tokens with "
                    f"(entries: {', '.join(sorted(table, key=int))})"
                )
            table[to] = dict(table[source])
        for count, values in (fields or {}).items():
            entry = table.get(count)
            if entry is None:
                raise ValueError(f"{path}: no entry {count!r} to set {', '.join(values)} in")
            unknown = sorted(set(values) - set(entry))
            if unknown:
                raise ValueError(
                    f"{path}: entry {count!r} has no field {', '.join(unknown)} "
                    f"(fields: {', '.join(entry)})"
                )
            table[count] = {**entry, **values}
        tables[path] = {k: table[k] for k in sorted(table, key=int)}
    written = []
    for path, table in tables.items():
        target = out / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(table, indent=2) + "\n")
        written.append(target)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="src", required=True, help="a SGLANG_MOE_CONFIG_DIR")
    p.add_argument("--out", required=True, help="new or empty directory")
    p.add_argument("--entry", action="append", default=[], help="TO=FROM token counts")
    p.add_argument("--set", dest="fields", action="append", default=[],
                   help="COUNTS:FIELD=VALUE[,FIELD=VALUE], e.g. 4,5,6:BLOCK_SIZE_N=64")  # fmt: skip
    args = p.parse_args(argv)
    if not args.entry and not args.fields:
        p.error("nothing to change: give --entry TO=FROM or --set COUNTS:FIELD=VALUE")
    try:
        entries = dict(map(parse_entry, args.entry))
        fields: dict[str, dict[str, int]] = {}
        for text in args.fields:
            for count, values in parse_set(text).items():
                fields.setdefault(count, {}).update(values)
        written = alias(Path(args.src), Path(args.out), entries, fields)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    print(f"serve with SGLANG_MOE_CONFIG_DIR={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
