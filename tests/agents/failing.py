"""An agent whose provider refuses it and echoes the API key back, as some do: a failed
session whose failure reason holds a secret (tests of the service's logs)."""

from __future__ import annotations

import os

from pydantic import BaseModel

from helix_transport import Agent
from helix_transport.agent.scripted import ScriptedTurn, register_script

KEY_ENV = "OPENAI_API_KEY"


class Prompt(BaseModel):
    text: str


class Reply(BaseModel):
    text: str


def _refuse(messages: list[dict[str, object]]) -> ScriptedTurn:
    raise ValueError(f"Incorrect API key provided: {os.environ.get(KEY_ENV, '')}")


refused = Agent(
    name="refused",
    description="Fails at its first model call: the provider refuses its key.",
    input_model=Prompt,
    output_model=Reply,
    model=register_script("refused-by-provider", _refuse),
)
