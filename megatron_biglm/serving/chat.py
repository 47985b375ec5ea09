"""`/v1/chat/completions` for instruction-tuned models: one user message through the chat
template of instruction tuning, then an ordinary completion.

An instruction-tuned BiGLM saw `[BOS] user INSTRUCTION assistant TARGET end [EOS]`
(`finetune.instruct.chat_template`), and the multitask evaluation prompts it with
`user + source + assistant` (`finetune.instruct.chat_template.prompt_of`); a chat request is that
prompt, with the completion fields of the request (`max_tokens` or `max_completion_tokens`,
sampling, `n`, `stream`, BiGLM's decoding fields). The model was tuned on single
instructions, so a conversation (a system message, earlier turns) is refused with a 400
rather than flattened into a layout it never saw.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from megatron_biglm.finetune.instruct.chat_template import prompt_of

from .schema import BadRequest, CompletionRequest, DecodingFields, StrictBody


class ChatMessage(StrictBody):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str
    name: Optional[str] = None


class ChatCompletionRequest(DecodingFields):
    messages: list[ChatMessage]
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)


def chat_as_completion(req: ChatCompletionRequest, template) -> CompletionRequest:
    """The completion request of a chat request (`template`: a `ChatTemplate` or its name)."""
    if len(req.messages) != 1 or req.messages[0].role != "user":
        roles = [m.role for m in req.messages]
        raise BadRequest(f"messages must be one user message (the model was instruction-tuned on "
                         f"single instructions), got roles {roles}", "messages")
    if req.max_tokens is not None and req.max_completion_tokens is not None:
        raise BadRequest("give max_tokens or max_completion_tokens, not both", "max_tokens")
    max_tokens = req.max_completion_tokens or req.max_tokens or 16
    fields = req.model_dump(exclude={"messages", "max_tokens", "max_completion_tokens"})
    return CompletionRequest(prompt=prompt_of(req.messages[0].content, template), max_tokens=max_tokens,
                             **fields)


def as_chat_response(completion: dict) -> dict:
    """A completion response in the chat shape (each choice's text as the assistant message)."""
    choices = [{"index": c["index"], "message": {"role": "assistant", "content": c["text"]},
                "logprobs": None, "finish_reason": c["finish_reason"], "token_ids": c["token_ids"]}
               for c in completion["choices"]]
    return {**completion, "id": "chat" + completion["id"], "object": "chat.completion", "choices": choices}
