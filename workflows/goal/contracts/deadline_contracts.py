"""How long a question waits for a person, when it reminds them, and what it decides when
nobody answers: `QuestionDeadline`, set by the goal (GoalSpec), a plan and a plan step,
the most specific winning field by field (workflows/goal/rules/question_deadline_rules.py applies it).

Pure validation only. `happened` and `not_happened` assume what became of one tool's
uncertain call, so they are taken only on a step, about a tool that declares them safe
(ToolSpec.safe_on_expiry); a goal or a plan naming them is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from perdure.workflows.goal.rules.timing import DURATION_FORMAT, parse_duration
from perdure.workflows.shared.tool_specs import WRITE_RISKS, ExpiryOutcome, ToolSpec

DEFAULT_DEADLINE = "48h"
"""A question's deadline when the rules that set one name no duration."""
REMIND_FRACTION = 0.25
"""Without `remind_before`, the reminder comes this share of the deadline before it (12 h of 48 h)."""
ASSUMED = ("happened", "not_happened")


class QuestionDeadline(BaseModel):
    """A deadline rule; a field left out is taken from the less specific rule (step, then plan,
    then goal), then from the defaults: DEFAULT_DEADLINE, a quarter of it for the reminder, and
    the safe outcome for the question's kind (deny a confirmation of a write, park otherwise)."""

    model_config = ConfigDict(extra="forbid")

    after: str | None = Field(
        default=None, max_length=40, description=f"How long a question waits for an answer: {DURATION_FORMAT}."
    )
    remind_before: str | None = Field(
        default=None,
        max_length=40,
        description="The reminder comes this long before the deadline (default: a quarter of the deadline).",
    )
    on_expiry: ExpiryOutcome | None = Field(
        default=None,
        description="What an unanswered question decides at its deadline: deny (as if refused: the step is "
        "dropped with the work that needs it, the goal goes on), park (the goal parks, the question stays open), "
        "abort; on a step, for a question whether its call happened: happened or not_happened, only for a tool "
        "that declares it safe.",
    )

    @field_validator("after", "remind_before")
    @classmethod
    def _is_a_duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)  # its ValueError is the message
        return value

    @model_validator(mode="after")
    def _reminder_before_the_deadline(self) -> QuestionDeadline:
        if self.after is not None and self.remind_before is not None:
            if parse_duration(self.remind_before) >= parse_duration(self.after):
                raise ValueError(f"remind_before {self.remind_before} is not shorter than the deadline {self.after}")
        return self

    def duration(self) -> timedelta | None:
        return parse_duration(self.after) if self.after is not None else None

    def reminder_lead(self) -> timedelta | None:
        return parse_duration(self.remind_before) if self.remind_before is not None else None


DEFAULT_QUESTION_DEADLINE = QuestionDeadline(after=DEFAULT_DEADLINE)
"""What every goal perdure's front ends start is given unless told otherwise."""


def not_assumed(rule: QuestionDeadline | None, where: str) -> str | None:
    """Why a goal's or plan's rule may not name happened/not_happened, or None."""
    if rule is None or rule.on_expiry not in ASSUMED:
        return None
    return (
        f"{where}: on_expiry {rule.on_expiry} assumes what became of one tool's call; set it on the step that "
        "calls a tool declaring it safe"
    )


def step_expiry_problems(
    step: str, tools: list[str], rule: QuestionDeadline | None, table: Mapping[str, ToolSpec]
) -> list[str]:
    """A step's on_expiry happened/not_happened, judged against each tool it may call that can
    leave an uncertain outcome (a write or a command); tools `table` does not know pass (only a
    worker knows a user's own: the goal checks them against its catalogue)."""
    if rule is None or rule.on_expiry not in ASSUMED:
        return []
    problems = []
    for name in tools:
        spec = table.get(name)
        if spec is None or (spec.risk not in WRITE_RISKS and not spec.runs_commands):
            continue
        problem = spec.expiry_problem(rule.on_expiry)
        if problem:
            problems.append(f"step '{step}': {problem}")
    return problems
