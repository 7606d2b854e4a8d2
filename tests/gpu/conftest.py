"""GPU tests: real SGLang servers on a CUDA machine. Marked `gpu`; skipped without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no torch / broken driver: no GPU tests
        return False


def _phase(item) -> float:
    """Run order, one pytest process on one GPU: the public-config corpus (dummy targets, no
    trained fixture: it runs while the fixtures train), then the llama tests (the MLA
    servers start in the background meanwhile), the seed case, `alone` (timed tests that
    stop every server but suite.ALONE_KEEP first; the seed case's speed before the others),
    `late` (the soak, on the plugin server, once the timing is done), and the TP=2 phase
    (which stops the TP=1 servers)."""
    name = Path(item.path).name
    if name == "test_tp2.py":
        return 5
    if item.get_closest_marker("late"):
        return 4
    if item.get_closest_marker("alone"):
        return 3 if name == "test_seed_case.py" else 3.5
    if name == "test_public_configs.py":
        return 0
    return 2 if name == "test_seed_case.py" else 1


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if HERE in Path(item.path).parents]
    if not gpu_items:
        return
    items.sort(key=lambda item: _phase(item) if HERE in Path(item.path).parents else -1)
    skip = (
        None
        if _cuda_available()
        else pytest.mark.skip(
            reason="needs a CUDA GPU (real SGLang servers); run `pytest -m gpu` on a GPU node"
        )
    )
    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
        if skip is not None:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Every GPU test that will run is "not run" until it reports: a session cut short says
    which tests it never reached (the seventh run's results just lacked the soak). After
    deselection (-k, -m), on a GPU only."""
    gpu_items = [item for item in session.items if HERE in Path(item.path).parents]
    if not gpu_items or not _cuda_available():
        return
    from harness import OUTCOMES

    for item in gpu_items:
        OUTCOMES.setdefault(item.nodeid.split("::", 1)[-1], "not run")


FAILURE_TAIL_CHARS = 4000  # the assertion line and the values it printed


def pytest_runtest_logreport(report):
    """Record each GPU test's outcome so the results JSON says which criteria held."""
    if "tests/gpu/" not in report.nodeid:
        return
    import time

    from harness import DURATIONS, FAILURES, FINISHED_AT, OUTCOMES

    name = report.nodeid.split("::", 1)[-1]
    if report.when in ("setup", "call"):
        DURATIONS[name] = round(DURATIONS.get(name, 0.0) + report.duration, 1)
    if report.when == "teardown":  # the timeline: where the suite's time went, gaps included
        FINISHED_AT[name] = time.strftime("%H:%M:%S", time.gmtime(getattr(report, "stop", None)))
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        OUTCOMES[name] = report.outcome
    if report.failed:
        FAILURES[name] = f"{report.when}: {report.longreprtext[-FAILURE_TAIL_CHARS:]}"
    if report.when == "call":
        # The results file after every test that ran, not only at the session's end: a
        # session cut short (the machine taken back, a limit) keeps what it measured (the
        # 2026-12-01 run lost 22 tests' figures that way). Tests skipped without a GPU
        # have no call phase, so a CPU run writes nothing.
        from suite import write_results

        write_results(quiet=True)


# The session's servers and no-speculation baselines (suite.py), shared by every test module.
from suite import cluster, llama_baseline, mla_baseline  # noqa: E402, F401
