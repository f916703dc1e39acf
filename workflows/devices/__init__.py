"""The device registry: one long-lived workflow that knows which devices are online."""
