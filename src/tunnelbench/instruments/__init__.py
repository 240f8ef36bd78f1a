"""The measuring instruments: one module per tool the workloads drive (iperf3, iperf2, nginx, ping's parser)
and the stdlib-only agents copied to hosts (crr_agent, leak_peer). Below the VPNs and the workloads: an
instrument knows hosts and the case's two ends (instruments/base.py), never a VPN or a workload."""
