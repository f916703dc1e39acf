"""The digest `perdure start` compares to tell a retried start from a different goal under the
same id (starters/client/goal_specs.py spec_digest): a spec field added later must not change the
digest of a spec that leaves it at its default, or a start retried across an upgrade would
be refused as "a different spec"."""

from __future__ import annotations

import hashlib

from perdure.starters.client.goal_specs import LATER_SPEC_FIELDS, LATER_VERIFY_FIELDS, spec_digest
from perdure.workflows.goal.contracts.goal_contracts import GoalSpec
from perdure.workflows.goal.contracts.plan import VerifySpec

# GoalSpec's fields when start digests were first compared; every field since is "later".
FIELDS_WHEN_DIGESTS_BEGAN = {
    *("goal", "plan", "constraints", "budget", "model_profile", "allowed_tools", "workspace", "allow_network"),
    *("max_plan_repairs", "max_agent_turns", "premises", "soft_gate", "drift_every", "stall_threshold"),
    *("stall_after_s", "local_activities_up_to_s", "continue_as_new_after_events", "device_wait_s"),
    *("device_approval", "compact_context_after_chars"),
}
# A step's `verify` fields when `verify` came (and the digest left it out at its default).
VERIFY_FIELDS_WHEN_IT_CAME = {"depth", "command", "expect_exit", "timeout_s"}


def test_every_field_added_since_digests_began_is_left_out_of_the_digest_at_its_default():
    later = set(GoalSpec.model_fields) - FIELDS_WHEN_DIGESTS_BEGAN
    assert later == set(LATER_SPEC_FIELDS), "list a new GoalSpec field in LATER_SPEC_FIELDS"
    spec = GoalSpec(goal="tidy the notes", workspace="/tmp/w")
    as_before = spec.model_dump_json(include=FIELDS_WHEN_DIGESTS_BEGAN)
    assert spec_digest(spec) == hashlib.sha256(as_before.encode()).hexdigest()


def test_a_later_field_set_away_from_its_default_changes_the_digest():
    spec = GoalSpec(goal="tidy the notes", workspace="/tmp/w")
    assert spec_digest(spec.model_copy(update={"recovery_mode": "trust"})) != spec_digest(spec)


def test_a_plan_file_spec_digests_as_it_did_before_steps_had_verify_writes_and_defer():
    from perdure.starters.client.goal_specs import LATER_STEP_FIELDS

    steps = [{"name": "read", "kind": "tool", "tool": "read_file", "args": {"path": "ñotes.md"}}]
    spec = GoalSpec(goal="tidy the notes", workspace="/tmp/w", plan={"steps": steps})
    data = spec.model_dump(mode="json", include=FIELDS_WHEN_DIGESTS_BEGAN)
    for step in data["plan"]["steps"]:
        for name in LATER_STEP_FIELDS:
            step.pop(name)
    # What the digest hashed then: pydantic's compact JSON of the spec without the later fields.
    then = GoalSpec.model_validate(data).model_dump_json(include=FIELDS_WHEN_DIGESTS_BEGAN)
    then = then.replace(',"verify":null', "").replace(',"writes":null', "").replace(',"defer":true', "")
    then = then.replace(',"question_deadline":null', "")  # a step's and a plan's, since deadlines came
    assert spec_digest(spec) == hashlib.sha256(then.encode()).hexdigest()


def test_a_step_whose_verify_asks_no_question_digests_as_it_did_before_questions():
    assert set(VerifySpec.model_fields) - VERIFY_FIELDS_WHEN_IT_CAME == set(LATER_VERIFY_FIELDS)
    steps = [
        {"name": "build", "kind": "tool", "tool": "run_command", "args": {"command": "make"}},
        {"name": "notes", "kind": "llm", "prompt": "Sum up.", "needs": ["build"], "verify": {"command": "make -q"}},
    ]
    spec = GoalSpec(goal="build it", workspace="/tmp/w", plan={"steps": steps})
    # What the digest hashed before questions: the same text, with no `question` in `verify`.
    then = spec.model_dump_json(include=FIELDS_WHEN_DIGESTS_BEGAN)
    assert ',"question":null' in then
    for later in (',"question":null', ',"verify":null', ',"writes":null', ',"defer":true', ',"question_deadline":null'):
        then = then.replace(later, "")
    assert spec_digest(spec) == hashlib.sha256(then.encode()).hexdigest()
    asking = [steps[0], {**steps[1], "verify": {"command": "make -q", "question": "Still true?"}}]
    assert spec_digest(GoalSpec(goal="build it", workspace="/tmp/w", plan={"steps": asking})) != spec_digest(spec)


def test_the_question_deadline_every_start_gets_digests_as_no_deadline_did():
    """A start retried across the upgrade that brought deadlines (it now carries the default)."""
    from perdure.workflows.goal.contracts.deadline_contracts import DEFAULT_QUESTION_DEADLINE, QuestionDeadline

    spec = GoalSpec(goal="tidy the notes", workspace="/tmp/w")
    defaulted = spec.model_copy(update={"question_deadline": DEFAULT_QUESTION_DEADLINE})
    assert spec_digest(defaulted) == spec_digest(spec)
    shorter = spec.model_copy(update={"question_deadline": QuestionDeadline(after="10m")})
    assert spec_digest(shorter) != spec_digest(spec)


def test_keyed_writes_as_local_activities_are_no_part_of_the_digest():
    """Every start now sets it: a start retried across that upgrade still names its goal."""
    spec = GoalSpec(goal="tidy the notes", workspace="/tmp/w")
    assert spec_digest(spec.model_copy(update={"local_keyed_writes": True})) == spec_digest(spec)
