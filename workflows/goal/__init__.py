"""The goal workflow, one room per concern."""

from workflows.goal.workflow import GoalWorkflow

__all__ = ["GoalWorkflow"]
