"""Session fixtures of the CPU suite: a tiny Llama target and speculators drafters built once."""

from __future__ import annotations

import pytest
from builders import VARIANTS, build_drafter, write_target


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory):
    return write_target(tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="session")
def sglang_env(target_dir):
    """SGLang's model classes importable and constructible on CPU (see tests/sglang_cpu.py)."""
    from sglang_cpu import init_sglang_cpu

    init_sglang_cpu(str(target_dir))


@pytest.fixture(scope="session")
def drafter(tmp_path_factory, target_dir):
    """drafter(name) -> (directory, speculators model), built once per session per variant."""
    cache = {}

    def get(name: str):
        if name not in cache:
            directory = tmp_path_factory.mktemp(f"drafter-{name}")
            model = build_drafter(directory, target_dir, VARIANTS[name]).eval()
            cache[name] = (directory, model)
        return cache[name]

    return get
