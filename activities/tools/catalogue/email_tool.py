"""send_email: one plain-text email through the mail API configured on the worker
(PERDURE_MAIL_URL, PERDURE_MAIL_KEY, PERDURE_MAIL_FROM, read at call time).

A `keyed` remote write: the effect key goes out as the Idempotency-Key header and as the
Message-ID, so the mail API and any mail client see one message however often it is sent.
"""

from __future__ import annotations

from pydantic import Field

from perdure.activities.tools.catalogue.tool_base import EffectCall, EffectTool, how_confirmed
from perdure.activities.tools.catalogue.tool_errors import OutcomeUnknown
from perdure.workflows.shared.tool_specs import REMOTE_TIMEOUTS, Effect, ToolArgs, ToolSpec

EMAIL = r"^[^@\s<>,;]+@[^@\s<>,;]+$"
DEFAULT_MAIL_FROM = "perdure <perdure@localhost>"


class SendEmailArgs(ToolArgs):
    to: str = Field(pattern=EMAIL, max_length=320, description="One recipient address.")
    subject: str = Field(min_length=1, max_length=998)
    body: str = Field(description="Plain-text body.")


class SendEmail(EffectTool):
    spec = ToolSpec(
        name="send_email",
        risk="remote-write",
        replay="keyed",
        description="Send one plain-text email through the mail API configured on the worker.",
        args_model=SendEmailArgs,
        **REMOTE_TIMEOUTS,
    )
    example = {"to": "ada@example.com", "subject": "Weekly report", "body": "All green."}

    def effect(self, args: SendEmailArgs, workspace: str) -> Effect:
        return Effect(f"mailto:{args.to}", "send", args.model_dump(mode="json"))

    def target(self, args: SendEmailArgs) -> str:
        return args.to

    async def send(self, call: EffectCall, args: SendEmailArgs) -> dict:
        from perdure.activities.tools import http_calls as http

        base = http.service_url(call.tool, "PERDURE_MAIL_URL", "mail")
        sender = http.setting("PERDURE_MAIL_FROM") or DEFAULT_MAIL_FROM
        domain = sender.rstrip(">").rpartition("@")[2] or "perdure.invalid"
        message = {
            "from": sender,
            "to": [args.to],
            "subject": args.subject,
            "text": args.body,
            # The key as Message-ID too: a mail server or client that sees it twice knows it is one message.
            "headers": {"Message-ID": f"<{call.key}@{domain}>"},
        }
        headers = {"Idempotency-Key": call.key, **http.bearer("PERDURE_MAIL_KEY")}
        response = await http.http_call("POST", f"{base}/emails", body=message, headers=headers)
        http.check_status(response, "the mail API")
        reply = http.json_reply(response, "the mail API")
        if not isinstance(reply, dict) or not reply.get("id"):
            raise OutcomeUnknown(f"the mail API accepted the message but returned no id: {http.excerpt(response)}")
        return {"message_id": str(reply["id"]), "to": args.to, **http.replayed(response)}

    def describe(self, call: EffectCall, args: SendEmailArgs, receipt: dict) -> str:
        return f"sent '{args.subject}' to {args.to} (message id {receipt.get('message_id')}{how_confirmed(receipt)})"


DECLARED = (SendEmail(),)
