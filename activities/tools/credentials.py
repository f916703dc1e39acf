"""Credentials that tools need, resolved on the worker by name.

A plan step or an agent's call names a credential (`auth: GITHUB_TOKEN`); it never
carries the secret, so no plan, workflow input, activity input or history holds it.
The worker's operator declares which credentials exist and where each may be sent,
in the `[credentials]` table of the config file (perdure.runtime.settings.config_path):

    [credentials.GITHUB_TOKEN]
    hosts = ["api.github.com"]      # the only hosts it is sent to
    header = "Authorization"        # default
    scheme = "Bearer"               # default; "" sends the bare value

The secret is the worker's environment variable of that name (or `env = "OTHER"`).
A name that is not declared, a host that is not listed, or an unset variable is a
tool error that says which, so a model cannot send a worker's key anywhere it likes.
Whatever a service answers is redacted of the secrets sent before it reaches a
result, an error or the artifact store.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perdure.activities.tools.catalogue.tool_errors import NotSent, OutcomeUnknown, ToolError
from perdure.runtime import settings

REDACTED = "[redacted]"


class Credential(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hosts: list[str] = Field(min_length=1, description="Hosts (exact, lower-case) the credential may be sent to.")
    header: str = Field(default="Authorization", pattern=r"^[A-Za-z0-9-]{1,64}$")
    scheme: str = Field(default="Bearer", max_length=32)
    env: str | None = Field(default=None, pattern=r"^[A-Z][A-Z0-9_]{0,63}$", description="Default: the name.")


def declared(path: Path | None = None) -> dict[str, Credential]:
    """The credentials the config file declares (none when there is no file or table)."""
    path = path or settings.config_path()
    if not path.is_file():
        return {}
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8")).get("credentials", {})
        return {name: Credential.model_validate(entry) for name, entry in table.items()}
    except (OSError, tomllib.TOMLDecodeError, ValidationError, AttributeError) as err:
        raise ToolError(f"the [credentials] table of {path} cannot be read: {err}") from None


def header_for(name: str, url: str, path: Path | None = None) -> tuple[dict[str, str], str]:
    """The header that carries credential `name` to `url`, and the secret (to redact)."""
    credentials = declared(path)
    credential = credentials.get(name)
    if credential is None:
        known = ", ".join(sorted(credentials)) or "none"
        raise ToolError(
            f"no credential '{name}' is declared on this worker (declared: {known}); the operator adds it to "
            "the [credentials] table of the config file with the hosts it may be sent to"
        )
    host = (urlsplit(url).hostname or "").lower()
    if host not in {h.lower() for h in credential.hosts}:
        hosts = ", ".join(credential.hosts)
        raise ToolError(f"credential '{name}' may not be sent to {host or url} (its hosts: {hosts})")
    secret = os.environ.get(credential.env or name, "").strip()
    if not secret:
        raise ToolError(f"credential '{name}' is declared but ${credential.env or name} is not set on this worker")
    value = f"{credential.scheme} {secret}" if credential.scheme else secret
    return {credential.header: value}, secret


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def redacted(err: ToolError | NotSent | OutcomeUnknown, secrets: list[str]) -> ToolError | NotSent | OutcomeUnknown:
    """The same error with the secrets taken out of its message (and a ToolError's output);
    raise it `from None`, so the original does not travel as its cause."""
    message = redact(str(err.args[0]) if err.args else "", secrets)
    if isinstance(err, ToolError):
        return ToolError(message, output=redact(err.output, secrets) if err.output is not None else None)
    return type(err)(message, retry_after_s=err.retry_after_s)
