"""Build-time check of the sglang-ext plugin image: a `pip check` for the plugin alone.

The Dockerfile installs the plugin wheel with `pip install --no-deps` so that pip never
re-resolves the SGLang/torch/CUDA stack of the base image; this script then checks what
`--no-deps` skipped:

* every requirement of the installed `sglang-ext` distribution (`sglang>=...,<...`,
  `safetensors`, ...) is installed in a version that satisfies it, and
* with `--expect-sglang VERSION`, the installed SGLang is exactly the version the image was
  built for (the `SGLANG_VERSION` build argument), so that a base image pinned by digest
  cannot silently carry another SGLang than the tag it claims.

It prints one line per requirement and exits 1 on any failure. Only the standard library
and `packaging` (a dependency of SGLang; pip's vendored copy otherwise) are used.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import sys

try:
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover - pip always vendors packaging
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef]

DIST = "sglang-ext"


def check(dist_name: str, expect_sglang: str | None) -> list[str]:
    """Return the problems found (empty when the installation is sound)."""
    problems: list[str] = []
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        return [f"{dist_name} is not installed"]
    print(f"{dist_name} {dist.version}")
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an optional extra, or a requirement for another platform
        try:
            installed = md.version(req.name)
        except md.PackageNotFoundError:
            problems.append(f"{dist_name} requires {req}, which is not installed")
            continue
        ok = req.specifier.contains(installed, prereleases=True)
        print(f"  requires {req}: installed {req.name} {installed} {'ok' if ok else 'NO'}")
        if not ok:
            problems.append(f"{dist_name} requires {req}, but {req.name} {installed} is installed")
    if expect_sglang:
        try:
            installed = md.version("sglang")
        except md.PackageNotFoundError:
            problems.append("SGLang is not installed")
        else:
            try:
                same = Version(installed) == Version(expect_sglang)
            except InvalidVersion:
                same = installed == expect_sglang
            print(f"  sglang {installed}, expected {expect_sglang}: {'ok' if same else 'NO'}")
            if not same:
                problems.append(
                    f"the base image has SGLang {installed}, but the image is built for "
                    f"SGLANG_VERSION={expect_sglang}: pass the matching --build-arg "
                    "SGLANG_VERSION with SGLANG_IMAGE"
                )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", default=DIST, help="distribution to check (default %(default)s)")
    parser.add_argument("--expect-sglang", metavar="VERSION", help="required SGLang version")
    args = parser.parse_args(argv)
    problems = check(args.dist, args.expect_sglang)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
