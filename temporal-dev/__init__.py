"""The embedded dev server's dynamic config (dynamic-config.yaml), installed as `perdure.temporal_dev` so
that `perdure server start` from a wheel applies the same values as from a checkout."""
