"""The behavioural suite runs the same tests in one of two modes (SGLANG_EXT_BEHAVIOUR):

- ``plugin`` (default, part of the regular suite): the installed, stock SGLang with the
  sglang-ext plugin loaded by SGLang's own plugin loader (entry point ``sglang_ext``);
- ``patched``: SGLang with the patch series patches/vX.Y.Z applied (a scratch copy first on
  PYTHONPATH, SGLANG_EXT_PATCHED_SITE names it) and NO plugin: SGLANG_PLUGINS must exclude
  ``sglang_ext``, and importing any plugin module fails the run. tests/test_patches.py runs it.

The tests themselves (test_speculators_eagle3_*.py) only use SGLang's entry points, so the
same assertions hold in both; this is the drift guard between the plugin and the hand-written
series (a few plugin-only behaviours skip in patched mode, saying why). Plugin mode restores
SGLang's registry and hooked functions after each test module, so the rest of the suite sees
SGLang as it found it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import pkgutil
import sys
from pathlib import Path

import pytest

MODE = os.environ.get("SGLANG_EXT_BEHAVIOUR", "plugin")
if MODE not in ("plugin", "patched"):
    raise pytest.UsageError(f"SGLANG_EXT_BEHAVIOUR={MODE!r}: expected 'plugin' or 'patched'")
# A module only a patched SGLang has: the series' speculators config reader (the 0.5.17
# series of the plugin-generated shape adds the package speculators_eagle3).
IN_TREE = ("sglang.srt.configs.speculators_eagle3", "sglang.srt.speculative.speculators_eagle3")
# The checkpoint builders (sglang_ext.demo, speculators' own classes) are test fixtures, not
# the system under test.
FIXTURE_MODULES = {"sglang_ext", "sglang_ext.demo"}


class _NoPlugin(importlib.abc.MetaPathFinder):
    """Patched mode: the plugin must play no part."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "sglang_ext" and name not in FIXTURE_MODULES:
            raise ImportError(
                f"{name}: the behavioural suite runs in patched mode (SGLang with the patch "
                "series, no plugin); the plugin must not be imported"
            )
        return None


if MODE == "patched":
    already = sorted(m for m in sys.modules if m.split(".")[0] == "sglang_ext"
                     and m not in FIXTURE_MODULES)
    if already:
        raise pytest.UsageError(f"patched mode, but plugin modules are loaded: {already}")
    sys.meta_path.insert(0, _NoPlugin())


def pytest_report_header(config):
    return f"EAGLE-3 behavioural suite: {MODE} mode"


def pytest_terminal_summary(terminalreporter):
    spec = importlib.util.find_spec("sglang")
    where = Path(spec.origin).parent.parent if spec and spec.origin else "<not found>"
    terminalreporter.write_line(f"EAGLE-3 behavioural suite: {MODE} mode, sglang from {where}")


@pytest.fixture(scope="module", autouse=True)
def sglang_stack(sglang_env):
    """SGLang as a server process would have it: plugins loaded by SGLang's loader (per test
    module, undone after it in plugin mode, so the tests outside this folder are unaffected)."""
    import sglang
    from sglang.srt import plugins
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.plugins.hook_registry import HookRegistry

    in_tree = any(importlib.util.find_spec(name) is not None for name in IN_TREE)
    if MODE == "patched":
        if not in_tree:
            pytest.exit(f"patched mode, but {sglang.__file__} has none of {IN_TREE}",
                        returncode=4)
        site = os.environ.get("SGLANG_EXT_PATCHED_SITE")
        if site and not Path(sglang.__file__).resolve().is_relative_to(Path(site).resolve()):
            pytest.exit(f"patched mode: sglang comes from {sglang.__file__}, not {site}",
                        returncode=4)
        allowed = os.environ.get("SGLANG_PLUGINS", "")
        if not allowed or "sglang_ext" in {x.strip() for x in allowed.split(",")}:
            pytest.exit("patched mode needs SGLANG_PLUGINS set to exclude sglang_ext "
                        "(e.g. SGLANG_PLUGINS=__none__)", returncode=4)
        plugins.load_plugins()
        cls, _ = ModelRegistry.resolve_model_cls(["LlamaForCausalLMEagle3"])
        assert cls.__module__ == "sglang.srt.models.llama_eagle3", cls.__module__
        yield "patched"
        return

    if in_tree:
        pytest.exit(f"plugin mode needs a stock SGLang, but {sglang.__file__} carries the "
                    "patch series", returncode=4)
    registry = dict(ModelRegistry.models)
    hooks = {target: list(entries) for target, entries in HookRegistry._hooks.items()}
    patched = set(HookRegistry._patched)
    loaded = plugins._plugins_loaded
    plugins._plugins_loaded = False
    try:
        plugins.load_plugins()
        HookRegistry.apply_hooks()
        cls, _ = ModelRegistry.resolve_model_cls(["LlamaForCausalLMEagle3"])
        if not cls.__module__.startswith("sglang_ext."):
            pytest.exit(f"plugin mode, but SGLang resolves LlamaForCausalLMEagle3 to "
                        f"{cls.__module__}: is sglang-ext installed and allowed by "
                        f"SGLANG_PLUGINS={os.environ.get('SGLANG_PLUGINS')!r}?", returncode=4)
        yield "plugin"
    finally:
        for target in set(HookRegistry._patched) - patched:
            _unwrap(target)
        HookRegistry._hooks.clear()
        HookRegistry._hooks.update(hooks)
        HookRegistry._patched.clear()
        HookRegistry._patched.update(patched)
        ModelRegistry.models.clear()
        ModelRegistry.models.update(registry)
        plugins._plugins_loaded = loaded


def _unwrap(target: str) -> None:
    """Undo one hook wrapper that HookRegistry applied to `target` (and propagated)."""
    owner_path, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    current = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
    original = getattr(current, "__wrapped__", None)
    if original is None:
        return
    setattr(owner, attr, original)
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if value is current:
                setattr(module, name, original)
