"""The same CPU cores for the same part of every server a benchmark compares.

At batch 1 a speculative cycle's pace is set by the host as much as by the GPU (2026-12-03,
fa3: the fp8 drafter's cheaper kernels left the 3/1/4 cycle where it was), and so is the first
token (SGLang prefills eagerly here). Two servers of one configuration then differ by a few
per cent (plugin/plugin 1.019, stock/stock 0.991 on 2026-12-03; first tokens 45-56 ms across
the servers of one run), more than a pair's prompt-paired interval, and nothing says which
cores each server's processes ran on. A plan pins each role of every server to its own cores,
identical for all servers (they are measured one at a time; the idle ones sleep):

- ``scheduler``: SGLang's scheduler process (``sglang::scheduler``, it sets the title), which
  builds, launches and reads back every batch;
- ``detokenizer``: ``sglang::detokenizer``;
- ``server``: the launcher's own process (HTTP and the TokenizerManager) and anything else of
  the server's process group;
- ``client``: the benchmark process itself, sending the requests.

Every thread of a process is pinned (``/proc/PID/task``): Linux sets affinity per thread, and
threads started later inherit their creator's.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from sglang_ext_tools.launch import group_members

ROLES = ("client", "scheduler", "detokenizer", "server")
# cores per role in the `auto` plan, taken in ROLES order from the cores this process may use
AUTO_CORES = {"client": 2, "scheduler": 2, "detokenizer": 1, "server": 2}
TITLES = (("sglang::scheduler", "scheduler"), ("sglang::detokenizer", "detokenizer"))

Plan = dict[str, frozenset[int]]


def parse_cpus(text: str) -> frozenset[int]:
    """'0-1,4' -> {0, 1, 4} (the kernel's cpulist format)."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"cpu list {text!r}: expected numbers and ranges like 0-1,4")
        cpus.update(range(int(low), int(high or low) + 1))
    return frozenset(cpus)


def nvidia_smi_bus_id(gpu: int) -> str:
    """The GPU's PCI bus id as nvidia-smi writes it (00000000:19:00.0)."""
    return subprocess.run(
        ["nvidia-smi", "-i", str(gpu), "--query-gpu=pci.bus_id", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout


def gpu_local_cpus(
    gpu: int = 0, sys_root: Path = Path("/sys"), query=nvidia_smi_bus_id
) -> frozenset[int] | None:
    """The CPUs on the GPU's own NUMA node (its PCI device's ``local_cpulist``), None where
    that is not known (no nvidia-smi, no sysfs entry)."""
    try:
        bus = query(gpu).strip().lower()
    except (OSError, subprocess.SubprocessError):
        return None
    # nvidia-smi writes an 8-digit PCI domain (00000000:19:00.0); sysfs names 4 (0000:19:00.0)
    domain, _, rest = bus.partition(":")
    path = sys_root / "bus" / "pci" / "devices" / f"{domain[-4:]}:{rest}" / "local_cpulist"
    try:
        return parse_cpus(path.read_text().strip())
    except (OSError, ValueError):
        return None


def parse_plan(
    text: str, available: frozenset[int] | None = None, local: frozenset[int] | None = None
) -> Plan:
    """``auto`` (AUTO_CORES from the cores this process may use, those on the GPU's NUMA
    node first: ``local``, gpu_local_cpus where not given) or
    ``client=0-1;scheduler=2-3;detokenizer=4;server=5-6``: every role once, no core shared."""
    available = available if available is not None else frozenset(os.sched_getaffinity(0))
    if text == "auto":
        need = sum(AUTO_CORES.values())
        local = local if local is not None else (gpu_local_cpus() or frozenset())
        near = sorted(available & local)
        cores = near if len(near) >= need else sorted(available)
        if len(cores) < need:
            raise ValueError(f"--pin-cpus auto needs {need} cores, this process may use {cores}")
        plan, at = {}, 0
        for role in ROLES:
            plan[role] = frozenset(cores[at : at + AUTO_CORES[role]])
            at += AUTO_CORES[role]
        return plan
    plan = {}
    for item in filter(None, (p.strip() for p in text.split(";"))):
        role, sep, cpus = item.partition("=")
        if not sep or role not in ROLES:
            raise ValueError(f"--pin-cpus {text!r}: {item!r} is not ROLE=CPUS (roles {ROLES})")
        plan[role] = parse_cpus(cpus)
    missing = [r for r in ROLES if r not in plan]
    if missing:
        raise ValueError(f"--pin-cpus {text!r}: no cores for {missing}")
    seen: set[int] = set()
    for role, cpus in plan.items():
        if cpus & seen:
            raise ValueError(f"--pin-cpus {text!r}: {role} shares cores {sorted(cpus & seen)}")
        if not cpus <= available:
            outside = sorted(cpus - available)
            raise ValueError(f"--pin-cpus {text!r}: {role} asks for cores {outside} not allowed")
        seen |= cpus
    return plan


def role_of(cmdline: str) -> str:
    """A server process's role from its command line (SGLang's process titles)."""
    for title, role in TITLES:
        if cmdline.startswith(title):
            return role
    return "server"


def group_processes(pgid: int, proc: Path = Path("/proc")) -> dict[int, str]:
    """pid -> role for the live processes of process group ``pgid``."""
    out = {}
    for pid in group_members(pgid, proc):
        try:
            cmdline = (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # the process ended meanwhile
            continue
        out[pid] = role_of(cmdline)
    return out


def pin_group(pgid: int, plan: Mapping[str, frozenset[int]], proc: Path = Path("/proc"),
              setaffinity=os.sched_setaffinity) -> dict[str, int]:  # fmt: skip
    """Pin every thread of every process of the group to its role's cores; role -> threads
    pinned (a thread that ended meanwhile is skipped)."""
    pinned = dict.fromkeys(ROLES[1:], 0)
    for pid, role in group_processes(pgid, proc).items():
        for task in (proc / str(pid) / "task").glob("[0-9]*"):
            try:
                setaffinity(int(task.name), plan[role])
            except (ProcessLookupError, FileNotFoundError):
                continue
            pinned[role] += 1
    return pinned


def describe(plan: Mapping[str, frozenset[int]]) -> dict[str, list[int]]:
    """The plan as the result JSON records it."""
    return {role: sorted(plan[role]) for role in ROLES}
