"""perdure.runtime.connect: the standard Temporal client configuration (profile file, TEMPORAL_*
variables, TLS, API key) with perdure's variables and arguments on top; a real connect
through a profile file; configuration mistakes as clear errors, in the CLI without a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import TLSConfig

from perdure.runtime import connect as runtime_connect
from perdure.runtime.connect import connect, connect_config
from perdure.runtime.plugin import PerdurePlugin
from perdure.runtime.settings import TemporalConfigError

# No timing a loaded machine breaks: make test runs its process tests five at a time.
pytestmark = pytest.mark.parallel_safe

PERDURE = str(Path(sys.executable).parent / "perdure")

PROFILES = """
[profile.default]
address = "file-default:7233"

[profile.cloud]
address = "acme.a1b2c.tmprl.cloud:7233"
namespace = "acme.a1b2c"
api_key = "key-from-file"

[profile.cloud.grpc_meta]
team = "agents"
"""


@pytest.fixture
def temporal_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No Temporal configuration of the machine running the tests: no TEMPORAL_* or
    PERDURE_TEMPORAL / PERDURE_NAMESPACE variable, and no default profile file."""
    for name in list(os.environ):
        if name.startswith("TEMPORAL_") or name in ("PERDURE_TEMPORAL", "PERDURE_NAMESPACE"):
            monkeypatch.delenv(name)
    # Where the SDK looks for its default file (temporalio/temporal.toml under the config dir).
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    return monkeypatch


def profile_file(tmp_path: Path, text: str = PROFILES) -> Path:
    path = tmp_path / "temporal.toml"
    path.write_text(text)
    return path


def test_nothing_configured_means_the_local_default(temporal_env):
    assert connect_config() == {"target_host": "localhost:7233", "namespace": "default"}


def test_a_profile_file_and_the_temporal_variables(temporal_env, tmp_path):
    temporal_env.setenv("TEMPORAL_CONFIG_FILE", str(profile_file(tmp_path)))
    assert connect_config() == {"target_host": "file-default:7233", "namespace": "default"}

    temporal_env.setenv("TEMPORAL_PROFILE", "cloud")
    assert connect_config() == {
        "target_host": "acme.a1b2c.tmprl.cloud:7233",
        "namespace": "acme.a1b2c",
        "api_key": "key-from-file",
        "tls": True,  # an API key turns TLS on
        "rpc_metadata": {"team": "agents"},
    }

    temporal_env.setenv("TEMPORAL_NAMESPACE", "acme.other")
    temporal_env.setenv("TEMPORAL_API_KEY", "key-from-env")
    config = connect_config()
    assert (config["namespace"], config["api_key"]) == ("acme.other", "key-from-env")


def test_perdure_variables_then_arguments_override_the_profile(temporal_env, tmp_path):
    temporal_env.setenv("TEMPORAL_CONFIG_FILE", str(profile_file(tmp_path)))
    temporal_env.setenv("TEMPORAL_PROFILE", "cloud")
    temporal_env.setenv("TEMPORAL_ADDRESS", "from-temporal-env:7233")
    temporal_env.setenv("PERDURE_TEMPORAL", "from-perdure:7233")
    temporal_env.setenv("PERDURE_NAMESPACE", "perdure-ns")
    config = connect_config()
    assert (config["target_host"], config["namespace"]) == ("from-perdure:7233", "perdure-ns")
    # The credentials still come from the profile: only where and which namespace are overridden.
    assert config["api_key"] == "key-from-file"

    config = connect_config("explicit:1234", "explicit-ns")
    assert (config["target_host"], config["namespace"]) == ("explicit:1234", "explicit-ns")


def tls_files(tmp_path: Path) -> dict[str, Path]:
    files = {"cert": tmp_path / "client.pem", "key": tmp_path / "client.key", "ca": tmp_path / "ca.pem"}
    for name, path in files.items():
        path.write_bytes(f"-- {name} bytes --".encode())
    return files


def test_mtls_from_a_profile_file(temporal_env, tmp_path):
    files = tls_files(tmp_path)
    text = f"""
[profile.default]
address = "mtls.example:7233"
namespace = "mtls-ns"
[profile.default.tls]
client_cert_path = "{files["cert"]}"
client_key_path = "{files["key"]}"
server_ca_cert_path = "{files["ca"]}"
server_name = "frontend.example"
"""
    temporal_env.setenv("TEMPORAL_CONFIG_FILE", str(profile_file(tmp_path, text)))
    assert connect_config()["tls"] == TLSConfig(
        client_cert=b"-- cert bytes --",
        client_private_key=b"-- key bytes --",
        server_root_ca_cert=b"-- ca bytes --",
        domain="frontend.example",
    )


async def test_tls_and_api_key_from_variables_reach_client_connect(temporal_env, tmp_path, monkeypatch):
    files = tls_files(tmp_path)
    temporal_env.setenv("TEMPORAL_ADDRESS", "acme.a1b2c.tmprl.cloud:7233")
    temporal_env.setenv("TEMPORAL_NAMESPACE", "acme.a1b2c")
    temporal_env.setenv("TEMPORAL_API_KEY", "secret-key")
    temporal_env.setenv("TEMPORAL_TLS_CLIENT_CERT_PATH", str(files["cert"]))
    temporal_env.setenv("TEMPORAL_TLS_CLIENT_KEY_PATH", str(files["key"]))
    temporal_env.setenv("TEMPORAL_TLS_SERVER_NAME", "sni.example")
    received: dict = {}

    async def fake_connect(target_host: str, **kwargs) -> str:
        received.update(kwargs, target_host=target_host)
        return "client"

    # There is no TLS server here: what matters is what the SDK is asked to connect with.
    monkeypatch.setattr(Client, "connect", fake_connect)
    assert await connect() == "client"
    assert received["target_host"] == "acme.a1b2c.tmprl.cloud:7233"
    assert received["namespace"] == "acme.a1b2c"
    assert received["api_key"] == "secret-key"
    assert received["tls"] == TLSConfig(
        client_cert=b"-- cert bytes --", client_private_key=b"-- key bytes --", domain="sni.example"
    )
    assert [type(p) for p in received["plugins"]] == [PerdurePlugin]


async def test_a_real_connect_through_a_profile_file(env, temporal_env, tmp_path):
    address = env.client.service_client.config.target_host
    text = f'[profile.local]\naddress = "{address}"\nnamespace = "{env.client.namespace}"\n'
    temporal_env.setenv("TEMPORAL_CONFIG_FILE", str(profile_file(tmp_path, text)))
    temporal_env.setenv("TEMPORAL_PROFILE", "local")
    client = await connect()
    assert client.service_client.config.target_host == address
    assert client.namespace == env.client.namespace
    assert await client.count_workflows() is not None
    assert [p.name() for p in client.config()["plugins"]] == ["perdure"]


async def test_an_unreachable_server_is_server_unavailable(temporal_env):
    temporal_env.setenv("TEMPORAL_ADDRESS", "127.0.0.1:1")
    with pytest.raises(runtime_connect.ServerUnavailable, match=r"cannot reach Temporal at 127\.0\.0\.1:1"):
        await connect()


# ---------------------------------------------------------------- mistakes a user can make

MISTAKES = {
    "missing file": (
        {"TEMPORAL_CONFIG_FILE": "{tmp}/nope.toml"},
        None,
        "TEMPORAL_CONFIG_FILE={tmp}/nope.toml: no such file",
    ),
    "missing profile": ({"TEMPORAL_PROFILE": "staging"}, PROFILES, "cannot load Temporal profile 'staging'"),
    "bad toml": ({}, "[profile.default\naddress = ", "unclosed table, expected `]`"),
    "missing cert": (
        {"TEMPORAL_TLS_CLIENT_CERT_PATH": "{tmp}/gone.pem", "TEMPORAL_TLS_CLIENT_KEY_PATH": "{tmp}/gone.key"},
        None,
        "cannot read {tmp}/gone.pem, a TLS file the Temporal configuration names",
    ),
}


def mistake(name: str, tmp_path: Path) -> tuple[dict[str, str], str]:
    """The variables that make this mistake, and the message that names it."""
    variables, file_text, message = MISTAKES[name]
    variables = {k: v.format(tmp=tmp_path) for k, v in variables.items()}
    if file_text is not None:
        variables["TEMPORAL_CONFIG_FILE"] = str(profile_file(tmp_path, file_text))
    return variables, message.format(tmp=tmp_path)


@pytest.mark.parametrize("name", MISTAKES)
def test_configuration_mistakes_are_clear_errors(name, temporal_env, tmp_path):
    variables, message = mistake(name, tmp_path)
    for key, value in variables.items():
        temporal_env.setenv(key, value)
    with pytest.raises(TemporalConfigError) as raised:
        connect_config()
    assert message in str(raised.value)


@pytest.mark.process
@pytest.mark.process
@pytest.mark.parametrize("name", MISTAKES)
def test_the_cli_prints_a_configuration_mistake_without_a_traceback(name, tmp_path):
    variables, message = mistake(name, tmp_path)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    clean.pop("PERDURE_TEMPORAL", None)
    environment = {**clean, "XDG_CONFIG_HOME": str(tmp_path / "no-config"), "COLUMNS": "400", **variables}
    done = subprocess.run([PERDURE, "status", "some-goal"], env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert message in " ".join(done.stderr.split()), done.stderr
