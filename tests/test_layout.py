"""The package layout of ARCHITECTURE.md, checked from the sources' import statements (ast).

ARCHITECTURE.md is the one module list: its table names every part of ``sglang_ext`` (a
subpackage or a top-level module), the modules in it and the parts it may import; its floors
block gives each module's floor (one above the highest module it imports). Here: the tree is
that list, each part imports only what the table allows, the floors are as written (so there is
no cycle), the rules each part promises (``drafter/`` without SGLang, doctor without SGLang at
import, ``cli/`` imported by nothing below it, the tooling by nothing in the package), and no
façades: every name imported from ``sglang_ext`` is imported from the module that defines it.
Nothing here imports the modules, so the check needs neither SGLang nor torch.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
TOOLING = (
    "sglang_ext_tools",
    *sorted(p.stem for d in ("scripts", "node") for p in (ROOT / d).glob("*.py")),
)
# Strings that look like module paths and are not: the acceptance log line's fixed prefix, and
# the loggers of serving/, named as they were before the move (logging configurations name them).
NOT_MODULE_PATHS = {
    "sglang_ext.acceptance",
    "sglang_ext.fusion",
    "sglang_ext.tokenizer_workers",
    "sglang_ext.verify_splitkv",
}


def _modules(package: str = "sglang_ext") -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "data" in parts:  # speculators-written fixture files, not package code
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def imported(module: str, path: Path, *, lazy: bool = True) -> set[str]:
    """Every module name an import statement in ``path`` can load (with ``lazy``, also inside
    functions); ``from pkg import name`` counts as ``pkg`` and ``pkg.name``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = ast.walk(tree) if lazy else _module_level(tree.body)
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names - {"__future__", "__future__.annotations"}


def _module_level(body):
    """The statements run at import: the body, into if/try/with blocks, not into defs."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                yield from _module_level(block)
            for handler in getattr(node, "handlers", []):
                yield from _module_level(handler.body)


def package_imports(module: str, *, lazy: bool = True) -> set[str]:
    """The package's modules that ``module`` imports; a package counts only where none of its
    submodules is named (``from sglang_ext.cli import exit_codes`` is ``cli.exit_codes``)."""
    named = {n for n in imported(module, MODULES[module], lazy=lazy) if n in MODULES} - {module}
    return {n for n in named if not any(o.startswith(n + ".") for o in named)}


def _short(module: str) -> str:
    return module.removeprefix("sglang_ext.") if module != "sglang_ext" else "sglang_ext"


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


@functools.cache
def parts() -> dict[str, tuple[set[str], set[str]]]:
    """ARCHITECTURE.md's table: part -> (its modules, the parts it may import)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    table = text.split("## The tree", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        part = _ticked(cells[0])[0].rstrip("/")
        modules = {m.split(" ")[0] for m in _ticked(cells[1])}
        names = {part} if modules == {part} else {f"{part}.{m}" for m in modules}
        names = {n.removesuffix(".__init__") for n in names}
        out[part] = ({f"sglang_ext.{n}" for n in names}, {p.rstrip("/") for p in _ticked(cells[2])})
    return out


def part_of(module: str) -> str:
    return "sglang_ext" if module == "sglang_ext" else module.split(".")[1]


@functools.cache
def floor(module: str) -> int:
    return 1 + max((floor(m) for m in package_imports(module)), default=-1)


def documented_floors() -> dict[str, int]:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    block = text.split("## Floors", 1)[1].split("```", 2)[1]
    out = {}
    for line in block.splitlines():
        match = re.match(r"\s*(\d+)\s+(.+)$", line)
        if match:
            out |= {f"sglang_ext.{m}": int(match.group(1)) for m in match.group(2).split()}
    return out


def _docstring_only(module: str) -> bool:
    return not imported(module, MODULES[module])


# -- the one module list ----------------------------------------------------------------------


def test_architecture_lists_every_module_of_the_package():
    """A new module must be placed (a part of the table) before it ships."""
    listed = {"sglang_ext"} | set().union(*(mods for mods, _ in parts().values()))
    listed |= {f"sglang_ext.{p}" for p in parts() if (ROOT / "sglang_ext" / p).is_dir()}
    assert listed == set(MODULES)


def test_readme_points_at_architecture_for_the_module_list():
    assert "ARCHITECTURE.md" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_part_imports_only_what_architecture_allows(module):
    own = part_of(module)
    allowed = {own, "sglang_ext"} | (parts()[own][1] if own in parts() else set())
    bad = {m for m in package_imports(module) if part_of(m) not in allowed}
    assert not bad, f"{module} ({own}) imports {sorted(bad)}; ARCHITECTURE.md allows {allowed}"


def test_the_floors_are_as_architecture_draws_them():
    """Each module one floor above the highest it imports, so imports point down, no cycle."""
    drawn = documented_floors()
    shown = {m for m in MODULES if not _docstring_only(m) or m in drawn}
    assert {m: floor(m) for m in shown} == {m: drawn.get(m) for m in shown}


def test_package_roots_import_nothing():
    """``import sglang_ext`` (SGLang's plugin loader, the CLI) costs nothing; the subpackage
    roots are docstrings (``models`` imports its classes for SGLang's registry, ``cli`` is
    the command)."""
    for module in ("sglang_ext", "sglang_ext.drafter", "sglang_ext.serving", "sglang_ext.metrics"):
        assert _docstring_only(module), module


# -- what each part promises ------------------------------------------------------------------


@pytest.mark.parametrize("module", sorted(m for m in MODULES if part_of(m) == "drafter"))
def test_drafter_imports_no_sglang_and_only_the_standard_library_at_import(module):
    """drafter/ is the drafter as data: SGLang never (doctor and convert run without it), and
    torch, transformers, safetensors, numpy only inside the function that needs them."""
    names = imported(module, MODULES[module])
    assert not {n for n in names if n.split(".")[0] == "sglang"}, module
    top = {n.split(".")[0] for n in imported(module, MODULES[module], lazy=False)}
    assert top <= set(sys.stdlib_module_names) | {"sglang_ext"}, (module, sorted(top))


def _import_closure(module: str) -> set[str]:
    """The package modules that importing ``module`` runs (module-level imports, parents)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parents = [name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)]
        todo += [p for p in parents if p in MODULES]
        todo += list(package_imports(name, lazy=False))
    return seen


@pytest.mark.parametrize("module", ["sglang_ext.cli.doctor", "sglang_ext.cli.convert"])
def test_doctor_and_convert_import_no_sglang_or_torch(module):
    """doctor's promise (no GPU, no server, no SGLang import): nothing that importing it runs
    imports SGLang or torch, and doctor and convert never import SGLang themselves."""
    for name in _import_closure(module):
        top = {n.split(".")[0] for n in imported(name, MODULES[name], lazy=False)}
        assert not top & {"sglang", "torch", "transformers"}, (module, name, sorted(top))
    assert not {n for n in imported(module, MODULES[module]) if n.split(".")[0] == "sglang"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if part_of(m) != "cli"))
def test_cli_is_imported_by_nothing_below_it(module):
    """What a server loads never pulls a CLI, nor SGLang's benchmark client."""
    names = imported(module, MODULES[module])
    above = ("sglang_ext.cli", "sglang.benchmark", "sglang.bench_")
    bad = {n for n in names if n.startswith(above)}
    assert not bad, f"{module} imports {sorted(bad)}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_sglang_ext_never_imports_the_tooling(module):
    bad = {n for n in imported(module, MODULES[module]) if n.split(".")[0] in TOOLING}
    assert not bad, f"{module} imports test/benchmark tooling {sorted(bad)}"


def _tooling_section() -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    return text.split("\n## Tooling", 1)[1].split("\n## ", 1)[0]


def _tooling_files() -> list[Path]:
    return sorted(
        [*(ROOT / "sglang_ext_tools").rglob("*.py"), *(ROOT / "scripts").glob("*.py"),
         *(ROOT / "node").glob("*.py")]
    )  # fmt: skip


def test_architecture_places_every_tooling_module_and_script():
    """The tooling has one list too: each module of sglang_ext_tools (``fixtures.common``),
    each subpackage (``sglang_ext_tools/fixtures/``) and each file of scripts/ and node/ is
    named in ARCHITECTURE.md's Tooling section."""
    named = set(_ticked(_tooling_section()))
    wanted = set()
    for path in (ROOT / "sglang_ext_tools").rglob("*.py"):
        parts = path.relative_to(ROOT / "sglang_ext_tools").with_suffix("").parts
        if parts[-1] == "__init__":
            if len(parts) > 1:
                wanted.add("sglang_ext_tools/" + "/".join(parts[:-1]) + "/")
            continue
        wanted.add(".".join(parts))
    for folder in ("scripts", "node"):
        for path in (ROOT / folder).iterdir():
            if path.name != "__pycache__":
                wanted.add(path.name + ("/" if path.is_dir() else ""))
    assert not wanted - named, sorted(wanted - named)


def test_architecture_gives_each_tools_module_one_bullet():
    """The ``sglang_ext_tools/`` part of the Tooling section (up to its ``fixtures/`` paragraph)
    is grouped lists, one ``- `name`: …`` bullet for each module at the package's top (not
    ``__init__``, not ``fixtures/``): none missing, none twice, none for a module that is gone."""
    text = _tooling_section()
    part = text.split("**`sglang_ext_tools/`.**", 1)[1].split("**`sglang_ext_tools/fixtures/`**")[0]
    bullets = re.findall(r"^- `([^`]+)`:", part, re.MULTILINE)
    modules = {p.stem for p in (ROOT / "sglang_ext_tools").glob("*.py")} - {"__init__"}
    assert len(bullets) == len(set(bullets)), sorted(b for b in bullets if bullets.count(b) > 1)
    assert set(bullets) == modules, (sorted(modules - set(bullets)), sorted(set(bullets) - modules))


def test_architecture_has_no_run_on_line():
    """Prose is wrapped (~100 columns); a line past 400 characters is a list run together. The
    table rows are the longest lines kept on purpose, and stay under that too."""
    lines = ARCHITECTURE.read_text(encoding="utf-8").splitlines()
    long = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > 400]
    assert not long, f"ARCHITECTURE.md lines (number, length) past 400 characters: {long}"


def _edits_sys_path(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value  # sys.path.insert(...), .append(...)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t for t in targets if isinstance(t, ast.Attribute)), None)
        if (isinstance(target, ast.Attribute) and target.attr == "path"
                and isinstance(target.value, ast.Name) and target.value.id == "sys"):
            lines.append(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize("path", _tooling_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_tooling_edits_no_sys_path(path):
    """The fixture builders and the benchmark are one package and import each other by name;
    node/ and scripts/ are standalone scripts: nothing reaches another file by editing
    sys.path."""
    assert not _edits_sys_path(ast.parse(path.read_text(encoding="utf-8")))


def test_the_sys_path_check_sees_an_edit():
    tree = ast.parse("import sys\nsys.path.insert(0, 'x')\nsys.path += ['y']\nsys.argv.pop()\n")
    assert _edits_sys_path(tree) == [2, 3]


@pytest.mark.parametrize(
    "module",
    ["sglang_ext.metrics.acceptance", "sglang_ext.metrics.acceptance_prometheus",
     "sglang_ext.metrics.drafter_health"],
)
def test_acceptance_leaves_import_neither_the_package_nor_sglang(module):
    """metrics.hook (the SGLang hook) imports these; they import nothing back, nor SGLang."""
    names = imported(module, MODULES[module])
    bad = {n for n in names if n.split(".")[0] in ("sglang_ext", "sglang", "torch")}
    assert not bad, f"{module} imports {sorted(bad)}"


def test_demo_and_compat_import_nothing_of_the_package():
    """demo's builders are the behavioural suite's fixture in its no-plugin mode, which lets
    only sglang_ext and sglang_ext.demo load; compat is the bottom floor and reads SGLang only
    inside functions."""
    for module in ("sglang_ext.demo", "sglang_ext.compat"):
        names = imported(module, MODULES[module])
        assert not {n for n in names if n.split(".")[0] == "sglang_ext"}, module
    top = {n.split(".")[0] for n in imported("sglang_ext.compat", MODULES["sglang_ext.compat"],
                                             lazy=False)}
    assert top <= set(sys.stdlib_module_names), sorted(top)


# -- no façades -------------------------------------------------------------------------------


def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


@functools.cache
def defined(module: str) -> frozenset[str]:
    """The names ``module`` defines at top level (def, class, assignment), not those it imports."""
    out = set()
    for node in _module_level(ast.parse(_module_file(module).read_text(encoding="utf-8")).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return frozenset(out)


def lives_in(module: str, name: str) -> bool:
    return _module_file(f"{module}.{name}") is not None or name in defined(module)


def _python_files() -> list[str]:
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "*.py"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    skip = ("sglang_ext/data/", "tests/data/", "tests/test_layout.py")  # its own samples
    return [f for f in listed if not f.startswith(skip) and (ROOT / f).is_file()]


def facade_uses(relpath: str, root: Path = ROOT) -> list[str]:
    """Where ``relpath`` (under ``root``) takes a name of ``sglang_ext`` from a module that does
    not define it: ``from M import n``, ``alias.n`` on an imported module, a dotted string."""
    tree = ast.parse((root / relpath).read_text(encoding="utf-8"))
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
            node.module.split(".")[0] == "sglang_ext"
        ):
            if _module_file(node.module) is None:
                found.append(f"{relpath}:{node.lineno}: no module {node.module}")
                continue
            for alias in node.names:
                if not lives_in(node.module, alias.name):
                    found.append(f"{relpath}:{node.lineno}: {alias.name} not in {node.module}")
                elif _module_file(f"{node.module}.{alias.name}"):
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sglang_ext":
                    if _module_file(alias.name) is None:
                        found.append(f"{relpath}:{node.lineno}: no module {alias.name}")
                    elif alias.asname:
                        aliases[alias.asname] = alias.name
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and re.fullmatch(r"sglang_ext(\.\w+)+", node.value)
              and node.value not in NOT_MODULE_PATHS):
            dotted = node.value.split(".")
            i = max(i for i in range(1, len(dotted) + 1) if _module_file(".".join(dotted[:i])))
            if i < len(dotted) and not lives_in(".".join(dotted[:i]), dotted[i]):
                found.append(f"{relpath}:{node.lineno}: {node.value!r} names no definition")
    rebound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
               and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.value.id not in rebound
                and not lives_in(aliases[node.value.id], node.attr)):
            found.append(f"{relpath}:{node.lineno}: {node.value.id}.{node.attr} not in "
                         f"{aliases[node.value.id]}")
    return found


def test_every_name_is_imported_from_where_it_lives():
    """No module hands on another's names: callers (package, tests, scripts, tooling) import
    each from the module that defines it, so a move shows at every caller."""
    found = [use for path in _python_files() for use in facade_uses(path)]
    assert not found, "\n".join(found)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from .. import reference\n    import sglang_ext_tools.widen\n")
    names = imported("sglang_ext.sub.m", src)
    assert {"sglang_ext.reference", "sglang_ext_tools.widen"} <= names
    assert not imported("sglang_ext.sub.m", src, lazy=False)


def test_the_checker_sees_a_facade(tmp_path):
    """``loading`` imports DrafterLoadError from checkpoint_files: taking it from loading is a
    façade use; so is an attribute or a monkeypatch string through the wrong module."""
    (tmp_path / "t.py").write_text(
        "from sglang_ext.drafter.loading import DrafterLoadError, LoadPlan\n"
        "from sglang_ext.drafter import loading\n"
        "loading.read_checkpoint\n"
        "target = 'sglang_ext.drafter.loading.TensorInfo'\n"
    )
    found = facade_uses("t.py", tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == [
        "DrafterLoadError not in sglang_ext.drafter.loading",
        "'sglang_ext.drafter.loading.TensorInfo' names no definition",
        "loading.read_checkpoint not in sglang_ext.drafter.loading",
    ]
