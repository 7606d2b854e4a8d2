"""`sglang-ext convert SRC DST`: speculators drafter -> SGLang-native EAGLE-3 layout.

For users who cannot install the plugin. Stock SGLang cannot express some of speculators' math
(``sglang_ext.cli.doctor.math_stock_lacks``): conversion refuses such a drafter unless ``--force``,
and then writes down what will differ. With the plugin installed, convert nothing: point
``--speculative-draft-model-path`` at the speculators directory.

It never loses data: the destination must be new or empty (``--overwrite`` replaces a
non-empty one; ``--force`` only permits lossy math), must not be, contain or lie inside the
source, and the drafter is written into a temporary directory next to it that is renamed into
place only once complete.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from sglang_ext.cli import exit_codes
from sglang_ext.cli.doctor import math_stock_lacks
from sglang_ext.drafter.aux_capture import TargetInfo, sglang_ids_for_capture
from sglang_ext.drafter.checkpoint_files import (
    DrafterLoadError,
    read_checkpoint,
    read_pickle,
    weight_files,
)
from sglang_ext.drafter.config_fields import DrafterConfigError
from sglang_ext.drafter.key_table import stock_checkpoint_name
from sglang_ext.drafter.loading import plan_from_checkpoint
from sglang_ext.drafter.speculators_format import load_drafter_spec, stock_sglang_config_dict


class ConversionRefused(exit_codes.Refused):
    """convert will not write this destination or this lossy conversion (exit 2)."""


def converted_name(name: str, spec) -> str | None:
    """The SGLang-format name of a speculators tensor (None: dropped): the key table's column
    of stock SGLang's names."""
    if name == "t2d":
        return None
    return stock_checkpoint_name(name, "speculators")


def check_destination(src: Path, dst: Path, overwrite: bool, tool: str = "convert") -> None:
    """Refuse any destination whose replacement could lose data (`tool`: the command named)."""
    source, target = src.resolve(), dst.resolve()
    if not dst.name:
        raise ConversionRefused(f"{dst}: not a directory {tool} can create or replace")
    if target == source:
        raise ConversionRefused(
            f"{dst} is the source directory: {tool} writes a new drafter and never modifies "
            "the source; choose a DST outside SRC"
        )
    if source in target.parents:
        raise ConversionRefused(
            f"{dst} lies inside the source directory {src}; choose a DST outside SRC"
        )
    if target in source.parents:
        raise ConversionRefused(
            f"{dst} contains the source directory {src}: replacing it would delete the source; "
            "choose a DST outside SRC"
        )
    if dst.is_symlink():
        raise ConversionRefused(f"{dst} is a symbolic link; pass the directory it points to")
    if not dst.exists():
        return
    if not dst.is_dir():
        raise ConversionRefused(f"{dst} exists and is not a directory; choose a new DST")
    entries = sorted(p.name for p in dst.iterdir())
    if entries and not overwrite:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ConversionRefused(
            f"{dst} is not empty ({len(entries)} entries: {shown}); {tool} does not overwrite "
            "files. Choose a new DST, or pass --overwrite to replace that directory as a whole"
        )


def publish(staging: Path, dst: Path) -> None:
    """Move the complete `staging` directory to `dst`, replacing what `dst` held (checked by
    check_destination); on failure `dst` keeps its old contents."""
    if not dst.exists():
        os.replace(staging, dst)
        return
    replaced = dst.with_name(f".{dst.name}.replaced-{uuid.uuid4().hex[:8]}")
    os.replace(dst, replaced)
    try:
        os.replace(staging, dst)
    except BaseException:
        os.replace(replaced, dst)
        raise
    shutil.rmtree(replaced)


def convert(
    src: str | Path,
    dst: str | Path,
    target: str | Path | None = None,
    force: bool = False,
    overwrite: bool = False,
) -> list[str]:
    """Write the converted drafter; returns the list of behaviour differences (may be empty).

    `force` permits lossy math (the differences are written to DST/CONVERTED.md); `overwrite`
    permits replacing a non-empty DST. Neither permits a DST that overlaps SRC."""
    src, dst = Path(src), Path(os.path.abspath(dst))  # "." and ".." get a name to stage by
    check_destination(src, dst, overwrite)
    spec = load_drafter_spec(src)
    if spec.format != "speculators":
        raise ConversionRefused(f"{src} is already in SGLang format; nothing to convert")
    plan_from_checkpoint(spec, read_checkpoint(spec.source)).raise_for_errors()
    differences = math_stock_lacks(spec)
    if differences and not force:
        raise ConversionRefused(
            f"{src} uses math stock SGLang cannot express, so the converted drafter would run "
            "different math than it was trained with:\n  - "
            + "\n  - ".join(differences)
            + "\nInstall sglang-ext and serve the directory as is, or pass --force to convert "
            "anyway (acceptance will be lower)."
        )
    if target is not None:
        info = TargetInfo.from_path(target)
        problems = spec.target_problems(info)
        if problems:
            raise DrafterConfigError(
                f"{src} against the target {target}: " + "; ".join(problems)
            )
        ids = info.sglang_ids_for(spec.captured_layers(info))
    elif spec.aux_hidden_state_layer_ids:
        # Without a target, assume SGLang's llama/qwen rule (layers_to_capture = id + 1).
        ids = sglang_ids_for_capture(list(spec.aux_hidden_state_layer_ids), "plus_one")
        differences.append(
            "aux ids converted for llama/qwen-style targets (id - 1); pass --target for "
            "DeepSeek-family targets"
        )
    else:
        raise ConversionRefused(
            f"{src} names no eagle_aux_hidden_state_layer_ids; pass --target so the default can "
            "be resolved against the target's layer count"
        )

    config = stock_sglang_config_dict(spec, ids)

    notes = ["# Converted by sglang-ext convert", f"source: {src}", ""]
    if spec.sliding_layers:
        notes.append(
            f"Trained with sliding_window={spec.sliding_window}; the converted drafter is "
            "served with full attention (same math up to that many tokens); the plugin serves "
            "the speculators directory with the window on SGLang >= 0.5.23."
        )
    notes += [f"- differs: {d}" for d in differences] or ["No behaviour differences."]

    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = dst.with_name(f".{dst.name}.converting-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        write_converted(spec, staging, config, notes)
        check_destination(src, dst, overwrite)  # again: DST may have changed meanwhile
        publish(staging, dst)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return differences


def write_converted(spec, directory: Path, config: dict, notes: list[str]) -> None:
    """The converted drafter's files, into `directory` (a fresh staging directory)."""
    from safetensors.torch import load_file, save_file

    tensors = {}
    for path in weight_files(spec.source):
        read = load_file(str(path)) if path.suffix == ".safetensors" else read_pickle(path)
        for name, tensor in read.items():
            new = converted_name(name, spec)
            if new is not None:
                tensors[new] = tensor.contiguous()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "CONVERTED.md").write_text("\n".join(notes) + "\n")


def main(args) -> int:
    """Exit 0 converted, 1 the drafter or target has errors, 2 refused (exit_codes)."""
    try:
        differences = convert(args.src, args.dst, args.target, args.force, args.overwrite)
    except OSError as exc:
        return exit_codes.fail("convert", OSError(f"cannot write {args.dst}: {exc}"))
    except (DrafterConfigError, DrafterLoadError, ConversionRefused) as exc:
        return exit_codes.fail("convert", exc)
    print(f"wrote {args.dst} (SGLang-native EAGLE-3 layout)")
    for difference in differences:
        print(f"  differs: {difference}")
    return exit_codes.OK
