"""The goal's pure rules: density, estimates, ETA, evidence, invalidation, risk order,
segments, stalls, questions, what a drift check and the progress query show. No I/O, no workflow calls."""
