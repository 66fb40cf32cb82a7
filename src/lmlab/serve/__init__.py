"""`lmlab serve`: an OpenAI-compatible HTTP server for any lmlab model, with lmlab's decoders as a request option.

- `lmlab.serve.scheduler`: the continuous-batching scheduler (requests join the engine's batched decode between
  steps, leave it when they finish or their client goes away).
- `lmlab.serve.strategies`: the lmlab decoding strategies a request may ask for (``"lmlab": {"strategy": ...}``).
- `lmlab.serve.app`: the FastAPI application (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``,
  ``/health``), OpenAI-style JSON errors, server-sent events for ``stream: true``.

Nothing here is imported by `lmlab list`; FastAPI loads only when a server is built.
"""
