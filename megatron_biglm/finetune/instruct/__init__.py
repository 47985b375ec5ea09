"""Instruction tuning (encoder instruction-tuning spec §3.1): chat template, FLAN/xP3 rows with the seed's
filters, the tokenized dataset; the kind that trains on it is `finetune/kinds/instruct.py`.

| concept | module |
|---|---|
| `ChatTemplate`, `TemplateEncoder` (a role per token; prompts with `<mask>` slots) | `chat_template` |
| FLAN/xP3 and instruction/input/output rows; language and target-length filters | `rows` |
| `InstructionData` (.npy) and `InstructionSamples` (masked, by global sample) | `dataset` |

The commands are `python -m megatron_biglm.cli.instruct_data build` and `cli.instruct_tune`.
"""
from .chat_template import TEMPLATES, ChatTemplate, Encoded, TemplateEncoder, get_template
from .dataset import InstructionData, InstructionSamples, build_instruction_data
from .rows import InstructionReport, read_instruction_rows

__all__ = ["TEMPLATES", "ChatTemplate", "Encoded", "InstructionData", "InstructionReport", "InstructionSamples",
           "TemplateEncoder", "build_instruction_data", "get_template", "read_instruction_rows"]
