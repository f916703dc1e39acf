"""Worker entry points (orchestrator)."""
