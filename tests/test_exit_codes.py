"""One exit-code convention for every `sglang-ext` command (README "Exit codes"): 0 ok, 1 the
drafter/target has errors, 2 usage or refusal; no traceback for any input."""

from __future__ import annotations

import pytest

from sglang_ext import demo
from sglang_ext.cli import convert, main


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


def test_a_bad_url_is_a_usage_error(capsys):
    """`bench --url notaurl` was once "internal error ... a bug in sglang-ext", exit 1."""
    for url in ("notaurl", "ftp://host:1", "http://host:port"):
        with pytest.raises(SystemExit) as info:
            main(["bench", "--url", url])
        assert info.value.code == 2, url
        err = capsys.readouterr().err
        assert f"argument --url: {url!r} is not a server URL" in err, err
        assert "internal error" not in err and "Traceback" not in err


@pytest.mark.parametrize("kind", ["missing", "empty", "loop", "missing target"])
def test_an_unusable_drafter_or_target_path_is_1_and_says_what_it_found(tmp_path, capsys, kind):
    """README: a drafter or --target that does not exist or cannot be read is exit 1, with a
    sentence saying what is there (not "file not found" for a missing directory)."""
    from sglang_ext.demo import BUNDLED

    paths = {"missing": tmp_path / "nowhere", "empty": tmp_path / "empty", "loop": tmp_path / "l"}
    (tmp_path / "empty").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "l")
    if kind == "missing target":
        argv = ["doctor", str(BUNDLED / "drafter"), "--target", str(tmp_path / "nowhere")]
        expected = f"{tmp_path / 'nowhere'}: no such file or directory"
    else:
        argv = ["doctor", str(paths[kind])]
        expected = {
            "missing": f"{paths['missing']}: no such file or directory",
            "empty": f"{paths['empty']}: no config.json in this directory",
            "loop": f"{paths['loop']}: cannot read (Too many levels of symbolic links)",
        }[kind]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert f"ERROR: {expected}" in out, out
    assert "file not found" not in out and "format:  None" not in out
    if kind == "missing target":
        assert "--target could not be read" in out and "no --target given" not in out


def test_stdout_closed_early_is_not_an_error(tmp_path):
    """`doctor --json | head -1`: no "Broken pipe", and the command keeps its own code."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from sglang_ext.demo import BUNDLED

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code = "from sglang_ext.cli import main; raise SystemExit(main())"
    argv = [sys.executable, "-c", code, "doctor", str(BUNDLED / "drafter"), "--json"]
    for _ in range(3):  # the race (reader gone before or after the first write) both ways
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path
        )
        assert proc.stdout.readline().strip() == b"{"
        proc.stdout.close()  # the reader stops, as head -1 does
        err = proc.stderr.read().decode()
        proc.stderr.close()
        assert proc.wait(timeout=120) == 0, err
        assert "Broken pipe" not in err and "Traceback" not in err, err


def test_one_table_maps_errors_to_codes():
    from sglang_ext.cli import exit_codes
    from sglang_ext.cli.bench import BenchError
    from sglang_ext.cli.convert import ConversionRefused
    from sglang_ext.drafter.checkpoint_files import DrafterLoadError
    from sglang_ext.drafter.config_fields import DrafterConfigError

    assert exit_codes.code_for(ConversionRefused("x")) == (2, "refused")
    assert exit_codes.code_for(BenchError("x")) == (2, "error")
    assert exit_codes.code_for(DrafterConfigError("x"))[0] == 1
    assert exit_codes.code_for(DrafterLoadError("x"))[0] == 1
    assert exit_codes.code_for(OSError(28, "No space left on device"))[0] == 2
    assert exit_codes.code_for(RuntimeError("x")) == (1, "internal error")
