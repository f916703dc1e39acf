"""Connecting to Temporal: one `connect()` for the CLI, the workers and the demos,
and the errors a user sees when the server cannot be reached or the configuration
cannot be used. No workflow logic lives here.

Where the server is comes from runtime/settings.py: the standard Temporal client
configuration (profile file, TEMPORAL_* variables), then PERDURE_TEMPORAL and
PERDURE_NAMESPACE, then the arguments of `connect()`, each overriding the one
before. The API key, TLS (client certificate and key, server CA, server name) and
gRPC metadata come from the Temporal configuration alone, so the same CLI and
workers reach a Temporal Cloud namespace. Every client carries `PerdurePlugin`,
so it and the workers built on it share perdure's data converter.

A process that made a client lets the SDK's threads settle before the interpreter tears
down (`settle_at_exit`): without it a short program that finished correctly can die in
the teardown (temporalio sdk-python issue 300).
"""

from __future__ import annotations

import atexit
import time

from temporalio.client import Client
from temporalio.envconfig import ClientConnectConfig

from perdure.runtime import settings
from perdure.runtime.plugin import PerdurePlugin
from perdure.runtime.settings import TemporalConfigError
from perdure.runtime.telemetry import metrics_runtime, tracing_plugins


class ServerUnavailable(RuntimeError):
    """Temporal is not reachable at the configured address."""


def connect_config(address: str | None = None, namespace: str | None = None) -> ClientConnectConfig:
    """The keyword arguments `connect()` gives `Client.connect`, besides the plugin.

    Reads the TLS files the configuration names (a missing or unreadable one is a
    `TemporalConfigError`); does not touch the network.
    """
    profile = settings.temporal_profile()
    try:
        config = profile.to_client_connect_config()
    except OSError as err:
        raise TemporalConfigError(
            f"cannot read {err.filename}, a TLS file the Temporal configuration names ({err.strerror})"
        ) from None
    config["target_host"] = address or settings.temporal_address(profile)
    config["namespace"] = namespace or settings.namespace(profile)
    return config


async def connect(
    address: str | None = None, namespace: str | None = None, *, payload_store: bool = True, worker: bool = False
) -> Client:
    """`payload_store=False` for a device daemon: its payloads stay inline (runtime/converter.py).
    `worker=True` for a worker's client: it serves Prometheus metrics when they are asked for
    (runtime/telemetry.py); a command's client never takes the port."""
    config = connect_config(address, namespace)
    runtime = metrics_runtime(serve=worker)
    settle_at_exit()
    try:
        plugins = [PerdurePlugin(payload_store=payload_store), *tracing_plugins()]
        return await Client.connect(**config, plugins=plugins, runtime=runtime)
    except RuntimeError as err:
        raise ServerUnavailable(
            f"cannot reach Temporal at {config['target_host']} ({err}). Start the embedded server with "
            "`perdure server start`, or point perdure at your server: PERDURE_TEMPORAL, or TEMPORAL_ADDRESS "
            "or a Temporal profile (TEMPORAL_CONFIG_FILE, TEMPORAL_PROFILE; see the README's Configuration)."
        ) from None


# How long the interpreter waits at exit, the GIL released, before tearing down.
EXIT_SETTLE_S = 0.05
_settling = False


def settle_at_exit() -> None:
    """Once per process: at exit, before the interpreter finalizes, wait EXIT_SETTLE_S.

    The SDK's Rust threads still hold Python objects for a moment after each call's result
    is handed over (they release them under the GIL); a program whose last call had just
    returned then finalizes under them and aborts in PyGILState_Release (sdk-python issue
    300: about one run in four of a one-call program on a loaded 2-core machine; none of
    60 with this wait). atexit callbacks run before finalization begins, so the wait lets
    those threads finish. The CLI leaves with os._exit and never waits.
    """
    global _settling
    if not _settling:
        _settling = True
        atexit.register(time.sleep, EXIT_SETTLE_S)
