"""The public-config corpus on the GPU (issue 22, item 8): each published drafter (scaled by
tests/public_configs.py's rule, random weights in its published layout) served with the plugin
next to a dummy-weight target built from the corpus target config (`--load-format dummy`),
triton, 3/1/4. Doctor's verdict must equal the startup outcome, and requests must succeed.
Records RESULTS["public_configs"] = {name: {doctor, server, requests_ok}}.

The servers start together, in one batch with fixed pools (suite.launch), in a module-scoped
fixture, and stop at the end of the module.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from harness import Server
from suite import PORT_BASE, RESULTS, launch, stop, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the corpus builder
from public_configs import build, manifest, record  # noqa: E402

from sglang_ext import doctor  # noqa: E402

NAMES = sorted(manifest()["drafters"])
PORT_OFFSET = 500  # clear of the suite's cluster ports
PROMPTS = [list(range(10 + i, 42 + i)) for i in range(4)]  # ids inside every scaled vocab
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("public-configs")
    built, servers = {}, []
    for i, name in enumerate(NAMES):
        drafter, target, entry = build(name, root)
        built[name] = (drafter, target, doctor.diagnose(drafter, target))
        servers.append(
            Server(
                name=f"public_{name}",
                model=str(target),
                port=PORT_BASE + PORT_OFFSET + i,
                draft=str(drafter),
                extra=["--load-format", "dummy", "--dtype", "bfloat16"],
            )
        )
    servers = launch(servers, "public_configs_startup")
    by_name = {s.name.removeprefix("public_"): s for s in servers}
    RESULTS["public_configs"] = {}
    try:
        yield built, by_name
    finally:
        stop(servers)
        write_results()


@pytest.mark.parametrize("name", NAMES)
def test_doctor_verdict_equals_startup_and_requests_succeed(corpus, name):
    built, servers = corpus
    if name not in servers:
        pytest.skip(f"server public_{name} not started (SGLANG_EXT_SERVERS)")
    _, _, diagnosis = built[name]
    server = servers[name]
    responses = None
    if server.status == "ready":
        responses = []
        for prompt in PROMPTS:
            try:
                responses.append(server.generate(prompt, NEW_TOKENS))
            except Exception as exc:  # noqa: BLE001 - recorded, asserted below
                responses.append({"error": f"{type(exc).__name__}: {exc}"})
    entry = record(diagnosis.verdict, server.status, responses)
    if entry["server"] == "fails":
        entry["startup_error"] = server.startup_error()
    RESULTS["public_configs"][name] = entry
    assert entry["doctor"] == entry["server"], (
        f"{name}: doctor predicted {entry['doctor']} ({diagnosis.errors}), the server "
        f"{server.status}: {server.startup_error()}"
    )
    if entry["server"] == "starts":
        assert entry["requests_ok"], f"{name}: {responses}"
        context = [w for w in diagnosis.warnings if "drafter context length" in w]
        if context:  # the startup WARNING says the same sentence as doctor
            assert context[0] in server.log_text()
