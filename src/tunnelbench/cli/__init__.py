"""The `tunnelbench` command line: the group and what its verbs share in common.py, one module per group of
verbs (each registers its commands on import), assembled in app.py (the console script's `main`)."""
