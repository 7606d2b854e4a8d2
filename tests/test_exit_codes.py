"""One exit-code convention for every `sglang-ext` command (README "Exit codes"): 0 ok, 1 the
drafter/target has errors, 2 usage or refusal; no traceback for any input."""

from __future__ import annotations

import pytest

from sglang_ext import convert, demo
from sglang_ext.cli import main


def test_demo_refuses_an_out_that_holds_anything(tmp_path, capsys):
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "drafter").mkdir()
    (occupied / "drafter" / "config.json").write_text('{"mine": true}\n')
    assert main(["demo", "--out", str(occupied)]) == 2
    err = capsys.readouterr().err
    assert f"{occupied} is not empty" in err
    assert (occupied / "drafter" / "config.json").read_text() == '{"mine": true}\n'
    assert sorted(p.name for p in occupied.rglob("*")) == ["config.json", "drafter"]

    a_file = tmp_path / "file"
    a_file.write_text("x\n")
    assert main(["demo", "--out", str(a_file)]) == 2
    assert f"{a_file} exists and is not a directory" in capsys.readouterr().err
    assert a_file.read_text() == "x\n"


def test_usage_errors_exit_2_without_a_traceback(capsys):
    assert main(["convert", "only-one-argument"]) == 2
    assert main(["no-such-command"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_an_unreadable_or_unwritable_path_is_2_and_a_bug_is_1(tmp_path, capsys, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(demo, "make_demo", disk_full)
    assert main(["demo", "--out", str(tmp_path / "d")]) == 2
    assert "No space left on device" in capsys.readouterr().err

    def bug(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(convert, "convert", bug)
    assert main(["convert", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert "RuntimeError: boom" in err and "bug in sglang-ext" in err and "Traceback" not in err
    monkeypatch.setenv("SGLANG_EXT_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(["convert", str(tmp_path / "a"), str(tmp_path / "b")])
