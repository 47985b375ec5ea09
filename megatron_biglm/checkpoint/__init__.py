"""Checkpoints on disk (floor 1): below training, export, evaluation and inference.

    dirs.py            atomic directories: temp dir, manifest, rename, `latest`, where a run starts
    files.py           the files every backend writes the same way (RNG, train state, signature,
                       config.yaml) and the collective that seals a checkpoint
    rng.py             every random stream, saved and restored as one
    signature.py       the model-shape signature and the refusal of a checkpoint of another model
    megatron_io.py     the megatron backend's dist_checkpointing save/load
    run_checkpoint.py  find and read a complete checkpoint (plain data; config/ rebuilds its configs)
    weights_only.py    load only a checkpoint's model weights into a built model chunk
    dist_reader.py     read a torch_dist checkpoint's tensors slice by slice, without a model
    checksums.py       CRC-check a torch_dist checkpoint's stored bytes
    verify.py          the one verifier every load runs first (sizes + every item's CRC-32), with
                       the previous checkpoint named in its refusal

It imports only common/, patches/ and third-party packages: the run config and model config
arrive as plain data or duck-typed objects (anything with `to_yaml()`, a model config with
`to_dict()` and `padded_vocab_size`), so every floor above can use it.
"""
