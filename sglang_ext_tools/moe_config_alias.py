"""A copy of a fused-MoE config directory (``SGLANG_MOE_CONFIG_DIR``) in which some token
counts run another count's config: ``--entry 4=6`` serves 4 tokens with the entry for 6.

At the seed's rank shape, 3/1/4's verify (4 tokens) has cost more than 5/1/6's (6 tokens)
in every run. SGLang 0.5.23's MoE path differs between the two only in the config entry the
nearest-key lookup picks (``fused_moe_triton_config.try_get_optimal_moe_config``); the tuned
file of 2026-12-03 had block N 32 at 4 tokens and 64 at 6. A server serving 4 tokens with
6's entry (a ``bench_speed --variant`` with ``SGLANG_MOE_CONFIG_DIR`` set to the copy) tells
whether that entry is what makes the shorter verify dearer.

    python -m sglang_ext_tools.moe_config_alias --from /tmp/seed/moe-configs \\
        --out /tmp/seed/moe-configs-4as6 --entry 4=6
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


def alias(src: Path, out: Path, entries: Mapping[str, str]) -> list[Path]:
    """Every config file under SRC/configs/ copied to OUT with entry TO replaced by (or set
    to) entry FROM's config; the files written. SRC is only read; OUT must be new or empty."""
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
    p.add_argument("--entry", action="append", required=True, help="TO=FROM token counts")
    args = p.parse_args(argv)
    try:
        entries = dict(map(parse_entry, args.entry))
        written = alias(Path(args.src), Path(args.out), entries)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    print(f"serve with SGLANG_MOE_CONFIG_DIR={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
