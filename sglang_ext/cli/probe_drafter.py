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

A drafter `sglang-ext doctor SRC` marks ERROR gets no twin: the same checks run first (doctor's
``diagnose``; without --target, so the aux layers are not checked against a target), and the
refusal quotes doctor's errors on one line, exit 1, before anything is written. A source file
that cannot be read is named as the source's problem; only a failed write blames DST (exit 2).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import uuid
from pathlib import Path

from sglang_ext.cli import exit_codes
from sglang_ext.cli.convert import ConversionRefused, check_destination, publish
from sglang_ext.drafter.checkpoint_files import (
    DrafterLoadError,
    TensorInfo,
    nonfinite_count,
    read_checkpoint,
    read_safetensors_header,
    weight_files,
)
from sglang_ext.drafter.config_fields import DrafterConfigError
from sglang_ext.drafter.loading import FLOAT_DTYPES
from sglang_ext.drafter.speculators_format import load_drafter_spec

# The drafter's final norm, as checkpoints name it (speculators and SGLang layouts alike;
# sglang_ext.drafter.key_table: "norm.weight" -> "model.norm.weight").
FINAL_NORM_NAMES = ("norm.weight", "model.norm.weight")
NOTE = "PROBE_DRAFTER.md"
DOCTOR_ERRORS_SHOWN = 5  # doctor's errors quoted in the one-line refusal; the rest are counted
_COPY_CHUNK = 1 << 24  # bytes per read while copying the source's files


class ProbeDrafterError(exit_codes.InputError):
    """A drafter whose final norm cannot be found or rewritten (names files and tensors)."""


class _StagingWriteFailed(Exception):
    """Carries an OSError of a write into the staging directory out of shutil.copytree (which
    would collect it and go on copying): a write failure is DST's problem, not the source's."""


def find_final_norm(source: Path) -> tuple[Path, TensorInfo]:
    """The weight file and header entry of the drafter's final norm; exactly one must exist.
    Every safetensors file's header is validated as doctor validates it
    (checkpoint_files.read_safetensors_header), so a corrupt file is named with its problem."""
    found: list[tuple[Path, TensorInfo]] = []
    pickled = []
    for path in weight_files(source):
        if path.suffix != ".safetensors":
            pickled.append(path.name)
            continue
        found += [(path, t) for t in read_safetensors_header(path) if t.name in FINAL_NORM_NAMES]
    if len(found) == 1:
        return found[0]
    if not found and pickled:
        raise ProbeDrafterError(
            f"{source}: the final norm ({' or '.join(FINAL_NORM_NAMES)}) is not in a "
            f".safetensors file, and pickled weights ({', '.join(pickled)}) are not rewritten; "
            "save the drafter as safetensors first"
        )
    shown = ", ".join(f"{p.name}:{t.name}" for p, t in found) or "none"
    raise ProbeDrafterError(
        f"{source}: expected exactly one final norm tensor ({' or '.join(FINAL_NORM_NAMES)}), "
        f"found {shown}"
    )


def check_negatable(path: Path, tensor: TensorInfo) -> None:
    """The norm's weight must be a float a drafter parameter holds (negating BOOL fails, U8
    wraps around) and finite (a NaN norm has no least likely token). Doctor refuses such a norm
    first; this keeps the negation meaningful whatever doctor's rules become."""
    if tensor.dtype not in FLOAT_DTYPES:
        raise ProbeDrafterError(
            f"{path}: tensor {tensor.name!r} is {tensor.dtype}; expected a final norm weight in "
            f"{'/'.join(sorted(FLOAT_DTYPES))} to negate"
        )
    bad = nonfinite_count(path.parent, tensor)
    if bad:
        raise ProbeDrafterError(
            f"{path}: tensor {tensor.name!r} has {bad} of {math.prod(tensor.shape)} values NaN or "
            "Inf; expected finite values (its negation would propose no least likely token)"
        )


def refuse_what_doctor_refuses(src: str | Path, source: Path) -> None:
    """Run `sglang-ext doctor SRC` (no --target: probe-drafter has none) and refuse, exit 1,
    with doctor's errors on one line, each prefixed with the file it is about when doctor's own
    sentence names no path (a tensor problem names the weight file holding that tensor)."""
    from sglang_ext.cli.doctor import diagnose

    errors = diagnose(src).errors
    if not errors:
        return
    try:
        files = {t.name: source / t.file for t in read_checkpoint(source)}
    except DrafterLoadError:
        files = {}
    located = []
    for error in errors:
        error = " ".join(line.strip() for line in error.splitlines() if line.strip())
        subject = error.split(": ", 1)[0]
        if subject in files:
            error = f"{files[subject]}: {error}"
        elif os.sep not in subject and not subject.startswith((str(src), str(source))):
            error = f"{source}: {error}"
        located.append(error)
    message = "; ".join(located[:DOCTOR_ERRORS_SHOWN])
    if len(located) > DOCTOR_ERRORS_SHOWN:
        message += (
            f"; ... and {len(located) - DOCTOR_ERRORS_SHOWN} more "
            f"(`sglang-ext doctor {src}` lists them)"
        )
    raise ProbeDrafterError(message)


def _copy_file(source_name: str, staged_name: str) -> None:
    """copytree's copy function: a source file that cannot be read is named as the source's
    problem (exit 1), a staged file that cannot be written as DST's (OSError, exit 2)."""

    def unreadable(exc: OSError) -> ProbeDrafterError:
        return ProbeDrafterError(f"{source_name}: cannot read ({exc.strerror or exc})")

    try:
        mode = os.stat(source_name).st_mode
    except OSError as exc:
        raise unreadable(exc) from exc
    if not stat.S_ISREG(mode):  # a FIFO would block the read, a device never end
        found = (
            "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file"
        )  # fmt: skip
        raise ProbeDrafterError(
            f"{source_name}: expected a regular file to copy into the twin, found {found}"
        )
    try:
        reader = open(source_name, "rb")  # noqa: SIM115 - a with statement would not tell
    except OSError as exc:  # a failed read from a failed write
        raise unreadable(exc) from exc
    with reader:
        try:
            with open(staged_name, "wb") as writer:
                while True:
                    try:
                        chunk = reader.read(_COPY_CHUNK)
                    except OSError as exc:
                        raise unreadable(exc) from exc
                    if not chunk:
                        break
                    writer.write(chunk)
            shutil.copystat(source_name, staged_name)
        except OSError as exc:
            raise _StagingWriteFailed(exc) from exc


def _read_norm_file(norm_file: Path) -> tuple[dict | None, dict]:
    """The metadata and tensors of the file holding the norm; a read failure names the file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(norm_file), framework="pt") as handle:
            metadata = handle.metadata()
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except (OSError, SafetensorError) as exc:
        raise ProbeDrafterError(f"{norm_file}: cannot read ({exc})") from exc
    return metadata, tensors


def write_probe_drafter(src: str | Path, dst: str | Path, overwrite: bool = False) -> dict:
    """Write the twin of drafter `src` into `dst`; returns what was changed. Refuses (exit 1)
    any drafter doctor marks ERROR, with doctor's message, before writing anything."""
    from safetensors.torch import save_file

    src, dst = Path(src), Path(os.path.abspath(dst))
    check_destination(src, dst, overwrite, "probe-drafter")
    spec = load_drafter_spec(src)  # a drafter SGLang or the plugin would load, or an error
    source = Path(spec.source)
    norm_file, norm = find_final_norm(source)
    refuse_what_doctor_refuses(src, source)
    check_negatable(norm_file, norm)
    norm_name = norm.name
    metadata, tensors = _read_norm_file(norm_file)
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = dst.with_name(f".{dst.name}.probe-{uuid.uuid4().hex[:8]}")
    try:
        # every file but the one rewritten below (a shard can be gigabytes)
        try:
            shutil.copytree(
                str(source),
                staging,
                ignore=lambda d, names: [n for n in names if Path(d) / n == norm_file],
                copy_function=_copy_file,
            )
        except _StagingWriteFailed as exc:
            raise exc.args[0] from exc
        except shutil.Error as exc:  # listing or linking, collected by copytree
            first = exc.args[0][0]
            raise OSError(f"{first[0]} -> {first[1]}: {first[2]}") from exc
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
