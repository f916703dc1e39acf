"""Where a message to the router goes, decided without a model whenever the message says
so itself: the goal it names, the goal that owns an object it names, the goal whose card
it answers. And the strict reading of a model's choice when nothing did. Pure.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

from pydantic import ValidationError

from perdure.workflows.router.router_contracts import Candidate, RouteChoice, RouterState, Thread

# Below this the router asks the user instead of acting on the model's choice.
LOW_CONFIDENCE = 0.6
# A message this soon after a light answer may follow it up (the model is told so).
THREAD_WINDOW = timedelta(minutes=30)
NEW, ANSWER = "new", "answer"
# Names of workspace files (a dot and an extension) and artifact digests.
OBJECT = re.compile(r"(?<![\w/.-])(?:sha256:[0-9a-f]{8,64}|[\w./-]*[\w-]\.[A-Za-z0-9]{1,8})(?![\w/-])")
GOAL_AT = re.compile(r"^@(\S+)\s+")


def named_objects(text: str) -> list[str]:
    """The file paths and artifact digests a message names, in order, once each."""
    found: list[str] = []
    for match in OBJECT.finditer(text):
        name = match.group(0).rstrip(".").removeprefix("./")
        if name and name not in found:
            found.append(name)
    return found


def addressed_goal(text: str) -> tuple[str | None, str]:
    """`@GOAL rest of the message` names its goal: (goal id, the rest); else (None, text)."""
    match = GOAL_AT.match(text)
    if match is None:
        return None, text
    return match.group(1), text[match.end() :] or text


def bound_goal(text: str, candidates: list[Candidate]) -> tuple[Candidate | None, str]:
    """The one goal that owns an object the message names, and why; (None, why not) when
    none does or several do (then the model weighs them, told which)."""
    owners: dict[str, tuple[Candidate, str]] = {}
    for name in named_objects(text):
        for candidate in candidates:
            if any(_same_object(name, owned) for owned in candidate.objects):
                owners.setdefault(candidate.goal_id, (candidate, name))
    if len(owners) == 1:
        candidate, name = next(iter(owners.values()))
        return candidate, f"it names {name}, which goal {candidate.goal_id} owns"
    if owners:
        return None, "it names objects of several goals: " + ", ".join(
            f"{name} ({goal})" for goal, (_, name) in sorted(owners.items())
        )
    return None, ""


def _same_object(named: str, owned: str) -> bool:
    if named.startswith("sha256:"):
        return owned.startswith(named)
    if "/" in named:
        return owned == named or owned.endswith("/" + named)
    return owned.rsplit("/", 1)[-1] == named


def open_thread(state: RouterState, now: datetime) -> Thread | None:
    """The light conversation a message may follow up: the newest, if recent and not a goal yet."""
    if not state.threads:
        return None
    thread = state.threads[-1]
    if thread.goal_id is None and now - thread.last_at <= THREAD_WINDOW:
        return thread
    return None


def parse_choice(
    text: str, candidates: list[Candidate], thread: Thread | None
) -> tuple[RouteChoice | None, str | None]:
    """The model's reply as a choice, or why it is not one. Strict: one JSON object whose
    target is a candidate's goal id, `new`, `answer`, or the open thread's id."""
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`").removeprefix("json").strip()
    try:
        data = json.loads(body)
    except ValueError:
        return None, f"the reply is not JSON: {text[:120]!r}"
    if not isinstance(data, dict):
        return None, "the reply is not a JSON object"
    try:
        choice = RouteChoice.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "reply"
        return None, f"the reply's {where}: {first['msg']}"
    known = {c.goal_id for c in candidates} | {NEW, ANSWER} | ({thread.id} if thread else set())
    if choice.target not in known:
        return None, f"the reply names {choice.target[:80]!r}, which is none of the candidates"
    return choice, None
