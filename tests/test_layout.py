"""The package layout of ARCHITECTURE.md, checked from the sources' import statements (ast).

Three rooms: the runtime a server loads, the CLIs a user runs (both in ``sglang_ext``), and the
test/benchmark tooling (``sglang_ext_tools``). Imports point one way: tooling -> CLIs ->
runtime. Nothing here imports the modules, so the check needs neither SGLang nor torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = {
    "sglang_ext",
    "sglang_ext.acceptance",
    "sglang_ext.acceptance_prometheus",
    "sglang_ext.architecture_aliases",
    "sglang_ext.aux_capture",
    "sglang_ext.checkpoint_files",
    "sglang_ext.compat",
    "sglang_ext.config_fields",
    "sglang_ext.context_length",
    "sglang_ext.drafter_health",
    "sglang_ext.drafter_spec",
    "sglang_ext.fusion",
    "sglang_ext.key_table",
    "sglang_ext.loading",
    "sglang_ext.metrics",
    "sglang_ext.model_paths",
    "sglang_ext.models",
    "sglang_ext.models.kimi_k25_eagle3",
    "sglang_ext.models.llama_eagle3",
    "sglang_ext.pickle_weights",
    "sglang_ext.plugin",
    "sglang_ext.speculators_format",
    "sglang_ext.tokenizer_worker_app",
    "sglang_ext.tokenizer_workers",
    "sglang_ext.verify_splitkv",
}
CLI = {
    "sglang_ext.bench",
    "sglang_ext.bench_report",
    "sglang_ext.cli",
    "sglang_ext.convert",
    "sglang_ext.demo",
    "sglang_ext.doctor",
    "sglang_ext.exit_codes",
}
TOOLING = "sglang_ext_tools"


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "data" in parts:  # speculators-written fixture files, not package code
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(module: str, path: Path) -> set[str]:
    """Every module name an import statement in ``path`` can load, at any depth (lazy imports
    inside functions included); ``from pkg import name`` counts as ``pkg`` and ``pkg.name``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def test_every_package_module_is_in_a_room():
    """A new module must be placed (runtime or CLI) before it ships."""
    assert set(_modules("sglang_ext")) == RUNTIME | CLI


@pytest.mark.parametrize("module", sorted(RUNTIME | CLI))
def test_sglang_ext_never_imports_the_tooling(module):
    bad = {n for n in imported(module, _modules("sglang_ext")[module]) if n.startswith(TOOLING)}
    assert not bad, f"{module} imports test/benchmark tooling {sorted(bad)}"


@pytest.mark.parametrize("module", sorted(RUNTIME))
def test_runtime_imports_only_the_runtime(module):
    """What a server loads never pulls a CLI (nor SGLang's benchmark client)."""
    names = imported(module, _modules("sglang_ext")[module])
    bad = {n for n in names if n in CLI or n.startswith(("sglang.benchmark", "sglang.bench_"))}
    assert not bad, f"runtime module {module} imports {sorted(bad)}"


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from .. import reference\n    import sglang_ext_tools.widen\n")
    names = imported("sglang_ext.sub.m", src)
    assert {"sglang_ext.reference", "sglang_ext_tools.widen"} <= names


@pytest.mark.parametrize(
    "module",
    ["sglang_ext.acceptance", "sglang_ext.acceptance_prometheus", "sglang_ext.drafter_health"],
)
def test_acceptance_leaves_import_neither_the_package_nor_sglang(module):
    """metrics (the SGLang hook) imports these; they import nothing back, nor SGLang."""
    names = imported(module, _modules("sglang_ext")[module])
    bad = {n for n in names if n.split(".")[0] in ("sglang_ext", "sglang", "torch")}
    assert not bad, f"{module} imports {sorted(bad)}"
