"""Security conformance checks that are not workloads: key hygiene (keys.py)."""
