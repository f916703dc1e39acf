"""perdure's bottom layer: what workers, the CLI, benchmarks and tests share to
reach Temporal and to keep files.

settings       where things are (PERDURE_* variables, the Temporal profile)
files          write-then-rename helpers
payload_store  the disk driver for payloads too large for history
codec          AES-256-GCM: the payload codec and the files at rest, one keyring
converter      the one data converter (pydantic + external payload storage
               + the codec when keys are configured)
plugin         PerdurePlugin: gives clients, workers, replayers and test
               environments that converter
connect        connect(): a client from the standard Temporal configuration
               (profile file, TEMPORAL_* variables: TLS, API key), perdure's
               variables overriding it

It imports nothing from activities/, workers/ or starters/ (they import it), and
only pure constants from workflows/. Workflow code never imports it: everything
here does I/O or reads the environment.
"""
