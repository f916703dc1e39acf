"""perdure's benchmarks: each module measures one figure on a local dev server;
`bench/run.py` runs them all and merges the figures into `bench/results.json`."""
