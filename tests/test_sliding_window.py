"""speculators' per-layer sliding window as SGLang serves it (SGLang 0.5.23 and 0.5.17).

speculators keeps S = `sliding_window` keys per query, its own included
(models/eagle3/attention.py: create_combined_mask_mod). SGLang 0.5.23's triton backend keeps
`min(keys, w)` on decode (update_sliding_window_buffer, the model-level window) and
`q - k <= w` on extend (the layer's sliding_window_size): the plugin gives the model S and
each sliding layer S - 1. Older SGLang serves the window as full attention, with a warning.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from sglang_ext import compat
from sglang_ext.drafter.drafter_spec import DrafterSpec

pytest.importorskip("speculators", reason="the test checkpoints are written by speculators")

LOGGER = "sglang_ext.models.llama_eagle3"


def speculators_keys(window: int, length: int, query: int) -> set[int]:
    """Keys speculators' own mask lets `query` see in a one-document sequence."""
    from speculators.models.eagle3.attention import create_combined_mask_mod

    mask = create_combined_mask_mod(torch.zeros(length, dtype=torch.long), length, window)
    zero, q = torch.tensor(0), torch.tensor(query)
    return {k for k in range(length) if bool(mask(zero, zero, q, torch.tensor(k)))}


def served_windows(window: int) -> tuple[int, int]:
    """(layer window, model window) the plugin serves for a speculators window (only the
    window fields of DrafterSpec matter)."""
    spec = SimpleNamespace(sliding_window=window, sliding_layers=(0,))
    return DrafterSpec.sglang_window_size(spec), DrafterSpec.sglang_decode_window(spec)


# -- the compat table -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "supported"),
    [("0.5.17", False), ("0.5.22", False), ("0.5.23", True), ("0.5.24.dev3", True),
     ("0.6.0rc1", True), ("garbage", False)],
)
def test_draft_layer_window_table(version, supported):
    assert compat.supports("draft_layer_window", version) is supported


def test_unknown_feature_is_named():
    with pytest.raises(KeyError, match="no_such_feature"):
        compat.supports("no_such_feature", "0.5.23")


# -- the key-count convention, per path -------------------------------------------------------


class _RecordingTranslator:
    """Stands in for SGLang's KV index translator: records which keys the window keeps."""

    window_kv_kind = None

    def pack_read_stream(self, plan, *, seq_lens, kv_start_idx, **_):
        self.lens, self.start = seq_lens.clone(), kv_start_idx.clone()
        return True


# SGLang's window rail as 0.5.23 builds it (a translator, on CPU); 0.5.17-0.5.22 fill it with a
# Triton kernel and serve no windowed drafter (compat's draft_layer_window), so nothing to hold
needs_window_rail = pytest.mark.skipif(
    not compat.supports("draft_layer_window"),
    reason=f"SGLang {compat.sglang_version()} has no draft-layer window (compat.FEATURE_SINCE)",
)


def sglang_window_rows(window: int, lengths: list[int]) -> list[range]:
    """The key positions SGLang's triton backend keeps per row with a model window `window`
    (its own update_sliding_window_buffer, run on CPU)."""
    from sglang.srt.layers.attention.triton_backend import update_sliding_window_buffer

    recorder = _RecordingTranslator()
    seq_lens = torch.tensor(lengths)
    update_sliding_window_buffer(
        torch.zeros(len(lengths) + 1, dtype=torch.int64), recorder, None, None, window,
        seq_lens, len(lengths), device="cpu",
    )
    rows = zip(recorder.start, recorder.lens, strict=True)
    return [range(int(s), int(s) + int(n)) for s, n in rows]


@needs_window_rail
@pytest.mark.parametrize("window", [1, 4, 16, 2048])
def test_decode_keeps_speculators_keys(window):
    """Decode (and the multi-step draft's rail, min(seq_len + step, w) keys in
    cache_locs.generate_draft_decode_window_kv_indices): the query is the last key."""
    _, model_window = served_windows(window)
    lengths = [1, max(window - 1, 1), window, window + 1, 3 * window + 5]
    for length, kept in zip(lengths, sglang_window_rows(model_window, lengths), strict=True):
        assert set(kept) == speculators_keys(window, length, length - 1), (window, length)


@needs_window_rail
@pytest.mark.parametrize("window", [1, 4, 16])
@pytest.mark.parametrize("prefix", [0, 3, 20])
def test_extend_keeps_speculators_keys(window, prefix):
    """Extend (prefill, draft extend): the prefix rail from the model window, then the extend
    kernel's mask `q <= k + w` with the layer's w (kernels/ops/attention/extend_attention.py)."""
    layer_w, model_window = served_windows(window)
    (rail,) = sglang_window_rows(model_window, [prefix])
    length = prefix + 7
    for q in range(prefix, length):
        candidates = set(rail) | set(range(prefix, q + 1))
        kept = {k for k in candidates if k <= q and q <= k + layer_w}
        assert kept == speculators_keys(window, length, q), (window, prefix, q)


# -- the drafter class ------------------------------------------------------------------------


def mixed_drafter(drafter, tmp_path):
    """tiny_window (2 layers, S=4) with layer 1 trained as full attention."""
    source, _ = drafter("tiny_window")
    directory = tmp_path / "mixed"
    shutil.copytree(source, directory)
    config = json.loads((directory / "config.json").read_text())
    config["transformer_layer_config"]["layer_types"] = ["sliding_attention", "full_attention"]
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def build(directory, monkeypatch, *, version: str, flag: int | None = None):
    from sglang.srt.models import llama_eagle3 as upstream

    from sglang_ext.drafter.speculators_format import load_drafter_spec, to_sglang_config
    from sglang_ext.models.llama_eagle3 import Eagle3DraftModel

    real = upstream.get_spec

    class Spec:
        speculative_draft_window_size = flag

        def __getattr__(self, name):
            return getattr(real(), name)

    monkeypatch.setattr(upstream, "get_spec", Spec)
    monkeypatch.setattr(compat, "sglang_version", lambda: version)
    return Eagle3DraftModel(to_sglang_config(load_drafter_spec(directory)))


def ours(caplog, level: str) -> list:
    return [r for r in caplog.records if r.name == LOGGER and r.levelname == level]


def windows(model) -> list:
    return [layer.self_attn.attn.sliding_window_size for layer in model.model.layers]


def test_window_only_on_sliding_layers(sglang_env, drafter, tmp_path, monkeypatch, caplog):
    with caplog.at_level("INFO", logger=LOGGER):
        model = build(mixed_drafter(drafter, tmp_path), monkeypatch, version="0.5.23")
    assert windows(model) == [3, -1]  # S - 1 on the sliding layer, full stays full
    assert model.get_attention_sliding_window_size() == 4  # S: the backend's window buffers
    assert "layers [0] attend to the last 4 keys" in caplog.text
    assert "layers [1] full" in caplog.text
    assert not ours(caplog, "WARNING")


def test_mismatched_flag_warns_and_the_trained_window_wins(
    sglang_env, drafter, tmp_path, monkeypatch, caplog
):
    with caplog.at_level("WARNING", logger=LOGGER):
        model = build(mixed_drafter(drafter, tmp_path), monkeypatch, version="0.5.23", flag=9)
    assert "--speculative-draft-window-size=9" in caplog.text
    assert "sliding_window=4" in caplog.text
    assert windows(model) == [3, -1]  # SGLang had put 9 on every layer
    assert model.get_attention_sliding_window_size() == 4


def test_matching_flag_is_quiet(sglang_env, drafter, tmp_path, monkeypatch, caplog):
    with caplog.at_level("WARNING", logger=LOGGER):
        model = build(mixed_drafter(drafter, tmp_path), monkeypatch, version="0.5.23", flag=4)
    assert not ours(caplog, "WARNING")
    assert windows(model) == [3, -1]


def test_old_sglang_serves_full_attention_and_says_so(
    sglang_env, drafter, tmp_path, monkeypatch, caplog
):
    with caplog.at_level("WARNING", logger=LOGGER):
        model = build(mixed_drafter(drafter, tmp_path), monkeypatch, version="0.5.17")
    assert "trained with sliding_window=4 on layers [0]" in caplog.text
    assert "0.5.17" in caplog.text
    assert windows(model) == [-1, -1]
    assert model.get_attention_sliding_window_size() is None


def test_full_attention_drafter_keeps_sglangs_flag_handling(
    sglang_env, drafter, monkeypatch, caplog
):
    directory, _ = drafter("full_attention")
    with caplog.at_level("WARNING", logger=LOGGER):
        model = build(directory, monkeypatch, version="0.5.23", flag=8)
    assert windows(model) == [8] * len(model.model.layers)  # SGLang's own: the flag, everywhere
    assert model.get_attention_sliding_window_size() == 8
    assert not ours(caplog, "WARNING")


@pytest.mark.parametrize(
    ("version", "served", "warned"),
    [("0.5.17", "full", True), ("0.5.23", "sliding window 4 on layers [0, 1]", False)],
)
def test_doctor_says_what_this_sglang_serves(drafter, monkeypatch, version, served, warned):
    from sglang_ext.cli import doctor
    from sglang_ext.drafter.speculators_format import load_drafter_spec

    monkeypatch.setattr(compat, "sglang_version", lambda: version)
    diagnosis = doctor.Diagnosis(drafter=None, target=None)
    doctor._config_checks(diagnosis, load_drafter_spec(drafter("tiny_window")[0]))
    assert diagnosis.checks["served_attention"].startswith(served)
    warnings = [w for w in diagnosis.warnings if "sliding_window=4" in w]
    assert bool(warnings) is warned
    assert all(version in w for w in warnings)
