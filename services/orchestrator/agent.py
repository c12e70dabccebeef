"""The orchestrator agent: breaks a question into sub-questions and answers it.

For now it works alone: a ``plan`` tool splits the question, and the scripted model
finishes with an answer composed from that plan. The next step replaces this with
delegation: ``plan``'s sub-questions go to the researcher and the summarizer over
gRPC (remote sub-agent tools), and the answer is built from what they return. Only
``script``, the tool list and the prompt need to change; the schemas stay.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, Field

from helix_transport.agent.definition import Agent
from helix_transport.agent.scripted import ScriptedTurn, call, register_script, user_input
from helix_transport.agent.tools import FINISH_TOOL, ToolContext, tool


class Question(BaseModel):
    """The question to answer."""

    question: str = Field(min_length=1, description="The question to answer.")


class Answer(BaseModel):
    """The answer and what it rests on."""

    answer: str = Field(description="The answer to the question.")
    findings: list[str] = Field(description="The findings the answer is built from.")


_SENTENCE = re.compile(r"[^.?!;]+[.?!;]*")
# Split on "and" only where a new question starts ("... and why ..."), so
# "salt and pepper" stays one sub-question.
_AND_QUESTION = re.compile(
    r",?\s+and\s+(?=(?:what|why|how|when|where|who|which|whether|is|are|does|do|can)\b)",
    re.IGNORECASE,
)


def split_question(question: str) -> list[str]:
    """The sub-questions of ``question``, each capitalized and ending in ``?``."""
    parts: list[str] = []
    for sentence in _SENTENCE.findall(" ".join(question.split())):
        for part in _AND_QUESTION.split(sentence):
            part = part.strip().rstrip(".?!;,").strip()
            if part:
                parts.append(f"{part[0].upper()}{part[1:]}?")
    return parts


class PlanArgs(BaseModel):
    """Arguments of ``plan``."""

    question: str = Field(min_length=1, description="The question to break down.")


@tool
async def plan(ctx: ToolContext, args: PlanArgs) -> dict[str, list[str]]:
    """Break a question into the sub-questions to answer, in order."""
    return {"sub_questions": split_question(args.question)}


SYSTEM_PROMPT = """\
You answer questions by planning first. The user message is JSON: {"question": ...}.

Call `plan` with the question to break it into sub-questions. Then finish with `answer`: \
a direct answer that addresses every sub-question in order, and `findings`: one entry per \
sub-question saying what you concluded about it. Say plainly when you cannot answer a part; \
do not make up facts."""


def _plan_result(messages: list[dict[str, Any]]) -> Any:
    """The latest ``plan`` result (parsed), or ``None`` before ``plan`` ran."""
    for message in reversed(messages):
        if message.get("role") == "tool" and message.get("name") == "plan":
            try:
                return json.loads(message.get("content") or "")
            except json.JSONDecodeError:
                return {"error": message.get("content")}
    return None


def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    """Plan, then finish with an answer composed from the plan."""
    question = Question.model_validate(user_input(messages)).question
    result = _plan_result(messages)
    if result is None:
        return ScriptedTurn(
            text="Planning how to answer. ",
            tool_calls=(call("plan", question=question),),
        )
    subs = result.get("sub_questions") if isinstance(result, dict) else None
    # A failed plan is not fatal: treat the question as its own only part.
    parts = [str(s) for s in subs] if isinstance(subs, list) and subs else [question]
    findings = [f"Part {i}: {part}" for i, part in enumerate(parts, 1)]
    output = Answer(
        answer=f"Answering {question!r} takes {len(parts)} part(s): "
        + " ".join(f"({i}) {part}" for i, part in enumerate(parts, 1)),
        findings=findings,
    )
    return ScriptedTurn(
        text=f"The plan has {len(parts)} part(s). ",
        tool_calls=(call(FINISH_TOOL, **output.model_dump()),),
    )


agent = Agent(
    name="orchestrator",
    description="Answers a question by planning it into sub-questions.",
    input_model=Question,
    output_model=Answer,
    system_prompt=SYSTEM_PROMPT,
    tools=[plan],
    model=register_script("orchestrator", script),
    max_steps=8,
)
