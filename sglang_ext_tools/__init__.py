"""Tooling that tests, fixture scripts and benchmarks use, never a server: the offline EAGLE-3
reference loop (``reference``), function-preserving widening (``widen``), SGLang server
launcher (``launch``) and torch-profiler trace breakdown (``trace_breakdown``).

May import ``sglang_ext``; ``sglang_ext`` never imports this package
(``tests/test_layout.py`` checks it).
"""
