"""What the plugin changes in a running server: fusion by capture, tokenizer workers, verify kernel.

ARCHITECTURE.md lists the modules and their floors.
"""
