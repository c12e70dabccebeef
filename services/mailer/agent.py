"""The mailer agent: writes and sends one email, and a person approves each one first.

Its ``send_email`` tool needs an approval (``@tool(approval=True)``): the session logs
a request for input and suspends until the answer arrives through the root of its
tree (``helix-mesh call`` asks at a terminal, ``helix-mesh respond`` from a script).
A denial reaches the model as the tool's error, and the mailer says it did not send.

"Sending" appends the email as a JSON line to the file ``HELIX_MAILER_OUTBOX`` names;
without it nothing is written and the tool only answers with a message id. The input
is the email itself (``to``, ``subject``, ``body``) or a request in words
(``request``), from which the offline script takes the first email address and uses
the text as the body. ``HELIX_MODEL`` switches to a real model, which gets the same
tool and the system prompt below.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from typing import Any, Self

from pydantic import BaseModel, Field, model_validator

from helix_transport import Agent, ToolContext, tool
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    step_results,
    user_input,
)
from helix_transport.config import declare

OUTBOX_ENV = declare("HELIX_MAILER_OUTBOX")  # this agent's own: no warning at start
"""The file each sent email is appended to, one JSON line each (unset: none)."""


class MailRequest(BaseModel):
    """An email to send: spelled out, or asked for in words."""

    to: str = Field(default="", description="The recipient's address.")
    subject: str = Field(default="", description="The subject line.")
    body: str = Field(default="", description="The text of the email.")
    request: str = Field(
        default="", description="What to send, in words, when to/subject/body are not given."
    )

    @model_validator(mode="after")
    def _an_email_or_a_request(self) -> Self:
        if not self.request and not (self.to and self.body):
            raise ValueError("give to and body (and a subject), or a request in words")
        return self


class MailResult(BaseModel):
    """Whether the email went out."""

    sent: bool = Field(description="True once send_email ran (a person approved it).")
    message_id: str | None = Field(default=None, description="The sent email's id.")
    detail: str = Field(description="To whom it went, or why it did not.")


class Email(BaseModel):
    """Arguments of ``send_email``."""

    to: str = Field(min_length=3, description="The recipient's address.")
    subject: str = Field(description="The subject line.")
    body: str = Field(min_length=1, description="The text of the email.")


@tool(approval=True)
async def send_email(ctx: ToolContext, args: Email) -> dict[str, Any]:
    """Send an email. A person approves each one before it goes."""
    message_id = f"<{uuid.uuid4().hex}@helix-mesh.mailer>"
    outbox = os.environ.get(OUTBOX_ENV)
    if outbox:
        line = json.dumps({"message_id": message_id, "session_id": ctx.session_id,
                           **args.model_dump()})  # fmt: skip
        await asyncio.to_thread(_append, outbox, line)
    return {"sent": True, "message_id": message_id}


def _append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as outbox:
        outbox.write(line + "\n")


SYSTEM_PROMPT = """\
You send one email. The user message is JSON: {"to", "subject", "body"}, or {"request"} \
describing the email in words.

Call `send_email` once with `to`, `subject` and `body` (from a request, write a short, \
plain email; never invent an address the request does not give). A person approves it \
first: if the tool answers with an error, the email was not sent. Finish with `sent`, \
`message_id` (from the tool's result, if sent) and `detail` (to whom it went, or why not)."""

_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


def email_of(request: MailRequest) -> Email:
    """The email a request asks for: as given, or taken from the request's words."""
    if not request.request:
        return Email(to=request.to, subject=request.subject or "(no subject)", body=request.body)
    found = _ADDRESS.search(request.request)
    to = request.to or (found.group(0) if found else "nobody@example.com")
    return Email(to=to, subject=request.subject or "A note from helix-mesh",
                 body=request.body or request.request)  # fmt: skip


def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    """Send the email, then say whether it went."""
    email = email_of(MailRequest.model_validate(user_input(messages)))
    results = step_results(messages)
    if not results:
        return ScriptedTurn(
            text=f"Sending the email to {email.to}, once it is approved. ",
            tool_calls=(call("send_email", **email.model_dump()),),
        )
    _, result = results[0]
    if isinstance(result, dict) and result.get("sent"):
        return finish(sent=True, message_id=str(result.get("message_id")),
                      detail=f"sent to {email.to}")  # fmt: skip
    why = result.get("error") if isinstance(result, dict) else result
    return finish(sent=False, message_id=None, detail=f"not sent: {why}")


agent = Agent(
    name="mailer",
    description="Sends one email (to, subject, body, or a request in words) once a person "
    "approves it.",
    input_model=MailRequest,
    output_model=MailResult,
    system_prompt=SYSTEM_PROMPT,
    tools=[send_email],
    model=register_script("mailer", script),
    max_steps=4,
)
