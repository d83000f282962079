"""`python -m tandem.cli ...` runs the `tandem` command (used by the local runtime to start children)."""

from tandem.cli.main import main

main()
