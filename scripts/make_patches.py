#!/usr/bin/env python3
"""Generate the upstream SGLang patch series (patches/vX.Y.Z/) from the sglang_ext plugin.

    python scripts/make_patches.py --sglang-src SITE/sglang --version 0.5.23 --out patches/v0.5.23
    python scripts/make_patches.py --sglang-src SITE/sglang --version 0.5.23 \
        --out patches/v0.5.23 --check        # CI: the committed series is what we generate

The base is the *released wheel's* sources of exactly that SGLang version (the installed
`sglang` package directory, `--sglang-src`); paths in the series follow the upstream
repository layout (`python/sglang/...`, `test/registered/...`).

Each commit is built from two kinds of change, so the series never drifts from the plugin:

1. Modules that ARE the plugin's modules, moved in-tree with only their imports rewritten
   (`GENERATED_MODULES`, `IMPORT_HOMES`): the speculators format, strict loading, fusion policy
   and acceptance metrics live once, in sglang_ext, and are copied mechanically. The in-tree
   CPU tests are generated the same way from tests/behaviour (the behavioural suite that runs
   against both the plugin and the patched SGLang).
2. Small, explicit edits to upstream files that call into them (llama_eagle3.py,
   kimi_k25_eagle3.py, get_config, configure_aux_hidden_state_capture, the tokenizer manager).
   Every edit is an anchored text replacement: an anchor that is missing, or present more than
   once, stops the generator with the file and the anchor. These edits port code of the
   plugin's classes and hooks (sglang_ext/models/*, sglang_ext/plugin.py); each commit names
   those sources with a sha256 prefix in a `Ported-from:` trailer, so changing them changes
   the series and the drift check fails until the series is regenerated (and the port
   reviewed). The behavioural suite checks that both behave the same.

Output is deterministic (fixed author and date, content-derived commit ids, difflib diffs), so
`--check` compares byte for byte. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AUTHOR = "sglang-ext developers <sglang-ext@users.noreply.github.com>"
DATE = "Mon, 1 Dec 2025 00:00:00 +0000"
SIGNATURE = "scripts/make_patches.py (sglang-ext)"

PKG = "python/sglang/srt/speculative/speculators_eagle3"
PKG_MODULE = "sglang.srt.speculative.speculators_eagle3"
UNIT_DIR = "test/registered/unit/speculative/speculators_eagle3"
GPU_DIR = "test/registered/spec/eagle"

# plugin module -> in-tree module (import rewriting)
IMPORT_HOMES = {
    "sglang_ext.speculators_format": f"{PKG_MODULE}.format",
    "sglang_ext.loading": f"{PKG_MODULE}.loading",
    "sglang_ext.fusion": f"{PKG_MODULE}.fusion",
    "sglang_ext.metrics": f"{PKG_MODULE}.metrics",
}
# in-tree file <- plugin file (copied, imports rewritten)
GENERATED_MODULES = {
    f"{PKG}/format.py": "sglang_ext/speculators_format.py",
    f"{PKG}/fusion.py": "sglang_ext/fusion.py",
    f"{PKG}/loading.py": "sglang_ext/loading.py",
    f"{PKG}/metrics.py": "sglang_ext/metrics.py",
}
# test helper modules -> their in-tree names (unique on upstream's sys.path)
TEST_IMPORT_HOMES = {
    "sglang_cpu": "eagle3_cpu_harness",
    "builders": "speculators_checkpoints",
    "mla_drafters": "eagle3_mla_checkpoints",
    "eagle3_behaviour": "eagle3_behaviour",
}
GENERATED_TESTS = {
    f"{UNIT_DIR}/conftest.py": "tests/conftest.py",
    f"{UNIT_DIR}/eagle3_cpu_harness.py": "tests/sglang_cpu.py",
    f"{UNIT_DIR}/eagle3_mla_checkpoints.py": "tests/mla_drafters.py",
    **{
        f"{UNIT_DIR}/{name}": f"tests/behaviour/{name}"
        for name in (
            "eagle3_behaviour.py",
            "test_speculators_eagle3_fusion.py",
            "test_speculators_eagle3_loading.py",
            "test_speculators_eagle3_format.py",
            "test_speculators_eagle3_metrics.py",
        )
    },
}
BUILDERS_IN_TREE = f"{UNIT_DIR}/speculators_checkpoints.py"
GPU_TESTS_SRC = ROOT / "patches" / "gpu-tests"


class GenerationError(RuntimeError):
    """The series cannot be generated as specified (missing anchor, unmapped import, ...)."""


# ---------------------------------------------------------------------------------------------
# Sources


def read_text(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        raise GenerationError(f"{path}: no newline at end of file")
    return text


def repo_file(rel: str) -> str:
    return read_text(ROOT / rel)


def fingerprint(rel: str) -> str:
    return hashlib.sha256((ROOT / rel).read_bytes()).hexdigest()[:16]


def installed_version(pkg_dir: Path) -> str | None:
    """`__version__` of an SGLang package directory, read as text (never imported)."""
    for name in ("_version.py", "version.py"):
        path = pkg_dir / name
        if path.is_file():
            match = re.search(
                r"^__version__\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]",
                path.read_text(encoding="utf-8"),
                re.M,
            )
            if match:
                return match.group(1)
    for dist in sorted(pkg_dir.parent.glob("sglang-*.dist-info")):
        meta = dist / "METADATA"
        if meta.is_file():
            match = re.search(r"^Version:\s*(\S+)", meta.read_text(encoding="utf-8"), re.M)
            if match:
                return match.group(1)
    return None


# ---------------------------------------------------------------------------------------------
# Mechanical module generation


def rewrite_imports(source: str, homes: dict[str, str], where: str) -> str:
    """Rewrite `from <module> import ...` for the modules in `homes`; refuse any other
    import of sglang_ext (it would not exist in-tree)."""
    tree = ast.parse(source, filename=where)
    lines = source.splitlines(keepends=True)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top == "sglang_ext" or alias.name in homes:
                    problems.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = node.module
            if module in homes:
                line = lines[node.lineno - 1]
                old = f"from {module} import"
                if line.count(old) != 1:
                    problems.append(f"line {node.lineno}: cannot rewrite {line.strip()!r}")
                    continue
                lines[node.lineno - 1] = line.replace(old, f"from {homes[module]} import")
            elif module.split(".")[0] == "sglang_ext":
                problems.append(f"line {node.lineno}: from {module} import ...")
    if problems:
        raise GenerationError(
            f"{where}: imports with no in-tree home (extend IMPORT_HOMES or change the "
            "plugin):\n  " + "\n  ".join(problems)
        )
    return "".join(lines)


def with_header(source: str, origin: str, note: str) -> str:
    header = (
        f"# Generated by sglang-ext's scripts/make_patches.py from {origin}\n"
        f"# ({note}).\n"
        "# Edit it there and regenerate the series: the two never drift.\n"
    )
    return header + source


def generated_module(in_tree: str) -> str:
    origin = GENERATED_MODULES[in_tree]
    text = rewrite_imports(repo_file(origin), IMPORT_HOMES, origin)
    return with_header(text, origin, "imports moved in-tree, nothing else changed")


def generated_test(in_tree: str) -> str:
    origin = GENERATED_TESTS[in_tree]
    text = rewrite_imports(repo_file(origin), TEST_IMPORT_HOMES, origin)
    return with_header(text, origin, "helper imports renamed, nothing else changed")


def top_level_segment(source: str, name: str, where: str) -> str:
    tree = ast.parse(source, filename=where)
    lines = source.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "".join(lines[start - 1 : node.end_lineno])
    raise GenerationError(f"{where}: no top-level definition {name!r}")


def generated_builders() -> str:
    """tests/builders.py with the speculators checkpoint builders it imports from
    sglang_ext.demo inlined (Variant, write_target, build_drafter), nothing else changed."""
    builders = repo_file("tests/builders.py")
    demo = repo_file("sglang_ext/demo.py")
    wanted = "from sglang_ext.demo import Variant, build_drafter, write_target  # noqa: F401\n"
    if builders.count(wanted) != 1:
        raise GenerationError(f"tests/builders.py: expected exactly one line {wanted!r}")
    future = "from __future__ import annotations\n\n"
    if builders.count(future) != 1:
        raise GenerationError(f"tests/builders.py: expected exactly one {future.strip()!r}")
    inlined = "\n\n".join(
        top_level_segment(demo, name, "sglang_ext/demo.py")
        for name in ("Variant", "write_target", "build_drafter")
    )
    head, tail = builders.split(wanted)
    stdlib = "import json\nfrom dataclasses import dataclass\nfrom pathlib import Path\n\n"
    head = head.replace(future, future + stdlib)
    text = rewrite_imports(head + "\n" + inlined + "\n" + tail, TEST_IMPORT_HOMES,
                           "tests/builders.py")
    return with_header(
        text,
        "tests/builders.py",
        "with sglang_ext/demo.py's checkpoint builders inlined",
    )


# ---------------------------------------------------------------------------------------------
# Anchored edits of upstream files


@dataclass(frozen=True)
class Edit:
    """Replace `old` (which must occur exactly once) by `new`."""

    old: str
    new: str


@dataclass(frozen=True)
class Region:
    """Replace the text from `start` (inclusive) up to `end` (exclusive); both unique."""

    start: str
    end: str
    new: str


def insert_after(anchor: str, text: str) -> Edit:
    return Edit(anchor, anchor + text)


def insert_before(anchor: str, text: str) -> Edit:
    return Edit(anchor, text + anchor)


def _find_once(text: str, needle: str, path: str, what: str) -> int:
    count = text.count(needle)
    if count != 1:
        shown = needle if len(needle) < 200 else needle[:200] + "..."
        raise GenerationError(
            f"{path}: {what} found {count} times (expected exactly once); upstream changed? "
            f"anchor:\n{shown}"
        )
    return text.index(needle)


def apply_edit(text: str, edit: Edit | Region, path: str) -> str:
    if isinstance(edit, Edit):
        at = _find_once(text, edit.old, path, "anchor")
        return text[:at] + edit.new + text[at + len(edit.old) :]
    start = _find_once(text, edit.start, path, "region start")
    end = _find_once(text, edit.end, path, "region end")
    if end <= start:
        raise GenerationError(f"{path}: region end precedes region start")
    return text[:start] + edit.new + text[end:]


# ---------------------------------------------------------------------------------------------
# The commits


@dataclass
class Commit:
    slug: str
    subject: str
    body: str
    edits: dict[str, list[Edit | Region]] = field(default_factory=dict)  # path -> edits
    new_files: dict[str, Callable[[], str]] = field(default_factory=dict)  # path -> content
    generated_from: list[str] = field(default_factory=list)
    ported_from: list[str] = field(default_factory=list)


LLAMA = "python/sglang/srt/models/llama_eagle3.py"
KIMI = "python/sglang/srt/models/kimi_k25_eagle3.py"
CAPTURE = "python/sglang/srt/model_executor/model_runner_components/attention_backend_setup.py"
CONFIG = "python/sglang/srt/utils/hf_transformers/config.py"
TOKENIZER = "python/sglang/srt/managers/tokenizer_manager.py"

PKG_INIT = '''"""EAGLE-3 drafters trained by speculators (github.com/vllm-project/speculators).

- ``format``: the speculators checkpoint format as data: a typed drafter spec for speculators-
  and SGLang-format configs, the checkpoint-key table, the aux-layer-id conventions and the
  translation to the config SGLang's drafter classes read.
- ``loading``: strict weight loading: every checkpoint tensor is loaded, ignored for a stated
  reason, or an error; a parameter that nothing fills is an error.
- ``fusion``: when the drafter's fc fuses the target's auxiliary hidden states (by forward
  mode, never by tensor width), and the startup plan/check of what the target captures.
- ``metrics``: per-request acceptance log line, JSONL sink, Prometheus metrics and a
  drafter-health alarm.

The modules import only the standard library at import time.
"""
'''


def commit_fusion(version: str) -> Commit:
    fusion_import = (
        "from sglang.srt.speculative.speculators_eagle3.fusion import (\n"
        "    FusionPolicy,\n"
        "    check_algorithm,\n"
        ")\n"
    )
    llama = [
        Edit(
            "from sglang.srt.runtime_context import get_spec\n",
            "from sglang.srt.runtime_context import get_server_args, get_spec\n",
        ),
        insert_before("\n\nclass LlamaDecoderLayer(LlamaDecoderLayer):\n", fusion_import),
        insert_after(
            '        self.norm_output = getattr(config, "norm_output", False)\n',
            "\n"
            "        # Whether fc fuses is decided by the forward mode, never by tensor width:\n"
            "        # features of exactly one target layer are as wide as the drafter and used\n"
            "        # to skip fusion silently (accept length 1.0).\n"
            "        self.fusion = FusionPolicy(\n"
            '            drafter=str(getattr(config, "_name_or_path", "") or "<eagle3 drafter>"),\n'
            "            num_aux_hidden_states=self.num_aux_hidden_states,\n"
            "            fc_input_hidden_size=self.hidden_size_in,\n"
            "            hidden_size=config.hidden_size,\n"
            "        )\n",
        ),
        Edit(
            "        hidden_states = forward_batch.spec_info.hidden_states\n"
            "        if hidden_states.shape[-1] != embeds.shape[-1]:\n",
            "        hidden_states = forward_batch.spec_info.hidden_states\n"
            "        # Target features (every forward but a draft decode step) always go through\n"
            "        # fc; a draft decode step carries the drafter's own state and never does. A\n"
            "        # width that fits neither raises FusionError naming both widths.\n"
            "        if self.fusion.applies("
            "forward_batch.forward_mode, hidden_states.shape[-1]):\n",
        ),
        insert_after(
            "    ) -> None:\n        nn.Module.__init__(self)\n",
            "        check_algorithm(\n"
            "            get_server_args().speculative_algorithm,\n"
            '            str(getattr(config, "_name_or_path", "") or "<eagle3 drafter>"),\n'
            "        )\n",
        ),
    ]
    if version == "0.5.17":
        kimi_imports = [
            insert_before(
                "from sglang.srt.utils import BumpAllocator, add_prefix\n",
                "from sglang.srt.runtime_context import get_server_args\n" + fusion_import,
            )
        ]
    else:
        kimi_imports = [
            Edit(
                "from sglang.srt.runtime_context import get_parallel\n",
                "from sglang.srt.runtime_context import get_parallel, get_server_args\n"
                + fusion_import,
            )
        ]
    kimi = kimi_imports + [
        insert_after(
            '        self.norm_output = getattr(config, "norm_output", False)\n',
            "\n"
            "        # Whether fc fuses is decided by the forward mode, never by tensor width.\n"
            "        self.fusion = FusionPolicy(\n"
            '            drafter=str(getattr(config, "_name_or_path", "") or "<mla drafter>"),\n'
            "            num_aux_hidden_states=self.num_aux_hidden_states,\n"
            "            fc_input_hidden_size=target_hidden_size,\n"
            "            hidden_size=config.hidden_size,\n"
            "        )\n",
        ),
        Edit(
            "        hidden_states = forward_batch.spec_info.hidden_states\n"
            "        if hidden_states.shape[-1] != embeds.shape[-1]:\n",
            "        hidden_states = forward_batch.spec_info.hidden_states\n"
            "        # Fuse target features by forward mode, never by width "
            "(see llama_eagle3.py).\n"
            "        if self.fusion.applies("
            "forward_batch.forward_mode, hidden_states.shape[-1]):\n",
        ),
        insert_before(
            "        super().__init__()\n        self.config = config\n"
            "        # Match deepseek_nextn behavior",
            "        check_algorithm(\n"
            "            get_server_args().speculative_algorithm,\n"
            '            str(getattr(config, "_name_or_path", "") or "<mla drafter>"),\n'
            "        )\n",
        ),
    ]
    capture_imports = (
        "from sglang.srt.speculative.speculators_eagle3.format import load_drafter_spec\n"
        "from sglang.srt.speculative.speculators_eagle3.fusion import (\n"
        "    apply_capture,\n"
        "    plan_capture,\n"
        "    target_info_from_model,\n"
        ")\n"
    )
    if version == "0.5.17":
        capture_import_edits = [
            insert_before(
                "from sglang.srt.utils import init_cublas\n",
                "from sglang.srt.runtime_context import get_server_args\n" + capture_imports,
            )
        ]
    else:
        capture_import_edits = [
            Edit(
                "from sglang.srt.runtime_context import get_parallel\n",
                "from sglang.srt.runtime_context import get_parallel, get_server_args\n"
                + capture_imports,
            )
        ]
    capture = capture_import_edits + [
        insert_before(
            "def configure_aux_hidden_state_capture(\n",
            "def _plan_eagle3_capture(model):\n"
            '    """(spec, target, plan) for the EAGLE-3 drafter being served: the layers the\n'
            "    target must capture and the ids its own set_eagle3_layers_to_capture is called\n"
            "    with; None where this rank does not capture (not the last pipeline stage) or\n"
            '    no drafter is configured."""\n'
            "    draft_path = get_server_args().speculative_draft_model_path\n"
            "    spec = load_drafter_spec(draft_path) if draft_path else None\n"
            '    pp_group = getattr(model, "pp_group", None)\n'
            "    if spec is None or (pp_group is not None and not pp_group.is_last_rank):\n"
            "        return None\n"
            "    target = target_info_from_model(model)\n"
            "    return spec, target, plan_capture(spec, target)\n"
            "\n\n",
        ),
        Edit(
            "        model.set_eagle3_layers_to_capture(eagle_aux_hidden_state_layer_ids)\n",
            "        # Capture exactly the layers the drafter was trained on, and check it before\n"
            "        # serving: the model's own method switches capture on, then the planned\n"
            "        # layers are set where its class keeps them and read back. Ids that collapse\n"
            "        # or fall outside the target fail here, not as a shape error (or a silently\n"
            "        # unfused drafter) on the first request.\n"
            "        capture = _plan_eagle3_capture(model)\n"
            "        if capture is not None and capture[2].sglang_ids is not None:\n"
            "            eagle_aux_hidden_state_layer_ids = list(capture[2].sglang_ids)\n"
            "        model.set_eagle3_layers_to_capture(eagle_aux_hidden_state_layer_ids)\n"
            "        if capture is not None:\n"
            "            spec, target, plan = capture\n"
            "            logger.info(\n"
            '                "sglang_ext: target %s captures aux layers %s for drafter %s "\n'
            '                "(set and read back after set_eagle3_layers_to_capture(%s))",\n'
            "                target.architecture,\n"
            "                apply_capture(model, plan),\n"
            "                spec.source,\n"
            "                eagle_aux_hidden_state_layer_ids,\n"
            "            )\n",
        ),
    ]
    return Commit(
        slug="eagle3-decide-fc-fusion-by-forward-mode",
        subject="[Spec] EAGLE-3: decide fc fusion by forward mode, fail on width mismatch",
        body=BODY_FUSION,
        edits={LLAMA: llama, KIMI: kimi, CAPTURE: capture},
        new_files={
            f"{PKG}/__init__.py": lambda: PKG_INIT,
            f"{PKG}/format.py": lambda: generated_module(f"{PKG}/format.py"),
            f"{PKG}/fusion.py": lambda: generated_module(f"{PKG}/fusion.py"),
            f"{UNIT_DIR}/conftest.py": lambda: generated_test(f"{UNIT_DIR}/conftest.py"),
            f"{UNIT_DIR}/eagle3_cpu_harness.py": lambda: generated_test(
                f"{UNIT_DIR}/eagle3_cpu_harness.py"
            ),
            BUILDERS_IN_TREE: generated_builders,
            f"{UNIT_DIR}/eagle3_mla_checkpoints.py": lambda: generated_test(
                f"{UNIT_DIR}/eagle3_mla_checkpoints.py"
            ),
            f"{UNIT_DIR}/eagle3_behaviour.py": lambda: generated_test(
                f"{UNIT_DIR}/eagle3_behaviour.py"
            ),
            f"{UNIT_DIR}/test_speculators_eagle3_fusion.py": lambda: generated_test(
                f"{UNIT_DIR}/test_speculators_eagle3_fusion.py"
            ),
            f"{GPU_DIR}/test_eagle3_fusion_guard.py": lambda: read_text(
                GPU_TESTS_SRC / "test_eagle3_fusion_guard.py"
            ),
        },
        generated_from=[
            "sglang_ext/speculators_format.py",
            "sglang_ext/fusion.py",
            "tests/conftest.py",
            "tests/sglang_cpu.py",
            "tests/builders.py",
            "sglang_ext/demo.py",
            "tests/mla_drafters.py",
            "tests/behaviour/eagle3_behaviour.py",
            "tests/behaviour/test_speculators_eagle3_fusion.py",
            "patches/gpu-tests/test_eagle3_fusion_guard.py",
        ],
        ported_from=[
            "sglang_ext/models/llama_eagle3.py",
            "sglang_ext/models/kimi_k25_eagle3.py",
            "sglang_ext/plugin.py",
        ],
    )


LOAD_WEIGHTS_DEF = (
    "    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:\n"
)
NEW_LOAD_WEIGHTS = LOAD_WEIGHTS_DEF + '''\
        """Every checkpoint tensor is loaded, ignored for a stated reason, or an error,
        and a parameter that no tensor fills is an error too: a checkpoint whose keys do
        not match used to leave the drafter at random init without a word."""
        plan = LoadPlan(self.spec)
        params_dict = dict(self.named_parameters())
        for name, loaded_weight in weights:
            decision = plan.route(
                name, tuple(loaded_weight.shape), torch_dtype_name(loaded_weight.dtype)
            )
            if decision.action == "load":
                param = params_dict[decision.param]
                weight_loader = getattr(param, "weight_loader", default_weight_loader)
                if decision.shard is None:
                    weight_loader(param, loaded_weight)
                else:
                    weight_loader(param, loaded_weight, decision.shard)
            elif decision.action == "d2t":
                self.hot_token_id = self._hot_token_ids(loaded_weight)
        report = plan.finish()
        report.raise_for_errors()
        self.load_report = report
        logger.info(
            "sglang_ext: loaded %d tensors from %s (%d ignored, %d derived)",
            report.count("loaded"),
            self.spec.source,
            report.count("ignored"),
            report.count("derived"),
        )

    def _hot_token_ids(self, d2t: torch.Tensor) -> torch.Tensor:
        # d2t stores diffs between draft id and target id
        ids = d2t.to(torch.int64) + torch.arange(d2t.shape[0], dtype=torch.int64)
        bad = (ids < 0) | (ids >= self.spec.vocab_size)
        if bool(bad.any()):
            raise DrafterLoadError(
                f"{self.spec.source}: d2t maps {int(bad.sum())} draft ids outside the "
                f"target vocabulary [0, {self.spec.vocab_size})"
            )
        return ids

'''


MLA_LOAD_WEIGHTS_START = LOAD_WEIGHTS_DEF + (
    "        params_dict = dict(self.named_parameters())\n        stacked_params_mapping = [\n"
)
NEW_MLA_LOAD_WEIGHTS = LOAD_WEIGHTS_DEF + '''\
        """The same load plan as llama_eagle3.py: every checkpoint tensor is loaded, ignored
        for a stated reason, or an error, and a parameter no tensor fills is an error too
        (names that did not match used to be skipped with a log line)."""
        plan = LoadPlan(self.spec)
        params_dict = dict(self.named_parameters())
        pending: dict = {}
        for name, loaded_weight in weights:
            decision = plan.route(
                name, tuple(loaded_weight.shape), torch_dtype_name(loaded_weight.dtype)
            )
            if decision.action == "d2t":
                self.hot_token_id = _hot_token_ids(self.spec, loaded_weight)
            if decision.action != "load":
                continue
            param = params_dict[decision.param]
            weight_loader = getattr(param, "weight_loader", default_weight_loader)
            expected = plan.params[decision.param]
            if expected.concatenated:
                # q_a_proj and kv_a_proj_with_mqa, joined in that order once both arrived
                parts = pending.setdefault(decision.param, {})
                parts[decision.shard] = loaded_weight
                if len(parts) == len(expected.shards):
                    weight_loader(param, torch.cat([parts[s] for s in expected.shards], dim=0))
            elif decision.shard is None:
                weight_loader(param, loaded_weight)
            else:
                weight_loader(param, loaded_weight, decision.shard)
        report = plan.finish()
        report.raise_for_errors()
        self.load_report = report
        logger.info(
            "sglang_ext: loaded %d tensors from %s (%d ignored, %d derived)",
            report.count("loaded"),
            self.spec.source,
            report.count("ignored"),
            report.count("derived"),
        )
        self.post_load_weights()

'''
MLA_HOT_TOKEN_IDS = '''

def _hot_token_ids(spec, d2t: torch.Tensor) -> torch.Tensor:
    # d2t stores diffs between draft id and target id
    ids = d2t.to(torch.int64) + torch.arange(d2t.shape[0], dtype=torch.int64)
    bad = (ids < 0) | (ids >= spec.vocab_size)
    if bool(bad.any()):
        raise DrafterLoadError(
            f"{spec.source}: d2t maps {int(bad.sum())} draft ids outside the target "
            f"vocabulary [0, {spec.vocab_size})"
        )
    return ids
'''


def commit_loading(version: str) -> Commit:
    del version  # the same anchors in every supported version
    llama = [
        Edit(
            "import copy\nfrom typing import Iterable, Optional, Tuple\n",
            "import copy\nimport logging\nfrom typing import Iterable, Optional, Tuple\n",
        ),
        insert_before(
            "\n\nclass LlamaDecoderLayer(LlamaDecoderLayer):\n",
            "from sglang.srt.speculative.speculators_eagle3.format import (\n"
            "    DrafterSpec,\n"
            "    _sglang_spec,\n"
            "    config_path,\n"
            "    spec_from_hf_config,\n"
            ")\n"
            "from sglang.srt.speculative.speculators_eagle3.loading import (\n"
            "    DrafterLoadError,\n"
            "    LoadPlan,\n"
            "    torch_dtype_name,\n"
            ")\n"
            "\n"
            "logger = logging.getLogger(__name__)\n"
            "\n"
            "\n"
            "def _drafter_spec(config) -> DrafterSpec:\n"
            '    """The drafter\'s typed spec: attached by the speculators config translation,\n'
            '    or read from an SGLang-format config."""\n'
            "    spec = spec_from_hf_config(config)\n"
            "    if spec is not None:\n"
            "        return spec\n"
            '    source = getattr(config, "_name_or_path", "") or "<drafter>"\n'
            "    return _sglang_spec(\n"
            '        config.to_dict(), config_path(source) if source else config_path(".")\n'
            "    )\n",
        ),
        insert_after(
            "        self.capture_aux_hidden_states = True\n        self.hot_token_id = None\n",
            "\n"
            "        # One load plan accounts for every parameter of this model; a layout it does\n"
            "        # not know (or misses) fails here instead of staying at random init.\n"
            "        self.spec = _drafter_spec(config)\n"
            "        self.load_plan = LoadPlan(self.spec)\n"
            "        self.load_plan.check_model_parameters(\n"
            "            name for name, _ in self.named_parameters()\n"
            "        )\n",
        ),
        Region(
            start=LOAD_WEIGHTS_DEF + "        params_dict = dict(self.named_parameters())\n",
            end="    def get_hot_token_id(self):\n",
            new=NEW_LOAD_WEIGHTS,
        ),
    ]
    kimi = [
        Edit("import logging\nimport re\n", "import logging\n"),  # only load_weights used it
        insert_before(
            "\nlogger = logging.getLogger(__name__)\n",
            "from sglang.srt.speculative.speculators_eagle3.format import drafter_spec_for\n"
            "from sglang.srt.speculative.speculators_eagle3.loading import (\n"
            "    DrafterLoadError,\n"
            "    LoadPlan,\n"
            "    torch_dtype_name,\n"
            ")\n",
        ),
        insert_after(
            "        self.capture_aux_hidden_states = True\n        self.hot_token_id = None\n",
            "\n"
            "        # The same load plan as llama_eagle3.py accounts for every parameter.\n"
            "        self.spec = drafter_spec_for(config)\n"
            "        LoadPlan(self.spec).check_model_parameters(\n"
            "            name for name, _ in self.named_parameters()\n"
            "        )\n",
        ),
        Region(
            start=MLA_LOAD_WEIGHTS_START,
            end="    def post_load_weights(self) -> None:\n",
            new=NEW_MLA_LOAD_WEIGHTS,
        ),
        insert_before("\n\nclass Eagle3MLADecoderLayer(nn.Module):\n", MLA_HOT_TOKEN_IDS),
    ]
    return Commit(
        slug="eagle3-strict-draft-weight-loading",
        subject="[Spec] EAGLE-3: strict draft weight loading with a load report",
        body=BODY_LOADING,
        edits={LLAMA: llama, KIMI: kimi},
        new_files={
            f"{PKG}/loading.py": lambda: generated_module(f"{PKG}/loading.py"),
            f"{UNIT_DIR}/test_speculators_eagle3_loading.py": lambda: generated_test(
                f"{UNIT_DIR}/test_speculators_eagle3_loading.py"
            ),
        },
        generated_from=[
            "sglang_ext/loading.py",
            "tests/behaviour/test_speculators_eagle3_loading.py",
        ],
        ported_from=["sglang_ext/models/llama_eagle3.py", "sglang_ext/models/kimi_k25_eagle3.py"],
    )


SPECULATORS_METHODS = '''    @staticmethod
    def _add_qk_norm(attn, eps: float) -> None:
        attn.q_norm = RMSNorm(attn.head_dim, eps=eps)
        attn.k_norm = RMSNorm(attn.head_dim, eps=eps)
        attn.__class__ = QKNormLlamaAttention

    def _warn_unapplied_sliding_window(self, spec: DrafterSpec) -> None:
        """speculators' sliding window, where SGLang can apply it: the EAGLE draft decode
        (triton multi-step draft backend) has no window buffers, so the window is served as
        full attention (same math below the window length) and the startup log says so."""
        if spec.sglang_window_size() is None or self._draft_window_size is not None:
            return
        logger.warning(
            "EAGLE-3 drafter %s was trained with sliding_window=%d on layers %s; the draft "
            "decode cannot apply a per-layer window, so it attends to the full context: "
            "identical up to %d tokens, lower acceptance (never wrong output) beyond",
            spec.source, spec.sliding_window, list(spec.sliding_layers), spec.sliding_window,
        )

    def set_embed(self, embed):
        # A drafter that trained its own embeddings (speculators embed_requires_grad,
        # or another hidden size than the target's) keeps them.
        if self.load_plan.params["model.embed_tokens.weight"].derived is None:
            return
        return super().set_embed(embed)

'''

QK_NORM_CLASS = '''class QKNormLlamaAttention(LlamaAttention):
    """LlamaAttention plus Qwen3's per-head RMSNorm of q and k before rotary embedding
    (speculators drafters with qwen3 draft layers)."""

    def forward_prepare_native(self, positions, hidden_states):
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
        k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        return q, k, v


'''


def commit_speculators(version: str) -> Commit:
    del version
    llama = [
        Edit(
            "from sglang.srt.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP\n",
            "from sglang.srt.models.llama import (\n"
            "    LlamaAttention,\n"
            "    LlamaDecoderLayer,\n"
            "    LlamaForCausalLM,\n"
            "    LlamaMLP,\n"
            ")\n",
        ),
        insert_after(
            "        self.hidden_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)\n",
            "        # speculators' norm_before_residual (set by LlamaForCausalLMEagle3).\n"
            "        self.norm_before_residual = False\n",
        ),
        Edit(
            "        if self.is_input_layer:\n"
            "            # Input layer consumes target hidden states; "
            "no carried residual to fuse.\n"
            "            residual = hidden_states\n"
            "            hidden_states = self.hidden_norm(hidden_states)\n",
            "        if self.is_input_layer:\n"
            "            if self.norm_before_residual:\n"
            "                # speculators' norm_before_residual: the residual stream starts from\n"
            "                # the normalised target features, not the raw ones.\n"
            "                hidden_states = self.hidden_norm(hidden_states)\n"
            "                residual = hidden_states\n"
            "            else:\n"
            "                # Input layer consumes target hidden states; no carried residual.\n"
            "                residual = hidden_states\n"
            "                hidden_states = self.hidden_norm(hidden_states)\n",
        ),
        insert_before("class LlamaModel(nn.Module):\n", QK_NORM_CLASS),
        insert_after(
            "        self.spec = _drafter_spec(config)\n",
            "        # speculators' math options that SGLang's config has no name for.\n"
            "        for layer in self.model.layers:\n"
            "            layer.norm_before_residual = self.spec.norm_before_residual\n"
            '            if self.spec.layer_type == "qwen3":\n'
            "                self._add_qk_norm(layer.self_attn, config.rms_norm_eps)\n"
            "        self._warn_unapplied_sliding_window(self.spec)\n",
        ),
        insert_after(
            "        self.load_plan.check_model_parameters(\n"
            "            name for name, _ in self.named_parameters()\n"
            "        )\n",
            "        logger.info(\n"
            '            "sglang_ext: EAGLE-3 drafter %s (%s format, %d %s layer(s), "\n'
            '            "norm_before_residual=%s, trained sliding_window=%s)",\n'
            "            self.spec.source,\n"
            "            self.spec.format,\n"
            "            self.spec.num_hidden_layers,\n"
            "            self.spec.layer_type,\n"
            "            self.spec.norm_before_residual,\n"
            "            self.spec.sliding_window,\n"
            "        )\n",
        ),
        insert_before(LOAD_WEIGHTS_DEF, SPECULATORS_METHODS),
        Edit(
            "\n\nEntryClass = [LlamaForCausalLMEagle3]\n",
            "\n\n"
            "class Eagle3DraftModel(LlamaForCausalLMEagle3):\n"
            '    """speculators\' architecture name for EAGLE-3 drafters (config.json)."""\n'
            "\n\n"
            "class Eagle3Speculator(LlamaForCausalLMEagle3):\n"
            '    """speculators\' architecture name for EAGLE-3 drafters (config.json)."""\n'
            "\n\n"
            "EntryClass = [LlamaForCausalLMEagle3, Eagle3DraftModel, Eagle3Speculator]\n",
        ),
    ]
    config = [
        Edit(
            "\nfrom pathlib import Path\nfrom typing import ",
            "\nimport os\nfrom pathlib import Path\nfrom typing import ",
        ),
        insert_before(
            "from sglang.srt.utils import is_remote_url, lru_cache_frozenset\n",
            "from sglang.srt.speculative.speculators_eagle3.format import (\n"
            "    is_speculators_dir,\n"
            "    load_drafter_spec,\n"
            "    to_sglang_config,\n"
            ")\n"
            "from sglang.srt.speculative.speculators_eagle3.loading import (\n"
            "    plan_from_checkpoint,\n"
            "    read_checkpoint,\n"
            ")\n",
        ),
        insert_before(
            "@lru_cache_frozenset(maxsize=32)\ndef get_config(\n",
            "def _speculators_drafter_config(model, model_override_args: Optional[dict]):\n"
            '    """A speculators-format EAGLE-3 drafter (config.json with\n'
            "    `speculators_model_type` and no `model_type`), read as data and translated to\n"
            "    the config SGLang's drafter classes read; its config.py (auto_map) is never\n"
            '    imported, whatever trust_remote_code says."""\n'
            "    spec = load_drafter_spec(model)\n"
            "    # The whole load report, from safetensors headers, before any GPU work: a\n"
            "    # missing or mis-shaped tensor or a truncated file fails the launch here.\n"
            "    plan_from_checkpoint(spec, read_checkpoint(model)).raise_for_errors()\n"
            "    config = to_sglang_config(spec)\n"
            "    for key, value in (model_override_args or {}).items():\n"
            "        setattr(config, key, value)\n"
            "    return config\n"
            "\n\n",
        ),
        Edit(
            "    **kwargs,\n):\n    is_gguf = check_gguf_file(model)\n",
            "    **kwargs,\n):\n"
            "    if isinstance(model, (str, os.PathLike)) and is_speculators_dir(model):\n"
            "        return _speculators_drafter_config(str(model), model_override_args)\n"
            "\n"
            "    is_gguf = check_gguf_file(model)\n",
        ),
    ]
    return Commit(
        slug="eagle3-serve-speculators-format-drafters",
        subject="[Spec] EAGLE-3: serve speculators-format drafters (config, keys, math)",
        body=BODY_SPECULATORS,
        edits={LLAMA: llama, CONFIG: config},
        new_files={
            f"{UNIT_DIR}/test_speculators_eagle3_format.py": lambda: generated_test(
                f"{UNIT_DIR}/test_speculators_eagle3_format.py"
            ),
            f"{GPU_DIR}/test_eagle3_speculators_drafter.py": lambda: read_text(
                GPU_TESTS_SRC / "test_eagle3_speculators_drafter.py"
            ),
        },
        generated_from=[
            "tests/behaviour/test_speculators_eagle3_format.py",
            "patches/gpu-tests/test_eagle3_speculators_drafter.py",
        ],
        ported_from=["sglang_ext/models/llama_eagle3.py", "sglang_ext/plugin.py"],
    )


def commit_metrics(version: str) -> Commit:
    del version
    tokenizer = [
        insert_before(
            "from sglang.srt.utils import (\n",
            "from sglang.srt.speculative.speculators_eagle3 import metrics as spec_acceptance\n",
        ),
        insert_before(
            "        # Init model config\n        self.init_model_config()\n",
            "        # Per-request speculative acceptance metrics: their SGLANG_EXT_* "
            "settings are\n"
            "        # read (an invalid one refused) at startup, not on the first request.\n"
            "        spec_acceptance.get_recorder()\n"
            "\n",
        ),
        Edit(
            '                meta_info["spec_cap_lens_histogram"] = '
            "recv_obj.spec_cap_lens_histogram[\n"
            "                    i\n"
            "                ]\n"
            "\n"
            "    def _request_has_grammar(",
            '                meta_info["spec_cap_lens_histogram"] = '
            "recv_obj.spec_cap_lens_histogram[\n"
            "                    i\n"
            "                ]\n"
            "\n"
            "        # Per-request acceptance: log line, JSONL sink, Prometheus histograms and\n"
            "        # per-position counters, drafter-health alarm; adds the exact accept length\n"
            "        # and per-position acceptance to meta_info. Never raises into the request.\n"
            "        if spec_acceptance.get_recorder().config.enabled:\n"
            "            spec_acceptance.after_calculate_spec_decoding_metrics(\n"
            "                None, self, meta_info, recv_obj, i\n"
            "            )\n"
            "\n"
            "    def _request_has_grammar(",
        ),
    ]
    return Commit(
        slug="eagle3-per-request-acceptance-metrics",
        subject="[Spec] EAGLE-3: per-request acceptance log, JSONL and Prometheus metrics",
        body=BODY_METRICS,
        edits={TOKENIZER: tokenizer},
        new_files={
            f"{PKG}/metrics.py": lambda: generated_module(f"{PKG}/metrics.py"),
            f"{UNIT_DIR}/test_speculators_eagle3_metrics.py": lambda: generated_test(
                f"{UNIT_DIR}/test_speculators_eagle3_metrics.py"
            ),
            f"{GPU_DIR}/test_eagle3_acceptance_metrics.py": lambda: read_text(
                GPU_TESTS_SRC / "test_eagle3_acceptance_metrics.py"
            ),
        },
        generated_from=[
            "sglang_ext/metrics.py",
            "tests/behaviour/test_speculators_eagle3_metrics.py",
            "patches/gpu-tests/test_eagle3_acceptance_metrics.py",
        ],
        ported_from=["sglang_ext/plugin.py"],
    )


COMMITS = (commit_fusion, commit_loading, commit_speculators, commit_metrics)

TESTED = """\
How tested (CPU; the GPU tests are registered for CI and were not run here):
  python3 -m pytest {unit_dir} -q
  (the same tests run against sglang-ext's plugin on stock SGLang, and numerical
  parity is against speculators' own Eagle3DraftModel)"""

BODY_FUSION = """\
What: the EAGLE-3 drafters (llama_eagle3.py and the MLA drafter in kimi_k25_eagle3.py)
decide whether fc fuses the target's auxiliary hidden states from the forward mode: a draft
decode step carries the drafter's own state and never fuses; every other forward carries
target features and always fuses, and a width other than num_aux x target_hidden_size
raises FusionError naming both widths and the likely causes. At startup,
configure_aux_hidden_state_capture asks the target for the layers the drafter was trained
on and verifies what it captures (ids that collapse to fewer layers or fall outside the
target fail before serving), and a drafter served with --speculative-algorithm EAGLE is
refused.

Why: fusion used to be decided by `hidden_states.shape[-1] != embeds.shape[-1]`. When the
target hands over one layer as wide as the drafter (aux capture not active: EAGLE instead
of EAGLE3, a target class without set_eagle3_layers_to_capture, or aux ids that collapse),
the widths match, fusion is skipped and the drafter runs on features it was never trained
on: accept length 1.0, no error. Collapsing default ids on small targets (the default
[2, L//2, L-3] with L < 6) crashed the scheduler on the first request with a matmul shape
error instead.

How: python/sglang/srt/speculative/speculators_eagle3/ is added with format.py (the typed
drafter spec and the aux-id conventions the capture plan needs; later commits use the rest)
and fusion.py (FusionPolicy, the capture plan and its verification). Both decisions are
made on Python-level facts fixed at CUDA-graph capture time, so captured graphs stay valid.

{tested}
"""

BODY_LOADING = """\
What: LlamaForCausalLMEagle3.load_weights routes every checkpoint tensor through one load
plan: each is loaded (with its stacked shard id), ignored for a stated reason (t2d,
speculators' verifier copies, parameters SGLang derives from the target), or an error
(unexpected name, wrong shape, non-float weights, a d2t that maps outside the target
vocabulary). A parameter that no tensor fills is an error too, and the constructor checks
that the plan and the model agree on the parameter set.

Why: load_weights used to skip names it did not know without a word, so a checkpoint whose
keys it could not map (a speculators drafter, a renamed layer, a missing v_proj) was served
with randomly initialised weights: accept length ~1.0 and no error.

How: python/sglang/srt/speculative/speculators_eagle3/loading.py (LoadPlan, LoadReport,
safetensors header reading with truncation checks); the key table lives in format.py and
keeps the legacy SGLang names (midlayer.*, aux_norm_*). The error lists every problem:

  drafter checkpoint /models/d does not match the model it configures (1 problem(s));
  refusing to serve a partly random drafter:
    - model.layers.0.hidden_norm.weight: missing (expected [4096], found -): ...

{tested}
"""

BODY_SPECULATORS = """\
What: EAGLE-3 drafters trained and saved by speculators (github.com/vllm-project/
speculators, config.json with speculators_model_type "eagle3" and no model_type) are
served as they are, with --speculative-algorithm EAGLE3:
- get_config reads such a directory as data (never importing its config.py) and returns
  the translated config; the checkpoint's whole load report is checked from the safetensors
  headers before any GPU work;
- the architectures Eagle3DraftModel and Eagle3Speculator resolve to the EAGLE-3 drafter;
- the math options SGLang had no name for: norm_before_residual, input_layernorm of draft
  layers >= 1 (multi-layer drafters), per-layer sliding window from layer_types (with
  speculators' window convention: sliding_window keys = SGLang window sliding_window - 1),
  drafter-owned embeddings (embed_requires_grad, or another hidden size), and qwen3 draft
  layers (per-head q_norm/k_norm);
- aux ids keep speculators' convention (id k = the state entering layer k) and are
  converted for the target's class by the capture plan of the first commit (llama/qwen
  targets add 1; deepseek_v2 targets add 1 only when the first id is 1, and a first layer of
  1 is set on the target directly).

Why: stock SGLang fails on these directories ("Should have a `model_type` key"), and a
hand-converted config silently drops the options above (norm_before_residual is
speculators' default), which costs acceptance without any error.

How: translation and key table in speculators_eagle3/format.py, used by get_config and by
the drafter class; numerical parity of the step-0 logits against speculators'
Eagle3DraftModel for every option, in fp32 on CPU.

{tested}
"""

BODY_METRICS = """\
What: every finished speculative request logs one structured line
  sglang_ext.acceptance {{"rid":..,"accept_length":..,"accept_per_position":[..],..}}
and can append the same object to a JSONL file (SGLANG_EXT_ACCEPTANCE_JSONL); with
--enable-metrics, Prometheus gets per-request accept length / accept rate histograms and
per-position proposed/accepted counters (sglang:spec_ext_*); meta_info gains
spec_accept_length_exact = (accepted drafts + verify steps) / verify steps and the
per-position acceptance; a rolling drafter-health alarm warns once per episode when the
mean accept rate of recent long requests falls below a threshold
(SGLANG_EXT_ALARM_WINDOW / _MIN_TOKENS / _ACCEPT_RATE; SGLANG_EXT_METRICS=0 turns it all off).

Why: a deployment ran EAGLE-3 at a third of its expected speed with an accept length of
exactly 1.00 and nobody noticed: only throughput was watched. spec_accept_length in
meta_info counts the prefill token, so it reads 1.33 for a drafter that never gets a token
accepted on a 3-step request.

How: speculators_eagle3/metrics.py, called at the end of
TokenizerManager._calculate_spec_decoding_metrics from counters SGLang already carries
(spec_verify_ct, spec_num_correct_drafts, spec_correct_drafts_histogram): O(steps) integer
arithmetic per finished request, nothing new crosses process boundaries.

{tested}
"""


# ---------------------------------------------------------------------------------------------
# Diffs and the format-patch files


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _range(start: int, length: int) -> str:
    if length == 1:
        return str(start + 1)
    if length == 0:
        return f"{start},0"
    return f"{start + 1},{length}"


def file_diff(path: str, old: str | None, new: str) -> tuple[str, int, int]:
    """A git-style diff of one file (old None: a new file); returns (text, added, removed)."""
    a = [] if old is None else old.splitlines(keepends=True)
    b = new.splitlines(keepends=True)
    for lines in (a, b):
        if lines and not lines[-1].endswith("\n"):
            raise GenerationError(f"{path}: no newline at end of file")
    old_id = "0" * 7 if old is None else git_blob_id(old.encode())[:7]
    new_id = git_blob_id(new.encode())[:7]
    out = [f"diff --git a/{path} b/{path}\n"]
    if old is None:
        out += ["new file mode 100644\n", f"index {old_id}..{new_id}\n", "--- /dev/null\n"]
    else:
        out += [f"index {old_id}..{new_id} 100644\n", f"--- a/{path}\n"]
    out.append(f"+++ b/{path}\n")
    added = removed = 0
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(3):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2 - i1)} +{_range(j1, j2 - j1)} @@\n")
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                out += [" " + line for line in a[a1:a2]]
                continue
            if tag in ("replace", "delete"):
                out += ["-" + line for line in a[a1:a2]]
                removed += a2 - a1
            if tag in ("replace", "insert"):
                out += ["+" + line for line in b[b1:b2]]
                added += b2 - b1
    return "".join(out), added, removed


def diffstat(stats: list[tuple[str, int, int]]) -> str:
    width = max(len(p) for p, _, _ in stats)
    most = max(a + r for _, a, r in stats) or 1
    num = len(str(most))
    scale = min(1.0, 40 / most)
    lines = []
    for path, added, removed in stats:
        plus = max(1, round(added * scale)) if added else 0
        minus = max(1, round(removed * scale)) if removed else 0
        lines.append(f" {path:<{width}} | {added + removed:>{num}} {'+' * plus}{'-' * minus}\n")
    files = len(stats)
    total_add = sum(a for _, a, _ in stats)
    total_del = sum(r for _, _, r in stats)
    summary = f" {files} file{'s' if files != 1 else ''} changed"
    if total_add:
        summary += f", {total_add} insertion{'s' if total_add != 1 else ''}(+)"
    if total_del:
        summary += f", {total_del} deletion{'s' if total_del != 1 else ''}(-)"
    return "".join(lines) + summary + "\n"


def wrap_body(text: str) -> str:
    return text.rstrip("\n") + "\n"


def patch_text(index: int, total: int, commit: Commit, diffs: str, stats, version: str) -> str:
    body = wrap_body(commit.body.format(tested=TESTED.format(unit_dir=UNIT_DIR)))
    trailers = [
        f"Base: SGLang {version} (released wheel sources)",
        *(f"Generated-from: {rel} sha256:{fingerprint(rel)}" for rel in commit.generated_from),
        *(f"Ported-from: {rel} sha256:{fingerprint(rel)}" for rel in commit.ported_from),
    ]
    message = f"{body}\n" + "".join(t + "\n" for t in trailers)
    commit_id = hashlib.sha1((commit.subject + message + diffs).encode()).hexdigest()
    if len(f"Subject: [PATCH {index}/{total}] {commit.subject}") > 100:
        raise GenerationError(f"subject too long for one header line: {commit.subject!r}")
    return (
        f"From {commit_id} Mon Sep 17 00:00:00 2001\n"
        f"From: {AUTHOR}\n"
        f"Date: {DATE}\n"
        f"Subject: [PATCH {index}/{total}] {commit.subject}\n"
        "\n"
        f"{message}"
        "---\n"
        f"{diffstat(stats)}"
        "\n"
        f"{diffs}"
        "-- \n"
        f"{SIGNATURE}\n"
        "\n"
    )


def upstream_file(sglang_src: Path, path: str) -> str:
    if not path.startswith("python/sglang/"):
        raise GenerationError(f"{path}: only python/sglang/ files are edited")
    source = sglang_src / path[len("python/sglang/") :]
    if not source.is_file():
        raise GenerationError(f"{source}: upstream file not found in --sglang-src")
    return read_text(source)


def generate(sglang_src: Path, version: str) -> dict[str, str]:
    """{file name in the series folder: content} for SGLang `version` at `sglang_src`."""
    found = installed_version(sglang_src)
    if found != version:
        raise GenerationError(
            f"--sglang-src {sglang_src} is SGLang {found or '<unknown>'}, not {version}: the "
            "series must be generated from the released sources of exactly that version"
        )
    state: dict[str, str | None] = {}  # path -> current content (None: absent upstream)
    commits = [make(version) for make in COMMITS]
    files: dict[str, str] = {}
    for index, commit in enumerate(commits, 1):
        changed: dict[str, tuple[str | None, str]] = {}
        for path, edits in commit.edits.items():
            before = state[path] if path in state else upstream_file(sglang_src, path)
            after = before
            for edit in edits:
                after = apply_edit(after, edit, path)
            if after == before:
                raise GenerationError(f"{path}: commit {commit.slug} changes nothing")
            changed[path] = (before, after)
        for path, make_content in commit.new_files.items():
            if path in state or path in changed:
                raise GenerationError(f"{path}: added twice")
            content = make_content()
            compile(content, path, "exec")
            changed[path] = (None, content)
        for path, (_, after) in changed.items():
            if path.endswith(".py"):
                compile(after, path, "exec")
            state[path] = after
        diffs, stats = [], []
        for path in sorted(changed):
            before, after = changed[path]
            text, added, removed = file_diff(path, before, after)
            diffs.append(text)
            stats.append((path, added, removed))
        name = f"{index:04d}-{commit.slug}.patch"
        files[name] = patch_text(index, len(commits), commit, "".join(diffs), stats, version)
    files["series"] = "".join(f"{name}\n" for name in files)
    return files


def write_series(out: Path, files: dict[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for stale in list(out.glob("*.patch")) + [out / "series"]:
        if stale.name not in files and stale.exists():
            stale.unlink()
    for name, content in files.items():
        (out / name).write_text(content, encoding="utf-8")


def compare_series(out: Path, files: dict[str, str]) -> list[str]:
    """Differences between the committed series in `out` and `files` (empty: identical)."""
    problems = []
    present = {p.name for p in out.glob("*.patch")}
    if (out / "series").exists():
        present.add("series")
    for name in sorted(present - set(files)):
        problems.append(f"{out / name}: not generated (stale file)")
    for name, content in files.items():
        path = out / name
        if not path.exists():
            problems.append(f"{path}: missing")
            continue
        committed = path.read_text(encoding="utf-8")
        if committed != content:
            delta = "".join(
                list(
                    difflib.unified_diff(
                        committed.splitlines(keepends=True),
                        content.splitlines(keepends=True),
                        f"committed/{name}",
                        f"generated/{name}",
                        n=1,
                    )
                )[:40]
            )
            problems.append(f"{path}: differs from the generated series:\n{delta}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sglang-src", required=True, type=Path,
                        help="the installed `sglang` package directory of that version")
    parser.add_argument("--version", required=True, help="SGLang version, e.g. 0.5.23")
    parser.add_argument("--out", required=True, type=Path, help="series folder, patches/vX.Y.Z")
    parser.add_argument("--check", action="store_true",
                        help="do not write; fail unless --out already holds exactly this series")
    args = parser.parse_args(argv)
    try:
        files = generate(args.sglang_src.resolve(), args.version)
    except GenerationError as exc:
        print(f"make_patches: {exc}", file=sys.stderr)
        return 2
    if args.check:
        problems = compare_series(args.out, files)
        if problems:
            print("make_patches: the committed series is not what the plugin generates "
                  "(run without --check to regenerate):", file=sys.stderr)
            for problem in problems:
                print(problem, file=sys.stderr)
            return 1
        print(f"make_patches: {args.out} is up to date ({len(files) - 1} patches)")
        return 0
    write_series(args.out, files)
    print(f"make_patches: wrote {len(files) - 1} patches to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
