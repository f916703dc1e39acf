"""Model profiles: built-ins, the TOML file, `default` by environment, prices."""

from __future__ import annotations

from pathlib import Path

import pytest

from perdure.activities.models.profiles import (
    DEFAULT_SCRIPT,
    ModelConfigInvalid,
    ModelProfile,
    UnknownModelProfile,
    load_model_config,
)

ENV = [
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "PERDURE_OPENAI_MODEL",
    "PERDURE_ANTHROPIC_MODEL",
    "PERDURE_SCRIPT",
    "PERDURE_CONFIG",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PERDURE_HOME", str(tmp_path / "home"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_builtins_without_a_file(tmp_path):
    config = load_model_config(tmp_path / "absent.toml")
    assert set(config.profiles) == {"scripted", "openai", "anthropic"}
    assert config.resolve("openai").model == "gpt-4o-mini"
    assert config.resolve("openai").api_key_env == "OPENAI_API_KEY"
    assert config.resolve("anthropic").model == "claude-sonnet-4-5"
    assert config.resolve("scripted").script == str(DEFAULT_SCRIPT)
    assert DEFAULT_SCRIPT.is_file()
    assert config.resolve("scripted").price_input_per_mtok == 0


def test_builtins_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PERDURE_OPENAI_MODEL", "llama3.2")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1")
    monkeypatch.setenv("PERDURE_ANTHROPIC_MODEL", "claude-haiku-4-5")
    monkeypatch.setenv("PERDURE_SCRIPT", "/tmp/my-script.yaml")
    config = load_model_config(tmp_path / "absent.toml")
    assert (config.resolve("openai").model, config.resolve("openai").base_url) == (
        "llama3.2",
        "http://localhost:11434/v1",
    )
    # An unlisted model is priced like the provider's default model, never as free.
    assert config.resolve("openai").price_input_per_mtok == 0.15
    assert config.resolve("anthropic").price_output_per_mtok == 5.0
    assert config.resolve("scripted").script == "/tmp/my-script.yaml"


def test_toml_profiles_add_and_override(tmp_path):
    path = write(
        tmp_path,
        """
[profiles.local]
provider = "openai"
model = "qwen2.5"
base_url = "http://localhost:11434/v1"
price_input_per_mtok = 0.0
price_output_per_mtok = 0.0
timeout_s = 600

[profiles.openai]
model = "gpt-4.1"
price_input_per_mtok = 2.0
price_output_per_mtok = 8.0

[profiles.demo]
provider = "scripted"
model = "scripted"
script = "scripts/demo.yaml"
""",
    )
    config = load_model_config(path)
    local = config.resolve("local")
    assert (local.provider, local.model, local.base_url, local.timeout_s) == (
        "openai",
        "qwen2.5",
        "http://localhost:11434/v1",
        600,
    )
    assert local.api_key_env is None
    overridden = config.resolve("openai")
    assert (overridden.model, overridden.api_key_env, overridden.price_output_per_mtok) == (
        "gpt-4.1",
        "OPENAI_API_KEY",
        8.0,
    )
    assert config.resolve("demo").script == str(tmp_path / "scripts" / "demo.yaml")
    assert "anthropic" in config.profiles


def test_default_path_comes_from_settings(monkeypatch, tmp_path):
    path = write(tmp_path, '[profiles.mine]\nprovider = "anthropic"\nmodel = "claude-x"\n')
    monkeypatch.setenv("PERDURE_CONFIG", str(path))
    assert load_model_config().resolve("mine").model == "claude-x"


@pytest.mark.parametrize(
    "text, problem",
    [
        ('[profiles.bad]\nprovider = "gemini"\nmodel = "m"\n', "provider"),
        ('[profiles.bad]\nprovider = "openai"\n', "model"),
        ('[profiles.bad]\nprovider = "openai"\nmodel = "m"\napi_key = "sk-x"\n', "api_key"),
        ("[profiles.bad\n", "cannot read"),
    ],
)
def test_invalid_profiles_are_reported_with_their_name(tmp_path, text, problem):
    with pytest.raises(ModelConfigInvalid) as caught:
        load_model_config(write(tmp_path, text))
    assert problem in str(caught.value)
    assert "bad" in str(caught.value) or "cannot read" in str(caught.value)


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, "scripted"),
        ({"ANTHROPIC_API_KEY": "k"}, "anthropic"),
        ({"OPENAI_API_KEY": "k"}, "openai"),
        ({"OPENAI_BASE_URL": "http://localhost:11434/v1", "ANTHROPIC_API_KEY": "k"}, "openai"),
    ],
)
def test_default_resolves_by_environment(monkeypatch, tmp_path, env, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert load_model_config(tmp_path / "absent.toml").resolve("default").name == expected


def test_default_from_the_file_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    config = load_model_config(write(tmp_path, '[profiles.default]\nprovider = "anthropic"\nmodel = "claude-y"\n'))
    assert config.resolve("default").model == "claude-y"


def test_unknown_profile_lists_known_names(tmp_path):
    with pytest.raises(UnknownModelProfile) as caught:
        load_model_config(tmp_path / "absent.toml").resolve("gpt-5")
    assert str(caught.value) == "unknown model profile 'gpt-5'; known profiles: anthropic, default, openai, scripted"


def test_cost_is_tokens_times_price_per_million():
    profile = ModelProfile(
        name="p", provider="anthropic", model="m", price_input_per_mtok=3.0, price_output_per_mtok=15.0
    )
    assert profile.cost_usd(1_000, 500) == pytest.approx(0.0105)
    assert profile.cost_usd(0, 0) == 0


def test_keys_are_never_part_of_a_profile(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET123")
    config = load_model_config(tmp_path / "absent.toml")
    assert "sk-test-SECRET123" not in config.model_dump_json()
    assert config.resolve("default").api_key_env == "OPENAI_API_KEY"


def test_default_meaning_a_profile_the_config_does_not_define_is_refused_with_the_names_known():
    from perdure.activities.models.profiles import ModelConfig, ModelProfile, UnknownModelProfile

    config = ModelConfig(profiles={"mine": ModelProfile(name="mine", provider="scripted", model="m")})
    with pytest.raises(UnknownModelProfile, match="profile 'default' means '.+' here .+ known profiles: mine"):
        config.resolve("default")
