"""The TP=2 phase (tests/gpu/test_tp2.py) as far as a CPU can take it: the servers it starts,
read from their command lines (issue: TP=2 is not lent; this is the dry run of its flags)."""

from __future__ import annotations

import sys
from pathlib import Path

GPU = Path(__file__).resolve().parent / "gpu"
sys.path.insert(0, str(GPU))

import test_tp2 as phase  # noqa: E402


def flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def test_every_tp2_server_runs_two_ranks_with_cuda_graphs():
    servers = {s.name: s for s in phase.tp2_servers(iter(range(40000, 40100)))}
    assert set(servers) == {
        "tp2_nospec", "tp2_plugin", "tp2_guard", "tp2_mla_nospec", "tp2_mla_chain", "tp2_mla_tree"
    }  # fmt: skip
    for server in servers.values():
        command = server.command()
        assert flag(command, "--tp-size") == "2", server.name
        assert "--disable-cuda-graph" not in command, server.name
        assert len({s.port for s in servers.values()}) == len(servers)
    plugin = servers["tp2_plugin"]
    assert "--enable-metrics" in plugin.command()
    assert plugin.env["SGLANG_EXT_ACCEPTANCE_JSONL"] == str(phase.JSONL_TP2)
    chain, tree = servers["tp2_mla_chain"].command(), servers["tp2_mla_tree"].command()
    assert flag(chain, "--speculative-eagle-topk") == "1"
    assert flag(chain, "--speculative-num-draft-tokens") == "4"
    assert flag(tree, "--speculative-eagle-topk") == "4"  # the seed's tree: topk 4, 5 tokens
    assert flag(tree, "--speculative-num-draft-tokens") == "5"
    assert flag(servers["tp2_guard"].command(), "--speculative-draft-model-path").endswith(
        "llama4layer-sglang-drafter"
    )
    assert flag(plugin.command(), "--speculative-algorithm") == "EAGLE3"
    assert "--speculative-algorithm" not in servers["tp2_nospec"].command()


def test_without_mla_fixtures_the_phase_is_llama_only():
    names = [s.name for s in phase.tp2_servers(iter(range(40000, 40100)), mla=False)]
    assert names == ["tp2_nospec", "tp2_plugin", "tp2_guard"]
