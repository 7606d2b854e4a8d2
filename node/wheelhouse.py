#!/usr/bin/env python3
"""Build an offline wheelhouse for an air-gapped GPU node that already ships its own torch.

GPU nodes have no network and a preinstalled, CUDA-matched stack (torch, triton, numpy, ...).
``pip install sglang`` there is impossible, and resolving on the node would try to replace
torch anyway.  This tool does the resolution here, for the *node's* Python and platform tags,
and produces a folder that is copied over and installed with ``--no-index --no-deps``:

* the dependency closure of ``sglang==VERSION`` is walked by hand: one
  ``pip download --only-binary=:all: --no-deps`` per package, then the wheel's METADATA
  ``Requires-Dist`` lines are read and their markers evaluated for the target (not for this
  machine).  Requirements that only apply to an ``extra`` are skipped, as are packages that the
  node already has at a satisfying version (``--node-freeze``) and names given to ``--exclude``.
* ``--pin`` forces a version whenever a name is reached (even if the node has a different one),
  ``--add`` adds extra top-level requirements that the metadata does not declare.
* ``--strip DIST:PATTERN`` removes members from a wheel (e.g. kernels for GPUs the node does not
  have) and rewrites its RECORD so that pip still installs it; the filename is kept.
* wheels are packed into chunk folders ``c1/ c2/ ...`` of at most ``--chunk-mb`` MB
  (1 MB = 1,000,000 bytes) because the transport to the node carries at most 64 MiB per trip.
* ``install.sh`` and a lock file (exact filenames, sha256, size) are written next to the chunks.

Freeze-file rule: a line ``name==version`` satisfies a requirement when the version matches its
specifier; a line with only ``name`` (version unknown) or ``name @ URL`` means "present at some
version" and satisfies every requirement on that name.  Use ``--pin`` to override such a package.

Usage::

    # the known-good H200 / CUDA 13 / Python 3.12 node profile (writes .wh/c1, c2, ..., install.sh)
    python node/wheelhouse.py build --profile h200-cu130-py312 --out .wh

    # the same wheels, exactly, from the committed lock (no resolution)
    python node/wheelhouse.py build --lock node/locks/sglang-0.5.17-h200-cu130-py312.lock --out .wh

    # a custom node
    python node/wheelhouse.py build --sglang 0.5.17 --python-version 3.12 \\
        --node-freeze node.freeze.txt --pin transformers==5.12.1 --exclude flash-attn-4 \\
        --strip sglang-kernel:sm100/ --chunk-mb 60 --out /tmp/wh

    # check a folder (flat, or with c1/ c2/ ... subfolders) against a lock
    python node/wheelhouse.py verify --lock node/locks/sglang-0.5.17-h200-cu130-py312.lock .wh

    # compare a lock with a plain list of wheel filenames
    python node/wheelhouse.py diff --lock .wh/sglang-0.5.17-h200-cu130-py312.lock wheels.txt

On the node (chunks copied one by one into /tmp/wh, flat or as /tmp/wh/c1, /tmp/wh/c2, ...)::

    WHEELS=/tmp/wh TARGET=/tmp/site bash /tmp/wh/install.sh
    export PYTHONPATH=/tmp/site
"""

from __future__ import annotations

import argparse
import base64
import csv
import dataclasses
import fnmatch
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from collections import deque
from collections.abc import Iterable, Sequence
from email.parser import HeaderParser
from pathlib import Path

# ferry.py (beside this file: the script's folder is on sys.path) is standard library only and
# runs on the node before anything is installed; the file hash and the lock-line reader live
# there, once.
from ferry import lock_line, sha256_file
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

REPO_ROOT = Path(__file__).resolve().parent.parent
LOCKS = Path(__file__).resolve().parent / "locks"
LOCK_HEADER = "# wheelhouse lock v1"
MB = 1_000_000

#: manylinux glibc 2.17 .. 2.39 on x86_64, plus the legacy aliases.  pip matches a ``--platform``
#: tag exactly (it does not expand 2_34 to "2_34 and older"), so all are listed; earlier tags are
#: preferred, so when a release has several wheels the most portable (oldest glibc) one is taken.
DEFAULT_PLATFORMS: tuple[str, ...] = (
    "manylinux1_x86_64",
    "manylinux2010_x86_64",
    "manylinux2014_x86_64",
    *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 40)),
)


class WheelhouseError(Exception):
    """A problem the user must fix (bad option, oversize wheel, hash mismatch, ...)."""


# --------------------------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Profile:
    """A known node: what to resolve for it and how, so that a build is one short command."""

    sglang: str
    python_version: str
    node_freeze: Path
    pins: list[str]
    excludes: list[str]
    strips: list[str]
    adds: list[str]
    keep_node: list[str]
    chunk_mb: int
    platforms: tuple[str, ...] = DEFAULT_PLATFORMS
    notes: list[str] = dataclasses.field(default_factory=list)
    lock: Path | None = None
    # Shipped although the node has a copy: the node's copy is at an unknown version in the
    # freeze (so it would "satisfy" any pin) but is known not to work with what we ship.
    replace_node: list[str] = dataclasses.field(default_factory=list)
    # Wheels larger than a chunk go to OUT/big/ (carried in parts with node/ferry.py)
    # instead of failing the build.
    ferry_large: bool = False


PROFILES: dict[str, Profile] = {
    "h200-cu130-py312": Profile(
        sglang="0.5.17",
        python_version="3.12.3",
        node_freeze=LOCKS / "node-h200-cu130-py312.freeze.txt",
        # The node's transformers 5.17 breaks SGLang 0.5.17 at import ("'qwen3_asr' is already
        # used by a Transformers config"); 5.12.1 is what sglang pins, 0.22.2 the tokenizers
        # that served with it (the node's 0.23.2 is outside transformers' <=0.23.0 anyway).
        pins=["transformers==5.12.1", "tokenizers==0.22.2"],
        # Declared by sglang/flashinfer but not imported on the EAGLE-3 serving path on H200
        # (verified on the node 2026-11-29); several are hundreds of MB of CUDA kernels.
        excludes=[
            "flash-attn-4",
            "tilelang",
            "nvidia-cutlass-dsl",
            "humming-kernels",
            "quack-kernels",
            "quack",
            "helion",
            "datasets",
            "modelscope",
            "kernels",
            "nvidia-mathdx",
            "tokenspeed-mla",
            "cuda-python",
            "cuda-tile",
            "nccl4py",
            "nvidia-cudnn-frontend",
            "smg-grpc-servicer",
            "py-spy",
            "torchcodec",
        ],
        # Stripped for size, not because the H200 does without them: FA3 (flash_ops, 1070 MiB
        # raw) is SGLang's attention backend of choice on Hopper and FlashMLA its MLA kernel
        # there. Without them (and sm100, Blackwell only) sglang-kernel is ~22 MB and serves
        # with the triton and flashinfer backends only. The unstripped wheel (its sha256 is
        # the lock's upstream-sha256) travels in parts with node/ferry.py.
        strips=[
            "sglang-kernel:flash_ops.abi3.so",
            "sglang-kernel:flashmla_ops.abi3.so",
            "sglang-kernel:sm100/",
        ],
        # sglang/srt/sampling/custom_logit_processor.py does `import dill` at module level but
        # sglang does not declare it (it came in through `datasets`, excluded above).
        adds=["dill"],
        # mistral-common 1.13.1 asks numpy<2.4 on Python <= 3.12; the node's numpy 2.5.2 served
        # fine, and replacing numpy under the node's torch/jax/cupy is riskier than the cap.
        keep_node=["numpy"],
        chunk_mb=60,
        notes=[
            "Node: H200, CUDA 13, Python 3.12.3, torch 2.11.0+cu130 preinstalled, no network;",
            "its packages: node/locks/node-h200-cu130-py312.freeze.txt.  Built with",
            "  python node/wheelhouse.py build --profile h200-cu130-py312 --out .wh",
            "Against the wheel list that served SGLang 0.5.17 with EAGLE-3 on that node on",
            "2026-11-29 (the node's own wheel list, cp312), `wheelhouse.py diff`",
            "reports the same 76 filenames.  What it took to get there:",
            "- dill is added by hand: sglang imports it but declares it only through `datasets`;",
            "- numpy is the node's 2.5.2 although mistral-common caps numpy<2.4 on Python 3.12",
            "  (it served fine; a second numpy under torch is worse than the cap);",
            "- platform tags are preferred oldest glibc first, which takes apache_tvm_ffi's",
            "  manylinux2014 wheel as the list does (newest first would take the 2_24/2_28 one);",
            "- the sha256 of the stripped sglang_kernel is that of this tool's rewrite; the list",
            "  records no hashes, so byte identity with the node's copy is not claimed.",
        ],
        lock=LOCKS / "sglang-0.5.17-h200-cu130-py312.lock",
    ),
    # SGLang 0.5.23, beside 0.5.17: torch 2.14.1, triton 3.8, sglang-kernel 0.4.10 unstripped,
    # flashinfer 0.7.2; installed into its own --target so the 0.5.17 profile keeps working.
    "h200-cu130-py312-sglang0.5.23": Profile(
        sglang="0.5.23",
        python_version="3.12.3",
        node_freeze=LOCKS / "node-h200-cu130-py312.freeze.txt",
        pins=[],
        excludes=[
            "flash-attn-4", "tilelang", "humming-kernels",
            "quack-kernels", "quack", "helion", "datasets", "modelscope", "kernels",
            "nvidia-mathdx", "tokenspeed-mla", "cuda-python", "cuda-tile", "nccl4py",
            "nvidia-cudnn-frontend", "smg-grpc-servicer", "py-spy", "torchcodec",
            # new in 0.5.18-0.5.23, not imported at module level on the EAGLE-3 serving path
            # (DeepEP all-to-all, DeepSeek-V4 chat recipes, renderers, nvshmem bindings)
            "sgl-deep-ep", "nccl-extensions", "nvshmem4py-cu13", "deepseek-recipe",
            "tml-renderers",
            # nvidia-cutlass-dsl names its CUDA 12 libraries unconditionally; the node is
            # CUDA 13, so its cu13 libraries are added instead (below)
            "nvidia-cutlass-dsl-libs-cu12",
        ],
        strips=[],
        # 0.5.23's LlamaMLP builds a DualGemm that imports `cutlass` (CuTe DSL) on Hopper at
        # model construction (sglang/srt/layers/dual_gemm.py:_select_mode): without it the
        # scheduler dies loading the target (seen on the H200, 2026-12-01).
        adds=["dill", "nvidia-cutlass-dsl-libs-cu13==4.8.0"],
        keep_node=["numpy"],
        # torch 2.14.1's libtorch_cuda.so calls NCCL 2.29+/2.30 functions (ncclCommGrow,
        # ncclCommSuspend, ncclWinGetUserPtr, ...) that the node's 2.28.9 (torch 2.11's pin)
        # lacks: checked with `nm -D` here. The node's CUDA 13.0.2 libraries (cublas 13.1.0.3
        # vs the pinned 13.1.1.3: every cublas symbol torch 2.14.1 imports is defined there),
        # cudnn 9.19, cusparselt 0.8.0 and nvshmem 3.4.5 are used as they are.
        replace_node=["nvidia-nccl-cu13", "torchvision"],
        chunk_mb=60,
        ferry_large=True,
        notes=[
            "Node: H200, CUDA 13, Python 3.12.3, torch 2.11.0+cu130 preinstalled, no network;",
            "its packages: node/locks/node-h200-cu130-py312.freeze.txt.  Built with",
            "  python node/wheelhouse.py build --profile h200-cu130-py312-sglang0.5.23 "
            "--out .wh523",
            "Installed with --target /tmp/site523 beside the 0.5.17 profile's /tmp/site.",
            "Wheels over 60 MB (torch, triton, sglang-kernel, nccl, flashinfer) are in big/ and",
            "travel in parts: node/ferry.py split, gpu_node.sh ferry-recv / ferry-join.",
            "Node libraries used instead of torch 2.14.1's pins (ABI-checked with nm -D):",
            "  cuda-toolkit 13.0.2 libs (cublas 13.1.0.3), nvidia-cudnn-cu13, cusparselt,",
            "  nvshmem 3.4.5.  Shipped although the node has one: nvidia-nccl-cu13 (torch",
            "  2.14.1 calls NCCL 2.30 functions), torchvision (the node's is built for 2.11).",
            "  The node's versions, as pip listed them there on 2026-12-01:",
            "  node/locks/node-h200-cu130-py312.pip-list-2026-12-01.txt.",
            "nvidia-cutlass-dsl with its cu13 libraries (not cu12): SGLang 0.5.23's LlamaMLP",
            "  imports `cutlass` on Hopper; its .pth file does not run from a --target site, so",
            "  gpu_node.sh puts nvidia_cutlass_dsl/dsl_packages on PYTHONPATH.",
        ],
        lock=LOCKS / "sglang-0.5.23-h200-cu130-py312.lock",
    ),
}


# --------------------------------------------------------------------------------------------
# Target environment, freeze files, requirements
# --------------------------------------------------------------------------------------------


def target_environment(python_version: str, platforms: Sequence[str]) -> dict[str, str]:
    """Marker environment of the *node*, so markers are never evaluated against this machine.

    Every key PEP 508 defines is set; ``extra`` is empty, so ``extra == "x"`` requirements (only
    wanted when someone asks for that extra) evaluate to False.
    """
    parts = python_version.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        raise WheelhouseError(
            f"--python-version must look like 3.12 or 3.12.3, got {python_version}"
        )
    full = ".".join(parts + ["0"] * (3 - len(parts)))
    machine = "x86_64"
    for tag in platforms:
        if tag != "any":
            machine = re.sub(r"^(manylinux|musllinux|linux)(_\d+_\d+|\d+)?_", "", tag)
            break
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": full,
        "python_version": ".".join(parts[:2]),
        "sys_platform": "linux",
        "extra": "",
    }


def requirement_applies(req: Requirement, env: dict[str, str]) -> bool:
    """True when ``req`` is needed on the target: no marker, or a marker true for ``env``."""
    return req.marker is None or req.marker.evaluate(env)


def read_freeze(path: Path) -> dict[str, Version | None]:
    """Parse ``pip freeze`` output into {normalised name: version, or None if unknown}.

    ``name==v`` / ``name===v`` give a version; ``name``, ``name @ url`` and ``-e ...#egg=name``
    mean present at an unknown version.  A version that is not PEP 440 also counts as unknown.
    """
    node: dict[str, Version | None] = {}
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-e ", "--editable ")):
            egg = re.search(r"#egg=([A-Za-z0-9._-]+)", raw)
            if egg:
                node[canonicalize_name(egg.group(1))] = None
            continue
        if line.startswith("-"):
            continue
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(===?\s*(\S+))?", line)
        if not match:
            raise WheelhouseError(f"{path}: cannot parse freeze line {raw!r}")
        name, version = match.group(1), match.group(3)
        try:
            node[canonicalize_name(name)] = Version(version) if version else None
        except InvalidVersion:
            node[canonicalize_name(name)] = None
    return node


def node_satisfies(node: dict[str, Version | None], name: str, specifier: SpecifierSet) -> bool:
    """Whether the node's copy of ``name`` can be used instead of shipping a wheel.

    A package present at an unknown version satisfies any specifier (see the module docstring).
    Pre-releases and local versions (``2.11.0+cu130``) count: they are what the node runs.
    """
    key = canonicalize_name(name)
    if key not in node:
        return False
    version = node[key]
    return version is None or specifier.contains(version, prereleases=True)


def read_requirements(wheel: Path) -> list[Requirement]:
    """The ``Requires-Dist`` entries of a wheel's METADATA (unparseable ones are reported)."""
    with zipfile.ZipFile(wheel) as zf:
        names = [
            n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
        ]
        if len(names) != 1:
            raise WheelhouseError(f"{wheel.name}: expected one .dist-info/METADATA, got {names}")
        text = zf.read(names[0]).decode("utf-8")
    reqs = []
    for line in HeaderParser().parsestr(text).get_all("Requires-Dist") or []:
        try:
            reqs.append(Requirement(line))
        except InvalidRequirement as exc:
            log(f"  ! {wheel.name}: ignoring unparseable Requires-Dist {line!r}: {exc}")
    return reqs


def parse_named_requirements(values: Iterable[str], what: str) -> dict[str, Requirement]:
    """--pin / --add values as {normalised name: Requirement}; later values win."""
    out: dict[str, Requirement] = {}
    for value in values:
        try:
            req = Requirement(value)
        except InvalidRequirement as exc:
            raise WheelhouseError(f"bad {what} {value!r}: {exc}") from exc
        out[canonicalize_name(req.name)] = req
    return out


# --------------------------------------------------------------------------------------------
# Downloading and resolving
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Target:
    """What pip must download for: the node's interpreter and platform tags."""

    python_version: str
    platforms: Sequence[str]
    pip: Sequence[str] = (sys.executable, "-m", "pip")

    def pip_download_args(self) -> list[str]:
        """Arguments that make ``pip download`` pick wheels for the node, not for this host.

        With ``--implementation cp`` and no ``--abi`` pip accepts cpXY, abi3 (also older
        ``cp3N-abi3``) and ``none``; ``py3-none-any`` wheels always match.
        """
        args = [
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--implementation",
            "cp",
            "--python-version",
            self.python_version,
        ]
        for platform in self.platforms:
            args += ["--platform", platform]
        return args


def pip_download(requirement: str, target: Target, dest: Path) -> Path:
    """Download the one wheel pip picks for ``requirement`` on the target into ``dest``.

    A scratch folder per call tells us unambiguously which file pip chose (pip's HTTP cache
    keeps repeated runs fast).
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wh-dl-") as tmp:
        cmd = [*target.pip, *target.pip_download_args(), "-q", "-d", tmp, requirement]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            raise WheelhouseError(f"pip download {requirement!r} failed:\n{tail}")
        files = [p for p in Path(tmp).iterdir() if p.suffix == ".whl"]
        if len(files) != 1:
            raise WheelhouseError(f"pip download {requirement!r} produced {files}")
        final = dest / files[0].name
        shutil.move(str(files[0]), final)
        return final


@dataclasses.dataclass
class Resolution:
    """Outcome of a resolution, kept for the build report and the lock header."""

    wheels: dict[str, Path] = dataclasses.field(default_factory=dict)
    from_node: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> "==v"
    excluded: set[str] = dataclasses.field(default_factory=set)
    ignored_extras: set[str] = dataclasses.field(default_factory=set)
    pin_overrides: list[str] = dataclasses.field(default_factory=list)
    kept_despite: list[str] = dataclasses.field(default_factory=list)


def combined_specifier(reqs: Iterable[Requirement]) -> SpecifierSet:
    """Intersection of every specifier seen for one name."""
    spec = SpecifierSet()
    for req in reqs:
        spec &= req.specifier
    return spec


def wheel_version(path: Path) -> Version:
    """Version from a wheel filename (the filename is authoritative for pip too)."""
    return parse_wheel_filename(path.name)[1]


def resolve(
    roots: Sequence[Requirement],
    env: dict[str, str],
    node: dict[str, Version | None],
    pins: dict[str, Requirement],
    excludes: set[str],
    fetch,
    keep_node: Iterable[str] = (),
) -> Resolution:
    """Walk the dependency closure breadth-first, downloading one wheel per needed name.

    ``fetch(requirement_string) -> Path`` downloads a wheel (injectable for tests).  The walk is
    deliberately simple (no backtracking): pip picks the newest version that meets every
    specifier seen so far; when a later specifier rules out a chosen wheel it is fetched again
    with the combined specifier.  A pinned name always uses its pin, a ``keep_node`` name always
    uses the node's copy (both report the specifiers they override).  Requests for extras
    (``pkg[x]``) are reported and not followed.
    """
    keep = {canonicalize_name(n) for n in keep_node}
    res = Resolution()
    seen: dict[str, list[Requirement]] = {}
    queue: deque[tuple[Requirement, str]] = deque((req, "<root>") for req in roots)
    while queue:
        req, parent = queue.popleft()
        name = canonicalize_name(req.name)
        if not requirement_applies(req, env):
            continue
        if req.extras:
            res.ignored_extras.add(f"{parent} -> {req.name}[{','.join(sorted(req.extras))}]")
        if name in excludes:
            res.excluded.add(name)
            continue
        seen.setdefault(name, []).append(req)
        if name in keep and name in node:
            version = node[name]
            if version is not None and not req.specifier.contains(version, prereleases=True):
                res.kept_despite.append(f"node's {name} {version} although {parent} wants {req}")
            res.from_node[name] = f"=={version}" if version else " (any version)"
            continue
        if name in pins:
            spec = pins[name].specifier  # conflicts with other specifiers are reported below
            if name in res.wheels:
                continue
        else:
            spec = combined_specifier(seen[name])
            if name in res.wheels:
                if spec.contains(wheel_version(res.wheels[name]), prereleases=True):
                    continue
                log(f"  ~ {name}: {res.wheels[name].name} violates {spec} (from {parent}); refetch")
                res.wheels.pop(name).unlink()
        if node_satisfies(node, name, spec):
            version = node[name]
            res.from_node[name] = f"=={version}" if version else " (any version)"
            continue
        res.from_node.pop(name, None)
        wheel = fetch(f"{name}{spec}")
        log(f"  + {wheel.name}  (for {parent}: {req})")
        res.wheels[name] = wheel
        for dep in read_requirements(wheel):
            queue.append((dep, name))
    for name, reqs in seen.items():
        if name in pins and name in res.wheels:
            version = wheel_version(res.wheels[name])
            for req in reqs:
                if not req.specifier.contains(version, prereleases=True):
                    res.pin_overrides.append(f"{name}=={version} (pinned) overrides {req}")
    return res


# --------------------------------------------------------------------------------------------
# Stripping members from a wheel
# --------------------------------------------------------------------------------------------


def record_hash(data: bytes) -> str:
    """Hash in RECORD format: ``sha256=`` + urlsafe base64 without padding (PEP 376/427)."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def parse_strip_rules(values: Iterable[str]) -> dict[str, list[str]]:
    """``DIST:PATTERN`` values as {normalised dist name: [patterns]}."""
    rules: dict[str, list[str]] = {}
    for value in values:
        dist, sep, pattern = value.partition(":")
        if not sep or not dist or not pattern:
            raise WheelhouseError(f"--strip wants DIST:PATTERN, got {value!r}")
        rules.setdefault(canonicalize_name(dist), []).append(pattern)
    return rules


def member_matches(member: str, pattern: str) -> bool:
    """Whether a zip member is selected by a strip pattern.

    * ``dir/`` (trailing slash): everything under a directory of that name at any depth, e.g.
      ``sm100/`` matches ``sgl_kernel/sm100/x.so`` (``pkg/sm100/`` limits it to that path);
    * a pattern without ``/``: glob on the basename, e.g. ``flash_ops.abi3.so`` or ``*.so``;
    * otherwise: glob on the whole member path.
    """
    if pattern.endswith("/"):
        return ("/" + member).find("/" + pattern) != -1
    if "/" not in pattern:
        return fnmatch.fnmatchcase(member.rsplit("/", 1)[-1], pattern)
    return fnmatch.fnmatchcase(member, pattern)


def strip_wheel(wheel: Path, patterns: Sequence[str]) -> list[str]:
    """Remove the members matching ``patterns`` from ``wheel`` in place; return their names.

    The wheel's RECORD is rewritten without the removed files' lines (pip reads RECORD to know
    what it installed; stale lines would break uninstall and checkers), other RECORD lines are
    kept byte for byte, and the filename is unchanged.  ``.dist-info`` members are never removed,
    and a pattern that matches nothing is an error (it usually means the wheel changed layout).
    """
    with zipfile.ZipFile(wheel) as src:
        infos = src.infolist()
        record_names = [
            i.filename for i in infos if re.fullmatch(r"[^/]+\.dist-info/RECORD", i.filename)
        ]
        if len(record_names) != 1:
            raise WheelhouseError(f"{wheel.name}: expected one .dist-info/RECORD")
        record_name = record_names[0]
        dist_info = record_name.split("/", 1)[0] + "/"
        removed: list[str] = []
        for pattern in patterns:
            hits = [
                i.filename
                for i in infos
                if not i.filename.startswith(dist_info) and member_matches(i.filename, pattern)
            ]
            if not hits:
                raise WheelhouseError(f"{wheel.name}: strip pattern {pattern!r} matches nothing")
            removed += [h for h in hits if h not in removed]
        gone = set(removed)
        record = rewrite_record(src.read(record_name).decode("utf-8"), gone)
        tmp = wheel.with_name(wheel.name + ".tmp")
        with zipfile.ZipFile(tmp, "w") as dst:
            for info in infos:
                if info.filename in gone:
                    continue
                data = record.encode("utf-8") if info.filename == record_name else src.read(info)
                dst.writestr(info, data, compress_type=info.compress_type)
    os.replace(tmp, wheel)
    return removed


def rewrite_record(record: str, removed: set[str]) -> str:
    """RECORD text without the lines of ``removed`` files (the other lines stay verbatim)."""
    kept = []
    for line in record.splitlines(keepends=True):
        fields = next(csv.reader([line]), [])
        if fields and fields[0] in removed:
            continue
        kept.append(line)
    return "".join(kept)


def check_record(wheel: Path) -> list[str]:
    """Problems between a wheel's RECORD and its members (empty list = consistent).

    Every member except RECORD itself must be listed with the right sha256 and size, and every
    listed file must exist: what ``pip`` and ``installer`` expect of a valid wheel.
    """
    problems = []
    with zipfile.ZipFile(wheel) as zf:
        files = {i.filename for i in zf.infolist() if not i.is_dir()}
        record_name = next(f for f in files if re.fullmatch(r"[^/]+\.dist-info/RECORD", f))
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode("utf-8"))))
        listed = {row[0]: row for row in rows if row}
        for name in sorted(files - set(listed)):
            problems.append(f"not in RECORD: {name}")
        for name, row in sorted(listed.items()):
            if name not in files:
                problems.append(f"in RECORD but missing: {name}")
            elif name != record_name:
                data = zf.read(name)
                if row[1] != record_hash(data) or row[2] != str(len(data)):
                    problems.append(f"hash/size mismatch: {name}")
    return problems


# --------------------------------------------------------------------------------------------
# Chunks, install script, lock
# --------------------------------------------------------------------------------------------


def plan_chunks(
    sizes: dict[str, int], limit_bytes: int, first: Sequence[str] = ()
) -> list[list[str]]:
    """Pack wheels into as few chunks as first-fit-decreasing finds, each <= ``limit_bytes``.

    A wheel that alone exceeds the limit cannot be carried at all, so that is an error naming it
    (strip it, or raise ``--chunk-mb``).  Order is deterministic (size, then name).  The wheels
    named in ``first`` (file names) all start chunk 1; the rest fill the room left.
    """
    oversize = [f"{n} ({s / MB:.1f} MB)" for n, s in sizes.items() if s > limit_bytes]
    if oversize:
        raise WheelhouseError(
            f"wheel larger than the chunk limit of {limit_bytes / MB:.0f} MB: "
            + ", ".join(sorted(oversize))
        )
    used = sum(sizes[n] for n in first)
    if used > limit_bytes:
        raise WheelhouseError(
            f"the first chunk's wheels take {used / MB:.1f} MB, over {limit_bytes / MB:.0f} MB"
        )
    chunks: list[list[str]] = [list(first)] if first else []
    room: list[int] = [limit_bytes - used] if first else []
    for name in sorted(set(sizes) - set(first), key=lambda n: (-sizes[n], n)):
        for i, free in enumerate(room):
            if sizes[name] <= free:
                chunks[i].append(name)
                room[i] -= sizes[name]
                break
        else:
            chunks.append([name])
            room.append(limit_bytes - sizes[name])
    return [sorted(chunk) for chunk in chunks]


# What the fixture pipelines train with before SGLang is installed (node/gpu_node.sh
# speed-start / suite-start carry chunk s1 alone): transformers/tokenizers pinned like
# SGLang's, speculators and what it imports (speculators.train.data imports openai).
TRAINING_FIRST = (
    "transformers", "tokenizers", "speculators", "datasets", "hs-connectors", "multiprocess",
    "pydantic-settings", "python-dotenv", "pydantic", "pydantic-core", "annotated-types",
    "typing-inspection", "loguru", "dill", "openai", "distro", "jiter", "sniffio",
)


def plan_chunks_first(
    sizes: dict[str, int], first: Sequence[str], limit_bytes: int
) -> list[list[str]]:
    """``plan_chunks`` with the wheels of the distributions in ``first`` all in chunk 1 (so
    one carry can start work that needs only them)."""
    wanted = {canonicalize_name(n) for n in first}
    head = [n for n in sizes if canonicalize_name(parse_wheel_filename(n)[0]) in wanted]
    missing = wanted - {canonicalize_name(parse_wheel_filename(n)[0]) for n in head}
    if missing:
        raise WheelhouseError(f"no wheel for {', '.join(sorted(missing))} in the folder")
    return plan_chunks(sizes, limit_bytes, first=head)


@dataclasses.dataclass
class LockEntry:
    """One wheel of a lock: exact file, its sha256 and size, and the upstream sha if stripped."""

    filename: str
    sha256: str
    size: int
    upstream_sha256: str | None = None


@dataclasses.dataclass
class Lock:
    """An exact wheel set plus the options needed to download it again."""

    entries: list[LockEntry]
    python_version: str
    platforms: list[str]
    strips: list[str]
    notes: list[str] = dataclasses.field(default_factory=list)


def render_lock(lock: Lock) -> str:
    """Text of a lock file: comment header, ``@`` option lines, one line per wheel."""
    lines = [
        LOCK_HEADER,
        "# Exact wheel set: filename, sha256 and size of the file that is installed (for a",
        "# stripped wheel also the sha256 of the upstream file).  Check a folder with",
        "#   python node/wheelhouse.py verify --lock THIS_FILE DIR",
        "# and download it again with",
        "#   python node/wheelhouse.py build --lock THIS_FILE --out DIR",
    ]
    for note in lock.notes:  # long generated notes are wrapped; comments are not parsed
        lines += textwrap.wrap(note, 98, initial_indent="# ", subsequent_indent="#   ") or ["#"]
    lines.append(f"@python-version {lock.python_version}")
    lines.append("@platform " + " ".join(lock.platforms))
    lines += [f"@strip {rule}" for rule in lock.strips]
    total = sum(e.size for e in lock.entries)
    lines.append(f"# {len(lock.entries)} wheels, {total / MB:.1f} MB")
    for e in sorted(lock.entries, key=lambda e: e.filename.lower()):
        line = f"{e.filename} sha256={e.sha256} size={e.size}"
        if e.upstream_sha256:
            line += f" upstream-sha256={e.upstream_sha256}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def read_lock(path: Path) -> Lock:
    """Parse a lock written by :func:`render_lock` (comment lines are ignored)."""
    lock = Lock(entries=[], python_version="", platforms=[], strips=[])
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            key, _, value = line[1:].partition(" ")
            if key == "python-version":
                lock.python_version = value.strip()
            elif key == "platform":
                lock.platforms = value.split()
            elif key == "strip":
                lock.strips.append(value.strip())
            else:
                raise WheelhouseError(f"{path}: unknown lock option {key!r}")
            continue
        filename, attrs = lock_line(line)
        lock.entries.append(
            LockEntry(filename, attrs["sha256"], int(attrs["size"]), attrs.get("upstream-sha256"))
        )
    if not lock.python_version or not lock.platforms:
        raise WheelhouseError(f"{path}: missing @python-version or @platform line")
    return lock


def find_wheel(folder: Path, filename: str) -> Path | None:
    """A wheel in ``folder`` itself or in one of its chunk subfolders ``c1/``, ``c2/`` ..."""
    for candidate in [
        folder / filename,
        *sorted(folder.glob(f"c*/{filename}")),
        folder / "big" / filename,
    ]:
        if candidate.is_file():
            return candidate
    return None


def verify_folder(lock: Lock, folder: Path) -> list[str]:
    """Differences between ``folder`` (flat or chunked) and the lock: missing, changed, extra."""
    problems = []
    wanted = set()
    for entry in lock.entries:
        wanted.add(entry.filename)
        path = find_wheel(folder, entry.filename)
        if path is None:
            problems.append(f"missing: {entry.filename}")
        elif path.stat().st_size != entry.size:
            problems.append(
                f"size mismatch: {entry.filename} ({path.stat().st_size} != {entry.size})"
            )
        elif sha256_file(path) != entry.sha256:
            problems.append(f"sha256 mismatch: {entry.filename}")
    present = {
        p.name for p in [*folder.glob("*.whl"), *folder.glob("c*/*.whl"), *folder.glob("big/*.whl")]
    }
    problems += [f"not in lock: {name}" for name in sorted(present - wanted)]
    return problems


def render_install_sh(lock: Lock, title: str) -> str:
    """A bash installer listing every wheel (with sha256) that finds them flat or in ``c*/``."""
    entries = sorted(lock.entries, key=lambda e: e.filename.lower())
    listing = "\n".join(f"  {e.sha256}  {e.filename}" for e in entries)
    return f"""#!/usr/bin/env bash
# Offline install of {title}: {len(entries)} wheels, generated by node/wheelhouse.py.
#
# The wheels may sit next to this script or in chunk folders c1/ c2/ ... beside it, or in
# $WHEELS (flat or chunked).  Chunks can be copied into one folder, e.g.
#   mkdir -p /tmp/wh && cp -r .wh/install.sh .wh/c1 /tmp/wh/   # then c2, c3, ... one by one
#   (or: cp .wh/c*/*.whl /tmp/wh/ for a flat folder)
#   WHEELS=/tmp/wh TARGET=/tmp/site bash /tmp/wh/install.sh
#   export PYTHONPATH=/tmp/site${{PYTHONPATH:+:$PYTHONPATH}}
# Variables: WHEELS (default: this script's folder), TARGET (default /tmp/site),
#            PYTHON (default python3), WH_VERIFY=0 skips the sha256 check.
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
WHEELS="${{WHEELS:-$HERE}}"
TARGET="${{TARGET:-/tmp/site}}"
PYTHON="${{PYTHON:-python3}}"

LIST='
{listing}
'

paths=()
checks=""
missing=0
while read -r sha name; do
  [ -n "$name" ] || continue
  found=""
  for candidate in "$WHEELS/$name" "$WHEELS"/c*/"$name"; do
    if [ -f "$candidate" ]; then found="$candidate"; break; fi
  done
  if [ -z "$found" ]; then echo "missing wheel: $name" >&2; missing=1; continue; fi
  paths+=("$found")
  checks+="$sha  $found"$'\\n'
done <<< "$LIST"
if [ "$missing" != 0 ]; then echo "copy every chunk into $WHEELS first" >&2; exit 1; fi
if [ "${{WH_VERIFY:-1}}" != 0 ]; then printf '%s' "$checks" | sha256sum -c --quiet -; fi

"$PYTHON" -m pip install --no-index --no-deps --no-compile --upgrade \\
  --disable-pip-version-check --target "$TARGET" "${{paths[@]}}"
echo "installed ${{#paths[@]}} wheels into $TARGET; export PYTHONPATH=$TARGET"
"""


# --------------------------------------------------------------------------------------------
# Build
# --------------------------------------------------------------------------------------------


def log(message: str) -> None:
    """Progress on stderr (stdout stays for the summary)."""
    print(message, file=sys.stderr, flush=True)


def apply_strips(wheels: dict[str, Path], rules: dict[str, list[str]]) -> dict[str, str]:
    """Strip the wheels named in ``rules``; return {filename: upstream sha256}."""
    upstream = {}
    missing = set(rules) - set(wheels)
    if missing:
        raise WheelhouseError(f"--strip names wheels that are not in the set: {sorted(missing)}")
    for name, patterns in rules.items():
        wheel = wheels[name]
        upstream[wheel.name] = sha256_file(wheel)
        before = wheel.stat().st_size
        removed = strip_wheel(wheel, patterns)
        log(
            f"  - stripped {len(removed)} members from {wheel.name}: "
            f"{before / MB:.1f} -> {wheel.stat().st_size / MB:.1f} MB"
        )
    return upstream


def write_output(
    wheels: Sequence[Path],
    lock: Lock,
    out: Path,
    chunk_mb: int,
    lock_name: str,
    title: str,
    lock_text: str | None = None,
    ferry_large: bool = False,
) -> list[tuple[str, int]]:
    """Lay out ``out``: chunk folders, install.sh and the lock; return [(chunk, bytes)].

    With ``ferry_large`` a wheel larger than a chunk goes to ``out/big/`` (for
    ``node/ferry.py split``) instead of failing the build.

    Previous chunk folders, install.sh and ``*.lock`` in ``out`` are replaced so a re-run never
    mixes wheel sets.  ``lock_text`` (a lock that was built from) is copied verbatim, so its
    comments survive; otherwise the lock is rendered.
    """
    sizes = {w.name: w.stat().st_size for w in wheels}
    large = sorted(n for n, size in sizes.items() if ferry_large and size > chunk_mb * MB)
    chunks = plan_chunks({n: s for n, s in sizes.items() if n not in large}, chunk_mb * MB)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        if old.is_dir() and (re.fullmatch(r"c\d+", old.name) or old.name == "big"):
            shutil.rmtree(old)
        elif old.name == "install.sh" or old.suffix == ".lock":
            old.unlink()
    by_name = {w.name: w for w in wheels}
    summary = []
    for index, chunk in enumerate(chunks, start=1):
        folder = out / f"c{index}"
        folder.mkdir()
        for name in chunk:
            shutil.copy2(by_name[name], folder / name)
        summary.append((folder.name, sum(sizes[n] for n in chunk)))
    if large:
        (out / "big").mkdir()
        for name in large:
            shutil.copy2(by_name[name], out / "big" / name)
        summary.append(("big", sum(sizes[n] for n in large)))
    script = out / "install.sh"
    script.write_text(render_install_sh(lock, title))
    script.chmod(0o755)
    (out / lock_name).write_text(lock_text if lock_text is not None else render_lock(lock))
    return summary


def build_from_resolution(args, profile: Profile | None, work: Path) -> tuple[list[Path], Lock]:
    """Resolve the closure for the options/profile and download + strip the wheels."""

    def pick(cli_value, profile_value):
        """A command-line value overrides the profile's."""
        return cli_value if cli_value is not None else profile_value

    sglang = pick(args.sglang, profile and profile.sglang)
    if not sglang:
        raise WheelhouseError("give --sglang VERSION or --profile")
    python_version = pick(args.python_version, profile and profile.python_version) or "3.12"
    platforms = args.platform or list(profile.platforms if profile else DEFAULT_PLATFORMS)
    freeze = pick(args.node_freeze, profile and profile.node_freeze)
    pins = parse_named_requirements([*(profile.pins if profile else []), *args.pin], "--pin")
    adds = [*(profile.adds if profile else []), *args.add]
    keep_node = [*(profile.keep_node if profile else []), *args.keep_node]
    excludes = {
        canonicalize_name(n) for n in [*(profile.excludes if profile else []), *args.exclude]
    }
    strips = [*(profile.strips if profile else []), *args.strip]
    rules = parse_strip_rules(strips)

    target = Target(python_version, platforms)
    env = target_environment(python_version, platforms)
    node = read_freeze(Path(freeze)) if freeze else {}
    for name in profile.replace_node if profile else []:
        node.pop(canonicalize_name(name), None)
    roots = [Requirement(f"sglang=={sglang}"), *parse_named_requirements(adds, "--add").values()]
    log(f"resolving {', '.join(map(str, roots))} for cp{python_version} ({len(node)} on node)")
    fetch = lambda r: pip_download(r, target, work)  # noqa: E731
    res = resolve(roots, env, node, pins, excludes, fetch, keep_node)
    upstream = apply_strips(res.wheels, rules)

    notes = list(profile.notes if profile else [])
    notes += [f"excluded (reached but not shipped): {', '.join(sorted(res.excluded))}"]
    notes += [f"pin: {p}" for p in sorted(pins.values(), key=str)]
    notes += [f"added (undeclared): {a}" for a in adds]
    notes += [f"pin override: {p}" for p in res.pin_overrides]
    notes += [f"kept: {k}" for k in res.kept_despite]
    notes.append(
        "taken from the node: " + ", ".join(f"{n}{v}" for n, v in sorted(res.from_node.items()))
    )
    notes += [f"extra not followed: {e}" for e in sorted(res.ignored_extras)]
    unused = sorted(excludes - res.excluded)
    if unused:
        notes.append(f"excludes never reached: {', '.join(unused)}")
    wheels = sorted(res.wheels.values(), key=lambda p: p.name.lower())
    lock = Lock(
        entries=[
            LockEntry(w.name, sha256_file(w), w.stat().st_size, upstream.get(w.name))
            for w in wheels
        ],
        python_version=python_version,
        platforms=list(platforms),
        strips=strips,
        notes=notes,
    )
    return wheels, lock


def build_from_lock(args, work: Path) -> tuple[list[Path], Lock]:
    """Download exactly the wheels of a lock, re-apply its strips and check every sha256."""
    lock = read_lock(Path(args.lock))
    target = Target(args.python_version or lock.python_version, args.platform or lock.platforms)
    rules = parse_strip_rules(lock.strips)
    wheels: dict[str, Path] = {}
    for entry in lock.entries:
        name, version, *_ = parse_wheel_filename(entry.filename)
        path = pip_download(f"{name}=={version}", target, work)
        if path.name != entry.filename:
            raise WheelhouseError(f"lock wants {entry.filename}, pip chose {path.name}")
        log(f"  + {path.name}")
        wheels[canonicalize_name(name)] = path
    upstream = apply_strips(wheels, rules)
    for entry in lock.entries:
        path = work / entry.filename
        if entry.upstream_sha256 and upstream.get(entry.filename) != entry.upstream_sha256:
            raise WheelhouseError(f"{entry.filename}: upstream sha256 differs from the lock")
        if sha256_file(path) != entry.sha256:
            raise WheelhouseError(
                f"{entry.filename}: sha256 differs from the lock"
                + (" after stripping (zlib differs?)" if entry.upstream_sha256 else "")
            )
    return sorted(wheels.values(), key=lambda p: p.name.lower()), lock


def cmd_build(args) -> int:
    """``build``: resolve (or read a lock), download, strip, chunk, write install.sh + lock."""
    profile = PROFILES[args.profile] if args.profile else None
    out = Path(args.out)
    chunk_mb = args.chunk_mb or (profile.chunk_mb if profile else 60)
    with tempfile.TemporaryDirectory(prefix="wh-work-") as tmp:
        if args.lock:
            wheels, lock = build_from_lock(args, Path(tmp))
            lock_name = Path(args.lock).name
            lock_text = Path(args.lock).read_text()
            title = lock_name.removesuffix(".lock")
        else:
            wheels, lock = build_from_resolution(args, profile, Path(tmp))
            sglang = args.sglang or profile.sglang
            title = f"sglang-{sglang}-{args.profile or 'custom'}"
            lock_name = f"{title}.lock"
            lock_text = None
        ferry_large = args.ferry_large or bool(profile and profile.ferry_large)
        summary = write_output(
            wheels, lock, out, chunk_mb, lock_name, title, lock_text, ferry_large
        )
    total = sum(size for _, size in summary)
    for chunk, size in summary:
        print(f"{out / chunk}: {size / MB:.1f} MB")
    print(
        f"{len(wheels)} wheels, {total / MB:.1f} MB total; {out / lock_name}, {out / 'install.sh'}"
    )
    if profile and profile.lock and profile.lock.exists() and not args.lock:
        drift = diff_lists(read_lock(profile.lock), [e.filename for e in lock.entries])
        if drift:
            print(f"differs from {profile.lock.relative_to(REPO_ROOT)}:\n  " + "\n  ".join(drift))
    return 0


def diff_lists(lock: Lock, filenames: Sequence[str]) -> list[str]:
    """Per-package differences between a lock and a plain list of wheel filenames."""

    def versions(names: Iterable[str]) -> dict[str, str]:
        return {canonicalize_name(parse_wheel_filename(n)[0]): n for n in names}

    ours = versions(e.filename for e in lock.entries)
    theirs = versions(filenames)
    lines = []
    for name in sorted(ours.keys() | theirs.keys()):
        a, b = ours.get(name), theirs.get(name)
        if a == b:
            continue
        if a is None:
            lines.append(f"only in list: {b}")
        elif b is None:
            lines.append(f"only in lock: {a}")
        else:
            lines.append(f"lock {a} vs list {b}")
    return lines


def cmd_verify(args) -> int:
    """``verify``: exit 1 if the folder misses, changes or adds wheels relative to the lock."""
    problems = verify_folder(read_lock(Path(args.lock)), Path(args.folder))
    if args.ignore_extra:  # a folder that also holds other wheels (the training subset)
        problems = [p for p in problems if not p.startswith("not in lock: ")]
    for problem in problems:
        print(problem)
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def cmd_diff(args) -> int:
    """``diff``: compare a lock with a text file of wheel filenames (``#`` comments ignored)."""
    names = [
        line.strip()
        for line in Path(args.list).read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    lines = diff_lists(read_lock(Path(args.lock)), names)
    print("\n".join(lines) if lines else "same wheel set")
    return 1 if lines else 0


def cmd_split(args) -> int:
    """``split``: re-pack the wheels of a folder (flat or chunked) into ``s1/ s2/ ...`` with
    the ``--first`` distributions in ``s1`` (hard links where possible)."""
    folder = Path(args.folder)
    wheels = {p.name: p for p in [*folder.glob("*.whl"), *sorted(folder.glob("c*/*.whl"))]}
    first = args.first.split(",") if args.first else list(TRAINING_FIRST)
    chunks = plan_chunks_first(
        {n: p.stat().st_size for n, p in wheels.items()}, first, args.chunk_mb * MB
    )
    for old in folder.iterdir():
        if old.is_dir() and re.fullmatch(r"s\d+", old.name):
            shutil.rmtree(old)
    for index, chunk in enumerate(chunks, start=1):
        out = folder / f"s{index}"
        out.mkdir()
        for name in chunk:
            try:
                (out / name).hardlink_to(wheels[name])
            except OSError:
                shutil.copy2(wheels[name], out / name)
        size = sum(wheels[n].stat().st_size for n in chunk)
        print(f"{out.name}: {len(chunk)} wheels, {size / MB:.1f} MB")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Command line: ``build``, ``verify``, ``diff``, ``split``."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="resolve + download + strip + chunk")
    b.add_argument("--out", required=True, help="output folder (chunks c1/ c2/ ..., install.sh)")
    b.add_argument("--profile", choices=sorted(PROFILES), help="known node profile")
    b.add_argument("--lock", help="download exactly the wheels of this lock (no resolution)")
    b.add_argument("--sglang", help="SGLang version, e.g. 0.5.17")
    b.add_argument("--python-version", help="node Python, e.g. 3.12 or 3.12.3 (default 3.12)")
    b.add_argument(
        "--platform",
        action="append",
        default=[],
        help="node platform tag, repeatable (default: manylinux 2_17..2_39 x86_64 + aliases)",
    )
    b.add_argument("--node-freeze", help="pip freeze of the node (packages not to ship)")
    b.add_argument("--pin", action="append", default=[], help="NAME==VER forced when reached")
    b.add_argument("--add", action="append", default=[], help="extra top-level requirement")
    b.add_argument("--exclude", action="append", default=[], help="never ship NAME (nor its deps)")
    b.add_argument(
        "--keep-node",
        action="append",
        default=[],
        help="use the node's NAME even where a specifier rules its version out",
    )
    b.add_argument(
        "--strip", action="append", default=[], help="DIST:PATTERN members to drop from a wheel"
    )
    b.add_argument("--chunk-mb", type=int, help="max chunk size in MB of 10^6 bytes (default 60)")
    b.add_argument(
        "--ferry-large",
        action="store_true",
        help="put wheels over a chunk in OUT/big/ for node/ferry.py (default: the profile's)",
    )
    b.set_defaults(func=cmd_build)

    v = sub.add_parser("verify", help="check a folder (flat or chunked) against a lock")
    v.add_argument("--lock", required=True)
    v.add_argument("folder")
    v.add_argument(
        "--ignore-extra", action="store_true", help="wheels the lock does not list are fine"
    )
    v.set_defaults(func=cmd_verify)

    d = sub.add_parser("diff", help="compare a lock with a list of wheel filenames")
    d.add_argument("--lock", required=True)
    d.add_argument("list")
    d.set_defaults(func=cmd_diff)

    s = sub.add_parser("split", help="re-pack into s1/ s2/ ... with some distributions first")
    s.add_argument("folder", help="a build's output (chunked c1/ c2/ ... or flat)")
    s.add_argument("--first", help="comma-separated distributions for s1 (default: training)")
    s.add_argument("--chunk-mb", type=int, default=60)
    s.set_defaults(func=cmd_split)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; user errors print one line and exit 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except WheelhouseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
