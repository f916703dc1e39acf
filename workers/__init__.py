"""Worker entry points: the orchestrator worker and the watchdog's schedule. Connecting,
settings and the data converter are runtime/'s."""
