"""The summarizer agent: condenses a text into its leading sentences and key points.

Offline, the scripted model calls ``count_words`` and ``split_sentences`` concurrently,
then finishes with the first ``max_sentences`` sentences as the summary. ``HELIX_MODEL``
switches to a real model, which gets the same tools and the system prompt below.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, Field

from helix_transport import Agent, ToolContext, tool
from helix_transport.agent.scripted import ScriptedTurn, call, register_script, user_input
from helix_transport.agent.tools import FINISH_TOOL


class SummarizeInput(BaseModel):
    """The text to summarize."""

    text: str = Field(min_length=1, description="The text to summarize.")
    max_sentences: int = Field(
        default=3, ge=1, le=10, description="Most sentences the summary may have."
    )


class Summary(BaseModel):
    """A summary of a text."""

    summary: str = Field(description="At most max_sentences sentences.")
    key_points: list[str] = Field(description="The summary's points, one per sentence.")
    word_count: int = Field(ge=0, description="Words in the original text.")


_WORD = re.compile(r"\S*[^\W_]\S*")
"""A whitespace-separated token with at least one letter or digit (a lone dash is no word)."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def count_words_in(text: str) -> int:
    """Words in ``text``: whitespace-separated tokens holding a letter or digit."""
    return len(_WORD.findall(text))


def sentences_of(text: str) -> list[str]:
    """``text`` split after ``.``, ``!`` or ``?`` followed by whitespace; whitespace collapsed."""
    flat = " ".join(text.split())
    return [s for s in _SENTENCE_END.split(flat) if s]


class TextArgs(BaseModel):
    """Arguments of the text tools."""

    text: str = Field(description="The text to work on.")


@tool
async def count_words(ctx: ToolContext, args: TextArgs) -> dict[str, int]:
    """Count the words in a text."""
    return {"word_count": count_words_in(args.text)}


@tool
async def split_sentences(ctx: ToolContext, args: TextArgs) -> dict[str, list[str]]:
    """Split a text into sentences, in order."""
    return {"sentences": sentences_of(args.text)}


SYSTEM_PROMPT = """\
You summarize texts. The user message is JSON: {"text": ..., "max_sentences": ...}.

Call `count_words` and `split_sentences` on the text (both in one turn). Then finish with:
- `summary`: at most `max_sentences` sentences capturing the text's main point, taken or \
condensed from its sentences; add nothing the text does not say;
- `key_points`: the summary's points, one short phrase per sentence;
- `word_count`: exactly the number `count_words` returned for the original text."""


def _latest_results(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The latest result of each tool in the conversation, by tool name."""
    results: dict[str, Any] = {}
    for message in messages:
        if message.get("role") == "tool":
            try:
                results[str(message.get("name", ""))] = json.loads(message.get("content") or "")
            except json.JSONDecodeError:
                results[str(message.get("name", ""))] = {"error": message.get("content")}
    return results


def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    """Both tools at once, then a summary of the first ``max_sentences`` sentences."""
    request = SummarizeInput.model_validate(user_input(messages))
    results = _latest_results(messages)
    if "count_words" not in results and "split_sentences" not in results:
        return ScriptedTurn(
            text="Counting the words and splitting the text into sentences. ",
            tool_calls=(
                call("count_words", text=request.text),
                call("split_sentences", text=request.text),
            ),
        )
    counted = results.get("count_words")
    split = results.get("split_sentences")
    # A failed tool is not fatal: finish with the same computation done here.
    word_count = (
        counted["word_count"]
        if isinstance(counted, dict) and isinstance(counted.get("word_count"), int)
        else count_words_in(request.text)
    )
    sentences = (
        [str(s) for s in split["sentences"]]
        if isinstance(split, dict) and isinstance(split.get("sentences"), list)
        else sentences_of(request.text)
    )
    chosen = sentences[: request.max_sentences]
    output = Summary(
        summary=" ".join(chosen),
        key_points=[s.rstrip(".!?") for s in chosen],
        word_count=word_count,
    )
    return ScriptedTurn(
        text=f"The text has {word_count} words and {len(sentences)} sentence(s); "
        f"keeping the first {len(chosen)}. ",
        tool_calls=(call(FINISH_TOOL, **output.model_dump()),),
    )


agent = Agent(
    name="summarizer",
    description="Summarizes a text in at most max_sentences sentences, with key points.",
    input_model=SummarizeInput,
    output_model=Summary,
    system_prompt=SYSTEM_PROMPT,
    tools=[count_words, split_sentences],
    model=register_script("summarizer", script),
    max_steps=6,
)
