"""Deterministic side of perdure: workflows and the pure logic they use.

Nothing in this package performs I/O; activities and the CLI import the
contracts defined here so both sides agree on every payload.
"""
