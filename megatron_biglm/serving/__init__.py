"""Serving a trained BiGLM over HTTP (`biglm-serve`, `cli/serve.py`): the OpenAI-compatible app
(`app.py`, request bodies in `schema.py`), completions (`completions.py`) and chat
(`chat.py`) decoded by the scheduler that batches requests at block boundaries
(`scheduler.py`) over a `BlockDecoder` (`block_decoder.py`: today's adapters with the exact
prefix cache), prompt scoring under a named rule (`scoring.py`), embeddings as the export
embeds (`embeddings.py`), Prometheus metrics (`metrics.py`), and the server as a child process
for whoever drives it from outside (`process.py`)."""
