"""Model profiles: which provider, model, endpoint and price a profile name means.

Owns the profile table (built-in profiles plus `[profiles.NAME]` tables from the
TOML config file) and resolving a name, including `default`, which follows the
environment of the worker. A table loaded with `watch=True` (the worker's) reads the
file again when its modification time or size has changed, checked as a name is
resolved, so a profile added to config.toml is used without restarting the worker; a
file that no longer parses leaves the last good table in use and says why.
Workflows carry only a profile *name*; this module stores the *name* of the
environment variable that holds a key and must never read, store or log the key
itself (providers read it at call time).
"""

from __future__ import annotations

import os
import threading
import tomllib
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from perdure.runtime.settings import config_path
from perdure.workflows.goal.contracts.plan import describe_validation_error
from perdure.workflows.quota.quota_workflow import QuotaLimits

log = structlog.get_logger(__name__)

DEFAULT_SCRIPT = Path(__file__).parent / "scripts" / "demo.yaml"
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"
# The shortest interval at which a streamed reply's text may be sent to its goal.
MIN_LIVE_EVERY_S = 0.2
DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-4-5"

# USD per million tokens (input, output), list prices. A built-in profile whose
# model is not listed falls back to its provider's default model, so a budget
# over-counts rather than silently counting zero; set prices in config.toml.
LIST_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "claude-sonnet-4-5": (3.00, 15.00),
    "claude-haiku-4-5": (1.00, 5.00),
    "claude-opus-4-1": (15.00, 75.00),
}

# Tokens of prompt and reply together each listed model takes (its context window), from the
# providers' model pages. A profile's `context_window` overrides it, and is how a model not
# listed gets one; a profile with neither is sent whatever it is given.
CONTEXT_WINDOWS: dict[str, int] = {
    "gpt-4o-mini": 128_000,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "claude-sonnet-4-5": 200_000,
    "claude-haiku-4-5": 200_000,
    "claude-opus-4-1": 200_000,
}

# Which credentials make `default` mean a built-in provider, in order of preference.
PROVIDER_ENV: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
    "anthropic": ("ANTHROPIC_API_KEY",),
}


class UnknownModelProfile(LookupError):
    """No profile has this name; the message lists the known names."""


class ModelConfigInvalid(ValueError):
    """The config file cannot be read as model profiles."""


class ModelProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    provider: Literal["openai", "anthropic", "scripted"]
    model: str
    base_url: str | None = None
    api_key_env: str | None = Field(default=None, description="NAME of the env var holding the key, never the key.")
    price_input_per_mtok: float = Field(default=0.0, ge=0)
    price_output_per_mtok: float = Field(default=0.0, ge=0)
    max_output_tokens: int = Field(default=2048, ge=1)
    context_window: int | None = Field(
        default=None,
        gt=0,
        description="Tokens of prompt and reply the model takes; default: the built-in table's for a listed "
        "model (CONTEXT_WINDOWS). A call that cannot fit is compacted or refused before it is sent.",
    )
    timeout_s: float = Field(
        default=120,
        gt=0,
        description="How long the provider may take to accept a request (connect, send). The wait for the reply "
        "is not this: it lasts as long as the activity's attempt (activities/models/timeouts.py).",
    )
    mode: Literal["sync", "background"] = Field(
        default="sync",
        description="sync: one request waits for the reply. background: the call is submitted and its handle "
        "polled (OpenAI: the Responses API with background=true; Anthropic: a Message Batch), so a worker "
        "that dies resumes the same call and it is paid once.",
    )
    background_min_output_tokens: int = Field(
        default=0,
        ge=0,
        description="mode = background: only calls that may write at least this many tokens go background "
        "(long replies); shorter ones stay sync. 0: every call.",
    )
    poll_interval_s: float = Field(default=2.0, gt=0, le=300, description="mode = background: time between polls.")
    stream: bool = Field(
        default=True,
        description="mode = sync: read the reply as the provider streams it, so its text is shown live while it "
        "is written (`perdure ui`). false: one request, one JSON reply (for servers that cannot stream).",
    )
    live_every_s: float = Field(
        default=1.0,
        ge=0,
        le=10,
        description="How often a streamed reply's new text is sent to the goal's event stream (each send adds "
        "about four events to the goal's history; a reply done sooner sends none). 0: never.",
    )
    script: str | None = Field(default=None, description="Scripted profiles only: path of the script file.")
    quota: str | None = Field(
        default=None,
        description="The `[quotas.NAME]` its calls draw on (profiles sharing one API key share one); "
        "default: the quota named like the profile, if any.",
    )

    @field_validator("live_every_s")
    @classmethod
    def _live_not_per_chunk(cls, value: float) -> float:
        if 0 < value < MIN_LIVE_EVERY_S:
            raise ValueError(f"must be 0 (off) or at least {MIN_LIVE_EVERY_S} s: each send adds history events")
        return value

    def background_for(self, max_output_tokens: int) -> bool:
        """Whether a call allowed `max_output_tokens` goes by handle."""
        return self.mode == "background" and max_output_tokens >= self.background_min_output_tokens

    def window(self) -> int | None:
        """The model's context window in tokens, when it is known (see `context_window`)."""
        return self.context_window or CONTEXT_WINDOWS.get(self.model)

    def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.price_input_per_mtok + output_tokens * self.price_output_per_mtok) / 1e6


class ModelConfig(BaseModel):
    profiles: dict[str, ModelProfile]
    quotas: dict[str, QuotaLimits] = Field(
        default_factory=dict,
        description="External resources' quotas, enforced across goals (workflows/quota/quota_workflow.py).",
    )
    _source: Path | None = PrivateAttr(default=None)
    _stamp: tuple[int, int] | None = PrivateAttr(default=None)
    _problem: str | None = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def problem(self) -> str | None:
        """Why the watched file's latest version is not in use (it does not parse), else None."""
        return self._problem

    def refresh(self) -> None:
        """Reload a watched file that changed since it was read; keep the last good table if it is invalid."""
        if self._source is None:
            return
        stamp = _stamp_of(self._source)
        if stamp == self._stamp:
            return
        with self._lock:
            if stamp == self._stamp:
                return
            try:
                fresh = load_model_config(self._source)
            except ModelConfigInvalid as err:
                if self._problem != str(err):
                    log.warning("model profiles not reloaded", problem=str(err))
                self._problem = str(err)
            else:
                self.profiles, self.quotas = fresh.profiles, fresh.quotas
                self._problem = None
                log.info("model profiles reloaded", path=str(self._source), profiles=sorted(self.profiles))
            self._stamp = stamp

    def resolve(self, name: str) -> ModelProfile:
        self.refresh()
        if name in self.profiles:
            return self.profiles[name]
        if name == "default":
            meant = default_provider_from_env()
            if meant in self.profiles:
                return self.profiles[meant]
            known = ", ".join(sorted(self.profiles)) or "none"
            raise UnknownModelProfile(
                f"profile 'default' means '{meant}' here (judged by which model keys are set), which this "
                f"worker's configuration does not define; known profiles: {known}"
            )
        known = ", ".join(sorted({*self.profiles, "default"}))
        raise UnknownModelProfile(f"unknown model profile '{name}'; known profiles: {known}")


def default_provider_from_env() -> str:
    """Which built-in profile `default` means in this environment, judged by which credentials exist."""
    for provider, names in PROVIDER_ENV.items():
        if any(os.environ.get(name) for name in names):
            return provider
    return "scripted"


def builtin_profiles() -> dict[str, ModelProfile]:
    openai_model = os.environ.get("PERDURE_OPENAI_MODEL") or DEFAULT_OPENAI_MODEL
    anthropic_model = os.environ.get("PERDURE_ANTHROPIC_MODEL") or DEFAULT_ANTHROPIC_MODEL
    openai_in, openai_out = LIST_PRICES.get(openai_model, LIST_PRICES[DEFAULT_OPENAI_MODEL])
    anthropic_in, anthropic_out = LIST_PRICES.get(anthropic_model, LIST_PRICES[DEFAULT_ANTHROPIC_MODEL])
    return {
        "scripted": ModelProfile(
            name="scripted",
            provider="scripted",
            model="scripted",
            script=os.environ.get("PERDURE_SCRIPT") or str(DEFAULT_SCRIPT),
        ),
        "openai": ModelProfile(
            name="openai",
            provider="openai",
            model=openai_model,
            base_url=os.environ.get("OPENAI_BASE_URL") or None,
            api_key_env="OPENAI_API_KEY",
            price_input_per_mtok=openai_in,
            price_output_per_mtok=openai_out,
        ),
        "anthropic": ModelProfile(
            name="anthropic",
            provider="anthropic",
            model=anthropic_model,
            api_key_env="ANTHROPIC_API_KEY",
            price_input_per_mtok=anthropic_in,
            price_output_per_mtok=anthropic_out,
        ),
    }


def _stamp_of(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def load_model_config(path: Path | None = None, watch: bool = False) -> ModelConfig:
    """Built-in profiles, overlaid by `[profiles.NAME]` tables of the TOML file when it exists.

    A table named like a built-in profile overrides only the fields it sets.
    A relative `script` path is taken relative to the config file. With `watch`,
    the table follows later changes of the file (`ModelConfig.refresh`).
    """
    path = path or config_path()
    if watch:
        stamp = _stamp_of(path)
        config = load_model_config(path)
        config._source, config._stamp = path, stamp
        return config
    profiles = builtin_profiles()
    if not path.is_file():
        return ModelConfig(profiles=profiles)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ModelConfigInvalid(f"cannot read model profiles from {path}: {err}") from None
    tables = data.get("profiles", {})
    if not isinstance(tables, dict):
        raise ModelConfigInvalid(f"{path}: 'profiles' must be a table of [profiles.NAME] tables")
    for name, table in tables.items():
        profiles[name] = _profile_from_table(path, name, table, profiles.get(name))
    return ModelConfig(profiles=profiles, quotas=_quotas_from(path, data.get("quotas", {})))


def _quotas_from(path: Path, tables: Any) -> dict[str, QuotaLimits]:
    """`[quotas.NAME]` tables: requests_per_minute, tokens_per_minute (and spacing)."""
    if not isinstance(tables, dict):
        raise ModelConfigInvalid(f"{path}: 'quotas' must be a table of [quotas.NAME] tables")
    quotas = {}
    for name, table in tables.items():
        try:
            quotas[name] = QuotaLimits.model_validate(table)
        except ValidationError as err:
            raise ModelConfigInvalid(f"{path}: [quotas.{name}] is invalid: {describe_validation_error(err)}") from None
    return quotas


def _profile_from_table(path: Path, name: str, table: Any, base: ModelProfile | None) -> ModelProfile:
    if not isinstance(table, dict):
        raise ModelConfigInvalid(f"{path}: [profiles.{name}] must be a table")
    fields = (base.model_dump() if base else {}) | table | {"name": name}
    if fields.get("script") and "script" in table:
        script = Path(fields["script"]).expanduser()
        fields["script"] = str(script if script.is_absolute() else path.parent / script)
    try:
        return ModelProfile.model_validate(fields)
    except ValidationError as err:
        raise ModelConfigInvalid(f"{path}: [profiles.{name}] is invalid: {describe_validation_error(err)}") from None
