"""SGLang plugin entry point (group ``sglang.srt.plugins``, name ``sglang_ext``).

SGLang calls :func:`register` in every process it starts (``sglang/srt/plugins/__init__.py:
load_plugins``: the launcher before it parses server args, the scheduler that builds the
models, the detokenizer). It registers:

- the drafter classes of ``sglang_ext.models`` over SGLang's in-tree ones;
- an AROUND hook on SGLang's ``get_config`` that reads speculators-format drafter directories
  (no ``model_type``) as data and returns the translated config;
- an AROUND hook on ``configure_aux_hidden_state_capture`` that lets the target's own
  ``set_eagle3_layers_to_capture`` switch capture on, then sets the layers the drafter was
  trained on where the class keeps them and reads them back, before serving
  (``sglang_ext.serving.fusion.apply_capture``);
- an AROUND hook on ``ModelConfig._derive_context_length`` that serves an EAGLE-3 drafter whose
  context length is below the target's on purpose, with one WARNING
  (``sglang_ext.drafter.context_length``), where stock SGLang raises a ValueError;
- the acceptance metrics hooks (``sglang_ext.metrics.hook``), also in SGLang's tokenizer worker
  processes (``--tokenizer-worker-num > 1``: ``sglang_ext.serving.tokenizer_workers``);
- opt-in (``SGLANG_EXT_SPLITKV_VERIFY=1``): SGLang's split-KV verify attention on CUDA
  (``sglang_ext.serving.verify_splitkv``);
- opt-out, for diagnosis (``SGLANG_EXT_MOE_PDL=0``): SGLang's Triton fused MoE without
  programmatic dependent launch (``sglang_ext.serving.moe_pdl``);
- opt-in (``SGLANG_EXT_MOE_SHARED_STREAM=0``): SGLang's DeepSeek MoE layers run their shared
  expert on the main stream instead of a second one (``sglang_ext.serving.moe_shared_stream``).

``load_plugins`` logs and swallows exceptions from plugins, which would silently leave SGLang
on its in-tree classes. A failure here therefore raises ``SystemExit`` (not an ``Exception``),
which ends the launch with the reason. ``SGLANG_PLUGINS`` (a comma-separated allow-list of
entry-point names) can still exclude this plugin deliberately.

This module imports only the standard library at import time so the entry point always loads.
"""

from __future__ import annotations

import copy
import inspect
import logging
import os
import pkgutil
from functools import lru_cache

logger = logging.getLogger(__name__)

PLUGIN_NAME = "sglang_ext"
MODELS_PACKAGE = "sglang_ext.models"
CAPTURE_TARGET = (
    "sglang.srt.model_executor.model_runner_components.attention_backend_setup."
    "configure_aux_hidden_state_capture"
)
CONTEXT_TARGET = "sglang.srt.configs.model_config.ModelConfig._derive_context_length"


def register() -> None:
    try:
        targets = _register()
    except BaseException as exc:  # noqa: BLE001 - turned into a loud, non-swallowable exit
        if isinstance(exc, SystemExit):
            raise
        raise SystemExit(
            f"sglang_ext: the plugin failed to load, refusing to let SGLang fall back to its "
            f"in-tree EAGLE-3 classes: {type(exc).__name__}: {exc}\n(To run stock SGLang on "
            f"purpose, exclude the plugin: SGLANG_PLUGINS=<other plugins> or uninstall "
            f"sglang-ext.)"
        ) from exc
    logger.info("sglang_ext: registered models and hooks on %s", ", ".join(targets))


def _register() -> list[str]:
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_ext.metrics import hook as metrics
    from sglang_ext.serving import moe_pdl, moe_shared_stream, tokenizer_workers, verify_splitkv

    ModelRegistry.register(MODELS_PACKAGE, overwrite=True, strict=True)
    targets = [config_hook_target(), CAPTURE_TARGET, CONTEXT_TARGET]
    for target in targets:
        pkgutil.resolve_name(target)  # a moved target fails the launch here, not silently
    HookRegistry.register(targets[0], get_config_hook, HookType.AROUND)
    HookRegistry.register(CAPTURE_TARGET, configure_capture_hook, HookType.AROUND)
    HookRegistry.register(CONTEXT_TARGET, derive_context_length_hook, HookType.AROUND)
    if os.environ.get("SGLANG_EXT_METRICS", "1") != "0":
        targets.extend(metrics.install())
    targets.extend(tokenizer_workers.install())
    targets.extend(verify_splitkv.install())
    targets.extend(moe_pdl.install())
    targets.extend(moe_shared_stream.install())
    return targets


def config_hook_target() -> str:
    """Where SGLang defines `get_config` (re-exported by hf_transformers_utils in both 0.5.17
    and 0.5.23); HookRegistry propagates the patch to every module that imported it."""
    from sglang.srt.utils import hf_transformers_utils

    func = inspect.unwrap(hf_transformers_utils.get_config)
    return f"{func.__module__}.{func.__qualname__}"


# --------------------------------------------------------------------------------------------
# get_config: speculators directories are read as data, never through AutoConfig


@lru_cache(maxsize=16)
def _translated(path: str, mtime: float):
    from sglang_ext.drafter.checkpoint_files import read_checkpoint
    from sglang_ext.drafter.loading import plan_from_checkpoint
    from sglang_ext.drafter.speculators_format import load_drafter_spec, to_sglang_config

    spec = load_drafter_spec(path)  # spec.source: the local directory (Hub ids resolved)
    # The whole load report, from safetensors headers, before any GPU work: a missing or
    # mis-shaped tensor, a truncated file or a pickle-only drafter fails the launch here.
    plan_from_checkpoint(spec, read_checkpoint(spec.source)).raise_for_errors()
    return to_sglang_config(spec)


def get_config_hook(original, model, *args, **kwargs):
    from sglang_ext.drafter.model_paths import config_path
    from sglang_ext.drafter.speculators_format import is_speculators_dir

    if isinstance(model, (str, os.PathLike)) and is_speculators_dir(model):
        config = _translated(str(model), config_path(model).stat().st_mtime)
        overrides = kwargs.get("model_override_args") or {}
        if overrides:  # never mutate the cached translation
            config = copy.deepcopy(config)
            for key, value in overrides.items():
                setattr(config, key, value)
        return config
    config = original(model, *args, **kwargs)
    _read_alias_as_sglang_name(config, model)
    return config


def _read_alias_as_sglang_name(config, model) -> None:
    """Another project's name for SGLang's EAGLE-3 layout (architecture_aliases.ALIASES) is
    read as SGLang's, so its registry builds our class, whose load plan checks the keys."""
    from sglang_ext.drafter import architecture_aliases

    archs = list(getattr(config, "architectures", None) or [])
    note = architecture_aliases.alias_note(archs[0]) if archs else None
    if note is None:
        return
    archs[0] = architecture_aliases.canonical(archs[0])
    config.architectures = archs
    logger.info("sglang_ext: %s: %s", model, note)


# --------------------------------------------------------------------------------------------
# ModelConfig._derive_context_length: a drafter shorter than the target is served on purpose


_CONTEXT_WARNED: set[str] = set()


def derive_context_length_hook(original, self, context_length, *args, **kwargs):
    """For our EAGLE-3 drafters built at the target's context (SGLang passes the target's
    context_len to the draft ModelConfig), do what SGLang does under
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (raise the draft's context_len and its
    max_position_embeddings, which sizes its rotary cache), with one WARNING naming both
    lengths, the drafter's file and field (sglang_ext.drafter.context_length). Everything else goes
    through SGLang's own check unchanged."""
    from sglang.srt.configs import model_config

    from sglang_ext.drafter import context_length as ctx
    from sglang_ext.models import ARCHITECTURES

    archs = list(getattr(self.hf_config, "architectures", None) or [])
    if not (
        getattr(self, "is_draft_model", False)
        and context_length is not None
        and archs
        and archs[0] in ARCHITECTURES
    ):
        return original(self, context_length, *args, **kwargs)
    text_config = self.hf_text_config
    derived = model_config.get_context_length(text_config)  # SGLang's own number decides
    if context_length <= derived:
        return original(self, context_length, *args, **kwargs)
    result = original(self, None, *args, **kwargs)  # derives the drafter's own length
    message = ctx.context_warning(
        derived,
        drafter_config_file(self.model_path),
        drafter_context_field(self.model_path),
        context_length,
    )
    if message not in _CONTEXT_WARNED:  # SGLang builds the draft config more than once
        _CONTEXT_WARNED.add(message)
        logger.warning("sglang_ext: %s", message)
    self.context_len = context_length
    text_config.max_position_embeddings = context_length
    self.hf_config.context_len = context_length
    return result


def drafter_context_field(path) -> str | None:
    """The field doctor names (sglang_ext.drafter.context_length.drafter_context), read the
    same way."""
    from sglang_ext.drafter import context_length as ctx
    from sglang_ext.drafter.config_fields import DrafterConfigError
    from sglang_ext.drafter.speculators_format import load_drafter_spec, served_config_dict

    try:
        spec = load_drafter_spec(path)
        return ctx.drafter_context(served_config_dict(spec), spec.format == "speculators")[1]
    except (DrafterConfigError, ctx.ContextLengthError):
        return None


def drafter_config_file(path) -> str:
    from sglang_ext.drafter.config_fields import DrafterConfigError
    from sglang_ext.drafter.model_paths import config_path

    try:
        return str(config_path(path))
    except DrafterConfigError:
        return f"{path}/config.json"


# --------------------------------------------------------------------------------------------
# configure_aux_hidden_state_capture: the target captures what the drafter was trained on


def current_drafter_spec():
    """The drafter this server speculates with; None when aux states are captured without one
    (--enable-return-aux-hidden-states). Unknown server args are an error: passing the ids
    through unconverted would capture the wrong layers without a word."""
    from sglang_ext import compat
    from sglang_ext.drafter.speculators_format import load_drafter_spec

    args = compat.server_args()
    if args is None:
        raise RuntimeError(
            "sglang_ext: the target is asked to capture EAGLE-3 aux hidden states, but this "
            "process has no published server args, so the drafter (and its aux-id convention) "
            "is unknown; refusing to guess the layers"
        )
    path = getattr(args, "speculative_draft_model_path", None)
    return load_drafter_spec(path) if path else None


def configure_capture_hook(original, *args, **kwargs):
    from sglang_ext.serving import fusion

    bound = inspect.signature(original).bind(*args, **kwargs)
    arguments = bound.arguments
    spec = current_drafter_spec() if arguments.get("eagle_use_aux_hidden_state") else None
    model = arguments.get("model")
    pp_group = getattr(model, "pp_group", None)
    if spec is None or (pp_group is not None and not pp_group.is_last_rank):
        return original(*bound.args, **bound.kwargs)
    target = fusion.target_info_from_model(model)
    plan = fusion.plan_capture(spec, target)
    if plan.sglang_ids is not None:
        arguments["eagle_aux_hidden_state_layer_ids"] = list(plan.sglang_ids)
    result = original(*bound.args, **bound.kwargs)
    captured = fusion.apply_capture(model, plan)
    logger.info(
        "sglang_ext: target %s captures aux layers %s for drafter %s (set and read back after "
        "its set_eagle3_layers_to_capture(%s))",
        target.architecture,
        captured,
        spec.source,
        arguments["eagle_aux_hidden_state_layer_ids"],
    )
    return result


# --------------------------------------------------------------------------------------------


def self_check() -> dict:
    """Resolve the entry point and the registered classes as SGLang would; raise on failure.

    Importing SGLang's model registry imports every in-tree model module (~100, most of a
    20 s check on a CPU machine). A check in a fresh process defers them the way SGLang does
    for SGLANG_EXTERNAL_MODEL_PACKAGE, so the registry holds the plugin's classes only; the
    in-tree classes they replace by name are not imported (`in_tree_models_imported`). A
    registry that cannot defer (0.5.17's imports every in-tree model as it is imported) is
    reported as having imported them."""
    import sys
    from importlib.metadata import entry_points

    fresh = "sglang.srt.models.registry" not in sys.modules
    deferred = False
    if fresh:
        saved = os.environ.get("SGLANG_EXTERNAL_MODEL_PACKAGE")
        os.environ["SGLANG_EXTERNAL_MODEL_PACKAGE"] = MODELS_PACKAGE
        try:
            from sglang.srt.models.registry import ModelRegistry
        finally:
            if saved is None:
                del os.environ["SGLANG_EXTERNAL_MODEL_PACKAGE"]
            else:
                os.environ["SGLANG_EXTERNAL_MODEL_PACKAGE"] = saved
        deferred = getattr(ModelRegistry, "_default_models_loaded", True) is False
        # register() would load the deferred in-tree models first: what this check skips.
        ModelRegistry._default_models_loaded = True
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_ext import compat
    from sglang_ext.models import ARCHITECTURES

    eps = {ep.name: ep for ep in entry_points(group="sglang.srt.plugins")}
    entry = eps.get(PLUGIN_NAME)
    if entry is None or entry.value != "sglang_ext.plugin:register":
        raise RuntimeError(
            f"entry point {PLUGIN_NAME} not found in sglang.srt.plugins (found: "
            f"{sorted(eps) or 'none'}); reinstall sglang-ext"
        )
    entry.load()()
    HookRegistry.apply_hooks()
    resolved = {}
    for arch in ARCHITECTURES:
        cls, _ = ModelRegistry.resolve_model_cls([arch])
        resolved[arch] = f"{cls.__module__}.{cls.__qualname__}"
        if not cls.__module__.startswith("sglang_ext."):
            raise RuntimeError(f"ModelRegistry resolves {arch} to {resolved[arch]}, not sglang_ext")
    return {
        "plugin_loaded": True,
        "entry_points": {PLUGIN_NAME: entry.value},
        # Other packages' plugins in the same group: SGLang loads them too; not checked here.
        "other_packages_plugins": sorted(name for name in eps if name != PLUGIN_NAME),
        "architectures": resolved,
        "hooks": [config_hook_target(), CAPTURE_TARGET, CONTEXT_TARGET],
        "in_tree_models_imported": not deferred,
        "sglang_version": compat.sglang_version(),
    }
