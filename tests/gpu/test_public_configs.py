"""The public-config corpus on the GPU: each published drafter (scaled by
tests/public_configs.py's rule, random weights in its published layout) served with the plugin
next to a dummy-weight target built from the corpus target config (`--load-format dummy`),
triton, 3/1/4. Doctor's verdict must equal the startup outcome, and requests must succeed.
Records RESULTS["public_configs"] = {name: {doctor, server, requests_ok}}.

The servers need no trained fixture: they start together in a phase of their own
(suite.public_config_servers, where doctor's diagnosis of each is taken before any server runs);
on the node they run while the fixtures train (node/gpu_node.sh one-pipeline).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from suite import PUBLIC_CONFIGS, RESULTS, launch, public_config_servers, stop, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the corpus builder
from public_configs import manifest, record  # noqa: E402

NAMES = sorted(manifest()["drafters"])
PROMPTS = [list(range(10 + i, 42 + i)) for i in range(4)]  # ids inside every scaled vocab
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def public(tmp_path_factory):
    """The corpus servers, started together in a phase of their own; results written when the
    module ends (a pipeline folds them into the main run's file: suite.merge_earlier_phase)."""
    from suite import PORT_BASE

    servers = launch(public_config_servers(iter(range(PORT_BASE + 500, PORT_BASE + 600))),
                     "public_configs_startup")  # fmt: skip
    try:
        yield {s.name: s for s in servers}
    finally:
        stop(servers)
        write_results()


@pytest.mark.parametrize("name", NAMES)
def test_doctor_verdict_equals_startup_and_requests_succeed(public, name):
    if f"public_{name}" not in public:
        pytest.skip(f"server public_{name} not started (SGLANG_EXT_SERVERS)")
    server = public[f"public_{name}"]
    diagnosis = PUBLIC_CONFIGS[name]["diagnosis"]
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
    RESULTS.setdefault("public_configs", {})[name] = entry
    assert entry["doctor"] == entry["server"], (
        f"{name}: doctor predicted {entry['doctor']} ({diagnosis.errors}), the server "
        f"{server.status}: {server.startup_error()}"
    )
    if entry["server"] == "starts":
        assert entry["requests_ok"], f"{name}: {responses}"
        context = [w for w in diagnosis.warnings if "drafter context length" in w]
        if context:  # the startup WARNING says the same sentence as doctor
            assert context[0] in server.log_text()
