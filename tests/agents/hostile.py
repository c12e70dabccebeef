"""An agent with a nested input schema, for the hostile-input tests and the fuzz run."""

from __future__ import annotations

from pydantic import BaseModel, Field

from helix_transport import Agent
from helix_transport.agent.scripted import ScriptedTurn, finish, register_script, user_input


class Item(BaseModel):
    name: str = Field(min_length=1, max_length=100)
    count: int = Field(default=1, ge=0)


class EchoInput(BaseModel):
    topic: str = Field(min_length=1, max_length=10_000)
    items: list[Item] = Field(default_factory=list, max_length=100)
    tags: dict[str, str] = Field(default_factory=dict)


class EchoOutput(BaseModel):
    topic: str
    items: int


def _echo(messages: list[dict[str, object]]) -> ScriptedTurn:
    given = EchoInput.model_validate(user_input(messages))
    return finish(topic=given.topic[:100], items=len(given.items))


echo = Agent(
    name="echo",
    description="Echoes its topic and counts its items.",
    input_model=EchoInput,
    output_model=EchoOutput,
    model=register_script("echo", _echo),
    max_steps=3,
)
