"""The router's activities."""
