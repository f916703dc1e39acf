"""`perdure.tool` declarations on their own (issue 36, part 1): what a contradictory one
raises, naming the tool; what loading modules and entry points refuses, in one line; the
effect key and compensation a declaration makes; and a tool run by the tool activity as a
worker runs it (Temporal's activity test environment), its cost on the result."""

from __future__ import annotations

import asyncio
import dataclasses
import textwrap
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel, ConfigDict
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import perdure
from perdure.activities.artifacts import DiskArtifactStore
from perdure.activities.tools.run_tool import ToolActivities
from perdure.activities.tools.user.tool_modules import ToolLoadError, configured_modules, load_toolbox
from perdure.activities.tools.user.toolbox import Toolbox
from perdure.workflows.shared.contracts import ToolInput
from perdure.workflows.shared.effects import done_details
from perdure.workflows.shared.user_tools import UserToolCatalogueInput
from tests import usertool_sample


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")

    account: str
    amount: int
    note: str = ""


async def find_it(args: Args, call: perdure.ToolCall) -> dict | None:
    return None


def declared(**options):
    def send(args: Args, call: perdure.ToolCall) -> str:
        """Send something somewhere."""
        return "sent"

    return perdure.tool(**options)(send)


CONTRADICTIONS = {
    "is irreversible but its replay is `safe`": dict(risk="irreversible", replay="safe"),
    "is remote-write: declare its replay policy": dict(risk="remote-write"),
    "replays `check` but has no lookup": dict(risk="remote-write", replay="check"),
    "has a lookup but replays `keyed`": dict(risk="remote-write", replay="keyed", lookup=lambda args: None),
    "is read but replays `keyed`": dict(replay="keyed"),
    "is read but declares key_fields, compensation": dict(key_fields=["account"], compensation="undo_it"),
    "key_fields names owner, not fields of Args": dict(risk="remote-write", replay="keyed", key_fields=["owner"]),
    "its target names {owner}, not a field of Args": dict(risk="remote-write", replay="keyed", target="x:{owner}"),
    "gives `effect` and also target/action/key_fields": dict(
        risk="remote-write", replay="keyed", target="x", effect=lambda args: ("x", "y", {})
    ),
    "heartbeat_s (60) must be shorter than timeout_s (30)": dict(risk="read", heartbeat_s=60, timeout_s=30),
    "names itself as its compensation": dict(risk="remote-write", replay="keyed", compensation="send"),
    "is the name of a built-in tool": dict(name="read_file"),
    "risk 'dangerous' is not one of read": dict(risk="dangerous"),
    "max_cost_usd must be a finite number of USD >= 0, got nan": dict(max_cost_usd=float("nan")),
    "max_cost_usd must be a finite number of USD >= 0, got inf": dict(max_cost_usd=float("inf")),
    "replays `once` but is a plain function: a thread cannot be stopped": dict(risk="remote-write", replay="once"),
    "replays `check` but is a plain function": dict(risk="remote-write", replay="check", lookup=find_it),
    "its lookup is a lambda: give a function annotated like the tool's, def find(args: Args, call: perdure.ToolCall)": (
        dict(risk="remote-write", replay="check", lookup=lambda args, call: None)
    ),
    "secrets is a list of environment variable names": dict(secrets="PAYMENTS_KEY"),
}


@pytest.mark.parametrize("expected", sorted(CONTRADICTIONS))
def test_a_contradictory_declaration_raises_naming_the_tool(expected: str) -> None:
    with pytest.raises(perdure.ToolDeclarationError) as raised:
        declared(**CONTRADICTIONS[expected])
    assert expected in str(raised.value)
    assert str(raised.value).startswith(f"tool {CONTRADICTIONS[expected].get('name', 'send')}: ")


def test_a_function_without_an_argument_model_or_description_is_refused() -> None:
    def untyped(args: dict) -> str:
        """Take a dict."""
        return ""

    def undocumented(args: Args) -> str:
        return ""

    def stray(args: Args, retries: int) -> str:
        """Take something else too."""
        return ""

    with pytest.raises(perdure.ToolDeclarationError, match="tool untyped: its function takes `args`, which is"):
        perdure.tool(untyped)
    with pytest.raises(perdure.ToolDeclarationError, match="tool undocumented: has no description"):
        perdure.tool(undocumented)
    with pytest.raises(perdure.ToolDeclarationError, match="tool stray: its function takes `retries`"):
        perdure.tool(stray)


async def test_a_tool_call_parameter_that_may_be_none_is_passed_the_call() -> None:
    def priced(args: Args, call: perdure.ToolCall | None = None) -> str:
        """Price something."""
        if call is not None:
            call.cost(0.5)
        return "priced"

    tool = perdure.tool(priced)
    assert tool.signature.call_name == "call"
    call = perdure.ToolCall()
    assert await tool.signature.invoke(tool.fn, Args(account="a", amount=1), call) == "priced"
    assert call.cost_usd == 0.5


def test_the_effect_key_is_made_from_the_declared_fields_and_the_compensation_carries_an_undo() -> None:
    tool = declared(risk="remote-write", replay="keyed", target="ledger:{account}", key_fields=["account", "amount"])
    effect = tool.effect(Args(account="acme", amount=3, note="a"))
    assert effect == ("ledger:acme", "send", {"account": "acme", "amount": 3})
    # The note is not part of the payload: the same effect whatever it says.
    assert tool.effect(Args(account="acme", amount=3, note="b")) == effect
    assert tool.undo("fx-" + "1" * 32, Args(account="acme", amount=3)) is None
    paying = usertool_sample.charge
    undo = paying.undo("fx-" + "1" * 32, usertool_sample.ChargeArgs(amount_cents=5, recipient="x"))
    assert undo is not None and undo.tool == "refund_charge"
    assert perdure.Undo.model_validate(undo.args).args == {"amount_cents": 5, "recipient": "x", "memo": ""}


def test_a_tool_is_still_its_function_and_a_call_object_tests_it() -> None:
    call = perdure.ToolCall(idempotency_key="fx-" + "2" * 32)
    assert usertool_sample.quote(usertool_sample.QuoteArgs(amount_cents=10), call) == {
        "amount_cents": 10,
        "fee_usd": usertool_sample.CHARGE_FEE_USD,
    }
    assert call.cost_usd == usertool_sample.QUOTE_FEE_USD
    with pytest.raises(ValueError, match="a tool's cost is a finite number of USD >= 0"):
        call.cost(-1)


# --- loading -------------------------------------------------------------------------


def module(tmp_path: Path, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text("import perdure\nfrom pydantic import BaseModel\n" + textwrap.dedent(body))
    return name


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return lambda name, body: module(tmp_path, name, body)


UNDO_TOOL = """
@perdure.tool(risk="remote-write", replay="keyed")
def cancel(args: perdure.Undo) -> str:
    '''Cancel an order.'''
    return "cancelled"
"""

ORDER_TOOL = """
class Order(BaseModel):
    item: str

@perdure.tool(risk="remote-write", replay="keyed", compensation="{compensation}")
def order(args: Order, call: perdure.ToolCall) -> str:
    '''Order an item.'''
    return "ordered"
"""


def test_loading_checks_compensations_across_modules(modules) -> None:
    modules("ut_cancel", UNDO_TOOL)
    modules("ut_order", ORDER_TOOL.format(compensation="cancel"))
    box = load_toolbox(["ut_order", "ut_cancel"], with_entry_points=False)
    assert sorted(box.declarations) == ["cancel", "order"]
    assert [o.compensation for o in box.offers()] == [None, "cancel"]

    modules("ut_order_alone", ORDER_TOOL.format(compensation="cancel"))
    with pytest.raises(ToolLoadError) as alone:
        load_toolbox(["ut_order_alone"], with_entry_points=False)
    assert str(alone.value) == (
        "tool order (module ut_order_alone): its compensation names cancel, which is not loaded (tools loaded: order)"
    )

    modules("ut_order_read", ORDER_TOOL.format(compensation="look"))
    modules("ut_look", "@perdure.tool\ndef look(args: perdure.Undo) -> str:\n    '''Look.'''\n    return ''\n")
    with pytest.raises(ToolLoadError, match="its compensation look is read with replay `safe`: a compensation is"):
        load_toolbox(["ut_order_read", "ut_look"], with_entry_points=False)

    modules("ut_order_wrong", ORDER_TOOL.format(compensation="wrong"))
    modules(
        "ut_wrong",
        "class W(BaseModel):\n    order_id: str\n\n"
        "@perdure.tool(risk='remote-write', replay='keyed')\ndef wrong(args: W) -> str:\n    '''W.'''\n    return ''\n",
    )
    with pytest.raises(ToolLoadError, match="its compensation wrong does not take perdure.Undo as its arguments"):
        load_toolbox(["ut_order_wrong", "ut_wrong"], with_entry_points=False)


def test_a_tool_for_devices_whose_compensation_is_not_is_refused_at_load_naming_both(modules) -> None:
    modules("ut_cancel_here", UNDO_TOOL)
    modules(
        "ut_order_there",
        ORDER_TOOL.format(compensation="cancel").replace('replay="keyed",', 'replay="keyed", devices=True,'),
    )
    with pytest.raises(ToolLoadError) as raised:
        load_toolbox(["ut_order_there", "ut_cancel_here"], with_entry_points=False)
    assert str(raised.value) == (
        "tool order (module ut_order_there): is declared for devices but its compensation cancel is not: a rollback "
        "undoes an effect where it was made, so declare cancel devices=True too"
    )


def test_the_catalogue_a_goal_gets_lists_the_compensations_of_the_tools_it_names() -> None:
    box = load_toolbox(["tests.usertool_sample"], with_entry_points=False)
    catalogue = asyncio.run(box.catalogue(UserToolCatalogueInput(names=["charge", "quote", "chrage"])))
    # refund_charge is not named, but a rollback of a charge runs it by its own declaration.
    assert sorted(catalogue.tools) == ["charge", "quote", "refund_charge"]
    assert catalogue.tools["refund_charge"].start_to_close_s == usertool_sample.REFUND_TIMEOUT_S


def test_loading_refuses_in_one_line_what_cannot_be_used(modules, tmp_path: Path) -> None:
    modules("ut_broken", "raise RuntimeError('no credentials file')\n")
    modules("ut_exits", "import sys\nsys.exit('set PAY_KEY first')\n")
    modules("ut_empty", "X = 1\n")
    modules(
        "ut_contradiction",
        "@perdure.tool(risk='irreversible', replay='safe')\ndef pay(args: perdure.Undo):\n  '''P.'''\n",
    )
    modules("ut_twice", UNDO_TOOL)
    cases = {
        "ut_missing": "cannot import tool module ut_missing: no module named ut_missing",
        "ut_broken": "tool module ut_broken failed to import: RuntimeError: no credentials file",
        "ut_exits": "tool module ut_exits exited while it was imported (SystemExit: set PAY_KEY first)",
        "ut_empty": "tool module ut_empty declares no tool (decorate a function with @perdure.tool)",
        "ut_contradiction": "tool module ut_contradiction: tool pay: is irreversible but its replay is `safe`",
    }
    for name, said in cases.items():
        with pytest.raises(ToolLoadError) as raised:
            load_toolbox([name], with_entry_points=False)
        assert str(raised.value).startswith(said), str(raised.value)
        assert "\n" not in str(raised.value)
    modules("ut_cancel_again", UNDO_TOOL)
    with pytest.raises(
        ToolLoadError, match="tool cancel is declared twice: in module ut_twice and in module ut_cancel"
    ):
        load_toolbox(["ut_twice", "ut_cancel_again"], with_entry_points=False)

    config = tmp_path / "config.toml"
    config.write_text('tool_modules = ["ut_twice"]\n[profiles.x]\nprovider = "openai"\nmodel = "m"\n')
    assert configured_modules(config) == ["ut_twice"]
    config.write_text('tool_modules = "ut_twice"\n')
    with pytest.raises(ToolLoadError, match="tool_modules must be a list of module names"):
        configured_modules(config)


def test_an_installed_distribution_offers_its_tools_through_the_entry_point_group(modules, tmp_path: Path) -> None:
    modules("ut_shop", UNDO_TOOL)
    dist = tmp_path / "ut_shop-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ut-shop\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[perdure.tools]\nshop = ut_shop\n")
    box = load_toolbox([])
    assert "cancel" in box.declarations and "ut_shop" in box.sources

    (dist / "entry_points.txt").write_text("[perdure.tools]\nshop = ut_shop_gone\n")
    with pytest.raises(ToolLoadError) as raised:
        load_toolbox([])
    assert str(raised.value).startswith("entry point shop = ut_shop_gone (distribution ut-shop) failed to load:")


# --- run as a worker runs it ---------------------------------------------------------------


async def test_the_worker_prepares_and_sends_a_user_write_under_one_key_and_reports_its_cost(
    tmp_path: Path, payments_env
) -> None:
    box = load_toolbox(["tests.usertool_sample"], with_entry_points=False)
    acts = ToolActivities(DiskArtifactStore(tmp_path / "store"), user_tools=box.implementations())
    call = ToolInput(goal_id="g-1", node_key="node:1", tool="charge", workspace=str(tmp_path), args=payments_env[1])
    prepared = await ActivityEnvironment().run(acts.prepare_effect, call)
    assert prepared.error is None and prepared.compensation is not None
    assert prepared.compensation.tool == "refund_charge"
    assert prepared.compensation.args["effect_key"] == prepared.effect_key

    result = await ActivityEnvironment().run(acts.run_tool, call)
    assert result.ok and result.effect_key == prepared.effect_key
    assert result.cost_usd == usertool_sample.CHARGE_FEE_USD and result.receipt["cost_usd"] == result.cost_usd
    [payment] = payments_env[0].ledger()
    assert payment["idempotency_key"] == prepared.effect_key

    # An unconfirmed irreversible call is refused by the activity too, and nothing is sent.
    wired = await ActivityEnvironment().run(acts.run_tool, call.model_copy(update={"tool": "wire"}))
    assert not wired.ok and "needs a human confirmation" in (wired.error or "")
    assert len(payments_env[0].ledger()) == 1


@pytest.fixture
def payments_env(fake_service):
    from perdure.testing.fakes import PAYMENTS_KEY, PaymentsAPI

    return fake_service(PaymentsAPI, api_key=PAYMENTS_KEY), {"amount_cents": 700, "recipient": "ACME GmbH"}


def activity_env(attempt: int = 1, details: list | None = None, attempts: int = 6) -> ActivityEnvironment:
    """The test environment as attempt `attempt` of `attempts`, after a beat of `details`."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        attempt=attempt,
        heartbeat_details=details or [],
        retry_policy=RetryPolicy(maximum_attempts=attempts),
    )
    return env


async def test_an_attempt_that_reuses_a_lost_answers_receipt_charges_the_cost_on_it(tmp_path: Path, payments_env):
    """A keyed charge whose worker was lost after its `done` heartbeat: the next attempt
    sends nothing and charges the fee its receipt carries."""
    payments, args = payments_env
    box = load_toolbox(["tests.usertool_sample"], with_entry_points=False)
    acts = ToolActivities(DiskArtifactStore(tmp_path / "store"), user_tools=box.implementations())
    call = ToolInput(goal_id="g-2", node_key="node:1", tool="charge", workspace=str(tmp_path), args=args)
    first = await activity_env().run(acts.run_tool, call)
    assert first.ok and first.receipt is not None

    again = await activity_env(2, [done_details(first.effect_key, first.receipt)]).run(acts.run_tool, call)
    assert again.ok and "an earlier attempt's receipt" in again.receipt["confirmed_by"]
    assert again.cost_usd == usertool_sample.CHARGE_FEE_USD
    assert len(payments.ledger()) == 1 and payments.requests == 1  # not sent again


class Entry(BaseModel):
    ref: str


async def test_a_tool_this_worker_declares_once_is_not_sent_from_a_local_activity(tmp_path: Path):
    """The goal planned with `post_entry` keyed and placed its call in a local activity; this
    worker declares it `once`. A local activity's attempts restart at 1 on another worker,
    so a once call there could be sent twice: it is answered uncertain, nothing sent."""
    sent: list[str] = []

    def declared(replay: str):
        @perdure.tool(risk="remote-write", replay=replay)
        async def post_entry(args: Entry, call: perdure.ToolCall) -> str:
            """Post a ledger entry."""
            sent.append(args.ref)
            return "posted"

        return ToolActivities(DiskArtifactStore(tmp_path / replay), user_tools=Toolbox([post_entry]).implementations())

    def local() -> ActivityEnvironment:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, is_local=True)
        return env

    call = ToolInput(goal_id="g-4", node_key="n", tool="post_entry", workspace=str(tmp_path), args={"ref": "a"})
    refused = await local().run(declared("once").run_tool, call)
    assert not refused.ok and refused.uncertain and sent == []
    assert "declared remote-write, replay once on this worker" in (refused.error or "")
    # A person said it happened: recorded, still not sent.
    settled = await local().run(declared("once").run_tool, call.model_copy(update={"resolution": "happened"}))
    assert settled.ok and sent == []
    # The same declaration as an activity, and a keyed one as a local activity, are sent.
    assert (await ActivityEnvironment().run(declared("once").run_tool, call)).ok and sent == ["a"]
    assert (await local().run(declared("keyed").run_tool, call)).ok and sent == ["a", "a"]


class Rates(BaseModel):
    currency: str


async def test_a_write_failing_with_its_secret_in_the_error_is_redacted_and_carries_no_cause(
    tmp_path: Path, fake_service, monkeypatch: pytest.MonkeyPatch
):
    """An httpx error names the URL, key and all. What reaches the result, the failure and its
    cause chain (history) says [redacted] instead of the declared secret's value."""
    from perdure.testing.fakes import QUOTES_KEY, QuotesAPI

    quotes = fake_service(QuotesAPI, api_key=QUOTES_KEY, rates_failures=100)
    monkeypatch.setenv("QUOTES_KEY_FOR_TEST", QUOTES_KEY)

    @perdure.tool(risk="remote-write", replay="keyed", secrets=["QUOTES_KEY_FOR_TEST"])
    async def lock_rate(args: Rates, call: perdure.ToolCall) -> str:
        """Lock today's rate."""
        async with httpx.AsyncClient() as http:
            (await http.get(f"{quotes.base_url}/rates", params={"key": QUOTES_KEY})).raise_for_status()
        return "locked"

    acts = ToolActivities(DiskArtifactStore(tmp_path / "store"), user_tools=Toolbox([lock_rate]).implementations())
    call = ToolInput(goal_id="g-3", node_key="n", tool="lock_rate", workspace=str(tmp_path), args={"currency": "EUR"})
    with pytest.raises(ApplicationError) as raised:
        await activity_env(1, attempts=6).run(acts.run_tool, call)
    chain, err = [], raised.value
    while err is not None:
        chain.append(f"{type(err).__name__}: {err}")
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
    assert "503 Service Unavailable" in chain[0] and "[redacted]" in chain[0]
    assert QUOTES_KEY not in "\n".join(chain), chain

    last = await activity_env(6, attempts=6).run(acts.run_tool, call)
    assert last.uncertain and "[redacted]" in (last.error or "") and QUOTES_KEY not in (last.error or "")
