"""The workloads, one file per workload. The catalog (tunnelbench/catalog.py) lists them by name."""
