"""SGLang's HTTP app, for its tokenizer worker processes, with SGLang's plugins loaded first.

uvicorn/Granian import this module by path in each worker (``SGLANG_HTTP_SERVER_APP_PATH``,
set by ``sglang_ext.serving.tokenizer_workers``); SGLang itself loads no plugins there. The app
served is SGLang's own object: its lifespan builds the worker's TokenizerManager as usual.
"""

from sglang.srt.plugins import load_plugins

load_plugins()

from sglang.srt.entrypoints.http_server import app  # noqa: E402

__all__ = ["app"]
