"""`sglang-ext doctor` answers every input with a report, never a traceback: `--json` always
prints JSON, exit 0 for verdict OK, 1 for ERROR, 2 for a usage error (README "Exit codes")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sglang_ext.cli import doctor, main
from sglang_ext.demo import BUNDLED

BAD_VALUES = [None, 0, -1, "x", [], {}, [1], True, 1.5, [[1]], ["x", 1]]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["doctor", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def demo(tmp_path) -> tuple[Path, Path]:
    shutil.copytree(BUNDLED, tmp_path / "demo")
    return tmp_path / "demo" / "drafter", tmp_path / "demo" / "target"


def bad_inputs(tmp_path: Path) -> dict[str, Path]:
    binary = tmp_path / "model.safetensors"
    binary.write_bytes(bytes(range(256)))
    empty = tmp_path / "empty"
    empty.mkdir()
    listing = tmp_path / "list" / "config.json"
    listing.parent.mkdir()
    listing.write_text("[1, 2]\n")
    return {
        "binary file": binary,
        "empty directory": empty,
        "missing path": tmp_path / "nowhere",
        "config.json is a list": listing.parent,
    }


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("role", ["drafter", "target"])
def test_unusable_paths_are_errors_not_tracebacks(demo, tmp_path, capsys, as_json, role):
    drafter, target = demo
    for label, path in bad_inputs(tmp_path).items():
        args = [path, "--target", target] if role == "drafter" else [drafter, "--target", path]
        code, out, err = run(capsys, *args, *(["--json"] if as_json else []))
        assert code == 1, (label, out, err)
        assert "Traceback" not in err, (label, err)
        if as_json:
            report = json.loads(out)
            assert report["verdict"] == "ERROR"
            assert any(str(path) in e for e in report["errors"]), (label, report["errors"])
        else:
            assert "verdict: ERROR" in out and str(path) in out, (label, out)


def test_usage_errors_with_json_print_json_and_exit_2(capsys):
    code, out, err = run(capsys, "--json")
    assert code == 2
    report = json.loads(out)
    assert report["verdict"] == "ERROR"
    assert "the following arguments are required: drafter" in report["errors"][0]
    code, out, err = run(capsys, "a", "--json", "--no-such-flag")
    assert code == 2 and "unrecognized arguments: --no-such-flag" in json.loads(out)["errors"][0]
    code, out, err = run(capsys)  # without --json: argparse's usage text
    assert code == 2 and out == "" and "required: drafter" in err


def test_an_internal_failure_still_answers_in_json(demo, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(doctor, "diagnose", broken)
    code, out, err = run(capsys, demo[0], "--json")
    assert code == 1
    report = json.loads(out)
    assert report["verdict"] == "ERROR"
    assert (
        "RuntimeError: boom" in report["errors"][0] and "bug in sglang-ext" in report["errors"][0]
    )


def test_without_target_the_text_report_says_what_is_unresolved(demo, capsys):
    code, out, err = run(capsys, demo[0])
    assert code == 0, out
    aux = next(line for line in out.splitlines() if line.startswith("aux:"))
    assert "None" not in aux and "-," not in aux
    assert "checkpoint ids [1, 3, 4]" in aux and "no --target" in aux
    code, out, err = run(capsys, demo[0], "--target", demo[1])
    assert "target captures [1, 3, 4] (SGLang ids [0, 2, 3], rule plus_one)" in out


def _paths(config: dict, prefix=()):
    for key, value in config.items():
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _paths(value, (*prefix, key))


def _set(config: dict, path: tuple, value) -> dict:
    config = json.loads(json.dumps(config))
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return config


@pytest.mark.parametrize("which", ["speculators drafter", "sglang drafter", "target"])
def test_every_config_field_with_a_wrong_type_is_reported_not_raised(demo, tmp_path, which):
    """Each field of the config, set to each of a range of wrong-typed values: doctor answers
    with a Diagnosis (the value may be fine, then OK) and never raises."""
    drafter, target = demo
    if which == "sglang drafter":
        from sglang_ext.cli.convert import convert

        convert(drafter, tmp_path / "sglang", target, force=True)
        drafter = tmp_path / "sglang"
        config = json.loads((drafter / "config.json").read_text())
        config.update(num_aux_hidden_states=3, target_hidden_size=32)  # fields convert omits
        (drafter / "config.json").write_text(json.dumps(config))
    edited = target if which == "target" else drafter
    config = json.loads((edited / "config.json").read_text())
    failures = []
    for path in _paths(config):
        for value in BAD_VALUES:
            (edited / "config.json").write_text(json.dumps(_set(config, path, value)))
            try:
                doctor.format_text(doctor.diagnose(drafter, target))
                doctor.format_text(doctor.diagnose(drafter))
            except Exception as exc:  # noqa: BLE001 - collected, reported below
                failures.append(f"{'.'.join(path)}={value!r}: {type(exc).__name__}: {exc}")
    assert failures == []
