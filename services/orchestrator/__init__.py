"""The orchestrator agent: plans a question and answers it."""

from services.orchestrator.agent import agent

__all__ = ["agent"]
