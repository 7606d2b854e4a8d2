"""sglang_ext: EAGLE-3 speculative decoding in SGLang with speculators-trained drafters.

This package root imports nothing from SGLang or torch so that the CLI (doctor, convert,
bench) works on machines without a GPU, and so that SGLang's plugin loader can import the
entry point cheaply.
"""

__version__ = "0.1.0"
