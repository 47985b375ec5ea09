"""Serving a trained BiGLM over HTTP: an OpenAI-compatible app (`app.py`), the scheduler that
batches requests at block boundaries (`scheduler.py`) over a `BlockDecoder` (`block_decoder.py`:
today's adapters with the exact prefix cache), prompt scoring (`scoring.py`) and the metrics.
The command is `cli/serve.py` (`biglm-serve`)."""
