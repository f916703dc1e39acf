"""The quota service: one long-lived workflow per external resource."""
