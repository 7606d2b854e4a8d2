"""The drafter as data: config, files, capture rule, key table, load plan; read without SGLang.

Imports neither SGLang nor torch at module level (``pickle_weights`` loads torch inside the
function that reads a pickle), so doctor and convert run on any machine and the server's
hooks read the same objects. ARCHITECTURE.md lists the modules and their floors.
"""
