"""The watchdog: a scheduled workflow that judges every open goal's progress."""
