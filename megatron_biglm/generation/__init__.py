"""Mask-Predict generation for BiGLM: `[BOS] + prompt + N masked slots`, filled in
T iterations, with exact prefix K/V reuse, block-wise decoding and a length beam.

    from megatron_biglm.generation import MaskPredictGenerator, GenerationConfig
    outputs = MaskPredictGenerator(adapter, tokenizer).generate(["Once upon"], GenerationConfig(length=16))
    gen = MaskPredictGenerator.from_pretrained("runs/quickstart/hf")  # HF export or megatron checkpoint

`from_pretrained` loads through the one inference loader (`inference.loading.load_adapter`);
the command is `python -m megatron_biglm.cli.generate`.
"""
from .config import GenerationConfig, GenerationConfigError
from .generator import MaskPredictGenerator
from .length import LengthPredictor
from .output import CanvasStep, GenerationOutput, render_canvas

__all__ = ["CanvasStep", "GenerationConfig", "GenerationConfigError", "GenerationOutput",
           "LengthPredictor", "MaskPredictGenerator", "render_canvas"]
