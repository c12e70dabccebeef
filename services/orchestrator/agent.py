"""The orchestrator agent: plans a question, delegates the work, composes the answer.

It delegates over gRPC to other services found through the mesh registry
(``HELIX_AGENT_ADDRESS_RESEARCHER``, ``..._SUMMARIZER``, ``..._MAILER``): one
``research`` call per sub-question, all in one step so they run concurrently, then
one ``summarize`` call over everything found and, when the input names an
``email_to``, one ``email`` call that has the mailer send the answer there. The
mailer's ``send_email`` waits for a person's approval: the mailer suspends, then
the orchestrator, until the answer comes down from the root. Offline, the scripted
model plays exactly that plan; ``HELIX_MODEL`` switches to a real model with the
same tools.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from helix_transport import Agent, ToolContext, remote_agent_tool, tool
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    step_results,
    user_input,
)


class Question(BaseModel):
    """The question to answer."""

    question: str = Field(min_length=1, description="The question to answer.")
    email_to: str | None = Field(
        default=None, description="Email the answer to this address too (a person approves)."
    )


class Answer(BaseModel):
    """The answer and what it rests on."""

    answer: str = Field(description="The answer to the question.")
    findings: list[str] = Field(description="The findings the answer is built from.")
    email: str | None = Field(
        default=None, description="What became of the email of the answer, when asked for one."
    )


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


class ResearchRequest(BaseModel):
    """What the orchestrator asks the researcher (the researcher validates it again)."""

    topic: str = Field(min_length=1, description="The sub-question to research.")
    max_sources: int = Field(default=2, ge=1, le=10, description="Most notes to read.")


class SummarizeRequest(BaseModel):
    """What the orchestrator asks the summarizer."""

    text: str = Field(min_length=1, description="The text to summarize.")
    max_sentences: int = Field(default=3, ge=1, le=10, description="Sentences to keep.")


class EmailRequest(BaseModel):
    """What the orchestrator asks the mailer."""

    to: str = Field(min_length=3, description="The recipient's address.")
    subject: str = Field(description="The subject line.")
    body: str = Field(min_length=1, description="The text of the email.")


MAX_PARTS = 3
"""Sub-questions researched at most (one concurrent research call each)."""

SYSTEM_PROMPT = """\
You answer questions by planning and delegating. The user message is JSON: {"question": ...}.

1. Call `plan` with the question to break it into sub-questions.
2. Call `research` once per sub-question (at most 3), all in the same turn, with \
{"topic": <sub-question>}.
3. Call `summarize` with {"text": <every finding joined into one text>}.
4. If the input has `email_to`, call `email` with {"to": <email_to>, "subject": <the \
question>, "body": <the summary>}; a person approves it, and may refuse.
5. Finish with `answer` (the summary, addressing the question), `findings` (every \
finding the researchers returned) and, if you emailed, `email` (whether it was sent). \
Say plainly when nothing was found; never invent facts."""


def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    """Plan, research every part concurrently, summarize, email if asked, answer."""
    asked = Question.model_validate(user_input(messages))
    question = asked.question
    results = step_results(messages)
    names = {name for name, _ in results}
    if not results:
        return ScriptedTurn(
            text="Planning how to answer. ", tool_calls=(call("plan", question=question),)
        )
    if names == {"plan"}:
        plan_result = results[0][1]
        subs = plan_result.get("sub_questions") if isinstance(plan_result, dict) else None
        # A failed plan is not fatal: research the question as its own only part.
        parts = (
            [str(s) for s in subs][:MAX_PARTS] if isinstance(subs, list) and subs else [question]
        )
        return ScriptedTurn(
            text=f"Researching {len(parts)} part(s) in parallel. ",
            tool_calls=tuple(call("research", topic=part, max_sources=2) for part in parts),
        )
    if names == {"research"}:
        findings = _findings(results)
        if not findings:
            return finish(answer=f"I found nothing on {question!r}.", findings=[])
        return ScriptedTurn(
            text=f"Summarizing {len(findings)} finding(s). ",
            tool_calls=(call("summarize", text=" ".join(findings), max_sentences=3),),
        )
    if names == {"email"}:
        return _finish_emailed(messages, results[0][1])
    summary = results[0][1] if results else {}
    findings = _findings(step_results(_before_last_step(messages)))
    answer = summary.get("summary") if isinstance(summary, dict) else None
    answer = answer or " ".join(findings)
    if asked.email_to:
        return ScriptedTurn(
            text=f"Emailing the answer to {asked.email_to}. ",
            tool_calls=(call("email", to=asked.email_to, subject=question, body=answer),),
        )
    return finish(answer=answer, findings=findings)


def _finish_emailed(messages: list[dict[str, Any]], mailed: Any) -> ScriptedTurn:
    """The answer once the mailer is done: the summary and findings of the steps before."""
    before = _before_last_step(messages)
    summary = step_results(before)[0][1] if step_results(before) else {}
    findings = _findings(step_results(_before_last_step(before)))
    answer = summary.get("summary") if isinstance(summary, dict) else None
    if isinstance(mailed, dict) and "sent" in mailed:
        email = str(mailed.get("detail") or ("sent" if mailed["sent"] else "not sent"))
    else:  # the mailer failed or could not be reached
        email = f"not sent: {mailed.get('error') if isinstance(mailed, dict) else mailed}"
    return finish(answer=answer or " ".join(findings), findings=findings, email=email)


def _findings(results: list[tuple[str, Any]]) -> list[str]:
    """Every finding of the research results (failed calls contribute none)."""
    return [
        str(finding)
        for _, value in results
        if isinstance(value, dict) and isinstance(value.get("findings"), list)
        for finding in value["findings"]
    ]


def _before_last_step(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation up to the model turn that started the latest step."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "assistant":
            return messages[:index]
    return messages


agent = Agent(
    name="orchestrator",
    description="Answers a question by delegating research and summarizing to other agents.",
    input_model=Question,
    output_model=Answer,
    system_prompt=SYSTEM_PROMPT,
    tools=[
        plan,
        remote_agent_tool(
            "research",
            agent_type="researcher",
            input_model=ResearchRequest,
            description="Research one sub-question in the notes; returns findings and sources.",
            timeout_s=120,
        ),
        remote_agent_tool(
            "summarize",
            agent_type="summarizer",
            input_model=SummarizeRequest,
            description="Summarize a text into a few sentences and key points.",
            timeout_s=120,
        ),
        # No timeout: the mailer waits for a person's approval, however long it takes.
        remote_agent_tool(
            "email",
            agent_type="mailer",
            input_model=EmailRequest,
            description="Email a text; a person approves it before it is sent.",
        ),
    ],
    model=register_script("orchestrator", script),
    max_steps=8,
)
