"""Calling the model through litellm: the one module that imports litellm's completion API.

``stream_completion`` drives ``litellm.acompletion(stream=True)`` and turns its
chunks into text deltas as they arrive plus one final ``ModelResponse`` with the
assembled tool calls and token usage. Provider errors become ``ModelAPIError``.
``LitellmModel`` is the same call behind the ``Model`` seam (``agent.model``).
(``agent.scripted`` imports litellm too: it registers the offline models as a litellm
custom provider, so tests take this same path.)

litellm is imported on first use, not with this module: ``import litellm`` costs 2.0-2.3 s
of CPU and ~150 MiB, and a service answers its health check before paying it
(``load`` imports it in a thread; ``server.app`` warms it up after SERVING).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from helix_transport._exceptions import ModelAPIError
from helix_transport.agent import scripted
from helix_transport.agent.model import ModelResponse, ToolCall, new_tool_call_id
from helix_transport.store import Usage

_litellm: ModuleType | None = None
"""litellm once imported and set up (``imported``)."""
_errors: tuple[type[Exception], ...] = (ValueError, KeyError, TypeError)
"""What a call's provider errors are raised as (with openai's base once imported)."""
_importing = threading.Lock()


def imported() -> ModuleType:
    """litellm, imported and set up on the first call (blocking: seconds of CPU)."""
    global _litellm, _errors
    if _litellm is not None:
        return _litellm
    with _importing:  # one thread sets up; Python's import lock alone would let two
        if _litellm is None:
            import litellm
            from openai import OpenAIError  # litellm's exception base

            litellm.suppress_debug_info = True
            scripted.install()
            _errors = (OpenAIError, ValueError, KeyError, TypeError)
            _litellm = litellm
    return _litellm


async def load() -> ModuleType:
    """litellm, imported in a thread the first time, so the event loop keeps serving
    (health checks, streams) meanwhile."""
    return _litellm if _litellm is not None else await asyncio.to_thread(imported)


@dataclass(frozen=True)
class LitellmModel:
    """A ``Model`` that is the litellm model called ``name`` (``openai/gpt-4o-mini``,
    ``scripted/researcher``...)."""

    name: str

    @property
    def model_name(self) -> str:
        return self.name

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]],
        on_text: Callable[[str], None],
        settings: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ModelResponse:
        """One streamed completion (``stream_completion``)."""
        return await stream_completion(
            model=self.name,
            messages=messages,
            tools=tools,
            on_text=on_text,
            settings=settings,
            metadata=metadata,
        )


@contextmanager
def _map_litellm_errors(model: str) -> Iterator[None]:
    try:
        yield
    except _errors as exc:
        # litellm raises openai-style errors for every provider; keep the first line
        # (later lines carry litellm's bug-report boilerplate, not the cause).
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelAPIError(model, detail) from exc


async def stream_completion(
    *,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    on_text: Callable[[str], None],
    settings: dict[str, Any] | None = None,
    metadata: dict[str, str] | None = None,
) -> ModelResponse:
    """Run one streamed completion, calling ``on_text`` for every text delta.

    Raises:
        ModelAPIError: the provider failed (network, auth, bad request, bad stream).
    """
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    usage = Usage()
    seen = _Seen()
    litellm = await load()
    with _map_litellm_errors(model):
        stream = await litellm.acompletion(
            model=model,
            messages=messages,
            tools=tools or None,
            stream=True,
            stream_options={"include_usage": True},
            metadata=metadata or {},
            # Our tools are plain functions, never litellm-proxy MCP tools: skip the
            # MCP gateway check, which imports mcp/starlette/uvicorn (~20 MiB, 360
            # modules) on the first tool-calling completion of every process.
            _skip_mcp_handler=True,
            **(settings or {}),
        )
        async for chunk in _aiter(stream):
            if getattr(chunk, "usage", None):
                usage = _usage(chunk.usage)
            seen.chunk(chunk)
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            if delta.content:
                text.append(delta.content)
                on_text(delta.content)
            for tc in delta.tool_calls or ():
                slot = calls.setdefault(tc.index or 0, {"id": "", "name": "", "arguments": ""})
                if tc.id:
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    slot["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
    # A provider that sends no ids gets fresh ones: child sessions are named after
    # their tool call, so `call_0` in two steps would make the second rejoin the first.
    # Made once, kept in the conversation: a resumed run re-runs the same ids.
    tool_calls = [
        ToolCall(
            id=c["id"] or new_tool_call_id(),
            name=c["name"],
            arguments_json=c["arguments"] or "{}",
        )
        for _, c in sorted(calls.items())
    ]
    return ModelResponse(
        text="".join(text),
        tool_calls=tool_calls,
        usage=usage,
        provider=seen.provider or _provider(litellm, model),
        response_model=seen.model,
        finish_reasons=tuple(seen.finish_reasons),
        cost_usd=_cost(litellm, model, usage),
    )


class _Seen:
    """What the chunks of a stream said about the call (for tracing's gen_ai.* attributes)."""

    def __init__(self) -> None:
        self.provider = ""
        self.model = ""
        self.finish_reasons: list[str] = []

    def chunk(self, chunk: Any) -> None:
        self.model = getattr(chunk, "model", None) or self.model
        hidden = getattr(chunk, "_hidden_params", None) or {}
        self.provider = hidden.get("custom_llm_provider") or self.provider
        for choice in chunk.choices or ():
            if choice.finish_reason:
                self.finish_reasons.append(str(choice.finish_reason))


def _provider(litellm: ModuleType, model: str) -> str:
    try:
        return str(litellm.get_llm_provider(model)[1])
    except Exception:  # an unknown name: tracing shows none
        return ""


def _cost(litellm: ModuleType, model: str, usage: Usage) -> float | None:
    """The call's cost from litellm's cost map (``None`` for a model it does not know)."""
    try:
        prompt, completion = litellm.cost_per_token(
            model=model,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
        )
    except Exception:  # litellm raises for models missing from its map
        return None
    return float(prompt + completion)


def _aiter(stream: Any) -> AsyncIterator[Any]:
    return stream.__aiter__()  # type: ignore[no-any-return]


def _usage(raw: Any) -> Usage:
    prompt = int(getattr(raw, "prompt_tokens", 0) or 0)
    completion = int(getattr(raw, "completion_tokens", 0) or 0)
    total = int(getattr(raw, "total_tokens", 0) or 0) or prompt + completion
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)


async def warm_up() -> None:
    """Make one scripted completion so litellm's lazy imports happen now, not mid-request.

    litellm imports about 300 modules on its first call (0.3-0.5 s CPU); a service
    calls this (after ``load``, which imports litellm itself) once it is SERVING.
    """
    model = scripted.register_script("__warmup__", lambda messages: scripted.finish())
    await stream_completion(
        model=model,
        messages=[{"role": "user", "content": "{}"}],
        tools=[{"type": "function", "function": {"name": "__finish__", "parameters": {}}}],
        on_text=lambda text: None,
    )
