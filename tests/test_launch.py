"""sglang_ext_tools.launch's request helpers against a local stdlib HTTP server that speaks
the shape of SGLang's streamed /generate (server-sent events, `data: [DONE]` last). Client
plumbing only; the GPU suite runs them against real servers."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading

import pytest

from sglang_ext_tools.launch import Server, greedy_payload


class _Streamer(http.server.BaseHTTPRequestHandler):
    bodies: list = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        n = body["sampling_params"]["max_new_tokens"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if body["input_ids"] == [0]:  # a stream that ends without an event
            self.wfile.write(b"data: [DONE]\n\n")
            return
        ids = []
        for step in range(0, n, 2):  # two tokens per event, like an accepted draft
            ids += [step, step + 1][: n - step]
            event = {"output_ids": list(ids), "meta_info": {"completion_tokens": len(ids)}}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def streamer():
    handler = type("H", (_Streamer,), {"bodies": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield Server("s", "m", srv.server_address[1]), handler
    srv.shutdown()
    srv.server_close()


def test_generate_streamed_returns_the_last_event_and_asks_for_a_stream(streamer):
    server, handler = streamer
    out = server.generate_streamed([5, 6, 7], 7)
    assert out["output_ids"] == [0, 1, 2, 3, 4, 5, 6]
    assert out["meta_info"]["completion_tokens"] == 7
    (body,) = handler.bodies
    assert body["stream"] is True and body["input_ids"] == [5, 6, 7]
    assert body["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 7, "ignore_eos": True}


def test_generate_streamed_without_an_event_names_the_server(streamer):
    server, _ = streamer
    with pytest.raises(RuntimeError, match="s: a streamed /generate sent no event"):
        server.generate_streamed([0], 4)


def test_stream_events_yields_each_event_and_stops_when_closed(streamer):
    server, handler = streamer
    events = server.stream_events({"rid": "r1", "input_ids": [5], "sampling_params": {
        "max_new_tokens": 6}})  # fmt: skip
    assert [len(e["output_ids"]) for e in events] == [2, 4, 6]
    assert handler.bodies[-1]["rid"] == "r1" and handler.bodies[-1]["stream"] is True
    with contextlib.closing(server.stream_events(greedy_payload([5], 6))) as events:
        first = next(events)
    assert first["output_ids"] == [0, 1]
    with pytest.raises(StopIteration):
        next(events)  # closed: the connection is gone, nothing more is read


# ------------------------------------------------------------------ a stopped server is gone


def _stat(pid: int, name: str, state: str, pgrp: int) -> str:
    return f"{pid} ({name}) {state} 1 {pgrp} {pgrp} 0 -1 4194560 0 0\n"


def test_group_alive_reads_live_members_and_passes_over_zombies(tmp_path):
    """bench_speed --at-once starts the next group once the last one's processes are gone;
    a zombie left where PID 1 reaps no orphans holds no GPU memory and must not stall it."""
    for pid, name, state, pgrp in [
        (101, "python3", "Z", 77),  # the leader, reaped late
        (102, "sglang::scheduler ) x", "Z", 77),  # a ')' in the name: the last one counts
        (103, "python3", "S", 88),  # another group
    ]:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_stat(pid, name, state, pgrp))
    from sglang_ext_tools.launch import group_alive

    assert not group_alive(77, tmp_path)
    assert group_alive(88, tmp_path)
    (tmp_path / "102" / "stat").write_text(_stat(102, "sglang::scheduler ) x", "R", 77))
    assert group_alive(77, tmp_path)


def test_wait_gone_waits_for_the_children_of_a_stopped_leader():
    import os
    import signal
    import subprocess

    server = Server("s", "m", 1)
    assert server.wait_gone(0.1)  # never started
    # a leader with a child in its session, like launch_server and its scheduler
    server.process = subprocess.Popen(
        ["sh", "-c", "sleep 30 & exec sleep 30"], start_new_session=True
    )
    try:
        assert not server.wait_gone(0.6)
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=10)
        assert server.wait_gone(10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
