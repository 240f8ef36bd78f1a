"""The VPN drivers, one file per VPN. The catalog (tunnelbench/catalog.py) lists them by name."""
