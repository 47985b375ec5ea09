"""Floor 0 of the package: mechanisms every other package may use, importing none of them.

- `config_fields`: THE one coercion and unknown-key mechanism of config dataclasses.
- `mcore_internals`: every private megatron-core member we use, each wrapped once with a
  per-release check and a clear error.
- `hub`: THE one rule for reading from the Hugging Face hub without it: one line naming the
  local input to pass instead, never a traceback.
- `process_groups`: THE one process-group setup (free port, gloo/NCCL default group,
  megatron's parallel_state, a single-process group context).
"""
