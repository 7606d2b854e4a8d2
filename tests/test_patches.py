"""The upstream patch series (patches/vX.Y.Z) against the plugin it is generated from.

1. Drift guard: regenerating each series from the plugin and the released SGLang sources
   (scripts/make_patches.py) reproduces the committed files byte for byte.
2. scripts/apply_patches.py: check (dry run), apply and reverse on a scratch copy of the
   installed SGLang (hard links; the installed files are never touched), version mismatch,
   a source-tree checkout, and the same result as `git am`.
3. The behavioural suite (tests/behaviour) in patched mode: SGLang with the series applied,
   the plugin excluded, in a subprocess; and the series' own unit tests on the patched tree.

Series whose SGLang is not installed here are checked where an environment with it is found:
the interpreter running this file, or the virtual environments in SGLANG_EXT_SERIES_VENVS
(os.pathsep-separated; default /work/venv0517 when it exists).
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
UNIT_DIR = "test/registered/unit/speculative/speculators_eagle3"
SUMMARY = re.compile(r"^(\d+) passed(?:, \d+ warnings?)? in [\d.]+s", re.M)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


make_patches = _load("make_patches")


@dataclass(frozen=True)
class Env:
    python: str
    package: Path  # the installed `sglang` package directory
    version: str


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
SERIES = sorted(p.name[1:] for p in PATCHES.glob("v*") if any(p.glob("*.patch")))


def env_for(version: str) -> Env:
    if version not in ENVS:
        pytest.skip(f"no SGLang {version} here (set SGLANG_EXT_SERIES_VENVS to a venv with it)")
    return ENVS[version]


def series_files(version: str) -> list[Path]:
    return sorted((PATCHES / f"v{version}").glob("*.patch"))


def touched(version: str) -> tuple[set[str], set[str]]:
    """(modified, created) repository paths of a series."""
    modified, created = set(), set()
    for patch in series_files(version):
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


def apply(action: str, version: str, *where: str, series: str | None = None):
    return subprocess.run(
        [sys.executable, str(APPLY), action, "--series", series or str(PATCHES / f"v{version}"),
         *where],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SGLANG_EXT_", "PYTEST_")) and k not in ("PYTHONPATH",
                                                                        "SGLANG_PLUGINS")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def patched_sites(tmp_path_factory):
    """version -> a scratch site-packages holding a patched copy of that SGLang."""
    sites: dict[str, Path] = {}

    def get(version: str) -> Path:
        if version not in sites:
            env = env_for(version)
            site = tmp_path_factory.mktemp(f"site-{version}")
            link_tree(env.package, site / "sglang")
            result = apply("apply", version, "--sglang-site", str(site))
            assert result.returncode == 0, result.stdout + result.stderr
            sites[version] = site
        return sites[version]

    return get


# -- 1. drift guard ---------------------------------------------------------------------------


def test_every_series_folder_has_the_supported_layout():
    assert SERIES, "no patch series in patches/"
    for version in SERIES:
        folder = PATCHES / f"v{version}"
        listed = (folder / "series").read_text().split()
        assert listed == [p.name for p in series_files(version)]
        for patch in series_files(version):
            text = patch.read_text()
            assert text.startswith("From ") and "\nFrom: " in text and "\nDate: " in text
            assert re.search(r"^Subject: \[PATCH \d+/\d+\] ", text, re.M)
            assert f"Base: SGLang {version} (released wheel sources)" in text


@pytest.mark.parametrize("version", SERIES)
def test_series_is_reproducible_from_the_plugin(version):
    """Change sglang_ext (or the behavioural tests), and this fails until
    `python scripts/make_patches.py --sglang-src SITE/sglang --version V --out patches/vV`
    is run again (and the hand-ported edits reviewed)."""
    env = env_for(version)
    files = make_patches.generate(env.package, version)
    problems = make_patches.compare_series(PATCHES / f"v{version}", files)
    assert not problems, "\n".join(problems)


def test_a_missing_anchor_stops_the_generator(tmp_path):
    env = env_for("0.5.23")
    fake = tmp_path / "sglang"
    for rel in touched("0.5.23")[0]:
        source = env.package / rel.removeprefix("python/sglang/")
        (fake / source.relative_to(env.package)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, fake / source.relative_to(env.package))
    (fake / "_version.py").write_text("__version__ = version = '0.5.23'\n")
    make_patches.generate(fake, "0.5.23")  # the copy carries every anchor
    llama = fake / "srt/models/llama_eagle3.py"
    llama.write_text(llama.read_text().replace("if hidden_states.shape[-1] != embeds.shape[-1]",
                                               "if hidden_states.size(-1) != embeds.size(-1)"))
    with pytest.raises(make_patches.GenerationError, match="llama_eagle3.py: anchor found 0 times"):
        make_patches.generate(fake, "0.5.23")
    with pytest.raises(make_patches.GenerationError, match="is SGLang 0.5.23, not 0.5.17"):
        make_patches.generate(fake, "0.5.17")


def test_plugin_imports_without_an_in_tree_home_stop_the_generator():
    source = "from sglang_ext.compat import server_args\nfrom sglang_ext.fusion import X\n"
    with pytest.raises(make_patches.GenerationError, match="sglang_ext.compat"):
        make_patches.rewrite_imports(source, make_patches.IMPORT_HOMES, "fusion.py")
    rewritten = make_patches.rewrite_imports(source.splitlines(True)[1],
                                             make_patches.IMPORT_HOMES, "x.py")
    assert rewritten == "from sglang.srt.speculative.speculators_eagle3.fusion import X\n"


# -- 2. apply_patches.py ------------------------------------------------------------------------


@pytest.mark.parametrize("version", SERIES)
def test_check_apply_reverse_on_a_scratch_copy(version, tmp_path):
    env = env_for(version)
    site = tmp_path / "site"
    link_tree(env.package, site / "sglang")
    modified, created = touched(version)
    installed = {rel: digest(env.package / rel.removeprefix("python/sglang/"))
                 for rel in modified if rel.startswith("python/")}
    where = ("--sglang-site", str(site))

    result = apply("check", version, *where)
    assert result.returncode == 0, result.stderr
    assert "apply cleanly" in result.stdout and "skipped" in result.stdout
    assert all(digest(site / rel.removeprefix("python/")) == h for rel, h in installed.items())

    result = apply("apply", version, *where)
    assert result.returncode == 0, result.stderr
    for rel in installed:
        assert digest(site / rel.removeprefix("python/")) != installed[rel], f"{rel} unpatched"
    for rel in created:
        assert (site / rel.removeprefix("python/")).is_file() == rel.startswith("python/")
    assert not (site / "test").exists()

    again = apply("check", version, *where)
    assert again.returncode == 1 and "looks already applied" in again.stderr

    result = apply("reverse", version, *where)
    assert result.returncode == 0, result.stderr
    for rel, original in installed.items():
        assert digest(site / rel.removeprefix("python/")) == original
    assert not (site / "sglang/srt/speculative/speculators_eagle3").exists()
    again = apply("reverse", version, *where)
    assert again.returncode == 1 and "looks not applied" in again.stderr

    # the installed SGLang was never touched
    for rel, original in installed.items():
        assert digest(env.package / rel.removeprefix("python/sglang/")) == original


def test_a_version_mismatch_is_refused(tmp_path):
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "_version.py").write_text("__version__ = version = '0.5.16'\n")
    result = apply("apply", SERIES[-1], "--sglang-site", str(site))
    assert result.returncode == 2
    assert f"is for SGLang {SERIES[-1]}, but" in result.stderr and "0.5.16" in result.stderr
    assert sorted(p.name for p in (site / "sglang").iterdir()) == ["_version.py"]
    bad_name = tmp_path / "series-latest"
    shutil.copytree(PATCHES / f"v{SERIES[-1]}", bad_name)
    result = apply("check", SERIES[-1], "--sglang-site", str(site), series=str(bad_name))
    assert result.returncode == 2 and "must be named vX.Y.Z" in result.stderr


def test_a_hunk_that_does_not_apply_writes_nothing(tmp_path):
    version = SERIES[-1]
    env = env_for(version)
    site = tmp_path / "site"
    link_tree(env.package, site / "sglang")
    tokenizer = site / "sglang/srt/managers/tokenizer_manager.py"
    tokenizer.unlink()  # break the link before editing the copy
    shutil.copy(env.package / "srt/managers/tokenizer_manager.py", tokenizer)
    tokenizer.write_text(tokenizer.read_text().replace("    def _request_has_grammar(",
                                                       "    def _request_has_a_grammar("))
    result = apply("apply", version, "--sglang-site", str(site))
    assert result.returncode == 1
    assert "0004-" in result.stderr and "tokenizer_manager.py: hunk" in result.stderr
    assert "nothing was written" in result.stderr
    assert not (site / "sglang/srt/speculative/speculators_eagle3").exists()


def test_source_tree_mode_matches_git_am(tmp_path):
    version = SERIES[-1]
    env = env_for(version)
    modified, created = touched(version)
    tree = tmp_path / "tree"
    for rel in modified:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(env.package / rel.removeprefix("python/sglang/"), tree / rel)
    (tree / "python/sglang/_version.py").write_text(f"__version__ = version = '{version}'\n")
    result = apply("apply", version, "--source-tree", str(tree))
    assert result.returncode == 0, result.stderr
    assert all((tree / rel).is_file() for rel in created)
    if shutil.which("git") is None:
        pytest.skip("git not installed: the git am cross-check is skipped")
    repo = tmp_path / "repo"
    for rel in modified:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(env.package / rel.removeprefix("python/sglang/"), repo / rel)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
           "-c", "commit.gpgsign=false"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"],
                    ["am", "-q", "--keep-non-patch", *map(str, series_files(version))]):
        done = subprocess.run(git + command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    subjects = subprocess.run(git + ["log", "--format=%s", "-4"], capture_output=True,
                              text=True, check=True).stdout.splitlines()
    assert all(s.startswith("[Spec] EAGLE-3: ") for s in subjects), subjects
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
def test_behaviour_suite_passes_on_patched_sglang_without_the_plugin(version, patched_sites):
    env = env_for(version)
    site = patched_sites(version)
    result = run_pytest(
        env, [str(BEHAVIOUR)], ROOT,
        PYTHONPATH=str(site), SGLANG_PLUGINS="__none__", SGLANG_EXT_BEHAVIOUR="patched",
        SGLANG_EXT_PATCHED_SITE=str(site),
    )  # fmt: skip
    assert f"EAGLE-3 behavioural suite: patched mode, sglang from {site}" in result.stdout
    assert_all_passed(result, minimum=60)


@pytest.mark.parametrize("version", SERIES)
def test_the_series_own_unit_tests_pass_on_the_patched_tree(version, tmp_path):
    """The tests the series adds under test/registered/, run as SGLang would run them, on a
    source tree with the series applied. A `sglang_ext` that refuses to import shadows the
    installed plugin: the series needs nothing from it."""
    env = env_for(version)
    tree = tmp_path / "tree"
    link_tree(env.package, tree / "python" / "sglang")
    result = apply("apply", version, "--source-tree", str(tree))
    assert result.returncode == 0, result.stderr
    poison = tmp_path / "no-plugin" / "sglang_ext"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('the series needs no sglang_ext')\n")
    result = run_pytest(
        env, [UNIT_DIR], tree,
        PYTHONPATH=os.pathsep.join([str(tmp_path / "no-plugin"), str(tree / "python")]),
        SGLANG_PLUGINS="__none__",
    )  # fmt: skip
    assert_all_passed(result, minimum=60)
    for gpu_test in (tree / "test/registered/spec/eagle").glob("test_eagle3_*.py"):
        text = gpu_test.read_text()
        compile(text, str(gpu_test), "exec")
        assert "register_cuda_ci(" in text and 'if __name__ == "__main__":' in text
