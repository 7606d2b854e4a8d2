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
        # speculators' config sets `_auto_class`, so transformers' save_pretrained copies the
        # config class's source (speculators/models/eagle3/config.py) next to config.json for
        # trust_remote_code loading. Nothing here loads it that way: ship no speculators source.
        shutil.copytree(tmp, BUNDLED, ignore=shutil.ignore_patterns("*.py"))
    for path in sorted(BUNDLED.rglob("*")):
        if path.is_file():
            print(f"{path.stat().st_size:>8}  {path.relative_to(BUNDLED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
