#!/usr/bin/env python3
"""Apply, check or reverse an SGLang patch series (patches/vX.Y.Z) -- standard library only.

    python3 scripts/apply_patches.py check   --series patches/v0.5.23 --sglang-site SITE
    python3 scripts/apply_patches.py apply   --series patches/v0.5.23 --sglang-site SITE
    python3 scripts/apply_patches.py reverse --series patches/v0.5.23 --sglang-site SITE
    python3 scripts/apply_patches.py apply   --series patches/v0.5.23 --source-tree SGLANG_REPO

--sglang-site DIR: the directory that CONTAINS the installed `sglang` package (site-packages,
  `pip install --target DIR`, or `<repo>/python` of an editable install). The series' paths
  `python/sglang/...` land in DIR/sglang/...; files outside python/ (SGLang's tests) are not
  part of an installed package and are skipped, with a note.
--source-tree DIR: an SGLang repository checkout; every path applies (like `patch -p1`).

`check` is a dry run of the whole series, in order, in memory: it fails on any hunk that does
not apply (and says whether the series looks applied already). `apply` runs the same check
first and writes nothing unless every hunk of every patch applies; `reverse` undoes an applied
series. Hunks must match exactly (no fuzz); a hunk may sit at another line than the one it
names if its whole context matches there (reported as an offset). Files are replaced through a
new file and a rename, never rewritten in place, so a tree of hard links to another
installation stays safe. The series' version (the folder name, vX.Y.Z) must equal the
SGLang version found there, or nothing happens.

Exit status: 0 done, 1 a hunk does not apply, 2 usage error or version mismatch.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(Exception):
    """A patch that does not apply; the message names the patch, file and hunk."""


class UsageError(Exception):
    """Bad arguments, an unreadable series, or a version mismatch."""


# ---------------------------------------------------------------------------------------------
# Parsing


@dataclass
class Hunk:
    old_start: int
    old_lines: list[str]
    new_lines: list[str]
    header: str


@dataclass
class FilePatch:
    path: str  # repository-relative, e.g. python/sglang/srt/models/llama_eagle3.py
    new_file: bool = False
    deleted: bool = False
    hunks: list[Hunk] = field(default_factory=list)


@dataclass
class Patch:
    name: str
    subject: str
    files: list[FilePatch]


def _strip_prefix(path: str, prefix: str) -> str:
    if not path.startswith(prefix):
        raise UsageError(f"unexpected path {path!r} (expected the {prefix!r} prefix)")
    return path[len(prefix):]


def parse_patch(path: Path) -> Patch:
    """Parse a `git format-patch` file: headers, then `diff --git` sections with hunks."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    subject = next((ln[len("Subject: "):].strip() for ln in lines
                    if ln.startswith("Subject: ")), path.name)
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("diff --git "):
            i += 1
            continue
        i += 1
        new_file = deleted = False
        old_path = new_path = None
        while i < len(lines) and not lines[i].startswith("@@"):
            header = lines[i].rstrip("\n")
            if header.startswith("diff --git "):
                break
            if header.startswith("new file mode"):
                new_file = True
            elif header.startswith("deleted file mode"):
                deleted = True
            elif header.startswith("--- "):
                old_path = header[4:]
            elif header.startswith("+++ "):
                new_path = header[4:]
            elif header.startswith(("rename ", "copy ", "Binary files", "GIT binary patch")):
                raise UsageError(f"{path.name}: unsupported diff feature: {header}")
            i += 1
        if old_path is None or new_path is None:
            raise UsageError(f"{path.name}: a diff section without ---/+++ lines")
        if new_file or old_path == "/dev/null":
            new_file, target = True, _strip_prefix(new_path, "b/")
        elif deleted or new_path == "/dev/null":
            deleted, target = True, _strip_prefix(old_path, "a/")
        else:
            target = _strip_prefix(new_path, "b/")
            if _strip_prefix(old_path, "a/") != target:
                raise UsageError(f"{path.name}: renames are not supported ({old_path})")
        file_patch = FilePatch(target, new_file=new_file, deleted=deleted)
        while i < len(lines) and lines[i].startswith("@@"):
            match = HUNK_HEADER.match(lines[i])
            if not match:
                raise UsageError(f"{path.name}: bad hunk header {lines[i]!r}")
            old_start = int(match.group(1))
            old_count = int(match.group(2)) if match.group(2) is not None else 1
            new_count = int(match.group(4)) if match.group(4) is not None else 1
            header = lines[i].rstrip("\n")
            i += 1
            old, new = [], []
            while len(old) < old_count or len(new) < new_count:
                if i >= len(lines):
                    raise UsageError(f"{path.name}: {target}: hunk {header} is truncated")
                body = lines[i]
                i += 1
                if body.startswith("\\"):  # "\ No newline at end of file"
                    raise UsageError(f"{path.name}: {target}: files without a final newline "
                                     "are not supported")
                tag, text = body[:1], body[1:]
                if tag == " ":
                    old.append(text)
                    new.append(text)
                elif tag == "-":
                    old.append(text)
                elif tag == "+":
                    new.append(text)
                elif body in ("\n",):  # a context line whose leading space was stripped
                    old.append("\n")
                    new.append("\n")
                else:
                    raise UsageError(f"{path.name}: {target}: bad hunk line {body!r}")
            if len(old) != old_count or len(new) != new_count:
                raise UsageError(f"{path.name}: {target}: hunk {header} line counts differ")
            file_patch.hunks.append(Hunk(old_start, old, new, header))
        files.append(file_patch)
    if not files:
        raise UsageError(f"{path.name}: no diff in this patch")
    return Patch(path.name, subject, files)


def read_series(series: Path) -> list[Patch]:
    if not series.is_dir():
        raise UsageError(f"{series}: no such series folder")
    listing = series / "series"
    if listing.is_file():
        names = [ln.strip() for ln in listing.read_text(encoding="utf-8").splitlines()
                 if ln.strip() and not ln.lstrip().startswith("#")]
    else:
        names = sorted(p.name for p in series.glob("*.patch"))
    if not names:
        raise UsageError(f"{series}: no patches")
    missing = [n for n in names if not (series / n).is_file()]
    if missing:
        raise UsageError(f"{series}: patches listed in `series` are missing: {missing}")
    return [parse_patch(series / name) for name in names]


# ---------------------------------------------------------------------------------------------
# Where the series applies, and its version


@dataclass
class Target:
    root: Path
    mode: str  # "site" | "tree"

    def locate(self, path: str) -> Path | None:
        """The file a series path refers to, or None when it is not part of this target."""
        if self.mode == "tree":
            return self.root / path
        if path.startswith("python/"):
            return self.root / path[len("python/"):]
        return None

    def package(self) -> Path:
        return self.root / "sglang" if self.mode == "site" else self.root / "python" / "sglang"


def series_version(series: Path) -> str:
    match = re.fullmatch(r"v(\d+\.\d+\.\d+(?:\.post\d+)?)", series.resolve().name)
    if not match:
        raise UsageError(f"{series}: the series folder must be named vX.Y.Z (the SGLang version)")
    return match.group(1)


def literal_version(path: Path) -> str | None:
    """The ``__version__`` literal of an sglang ``_version.py`` / ``version.py``, read as text
    (also scripts/make_patches.py's reader: sglang is never imported)."""
    if not path.is_file():
        return None
    match = re.search(
        r"^__version__\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]",
        path.read_text(encoding="utf-8"), re.M)
    return match.group(1) if match else None


def installed_version(target: Target) -> str | None:
    """The SGLang version at the target, read as text (sglang is never imported)."""
    package = target.package()
    for name in ("_version.py", "version.py"):
        found = literal_version(package / name)
        if found:
            return found
    if target.mode == "site":
        for meta in sorted(target.root.glob("sglang-*.dist-info/METADATA")):
            match = re.search(r"^Version:\s*(\S+)", meta.read_text(encoding="utf-8"), re.M)
            if match:
                return match.group(1)
        return None
    if shutil.which("git"):
        described = subprocess.run(
            ["git", "-C", str(target.root), "describe", "--tags", "--exact-match"],
            capture_output=True, text=True, check=False)
        if described.returncode == 0:
            return described.stdout.strip().lstrip("v")
    return None


def check_version(series: Path, target: Target, assume: str | None) -> str:
    wanted = series_version(series)
    if not target.package().is_dir():
        where = "--sglang-site" if target.mode == "site" else "--source-tree"
        raise UsageError(f"{where} {target.root}: no sglang package at {target.package()}")
    found = assume or installed_version(target)
    if found is None:
        raise UsageError(
            f"cannot tell which SGLang version {target.package()} is (no _version.py, "
            "version.py literal, dist-info or git tag); pass --assume-version X.Y.Z")
    if found != wanted:
        raise UsageError(
            f"version mismatch: the series {series} is for SGLang {wanted}, but "
            f"{target.package()} is SGLang {found}. Use patches/v{found}/ if it exists; a "
            "series is only applied to the release it was generated from.")
    return found


# ---------------------------------------------------------------------------------------------
# Applying, in memory


class Overlay:
    """File contents as the series goes: reads fall through to disk until written."""

    def __init__(self, target: Target):
        self.target = target
        self.contents: dict[Path, str | None] = {}  # None: deleted / absent

    def read(self, path: Path) -> str | None:
        if path in self.contents:
            return self.contents[path]
        if not path.exists():
            return None
        return path.read_text(encoding="utf-8")

    def write(self, path: Path, content: str | None) -> None:
        self.contents[path] = content


def _find_block(lines: list[str], block: list[str], expected: int) -> int | None:
    """Where `block` matches exactly, nearest to `expected` (0-based)."""
    if not block:
        return max(0, min(expected, len(lines)))
    last = len(lines) - len(block)
    for distance in range(0, max(expected, last - expected) + 1):
        for at in (expected - distance, expected + distance) if distance else (expected,):
            if 0 <= at <= last and lines[at:at + len(block)] == block:
                return at
    return None


def apply_hunks(text: str, hunks: list[Hunk], reverse: bool, where: str) -> tuple[str, list[str]]:
    lines = text.splitlines(keepends=True)
    notes = []
    delta = 0
    for hunk in hunks:
        old, new = (hunk.new_lines, hunk.old_lines) if reverse else (hunk.old_lines, hunk.new_lines)
        start = hunk.old_start
        if reverse:  # the new-side start of the hunk: the header's +N
            start = int(HUNK_HEADER.match(hunk.header).group(3))
        expected = max(start - 1, 0) + delta if old else start + delta
        at = _find_block(lines, old, expected)
        if at is None:
            raise PatchError(f"{where}: hunk {hunk.header} does not apply (its context and "
                             "removed lines are not in the file)")
        if at != expected:
            notes.append(f"{where}: hunk {hunk.header} applied at offset {at - expected:+d}")
        lines[at:at + len(old)] = new
        delta += len(new) - len(old)
    return "".join(lines), notes


def run_series(patches: list[Patch], target: Target, reverse: bool) -> tuple[Overlay, list[str]]:
    """Apply (or reverse) every patch in order, in memory. Raises PatchError."""
    overlay = Overlay(target)
    notes: list[str] = []
    skipped: set[str] = set()
    order = list(reversed(patches)) if reverse else patches
    for patch in order:
        for file_patch in patch.files:
            where = f"{patch.name}: {file_patch.path}"
            path = target.locate(file_patch.path)
            if path is None:
                skipped.add(file_patch.path)
                continue
            current = overlay.read(path)
            creates = file_patch.new_file and not reverse or file_patch.deleted and reverse
            removes = file_patch.new_file and reverse or file_patch.deleted and not reverse
            if creates:
                if current is not None:
                    raise PatchError(f"{where}: would create the file, but it already exists")
                content, more = apply_hunks("", file_patch.hunks, reverse, where)
                overlay.write(path, content)
            elif removes:
                if current is None:
                    raise PatchError(f"{where}: would remove the file, but it does not exist")
                content, more = apply_hunks(current, file_patch.hunks, reverse, where)
                if content:
                    raise PatchError(f"{where}: the file differs from what the patch removes")
                overlay.write(path, None)
            else:
                if current is None:
                    raise PatchError(f"{where}: file not found ({path})")
                content, more = apply_hunks(current, file_patch.hunks, reverse, where)
                overlay.write(path, content)
            notes.extend(more)
    if skipped:
        notes.append(f"skipped {len(skipped)} file(s) outside python/ (not part of an installed "
                     f"package): {', '.join(sorted(skipped))}")
    return overlay, notes


def write_overlay(overlay: Overlay) -> tuple[int, int, int]:
    """Write every changed file: new content through a temporary file and a rename."""
    created = changed = removed = 0
    for path, content in sorted(overlay.contents.items()):
        existed = path.exists()
        if content is None:
            if existed:
                path.unlink()
                removed += 1
                _prune_empty_dirs(path.parent, overlay.target.root)
            continue
        if existed and path.read_text(encoding="utf-8") == content:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = path.stat().st_mode & 0o7777 if existed else 0o644
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
                handle.write(content)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        if existed:
            changed += 1
        else:
            created += 1
    return created, changed, removed


def _prune_empty_dirs(directory: Path, stop: Path) -> None:
    """Remove directories the series created and emptied (ignoring Python byte-code)."""
    stop = stop.resolve()
    while directory.resolve() != stop and directory.is_dir():
        entries = list(directory.iterdir())
        if any(e.name != "__pycache__" for e in entries):
            return
        for entry in entries:
            shutil.rmtree(entry)
        directory.rmdir()
        directory = directory.parent


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Apply, check (dry run) or reverse an SGLang patch series.")
    parser.add_argument("action", choices=("apply", "check", "reverse"))
    parser.add_argument("--series", required=True, type=Path, help="patches/vX.Y.Z")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--sglang-site", type=Path,
                       help="directory that contains the installed `sglang` package")
    where.add_argument("--source-tree", type=Path, help="an SGLang repository checkout")
    parser.add_argument("--assume-version",
                        help="the SGLang version of a source tree that does not record one")
    args = parser.parse_args(argv)
    target = (Target(args.sglang_site.resolve(), "site") if args.sglang_site
              else Target(args.source_tree.resolve(), "tree"))
    try:
        version = check_version(args.series, target, args.assume_version)
        patches = read_series(args.series)
    except UsageError as exc:
        print(f"apply_patches: {exc}", file=sys.stderr)
        return 2
    reverse = args.action == "reverse"
    label = f"{len(patches)} patch(es) of {args.series} on SGLang {version} at {target.root}"
    try:
        overlay, notes = run_series(patches, target, reverse)
    except PatchError as exc:
        print(f"apply_patches: {args.action} failed, nothing was written: {exc}",
              file=sys.stderr)
        try:
            run_series(patches, target, not reverse)
        except PatchError:
            pass
        else:
            state = "not applied" if reverse else "already applied"
            print(f"apply_patches: the series looks {state} there (its reverse applies "
                  "cleanly)", file=sys.stderr)
        return 1
    for note in notes:
        print(f"apply_patches: note: {note}")
    if args.action == "check":
        print(f"apply_patches: OK: {label} apply cleanly ({len(overlay.contents)} file(s))")
        return 0
    created, changed, removed = write_overlay(overlay)
    verb = "reversed" if reverse else "applied"
    print(f"apply_patches: {verb} {label}: {created} file(s) created, {changed} changed, "
          f"{removed} removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
