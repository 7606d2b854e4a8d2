"""What a server process does with one of the plugin's switches, on CPU: the switch in its env,
the plugin's registration, SGLang's hooks applied, then ModelRunner.load_model, which ``setup``
replaces with a stand-in (a real one needs a GPU)."""

from __future__ import annotations

import subprocess
import sys


def run_with_plugin(env: dict[str, str], setup: str, after: str) -> list[str]:
    """Run it in a fresh Python: ``setup`` (code, with ``mr`` the model_runner module) before
    the registration, ``after`` (code, with ``targets`` the registered targets) once the hooks
    are applied; the words ``after`` printed."""
    code = "\n".join(
        [
            "import os",
            *(f"os.environ[{k!r}] = {v!r}" for k, v in env.items()),
            "from sglang.srt.model_executor import model_runner as mr",
            setup,
            "from sglang.srt.plugins.hook_registry import HookRegistry",
            "from sglang_ext import plugin",
            "targets = plugin._register()",
            "HookRegistry.apply_hooks()",
            after,
        ]
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()
