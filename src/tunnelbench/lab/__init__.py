"""Hosts, topology, process supervision and teardown."""
