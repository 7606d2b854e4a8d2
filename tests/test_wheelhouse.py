"""Offline tests of node/wheelhouse.py on small synthetic wheels (no network, no GPU)."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

SCRIPT = Path(__file__).resolve().parent.parent / "node" / "wheelhouse.py"


def _load():
    # wheelhouse.py imports ferry.py, beside it (run as a script, its folder is on sys.path)
    for name in ("ferry", "wheelhouse"):
        if name == "ferry" and name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, SCRIPT.with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while being built
        spec.loader.exec_module(module)
    return module


wh = _load()
ENV = wh.target_environment("3.12", wh.DEFAULT_PLATFORMS)


# ---------------------------------------------------------------------------- helpers


def b64_sha256(data: bytes) -> str:
    """RECORD hash computed independently of the module under test."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    folder: Path,
    name: str = "demo_kernel",
    version: str = "1.0",
    files: dict[str, bytes] | None = None,
    requires: list[str] = (),
    tag: str = "py3-none-any",
) -> Path:
    """Write a minimal valid wheel: package files + METADATA, WHEEL and a correct RECORD."""
    if files is None:
        files = {
            f"{name}/__init__.py": b"VALUE = 42\n",
            f"{name}/common_ops.abi3.so": b"\x7fELF keep me",
            f"{name}/flash_ops.abi3.so": b"\x7fELF" + b"x" * 5000,
            f"{name}/sm100/__init__.py": b"",
            f"{name}/sm100/blackwell.so": b"\x7fELF" + b"y" * 3000,
            f"{name}/sm90/hopper.so": b"\x7fELF hopper",
        }
    dist_info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = dict(files)
    members[f"{dist_info}/METADATA"] = metadata.encode()
    members[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()
    )
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, data in members.items():
        writer.writerow([path, b64_sha256(data), len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    members[f"{dist_info}/RECORD"] = record.getvalue().encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in members.items():
            zf.writestr(path, data)
    return wheel


def record_rows(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        rows = csv.reader(io.StringIO(zf.read(name).decode()))
        return {row[0]: row for row in rows if row}


def pip_install(wheels: list[Path], target: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile"]
    cmd += ["--disable-pip-version-check", "--target", str(target), *map(str, wheels)]
    return subprocess.run(cmd, capture_output=True, text=True)


# ---------------------------------------------------------------------------- stripping


def test_strip_removes_members_and_their_record_lines(tmp_path):
    wheel = make_wheel(tmp_path)
    removed = wh.strip_wheel(wheel, ["flash_ops.abi3.so", "sm100/"])
    assert sorted(removed) == [
        "demo_kernel/flash_ops.abi3.so",
        "demo_kernel/sm100/__init__.py",
        "demo_kernel/sm100/blackwell.so",
    ]
    assert wheel.name == "demo_kernel-1.0-py3-none-any.whl"  # filename kept
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert names.isdisjoint(removed)
    assert {"demo_kernel/common_ops.abi3.so", "demo_kernel/sm90/hopper.so"} <= names
    assert set(record_rows(wheel)).isdisjoint(removed)


def test_record_hashes_of_kept_files_still_verify(tmp_path):
    wheel = make_wheel(tmp_path)
    wh.strip_wheel(wheel, ["sm100/"])
    rows = record_rows(wheel)
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if not n.endswith("/RECORD")]
        assert sorted(members) == sorted(n for n in rows if not n.endswith("/RECORD"))
        for member in members:
            data = zf.read(member)
            assert rows[member][1:] == [b64_sha256(data), str(len(data))], member
    assert wh.check_record(wheel) == []


def test_check_record_detects_a_stale_line(tmp_path):
    """The checker used above must be able to fail: drop a member without touching RECORD."""
    wheel = make_wheel(tmp_path)
    broken = tmp_path / "broken" / wheel.name
    broken.parent.mkdir()
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(broken, "w") as dst:
        for info in src.infolist():
            if not info.filename.endswith("flash_ops.abi3.so"):
                dst.writestr(info, src.read(info))
    assert wh.check_record(broken) == ["in RECORD but missing: demo_kernel/flash_ops.abi3.so"]


def test_stripped_wheel_installs_with_pip(tmp_path):
    wheel = make_wheel(tmp_path / "w")
    wh.strip_wheel(wheel, ["flash_ops.abi3.so", "sm100/"])
    site = tmp_path / "site"
    proc = pip_install([wheel], site)
    assert proc.returncode == 0, proc.stderr
    assert (site / "demo_kernel" / "common_ops.abi3.so").is_file()
    assert not (site / "demo_kernel" / "flash_ops.abi3.so").exists()
    assert not (site / "demo_kernel" / "sm100").exists()
    installed_record = (site / "demo_kernel-1.0.dist-info" / "RECORD").read_text()
    assert "flash_ops" not in installed_record and "sm100" not in installed_record


def test_strip_pattern_that_matches_nothing_is_an_error(tmp_path):
    wheel = make_wheel(tmp_path)
    before = wheel.read_bytes()
    with pytest.raises(wh.WheelhouseError, match="sm120/"):
        wh.strip_wheel(wheel, ["sm120/"])
    assert wheel.read_bytes() == before


def test_strip_never_removes_dist_info(tmp_path):
    wheel = make_wheel(tmp_path)
    with pytest.raises(wh.WheelhouseError, match="matches nothing"):
        wh.strip_wheel(wheel, ["METADATA"])


@pytest.mark.parametrize(
    ("member", "pattern", "expected"),
    [
        ("sgl_kernel/sm100/x.so", "sm100/", True),
        ("sgl_kernel/sm100/x.so", "sgl_kernel/sm100/", True),
        ("sgl_kernel/sm1000/x.so", "sm100/", False),
        ("sgl_kernel/not_sm100/x.so", "sm100/", False),
        ("sgl_kernel/flash_ops.abi3.so", "flash_ops.abi3.so", True),
        ("sgl_kernel/flashmla_ops.abi3.so", "flash_ops.abi3.so", False),
        ("sgl_kernel/a/b.so", "sgl_kernel/*.so", True),
        ("sgl_kernel/a/b.so", "*.py", False),
    ],
)
def test_member_matches(member, pattern, expected):
    assert wh.member_matches(member, pattern) is expected


def test_parse_strip_rules_normalises_names_and_rejects_garbage():
    rules = wh.parse_strip_rules(["SGLang_Kernel:a.so", "sglang-kernel:sm100/"])
    assert rules == {"sglang-kernel": ["a.so", "sm100/"]}
    with pytest.raises(wh.WheelhouseError):
        wh.parse_strip_rules(["no-colon"])


# ---------------------------------------------------------------------------- markers


@pytest.mark.parametrize(
    ("requirement", "applies"),
    [
        ("foo", True),
        ('foo; sys_platform == "darwin"', False),
        ('foo; sys_platform == "linux" and platform_machine == "x86_64"', True),
        ('foo; platform_machine == "aarch64" or platform_machine == "arm64"', False),
        ('foo; python_version < "3.11"', False),
        ('foo; python_version >= "3.12"', True),
        ('foo; python_version <= "3.12"', True),
        ('foo; python_version > "3.12"', False),
        ('foo; extra == "test"', False),
        ('foo; sys_platform == "linux" and extra == "cu13"', False),
        ('foo; platform_system == "Windows"', False),
        ('foo; implementation_name == "cpython"', True),
    ],
)
def test_markers_evaluate_for_py312_linux_x86_64(requirement, applies):
    assert wh.requirement_applies(Requirement(requirement), ENV) is applies


def test_target_environment_ignores_the_host():
    env = wh.target_environment("3.12.3", ["manylinux_2_28_aarch64"])
    assert (env["python_version"], env["python_full_version"]) == ("3.12", "3.12.3")
    assert env["platform_machine"] == "aarch64"
    assert wh.target_environment("3.12", ["manylinux2014_x86_64"])["platform_machine"] == "x86_64"
    with pytest.raises(wh.WheelhouseError):
        wh.target_environment("py312", [])


# ---------------------------------------------------------------------------- freeze files


def test_read_freeze_and_satisfaction(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(
        "# comment\n"
        "Typing_Extensions==4.15.0\n"
        "torch==2.11.0+cu130\n"
        "numba\n"
        "mypkg @ file:///src/mypkg\n"
        "-e git+https://example.invalid/x.git#egg=Edit_Me\n"
        "tokenizers==0.23.2  # inline comment\n"
    )
    node = wh.read_freeze(freeze)
    assert node["typing-extensions"] == Version("4.15.0")
    assert node["numba"] is None and node["mypkg"] is None and node["edit-me"] is None
    sat = wh.node_satisfies
    assert sat(node, "typing_extensions", SpecifierSet(">=4.6"))
    assert sat(node, "TYPING.EXTENSIONS", SpecifierSet(">=4.6"))
    assert not sat(node, "typing-extensions", SpecifierSet(">=4.16"))
    assert sat(node, "torch", SpecifierSet("==2.11.0"))  # local version +cu130 matches
    assert not sat(node, "torch", SpecifierSet("==2.10.0"))
    assert sat(node, "numba", SpecifierSet("==0.65.1"))  # unknown version: present at any
    assert not sat(node, "tokenizers", SpecifierSet("<=0.23.0,>=0.22.0"))
    assert not sat(node, "pydantic", SpecifierSet())


def test_profile_freeze_file_parses_and_has_the_known_versions():
    node = wh.read_freeze(wh.PROFILES["h200-cu130-py312"].node_freeze)
    assert node["torch"] == Version("2.11.0+cu130")
    assert node["transformers"] == Version("5.17.0")
    assert "pydantic" not in node
    assert len(node) > 150


# ---------------------------------------------------------------------------- resolution


class FakeIndex:
    """Offline stand-in for pip download: picks the newest synthetic wheel meeting a spec."""

    def __init__(self, folder: Path, packages: dict[str, dict[str, list[str]]]):
        self.wheels = {
            canonicalize_name(name): {
                v: make_wheel(folder / name / v, name, v, {}, reqs) for v, reqs in vs.items()
            }
            for name, vs in packages.items()
        }
        self.calls: list[str] = []

    def __call__(self, requirement: str) -> Path:
        self.calls.append(requirement)
        req = Requirement(requirement)
        versions = self.wheels[canonicalize_name(req.name)]
        best = max((v for v in versions if v in req.specifier), key=Version)
        return versions[best]


def run_resolve(tmp_path, packages, root="app==1.0", node=None, **kwargs):
    index = FakeIndex(tmp_path, packages)
    opts = {"pins": {}, "excludes": set()} | kwargs
    res = wh.resolve([Requirement(root)], ENV, node or {}, fetch=index, **opts)
    return res, index


def test_resolve_follows_markers_extras_excludes_and_node(tmp_path):
    packages = {
        "app": {
            "1.0": [
                "needed>=1",
                'mac_only; sys_platform == "darwin"',
                'old_py; python_version < "3.11"',
                'test_dep; extra == "test"',
                "huge_kernels",
                "on_node>=2",
                "too_old_on_node>=3",
                "with_extra[cu13]",
            ]
        },
        "needed": {"1.0": ["leaf"], "2.0": ["leaf"]},
        "leaf": {"0.1": []},
        "huge_kernels": {"1.0": ["leaf"]},
        "on_node": {"9.0": []},
        "too_old_on_node": {"3.5": []},
        "with_extra": {"1.0": ['extra_only; extra == "cu13"']},
    }
    node = {"on-node": Version("2.5"), "too-old-on-node": Version("2.0")}
    res, index = run_resolve(tmp_path, packages, node=node, excludes={"huge-kernels"})
    versions = {n: wh.wheel_version(p) for n, p in res.wheels.items()}
    assert versions == {
        "app": Version("1.0"),
        "needed": Version("2.0"),
        "leaf": Version("0.1"),
        "too-old-on-node": Version("3.5"),
        "with-extra": Version("1.0"),
    }
    assert res.excluded == {"huge-kernels"}
    assert "on-node" in res.from_node
    assert res.ignored_extras == {"app -> with_extra[cu13]"}
    assert not any(c.startswith(("mac", "old", "test", "extra")) for c in index.calls)


def test_pins_override_node_and_specifiers(tmp_path):
    packages = {
        "app": {"1.0": ["tokenizers<=0.23.0,>=0.22.0", "transformers>=5.13"]},
        "tokenizers": {"0.22.2": [], "0.23.0": []},
        "transformers": {"5.12.1": [], "5.17.0": []},
    }
    node = {"transformers": Version("5.17.0"), "tokenizers": Version("0.23.2")}
    pins = {
        "transformers": Requirement("transformers==5.12.1"),
        "tokenizers": Requirement("tokenizers==0.22.2"),
    }
    res, _ = run_resolve(tmp_path, packages, node=node, pins=pins)
    assert res.wheels["transformers"].name.startswith("transformers-5.12.1-")
    assert res.wheels["tokenizers"].name.startswith("tokenizers-0.22.2-")
    assert res.pin_overrides == ["transformers==5.12.1 (pinned) overrides transformers>=5.13"]


def test_pin_matching_the_node_ships_nothing(tmp_path):
    packages = {"app": {"1.0": ["tokenizers"]}, "tokenizers": {"0.22.2": []}}
    pins = {"tokenizers": Requirement("tokenizers==0.22.2")}
    res, _ = run_resolve(tmp_path, packages, node={"tokenizers": Version("0.22.2")}, pins=pins)
    assert "tokenizers" not in res.wheels


def test_keep_node_beats_a_cap_and_reports_it(tmp_path):
    packages = {"app": {"1.0": ["numpy<2.4"]}, "numpy": {"2.3.5": []}}
    res, index = run_resolve(
        tmp_path, packages, node={"numpy": Version("2.5.2")}, keep_node=["NumPy"]
    )
    assert "numpy" not in res.wheels and index.calls == ["app==1.0"]
    assert res.kept_despite == ["node's numpy 2.5.2 although app wants numpy<2.4"]


def test_later_specifier_refetches_an_older_version(tmp_path):
    packages = {
        "app": {"1.0": ["lib", "other"]},
        "other": {"1.0": ["lib<2"]},
        "lib": {"1.5": [], "2.0": []},
    }
    res, index = run_resolve(tmp_path, packages)
    assert wh.wheel_version(res.wheels["lib"]) == Version("1.5")
    assert index.calls.count("lib") == 1 and "lib<2" in index.calls


def test_read_requirements_from_metadata(tmp_path):
    wheel = make_wheel(tmp_path, "x", "1", {}, ["a>=1", 'b; extra == "z"'])
    assert [str(r) for r in wh.read_requirements(wheel)] == ["a>=1", 'b; extra == "z"']


# ---------------------------------------------------------------------------- chunks


def test_chunks_respect_the_limit_and_hold_every_wheel_once():
    sizes = {f"w{i}.whl": s for i, s in enumerate([45, 30, 25, 20, 10, 10, 5, 1, 60])}
    chunks = wh.plan_chunks(sizes, 60)
    assert all(sum(sizes[n] for n in chunk) <= 60 for chunk in chunks)
    assert sorted(n for chunk in chunks for n in chunk) == sorted(sizes)
    assert len(chunks) == 4  # 206 bytes need at least 4 chunks of 60


def test_oversize_wheel_is_an_error_naming_it():
    with pytest.raises(wh.WheelhouseError, match=r"big-1\.0-py3-none-any\.whl \(0\.0 MB\)"):
        wh.plan_chunks({"small.whl": 10, "big-1.0-py3-none-any.whl": 61}, 60)


# ---------------------------------------------------------------------------- output, lock


def make_lock(wheels: list[Path], strips=()) -> object:
    entries = [wh.LockEntry(w.name, wh.sha256_file(w), w.stat().st_size) for w in wheels]
    return wh.Lock(entries, "3.12", list(wh.DEFAULT_PLATFORMS), list(strips), ["a note"])


def test_lock_round_trip(tmp_path):
    wheel = make_wheel(tmp_path)
    lock = make_lock([wheel], ["demo-kernel:sm100/"])
    lock.entries[0].upstream_sha256 = "ab" * 32
    path = tmp_path / "x.lock"
    path.write_text(wh.render_lock(lock))
    again = wh.read_lock(path)
    assert again.entries == lock.entries
    assert (again.python_version, again.platforms, again.strips) == (
        "3.12",
        list(wh.DEFAULT_PLATFORMS),
        ["demo-kernel:sm100/"],
    )
    assert "# a note" in path.read_text()


def test_verify_detects_modified_missing_and_extra_files(tmp_path):
    folder = tmp_path / "wh"
    a = make_wheel(folder / "c1", "a", "1.0", {"a/x.py": b"1"})
    b = make_wheel(folder / "c2", "b", "1.0", {"b/x.py": b"2"})
    lock = make_lock([a, b])
    assert wh.verify_folder(lock, folder) == []

    data = bytearray(a.read_bytes())
    data[10] ^= 0xFF  # same size, different content
    a.write_bytes(bytes(data))
    assert wh.verify_folder(lock, folder) == [f"sha256 mismatch: {a.name}"]

    b.unlink()
    make_wheel(folder, "c", "1.0", {"c/x.py": b"3"})
    problems = wh.verify_folder(lock, folder)
    assert f"missing: {b.name}" in problems and "not in lock: c-1.0-py3-none-any.whl" in problems


def test_verify_command_exit_code(tmp_path, capsys):
    wheel = make_wheel(tmp_path / "wh")
    lock_path = tmp_path / "x.lock"
    lock_path.write_text(wh.render_lock(make_lock([wheel])))
    assert wh.main(["verify", "--lock", str(lock_path), str(tmp_path / "wh")]) == 0
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    assert wh.main(["verify", "--lock", str(lock_path), str(tmp_path / "wh")]) == 1
    assert "size mismatch" in capsys.readouterr().out


def test_write_output_chunks_install_sh_and_lock(tmp_path):
    src = tmp_path / "src"
    wheels = [
        make_wheel(src, f"pkg{i}", "1.0", {f"pkg{i}/data.bin": bytes([i]) * (i * 700)})
        for i in range(1, 6)
    ]
    out = tmp_path / "out"
    (out / "c9").mkdir(parents=True)  # stale chunk from an earlier run
    lock = make_lock(wheels)
    limit_mb = 1
    summary = wh.write_output(wheels, lock, out, limit_mb, "t.lock", "test set")
    assert not (out / "c9").exists()
    assert [c for c, _ in summary] == [f"c{i}" for i in range(1, len(summary) + 1)]
    assert wh.verify_folder(wh.read_lock(out / "t.lock"), out) == []
    script = (out / "install.sh").read_text()
    for wheel in wheels:
        assert f"{wh.sha256_file(wheel)}  {wheel.name}" in script
    assert "--no-index --no-deps --no-compile" in script
    assert '--target "$TARGET"' in script and 'TARGET="${TARGET:-/tmp/site}"' in script

    wh.write_output(wheels, lock, out, limit_mb, "t.lock", "test set", "# kept verbatim\n")
    assert (out / "t.lock").read_text() == "# kept verbatim\n"


def test_ferry_large_puts_oversize_wheels_in_big_and_verify_finds_them(tmp_path, monkeypatch):
    src = tmp_path / "src"
    small = make_wheel(src, "small", "1.0", {"small/x.py": b"1"})
    large = make_wheel(src, "large", "1.0", {"large/x.bin": bytes(range(256)) * 40})
    monkeypatch.setattr(wh, "MB", large.stat().st_size - 1)  # only `large` exceeds one chunk
    out = tmp_path / "out"
    with pytest.raises(wh.WheelhouseError, match="large-1.0"):
        wh.write_output([small, large], make_lock([small, large]), out, 1, "t.lock", "t")
    summary = wh.write_output(
        [small, large], make_lock([small, large]), out, 1, "t.lock", "t", ferry_large=True
    )
    assert ("big", large.stat().st_size) in summary
    assert (out / "big" / large.name).is_file() and not list(out.glob(f"c*/{large.name}"))
    assert wh.verify_folder(wh.read_lock(out / "t.lock"), out) == []


def test_verify_ignore_extra_accepts_unlisted_wheels_only(tmp_path, capsys):
    wheel = make_wheel(tmp_path / "wh")
    make_wheel(tmp_path / "wh", "extra", "1.0", {"extra/x.py": b"1"})
    lock_path = tmp_path / "x.lock"
    lock_path.write_text(wh.render_lock(make_lock([wheel])))
    args = ["verify", "--lock", str(lock_path), str(tmp_path / "wh")]
    assert wh.main(args) == 1
    assert wh.main([*args, "--ignore-extra"]) == 0
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    assert wh.main([*args, "--ignore-extra"]) == 1  # a changed listed wheel still fails


def test_sglang_0523_profile_ships_what_the_node_cannot_serve_with():
    profile = wh.PROFILES["h200-cu130-py312-sglang0.5.23"]
    assert profile.ferry_large and "nvidia-nccl-cu13" in profile.replace_node
    lock = wh.read_lock(profile.lock)
    versions = {
        e.filename.split("-")[0].lower(): e.filename.split("-")[1] for e in lock.entries
    }
    assert versions["sglang"] == "0.5.23" and versions["torch"] == "2.14.1"
    assert versions["nvidia_nccl_cu13"] == "2.30.7" and versions["triton"].startswith("3.8")
    assert versions["sglang_kernel"] == "0.4.10" and not lock.strips  # FA3 + FlashMLA kept
    # CUDA libraries the node's torch 2.11 brought are used as they are (lock notes say why)
    assert not {"nvidia_cudnn_cu13", "nvidia_cublas", "nvidia_cusparselt_cu13"} & set(versions)
    # 0.5.23's LlamaMLP imports `cutlass` on Hopper: the CuTe DSL with CUDA 13 libraries only
    assert "nvidia_cutlass_dsl_libs_cu13" in versions
    assert "nvidia_cutlass_dsl_libs_cu12" not in versions


def _run_install_sh(script: Path, wheels_dir: Path, target: Path, verify="1"):
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": sys.executable,
        "WHEELS": str(wheels_dir),
        "TARGET": str(target),
        "WH_VERIFY": verify,
    }
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)


def test_install_sh_installs_from_chunks_and_from_a_flat_copy(tmp_path, monkeypatch):
    src = tmp_path / "src"
    wheels = [
        make_wheel(src, f"pkg{i}", "1.0", {f"pkg{i}/__init__.py": b"X = 1\n"}) for i in (1, 2)
    ]
    wheels.append(make_wheel(src / "k"))
    wh.strip_wheel(wheels[-1], ["sm100/"])
    out = tmp_path / "out"
    monkeypatch.setattr(wh, "MB", 300)  # tiny chunks so that the wheels spread over c1, c2, ...
    summary = wh.write_output(wheels, make_lock(wheels), out, 10, "t.lock", "test")
    assert len(summary) >= 2

    proc = _run_install_sh(out / "install.sh", out, tmp_path / "site1")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "site1" / "pkg2" / "__init__.py").is_file()
    assert (tmp_path / "site1" / "demo_kernel" / "sm90" / "hopper.so").is_file()

    flat = tmp_path / "flat"  # chunks copied into one folder, script elsewhere
    flat.mkdir()
    for wheel in out.glob("c*/*.whl"):
        (flat / wheel.name).write_bytes(wheel.read_bytes())
    proc = _run_install_sh(out / "install.sh", flat, tmp_path / "site2")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "site2" / "pkg1" / "__init__.py").is_file()

    (flat / wheels[0].name).write_bytes(b"corrupt")
    proc = _run_install_sh(out / "install.sh", flat, tmp_path / "site3")
    assert proc.returncode != 0 and not (tmp_path / "site3").exists()

    (flat / wheels[0].name).unlink()
    proc = _run_install_sh(out / "install.sh", flat, tmp_path / "site4", verify="0")
    assert proc.returncode == 1 and f"missing wheel: {wheels[0].name}" in proc.stderr


def test_committed_lock_matches_profile_and_parses():
    profile = wh.PROFILES["h200-cu130-py312"]
    lock = wh.read_lock(profile.lock)
    names = {e.filename.split("-")[0].lower() for e in lock.entries}
    assert {"sglang", "sglang_kernel", "transformers", "tokenizers", "dill"} <= names
    assert not names & {"torch", "numpy", "flash_attn_4", "tilelang", "datasets"}
    assert lock.strips == profile.strips
    kernel = next(e for e in lock.entries if e.filename.startswith("sglang_kernel-"))
    assert kernel.upstream_sha256 and kernel.size < 30 * wh.MB
    assert sum(e.size for e in lock.entries) < 200 * wh.MB


def test_split_puts_the_first_distributions_in_chunk_one():
    sizes = {
        "transformers-5.12.1-py3-none-any.whl": 12,
        "speculators-0.9.0-py3-none-any.whl": 1,
        "flashinfer_python-0.6.15-py3-none-any.whl": 50,
        "sglang-0.5.17-py3-none-any.whl": 40,
        "orjson-3.1-py3-none-any.whl": 5,
    }
    chunks = wh.plan_chunks_first(sizes, ["transformers", "speculators"], 60)
    assert {"transformers-5.12.1-py3-none-any.whl", "speculators-0.9.0-py3-none-any.whl"} <= set(
        chunks[0]
    )
    assert sorted(n for c in chunks for n in c) == sorted(sizes)
    assert all(sum(sizes[n] for n in c) <= 60 for c in chunks)
    with pytest.raises(wh.WheelhouseError, match="no wheel for datasets"):
        wh.plan_chunks_first(sizes, ["datasets"], 60)
    with pytest.raises(wh.WheelhouseError, match="first chunk's wheels take"):
        wh.plan_chunks_first(sizes, ["flashinfer-python", "transformers"], 60)
