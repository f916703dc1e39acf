"""The one client of perdure's goals: `Client` (perdure_client.py), over a temporalio Client,
public as `perdure.Client`; inside perdure it is `PerdureClient`, the same class under a name
apart from temporalio's Client. Python programs, the CLI (starters/cli/), the web UI's server
(starters/ui_server.py) and the MCP server (starters/mcp_server.py) start, steer and read
goals only through it; what can go wrong is client_errors.py, and a goal's spec is built,
before any call, by goal_specs.py.

The rooms behind it, one concern each: goal_starts.py and start_checks.py (starting, and
checking a start against what the workers offer), message_delivery.py (steering messages
and the inbox), steering_verbs.py (one method per steering verb), goal_reads.py (progress,
results, reports, listings), goal_decisions.py (the decision log), goal_events.py (the
event stream), router_calls.py (the user's router), goal_forks.py (fork and diff).
"""

from perdure.starters.client.perdure_client import Client

PerdureClient = Client

__all__ = ["Client", "PerdureClient"]
