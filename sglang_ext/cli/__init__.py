"""`sglang-ext`: doctor | convert | bench | tune | probe-drafter | demo | self-check.

Exit codes, every command (README "Exit codes", the table in sglang_ext.cli.exit_codes): 0 ok;
1 the drafter or target has errors (doctor/demo verdict ERROR, also when a path named as the
drafter or target does not exist or cannot be read; an invalid drafter to convert, failed
benchmark requests or accept length below --min-accept-length, a plugin that does not
register); 2 usage or refusal (bad arguments, an unreachable server, a conversion or
destination refused, a file that cannot be written). No input gets a Python traceback: a
failure of sglang-ext itself is one line naming it as a bug (exit 1), with the traceback under
SGLANG_EXT_DEBUG=1. Closing stdout early (`| head`) is not an error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglang_ext.cli import exit_codes
from sglang_ext.cli.arg_types import positive_int


class Parser(argparse.ArgumentParser):
    """argparse, except that with `json_errors` a usage error is printed as a doctor JSON
    report (`doctor --json` always prints JSON). Exit status 2 either way."""

    json_errors = False

    def error(self, message: str):
        if not self.json_errors:
            super().error(message)
        from sglang_ext.cli.doctor import failed

        report = failed(None, None, f"usage: {message} ({self.format_usage().strip()})")
        print(json.dumps(report.to_json(), indent=2))
        raise SystemExit(2)


def build_parser(json_errors: bool = False) -> argparse.ArgumentParser:
    parser = Parser(prog="sglang-ext", description=__doc__)
    parser.json_errors = json_errors
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="what to run (COMMAND -h: options)"
    )

    doctor = sub.add_parser("doctor", help="report what SGLang will do with a drafter (no GPU)")
    doctor.json_errors = json_errors
    doctor.add_argument("drafter", help="drafter directory (speculators or SGLang format)")
    doctor.add_argument("--target", help="target model directory or its config.json")
    doctor.add_argument(
        "--context-length",
        type=positive_int,
        help="the server's --context-length, if given (default: the target's own)",
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable report")

    convert = sub.add_parser("convert", help="speculators drafter -> SGLang-native layout")
    convert.add_argument("src", help="speculators drafter directory (read, never modified)")
    convert.add_argument(
        "dst", help="new or empty directory for the SGLang-format drafter (never inside SRC)"
    )
    convert.add_argument("--target", help="target directory (resolves aux ids for its class)")
    convert.add_argument(
        "--force",
        action="store_true",
        help="convert even when stock SGLang cannot express the math (lossy; see CONVERTED.md)",
    )
    convert.add_argument(
        "--overwrite",
        action="store_true",
        help="replace DST if it is a non-empty directory (never one that overlaps SRC)",
    )

    probe = sub.add_parser(
        "probe-drafter",
        help="a never-right twin of a drafter (same cost, ~no acceptance) for tune's cost probe",
    )
    probe.add_argument("src", help="drafter directory (read, never modified)")
    probe.add_argument("dst", help="new or empty directory for the twin (never inside SRC)")
    probe.add_argument(
        "--overwrite",
        action="store_true",
        help="replace DST if it is a non-empty directory (never one that overlaps SRC)",
    )

    demo = sub.add_parser("demo", help="write a tiny speculators drafter and diagnose it")
    demo.add_argument("--out", help="output directory (default: a new temporary directory)")

    tune = sub.add_parser(
        "tune",
        help="which steps/topk/draft tokens to serve: tau from a served run's acceptance "
        "records over each setting's measured cycle cost",
    )
    tune.add_argument(
        "acceptance",
        nargs="+",
        type=Path,
        help="the plugin's acceptance JSONL (SGLANG_EXT_ACCEPTANCE_JSONL) of served runs",
    )
    tune.add_argument(
        "--costs",
        type=Path,
        required=True,
        help='cycle costs in decode steps: {"settings": [{"steps", "topk", "draft_tokens", '
        '"cycle_cost"}]} from a zero-acceptance probe, or a bench_speed result (its batch-1 '
        "rows, each request's first token taken apart from its cycles where the probe "
        "measured it or traced its baseline)",
    )
    tune.add_argument(
        "--against",
        type=Path,
        help="a bench_speed result of the same settings: check the advice against it (ranking "
        "at batch 1 and each predicted speedup within 10 %%)",
    )
    tune.add_argument(
        "--target-config",
        type=Path,
        help="the target's config.json: an MoE target's verify fan-out is added to costs "
        "probed on dummy weights (which route every token to the same experts)",
    )
    tune.add_argument(
        "--tp", type=positive_int, default=1,
        help="the target's tensor parallelism (with --target-config)",
    )
    tune.add_argument(
        "--output-tokens",
        type=positive_int,
        help="predict whole requests of this many output tokens (default: the probe's "
        "--max-new-tokens), each with its first token's time, where the probe measured it",
    )
    tune.add_argument("--json", action="store_true", help="machine-readable advice")

    sub.add_parser(
        "self-check",
        help="verify the plugin registers with the installed SGLang (JSON: its entry point, "
        "architectures, hooks)",
    )
    sub.add_parser(
        "bench", help="benchmark a running server (see `sglang-ext bench -h`)", add_help=False
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else ""
    try:
        code = run(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except Exception as exc:  # noqa: BLE001 - no traceback for any input (exit_codes' table)
        if exit_codes.debugging() and not isinstance(exc, BrokenPipeError):
            raise
        return exit_codes.fail(command, exc)


def run(argv: list[str]) -> int:
    if argv[:1] == ["bench"]:
        from sglang_ext.cli import bench

        return bench.main(argv[1:])
    json_errors = argv[:1] == ["doctor"] and "--json" in argv
    try:
        args = build_parser(json_errors).parse_args(argv)
    except SystemExit as exc:  # argparse: usage errors (2) and --help (0)
        return exc.code if isinstance(exc.code, int) else exit_codes.USAGE
    if args.command == "doctor":
        from sglang_ext.cli import doctor

        return doctor.main(args)
    if args.command == "convert":
        from sglang_ext.cli import convert

        return convert.main(args)
    if args.command == "probe-drafter":
        from sglang_ext.cli import probe_drafter

        return probe_drafter.main(args)
    if args.command == "demo":
        from sglang_ext.cli import demo

        return demo.main(args)
    if args.command == "tune":
        from sglang_ext.cli import tune

        return tune.main(args)
    if args.command == "self-check":
        from sglang_ext import plugin

        try:
            result = plugin.self_check()
        except BaseException as exc:  # noqa: BLE001 - report any failure as JSON, exit 1
            error = f"{type(exc).__name__}: {exc}"
            exit_codes.emit(json.dumps({"plugin_loaded": False, "error": error}))
            return exit_codes.INPUT_ERROR
        exit_codes.emit(json.dumps(result, indent=2))
        return exit_codes.OK
    return exit_codes.USAGE
