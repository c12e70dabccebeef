"""A deterministic model served through litellm's custom-provider hook.

Tests and the offline demo use model names like ``scripted/researcher``: litellm
routes the call here, and a registered *script* (a pure function of the
conversation) decides the next turn. Because the call goes through
``litellm.acompletion(..., stream=True)`` like any real provider, the run loop
exercises exactly the code path it uses in production.

A script runs within the call, so a script that raises (a litellm exception such
as ``ServiceUnavailableError``, or any other) is a provider refusing the request, and a
turn's ``latency_s`` beyond the call's ``timeout`` is a provider too slow to answer:
litellm's ``num_retries`` and ``fallbacks`` act on both, as for a real provider.

``HELIX_SCRIPTED_DELAY_MS`` adds a delay before every streamed chunk, so a test
can kill a process in the middle of a run. ``HELIX_SCRIPTED_CALL_LOG`` names a
file that gets one line per model call (``model session_id``), so a test can
count calls across processes.

Registering a script does not import litellm (2 s of CPU): ``install`` registers the
provider and every scripted model once litellm is imported (at once, when it already is).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from helix_transport.config import Environment

PROVIDER = "scripted"


@dataclass(frozen=True, kw_only=True)
class ScriptedToolCall:
    """One tool call the scripted model makes."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    with_id: bool = True
    """False: sent without an id, as some providers do."""
    id: str | None = None
    """The id to send (default ``call_{step}_{index}``): a fixed one repeats, as some
    providers' ids do."""


@dataclass(frozen=True, kw_only=True)
class ScriptedTurn:
    """What the scripted model answers in one call: text, then tool calls."""

    text: str = ""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    latency_s: float = 0.0
    """Seconds before the first chunk, like a provider's time to first byte. A call
    whose litellm ``timeout`` is shorter waits that long and fails with litellm's
    ``Timeout``, as an HTTP client's read timeout would (retries and fallbacks apply)."""


Script = Callable[[list[dict[str, Any]]], ScriptedTurn]
"""A pure function from the conversation so far to the next turn."""

_SCRIPTS: dict[str, Script] = {}

_MODEL_INFO: dict[str, Any] = {
    "litellm_provider": PROVIDER,
    "mode": "chat",
    "max_tokens": 1_000_000,
    "max_input_tokens": 1_000_000,
    "max_output_tokens": 1_000_000,
    "input_cost_per_token": 0.0,
    "output_cost_per_token": 0.0,
    "cache_creation_input_token_cost": 0.0,
    "cache_read_input_token_cost": 0.0,
    "supports_function_calling": True,
}
"""What litellm's cost map says about every scripted model: free, tool-capable."""


def register_script(name: str, script: Script) -> str:
    """Register ``script`` and return its model name, ``scripted/<name>``."""
    _SCRIPTS[name] = script
    if "litellm" in sys.modules:  # already paid for: register now (see ``install``)
        install()
    return f"{PROVIDER}/{name}"


def finish(**output: Any) -> ScriptedTurn:
    """A turn that ends the run with ``output`` (calls the ``__finish__`` tool)."""
    return ScriptedTurn(tool_calls=(ScriptedToolCall(name="__finish__", arguments=output),))


def call(name: str, **arguments: Any) -> ScriptedToolCall:
    """A tool call, for building turns: ``ScriptedTurn(tool_calls=(call("search", q="x"),))``."""
    return ScriptedToolCall(name=name, arguments=arguments)


def user_input(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's input: the first user message parsed as JSON (``{}`` if it is not)."""
    for message in messages:
        if message.get("role") == "user":
            try:
                value = json.loads(message.get("content") or "")
            except json.JSONDecodeError:
                return {}
            return value if isinstance(value, dict) else {"input": value}
    return {}


def step_results(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """``(tool name, parsed result)`` for each tool call of the latest step, in call order."""
    results: list[tuple[str, Any]] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        content = message.get("content") or ""
        try:
            value = json.loads(content)
        except json.JSONDecodeError:
            value = content
        results.append((str(message.get("name", "")), value))
    return results[::-1]


def tool_results(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The latest step's results by tool name; for a tool called twice, the first call's.

    Use ``step_results`` when a step calls one tool several times.
    """
    results: dict[str, Any] = {}
    for name, value in step_results(messages):
        results.setdefault(name, value)
    return results


def steps_taken(messages: list[dict[str, Any]]) -> int:
    """How many model turns the conversation already holds."""
    return sum(1 for m in messages if m.get("role") == "assistant")


def _chunks(text: str) -> Iterator[str]:
    # Word-sized pieces, whitespace kept, so the deltas join back to the text.
    yield from re.findall(r"\S+\s*|\s+", text)


def _tokens(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


def _astreaming(
    self: Any, model: str, messages: list[Any], *args: Any, **kwargs: Any
) -> AsyncIterator[Any]:
    """The provider's ``astreaming`` (see ``install``)."""
    # litellm declares astreaming as a coroutine returning an iterator but only wraps
    # what it returns in its stream wrapper; only model, messages and kwargs matter here.
    # The script runs now, within the call (in litellm's worker thread), not at the
    # first chunk: a script that raises is a provider refusing the request before
    # streaming anything, which litellm's num_retries and fallbacks act on, as they
    # do for a real provider's HTTP error.
    turn = _turn(model, messages, kwargs)
    timeout = kwargs.get("timeout")
    if turn.latency_s and isinstance(timeout, int | float) and timeout < turn.latency_s:
        import litellm  # imported already: litellm is what calls this

        time.sleep(timeout)  # litellm's worker thread, as a blocked HTTP read
        raise litellm.exceptions.Timeout(
            message=f"no first byte within {timeout:g} s",
            model=model,
            llm_provider=PROVIDER,
        )
    return _stream(turn, messages)


async def _stream(turn: ScriptedTurn, messages: list[Any]) -> AsyncIterator[Any]:
    delay = Environment().scripted_delay_s()
    step = steps_taken(messages) + 1
    if turn.latency_s:
        await asyncio.sleep(turn.latency_s)
    pieces = list(_chunks(turn.text))
    for piece in pieces:
        if delay:
            await asyncio.sleep(delay)
        yield _chunk(text=piece)
    for index, tool_call in enumerate(turn.tool_calls):
        if delay:
            await asyncio.sleep(delay)
        yield _chunk(
            tool_use={
                "id": (tool_call.id or f"call_{step}_{index}") if tool_call.with_id else None,
                "type": "function",
                "function": {
                    "name": tool_call.name,
                    "arguments": json.dumps(tool_call.arguments),
                },
                "index": index,
            }
        )
    prompt = _tokens(json.dumps(messages, default=str))
    completion = _tokens(turn.text) + sum(_tokens(json.dumps(c.arguments)) for c in turn.tool_calls)
    # The usage says what the call cost, as providers that bill per call do: litellm
    # then prices the stream once instead of four times (0.77x its CPU per call).
    yield _chunk(
        finish_reason="tool_calls" if turn.tool_calls else "stop",
        usage={
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "cost": 0.0,
        },
    )


def _turn(model: str, messages: list[Any], kwargs: dict[str, Any]) -> ScriptedTurn:
    name = model.split("/", 1)[-1]
    script = _SCRIPTS.get(name)
    if script is None:
        known = ", ".join(sorted(_SCRIPTS)) or "none"
        raise ValueError(f"no scripted model named {name!r} (registered: {known})")
    log = Environment().scripted_call_log()
    if log:
        metadata = (kwargs.get("litellm_params") or {}).get("metadata") or {}
        with open(log, "a") as f:  # tiny append; a test-only path
            f.write(f"{name} {metadata.get('session_id', '')}\n")
    return script(list(messages))


def _chunk(
    *,
    text: str = "",
    tool_use: dict[str, Any] | None = None,
    finish_reason: str = "",
    usage: dict[str, float] | None = None,
) -> dict[str, Any]:
    return {
        "text": text,
        "tool_use": tool_use,
        "is_finished": bool(finish_reason),
        "finish_reason": finish_reason,
        "usage": usage,
        "index": 0,
    }


_handler: list[Any] = []
"""The provider registered with litellm (made by the first ``install``)."""


def install() -> None:
    """Register the ``scripted`` provider and every scripted model with litellm, importing
    it (idempotent: models registered since are added)."""
    import litellm
    from litellm.llms.custom_llm import CustomLLM

    if not _handler:

        class ScriptedLLM(CustomLLM):
            """The litellm custom provider that plays registered scripts."""

            astreaming = _astreaming  # type: ignore[assignment]

        _handler.append(ScriptedLLM())
    if not any(item.get("provider") == PROVIDER for item in litellm.custom_provider_map):
        litellm.custom_provider_map.append({"provider": PROVIDER, "custom_handler": _handler[0]})
    for name in list(_SCRIPTS):  # a copy: another thread may register meanwhile
        model = f"{PROVIDER}/{name}"
        if model not in litellm.model_cost:
            # Known to litellm's cost map (free), so every call's two cost lookups hit it
            # directly instead of falling back through litellm's generalisation regexes.
            litellm.register_model({model: _MODEL_INFO})
