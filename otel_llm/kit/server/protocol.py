"""Request bodies of the OpenAI-compatible API, and the JSON shapes of its answers.

Only what the reference engine can honour is accepted: one prompt, one choice, ``max_tokens``, and stop
strings of a single byte (the engine stops on token ids, and a token is a byte). Sampling knobs the
engine has no use for (``temperature``, ``top_p``, ``user``, ...) are accepted and ignored, as most
OpenAI-compatible servers do, so stock clients work; a value the engine cannot serve is a 400.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

DEFAULT_MAX_TOKENS = 16  # as in OpenAI's completions API


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: StrictStr | list[StrictStr] | None = None
    n: StrictInt = Field(default=1, ge=1, le=1)  # one choice per request; ask again for more

    @field_validator("stop")
    @classmethod
    def _single_byte_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        for s in [value] if isinstance(value, str) else value or []:
            if len(s.encode("utf-8")) != 1:
                raise ValueError(
                    f"stop sequence {s!r} is not one byte; the reference engine stops on single tokens"
                )
        return value

    def stop_token_ids(self) -> list[int]:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [s.encode("utf-8")[0] for s in stops]

    def output_limit(self) -> int:
        return self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Common):
    """``POST /v1/completions``: ``prompt`` is a string or a list of token ids (bytes here)."""

    prompt: StrictStr | list[StrictInt]

    @field_validator("prompt")
    @classmethod
    def _token_range(cls, value: str | list[int]) -> str | list[int]:
        if isinstance(value, list) and any(not 0 <= t < 256 for t in value):
            raise ValueError("token ids must be in 0..255 (the engine's byte-level vocabulary)")
        return value

    def engine_prompt(self) -> str | list[int]:
        return self.prompt


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``; ``max_completion_tokens`` (the newer name) wins over ``max_tokens``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)

    def output_limit(self) -> int:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return super().output_limit()

    def engine_prompt(self) -> str:
        # A plain-text chat template: the reference model has random weights, so any template will do;
        # what matters is that the prompt's length (and so its prefill) grows with the conversation.
        lines = [f"{m.role}: {m.text()}" for m in self.messages]
        return "\n".join([*lines, "assistant:"])


# --- answers ------------------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion(
    rid: str, model: str, text: str, reason: str | None, chat: bool, use: dict[str, int] | None
) -> dict[str, Any]:
    """A whole answer (``text_completion`` or ``chat.completion``)."""
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        choice = {"index": 0, "text": text}
    choice.update(logprobs=None, finish_reason=reason)
    body = _envelope(rid, model, "chat.completion" if chat else "text_completion", [choice])
    body["usage"] = use
    return body


def chunk(
    rid: str, model: str, text: str | None, reason: str | None, chat: bool, first: bool = False
) -> dict[str, Any]:
    """One streamed piece; ``text=None`` with a ``reason`` is the closing chunk."""
    if chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta}
    else:
        choice = {"index": 0, "text": text or ""}
    choice.update(logprobs=None, finish_reason=reason)
    return _envelope(rid, model, "chat.completion.chunk" if chat else "text_completion", [choice])


def usage_chunk(rid: str, model: str, chat: bool, use: dict[str, int]) -> dict[str, Any]:
    """The extra last chunk of ``stream_options.include_usage``: no choices, only usage."""
    body = _envelope(rid, model, "chat.completion.chunk" if chat else "text_completion", [])
    body["usage"] = use
    return body


def model_list(model: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "otel-llm"}],
    }


def _envelope(rid: str, model: str, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": choices}
