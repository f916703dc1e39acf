"""`python -m perdure` is the `perdure` command."""

from perdure.starters.cli import main

main()
