"""The `perdure` CLI and client helpers."""
