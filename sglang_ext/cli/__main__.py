"""``python -m sglang_ext.cli``: the ``sglang-ext`` command, as the console script runs it."""

from sglang_ext.cli import main

raise SystemExit(main())
