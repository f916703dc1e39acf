"""The goal's tools on a worker.

- catalogue/: the built-in tools, one module each (or per small family), each declaring
  its arguments, risk class, replay policy, effect key, lookup, compensation and
  implementation together; the registry there gathers them. The goal workflow reads
  these declarations too, so they are pure at import (catalogue/__init__.py says why).
- run_tool.py: the activity every call goes through (arguments, workspace, fencing,
  heartbeats, outputs); effect_runner.py: the effect protocol for calls that reach
  outside the workspace (key, intent, lookup, receipt, uncertain).
- the plumbing the tools' implementations import when they run: workspace.py,
  workspace_versions.py and workspace_files.py (confined, versioned files),
  command_runs.py and sandbox.py (shell commands), http_calls.py and credentials.py
  (HTTP and the worker's secrets), git_repo.py (git), fingerprints.py.

Where do I add a tool (with a compensation): one module in catalogue/, one line in its
`TOOL_MODULES`, and its test; tests/test_tool_catalogue.py checks the declaration is
complete and consistent, and nothing else needs to change.
"""
