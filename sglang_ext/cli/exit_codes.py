"""The one exit-code convention of every `sglang-ext` command (README "Exit codes").

0 ok. 1 the input has errors: the drafter or target named on the command line cannot be used
as one (doctor/demo verdict ERROR, including a path that does not exist or cannot be read, an
empty directory, a symlink loop), a drafter `convert` cannot use, failed benchmark requests or
accept length below --min-accept-length, a plugin that does not register. 2 usage or refusal:
bad arguments (a --url that is not http(s)://HOST[:PORT] too), a server that cannot be reached,
`convert` refusing lossy math or a destination that would lose data, `demo --out` not empty, a
file sglang-ext cannot write. A reader that closes stdout early (`doctor --json | head -1`) is
not an error: the command keeps its own code.

:data:`EXIT_CODES` is the one table from an exception to a code; the commands raise, and
:func:`fail` (called by ``cli.main`` and the commands' own ``main``) prints the sentence and
returns the code.
"""

from __future__ import annotations

import os
import sys

from sglang_ext.drafter.checkpoint_files import DrafterLoadError
from sglang_ext.drafter.config_fields import DrafterConfigError

OK, INPUT_ERROR, USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad arguments or an environment that does not allow the command (exit 2)."""


class Refused(UsageError):
    """The command refuses to do what would lose data or fidelity (exit 2)."""


class InputError(ValueError):
    """A file named on the command line that cannot be used as what it should be (exit 1)."""


# First match wins: (exception type, exit code, how the message is labelled).
EXIT_CODES: tuple[tuple[type[BaseException], int, str], ...] = (
    (Refused, USAGE, "refused"),
    (UsageError, USAGE, "error"),
    (DrafterConfigError, INPUT_ERROR, "error"),
    (DrafterLoadError, INPUT_ERROR, "error"),
    (InputError, INPUT_ERROR, "error"),
    (OSError, USAGE, "error"),  # a file sglang-ext cannot write (disk full, permissions)
)


def code_for(exc: BaseException) -> tuple[int, str]:
    """The exit code and label of an exception; anything not in the table is a bug (1)."""
    for kind, code, label in EXIT_CODES:
        if isinstance(exc, kind):
            return code, label
    return INPUT_ERROR, "internal error"


def fail(command: str, exc: BaseException) -> int:
    """Print `exc` as one sentence on stderr and return its exit code (no traceback, except
    under SGLANG_EXT_DEBUG=1)."""
    if isinstance(exc, BrokenPipeError):
        silence_stdout()
        return OK
    code, label = code_for(exc)
    prefix = f"sglang-ext {command}: " if command else "sglang-ext: "
    if label == "internal error":
        print(
            f"{prefix}internal error: {type(exc).__name__}: {exc}. This is a bug in sglang-ext; "
            "rerun with SGLANG_EXT_DEBUG=1 for the traceback and report it",
            file=sys.stderr,
        )
    else:
        print(f"{prefix}{label}: {exc}", file=sys.stderr)
    return code


def debugging() -> bool:
    return os.environ.get("SGLANG_EXT_DEBUG") == "1"


def silence_stdout() -> None:
    """The reader closed stdout (`| head`): point it at devnull so that the interpreter's own
    flush at exit does not fail too (Python docs, signal module, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass


def emit(text: str) -> None:
    """Print `text` on stdout; a reader that stops reading early is not an error."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
