"""What the workers of a task queue offer, kept in a workflow a client reads without a worker."""
