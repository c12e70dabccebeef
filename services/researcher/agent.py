"""The researcher agent: searches a small notes corpus on a topic and reports findings.

Offline, the scripted model plays three turns: search the notes for the topic, fetch
the best hits concurrently (several tool calls in one step), then finish with one
finding per note read. ``HELIX_MODEL`` switches to a real model, which gets the same
tools and the system prompt below.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from helix_transport import Agent, ToolContext, tool
from helix_transport.agent.scripted import ScriptedTurn, call, register_script, user_input
from helix_transport.agent.tools import FINISH_TOOL


class ResearchInput(BaseModel):
    """What to research."""

    topic: str = Field(min_length=1, description="The topic to research.")
    max_sources: int = Field(default=3, ge=1, le=10, description="Most notes to read.")


class ResearchOutput(BaseModel):
    """What the research found."""

    topic: str = Field(description="The topic researched.")
    findings: list[str] = Field(description="One finding per note read, in relevance order.")
    sources: list[str] = Field(description="Ids of the notes the findings come from.")


@dataclass(frozen=True, kw_only=True)
class Note:
    """One note of the built-in corpus."""

    title: str
    text: str


NOTES: dict[str, Note] = {
    "grpc-streaming": Note(
        title="gRPC server streaming",
        text="A gRPC server-streaming call sends one request and receives a stream of "
        "responses; the server ends the stream with a status once it has sent the last one.",
    ),
    "grpc-status": Note(
        title="gRPC status codes",
        text="gRPC reports failures as status codes: INVALID_ARGUMENT for a bad request, "
        "NOT_FOUND for a missing resource and UNAVAILABLE for a transient outage worth retrying.",
    ),
    "event-sourcing": Note(
        title="Event sourcing",
        text="Event sourcing stores every change as an event in an append-only log, so current "
        "state is rebuilt by replaying the events in sequence order.",
    ),
    "event-log-replay": Note(
        title="Replaying an event log",
        text="A reader that remembers the last sequence it saw can resume a replay from that "
        "sequence and receive every later event exactly once, with no gap.",
    ),
    "redis-streams": Note(
        title="Redis streams",
        text="Redis streams are append-only logs with monotonically increasing ids; INCR and Lua "
        "scripts let a writer assign gapless per-key sequence numbers atomically.",
    ),
    "postgres-transactions": Note(
        title="PostgreSQL transactions",
        text="A PostgreSQL transaction with a unique (session_id, sequence) constraint makes "
        "concurrent appends to the same log fail instead of silently interleaving.",
    ),
    "asyncio-taskgroup": Note(
        title="asyncio TaskGroup",
        text="asyncio.TaskGroup runs tasks concurrently and cancels the rest when one fails, "
        "so no task outlives the block that started it.",
    ),
    "llm-tool-calling": Note(
        title="LLM tool calling",
        text="A language model calls tools by emitting structured tool calls; the caller runs "
        "them, possibly several at once, and sends the results back as tool messages.",
    ),
    "checkpointing": Note(
        title="Checkpointing agent runs",
        text="Checkpointing an agent run after every step lets a restarted process resume "
        "from the last completed step instead of starting over.",
    ),
    "backoff": Note(
        title="Exponential backoff",
        text="Exponential backoff with jitter spaces out retries of a failing call so that "
        "many clients reconnecting at once do not overwhelm a recovering server.",
    ),
}
"""The corpus ``search_notes`` and ``fetch_note`` read: note id -> note."""

_STOPWORD_TEXT = (
    "an and are as at be by for from how in is it of on or so that the their then this to "
    "what when which why with"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def _terms(text: str) -> set[str]:
    """Lower-cased words worth matching on (no stopwords, no one-letter words)."""
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 1} - _STOPWORDS


def search(query: str, *, limit: int) -> list[dict[str, Any]]:
    """Notes sharing terms with ``query``: best first, ties broken by id."""
    wanted = _terms(query)
    scored = [
        (len(wanted & _terms(f"{note_id} {note.title} {note.text}")), note_id)
        for note_id, note in NOTES.items()
    ]
    ranked = sorted((item for item in scored if item[0] > 0), key=lambda s: (-s[0], s[1]))
    return [
        {"id": note_id, "title": NOTES[note_id].title, "score": score}
        for score, note_id in ranked[:limit]
    ]


class NoteNotFound(LookupError):
    """``fetch_note`` was asked for an id the corpus does not have."""

    def __init__(self, note_id: str) -> None:
        super().__init__(
            f"no note with id {note_id!r}; use an id returned by search_notes "
            f"(known ids: {', '.join(sorted(NOTES))})"
        )


class SearchNotesArgs(BaseModel):
    """Arguments of ``search_notes``."""

    query: str = Field(min_length=1, description="Keywords to look for.")
    limit: int = Field(default=5, ge=1, le=10, description="Most notes to return.")


class FetchNoteArgs(BaseModel):
    """Arguments of ``fetch_note``."""

    note_id: str = Field(description="A note id returned by search_notes.")


@tool
async def search_notes(ctx: ToolContext, args: SearchNotesArgs) -> dict[str, Any]:
    """Search the notes by keyword. Returns matching notes (id, title, score), best first."""
    return {"query": args.query, "hits": search(args.query, limit=args.limit)}


@tool
async def fetch_note(ctx: ToolContext, args: FetchNoteArgs) -> dict[str, Any]:
    """Read one note in full, by the id search_notes returned."""
    note = NOTES.get(args.note_id)
    if note is None:
        raise NoteNotFound(args.note_id)
    return {"id": args.note_id, "title": note.title, "text": note.text}


SYSTEM_PROMPT = """\
You are a careful researcher. The user message is JSON: {"topic": ..., "max_sources": ...}.

1. Call `search_notes` with keywords for the topic.
2. Call `fetch_note` for the most relevant hits, at most `max_sources` of them. Fetch them \
all in one turn: several tool calls at once.
3. Finish with `topic` (the topic as given), `findings` (one finding per note you read, \
in relevance order, each stated as "<note title>: <what the note says>") and `sources` (the \
ids of those notes, in the same order).

Use only what the notes say; never invent a source. If a fetch fails, leave that note out. \
If nothing matches, finish with empty `findings` and `sources`."""


def _tool_results(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Every tool result in the conversation, in order, as ``(tool name, parsed JSON)``.

    Unlike ``scripted.tool_results`` this keeps several results of the same tool
    (the concurrent ``fetch_note`` calls of one step).
    """
    results: list[tuple[str, Any]] = []
    for message in messages:
        if message.get("role") != "tool":
            continue
        content = message.get("content") or ""
        try:
            value = json.loads(content)
        except json.JSONDecodeError:
            value = {"error": content}
        results.append((str(message.get("name", "")), value))
    return results


def _is_error(value: Any) -> bool:
    return not isinstance(value, dict) or "error" in value


def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    """search -> fetch the top hits concurrently -> finish, decided from the conversation."""
    request = ResearchInput.model_validate(user_input(messages))
    results = _tool_results(messages)
    searches = [value for name, value in results if name == "search_notes"]
    if not searches:
        return ScriptedTurn(
            text=f"Searching my notes for {request.topic!r}. ",
            tool_calls=(call("search_notes", query=request.topic, limit=request.max_sources),),
        )
    hits = [] if _is_error(searches[-1]) else list(searches[-1].get("hits") or [])
    ids = [str(hit["id"]) for hit in hits if isinstance(hit, dict) and "id" in hit]
    ids = ids[: request.max_sources]
    if ids and not any(name == "fetch_note" for name, _ in results):
        return ScriptedTurn(
            text=f"Found {len(hits)} matching note(s); reading {', '.join(ids)}. ",
            tool_calls=tuple(call("fetch_note", note_id=note_id) for note_id in ids),
        )
    notes = [v for name, v in results if name == "fetch_note" and not _is_error(v)]
    output = ResearchOutput(
        topic=request.topic,
        findings=[f"{note['title']}: {note['text']}" for note in notes],
        sources=[str(note["id"]) for note in notes],
    )
    text = (
        f"Writing up {len(notes)} finding(s) on {request.topic!r}. "
        if notes
        else f"My notes have nothing on {request.topic!r}. "
    )
    return ScriptedTurn(text=text, tool_calls=(call(FINISH_TOOL, **output.model_dump()),))


agent = Agent(
    name="researcher",
    description="Researches a topic in a notes corpus and reports findings with their sources.",
    input_model=ResearchInput,
    output_model=ResearchOutput,
    system_prompt=SYSTEM_PROMPT,
    tools=[search_notes, fetch_note],
    model=register_script("researcher", script),
    max_steps=6,
)
