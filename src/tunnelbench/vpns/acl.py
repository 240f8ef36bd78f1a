"""The lab's one access-control policy, declared the same way by every driver whose VPN has ACLs
(`acl_support = True`, an `acl` option from `acl_option()`): `vpn_options.<vpn>.acl`.

"isolate": the case's client may open flows (TCP, UDP, ICMP) to the case's server and gets the replies; every
other policy host ("isolated") may reach neither of them. The server is `MeshSpec.hub` (the runner passes
the scenario's `[lab] server`), else the second host; the client is the first other host. A driver may exempt
a host it needs as infrastructure (innernet's coordination server is reachable from every peer by design):
such a host is named in the record and never checked.

"declared-not-applied-test-only": the negative control of the `acl` workload. The driver records the same
policy (groups, CIDRs) but does not enforce it, so the check must fail. Never for a real measurement.

Drivers record `policy.record()` as `settings["acl"]`; the `acl` workload reads it from there."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from tunnelbench.lab.host import Host
from tunnelbench.vpns.base import MeshSpec

OFF, ISOLATE, NOT_APPLIED = "off", "isolate", "declared-not-applied-test-only"
AclMode = Literal["off", "isolate", "declared-not-applied-test-only"]


def acl_option() -> Any:
    """The `acl` field every driver with acl_support declares (`acl: AclMode = acl_option()`)."""
    return Field(
        OFF,
        description='access policy: "isolate" = the client may reach the server, every other host '
        'may reach neither; "declared-not-applied-test-only" = the policy is recorded but not enforced '
        "(the acl check's negative control, tests only)",
    )


@dataclass(frozen=True)
class AclPolicy:
    mode: str
    client: Host
    server: Host
    isolated: tuple[Host, ...]
    exempt: dict[str, str] = field(default_factory=dict)  # host name -> why the policy does not cover it

    @property
    def enforced(self) -> bool:
        return self.mode == ISOLATE

    def role(self, host: Host) -> str:
        return "client" if host is self.client else "server" if host is self.server else "isolated"

    def record(self, how: str) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "enforced": self.enforced,
            "allow": [[self.client.name, self.server.name]],
            "isolated": [h.name for h in self.isolated],
            "exempt": dict(self.exempt),
            "how": how,
        }


def acl_policy(spec: MeshSpec, mode: str, exempt: dict[str, str] | None = None) -> AclPolicy:
    exempt = exempt or {}
    server = spec.hub or spec.hosts[1]
    client = next(h for h in spec.hosts if h is not server and h.name not in exempt)
    isolated = tuple(h for h in spec.hosts if h not in (client, server) and h.name not in exempt)
    return AclPolicy(mode, client, server, isolated, exempt)


def may_open(policy: AclPolicy | None, host: Host, peers: list[Host]) -> list[Host]:
    """The peers `host` may open flows to under the policy (all of `peers` without one): what a driver's
    peers() returns under a policy, so the readiness probe (Mesh.pairs_down) asks only for allowed flows."""
    if policy is None:
        return peers
    return [policy.server] if host is policy.client else []
