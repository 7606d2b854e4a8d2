"""Real SGLang servers for the GPU tests: launched as subprocesses on loopback ports, waited on
through `/health_generate`, always torn down. Several small servers share one GPU (each with a
small --mem-fraction-static) and start in parallel, so the whole suite fits a short GPU lease.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# Flags that served on the H200 node with SGLang 0.5.17 (shared/gpu-node/README.md): triton
# attention gave a cheaper EAGLE-3 cycle than flashinfer; prefill CUDA graphs cost ~80 s.
BASE_FLAGS = [
    "--attention-backend",
    "triton",
    "--sampling-backend",
    "pytorch",
    "--cuda-graph-backend-prefill",
    "disabled",
    "--skip-tokenizer-init",
    "--disable-radix-cache",
    "--log-level",
    "info",
]
SPEC_FLAGS = [
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
]
STOCK_ENV = {"SGLANG_PLUGINS": "__no_plugin__"}  # an allow-list that excludes sglang_ext
# e.g. SGLANG_EXT_SERVER_ARGS="--dtype float32": appended to every server's command
EXTRA_ARGS = os.environ.get("SGLANG_EXT_SERVER_ARGS", "").split()
OUTCOMES: dict[str, str] = {}  # test id -> passed/failed/skipped, filled by conftest


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
            *BASE_FLAGS,
        ]
        if self.draft:
            cmd += ["--speculative-draft-model-path", self.draft, *SPEC_FLAGS]
        if self.gpu:
            cmd += ["--base-gpu-id", str(self.gpu)]
        return cmd + self.extra + EXTRA_ARGS

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

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # -- requests ----------------------------------------------------------------------

    def post(self, path: str, payload: dict, timeout: float = 300) -> dict:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())

    def generate(self, input_ids: list[int], max_new_tokens: int) -> dict:
        return self.post(
            "/generate",
            {
                "input_ids": input_ids,
                "sampling_params": {
                    "temperature": 0.0,
                    "max_new_tokens": max_new_tokens,
                    "ignore_eos": True,
                },
            },
        )

    def generate_many(
        self, prompts: list[list[int]], max_new_tokens: int, concurrency: int = 8
    ) -> list[dict]:
        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(lambda ids: self.generate(ids, max_new_tokens), prompts))

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as resp:
            return resp.read().decode()


def start_all(servers: list[Server], timeout: float) -> dict[str, str]:
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


def timed_tokens_per_s(
    server: Server, prompts: list[list[int]], max_new_tokens: int, concurrency: int
) -> dict:
    start = time.perf_counter()
    outputs = server.generate_many(prompts, max_new_tokens, concurrency)
    wall = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    return {
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tok_s": round(tokens / wall, 2),
        "requests": len(prompts),
        "concurrency": concurrency,
    }
