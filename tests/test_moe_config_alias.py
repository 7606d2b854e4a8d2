"""sglang_ext_tools.moe_config_alias: a config directory copied with one token count's entry
re-pointed; the source untouched, a used output refused, a missing entry named."""

from __future__ import annotations

import json

from sglang_ext_tools import moe_config_alias as mca

NAME = "configs/triton_3_8_0/E=32,N=256,device_name=NVIDIA_H200.json"
TABLE = {
    "1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32},
    "4": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32},
    "6": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64},
    "16": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128},
}


def _src(tmp_path):
    src = tmp_path / "moe-configs"
    (src / NAME).parent.mkdir(parents=True)
    (src / NAME).write_text(json.dumps(TABLE))
    return src


def test_four_tokens_run_the_entry_of_six_and_the_source_stays(tmp_path):
    src, out = _src(tmp_path), tmp_path / "moe-4as6"
    assert mca.main(["--from", str(src), "--out", str(out), "--entry", "4=6"]) == 0
    copied = json.loads((out / NAME).read_text())
    assert copied["4"] == TABLE["6"] and copied["6"] == TABLE["6"]
    assert copied["1"] == TABLE["1"] and copied["16"] == TABLE["16"]
    assert list(copied) == ["1", "4", "6", "16"]  # numeric order, as SGLang's files
    assert json.loads((src / NAME).read_text()) == TABLE


def test_a_new_count_is_added_and_errors_name_what_is_wrong(tmp_path, capsys):
    src = _src(tmp_path)
    out = tmp_path / "moe-5as6"
    mca.alias(src, out, {"5": "6"})
    assert json.loads((out / NAME).read_text())["5"] == TABLE["6"]
    # a used output directory is never written over
    assert mca.main(["--from", str(src), "--out", str(out), "--entry", "4=6"]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    # an entry the file lacks: the file and the entries it has
    assert mca.main(["--from", str(src), "--out", str(tmp_path / "x"), "--entry", "4=8"]) == 2
    err = capsys.readouterr().err
    assert "no entry '8'" in err and "E=32,N=256" in err and "1, 4, 6, 16" in err
    assert not (tmp_path / "x").exists()
    assert mca.main(["--from", str(tmp_path), "--out", str(tmp_path / "y"), "--entry", "4=6"]) == 2
    assert "no config files under configs/" in capsys.readouterr().err
    assert mca.main(["--from", str(src), "--out", str(tmp_path / "z"), "--entry", "4"]) == 2
    assert "TO=FROM" in capsys.readouterr().err


def test_set_pins_a_field_in_the_counts_it_names(tmp_path, capsys):
    """--set 4,6:BLOCK_SIZE_N=64: those entries with the field changed, the others as they
    were; the source untouched. A count or field the file lacks is named, nothing written."""
    src, out = _src(tmp_path), tmp_path / "moe-bn64"
    argv = ["--from", str(src), "--out", str(out), "--set", "4,6:BLOCK_SIZE_N=64"]
    assert mca.main(argv) == 0
    copied = json.loads((out / NAME).read_text())
    assert copied["4"] == {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64}
    assert copied["6"] == TABLE["6"] and copied["1"] == TABLE["1"]
    assert copied["16"] == TABLE["16"]
    assert json.loads((src / NAME).read_text()) == TABLE
    # an entry borrowed, then a field set in it
    both = tmp_path / "both"
    argv = ["--from", str(src), "--out", str(both), "--entry", "4=16", "--set", "4:BLOCK_SIZE_M=32"]
    assert mca.main(argv) == 0
    assert json.loads((both / NAME).read_text())["4"] == {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128}
    capsys.readouterr()
    for bad, said in (("5:BLOCK_SIZE_N=64", "no entry '5'"),
                      ("4:BLOCK_N=64", "no field BLOCK_N"),
                      ("4:BLOCK_SIZE_N=sixty", "COUNTS:FIELD=VALUE"),
                      ("x:BLOCK_SIZE_N=64", "COUNTS:FIELD=VALUE")):  # fmt: skip
        target = tmp_path / f"bad-{len(said)}"
        assert mca.main(["--from", str(src), "--out", str(target), "--set", bad]) == 2
        assert said in capsys.readouterr().err
        assert not target.exists()
