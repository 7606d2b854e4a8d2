"""`sglang-ext convert` never loses data: it refuses a non-empty destination unless
--overwrite, refuses a destination that is or contains the source (or lies inside it), and
publishes the converted drafter only once it is complete."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sglang_ext.cli import convert as convert_module
from sglang_ext.cli import main

LOSSLESS = "norms_off"  # stock SGLang expresses its math: converts without --force


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["convert", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def src(drafter, tmp_path) -> Path:
    directory = tmp_path / "src"
    shutil.copytree(drafter(LOSSLESS)[0], directory)
    return directory


def test_converts_into_a_new_directory(src, tmp_path, target_dir, capsys):
    dst = tmp_path / "out" / "converted"
    code, out, err = run(capsys, src, dst, "--target", target_dir)
    assert code == 0, err
    assert sorted(p.name for p in dst.iterdir()) == [
        "CONVERTED.md",
        "config.json",
        "model.safetensors",
    ]
    assert json.loads((dst / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLMEagle3"
    ]
    assert [p.name for p in dst.parent.iterdir()] == ["converted"]  # no temporary left behind


def test_empty_existing_directory_is_used(src, tmp_path, target_dir, capsys):
    dst = tmp_path / "empty"
    dst.mkdir()
    assert run(capsys, src, dst, "--target", target_dir)[0] == 0
    assert (dst / "model.safetensors").is_file()


@pytest.mark.parametrize("flags", [[], ["--force"]])
def test_non_empty_destination_is_refused_without_overwrite(
    src, tmp_path, target_dir, capsys, flags
):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "config.json").write_text('{"mine": true}\n')
    (dst / "model.safetensors").write_bytes(b"user weights")
    (dst / "notes.txt").write_text("keep me\n")
    before = snapshot(dst)
    code, out, err = run(capsys, src, dst, "--target", target_dir, *flags)
    assert code == 2
    assert f"{dst} is not empty" in err and "--overwrite" in err
    assert "Traceback" not in err
    assert snapshot(dst) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]


def test_overwrite_replaces_the_destination(src, tmp_path, target_dir, capsys):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "config.json").write_text('{"mine": true}\n')
    (dst / "stale.txt").write_text("old\n")
    code, out, err = run(capsys, src, dst, "--target", target_dir, "--overwrite")
    assert code == 0, err
    assert sorted(p.name for p in dst.iterdir()) == [
        "CONVERTED.md",
        "config.json",
        "model.safetensors",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]


@pytest.mark.parametrize("where", ["same", "inside", "contains"])
@pytest.mark.parametrize("flags", [[], ["--overwrite", "--force"]])
def test_destination_overlapping_the_source_is_refused(
    src, tmp_path, target_dir, capsys, where, flags
):
    if where == "contains":  # the source lives inside DST: replacing DST would delete it
        outer = tmp_path / "outer"
        outer.mkdir()
        src = Path(shutil.move(str(src), outer / "drafter"))
        dst, watched = outer, outer
    else:
        dst = src if where == "same" else src / "converted"
        watched = src
    before = snapshot(watched)
    code, out, err = run(capsys, src, dst, "--target", target_dir, *flags)
    assert code == 2, err
    assert "source" in err and "Traceback" not in err
    assert snapshot(watched) == before
    assert not (src / "converted").exists()


def test_destination_that_is_a_file_is_refused(src, tmp_path, target_dir, capsys):
    dst = tmp_path / "file"
    dst.write_text("not a directory\n")
    code, out, err = run(capsys, src, dst, "--target", target_dir, "--overwrite")
    assert code == 2
    assert f"{dst} exists and is not a directory" in err
    assert dst.read_text() == "not a directory\n"


@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_write_leaves_the_destination_as_it_was(
    src, tmp_path, target_dir, monkeypatch, existing
):
    dst = tmp_path / "dst"
    if existing:
        dst.mkdir()
        (dst / "config.json").write_text('{"mine": true}\n')
    before = snapshot(dst) if existing else None

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(convert_module, "write_converted", fail)
    with pytest.raises(OSError):
        convert_module.convert(src, dst, target_dir, overwrite=True)
    assert (snapshot(dst) if existing else dst.exists()) == (before if existing else False)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["dst", "src"] if existing else ["src"])


def test_exit_codes_drafter_errors_1_refusals_2(drafter, tmp_path, target_dir, capsys):
    lossy = drafter("default")[0]  # norm_before_residual: stock SGLang lacks the math
    code, _, err = run(capsys, lossy, tmp_path / "a", "--target", target_dir)
    assert code == 2 and "--force" in err
    broken = tmp_path / "broken"
    shutil.copytree(lossy, broken)
    (broken / "model.safetensors").unlink()
    code, _, err = run(capsys, broken, tmp_path / "b", "--target", target_dir, "--force")
    assert code == 1 and "no *.safetensors weight files" in err
    code, _, err = run(capsys, tmp_path / "nowhere", tmp_path / "c")
    assert code == 1 and f"{tmp_path / 'nowhere'}: no such file or directory" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
