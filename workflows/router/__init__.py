"""The router: one long-lived workflow per user that routes each message to a goal."""
