"""The GPU suite's servers and shared measurements: real SGLang servers on a trained target
and speculators-trained drafters (sglang_ext_tools.fixtures.make_fixtures ->
$SGLANG_EXT_FIXTURES) and the seed case's MLA + MoE target
(sglang_ext_tools.fixtures.make_mla_fixtures -> $SGLANG_EXT_MLA_FIXTURES).

All servers start in parallel (fixed KV pools, see `launch`) and are torn down at the
end. Every run writes tests/gpu/results/integration-<date>-<gpu>-sglang<version>.json (or into
$SGLANG_EXT_RESULTS_DIR) with the figures each test measured.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
from harness import (
    DURATIONS,
    FAILURES,
    FINISHED_AT,
    OUTCOMES,
    PHASES,
    STOCK_ENV,
    Server,
    start_all,
    stop_all,
    timed_phase,
)

from sglang_ext_tools import lossless, tau_compare
from sglang_ext_tools.launch import settle_acceptance  # noqa: F401 (the tests import it from here)

FIXTURES = Path(os.environ.get("SGLANG_EXT_FIXTURES", "/tmp/fixtures"))
MLA_FIXTURES = Path(os.environ.get("SGLANG_EXT_MLA_FIXTURES", "/tmp/mla"))
RESULTS_DIR = Path(os.environ.get("SGLANG_EXT_RESULTS_DIR", Path(__file__).parent / "results"))
LOG_DIR = Path(os.environ.get("SGLANG_EXT_LOG_DIR", "/tmp/sglang-ext-logs"))
PATCHED_SITE = os.environ.get("SGLANG_EXT_PATCHED_SITE")  # dir holding a patched `sglang`
STARTUP_TIMEOUT = float(os.environ.get("SGLANG_EXT_STARTUP_TIMEOUT", "420"))
# Fixtures still training when the suite starts (node/gpu_node.sh one-pipeline): wait up
# to this long for their READY (or FAILED) marker; unset: use what is there.
FIXTURES_WAIT_S = os.environ.get("SGLANG_EXT_FIXTURES_WAIT_S")
# Two suites on one node (one per SGLang version) need disjoint server ports.
PORT_BASE = int(os.environ.get("SGLANG_EXT_PORT_BASE", "31000"))
MAX_NEW_TOKENS = 256
# Teacher-forced lossless rule: >= 8,000 scored tokens per server. llama 32 x 256, MLA 64 x 128.
LOSSLESS_PROMPTS = 32
MLA_LOSSLESS_PROMPTS = 64
MLA_NEW_TOKENS = 128
TAU_PROMPTS, TAU_NEW_TOKENS = 64, 128  # tau equivalence: prompt-paired, like for like
AUX_DUMP = LOG_DIR / "aux-dump"  # the aux-dump test plugin's files (tests/gpu/auxdump)
AUX_DUMP_PLUGIN = Path(__file__).parent / "auxdump"
JSONL = LOG_DIR / "acceptance-plugin.jsonl"
ALARM_JSONL = LOG_DIR / "acceptance-random.jsonl"
CHAIN, TREE = (3, 1, 4), (3, 4, 5)  # the seed ran topk 4 with 5 draft tokens
WINDOW_DRAFTER = "window-drafter"  # trained with a binding sliding window (fixtures.window)

# The timed tests (marker `alone`) run last with only these servers up, idle but for the
# one being timed: the seed case's speed triple, the metrics on/off pair, the bench pair.
# The first of them stops every other server (dozens of idle servers starve the CPU).
ALONE_KEEP = frozenset(
    {"mla_nospec", "mla_stock_seed", "mla_tree", "plugin", "plugin_nometrics", "nospec"}
)

RESULTS: dict = {}
# The TP=1 phase's served outputs the TP=2 phase compares with, on the same prompts:
# name -> {"prompts": [...], "outputs": [...]} (llama: the lossless set; mla_chain, mla_tree).
TP1_OUTPUTS: dict[str, dict] = {}


def gpu_info() -> dict:
    """The GPU this suite's servers ran on: CUDA device 0 of this process (what
    CUDA_VISIBLE_DEVICES selects, as the servers inherit it), found in NVML by its UUID."""
    import pynvml
    import torch

    uuid = str(torch.cuda.get_device_properties(0).uuid)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(
            uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        )
    except pynvml.NVMLError:
        handle = None

    def text(value):
        return value.decode() if isinstance(value, bytes) else value

    info = {
        "name": torch.cuda.get_device_name(0),
        "uuid": uuid,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "driver": text(pynvml.nvmlSystemGetDriverVersion()),
        "count": torch.cuda.device_count(),
    }
    if handle is not None:
        info.update(
            nvml_index=pynvml.nvmlDeviceGetIndex(handle),
            memory_total_mib=pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
            sm_clock_max_mhz=pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            mem_clock_max_mhz=pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            sm_clock_now_mhz=pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        )
    pynvml.nvmlShutdown()
    return info


def gpu_count_safe() -> int:
    try:
        return gpu_count()
    except Exception:  # noqa: BLE001 - no torch/CUDA: the test is skipped anyway
        return 0


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


@functools.cache  # read once: the results file is rewritten after every test
def versions() -> dict:
    from importlib.metadata import version

    import torch

    out = {"python": sys.version.split()[0], "torch": torch.__version__}
    for name in (
        "sglang",
        "sglang-ext",
        "transformers",
        "speculators",
        "sglang-kernel",
        "flashinfer-python",
        "triton",
    ):
        try:
            out[name] = version(name)
        except Exception:  # noqa: BLE001 - report absence
            out[name] = None
    return out


def load_prompts(root: Path = FIXTURES) -> list[dict]:
    with (root / "prompts.jsonl").open() as handle:
        return [json.loads(line) for line in handle if line.strip()]


def reference(name: str) -> dict[str, dict]:
    path = FIXTURES / "reference" / f"{name}.jsonl"
    with path.open() as handle:
        return {row["id"]: row for row in map(json.loads, handle) if row}


def free_running(prompts: list[dict], outputs: list[dict], rows: dict[str, dict]) -> dict:
    """Served outputs vs a fixture's free-running reference (rows by prompt id, its own
    continuations), on the prompts the reference ran (it may have run a subset): recorded
    beside the like-for-like comparison, never asserted."""
    pairs = [(o, rows[p["id"]]) for p, o in zip(prompts, outputs, strict=True) if p["id"] in rows]
    return tau_compare.compare([o for o, _ in pairs], [r for _, r in pairs])


def tau_of(rows) -> float:
    return tau_compare.tau([tau_compare.reference_counts(r) for r in rows])


def served_tau(outputs: list[dict]) -> float:
    """Accept length from meta_info: (accepted draft tokens + verify steps) / verify steps
    (`tau_compare.served_counts` says where the counts come from)."""
    return tau_compare.tau([tau_compare.served_counts(o) for o in outputs])


def fixtures_ready(root: Path, marker: str, cancel: threading.Event | None = None) -> bool:
    """Whether the fixtures under ``root`` can be used: with $SGLANG_EXT_FIXTURES_WAIT_S set
    (fixtures training beside the suite), wait that long for ``root/READY`` and fail on
    ``root/FAILED``; otherwise whether ``root/marker`` exists."""
    if FIXTURES_WAIT_S is None:
        return (root / marker).exists()
    deadline = time.time() + float(FIXTURES_WAIT_S)
    while time.time() < deadline and not (cancel and cancel.is_set()):
        if (root / "FAILED").exists():
            pytest.fail(f"the fixture build for {root} failed (its log is beside the suite's)")
        if (root / "READY").exists():
            return (root / marker).exists()
        time.sleep(5)
    pytest.fail(f"no READY marker in {root} after {FIXTURES_WAIT_S} s")


class Cluster(dict):
    """name -> Server; a test that needs a server left out by SGLANG_EXT_SERVERS skips.

    The MLA servers start in a background thread once their fixtures are ready (they train
    longer than the llama ones), while the llama tests run; `join_background` waits for
    them and adds them (the seed-case tests, the soak and the timed tests call it)."""

    background: threading.Thread | None = None
    background_servers: tuple = ()  # built in the background (stopped at teardown)
    background_error: BaseException | None = None

    def __missing__(self, name: str):
        pytest.skip(f"server {name!r} not started (SGLANG_EXT_SERVERS)")

    def start_background(self, build, key: str) -> None:
        started: list[Server] = []
        self.cancel = threading.Event()  # the session is ending: stop waiting for fixtures

        def run():
            try:
                servers = build()
                self.background_servers = tuple(servers)
                started.extend(launch(servers, key))
            except BaseException as exc:  # noqa: BLE001 - re-raised by join_background
                self.background_error = exc

        self._background_started = started

        self.background = threading.Thread(target=run, name="mla-servers", daemon=True)
        self.background.start()

    def join_background(self, timeout: float | None = None) -> Cluster:
        if self.background is not None:
            self.background.join(timeout)
            if self.background.is_alive():  # teardown only: its servers are stopped anyway
                return self
            self.background = None
            self.update({s.name: s for s in self._background_started})
            if self.background_error is not None:
                raise self.background_error
        return self

    def only(self, keep) -> list[str]:
        """Stop every server not in ``keep``; return the names still running."""
        self.join_background()
        stop([s for name, s in self.items() if name not in keep])
        return sorted(name for name, s in self.items() if s.alive())


@pytest.fixture(scope="session")
def cluster():
    if not fixtures_ready(FIXTURES, "prompts.jsonl"):
        pytest.skip(
            f"no fixtures in {FIXTURES}: run python -m sglang_ext_tools.fixtures.make_fixtures"
        )
    from sglang_ext.cli.convert import convert

    converted = LOG_DIR / "converted-llama-drafter"
    RESULTS["converted_differences"] = convert(
        FIXTURES / "llama-drafter",
        converted,
        target=FIXTURES / "llama-target",
        force=True,
        overwrite=True,  # this suite's own scratch copy from an earlier run
    )
    llama, drafter = str(FIXTURES / "llama-target"), str(FIXTURES / "llama-drafter")
    metrics_env = {"SGLANG_EXT_ACCEPTANCE_JSONL": str(JSONL), **aux_dump_env("plugin")}
    port = iter(range(PORT_BASE + 1, PORT_BASE + 100))
    servers = [
        Server("nospec", llama, next(port), max_bs=32),
        Server("plugin", llama, next(port), drafter, ["--enable-metrics"], metrics_env, max_bs=32),
        Server(  # the plugin's metrics off, SGLang's on: the overhead test times ours alone
            "plugin_nometrics",
            llama,
            next(port),
            drafter,
            ["--enable-metrics"],
            env={"SGLANG_EXT_METRICS": "0"},
            max_bs=32,
        ),
        Server("stock_speculators", llama, next(port), drafter, env=STOCK_ENV),
        Server("stock_converted", llama, next(port), str(converted), env=STOCK_ENV),
        Server(
            "guard_plugin",
            str(FIXTURES / "llama4layer-target"),
            next(port),
            str(FIXTURES / "llama4layer-sglang-drafter"),
        ),
        Server(
            "guard_stock",
            str(FIXTURES / "llama4layer-target"),
            next(port),
            str(FIXTURES / "llama4layer-sglang-drafter"),
            env=STOCK_ENV,
        ),
        Server(
            "random",
            llama,
            next(port),
            str(FIXTURES / "random-drafter"),
            ["--enable-metrics"],
            {"SGLANG_EXT_ACCEPTANCE_JSONL": str(ALARM_JSONL)},
        ),
        Server("three_layer", llama, next(port), str(FIXTURES / "llama-drafter-3layer")),
        Server(
            "qwen3", str(FIXTURES / "qwen3-target"), next(port), str(FIXTURES / "qwen3-drafter")
        ),
    ]
    if (FIXTURES / WINDOW_DRAFTER).exists():  # make_fixtures --variants ...,window
        servers.append(Server("window", llama, next(port), str(FIXTURES / WINDOW_DRAFTER)))
    if PATCHED_SITE:
        pythonpath = f"{PATCHED_SITE}:{os.environ.get('PYTHONPATH', '')}"
        servers.append(
            Server(
                "patched",
                llama,
                next(port),
                drafter,
                env={**STOCK_ENV, "PYTHONPATH": pythonpath},
                max_bs=4,
            )
        )
    if gpu_count() >= 2:
        # Throughput pairs stay together on GPU 0; the checks that only need a server move to
        # GPU 1. TP=2 servers start later, alone (test_tp2.py): beside TP=1 servers they die
        # with "The memory capacity is unbalanced" (seen on nvidia-h200-x2, 2026-11-30).
        for server in servers:
            if server.name in (
                "stock_speculators",
                "guard_plugin",
                "guard_stock",
                "random",
                "three_layer",
                "qwen3",
                "window",
            ):
                server.gpu = 1
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    for path in (JSONL, ALARM_JSONL):
        path.unlink(missing_ok=True)
    shutil.rmtree(AUX_DUMP, ignore_errors=True)  # no dump of an earlier run may match
    started = Cluster()
    try:
        started.update({s.name: s for s in launch(servers, "startup")})

        def build_mla() -> list[Server]:
            if not fixtures_ready(MLA_FIXTURES, "deep-target", started.cancel):
                return []
            return mla_servers(port)

        started.start_background(build_mla, "startup_mla")
        yield started
    finally:
        try:
            if started.background is not None:
                started.cancel.set()
                started.join_background(timeout=15)
        finally:
            stop(list(started.values()) + list(started.background_servers))
            write_results()


@contextlib.contextmanager
def running(servers: list[Server], key: str):
    """The servers started by `launch`, as a Cluster; stopped on the way out."""
    servers = launch(servers, key)
    try:
        yield Cluster({s.name: s for s in servers})
    finally:
        stop(servers)


def launch(servers: list[Server], key: str) -> list[Server]:
    """Start these servers together (those $SGLANG_EXT_SERVERS names, when set) with fixed KV
    pools, wait for all, record how they started under RESULTS[key]."""
    wanted = os.environ.get("SGLANG_EXT_SERVERS")  # comma list: start only these
    if wanted:
        servers = [s for s in servers if s.name in wanted.split(",")]
    for server in servers:
        server.log_dir = LOG_DIR
        # Up to 19 servers start at once: fixed pools (see launch.Server.max_total_tokens).
        server.mem_fraction, server.max_total_tokens = 0.3, 65536
    started = time.time()
    start_all(servers, STARTUP_TIMEOUT)
    RESULTS[key] = {
        "wall_s": round(time.time() - started, 1),
        "servers": {
            s.name: {
                "status": s.status,
                "ready_after_s": s.ready_after_s,
                "command": " ".join(s.command()),
                "env": s.env,
            }
            for s in servers
        },
    }
    return servers


stop = stop_all  # the tests stop servers through suite.stop


PUBLIC_CONFIGS: dict[str, dict] = {}  # corpus name -> drafter, target, doctor's diagnosis


def public_config_servers(port) -> list[Server]:
    """The published-drafter corpus (tests/public_configs.py: configs scaled by one rule,
    random weights in the published layout) beside dummy-weight targets, plugin, 3/1/4. They
    start with the rest of the cluster (test_public_configs.py reads them); doctor's diagnosis
    of each is taken here, before any server runs."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the corpus builder
    from public_configs import build, manifest

    from sglang_ext.cli import doctor

    root = LOG_DIR / "public-configs"
    shutil.rmtree(root, ignore_errors=True)
    servers = []
    for name in sorted(manifest()["drafters"]):
        drafter, target, _ = build(name, root)
        PUBLIC_CONFIGS[name] = {
            "drafter": drafter,
            "target": target,
            "diagnosis": doctor.diagnose(drafter, target),
        }
        servers.append(
            Server(
                f"public_{name}",
                str(target),
                next(port),
                str(drafter),
                ["--load-format", "dummy", "--dtype", "bfloat16"],
            )
        )
    return servers


def aux_dump_env(name: str) -> dict[str, str]:
    """Environment that loads the aux-dump test plugin (tests/gpu/auxdump, an SGLang plugin
    found through its dist-info on PYTHONPATH) into one server: it saves the target features
    the drafter's fc receives on the first few draft extends (the item-4 check compares them
    with the HF target's hidden states)."""
    return {
        "PYTHONPATH": f"{AUX_DUMP_PLUGIN}:{os.environ.get('PYTHONPATH', '')}",
        "SGLANG_EXT_AUX_DUMP": str(AUX_DUMP / name),
    }


def mla_servers(port) -> list[Server]:
    """The seed case (sglang_ext_tools/fixtures/make_mla_fixtures.py): 61-layer MLA + MoE target, no
    speculation; the plugin with the drafter's trained capture, chain and tree; and the seed's
    configuration (one aux layer as wide as the drafter) under stock SGLang and the plugin."""
    if not (MLA_FIXTURES / "deep-target").exists():
        return []
    target = str(MLA_FIXTURES / "deep-target")
    drafter, seed = str(MLA_FIXTURES / "deep-drafter"), str(MLA_FIXTURES / "seed-drafter")
    nocapture = str(MLA_FIXTURES / "seed-nocapture-drafter")
    shifted = [
        # The trained drafter with every aux id one too high / one too low (make_mla_fixtures'
        # marker layers put a marker into both neighbours of every captured state).
        Server(
            f"mla_{shift}",
            target,
            next(port),
            str(MLA_FIXTURES / f"deep-drafter-{shift}"),
            env=aux_dump_env(f"mla_{shift}"),
            max_bs=8,  # the off-by-one test sends its 64 prompts 8 at a time
        )
        for shift in ("plus1", "minus1")
        if (MLA_FIXTURES / f"deep-drafter-{shift}").exists()
    ]
    return shifted + [
        Server("mla_nospec", target, next(port), max_bs=8),
        Server("mla_chain", target, next(port), drafter, env=aux_dump_env("mla_chain"), spec=CHAIN),
        Server("mla_tree", target, next(port), drafter, spec=TREE),
        Server(
            "mla_stock_seed",
            target,
            next(port),
            seed,
            env=STOCK_ENV,
            spec=TREE,
        ),
        Server("mla_guard_seed", target, next(port), seed, spec=TREE),
        # The seed's other shape: capture switched off, the final hidden state handed over.
        Server(
            "mla_stock_nocapture",
            target,
            next(port),
            nocapture,
            env=STOCK_ENV,
            spec=TREE,
        ),
        Server(
            "mla_guard_nocapture",
            target,
            next(port),
            nocapture,
            spec=TREE,
        ),
    ]


@pytest.fixture(scope="session")
def llama_baseline(cluster):
    """No-speculation outputs at concurrency 1 and 8, scored teacher-forced by the same
    server: the tie tolerance of the lossless rule (sglang_ext_tools.lossless)."""
    return baseline(cluster["nospec"], load_prompts()[:LOSSLESS_PROMPTS], MAX_NEW_TOKENS, "llama")


@pytest.fixture(scope="session")
def mla_baseline(cluster):
    cluster.join_background()
    if "mla_nospec" not in cluster:
        pytest.skip(
            f"no MLA fixtures in {MLA_FIXTURES}: "
            "run python -m sglang_ext_tools.fixtures.make_mla_fixtures"
        )
    prompts = load_prompts(MLA_FIXTURES)[:MLA_LOSSLESS_PROMPTS]
    return baseline(cluster["mla_nospec"], prompts, MLA_NEW_TOKENS, "mla")


def prometheus_value(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[-1])
    return total


def score(scorer: Server, prompt_ids: list[int], output_ids: list[int]) -> list:
    """Teacher-forced rows of one output, scored by the no-speculation server ``scorer``."""
    response = scorer.post("/generate", lossless.score_payload(prompt_ids, output_ids))
    return lossless.scored_rows(prompt_ids, output_ids, response["meta_info"])


def score_all(scorer: Server, prompts: list[list[int]], outputs: list[dict]) -> list[list]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        return list(
            pool.map(
                lambda po: score(scorer, po[0], po[1]["output_ids"]),
                zip(prompts, outputs, strict=True),
            )
        )


def baseline(server: Server, prompts: list[dict], max_new_tokens: int, name: str) -> dict:
    assert server.status == "ready", server.log_text()[-3000:]
    ids = [p["input_ids"] for p in prompts]
    c1 = server.generate_many(ids, max_new_tokens, concurrency=1)
    c8 = server.generate_many(ids, max_new_tokens, concurrency=8)
    rows_c1, rows_c8 = score_all(server, ids, c1), score_all(server, ids, c8)
    measured = lossless.tolerance([lossless.gaps(r) for r in rows_c1 + rows_c8])
    RESULTS.setdefault("lossless_tolerance", {})[name] = {
        **measured,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "rule": "the largest teacher-forced gap (prefill top-1 logprob - logprob of the "
        "emitted token) of the no-speculation server's own greedy outputs at concurrency 1 "
        "and 8",
    }
    return {
        "server": server,
        "prompts": prompts,
        "ids": ids,
        "c1": c1,
        "rows_c1": rows_c1,
        "tolerance": measured,
        "max_new_tokens": max_new_tokens,
    }


def lossless_verdict(base: dict, outputs: list[dict], server_name: str) -> dict:
    """Every token of ``outputs`` (one per baseline prompt) scored by the baseline's
    no-speculation server, against its measured tolerance; recorded under lossless.NAME."""
    rows = score_all(base["server"], base["ids"], outputs)
    gaps = {p["id"]: lossless.gaps(r) for p, r in zip(base["prompts"], rows, strict=True)}
    result = lossless.verdict(gaps, base["tolerance"])
    result.update(max_new_tokens=base["max_new_tokens"], concurrency=1)
    RESULTS.setdefault("lossless", {})[server_name] = result
    return result


def equivalence(name: str, served: list[tuple[int, int]], other: list[tuple[int, int]], **info):
    """tau(served) / tau(other) by equivalence, recorded under tau_equivalence.NAME."""
    result = {**tau_compare.equivalence(served, other), **info}
    RESULTS.setdefault("tau_equivalence", {})[name] = result
    return result


def like_for_like(
    target_dir: Path,
    drafter_dir: Path,
    prompts: list[dict],
    outputs: list[dict],
    steps: int,
    window: bool = True,
) -> list[dict]:
    """The offline reference teacher-forced on the served text (issue item: like for like):
    the HF target's hidden states and the speculators drafter's proposals on exactly the
    tokens the server emitted, bf16 on this GPU. One row per prompt (tokens, accepted per
    cycle, cycles, per_position). ``window=False`` runs the drafter with full attention."""
    import contextlib

    import torch

    from sglang_ext_tools import reference as ref

    key = f"like_for_like.{Path(drafter_dir).name}"
    with timed_phase(f"{key}.load"):
        target = ref.load_target(target_dir, device="cuda", dtype="bfloat16")
        drafter = ref.load_drafter(drafter_dir, device="cuda", dtype="bfloat16")
    try:
        with (
            timed_phase(f"{key}.rows"),
            contextlib.nullcontext() if window else ref.full_attention(drafter),
        ):
            return ref.teacher_forced_rows(
                target, drafter, [p["input_ids"] for p in prompts], outputs, num_steps=steps
            )
    finally:
        del target, drafter
        torch.cuda.empty_cache()


def paired_counts(outputs: list[dict], rows: list[dict]) -> tuple[list, list]:
    """(served, reference) (accepted, cycles) counts, prompt by prompt."""
    served = [tau_compare.served_counts(o) for o in outputs]
    reference_ = [tau_compare.reference_counts(r) for r in rows]
    return served, reference_


def record_like_for_like(name: str, outputs: list[dict], rows: list[dict], steps: int) -> dict:
    """tau equivalence of served vs like-for-like reference, and per-position acceptance of
    both, under tau_equivalence.NAME and like_for_like.NAME."""
    served, reference_ = paired_counts(outputs, rows)
    result = equivalence(name, served, reference_, reference="like for like (teacher-forced)")
    RESULTS.setdefault("like_for_like", {})[name] = {
        "prompts": len(rows),
        "served_per_position": tau_compare.served_per_position(outputs),
        "reference_per_position": tau_compare.per_position([r["accepted"] for r in rows], steps),
        "tau_served": result["tau_a"],
        "tau_reference": result["tau_b"],
        "identical_text": all(
            list(o["output_ids"]) == list(r["tokens"]) for o, r in zip(outputs, rows, strict=True)
        ),
    }
    return result


def merge_earlier_phase(data: dict) -> None:
    """Fold in the results file of an earlier phase of the same pipeline run
    ($SGLANG_EXT_EARLIER_RESULTS, e.g. the public-config servers run while the fixtures
    trained): its outcomes, durations and the keys this run did not write."""
    path = os.environ.get("SGLANG_EXT_EARLIER_RESULTS")
    if not path or not Path(path).is_file():
        return
    earlier = json.loads(Path(path).read_text())
    for key in ("outcomes", "durations_s"):
        data[key] = {**earlier.get(key, {}), **data.get(key, {})}
    for key, value in earlier.items():
        data.setdefault(key, value)
    data.setdefault("earlier_phases", []).append(
        {"file": Path(path).name, "date": earlier.get("date"), "command": earlier.get("command")}
    )


def write_results(quiet: bool = False) -> None:
    try:
        gpu = gpu_info()
    except Exception as exc:  # noqa: BLE001 - the file must still be written
        gpu = {"name": "unknown", "error": repr(exc)}
    found = versions()
    now = dt.datetime.now(dt.UTC)
    gpu_slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu.get("name", "gpu")).strip("-").lower()
    data = {
        "date": now.isoformat(timespec="seconds"),
        "gpu": gpu,
        "sglang_version": found.get("sglang"),
        "torch_version": found.get("torch"),
        "versions": found,
        "command": " ".join([sys.executable, "-m", "pytest", *sys.argv[1:]]),
        "flags": {
            "nospec_command": RESULTS.get("startup", {})
            .get("servers", {})
            .get("nospec", {})
            .get("command"),
            "note": "every server's own command line is in startup.servers.*.command; "
            "attention backend: triton for every figure",
        },
        "attention_backend": "triton",
        "outcomes": dict(OUTCOMES),
        "failures": dict(FAILURES),
        "phase_s": dict(PHASES),  # inside the long tests (harness.timed_phase)
        "durations_s": dict(DURATIONS),  # setup + call per test (setup holds server startup)
        "finished_at_utc": dict(FINISHED_AT),  # after teardown (module fixtures stop servers)
        **RESULTS,
    }
    data.setdefault("tp2", {"tau_served": None, "note": "not run (fewer than 2 GPUs)"})
    merge_earlier_phase(data)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    sglang = found.get("sglang") or "unknown"
    path = RESULTS_DIR / f"integration-{now.date().isoformat()}-{gpu_slug}-sglang{sglang}.json"
    tmp = path.with_suffix(".json.tmp")  # a copy taken mid-write is never half a file
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)
    if not quiet:
        print(f"\nresults written to {path}")
