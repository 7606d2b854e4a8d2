"""Every argument of every `sglang-ext` command has help text (`convert`'s
positionals and several `bench` flags once had none)."""

from __future__ import annotations

import argparse

from sglang_ext import cli
from sglang_ext.cli import bench


def parsers():
    top = cli.build_parser()
    yield "sglang-ext", top
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name != "bench":  # a stub: `sglang-ext bench` parses with bench's parser
                    yield f"sglang-ext {name}", sub
    yield "sglang-ext bench", bench.build_parser()


def test_every_argument_has_help():
    undocumented = [
        f"{prog}: {action.option_strings or action.dest}"
        for prog, parser in parsers()
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert undocumented == []


def test_every_subcommand_is_listed_with_help():
    top = cli.build_parser()
    (sub,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    assert set(helps) == set(sub.choices) and all(helps.values()), helps
