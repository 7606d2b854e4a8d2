"""node/ferry.py: a file larger than one device call, carried in checked parts."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ferry", ROOT / "node" / "ferry.py")
ferry = importlib.util.module_from_spec(spec)
sys.modules["ferry"] = ferry
spec.loader.exec_module(ferry)

NAME = "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl"


@pytest.fixture
def wheel(tmp_path):
    path = tmp_path / "src" / NAME
    path.parent.mkdir()
    path.write_bytes(os.urandom(2_500_000))
    return path


def test_split_then_join_gives_the_same_bytes(wheel, tmp_path):
    manifest = ferry.split(wheel, tmp_path / "ferry", part_bytes=1_000_000)
    data = json.loads(manifest.read_text())
    assert [p["size"] for p in data["parts"]] == [1_000_000, 1_000_000, 500_000]
    assert data["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    out = ferry.join(manifest, manifest.parent, tmp_path / "wh")
    assert out.read_bytes() == wheel.read_bytes()
    assert ferry.join(manifest, manifest.parent, tmp_path / "wh") == out  # same bytes: no-op


def test_a_corrupt_part_is_named_and_nothing_is_written(wheel, tmp_path):
    manifest = ferry.split(wheel, tmp_path / "ferry", part_bytes=1_000_000)
    part = manifest.parent / "part-01"
    part.write_bytes(b"x" + part.read_bytes()[1:])
    with pytest.raises(ferry.FerryError, match=f"{NAME} part-01: expected 1000000 bytes"):
        ferry.join(manifest, manifest.parent, tmp_path / "wh")
    assert list((tmp_path / "wh").iterdir()) == []


def test_missing_parts_are_listed(wheel, tmp_path):
    manifest = ferry.split(wheel, tmp_path / "ferry", part_bytes=1_000_000)
    (manifest.parent / "part-02").unlink()
    assert ferry.main(["status", str(manifest)]) == 1
    with pytest.raises(ferry.FerryError, match=r"parts missing .*\['part-02'\]"):
        ferry.join(manifest, manifest.parent, tmp_path / "wh")


def test_the_lock_must_list_the_file_by_sha256_or_upstream_sha256(wheel, tmp_path):
    manifest = ferry.split(wheel, tmp_path / "ferry", part_bytes=1_000_000)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock = tmp_path / "node.lock"
    lock.write_text(f"# lock\n{NAME} sha256={'0' * 64} size=1 upstream-sha256={digest}\n")
    assert ferry.join(manifest, manifest.parent, tmp_path / "wh", lock).exists()
    lock.write_text(f"{NAME} sha256={'0' * 64} size=1\n")
    with pytest.raises(ferry.FerryError, match="is not the lock's"):
        ferry.join(manifest, manifest.parent, tmp_path / "wh2", lock)
    lock.write_text("other.whl sha256=0 size=1\n")
    with pytest.raises(ferry.FerryError, match=f"no line for {NAME}"):
        ferry.join(manifest, manifest.parent, tmp_path / "wh3", lock)


def test_an_existing_different_file_is_never_replaced(wheel, tmp_path):
    manifest = ferry.split(wheel, tmp_path / "ferry", part_bytes=1_000_000)
    (tmp_path / "wh").mkdir()
    (tmp_path / "wh" / NAME).write_bytes(b"stripped copy")
    with pytest.raises(ferry.FerryError, match="not replaced"):
        ferry.join(manifest, manifest.parent, tmp_path / "wh")
    assert (tmp_path / "wh" / NAME).read_bytes() == b"stripped copy"


def test_split_refuses_to_mix_with_earlier_parts(wheel, tmp_path):
    ferry.split(wheel, tmp_path / "ferry", part_bytes=1_000_000)
    with pytest.raises(ferry.FerryError, match="already holds parts"):
        ferry.split(wheel, tmp_path / "ferry", part_bytes=1_000_000)


def test_the_real_lock_records_the_unstripped_kernel():
    """The lock gives the FA3/FlashMLA-carrying kernel wheel's hash (upstream-sha256)."""
    lock = ROOT / "node" / "locks" / "sglang-0.5.17-h200-cu130-py312.lock"
    assert len(ferry.lock_hashes(lock, NAME)) == 2


def test_a_part_that_cannot_travel_beside_the_tree_is_refused():
    """The limit counts the part, its manifest and the working tree together."""
    room = ferry.CALL_LIMIT_BYTES - 3_161_150 - ferry.MANIFEST_MARGIN
    ferry.check_fits_one_call(room, 3_161_150)
    with pytest.raises(ferry.FerryError, match="use --part-bytes"):
        ferry.check_fits_one_call(64_000_000, 3_161_150)
    ferry.check_fits_one_call(10**9, None)  # not a git checkout: nothing to count


def test_the_tree_that_travels_is_measured_from_git(tmp_path):
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("big/\n")
    (tmp_path / "a.txt").write_bytes(b"x" * 100)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "wheel").write_bytes(b"y" * 10_000)
    assert ferry.travelling_tree_bytes(tmp_path) == 2 * ferry.BLOCK  # a.txt, .gitignore
    assert ferry.travelling_tree_bytes(tmp_path / "nowhere") is None


def test_default_parts_travel_beside_this_checkout_with_room_to_grow():
    """The default part size must fit beside the tree as it stands, with 2 MB to spare: a
    tree that outgrows it fails here, on CPU, instead of refusing every ferry-recv call of a
    device session (2026-12-02: 7.5 MB of tree beside 60 MB parts)."""
    tree = ferry.travelling_tree_bytes(ROOT)
    if tree is None:
        pytest.skip("not a git checkout")
    ferry.check_fits_one_call(ferry.PART_BYTES + 2_000_000, tree)


def _returned(tmp_path, calls):
    """Device-call folders as the device tool leaves them: each call's files flat in NN/."""
    root = tmp_path / "device"
    for index, files in enumerate(calls):
        folder = root / f"{index:02d}"
        folder.mkdir(parents=True)
        for source in files:
            (folder / source.name).write_bytes(source.read_bytes())
    return root


def test_collect_gathers_the_parts_calls_returned_and_passes_over_an_older_bundle(tmp_path):
    old = tmp_path / "old" / "mla-fixtures.tar"
    old.parent.mkdir()
    old.write_bytes(os.urandom(2_500_000))
    new = tmp_path / "new" / "mla-fixtures.tar"
    new.parent.mkdir()
    new.write_bytes(os.urandom(2_500_000))
    old_manifest = ferry.split(old, tmp_path / "old-parts", part_bytes=1_000_000)
    manifest = ferry.split(new, tmp_path / "new-parts", part_bytes=1_000_000)
    parts = sorted(manifest.parent.glob("part-*"))
    stale = sorted(old_manifest.parent.glob("part-*"))
    # an earlier session's bundle of the same name, then this run's in two polls
    root = _returned(tmp_path, [[old_manifest, *stale], [manifest, *parts[:2]], parts[2:]])
    os.utime(root / "00" / "manifest.json", (1, 1))  # the older one is older
    status = ferry.collect("mla-fixtures.tar", root, tmp_path / "ferry")
    assert status == {"file": "mla-fixtures.tar", "parts": 3, "missing": []}
    joined = ferry.join(tmp_path / "ferry" / "mla-fixtures.tar" / "manifest.json",
                        tmp_path / "ferry" / "mla-fixtures.tar", tmp_path / "joined")  # fmt: skip
    assert joined.read_bytes() == new.read_bytes()
    # again: nothing changes; the main entry point says it all came
    assert ferry.main(["collect", "mla-fixtures.tar", "--from", str(root), "--out",
                       str(tmp_path / "ferry")]) == 0  # fmt: skip


def test_collect_lists_what_is_missing_and_never_mixes_two_bundles(wheel, tmp_path, capsys):
    manifest = ferry.split(wheel, tmp_path / "parts", part_bytes=1_000_000)
    parts = sorted(manifest.parent.glob("part-*"))
    root = _returned(tmp_path, [[manifest, parts[0]]])
    out = tmp_path / "ferry"
    status = ferry.collect(NAME, root, out)
    assert status["missing"] == ["part-01", "part-02"]
    assert ferry.main(["collect", NAME, "--from", str(root), "--out", str(out)]) == 1
    # another bundle of that name already collected: refused, nothing replaced
    other = tmp_path / "other" / NAME
    other.parent.mkdir()
    other.write_bytes(os.urandom(1_500_000))
    root2 = _returned(tmp_path / "b", [[ferry.split(other, tmp_path / "op", 1_000_000)]])
    with pytest.raises(ferry.FerryError, match="remove it to collect that one"):
        ferry.collect(NAME, root2, out)
    assert (out / NAME / "part-00").read_bytes() == parts[0].read_bytes()
    with pytest.raises(ferry.FerryError, match="no folder holds a manifest.json"):
        ferry.collect("nothing.tar", root, out)
