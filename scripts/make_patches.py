#!/usr/bin/env python3
"""Work on the upstream SGLang patch series (patches/vX.Y.Z/) as ordinary git commits.

The series is written by hand, as edits of SGLang's own files, in a scratch git repository
of the released sources; this script creates that repository and exports it back:

    # the released wheel's sources (pip download --no-deps) in the upstream layout
    # (python/sglang/...), committed as the base, with the committed series applied by git am
    python scripts/make_patches.py workspace --version 0.5.23 --repo /tmp/sg523
    # ... edit, test (test/registered/...), `git commit` / `git rebase -i` there ...
    python scripts/make_patches.py export --version 0.5.23 --repo /tmp/sg523
    python scripts/make_patches.py export --version 0.5.23 --repo /tmp/sg523 --check
    # per-commit size: changed lines, and additions outside test/
    python scripts/make_patches.py stats --version 0.5.23

`export` runs `git format-patch` on base..HEAD with a fixed author and date (commits
re-stamped, content unchanged), so exporting the same tree twice gives the same bytes.
What the series must do is checked by tests/test_patches.py: each patch applies in order to
the released sources, the size budget, and the behavioural suite (tests/behaviour) on the
patched SGLang without the plugin.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from apply_patches import literal_version  # beside this file: scripts/ is on sys.path

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "patches"
AUTHOR_NAME = "sglang-ext developers"
AUTHOR_EMAIL = "sglang-ext@users.noreply.github.com"
DATE = "2025-12-01T00:00:00+00:00"
WHEEL_CACHE = Path(tempfile.gettempdir()) / "sglang-ext-wheels"


def git(repo: Path, *args: str, **env: str) -> str:
    stamp = {
        "GIT_AUTHOR_NAME": AUTHOR_NAME, "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL, "GIT_AUTHOR_DATE": DATE,
        "GIT_COMMITTER_NAME": AUTHOR_NAME, "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
        "GIT_COMMITTER_DATE": DATE,
    }  # fmt: skip
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "commit.gpgsign=false", *args],
        capture_output=True, text=True, env={**os.environ, **stamp, **env},
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed in {repo}:\n{done.stderr}")
    return done.stdout


def installed_version(pkg_dir: Path) -> str | None:
    """The version of an `sglang` package directory, read from its _version.py."""
    return literal_version(pkg_dir / "_version.py")


def released_sources(version: str, cache: Path = WHEEL_CACHE) -> Path:
    """The `sglang` package directory of the released wheel of `version` (downloaded once
    with pip, no dependencies, and unpacked under `cache`). Raises RuntimeError if pip fails."""
    target = cache / f"sglang-{version}" / "sglang"
    if installed_version(target) == version:
        return target
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if not found:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
             "--quiet", "-d", str(wheels), f"sglang=={version}"],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
        if done.returncode != 0 or not found:
            raise RuntimeError(f"pip download sglang=={version} failed: {done.stderr[-2000:]}")
    staging = Path(tempfile.mkdtemp(dir=cache))
    with zipfile.ZipFile(found[0]) as wheel:
        wheel.extractall(staging, [n for n in wheel.namelist() if n.startswith("sglang/")])
    if target.parent.exists():
        shutil.rmtree(target.parent)
    staging.rename(target.parent)
    return target


def series_files(version: str, patches: Path = PATCHES) -> list[Path]:
    folder = patches / f"v{version}"
    return [folder / name for name in (folder / "series").read_text().split()]


def workspace(version: str, repo: Path, apply_series: bool = True, sources: Path | None = None):
    """`sources`: the released `sglang` package directory (default: the downloaded wheel's)."""
    if repo.exists():
        raise SystemExit(f"{repo} exists; give a new directory")
    shutil.copytree(sources or released_sources(version), repo / "python" / "sglang",
                    ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"SGLang {version} (released wheel sources)")
    git(repo, "tag", "base")
    if apply_series and (PATCHES / f"v{version}" / "series").exists():
        git(repo, "am", "-q", "--keep-non-patch", *map(str, series_files(version)))
    print(f"{repo}: SGLang {version} at tag `base`, series on top; edit, commit, then export")


def export(version: str, repo: Path, out: Path, check: bool) -> int:
    # Re-stamp every commit (content and messages unchanged) so the output is reproducible.
    git(repo, "rebase", "-q", "--force-rebase", "--exec",
        "git commit -q --amend --no-edit --reset-author --no-gpg-sign", "base")
    with tempfile.TemporaryDirectory() as tmp:
        git(repo, "format-patch", "-q", "--no-signature", "--zero-commit", "--numbered",
            "-o", tmp, "base..HEAD")  # fmt: skip
        produced = {p.name: p.read_text() for p in sorted(Path(tmp).glob("*.patch"))}
    produced["series"] = "".join(f"{name}\n" for name in sorted(produced))
    if check:
        current = {p.name: p.read_text() for p in out.iterdir()} if out.is_dir() else {}
        stale = sorted(n for n in set(produced) | set(current) if produced.get(n) != current.get(n))
        for name in stale:
            print(f"{out / name}: differs from {repo}", file=sys.stderr)
        return 1 if stale else 0
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name, text in produced.items():
        (out / name).write_text(text)
    print(f"wrote {len(produced) - 1} patches to {out}")
    return 0


@dataclass(frozen=True)
class PatchStats:
    name: str
    changed: int  # added + removed lines, tests included
    added_outside_tests: int  # added lines outside test/ (blank lines counted)


def patch_stats(patch: Path) -> PatchStats:
    changed = added_outside_tests = 0
    path = ""
    in_hunk = False
    for line in patch.read_text().splitlines():
        if line.startswith("diff --git "):
            path, in_hunk = line.split(" b/", 1)[1], False
        elif line.startswith("@@"):
            in_hunk = True
        elif in_hunk and line.startswith(("+", "-")) and not line.startswith(("+++", "---")):
            changed += 1
            if line.startswith("+") and not path.startswith("test/"):
                added_outside_tests += 1
        elif in_hunk and line == "-- ":  # format-patch signature separator
            in_hunk = False
    return PatchStats(patch.name, changed, added_outside_tests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("workspace", "export", "stats"):
        command = sub.add_parser(name)
        command.add_argument("--version", required=True, help="SGLang version, e.g. 0.5.23")
        if name != "stats":
            command.add_argument("--repo", type=Path, required=True, help="the scratch repository")
    sub.choices["workspace"].add_argument("--no-series", action="store_true",
                                          help="the released sources only")
    sub.choices["export"].add_argument("--check", action="store_true",
                                       help="write nothing; exit 1 if patches/vX.Y.Z differs")
    args = parser.parse_args(argv)
    out = PATCHES / f"v{args.version}"
    if args.command == "workspace":
        workspace(args.version, args.repo.resolve(), not args.no_series)
        return 0
    if args.command == "export":
        return export(args.version, args.repo.resolve(), out, args.check)
    for stats in map(patch_stats, series_files(args.version)):
        print(f"{stats.name}: {stats.changed} changed lines, "
              f"{stats.added_outside_tests} added outside test/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
