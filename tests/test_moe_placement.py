"""moe_placement's CPU parts: the offsets, the routing, the views and the spread it reports
(the timing itself needs a GPU and SGLang's kernels: the node runs it)."""

import json

import pytest
import torch

from sglang_ext_tools import moe_placement as mp


def test_offsets_start_at_zero_are_aligned_distinct_and_repeat():
    offs = mp.offsets_bytes(16, 8.0, 256)
    assert offs[0] == 0 and len(set(offs)) == 16 and offs == sorted(offs)
    assert all(o % 256 == 0 and o < 8 << 20 for o in offs)
    assert offs == mp.offsets_bytes(16, 8.0, 256)  # the same list on every run
    with pytest.raises(ValueError, match="multiple of 16"):
        mp.offsets_bytes(4, 8.0, 100)
    with pytest.raises(ValueError, match="fewer than 8 slots"):
        mp.offsets_bytes(8, 0.001, 256)


def test_routed_ids_send_every_token_to_one_expert():
    ids = mp.routed_ids(6, 1, 8, 3)
    assert ids.dtype == torch.int32 and ids.shape == (6, 1) and ids.eq(3).all()
    wrapped = mp.routed_ids(2, 3, 8, 7)
    assert wrapped.tolist() == [[7, 0, 1], [7, 0, 1]]


def test_placed_views_start_at_the_offset_in_bytes():
    buf = torch.arange(64, dtype=torch.bfloat16)
    view = mp.placed(buf, 32, (2, 3, 4))  # 32 bytes = 16 bf16 elements in
    assert view.shape == (2, 3, 4) and view.flatten()[0].item() == 16
    assert view.data_ptr() - buf.data_ptr() == 32
    view.fill_(-1)  # a view, not a copy
    assert buf[16:40].eq(-1).all() and buf[15].item() == 15


def test_spread_names_extremes_and_ratio():
    s = mp.spread({0: 33.0, 4096: 55.0, 512: 40.0})
    assert (s["fastest"], s["slowest"]) == (0, 4096)
    assert s["max_over_min"] == pytest.approx(55 / 33, abs=1e-4) and s["median_us"] == 40.0
    with pytest.raises(ValueError):
        mp.spread({})


def test_cli_refuses_existing_json_and_a_dense_model(tmp_path, capsys):
    out = tmp_path / "r.json"
    out.write_text("{}")
    with pytest.raises(SystemExit):
        mp.main(["--model", str(tmp_path), "--json", str(out)])
    assert "exists; not overwriting it" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    assert mp.main(["--model", str(tmp_path)]) == 2
    assert "not a DeepSeek-V3-style MoE" in capsys.readouterr().err
