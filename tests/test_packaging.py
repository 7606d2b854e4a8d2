"""What `pip install .` ships: the wheel built from the source tree, checked from its contents.

The other tests import sglang_ext from the source tree, so a file missing from the wheel (the
demo's bundled drafter once shipped only its config.py) passes them all. These build the wheel
the way pip does (setuptools' PEP 517 backend) and run README's first command from it, outside
the source tree. `.ci/run` also installs that wheel with pip and runs `sglang-ext demo`.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tracked_files() -> list[str]:
    """What a clean clone holds (`git ls-files`): the wheel is built from exactly that, so a
    package that `packages.find` picks up by accident (sglang_ext_tools) shows in it."""
    proc = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        pytest.skip(f"not a git checkout ({proc.stderr.strip()})")
    return [name for name in proc.stdout.split("\0") if name and (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in tracked_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, setuptools.build_meta as backend; print(backend.build_wheel(sys.argv[1]))",
            str(out),
        ],
        cwd=src,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


def test_wheel_holds_the_sglang_ext_package_only(wheel):
    """Top-level entries: the package and its dist-info (LICENSE inside it), nothing else:
    not the tooling (sglang_ext_tools), tests or scripts."""
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == {"sglang_ext"}, sorted(top)
    assert len(dist_info) == 1, sorted(top)
    assert f"{dist_info.pop()}/licenses/LICENSE" in names, names


def test_wheel_ships_every_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = sorted(
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "sglang_ext" / "data").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert "sglang_ext/data/demo/drafter/config.json" in data
    missing = [name for name in data if name not in names]
    assert missing == [], f"not in {wheel.name}: {missing}"


def test_wheel_carries_the_license_and_entry_points(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    licenses = [n for n in names if ".dist-info/" in n and n.endswith("LICENSE")]
    assert licenses, names
    text = zipfile.ZipFile(wheel).read(licenses[0]).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a pointer to it
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    parser = configparser.ConfigParser()
    parser.read_string(zipfile.ZipFile(wheel).read(entry_points).decode())
    assert parser["console_scripts"]["sglang-ext"].strip() == "sglang_ext.cli:main"
    assert parser["sglang.srt.plugins"]["sglang_ext"].strip() == "sglang_ext.plugin:register"


def test_demo_runs_from_the_wheel_outside_the_source_tree(wheel, tmp_path):
    """README's first command on a machine without speculators (pip install . does not pull
    it): the demo copies the bundled fixture, which must be in the wheel."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    script = (
        "import sys\n"
        "sys.modules['speculators'] = None  # as after `pip install .`: no speculators\n"
        "import sglang_ext\n"
        f"assert sglang_ext.__file__.startswith({str(site)!r}), sglang_ext.__file__\n"
        "from sglang_ext.cli import main\n"
        "raise SystemExit(main(['demo', '--out', 'demo']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "verdict: OK" in proc.stdout


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    commands = []
    for block in blocks:
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            commands.extend(part.strip() for part in line.split("&&") if part.strip())
    return commands


def test_readme_installs_from_something_that_exists():
    """sglang-ext is not published on PyPI: README installs the source tree, a wheel built
    from it, or a git URL, never a bare name."""
    installs = [c for c in _readme_commands() if re.match(r"(python -m )?pip install\b", c)]
    assert installs
    for command in installs:
        words = shlex.split(command)
        for arg in (w for w in words[words.index("install") + 1 :] if not w.startswith("-")):
            assert arg == "." or arg.startswith(".[") or arg.endswith(".whl") or "git+" in arg, (
                f"README: `{command}` installs {arg!r}, which pip cannot find"
            )


def test_ci_runs_readme_command_one_from_a_non_editable_wheel():
    """README's command 1 is what .ci/run checks: the wheel, installed without -e, then
    `sglang-ext demo` outside the source tree with verdict OK."""
    assert "pip install . && sglang-ext demo" in (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"pip wheel .*--no-deps.* \.$", ci, re.M), ci
    install = re.search(r"^.*pip[ _]install .*\.whl.*$", ci, re.M)
    assert install and " -e " not in install.group(0)
    assert re.search(r"cd \S+ .*sglang-ext demo", ci) and "verdict: OK" in ci


def _ci_pip_install(tmp_path: Path, failures: int) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run .ci/run's own pip_install function with a `python` that fails `failures` times."""
    ci = (ROOT / ".ci" / "run").read_text()
    retry = re.search(r"^retry\(\) \{\n.*?^\}\n", ci, re.M | re.S)
    function = re.search(r"^pip_install\(\) \{.*\}\n", ci, re.M)
    assert retry and function, ".ci/run defines no retry() or pip_install() function"
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        f'[ "$(wc -l < {calls})" -gt {failures} ]\n'
    )
    fake.chmod(0o755)
    script = "set -euo pipefail\nsleep() { :; }\n" + retry.group(0) + function.group(0)
    script += "pip_install sglang==0.5.23\n"
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_ci_pip_install_tries_a_cut_download_again(tmp_path):
    """A network cut (CI of 2026-12-07 lost triton mid-download) costs a retry, not the run."""
    done, calls = _ci_pip_install(tmp_path, failures=2)
    assert done.returncode == 0, done.stderr
    assert len(calls) == 3 and all("install --quiet --resume-retries" in c for c in calls), calls
    assert done.stderr.count("failed (try") == 2


def test_ci_pip_install_gives_up_after_three_tries(tmp_path):
    done, calls = _ci_pip_install(tmp_path, failures=5)
    assert done.returncode != 0 and len(calls) == 3, (done.returncode, calls)
    assert "failed (try 3 of 3)" in done.stderr
