"""The critic agent: reviews an artifact and returns a verdict, remembering earlier rounds.

Meant as a persistent companion (``helix_transport.delegation.companions``): a maker spawns it
once and re-consults the same session after each fix, so every round is a new
turn of one session (``Continue``) and the critic sees what it said before.

Offline, the scripted model plays two steps per round: ``inspect`` the artifact,
then finish with a verdict (``pass`` once the artifact mentions tests). Its notes
name the round and quote the previous round's artifact, which only a critic that
kept its memory can do. Two steps per round with ``max_steps=2`` also shows the
step budget is per turn: without a fresh budget the second round would fail.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from helix_transport import Agent, ToolContext, tool
from helix_transport.agent.scripted import ScriptedTurn, call, finish, register_script


class ReviewRequest(BaseModel):
    """What to review."""

    artifact: str = Field(min_length=1, description="The artifact's text.")


class Verdict(BaseModel):
    """The critic's verdict on one round."""

    verdict: Literal["pass", "revise"] = Field(description="pass, or revise with notes.")
    notes: str = Field(description="What to change, and what changed since the last round.")
    round: int = Field(description="How many rounds this critic has reviewed, this one included.")
    previous: str = Field(default="", description="The artifact of the previous round, if any.")


class InspectArgs(BaseModel):
    text: str


@tool
async def inspect(ctx: ToolContext, args: InspectArgs) -> dict[str, Any]:
    """Measure the artifact: its length and whether it mentions tests."""
    return {"length": len(args.text), "has_tests": "test" in args.text.lower()}


def _artifact(content: str) -> str:
    """A round's artifact: the JSON input of round 1, or a later round's plain message."""
    try:
        value = json.loads(content)
    except json.JSONDecodeError:
        return content
    return str(value.get("artifact", content)) if isinstance(value, dict) else content


def _script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    # Rounds are the user messages that are not the loop's nudges.
    rounds = [
        _artifact(str(m.get("content") or ""))
        for m in messages
        if m.get("role") == "user" and not str(m.get("content", "")).startswith("Continue the task")
    ]
    last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    inspected = [m for m in messages[last_user:] if m.get("role") == "tool"]
    if not inspected:
        return ScriptedTurn(text="Inspecting. ", tool_calls=(call("inspect", text=rounds[-1]),))
    facts = json.loads(str(inspected[-1]["content"]))
    passed = bool(facts.get("has_tests"))
    notes = f"round {len(rounds)}: " + ("looks good" if passed else "add tests")
    previous = rounds[-2] if len(rounds) > 1 else ""
    if previous:
        notes += f"; last round you sent {previous!r}"
    return finish(
        verdict="pass" if passed else "revise", notes=notes, round=len(rounds), previous=previous
    )


agent = Agent(
    name="critic",
    description="Reviews an artifact and returns a verdict; remembers earlier rounds.",
    input_model=ReviewRequest,
    output_model=Verdict,
    system_prompt=(
        "You review the maker's artifact and return a verdict. You remember earlier "
        "rounds: say what changed since the last one. Inspect the artifact first."
    ),
    tools=[inspect],
    model=register_script("critic", _script),
    max_steps=2,
)
