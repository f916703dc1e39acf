"""perdure's paid-generation example: a paid asynchronous generation API (api.py), a fake of it
that keeps a billing ledger (fake_api.py), and the tools that use it under perdure's replay
contract (tools.py), which workers load through the package's `perdure.tools` entry point."""
