"""One way the analysis tools hand back a result: JSON printed, and written to ``--out``
where given (the tools refuse an existing ``--out`` before they compute anything)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(result: Any, out: Path | None) -> int:
    """Print ``result`` as indented JSON and write the same text to ``out`` if set; 0."""
    text = json.dumps(result, indent=1) + "\n"
    if out:
        out.write_text(text)
    print(text, end="")
    return 0
