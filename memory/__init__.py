"""perdure's memory store (issue 21, section 2): SQLite with FTS5 under PERDURE_HOME, or
PostgreSQL when PERDURE_MEMORY_URL says so; forgetting with derived memories re-made or
dropped. Worker- and CLI-side (I/O); the goal's side is workflows/goal/goal_memory.py and its
models are workflows/goal/contracts/memory_contracts.py."""
