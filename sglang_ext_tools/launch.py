"""Launch real SGLang servers as subprocesses (GPU tests, ``sglang_ext_tools/bench_speed.py``).

Each server is ``python -m sglang.launch_server`` on a loopback port, waited on through
``/health_generate`` and torn down with its whole process group. Several small servers can
share one GPU (each with a small --mem-fraction-static) and start in parallel.

Stdlib only: importing this module never imports sglang or torch.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# Flags that served on the H200 node with SGLang 0.5.17 and 0.5.23; the
# attention backend is a Server field (triton gave a cheaper EAGLE-3 cycle than flashinfer);
# so is the prefill CUDA graph (off here: capturing it cost ~80 s a server; SGLang 0.5.23's
# default is "breakable", which its EAGLE v2 worker captures for the drafter too,
# eagle_worker_v2.py). --sleep-on-idle: an idle SGLang scheduler otherwise spins a
# core at 100 % (scheduler.py:Scheduler.on_idle runs its checks in a loop unless
# maybe_sleep_on_idle polls the sockets); the suite keeps up to 14 servers on one 16-core
# node, and in the eighth run (2026-12-02) the CPU-bound speculative server's latency for the
# same prompt and the same verify steps moved by up to 1.6x within seconds beside 5 idle ones.
BASE_FLAGS = [
    "--sleep-on-idle",
    "--sampling-backend",
    "pytorch",
    "--skip-tokenizer-init",
    "--disable-radix-cache",
    "--log-level",
    "info",
]
STOCK_ENV = {"SGLANG_PLUGINS": "__no_plugin__"}  # an allow-list that excludes sglang_ext
DEFAULT_SPEC = (3, 1, 4)  # speculative steps, EAGLE top-k, draft tokens


def settle_acceptance() -> None:
    """Wait until a plugin server's flusher has handed every finished request to the log, the
    JSONL file and Prometheus: they trail a response by up to its interval (meta_info never
    does); four intervals."""
    from sglang_ext.metrics.hook import DEFAULT_FLUSH_INTERVAL_S

    time.sleep(4 * DEFAULT_FLUSH_INTERVAL_S)


def spec_flags(spec: tuple[int, int, int] = DEFAULT_SPEC) -> list[str]:
    """The ``--speculative-*`` flags of an EAGLE-3 server (draft path not included)."""
    steps, topk, draft_tokens = spec
    return [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        str(steps),
        "--speculative-eagle-topk",
        str(topk),
        "--speculative-num-draft-tokens",
        str(draft_tokens),
    ]


def greedy_payload(input_ids: list[int], max_new_tokens: int) -> dict:
    """A /generate body: greedy, EOS ignored, exactly ``max_new_tokens`` tokens."""
    return {
        "input_ids": input_ids,
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": max_new_tokens,
            "ignore_eos": True,
        },
    }


@dataclass
class Server:
    name: str
    model: str
    port: int
    draft: str | None = None
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    mem_fraction: float = 0.05
    max_bs: int = 4
    gpu: int = 0  # --base-gpu-id: spreads the small servers over the GPUs of the node
    log_dir: Path = Path("/tmp")
    process: subprocess.Popen | None = None
    status: str = "not started"
    started_at: float = 0.0
    ready_after_s: float | None = None
    spec: tuple[int, int, int] = DEFAULT_SPEC  # used only when `draft` is set
    # A fixed KV pool. SGLang sizes the pool from free memory measured before and after
    # loading (kv_cache_configurator._profile_available_bytes); servers starting together
    # move each other's measurement, so a low --mem-fraction-static fails at random. A high
    # fraction with a fixed --max-total-tokens keeps each pool small and the check passing.
    max_total_tokens: int | None = None
    attention_backend: str = "triton"
    # --cuda-graph-backend-prefill; with a graph, --cuda-graph-max-bs-prefill (prefill's
    # "batch size" is its token count: longer prefills run eager)
    prefill_graph: str = "disabled"
    prefill_graph_max_tokens: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"server-{self.name}.log"

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--mem-fraction-static",
            str(self.mem_fraction),
            "--cuda-graph-max-bs-decode",
            str(self.max_bs),
            "--attention-backend",
            self.attention_backend,
            *BASE_FLAGS,
            "--cuda-graph-backend-prefill",
            self.prefill_graph,
        ]
        if self.prefill_graph != "disabled" and self.prefill_graph_max_tokens:
            cmd += ["--cuda-graph-max-bs-prefill", str(self.prefill_graph_max_tokens)]
        if self.draft:
            cmd += ["--speculative-draft-model-path", self.draft, *spec_flags(self.spec)]
        if self.gpu:
            cmd += ["--base-gpu-id", str(self.gpu)]
        if self.max_total_tokens:
            cmd += ["--max-total-tokens", str(self.max_total_tokens)]
        return cmd + self.extra

    def start(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("w")
        log.write(" ".join(self.command()) + "\n" + json.dumps(self.env) + "\n")
        log.flush()
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.started_at = time.time()
        self.status = "starting"

    def wait(self, timeout: float) -> str:
        deadline = self.started_at + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                self.status = f"exited({self.process.returncode})"
                return self.status
            try:
                with urllib.request.urlopen(self.url + "/health_generate", timeout=5) as resp:
                    if resp.status == 200:
                        self.status = "ready"
                        self.ready_after_s = round(time.time() - self.started_at, 1)
                        return self.status
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(2)
        self.status = "timeout"
        return self.status

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self) -> None:
        """Ask the server's process group to exit (SIGTERM), without waiting."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """SIGTERM (see terminate), up to 20 s for the group to exit, then SIGKILL. A server
        writing the plugin's acceptance JSONL first settles (:func:`settle_acceptance`): a
        killed process loses the records its flusher has not written yet."""
        if self.process is None or self.process.poll() is not None:
            return
        if "SGLANG_EXT_ACCEPTANCE_JSONL" in self.env:
            settle_acceptance()
        self.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait_gone(self, timeout: float = 60.0) -> bool:
        """Up to ``timeout`` s until no live process of the server's group is left (the
        scheduler and detokenizer children hold the GPU memory, not the leader ``stop``
        waited for; a zombie holds none, and where PID 1 does not reap orphans it stays);
        True once the group is gone or was never started."""
        if self.process is None:
            return True
        deadline = time.time() + timeout
        while group_alive(self.process.pid):
            if time.time() >= deadline:
                return False
            time.sleep(0.5)
        return True

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> list[str]:
        return self.log_text().splitlines()[-lines:]

    def startup_error(self) -> str | None:
        """The last ``SomethingError: ...`` line of the log (None when there is none)."""
        found = re.findall(r"(\w+(?:Error|Exception): [^\n]*)", self.log_text())
        return found[-1] if found else None

    # -- requests ----------------------------------------------------------------------

    def _request(self, path: str, payload: dict) -> urllib.request.Request:
        return urllib.request.Request(
            self.url + path,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )

    def post(self, path: str, payload: dict, timeout: float = 300) -> dict:
        with urllib.request.urlopen(self._request(path, payload), timeout=timeout) as resp:
            return json.loads(resp.read())

    def stream_events(self, payload: dict, timeout: float = 300) -> Iterator[dict]:
        """POST ``payload`` to /generate with ``stream`` on and yield each server-sent event
        (one per scheduler output) until ``[DONE]``. Closing the iterator early closes the
        connection: the client's disconnect, which SGLang turns into an abort."""
        request = self._request("/generate", {**payload, "stream": True})
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[len(b"data:") :].strip()
                if data == b"[DONE]":
                    return
                yield json.loads(data)

    def generate(self, input_ids: list[int], max_new_tokens: int, top_logprobs: int = 0) -> dict:
        """Greedy, EOS ignored; ``top_logprobs`` > 0 adds each output position's top-k
        logprobs (``meta_info.output_top_logprobs``), which the lossless rule reads."""
        payload = greedy_payload(input_ids, max_new_tokens)
        if top_logprobs:
            payload.update(return_logprob=True, top_logprobs_num=top_logprobs)
        return self.post("/generate", payload)

    def generate_streamed(self, input_ids: list[int], max_new_tokens: int) -> dict:
        """``generate`` as a streamed request, the kind `sglang-ext bench` sends by default;
        returns the last event (the whole request's output_ids and meta_info)."""
        last = None
        for last in self.stream_events(greedy_payload(input_ids, max_new_tokens)):  # noqa: B007
            pass
        if last is None:
            raise RuntimeError(f"{self.name}: a streamed /generate sent no event")
        return last

    def generate_many(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        concurrency: int = 8,
        top_logprobs: int = 0,
    ) -> list[dict]:
        with ThreadPoolExecutor(concurrency) as pool:
            return list(
                pool.map(lambda ids: self.generate(ids, max_new_tokens, top_logprobs), prompts)
            )

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as resp:
            return resp.read().decode()


def group_members(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """The live (not zombie) processes of group ``pgid``, from /proc/PID/stat."""
    out = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended while the folder was read
            continue
        state, _ppid, pgrp = text[text.rfind(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            out.append(int(stat.parent.name))
    return out


def group_alive(pgid: int, proc: Path = Path("/proc")) -> bool:
    """Whether a process of group ``pgid`` is alive (not a zombie), from /proc/PID/stat; where
    there is no /proc, whether the group can be signalled at all."""
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    return bool(group_members(pgid, proc))


def stop_all(servers) -> None:
    """Stop these servers together: SIGTERM to all first, then wait for each (one at a time,
    ~20 servers took 46 s to stop on the H200, 2026-12-01)."""
    servers = list(servers)
    for server in servers:
        server.terminate()
    for server in servers:
        server.stop()


def start_all(servers: list[Server], timeout: float) -> dict[str, str]:
    """Start every server, then wait for all of them in parallel; name -> final status."""
    for server in servers:
        server.start()
    results: dict[str, str] = {}
    threads = [
        threading.Thread(target=lambda s=s: results.__setitem__(s.name, s.wait(timeout)))
        for s in servers
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
