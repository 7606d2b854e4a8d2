#!/usr/bin/env python
"""Carry a file larger than one device call allows (64 MiB with the working tree) to the GPU
node in parts, and put it together there, checked.

    python node/ferry.py split FILE [--out .ferry] [--part-bytes 52000000]
        -> .ferry/FILE_NAME/part-00 .. part-NN and manifest.json (name, size, sha256 of the
           whole file and of each part). One part per device call, back to back (the node
           keeps /tmp while warm): carry .ferry/FILE_NAME/part-KK and its manifest.json.
    python node/ferry.py join MANIFEST --parts DIR --out DEST_DIR [--lock LOCK]
        -> DEST_DIR/FILE_NAME, written under a temporary name and renamed only once every
           part and the whole file match their sha256 (and, with --lock, the lock's sha256
           or upstream-sha256 for that filename: a stripped wheel's lock line records the
           upstream file's hash). An existing different file is never replaced.
    python node/ferry.py status MANIFEST --parts DIR
    python node/ferry.py collect NAME [--from /work/.device] [--out .ferry]
        -> OUT/NAME/: the parts of the bundle NAME (and its newest manifest) that device calls
           brought back, one folder per call under --from, each part checked by sha256; the
           way back, for what the node builds (fixtures.cache bundles). Exit 1 while parts
           are missing.

Stdlib only: it runs on the air-gapped node before anything is installed. Exit codes: 0 ok,
1 a check failed (named: file, part, expected, found), 2 usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

# 10^6-byte MB, like wheelhouse.py's chunks. 60 MB until 2026-12-02, when the tree (7.5 MB in
# 4 KiB blocks) had grown past what 60 MB parts left room for and every call was refused;
# 52 MB left ~7 MB for the tree to grow (tests/test_ferry.py holds the current tree to it),
# and by 2026-12-03 the tree was 13.5 MB, inside the test's 2 MB margin; 50 MB (34 parts of
# the 0.5.23 set, one call more) left ~3.6 MB. On 2026-12-06 the tree was 15.45 MB, over
# that margin again (the GPU suite's server-log tarballs are ~5 MB of it); 45 MB (38 parts,
# four calls more, ~16 s of device time) leaves room to 20.5 MB. On 2026-12-07 (twenty-third
# session) it was 20.5 MB with that session's shared-stream results (their traces cut to the MoE
# kernels, `moe_overlap --around`); 40 MB (43 parts, five calls more, ~20 s) leaves room to
# 25.0 MB.
PART_BYTES = 40_000_000
CHUNK = 1 << 20
# What one device call may carry: the working tree that travels plus the carried paths.
CALL_LIMIT_BYTES = 64 * 2**20
MANIFEST_MARGIN = 64 * 2**10  # the manifest.json that travels with each part
# The device counts each file in whole 4 KiB blocks (as du does): 261 tracked files of 6.94 MB
# came to 7.54 MB, and 60 MB parts beside them were refused although the byte sum fitted.
BLOCK = 4096


class FerryError(Exception):
    """A check failed; the message names the file or part, what was expected and found."""


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in blocks (wheelhouse.py uses this one too)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def travelling_tree_bytes(root: Path) -> int | None:
    """Bytes of what a device call sends of the checkout at ``root``: tracked files and
    untracked ones git does not ignore, each in whole ``BLOCK``s (None outside a git
    checkout)."""
    import subprocess

    try:
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"],
            capture_output=True, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    names = {name for name in listed.decode().split("\0") if name}
    sizes = ((root / name).stat().st_size for name in names if (root / name).is_file())
    return sum(-(-size // BLOCK) * BLOCK for size in sizes)


def check_fits_one_call(part_bytes: int, tree_bytes: int | None) -> None:
    """A part travels beside the working tree: both together must stay within one call's
    limit, or every ferry-recv call is refused (the 2026-12-01 run: a 3.16 MB tree and
    64,000,000-byte parts came to 67.16 MB, over 64 MiB)."""
    if tree_bytes is None:
        return
    room = CALL_LIMIT_BYTES - tree_bytes - MANIFEST_MARGIN
    if part_bytes > room:
        raise FerryError(
            f"--part-bytes {part_bytes:,} + the working tree's {tree_bytes:,} bytes + the "
            f"manifest exceed one device call's {CALL_LIMIT_BYTES:,} bytes: use "
            f"--part-bytes {room:,} or less, or make the tree smaller"
        )


def split(path: Path, out: Path, part_bytes: int = PART_BYTES) -> Path:
    if not path.is_file():
        raise FerryError(f"{path}: not a file")
    if part_bytes <= 0:
        raise FerryError(f"--part-bytes must be positive, found {part_bytes}")
    folder = out / path.name
    if folder.exists() and any(folder.iterdir()):
        raise FerryError(f"{folder}: already holds parts; remove it to split again")
    folder.mkdir(parents=True, exist_ok=True)
    whole, parts, index = hashlib.sha256(), [], 0
    with path.open("rb") as source:
        while True:
            data = source.read(part_bytes)
            if not data:
                break
            whole.update(data)
            name = f"part-{index:02d}"
            (folder / name).write_bytes(data)
            parts.append(
                {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            )
            index += 1
    manifest = {
        "file": path.name,
        "size": path.stat().st_size,
        "sha256": whole.hexdigest(),
        "part_bytes": part_bytes,
        "parts": parts,
    }
    target = folder / "manifest.json"
    target.write_text(json.dumps(manifest, indent=2) + "\n")
    return target


def read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text())
        for key in ("file", "size", "sha256", "parts"):
            manifest[key]  # noqa: B018 - presence check
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FerryError(f"{path}: not a ferry manifest ({exc})") from None
    if Path(manifest["file"]).name != manifest["file"]:
        raise FerryError(f"{path}: file name {manifest['file']!r} must not contain a path")
    return manifest


def missing_parts(manifest: dict, parts_dir: Path) -> list[str]:
    return [p["name"] for p in manifest["parts"] if not (parts_dir / p["name"]).is_file()]


def lock_line(line: str) -> tuple[str, dict[str, str]] | None:
    """A lock's wheel line as (filename, its key=value fields); None for a blank, comment or
    ``@`` option line. The one reader of wheel lines (wheelhouse.py's read_lock uses it)."""
    fields = line.split()
    if not fields or fields[0].startswith(("#", "@")):
        return None
    return fields[0], dict(f.split("=", 1) for f in fields[1:] if "=" in f)


def lock_hashes(lock: Path, filename: str) -> set[str]:
    """The sha256 values a lock accepts for ``filename`` (installed and upstream)."""
    for line in lock.read_text().splitlines():
        entry = lock_line(line)
        if entry and entry[0] == filename:
            attrs = entry[1]
            return {attrs[k] for k in ("sha256", "upstream-sha256") if k in attrs}
    raise FerryError(f"{lock}: no line for {filename}")


def join(manifest_path: Path, parts_dir: Path, out: Path, lock: Path | None = None) -> Path:
    manifest = read_manifest(manifest_path)
    missing = missing_parts(manifest, parts_dir)
    if missing:
        raise FerryError(f"{manifest['file']}: parts missing in {parts_dir}: {missing}")
    accepted = lock_hashes(lock, manifest["file"]) if lock else None
    if accepted is not None and manifest["sha256"] not in accepted:
        raise FerryError(
            f"{manifest['file']}: the manifest's sha256 {manifest['sha256']} is not the lock's "
            f"({', '.join(sorted(accepted))})"
        )
    target = out / manifest["file"]
    if target.exists():
        found = sha256_file(target)
        if found == manifest["sha256"]:
            return target  # already there, same bytes
        raise FerryError(
            f"{target}: exists with sha256 {found}, not {manifest['sha256']}; not replaced"
        )
    out.mkdir(parents=True, exist_ok=True)
    temporary = out / f".{manifest['file']}.ferry-tmp"
    whole = hashlib.sha256()
    try:
        with temporary.open("wb") as sink:
            for part in manifest["parts"]:
                data = (parts_dir / part["name"]).read_bytes()
                found = hashlib.sha256(data).hexdigest()
                if len(data) != part["size"] or found != part["sha256"]:
                    raise FerryError(
                        f"{manifest['file']} {part['name']}: expected {part['size']} bytes "
                        f"sha256 {part['sha256']}, found {len(data)} bytes sha256 {found}"
                    )
                whole.update(data)
                sink.write(data)
        if whole.hexdigest() != manifest["sha256"]:
            raise FerryError(
                f"{manifest['file']}: joined sha256 {whole.hexdigest()}, expected "
                f"{manifest['sha256']}"
            )
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    return target


def collect(name: str, sources: Path, out: Path) -> dict:
    """The parts of the bundle NAME that device calls returned, gathered from the folders
    under SOURCES (one per call; a call returns its files flat) into OUT/NAME with the
    newest manifest of that name. Only parts whose size and sha256 are the manifest's are
    taken, so an older bundle's parts of the same name are passed over; an OUT/NAME that
    holds another bundle (another manifest sha256, or a part that differs) is refused, not
    replaced. Returns the status: file, parts, missing."""
    found = []
    for candidate in sorted(sources.glob("*/manifest.json")):
        try:
            manifest = read_manifest(candidate)
        except FerryError:
            continue  # another tool's manifest.json
        if manifest["file"] == name:
            found.append((candidate.stat().st_mtime, str(candidate), manifest))
    if not found:
        raise FerryError(f"{sources}: no folder holds a manifest.json for {name}")
    _, source, manifest = max(found, key=lambda item: (item[0], item[1]))
    folder = out / name
    kept = folder / "manifest.json"
    if kept.exists() and read_manifest(kept)["sha256"] != manifest["sha256"]:
        raise FerryError(
            f"{folder}: holds {name} sha256 {read_manifest(kept)['sha256']}, the newest "
            f"returned ({source}) is {manifest['sha256']}; remove it to collect that one"
        )
    folder.mkdir(parents=True, exist_ok=True)
    for part in manifest["parts"]:
        target = folder / part["name"]
        if target.exists():
            if sha256_file(target) != part["sha256"]:
                raise FerryError(
                    f"{target}: differs from {name}'s {part['name']} (sha256 {part['sha256']})"
                )
            continue
        for candidate in sorted(sources.glob(f"*/{part['name']}")):
            size = candidate.stat().st_size
            if size == part["size"] and sha256_file(candidate) == part["sha256"]:
                temporary = folder / f".{part['name']}.ferry-tmp"
                temporary.write_bytes(candidate.read_bytes())
                os.replace(temporary, target)
                break
    if not kept.exists():
        kept.write_text(json.dumps(manifest, indent=2) + "\n")
    missing = missing_parts(manifest, folder)
    return {"file": name, "parts": len(manifest["parts"]), "missing": missing}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="cut FILE into checked parts")
    s.add_argument("file", type=Path)
    s.add_argument("--out", type=Path, default=Path(".ferry"))
    s.add_argument("--part-bytes", type=int, default=PART_BYTES)
    j = sub.add_parser("join", help="put the parts together, checked")
    j.add_argument("manifest", type=Path)
    j.add_argument("--parts", type=Path, help="folder of the parts (default: the manifest's)")
    j.add_argument("--out", type=Path, required=True)
    j.add_argument("--lock", type=Path, help="a wheelhouse lock that must list the file")
    t = sub.add_parser("status", help="which parts are here")
    t.add_argument("manifest", type=Path)
    t.add_argument("--parts", type=Path)
    c = sub.add_parser("collect", help="gather a bundle's parts that device calls returned")
    c.add_argument("name", help="the bundle's file name, e.g. mla-fixtures.tar")
    c.add_argument("--from", dest="sources", type=Path, default=Path("/work/.device"))
    c.add_argument("--out", type=Path, default=Path(".ferry"))
    args = parser.parse_args(argv)
    try:
        if args.command == "split":
            check_fits_one_call(args.part_bytes, travelling_tree_bytes(Path.cwd()))
            manifest = split(args.file, args.out, args.part_bytes)
            count = len(read_manifest(manifest)["parts"])
            print(f"{manifest}: {count} part(s)")
        elif args.command == "collect":
            status = collect(args.name, args.sources, args.out)
            print(json.dumps(status))
            return 1 if status["missing"] else 0
        elif args.command == "join":
            parts = args.parts or args.manifest.parent
            print(join(args.manifest, parts, args.out, args.lock))
        else:
            manifest = read_manifest(args.manifest)
            missing = missing_parts(manifest, args.parts or args.manifest.parent)
            print(
                json.dumps(
                    {"file": manifest["file"], "parts": len(manifest["parts"]), "missing": missing}
                )
            )
            return 1 if missing else 0
    except FerryError as exc:
        print(f"ferry: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
