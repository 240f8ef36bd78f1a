"""Hosts, topology, process supervision and teardown (the ground floor above core/).

Everything above the lab uses only the `Lab` contract (lab/base.py) and `Host` (lab/host.py); `make_lab`
(lab/make.py) picks the backend; `LabCfg` (lab/spec.py) is the scenario's [lab] table."""
