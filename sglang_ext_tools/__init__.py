"""Tooling that tests, the fixture builders and benchmarks use, never a server: the offline
EAGLE-3 reference loop (``reference``), function-preserving widening (``widen``), SGLang
server launcher (``launch``), torch-profiler trace breakdown (``trace_breakdown``), the speed
benchmark (``bench_speed``) and the fixture builders (``fixtures``). CLIs run as
``python -m sglang_ext_tools.<module>`` from the repository root.

May import ``sglang_ext``; ``sglang_ext`` never imports this package
(``tests/test_layout.py`` checks it).
"""
