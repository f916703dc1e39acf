"""The one wiring object: clients, workers, replayers and test environments get
perdure's data converter from `PerdurePlugin`, so what one side writes the others read.

A `temporalio.plugin.SimplePlugin`. Given to `Client.connect` (or to `Client(...)`,
or to `WorkflowEnvironment.start_local` / `start_time_skipping*`, which connect
their client with it) it sets the client's converter; every `Worker` built on that
client applies it too, because the SDK hands a client's worker plugins to its
workers (so never pass it to `Worker` as well: it would run twice). Given to a
`Replayer` it sets the replayer's converter. perdure has no interceptors; ones
that every side must share belong here.

Workflows and activities are not in it: `workers/orchestrator.build_worker`
registers the production set, and replay tests choose their own workflow classes.

Building one builds the converter (runtime/converter.py): it reads the
payload-store and payload-key environment (and the key file it names) and
touches neither the store nor the network.
"""

from __future__ import annotations

from temporalio.plugin import SimplePlugin

from runtime.converter import data_converter

PLUGIN_NAME = "perdure"


class PerdurePlugin(SimplePlugin):
    def __init__(self, *, payload_store: bool = True) -> None:
        """`payload_store=False`: a device daemon's client (runtime/converter.py)."""
        super().__init__(PLUGIN_NAME, data_converter=data_converter(payload_store=payload_store))
