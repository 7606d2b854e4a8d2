"""Regenerate the few-KB demo fixture bundled in sglang_ext/data/demo (used by `sglang-ext demo`
when speculators is not installed). Built by speculators' own code via sglang_ext.demo."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

from sglang_ext.demo import BUNDLED, make_demo


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # relative paths: the drafter's verifier name_or_path reads "target"
        make_demo(Path("."))
        shutil.rmtree(BUNDLED, ignore_errors=True)
        shutil.copytree(tmp, BUNDLED)
    for path in sorted(BUNDLED.rglob("*")):
        if path.is_file():
            print(f"{path.stat().st_size:>8}  {path.relative_to(BUNDLED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
