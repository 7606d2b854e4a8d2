"""Acceptance read back from server logs (sglang_ext_tools.log_acceptance)."""

from __future__ import annotations

import io
import json
import tarfile

from sglang_ext.metrics.acceptance import build_record, format_log_line, histogram_from_steps
from sglang_ext_tools import log_acceptance


def _line(rid, completion, steps_accepted):
    record = build_record(
        rid=rid, prompt_tokens=10, completion_tokens=completion,
        verify_steps=len(steps_accepted), accepted_draft_tokens=sum(steps_accepted),
        histogram=histogram_from_steps(steps_accepted), num_draft_tokens=4, num_steps=3,
    )  # fmt: skip
    return "[2026-12-01 13:22:11] " + format_log_line(record)


def test_tau_and_positions_from_the_logged_records(tmp_path):
    text = "\n".join([
        "noise line",
        _line("warmup", 8, [0, 0]),  # fewer than 16 tokens: left out
        _line("a", 128, [3, 0, 1]),
        _line("b", 128, [2, 2]),
    ])
    out = log_acceptance.servers({"mla_chain": text}, first=1, min_tokens=16)
    every = out["mla_chain"]["all"]
    assert every["requests"] == 2 and every["verify_steps"] == 5
    assert every["tau"] == (8 + 5) / 5
    assert every["per_position"] == [4 / 5, 3 / 5, 1 / 5]
    assert out["mla_chain"]["first_1"]["tau"] == round((4 + 3) / 3, 4)

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = text.encode()
        info = tarfile.TarInfo("server-mla_chain.log")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    logs = tmp_path / "logs.tgz"
    logs.write_bytes(buffer.getvalue())
    result = tmp_path / "out.json"
    assert log_acceptance.main([str(logs), "--first", "1", "--out", str(result)]) == 0
    assert json.loads(result.read_text())["servers"]["mla_chain"]["all"]["requests"] == 2
    assert log_acceptance.main([str(logs), "--out", str(result)]) == 2  # never overwrites
