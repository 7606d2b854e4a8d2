"""The drafter's per-step forward stays graph-friendly: no host synchronisation, no logging.

SGLang replays the draft decode, draft extend and target verify steps from CUDA graphs (the
H200 speed run logged `cuda graph: True` for every plugin server); a `.item()` or `.cpu()` in
these paths would break capture or add a host round trip to every verify cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sglang_ext.models.kimi_k25_eagle3 as kimi
import sglang_ext.models.llama_eagle3 as llama
import sglang_ext.serving.fusion as fusion

HOST_WORK = {"item", "tolist", "cpu", "numpy", "synchronize", "print", "info", "warning", "debug"}
PER_STEP = [
    (llama, "Eagle3Model", "forward"),
    (llama, "Eagle3DecoderLayer", "forward"),
    (llama, "QKNormLlamaAttention", "forward_prepare_native"),
    (kimi, "Eagle3MLAModel", "forward"),
    (kimi, "Eagle3MLAModel", "fuse_target_features"),
    (fusion, "FusionPolicy", "applies"),
]


def _method(module, cls: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(Path(module.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{module.__name__}.{cls}.{name} not found")


def _host_calls(fn: ast.FunctionDef) -> list[str]:
    calls = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            target = node.func
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name in HOST_WORK:
                calls.append(f"{name}() at line {node.lineno}")
    return calls


@pytest.mark.parametrize("module, cls, name", PER_STEP, ids=lambda x: getattr(x, "__name__", x))
def test_per_step_forward_has_no_host_work(module, cls, name):
    assert _host_calls(_method(module, cls, name)) == []


def test_the_guard_sees_host_work():
    fn = ast.parse("def f(x):\n    y = x.sum().item()\n    logger.info(y)\n").body[0]
    assert _host_calls(fn) == ["item() at line 2", "info() at line 3"]

