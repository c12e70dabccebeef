"""A Python parent that delegates to the Node.js agent service (tests.agents.interop:polyglot).

Like the orchestrator, it knows its child only through the contract: the
``translate`` tool is a remote sub-agent of type ``translator-node``, found through
the mesh registry (``HELIX_AGENT_ADDRESS_TRANSLATOR_NODE``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from helix_transport import Agent
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    steps_taken,
    tool_results,
    user_input,
)
from helix_transport.delegation.remote import remote_agent_tool

NODE_AGENT_TYPE = "translator-node"


class TranslateRequest(BaseModel):
    """What the parent sends the Node translator (which validates it again)."""

    text: str = Field(min_length=1, description="English text.")
    target: Literal["fr", "de", "es"] = Field(default="fr", description="Target language.")
    words_per_step: int = Field(default=4, ge=1, le=50, description="Words per child step.")


class Translation(BaseModel):
    """The parent's answer: the child's translation."""

    translation: str
    unknown: list[str]


def _script(messages: list[dict[str, object]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        request = TranslateRequest.model_validate(user_input(messages))
        return ScriptedTurn(
            text="Asking the Node.js translator. ",
            tool_calls=(call("translate", **request.model_dump()),),
        )
    result = tool_results(messages).get("translate")
    if isinstance(result, dict) and isinstance(result.get("translation"), str):
        return finish(translation=result["translation"], unknown=list(result.get("unknown", [])))
    return finish(translation=f"(the translator failed: {result})", unknown=[])


polyglot = Agent(
    name="polyglot",
    description="Translates a text by delegating to the Node.js translator service.",
    input_model=TranslateRequest,
    output_model=Translation,
    tools=[
        remote_agent_tool(
            "translate",
            agent_type=NODE_AGENT_TYPE,
            input_model=TranslateRequest,
            description="Translate English text word by word (fr, de, es).",
            timeout_s=120,
        )
    ],
    model=register_script("polyglot", _script),
    max_steps=3,
)
