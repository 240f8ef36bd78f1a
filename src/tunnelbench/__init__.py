"""tunnelbench: a benchmark lab for VPNs and overlay tunnels."""

__version__ = "0.1.0"
