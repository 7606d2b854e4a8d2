"""`sglang-ext demo`: the product's main job on an embedded default, on any machine.

Writes the demo's drafter and Llama target config (`sglang_ext.demo`), then prints the doctor
report: what the plugin will load, the aux layers the target will capture, and what stock SGLang
would do with that drafter.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sglang_ext import demo
from sglang_ext.cli import doctor, exit_codes


def main(args) -> int:
    """Exit 0 for verdict OK, 1 for ERROR, 2 when --out holds anything (exit_codes)."""
    if args.out:
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            refused = exit_codes.Refused(f"{out} exists and is not a directory")
            return exit_codes.fail("demo", refused)
        if out.is_dir() and any(out.iterdir()):
            refused = exit_codes.Refused(
                f"{out} is not empty; the demo writes drafter/ and target/ into a new or "
                "empty directory and never overwrites files"
            )
            return exit_codes.fail("demo", refused)
    else:
        out = Path(tempfile.mkdtemp(prefix="sglang-ext-demo-"))
    origin = demo.drafter_origin()
    target, drafter = demo.make_demo(out)
    exit_codes.emit(
        f"{origin}, in {drafter}, and wrote a Llama target config in {target} (config.json "
        f"only, no weights: enough for doctor, not for a server). Files: {out} (kept)\n"
    )
    diagnosis = doctor.diagnose(drafter, target)
    exit_codes.emit(doctor.format_text(diagnosis))
    exit_codes.emit(
        "\n(The 'stock SGLang' line is doctor's prediction from the config and tensor names; "
        "no server was started.)\n"
        "Serve it (GPU node, plugin installed, unchanged SGLang command, a real target's "
        "weights):\n"
        f"  sglang serve --model-path TARGET --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {drafter}"
    )
    return exit_codes.OK if diagnosis.verdict == "OK" else exit_codes.INPUT_ERROR
