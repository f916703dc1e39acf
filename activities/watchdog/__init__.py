"""The watchdog's activities: what the server knows, its memory, its model call."""
