"""aux_lens on a tiny random Llama: one share per hidden state, the final one agreeing with
itself, and an existing result never overwritten."""

from __future__ import annotations

import json

import torch

from sglang_ext_tools.fixtures import aux_lens
from sglang_ext_tools.fixtures.targets import build_llama

SHAPE = dict(num_hidden_layers=3, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
             head_dim=16, intermediate_size=64)  # fmt: skip


def _fixtures(tmp_path):
    torch.manual_seed(0)
    model = build_llama(dict(SHAPE), 64).eval()
    model.save_pretrained(tmp_path / "small-target")
    torch.save({"heldout": torch.randint(0, 64, (4, 24))}, tmp_path / "distill.pt")
    return model


def test_one_share_per_hidden_state_and_the_last_is_the_target_itself(tmp_path):
    model = _fixtures(tmp_path)
    tokens = torch.load(tmp_path / "distill.pt")["heldout"]
    shares = aux_lens.lens_agreement(model, tokens, 8)
    assert len(shares) == SHAPE["num_hidden_layers"] + 1
    assert shares[-1] == 1.0 and all(0 <= x <= 1 for x in shares)


def test_the_cli_reads_a_fixtures_folder_and_never_overwrites(tmp_path, capsys):
    _fixtures(tmp_path)
    out = tmp_path / "lens.json"
    argv = ["--fixtures", str(tmp_path), "--prompt-len", "8", "--out", str(out)]
    assert aux_lens.main(argv) == 0
    got = json.loads(out.read_text())
    assert got["target_layers"] == 3 and got["positions"] == 4 * 16 and got["drafter"] is None
    assert aux_lens.main(argv) == 1 and "never overwritten" in capsys.readouterr().err
    assert aux_lens.main(["--fixtures", str(tmp_path / "none")]) == 1
