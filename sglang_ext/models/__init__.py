"""Model classes registered with SGLang's ModelRegistry (each module ends in `EntryClass`).

The submodules are imported here, eagerly, on purpose: SGLang's registry
(``sglang/srt/models/registry.py:import_model_classes``) logs and skips a module that fails to
import, which would let SGLang fall back to its in-tree classes without a word. Importing them
from the package makes such a failure fail the import of ``sglang_ext.models`` itself, which
SGLang does not swallow (also under ``SGLANG_EXTERNAL_MODEL_PACKAGE=sglang_ext.models``).
"""

from sglang_ext.models import kimi_k25_eagle3, llama_eagle3  # noqa: F401

ARCHITECTURES = {
    cls.__name__: cls for module in (llama_eagle3, kimi_k25_eagle3) for cls in module.EntryClass
}
