"""The upstream patch series (patches/vX.Y.Z), checked as upstream would take it.

1. Shape: each patch applies in order to the released sources of its SGLang version; commit 1
   is at most 80 changed lines with its test; additions outside test/ stay within 1,200 lines
   across the series; the committed files are what scripts/make_patches.py exports from the
   commits (git am, then export --check).
2. scripts/apply_patches.py: check (dry run), apply and reverse on a scratch copy (hard links;
   the installed files are never touched), version mismatch, a failing hunk, a source-tree
   checkout, and the same result as `git am`.
3. Behaviour, the drift guard: the behavioural suite (tests/behaviour) on SGLang with the series
   applied and the plugin excluded, in a subprocess; and the series' own unit tests
   (test/registered/...) on the patched tree, after every commit.

The released sources are the installed `sglang` when it is that version and unpatched, else
the wheel fetched with `pip download --no-deps` (skipped, with the reason, when pip cannot).
Running a suite needs an interpreter with that SGLang's dependencies: this one, or the virtual
environments in SGLANG_EXT_SERIES_VENVS (os.pathsep-separated; default /work/venv0517).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "patches"
APPLY = ROOT / "scripts" / "apply_patches.py"
BEHAVIOUR = ROOT / "tests" / "behaviour"
GPU_DIR = "test/registered/spec/eagle"
GPU_TESTS = (  # what the series adds under GPU_DIR: SGLang-style GPU tests (register_cuda_ci)
    "test_eagle3_acceptance_metrics.py",
    "test_eagle3_fusion_guard.py",
    "test_eagle3_speculators_drafter.py",
)
UNIT_DIR = "test/registered/unit/speculative"
SUMMARY = re.compile(r"^(\d+) passed(?:, \d+ skipped)?(?:, \d+ warnings?)? in [\d.]+s", re.M)
COMMIT_1_MAX_CHANGED = 80
NON_TEST_BUDGET = 1200


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_load("apply_patches")  # make_patches imports its version reader from beside it
make_patches = _load("make_patches")
SERIES = sorted(p.name[1:] for p in PATCHES.glob("v*") if (p / "series").exists())


@dataclass(frozen=True)
class Env:
    python: str
    package: Path  # an installed `sglang` package directory
    version: str


def _is_pristine(package: Path) -> bool:
    return not any((package / "srt" / sub).exists() for sub in (
        "configs/speculators_eagle3.py", "speculative/speculators_eagle3"))


def _environments() -> dict[str, Env]:
    found: dict[str, Env] = {}
    spec = importlib.util.find_spec("sglang")  # locates, does not import
    if spec is not None and spec.origin:
        package = Path(spec.origin).parent
        version = make_patches.installed_version(package)
        if version:
            found[version] = Env(sys.executable, package, version)
    default = "/work/venv0517" if Path("/work/venv0517").is_dir() else ""
    for venv in filter(None, os.environ.get("SGLANG_EXT_SERIES_VENVS", default).split(os.pathsep)):
        python = Path(venv) / "bin" / "python"
        for package in sorted(Path(venv).glob("lib/python3*/site-packages/sglang")):
            version = make_patches.installed_version(package)
            if version and version not in found and python.exists():
                found[version] = Env(str(python), package, version)
    return found


ENVS = _environments()
_SOURCES: dict[str, Path] = {}


def released(version: str) -> Path:
    """The released `sglang` package of `version` (installed copy, or the downloaded wheel)."""
    if version not in _SOURCES:
        env = ENVS.get(version)
        if env is not None and _is_pristine(env.package):
            _SOURCES[version] = env.package
        else:
            try:
                _SOURCES[version] = make_patches.released_sources(version)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                pytest.skip(f"no released sources of SGLang {version}: {exc}")
    return _SOURCES[version]


def env_for(version: str) -> Env:
    if version not in ENVS:
        pytest.skip(f"no SGLang {version} environment here (set SGLANG_EXT_SERIES_VENVS)")
    return ENVS[version]


def series_files(version: str) -> list[Path]:
    return make_patches.series_files(version)


def touched(patches: list[Path]) -> tuple[set[str], set[str]]:
    """(modified, created) repository paths of these patches."""
    modified, created = set(), set()
    for patch in patches:
        text = patch.read_text()
        for path, header in re.findall(r"^diff --git a/(\S+) b/\S+\n(.*)$", text, re.M):
            (created if header.startswith("new file mode") else modified).add(path)
    return modified - created, created


def link_tree(source: Path, target: Path) -> None:
    """A copy of `source` made of hard links (byte-code left out): cheap, and safe because
    apply_patches replaces files instead of writing into them."""
    for directory, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = Path(directory).relative_to(source)
        (target / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            try:
                os.link(Path(directory) / name, target / rel / name)
            except OSError:  # another file system: copy
                shutil.copy2(Path(directory) / name, target / rel / name)


def apply(action: str, series: Path, *where: str):
    return subprocess.run(
        [sys.executable, str(APPLY), action, "--series", str(series), *where],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def partial_series(version: str, count: int, folder: Path) -> Path:
    """The first `count` patches of a series, as a series folder of their own."""
    target = folder / f"v{version}"
    target.mkdir(parents=True)
    patches = series_files(version)[:count]
    for patch in patches:
        shutil.copy(patch, target / patch.name)
    (target / "series").write_text("".join(f"{p.name}\n" for p in patches))
    return target


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SGLANG_EXT_", "PYTEST_")) and k not in ("PYTHONPATH",
                                                                        "SGLANG_PLUGINS")}
    env.update(extra)
    return env


# -- 1. shape ---------------------------------------------------------------------------------


def test_every_series_folder_has_the_supported_layout():
    assert SERIES, "no patch series in patches/"
    for version in SERIES:
        folder = PATCHES / f"v{version}"
        listed = (folder / "series").read_text().split()
        assert listed == sorted(p.name for p in folder.glob("*.patch"))
        for n, patch in enumerate(series_files(version), start=1):
            text = patch.read_text()
            assert text.startswith("From ") and "\nFrom: " in text and "\nDate: " in text
            assert re.search(rf"^Subject: \[PATCH {n}/{len(listed)}\] \[Spec\] ", text, re.M)


@pytest.mark.parametrize("version", SERIES)
def test_each_patch_applies_in_order_to_the_released_sources(version, tmp_path):
    sources = released(version)
    for count in range(1, len(series_files(version)) + 1):
        site = tmp_path / f"site-{count}"
        link_tree(sources, site / "sglang")
        series = partial_series(version, count, tmp_path / f"series-{count}")
        result = apply("apply", series, "--sglang-site", str(site))
        assert result.returncode == 0, f"patch {count}: {result.stdout}{result.stderr}"
        modified, created = touched(series_files(version)[:count])
        for rel in sorted(modified | created):  # the patched sources still compile
            if rel.startswith("python/") and rel.endswith(".py"):
                path = site / rel.removeprefix("python/")
                compile(path.read_text(), str(path), "exec")


@pytest.mark.parametrize("version", SERIES)
def test_commit_1_and_the_series_stay_within_the_size_budget(version):
    stats = [make_patches.patch_stats(p) for p in series_files(version)]
    assert stats[0].changed <= COMMIT_1_MAX_CHANGED, stats[0]
    assert sum(s.added_outside_tests for s in stats) <= NON_TEST_BUDGET, stats


def test_the_committed_series_is_what_make_patches_exports(tmp_path):
    """git am the series onto the released sources, export again: the same bytes."""
    version = SERIES[-1]
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    repo = tmp_path / "repo"
    make_patches.workspace(version, repo, sources=released(version))
    assert make_patches.export(version, repo, PATCHES / f"v{version}", check=True) == 0


# -- 2. apply_patches.py ------------------------------------------------------------------------


@pytest.mark.parametrize("version", SERIES)
def test_check_apply_reverse_on_a_scratch_copy(version, tmp_path):
    sources = released(version)
    site = tmp_path / "site"
    link_tree(sources, site / "sglang")
    modified, created = touched(series_files(version))
    installed = {rel: digest(sources / rel.removeprefix("python/sglang/"))
                 for rel in modified if rel.startswith("python/")}
    where = ("--sglang-site", str(site))
    series = PATCHES / f"v{version}"

    result = apply("check", series, *where)
    assert result.returncode == 0, result.stderr
    assert "apply cleanly" in result.stdout and "skipped" in result.stdout
    assert all(digest(site / rel.removeprefix("python/")) == h for rel, h in installed.items())

    result = apply("apply", series, *where)
    assert result.returncode == 0, result.stderr
    for rel in installed:
        assert digest(site / rel.removeprefix("python/")) != installed[rel], f"{rel} unpatched"
    for rel in created:
        assert (site / rel.removeprefix("python/")).is_file() == rel.startswith("python/")
    assert not (site / "test").exists()

    again = apply("check", series, *where)
    assert again.returncode == 1 and "looks already applied" in again.stderr

    result = apply("reverse", series, *where)
    assert result.returncode == 0, result.stderr
    for rel, original in installed.items():
        assert digest(site / rel.removeprefix("python/")) == original
    for rel in created:
        assert not (site / rel.removeprefix("python/")).exists(), rel
    again = apply("reverse", series, *where)
    assert again.returncode == 1 and "looks not applied" in again.stderr

    for rel, original in installed.items():  # the source copy was never touched
        assert digest(sources / rel.removeprefix("python/sglang/")) == original


def test_a_version_mismatch_is_refused(tmp_path):
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "_version.py").write_text("__version__ = version = '0.5.16'\n")
    result = apply("apply", PATCHES / f"v{SERIES[-1]}", "--sglang-site", str(site))
    assert result.returncode == 2
    assert f"is for SGLang {SERIES[-1]}, but" in result.stderr and "0.5.16" in result.stderr
    assert sorted(p.name for p in (site / "sglang").iterdir()) == ["_version.py"]
    bad_name = tmp_path / "series-latest"
    shutil.copytree(PATCHES / f"v{SERIES[-1]}", bad_name)
    result = apply("check", bad_name, "--sglang-site", str(site))
    assert result.returncode == 2 and "must be named vX.Y.Z" in result.stderr


def test_a_hunk_that_does_not_apply_writes_nothing(tmp_path):
    version = SERIES[-1]
    sources = released(version)
    site = tmp_path / "site"
    link_tree(sources, site / "sglang")
    last = series_files(version)[-1]
    text = last.read_text()
    # the first context line of the last patch's first hunk on an existing file
    path, hunk = re.search(r"^diff --git a/(python/\S+) b/\S+\nindex .*\n--- a/.*\n\+\+\+ .*\n"
                           r"(@@[^\n]*\n(?:[ +-][^\n]*\n)+)", text, re.M).groups()
    context = next(line[1:] for line in hunk.splitlines()[1:] if line.startswith(" ") and
                   line.strip())
    target = site / path.removeprefix("python/")
    original = target.read_text()
    target.unlink()  # break the link before editing the copy
    target.write_text(original.replace(context, context + "  # edited", 1))
    result = apply("apply", PATCHES / f"v{version}", "--sglang-site", str(site))
    assert result.returncode == 1
    assert last.name[:5] in result.stderr and f"{Path(path).name}: hunk" in result.stderr
    assert "nothing was written" in result.stderr
    _, created = touched(series_files(version))
    assert not any((site / rel.removeprefix("python/")).exists() for rel in created)


@pytest.mark.parametrize("version", SERIES)
def test_source_tree_mode_matches_git_am(version, tmp_path):
    sources = released(version)
    modified, created = touched(series_files(version))
    tree = tmp_path / "tree"
    for rel in modified:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(sources / rel.removeprefix("python/sglang/"), tree / rel)
    (tree / "python/sglang/_version.py").write_text(f"__version__ = version = '{version}'\n")
    result = apply("apply", PATCHES / f"v{version}", "--source-tree", str(tree))
    assert result.returncode == 0, result.stderr
    assert all((tree / rel).is_file() for rel in created)
    if shutil.which("git") is None:
        pytest.skip("git not installed: the git am cross-check is skipped")
    repo = tmp_path / "repo"
    for rel in modified:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(sources / rel.removeprefix("python/sglang/"), repo / rel)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
           "-c", "commit.gpgsign=false"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"],
                    ["am", "-q", "--keep-non-patch", *map(str, series_files(version))]):
        done = subprocess.run(git + command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    count = len(series_files(version))
    subjects = subprocess.run(git + ["log", "--format=%s", f"-{count}"], capture_output=True,
                              text=True, check=True).stdout.splitlines()
    assert all(s.startswith("[Spec] ") for s in subjects), subjects
    for rel in modified | created:
        assert (repo / rel).read_bytes() == (tree / rel).read_bytes(), rel


# -- 3. the behaviour, with the series and without the plugin ---------------------------------


def run_pytest(env: Env, args: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [env.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::Warning",
         *args],
        cwd=cwd, capture_output=True, text=True, timeout=900, env=clean_env(**extra),
    )  # fmt: skip


def assert_all_passed(result: subprocess.CompletedProcess, minimum: int) -> int:
    output = result.stdout + result.stderr
    match = SUMMARY.search(output)
    assert result.returncode == 0 and match, output[-6000:]
    passed = int(match.group(1))
    assert passed >= minimum, output[-2000:]
    return passed


@pytest.mark.parametrize("version", SERIES)
def test_behaviour_suite_passes_on_patched_sglang_without_the_plugin(version, tmp_path):
    env = env_for(version)
    site = tmp_path / "site"
    link_tree(released(version), site / "sglang")
    result = apply("apply", PATCHES / f"v{version}", "--sglang-site", str(site))
    assert result.returncode == 0, result.stdout + result.stderr
    result = run_pytest(
        env, [str(BEHAVIOUR)], ROOT,
        PYTHONPATH=str(site), SGLANG_PLUGINS="__none__", SGLANG_EXT_BEHAVIOUR="patched",
        SGLANG_EXT_PATCHED_SITE=str(site),
    )  # fmt: skip
    assert f"EAGLE-3 behavioural suite: patched mode, sglang from {site}" in result.stdout
    assert_all_passed(result, minimum=55)


@pytest.mark.parametrize("version", SERIES)
def test_each_commit_passes_its_own_unit_tests(version, tmp_path):
    """After each commit, the tests the series has added so far (test/registered/...), run as
    SGLang would run them, on a source tree with that much of the series applied. A
    `sglang_ext` that refuses to import shadows the installed plugin: the series needs
    nothing from it."""
    env = env_for(version)
    poison = tmp_path / "no-plugin" / "sglang_ext"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('the series needs no sglang_ext')\n")
    patches = series_files(version)
    counts = range(1, len(patches) + 1) if version == SERIES[-1] else [len(patches)]
    for count in counts:
        tree = tmp_path / f"tree-{count}"
        link_tree(released(version), tree / "python" / "sglang")
        series = partial_series(version, count, tmp_path / f"series-{count}")
        result = apply("apply", series, "--source-tree", str(tree))
        assert result.returncode == 0, result.stderr
        _, created = touched(patches[count - 1 : count])
        unit_tests = sorted(rel for rel in created if rel.startswith(UNIT_DIR)
                            and Path(rel).name.startswith("test_"))
        assert unit_tests, f"{patches[count - 1].name} adds no unit test under {UNIT_DIR}"
        result = run_pytest(
            env, [UNIT_DIR], tree,
            PYTHONPATH=os.pathsep.join([str(tmp_path / "no-plugin"), str(tree / "python")]),
            SGLANG_PLUGINS="__none__",
        )  # fmt: skip
        assert_all_passed(result, minimum=count)
    gpu_tests = sorted((tree / GPU_DIR).glob("test_eagle3_*.py"))
    assert [t.name for t in gpu_tests] == sorted(GPU_TESTS)
    _, created = touched(patches)
    assert {f"{GPU_DIR}/{name}" for name in GPU_TESTS} <= created, "the series creates them"
    for gpu_test in gpu_tests:  # read from the patched tree: the series is their one copy
        text = gpu_test.read_text()
        compile(text, str(gpu_test), "exec")
        assert "register_cuda_ci(" in text and 'if __name__ == "__main__":' in text
