"""The command line assembled: the group with every verb module's commands (the console script's target)."""

from tunnelbench.cli import lab, machines, results, run
from tunnelbench.cli.common import main

__all__ = ["lab", "machines", "main", "results", "run"]
