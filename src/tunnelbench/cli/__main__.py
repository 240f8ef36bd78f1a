"""`python -m tunnelbench.cli`: the command line, as the console script runs it."""

from tunnelbench.cli.app import main

main()
