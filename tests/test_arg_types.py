"""cli.arg_types: the one argparse reader of a count, and the message it gives."""

from __future__ import annotations

import argparse

import pytest

from sglang_ext.cli.arg_types import int_at_least, positive_int


@pytest.mark.parametrize("text, value", [("1", 1), ("16", 16), (" 3 ", 3)])
def test_a_count_reads_as_its_integer(text, value):
    assert positive_int(text) == value


@pytest.mark.parametrize("text", ["0", "-2", "1.5", "x", "", "nan"])
def test_anything_else_names_what_was_expected_and_found(text):
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        positive_int(text)
    assert str(caught.value) == f"expected a positive integer, found {text!r}"


def test_another_floor_is_named_as_such():
    assert int_at_least(0)("0") == 0
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected an integer >= 0, found '-1'$"):
        int_at_least(0)("-1")


def test_the_parser_says_it_with_the_flag():
    parser = argparse.ArgumentParser(prog="p", exit_on_error=False)
    parser.add_argument("--rounds", type=positive_int)
    with pytest.raises(argparse.ArgumentError, match=r"argument --rounds: expected a positive"):
        parser.parse_args(["--rounds", "0"])
