"""What a memory must never hold: a secret. Every text is scrubbed before it is stored.

The worker's own secrets are redacted with the scrubber the effect tools use
(activities/tools/credentials.py `redact`): the values of the credentials the config file
declares, of the model profiles' key variables and of the payload keys. Shapes that
are secrets wherever they come from (API keys, tokens, private keys, bearer headers)
are redacted too, since a tool's output may carry someone else's.
"""

from __future__ import annotations

import os
import re

from perdure.activities.tools.credentials import REDACTED, declared, redact

# Secrets shorter than this are not looked for: a short value would redact ordinary words.
MIN_SECRET_CHARS = 8
KEY_VARIABLES = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
SECRET_SHAPES = [
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.DOTALL),
    re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"(?i)\b(bearer|token|api[_-]?key|password|secret)(\s*[:=]\s*|\s+)['\"]?[A-Za-z0-9._~+/=-]{12,}"),
]


def worker_secrets() -> list[str]:
    """The secret values this machine's environment holds for perdure (read, never logged)."""
    names = set(KEY_VARIABLES)
    try:
        names |= {credential.env or name for name, credential in declared().items()}
    except Exception:  # noqa: BLE001 - an unreadable [credentials] table leaves the shapes to catch keys
        pass
    try:
        from perdure.activities.models.profiles import load_model_config

        names |= {p.api_key_env for p in load_model_config().profiles.values() if p.api_key_env}
    except Exception:  # noqa: BLE001 - an unreadable profile file is the worker's problem, not memory's
        pass
    values = [os.environ.get(name, "").strip() for name in names]
    for key in os.environ.get("PERDURE_PAYLOAD_KEYS", "").split(","):
        values.append(key.partition(":")[2].strip())
    return sorted({v for v in values if len(v) >= MIN_SECRET_CHARS}, key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> tuple[str, int]:
    """The text with every secret redacted, and how many were."""
    count = sum(text.count(s) for s in secrets if s)
    text = redact(text, secrets)
    for shape in SECRET_SHAPES:
        text, found = shape.subn(_keep_label, text)
        count += found
    return text, count


def _keep_label(match: re.Match) -> str:
    # `token: abc…` keeps its label so the memory still reads: `token: [redacted]`.
    if match.re is SECRET_SHAPES[-1]:
        return f"{match.group(1)}{match.group(2)}{REDACTED}"
    return REDACTED
