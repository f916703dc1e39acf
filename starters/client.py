"""Client helpers shared by the CLI and the workers: connecting, and the errors
a user sees when the server is not there. No workflow logic lives here.
"""

from __future__ import annotations

from temporalio.client import Client

from runtime import settings
from runtime.plugin import PerdurePlugin


class ServerUnavailable(RuntimeError):
    """Temporal is not reachable at the configured address."""


async def connect(address: str | None = None, namespace: str | None = None) -> Client:
    address = address or settings.temporal_address()
    namespace = namespace or settings.namespace()
    try:
        return await Client.connect(address, namespace=namespace, plugins=[PerdurePlugin()])
    except RuntimeError as err:
        raise ServerUnavailable(
            f"cannot reach Temporal at {address} ({err}). Start the embedded server with "
            "`perdure server start`, or set PERDURE_TEMPORAL to your cluster's address."
        ) from None
