"""The summarizer agent: condenses a text into a few sentences and key points."""

from services.summarizer.agent import agent

__all__ = ["agent"]
