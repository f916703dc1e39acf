"""Deployment plumbing checked as files: docker-compose.yml, Dockerfile, the
dev-server argv, and the CI entry point's exit codes.

There is no Docker engine here, so compose is parsed, not run. What must agree
with the code, above all the custom search attributes every server registers,
is compared with `workflows/shared/search_attributes.py`.
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
from pathlib import Path
from typing import Any

import pytest
import yaml

from perdure.runtime import converter
from perdure.runtime.payload_store import DiskPayloadDriver
from perdure.starters import devserver
from perdure.workflows.shared.search_attributes import CUSTOM_SEARCH_ATTRIBUTES, INDEXED_VALUE_TYPE

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


def test_all_services_exist() -> None:
    assert {"postgresql", "temporal", "temporal-ui", "temporal-setup", "worker"} <= set(SERVICES)


def test_postgres_keeps_its_data_on_a_volume() -> None:
    assert SERVICES["postgresql"]["image"] == "postgres:16"
    volume = SERVICES["postgresql"]["volumes"][0].split(":")[0]
    assert volume in COMPOSE["volumes"]


def test_temporal_runs_on_postgres_and_exposes_7233() -> None:
    temporal = SERVICES["temporal"]
    assert temporal["image"].startswith("temporalio/auto-setup:")
    assert env("temporal")["DB"] == "postgres12"
    assert env("temporal")["POSTGRES_SEEDS"] == "postgresql"
    assert {"POSTGRES_USER", "POSTGRES_PWD", "DB_PORT"} <= set(env("temporal"))
    assert "7233:7233" in [str(port) for port in temporal["ports"]]
    assert depends("temporal")["postgresql"]["condition"] == "service_healthy"
    assert "test" in temporal["healthcheck"]
    # auto-setup's own test attributes would take SQL visibility columns perdure needs.
    assert env("temporal")["SKIP_ADD_CUSTOM_SEARCH_ATTRIBUTES"] == "true"


def test_ui_is_on_host_port_8233_like_the_dev_server() -> None:
    ui = SERVICES["temporal-ui"]
    assert ui["image"].startswith("temporalio/ui:")
    assert env("temporal-ui")["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert [str(port).split(":")[0] for port in ui["ports"]] == ["8233"]


def test_setup_registers_exactly_the_custom_search_attributes() -> None:
    setup = SERVICES["temporal-setup"]
    assert setup["image"].startswith("temporalio/admin-tools:")
    assert depends("temporal-setup")["temporal"]["condition"] == "service_healthy"
    script = command_text("temporal-setup")
    creates = [line for line in script.splitlines() if "search-attribute create" in line]
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


def test_worker_scales_out_against_the_compose_temporal() -> None:
    worker = SERVICES["worker"]
    build = worker["build"]
    assert (build if isinstance(build, str) else build["context"]) == "."
    assert "replicas" in worker["deploy"]
    assert str(worker["deploy"]["replicas"]) == "${PERDURE_WORKERS:-2}"
    assert "container_name" not in worker  # replicas need generated names
    assert worker["command"] in (["perdure", "worker"], "perdure worker")
    assert depends("worker")["temporal-setup"]["condition"] == "service_completed_successfully"

    worker_env = env("worker")
    host, _, port = worker_env["PERDURE_TEMPORAL"].partition(":")
    assert host in SERVICES and host == "temporal" and port == "7233"

    home = worker_env["PERDURE_HOME"]
    mounts = dict(reversed(volume.split(":")[:2]) for volume in worker["volumes"])
    assert home in mounts, "PERDURE_HOME must be a mounted volume"
    assert mounts[home] in COMPOSE["volumes"], "PERDURE_HOME must be a named volume all replicas share"


def test_payload_store_is_on_the_volume_every_worker_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    value = env("worker")["PERDURE_PAYLOAD_STORE"]
    # Overridable from the shell (say, with s3://), shared disk by default.
    match = re.fullmatch(r"\$\{PERDURE_PAYLOAD_STORE:-(.+)\}", value)
    assert match, value
    monkeypatch.setenv("PERDURE_PAYLOAD_STORE", match.group(1))
    driver = converter.payload_driver()
    assert isinstance(driver, DiskPayloadDriver)
    mounts = dict(reversed(volume.split(":")[:2]) for volume in SERVICES["worker"]["volumes"])
    shared = [target for target, source in mounts.items() if source in COMPOSE["volumes"]]
    assert any(driver.root.is_relative_to(target) for target in shared), f"{driver.root} is not on a shared volume"
    assert env("worker")["PERDURE_PAYLOAD_THRESHOLD_BYTES"] is None  # passed through by name


def test_credentials_are_passed_by_name_never_written() -> None:
    reference = re.compile(r"\$\{\w+(:?-)?\}")
    for name in SERVICES:
        for key, value in env(name).items():
            if re.search(r"(API_KEY|SECRET|TOKEN)$", key):
                assert value is None or reference.fullmatch(str(value)), f"{name}.{key} has a literal value"
    assert {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL"} <= set(env("worker"))
    assert not re.search(r"sk-[A-Za-z0-9]", (ROOT / "docker-compose.yml").read_text())


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
    assert not any("perdure-data" in str(volume) for volume in device["volumes"])  # no shared store
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
