"""The goal's tools: the tool activity, remote-write effects, the sandbox and workspaces."""
