"""Per-request acceptance: the SGLang hook (``hook``), the arithmetic, Prometheus, drafter health.

Only ``hook`` touches SGLang (lazily); ``acceptance``, ``acceptance_prometheus`` and
``drafter_health`` import nothing of the package. ARCHITECTURE.md lists the modules.
"""
