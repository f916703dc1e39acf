"""The router: one long-lived workflow per user (`router-USER`) that takes every message the
user sends without naming a goal workflow (`perdure say`, the web page's input, the JSON
API) and sends it where it belongs.

Admission is durable and idempotent like a goal's: a `say` signal (no worker needed) or a
`say` update (a receipt with the decision), both keyed by the message's request id. Each
message is then routed in the order it came, deterministically first (workflows/router/routing.py):
the goal it names (`--goal`, or `@GOAL …`), a card it answers (the answer goes to the goal
that asked), a file or artifact it names that one goal owns. Only when nothing explicit
matches does a model choose among the user's goals, `new`, or `answer` (a light request),
with the candidates and its reason kept; a choice under LOW_CONFIDENCE, or a reply that
does not parse, is asked back to the user, who picks (`perdure say --pick`).

A routed message reaches its goal through that goal's own admission: a `message` signal
carrying a steer or queue with the request id `router.ID`, so every receipt rule of the
goal still holds. A goal that has ended cannot take messages: the message starts a follow-up
goal in the same workspace instead. Light requests are answered with one model call and no
goal; a follow-up of one (or an answer that says it needs tools or several steps) grows
into a goal carrying the conversation, and the router says so. Goals the router starts are
child workflows with parent-close policy ABANDON: they outlive the router's runs.

The router is also the user's inbox for goals' end-of-goal memory cards: a goal that ends
with verified conclusions sends them (a `memory_card` signal) instead of waiting for an
answer (workflows/goal/goal_memory.py). The router holds each card (bounded, across
continue-as-new) until a person answers it, `perdure say --card GOAL:memory=CHOICE`, or
until the shelf life of its memories ends (a timer drops it then); the answer promotes the
memories chosen with the goal's promote activity, and what was kept is recorded. An answer
to a card the router does not hold goes to the goal, as any card's answer. A goal's question
near its deadline arrives as a reminder (a `question_reminder` signal, workflows/goal/
question_deadlines.py), held until the user answers it here or its deadline passes.

Workflow code. Continue-as-new after `continue_after` routed messages (or when the server
suggests it), carrying the bounded state, with nothing pending or in a handler.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from perdure.workflows.goal.contracts.deadline_contracts import DEFAULT_QUESTION_DEADLINE
    from perdure.workflows.goal.contracts.goal_contracts import (
        GOAL_WORKFLOW,
        Activities,
        Budget,
        GoalSpec,
        Signals,
        goal_memo,
    )
    from perdure.workflows.goal.contracts.memory_contracts import MemoryOffer, PromoteInput, PromoteResult
    from perdure.workflows.goal.contracts.messages import Answer, Queue, Steer, bounded, content_digest
    from perdure.workflows.goal.contracts.plan import describe_validation_error
    from perdure.workflows.goal.contracts.state import GoalInput
    from perdure.workflows.goal.rules import memory_rules
    from perdure.workflows.router.router_contracts import (
        ROUTER_WORKFLOW,
        AnswerInput,
        AnswerResult,
        Candidate,
        ChooseInput,
        ChooseResult,
        KeptMemories,
        QuestionReminder,
        RouterActivities,
        RouterHandlers,
        RouterInput,
        RouterRefusal,
        RouterState,
        RouterView,
        Routing,
        Say,
        Thread,
        Turn,
    )
    from perdure.workflows.router.routing import (
        ANSWER,
        LOW_CONFIDENCE,
        NEW,
        addressed_goal,
        bound_goal,
        open_thread,
        parse_choice,
    )
    from perdure.workflows.shared.raw_values import decode_raw
    from perdure.workflows.shared.run_boundary import continue_as_new_due, continue_on_current_version
    from perdure.workflows.shared.search_attributes import OWNER

MESSAGES_KEPT = 200
THREADS_KEPT = 20
REFUSALS_KEPT = 50
CARDS_KEPT = 50
KEPT_KEPT = 50
SHOWN_CHARS = 500
MODEL_CALL = timedelta(seconds=180)
LOOKUP = timedelta(seconds=60)
RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=1))
EXAMPLE = '{"request_id": "r1", "text": "make the poster a bit warmer"}'


class _Unrouted(Exception):
    """A message that cannot be routed; the text says why (kept as its reason)."""


@workflow.defn(name=ROUTER_WORKFLOW)
class RouterWorkflow:
    @workflow.init
    def __init__(self, input: RouterInput) -> None:
        self._input = input
        self._state = input.state or RouterState(user=input.user, profile=input.profile)
        self._routed_this_run = 0

    @workflow.run
    async def run(self, input: RouterInput) -> None:
        state = self._state
        while True:
            self._drop_expired_cards()
            first_end = self._first_card_end()
            try:
                # Woken by a card that ends sooner too: the timer is set again for it.
                await workflow.wait_condition(
                    lambda end=first_end: (
                        bool(state.pending) or self._continue_as_new_due() or self._first_card_end() != end
                    ),
                    timeout=None if first_end is None else first_end - workflow.now(),
                    timeout_summary="a memory card's shelf life ends",
                )
            except TimeoutError:
                continue
            if state.pending:
                await self._route(state.pending[0])
                state.pending.pop(0)
                continue
            if not self._continue_as_new_due():
                continue
            # Nothing pending: an update still waiting for its decision would be cut off.
            await workflow.wait_condition(lambda: workflow.all_handlers_finished() or bool(state.pending))
            if state.pending:
                continue
            state.runs += 1
            continue_on_current_version(input.model_copy(update={"state": state}))

    # --- admission --------------------------------------------------------------------

    @workflow.signal(dynamic=True)
    def any_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """Durable admission without a worker; any name, any payload: a bad one is refused
        with its reason (kept, shown by `perdure inbox --router`), never a failed task."""
        if name == RouterHandlers.MEMORY_CARD:
            return self._card_arrived(args)
        if name == RouterHandlers.QUESTION_REMINDER:
            return self._reminder_arrived(args)
        if name != RouterHandlers.SAY:
            self._refuse(f"unknown signal '{bounded(name)[:80]}'; the router takes messages on '{RouterHandlers.SAY}'")
            return
        values, problem = decode_raw(args)
        say, problem = (None, problem) if problem else _parse(values)
        if say is None:
            self._refuse(problem or "unreadable message")
            return
        problem = self._admit(say)
        if problem:
            self._refuse(problem)

    @workflow.update(name=RouterHandlers.SAY)
    async def say(self, *args: Any) -> Routing:
        """Admission with a receipt: returns once the message is routed (or asked about)."""
        say, _ = _parse(list(args))
        assert say is not None  # the validator refused anything else
        self._admit(say)
        routing = self._routing(say.request_id)
        await workflow.wait_condition(lambda: routing.status != "pending")
        return routing

    @say.validator
    def _validate_say(self, *args: Any) -> None:
        say, problem = _parse(list(args))
        if say is None:
            raise ValueError(problem)
        problem = self._reuse_problem(say)
        if problem:
            raise ValueError(problem)

    @workflow.query(name=RouterHandlers.VIEW)
    def view(self) -> RouterView:
        state = self._state
        return RouterView(
            user=state.user,
            messages=state.messages[-50:],
            pending=len(state.pending),
            asked=[m for m in state.messages if m.status == "asked"],
            refusals=state.refusals[-20:],
            runs=state.runs,
            tokens=state.tokens,
            cost_usd=state.cost_usd,
            cards=state.cards,
            kept=state.kept[-20:],
            reminders=[r for r in state.reminders if r.deadline_at > workflow.now()],
        )

    def _admit(self, say: Say) -> str | None:
        """Admit once per request id; a retry of the same message is no new message."""
        problem = self._reuse_problem(say)
        if problem or self._find(say.request_id) is not None:
            return problem
        state = self._state
        shown = say.text if len(say.text) <= SHOWN_CHARS else say.text[: SHOWN_CHARS - 1] + "…"
        state.messages.append(
            Routing(request_id=say.request_id, text=shown, at=workflow.now(), digest=content_digest(say))
        )
        state.pending.append(say)
        self._trim()
        return None

    def _reuse_problem(self, say: Say) -> str | None:
        known = self._find(say.request_id)
        if known is None:
            return None
        if known.digest == content_digest(say):
            return None
        return f"request id '{say.request_id}' was already used for another message; a retry must send the same one"

    def _refuse(self, reason: str) -> None:
        workflow.logger.info("router message refused", extra={"reason": reason})
        state = self._state
        state.refusals = [*state.refusals, RouterRefusal(at=workflow.now(), reason=bounded(reason))][-REFUSALS_KEPT:]

    # --- routing ----------------------------------------------------------------------

    async def _route(self, say: Say) -> None:
        routing = self._routing(say.request_id)
        self._drop_expired_cards()
        try:
            await self._decide(say, routing)
        except _Unrouted as err:
            routing.status, routing.reason = "failed", str(err)
        except (ActivityError, ChildWorkflowError, ApplicationError) as err:
            cause = getattr(err, "cause", None) or err
            routing.status, routing.reason = "failed", f"could not route it: {str(cause)[:300]}"
        self._state.routed += 1
        self._routed_this_run += 1

    async def _decide(self, say: Say, routing: Routing) -> None:
        if say.pick is not None:
            return await self._picked(say, routing)
        if say.card is not None:
            held = self._held_card(say)
            if held is not None:
                return await self._keep(say, routing, held)
            card = say.card
            answer = Answer(request_id=f"router.{say.request_id}", question_id=card.question_id, choice=card.choice)
            await self._signal(card.goal_id, answer)
            self._answered_reminder(card.goal_id, card.question_id)
            return self._done(routing, "card", "answer", card.goal_id, f"an answer to question {card.question_id}")
        goal_id, text = (say.goal_id, say.text) if say.goal_id else addressed_goal(say.text)
        if goal_id is not None:
            mode = "queue" if say.queue else "steer"
            return await self._to_goal(routing, say, goal_id, mode, text, "explicit goal", "the message names it", None)
        if say.new:
            return await self._new_goal(routing, say, say.text, "new", "the user asked for a new goal")
        candidates = await self._candidates()
        routing.candidates = [c.goal_id for c in candidates]
        bound, why = bound_goal(say.text, candidates)
        if bound is not None:
            mode = "queue" if say.queue else "steer"
            return await self._to_goal(routing, say, bound.goal_id, mode, say.text, "bound object", why, bound)
        await self._by_model(say, routing, candidates, why)

    async def _by_model(self, say: Say, routing: Routing, candidates: list[Candidate], ambiguity: str) -> None:
        state = self._state
        thread = open_thread(state, workflow.now())
        recent = [f"{m.text[:120]} -> {m.action or m.status} {m.goal_id or ''}".strip() for m in state.messages[-6:-1]]
        if thread is not None:
            recent.append(f"open light conversation {thread.id}: " + " / ".join(t.text[:100] for t in thread.turns))
        if ambiguity:
            recent.append(ambiguity)
        chosen = await workflow.execute_activity(
            RouterActivities.CHOOSE,
            ChooseInput(profile=state.profile, text=say.text, candidates=candidates, recent=recent),
            result_type=ChooseResult,
            start_to_close_timeout=MODEL_CALL,
            retry_policy=RETRY,
            summary=f"route {say.request_id}"[:200],
        )
        self._charge(chosen.tokens, chosen.cost_usd)
        choice, problem = parse_choice(chosen.reply, candidates, thread)
        if choice is None:
            return self._ask(say, routing, candidates, thread, f"the model's choice could not be read ({problem})")
        routing.confidence = choice.confidence
        if choice.confidence < LOW_CONFIDENCE:
            return self._ask(say, routing, candidates, thread, f"the model was unsure ({choice.reason})")
        await self._act(say, routing, choice.target, choice.mode, candidates, thread, "model", choice.reason)

    async def _act(
        self,
        say: Say,
        routing: Routing,
        target: str,
        mode: str,
        candidates: list[Candidate],
        thread: Thread | None,
        by: str,
        reason: str,
    ) -> None:
        if target == NEW:
            return await self._new_goal(routing, say, say.text, by, reason)
        if target == ANSWER:
            return await self._light(say, routing, by, reason)
        if thread is not None and target == thread.id:
            return await self._upgrade(say, routing, thread, by, "a follow-up of a light request: " + reason)
        candidate = next((c for c in candidates if c.goal_id == target), None)
        await self._to_goal(routing, say, target, mode, say.text, by, reason, candidate)

    def _ask(self, say: Say, routing: Routing, candidates: list[Candidate], thread: Thread | None, why: str) -> None:
        self._state.asked.append(say)
        choices = [c.goal_id for c in candidates] + ([thread.id] if thread else []) + [NEW, ANSWER]
        routing.status, routing.action, routing.reason, routing.choices = "asked", "asked", why, choices
        listed = "; ".join(f"{c.goal_id} ({c.goal[:60]})" for c in candidates[:8]) or "no open goals"
        routing.reply = f"Which goal is this for? {listed}; or `new`, or `answer` for a quick reply."

    async def _picked(self, say: Say, routing: Routing) -> None:
        assert say.pick is not None
        asked = self._find(say.pick.request_id)
        original = next((p for p in self._state.asked if p.request_id == say.pick.request_id), None)
        if asked is None or asked.status != "asked" or original is None:
            raise _Unrouted(f"nothing is waiting for a pick under '{say.pick.request_id}'")
        if say.pick.choice not in asked.choices:
            raise _Unrouted(f"'{say.pick.choice[:80]}' is not one of: {', '.join(asked.choices)}")
        self._state.asked.remove(original)
        candidates = await self._candidates()
        thread = open_thread(self._state, workflow.now())
        thread = thread if thread is not None and thread.id == say.pick.choice else None
        asked.status = "pending"
        await self._act(original, asked, say.pick.choice, "steer", candidates, thread, "person", "the user picked it")
        self._done(routing, "person", asked.action or "steer", asked.goal_id, f"picked for {say.pick.request_id}")

    async def _to_goal(
        self,
        routing: Routing,
        say: Say,
        goal_id: str,
        mode: str,
        text: str,
        by: str,
        reason: str,
        candidate: Candidate | None,
    ) -> None:
        """Through the goal's own admission; a goal that has ended gets a follow-up goal."""
        if candidate is not None and not candidate.open:
            follow = f"{text}\n\nThis follows goal {goal_id} ({candidate.status}), whose goal was:\n{candidate.goal}"
            why = f"{reason}; {goal_id} has ended ({candidate.status}), so a follow-up goal"
            return await self._new_goal(routing, say, follow, by, why, workspace=candidate.workspace)
        message = (Queue if mode == "queue" else Steer)(request_id=f"router.{say.request_id}", text=text)
        await self._signal(goal_id, message)
        self._done(routing, by, "queue" if mode == "queue" else "steer", goal_id, reason)

    async def _signal(self, goal_id: str, message: Any) -> None:
        if getattr(message, "by", "") is None:
            # Sent for the user: the goal's decision log names them as who decided.
            message = message.model_copy(update={"by": self._state.user})
        try:
            await workflow.get_external_workflow_handle(goal_id).signal(
                Signals.MESSAGE, message.model_dump(mode="json")
            )
        except ApplicationError as err:
            raise _Unrouted(f"goal {goal_id} cannot take messages (it has ended or does not exist): {err}") from None

    async def _new_goal(
        self, routing: Routing, say: Say, goal_text: str, by: str, reason: str, workspace: str | None = None
    ) -> str:
        state = self._state
        where = workspace or say.workspace or state.workspace
        if not where:
            raise _Unrouted("a new goal needs a workspace: send the message with one (`perdure say` sends its cwd)")
        state.workspace = state.workspace or say.workspace
        goal_id = "goal-" + hashlib.sha256(f"{state.user}/{say.request_id}".encode()).hexdigest()[:10]
        try:
            # A goal the router starts has no budget of its own: it gets the default one.
            spec = GoalSpec(
                goal=goal_text[:20_000],
                workspace=where,
                model_profile=state.profile,
                budget=Budget().with_default_tokens(),
                question_deadline=DEFAULT_QUESTION_DEADLINE,
                local_keyed_writes=True,  # as every start (starters/client/goal_specs.py)
            )
        except ValidationError as err:
            raise _Unrouted(f"cannot start a goal from it: {describe_validation_error(err)}") from None
        try:
            started = await workflow.start_child_workflow(
                GOAL_WORKFLOW,
                GoalInput(spec=spec),
                id=goal_id,
                task_queue=workflow.info().task_queue,
                parent_close_policy=ParentClosePolicy.ABANDON,
                task_timeout=spec.task_timeout(),
                static_summary=goal_text[:200],
                search_attributes=TypedSearchAttributes([SearchAttributePair(OWNER, state.user)]),
                memo=goal_memo(goal_text),  # a list of goals shows their text
            )
        except WorkflowAlreadyStartedError:
            pass  # this very message started it in an earlier run
        else:
            # The router never waits for a goal it started: how the goal ends (a failure too)
            # is the goal's to report. Reading it keeps asyncio from logging it as unretrieved.
            started.add_done_callback(lambda ended: ended.cancelled() or ended.exception())
        action = "follow-up goal" if "follow-up" in reason else "new goal"
        self._done(routing, by, action, goal_id, reason)
        return goal_id

    async def _light(self, say: Say, routing: Routing, by: str, reason: str) -> None:
        state = self._state
        thread = Thread(id=f"t-{say.request_id}"[:64], turns=[Turn(role="user", text=say.text)], last_at=workflow.now())
        state.threads = [*state.threads, thread][-THREADS_KEPT:]
        routing.thread = thread.id
        answer = await self._answer(thread)
        if answer.needs_goal:
            return await self._upgrade(say, routing, thread, by, f"it needs a goal: {answer.needs_goal}", asked=False)
        thread.turns.append(Turn(role="router", text=answer.text))
        routing.reply = answer.text
        self._done(routing, by, "answered", None, reason)

    async def _upgrade(
        self, say: Say, routing: Routing, thread: Thread, by: str, reason: str, asked: bool = True
    ) -> None:
        if asked:
            thread.turns.append(Turn(role="user", text=say.text))
        routing.thread = thread.id
        conversation = "\n".join(f"{t.role}: {t.text}" for t in thread.turns)
        goal_text = f"A request that grew out of a conversation with the user:\n\n{conversation}"
        goal_id = await self._new_goal(routing, say, goal_text, by, reason)
        thread.goal_id, thread.last_at = goal_id, workflow.now()
        routing.action = "upgraded"
        routing.reply = f"This needs more than a quick answer: it is now goal {goal_id}."

    async def _answer(self, thread: Thread) -> AnswerResult:
        result = await workflow.execute_activity(
            RouterActivities.ANSWER,
            AnswerInput(profile=self._state.profile, turns=thread.turns),
            result_type=AnswerResult,
            start_to_close_timeout=MODEL_CALL,
            retry_policy=RETRY,
            summary=f"answer {thread.id}"[:200],
        )
        self._charge(result.tokens, result.cost_usd)
        return result

    async def _candidates(self) -> list[Candidate]:
        return await workflow.execute_activity(
            RouterActivities.CANDIDATES,
            self._state.user,
            result_type=list[Candidate],
            start_to_close_timeout=LOOKUP,
            retry_policy=RETRY,
            summary="the user's goals",
        )

    # --- memory cards -----------------------------------------------------------------

    def _card_arrived(self, args: Sequence[RawValue]) -> None:
        """A goal's memory card: held (one per goal, the newest) until answered or expired."""
        values, problem = decode_raw(args)
        offer, problem = (None, problem) if problem else _parse_offer(values)
        if offer is None:
            self._refuse(problem or "unreadable memory card")
            return
        state = self._state
        state.cards = [c for c in state.cards if c.goal_id != offer.goal_id] + [offer]
        self._drop_expired_cards()
        state.cards = state.cards[-CARDS_KEPT:]

    def _reminder_arrived(self, args: Sequence[RawValue]) -> None:
        """A goal's question near its deadline: held (one per question, the newest) until the
        user answers it here or its deadline passes."""
        values, problem = decode_raw(args)
        reminder, problem = (None, problem) if problem else _parse_reminder(values)
        if reminder is None:
            self._refuse(problem or "unreadable question reminder")
            return
        now = workflow.now()
        state = self._state
        kept = [r for r in state.reminders if r.deadline_at > now and (r.goal_id, r.question_id) != _about(reminder)]
        state.reminders = [*kept, reminder][-CARDS_KEPT:]

    def _answered_reminder(self, goal_id: str, question_id: str) -> None:
        self._state.reminders = [r for r in self._state.reminders if _about(r) != (goal_id, question_id)]

    def _held_card(self, say: Say) -> MemoryOffer | None:
        card = say.card
        if card is None or card.question_id != memory_rules.CARD_QUESTION:
            return None
        return next((c for c in self._state.cards if c.goal_id == card.goal_id), None)

    async def _keep(self, say: Say, routing: Routing, offer: MemoryOffer) -> None:
        """The answer to a card the router holds: the memories chosen become semantic
        (through the promote activity the goal's own card uses), and what was kept is recorded."""
        assert say.card is not None
        answer, goal_id, n = say.card.choice, offer.goal_id, len(offer.candidates)
        if answer not in offer.choices:
            raise _Unrouted(f"'{answer[:40]}' does not answer a memory card; one of: {', '.join(offer.choices)}")
        ids, scope = memory_rules.chosen(offer.candidates, answer, say.text, [])
        if answer == "choose" and not ids:
            raise _Unrouted(
                f"choose which to keep by their numbers (1 to {n}), e.g. "
                f'perdure say --card {goal_id}:{memory_rules.CARD_QUESTION}=choose "1 3"'
            )
        now = workflow.now()
        live = {c.id for c in offer.candidates if c.expires_at is None or c.expires_at > now}
        kept = KeptMemories(
            goal_id=goal_id,
            request_id=say.request_id,
            answer=answer,
            scope=scope if ids else None,  # type: ignore[arg-type]
            workspace=offer.workspace,
            not_kept=[i for i in ids if i not in live],
            at=now,
        )
        if any(i in live for i in ids):
            result = await workflow.execute_activity(
                Activities.MEMORY_PROMOTE,
                PromoteInput(
                    goal_id=goal_id, ids=[i for i in ids if i in live], scope=scope, workspace=offer.workspace, at=now
                ),
                result_type=PromoteResult,
                start_to_close_timeout=LOOKUP,
                retry_policy=RETRY,
                summary=f"memory keep {len(ids)} of {goal_id}"[:200],
            )
            kept.promoted, kept.not_kept = result.promoted, kept.not_kept + result.refused
        state = self._state
        state.cards = [c for c in state.cards if c is not offer]
        state.kept = [*state.kept, kept][-KEPT_KEPT:]
        where = f"for project {offer.workspace}" if scope == "project" else "everywhere"
        if kept.promoted:
            reason = f"kept {len(kept.promoted)} of {n} conclusion(s) of goal {goal_id} {where}"
            routing.reply = "kept as: " + ", ".join(kept.promoted.values())
        else:
            reason = f"kept none of {n} conclusion(s) of goal {goal_id}" + (" (skip)" if not ids else "")
        if kept.not_kept:
            reason += f"; not kept (revoked, gone or past their shelf life): {', '.join(kept.not_kept)}"
        self._done(routing, "card", "kept", goal_id, reason)

    def _drop_expired_cards(self) -> None:
        """A card whose memories' shelf life has ended cannot be acted on any more."""
        now = workflow.now()
        self._state.cards = [c for c in self._state.cards if c.expires_at > now]

    def _first_card_end(self) -> datetime | None:
        return min((c.expires_at for c in self._state.cards), default=None)

    # --- bookkeeping ------------------------------------------------------------------

    def _done(self, routing: Routing, by: Any, action: Any, goal_id: str | None, reason: str) -> None:
        routing.status, routing.by, routing.action, routing.goal_id = "routed", by, action, goal_id
        routing.reason = bounded(reason)

    def _charge(self, tokens: int, cost_usd: float) -> None:
        self._state.tokens += tokens
        self._state.cost_usd += cost_usd

    def _find(self, request_id: str) -> Routing | None:
        return next((m for m in reversed(self._state.messages) if m.request_id == request_id), None)

    def _routing(self, request_id: str) -> Routing:
        routing = self._find(request_id)
        assert routing is not None, request_id
        return routing

    def _trim(self) -> None:
        state = self._state
        if len(state.messages) > MESSAGES_KEPT:
            keep = {p.request_id for p in state.pending} | {a.request_id for a in state.asked}
            extra = len(state.messages) - MESSAGES_KEPT
            state.messages = [m for i, m in enumerate(state.messages) if i >= extra or m.request_id in keep]

    def _continue_as_new_due(self) -> bool:
        return self._routed_this_run >= self._input.continue_after or continue_as_new_due()


def _parse_offer(values: list[Any]) -> tuple[MemoryOffer | None, str | None]:
    if len(values) != 1 or not isinstance(values[0], dict):
        return None, f"the '{RouterHandlers.MEMORY_CARD}' signal takes one JSON object (a goal's memory card)"
    try:
        return MemoryOffer.model_validate(values[0]), None
    except ValidationError as err:
        return None, bounded(f"malformed memory card: {describe_validation_error(err)}")


def _parse_reminder(values: list[Any]) -> tuple[QuestionReminder | None, str | None]:
    if len(values) != 1 or not isinstance(values[0], dict):
        return None, f"the '{RouterHandlers.QUESTION_REMINDER}' signal takes one JSON object (a goal's reminder)"
    try:
        return QuestionReminder.model_validate(values[0]), None
    except ValidationError as err:
        return None, bounded(f"malformed question reminder: {describe_validation_error(err)}")


def _about(reminder: QuestionReminder) -> tuple[str, str]:
    return reminder.goal_id, reminder.question_id


def _parse(values: list[Any]) -> tuple[Say | None, str | None]:
    if len(values) != 1:
        got = "no argument" if not values else f"{len(values)} arguments"
        return None, f"the '{RouterHandlers.SAY}' message carries {got}; it takes one JSON object, e.g. {EXAMPLE}"
    raw = values[0]
    if not isinstance(raw, dict):
        return None, f"the '{RouterHandlers.SAY}' message must be a JSON object, e.g. {EXAMPLE}"
    try:
        return Say.model_validate(raw), None
    except ValidationError as err:
        return None, bounded(f"malformed message: {describe_validation_error(err)}")
