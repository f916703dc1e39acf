"""The goal's other activities: report, wait-step output, re-checks, memory reads and writes."""
