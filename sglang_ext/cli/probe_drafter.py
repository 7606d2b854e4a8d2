"""`sglang-ext probe-drafter SRC DST`: a never-right twin of a drafter, for `tune`'s cost probe.

`sglang-ext tune` predicts a setting's speedup as tau / cycle_cost, the cycle's cost measured by a
zero-acceptance probe (every verify cycle emits one token, timed against no speculation). Dummy
weights (``--load-format dummy``) give zero acceptance, but an MoE target on dummy weights routes
every token to the same experts (:mod:`sglang_ext.cli.moe_fanout`), so verifying n draft tokens
reads no more experts than decoding one. On one H200 at the split-expert rank shape of
Kimi-K2.5 (32 experts, top-8; issue #24, 2026-12-03) the trained cycles were 0.25-0.47 decode
steps above the dummy probe's, while the byte model of the fan-out said 0.98-1.30: the advice
built on them was off by 26-38 %.

The twin is the drafter with its final norm's weight negated: the same files, shapes, kernels
and bytes, so the same cost, but its logits are the drafter's negated, and every draft is the
token it ranks least likely, which the target accepts only by chance. Served against the real
target, the probe's verify passes route the draft tokens through the target's own router, so
the fan-out is in the measured cost. The final norm belongs to the drafter in every layout
(unlike lm_head, which SGLang takes from the target when the config has no draft vocabulary),
and the rule holds for any draft vocabulary (d2t) and for trees (the top-k of the negated logits
are the k least likely tokens).

Only the file holding the norm is rewritten; every other file is copied byte for byte. DST must
be new or empty (as for convert: the twin is never written over data), and a PROBE_DRAFTER.md
inside it says what it is, so nobody serves it by mistake.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from sglang_ext.cli import exit_codes
from sglang_ext.cli.convert import ConversionRefused, check_destination, publish
from sglang_ext.drafter.checkpoint_files import DrafterLoadError, weight_files
from sglang_ext.drafter.config_fields import DrafterConfigError
from sglang_ext.drafter.speculators_format import load_drafter_spec

# The drafter's final norm, as checkpoints name it (speculators and SGLang layouts alike;
# sglang_ext.drafter.key_table: "norm.weight" -> "model.norm.weight").
FINAL_NORM_NAMES = ("norm.weight", "model.norm.weight")
NOTE = "PROBE_DRAFTER.md"


class ProbeDrafterError(exit_codes.InputError):
    """A drafter whose final norm cannot be found or rewritten (names files and tensors)."""


def find_final_norm(source: Path) -> tuple[Path, str]:
    """The weight file and tensor name of the drafter's final norm; exactly one must exist."""
    from safetensors import safe_open

    found, pickled = [], []
    for path in weight_files(source):
        if path.suffix != ".safetensors":
            pickled.append(path.name)
            continue
        with safe_open(str(path), framework="pt") as handle:
            found += [(path, name) for name in handle.keys() if name in FINAL_NORM_NAMES]
    if len(found) == 1:
        return found[0]
    if not found and pickled:
        raise ProbeDrafterError(
            f"{source}: the final norm ({' or '.join(FINAL_NORM_NAMES)}) is not in a "
            f".safetensors file, and pickled weights ({', '.join(pickled)}) are not rewritten; "
            "save the drafter as safetensors first"
        )
    shown = ", ".join(f"{p.name}:{n}" for p, n in found) or "none"
    raise ProbeDrafterError(
        f"{source}: expected exactly one final norm tensor ({' or '.join(FINAL_NORM_NAMES)}), "
        f"found {shown}"
    )


def write_probe_drafter(src: str | Path, dst: str | Path, overwrite: bool = False) -> dict:
    """Write the twin of drafter `src` into `dst`; returns what was changed."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, dst = Path(src), Path(os.path.abspath(dst))
    check_destination(src, dst, overwrite, "probe-drafter")
    spec = load_drafter_spec(src)  # a drafter SGLang or the plugin would load, or an error
    norm_file, norm_name = find_final_norm(Path(spec.source))
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = dst.with_name(f".{dst.name}.probe-{uuid.uuid4().hex[:8]}")
    try:
        # every file but the one rewritten below (a shard can be gigabytes)
        rewritten = norm_file.resolve()
        shutil.copytree(
            spec.source,
            staging,
            ignore=lambda d, names: [n for n in names if (Path(d) / n).resolve() == rewritten],
        )
        with safe_open(str(norm_file), framework="pt") as handle:
            metadata = handle.metadata()
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        tensors[norm_name] = -tensors[norm_name]
        save_file(tensors, str(staging / norm_file.name), metadata=metadata)
        changed = {
            "source": str(spec.source),
            "file": norm_file.name,
            "tensor": norm_name,
            "change": "negated: the drafter's logits are negated, every draft is its least "
            "likely token",
        }
        (staging / NOTE).write_text(
            "# A never-right probe drafter (sglang-ext probe-drafter)\n\n"
            "For `sglang-ext tune`'s zero-acceptance cost probe only: the same cost as the "
            "drafter below, almost no accepted draft. Do not serve it for speed.\n\n"
            + json.dumps(changed, indent=2)
            + "\n"
        )
        check_destination(
            src, dst, overwrite, "probe-drafter"
        )  # again: DST may have changed meanwhile
        publish(staging, dst)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return changed


def main(args) -> int:
    """Exit 0 written, 1 the drafter has errors, 2 refused (exit_codes)."""
    try:
        changed = write_probe_drafter(args.src, args.dst, args.overwrite)
    except OSError as exc:
        return exit_codes.fail("probe-drafter", OSError(f"cannot write {args.dst}: {exc}"))
    except (DrafterConfigError, DrafterLoadError, ConversionRefused, ProbeDrafterError) as exc:
        return exit_codes.fail("probe-drafter", exc)
    print(
        f"wrote {args.dst}: {changed['file']}:{changed['tensor']} negated (a zero-acceptance "
        "probe drafter for `sglang-ext tune --costs`; not for serving)"
    )
    return exit_codes.OK
