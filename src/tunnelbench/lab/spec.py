"""The lab's spec: the scenario's [lab] table (backend, hosts, placement, underlay path, NAT types), validated
with errors that name the field."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tunnelbench.core.schema import Strict

NatType = Literal["full-cone", "address-restricted", "port-restricted", "symmetric"]  # lab.netns.NAT_TYPES


class LabCfg(Strict):
    backend: Literal["netns", "ssh"] = Field(
        "netns",
        description="netns = namespaces on this machine; ssh = real hosts from lab.inventory; kubernetes = "
        "many_clients' clients are pods of a Kubernetes cluster (lab.kubeconfig, or the lab's own on its last "
        "three hosts), the other hosts namespaces (or the inventory's hosts with lab.inventory)",
    )
    clients_on: Literal["hosts", "kubernetes"] = Field(
        "hosts", description='set by backend = "kubernetes": where many_clients\' clients run'
    )
    kubeconfig: str | None = Field(
        None,
        description="backend = \"kubernetes\": the cluster's kubeconfig (its current context); none = the lab's "
        "own cluster, brought up on the lab's last three hosts",
    )
    kube_namespace: str | None = Field(
        None,
        description="a namespace made beforehand (privileged pods allowed) for the client pods; none = the run "
        "makes its own, labelled with the run's tag, and deletes it",
    )
    kube_image: str | None = Field(
        None,
        description="the client pod image in your registry (REGISTRY/tunnelbench-fleet@sha256:..., "
        "docs/real-hosts.md); needed with a kubeconfig",
    )

    @model_validator(mode="before")
    @classmethod
    def _kubernetes(cls, data: object) -> object:
        """backend = "kubernetes" is the namespace lab (or, with an inventory, the SSH lab) whose many_clients
        clients are pods."""
        if isinstance(data, dict) and data.get("backend") == "kubernetes":
            return {
                **data,
                "backend": "ssh" if data.get("inventory") else "netns",
                "clients_on": "kubernetes",
            }
        return data

    inventory: str | None = Field(
        None, description="Ansible inventory (INI or YAML, read by Ansible) of the hosts (backend ssh)"
    )
    insecure_no_host_key_check: bool = Field(
        False, description="ssh: do not verify host keys (only on a lab network you fully control)"
    )
    hosts: int = Field(3, ge=2, le=1023, description="number of peer hosts")
    topology: Literal["mesh", "star"] = Field(
        "mesh",
        description="mesh = every host peers with every other; star = peers only with the server "
        "host (many-client scenarios, Goethals et al.; only drivers that list it)",
    )
    client: str = Field("h1", description="host that runs workload clients (fixed placement)")
    server: str = Field("h2", description="host that runs workload servers (fixed placement)")
    path: Literal["direct", "relay", "nat"] = Field(
        "direct",
        description="underlay path: direct; relay = UDP between peers blocked so traffic must cross the relay "
        "host; nat = every peer but the relay host behind its own masquerading NAT",
    )
    relay: str | None = Field(
        None, description="relay / rendezvous host for path relay|nat (default: the last host)"
    )
    underlay_mtu: int | None = Field(
        None,
        ge=1280,
        le=9000,
        description="MTU of every lab link (namespace lab; default 1500). A second no-VPN baseline at another MTU "
        'in the same run: vpns = ["internal", "internal@mtu1450"]',
    )
    nat_type: NatType = Field(
        "port-restricted",
        description="path nat: the type of every peer's NAT (RFC 4787): full-cone = endpoint-independent mapping "
        "and filtering; address-restricted = inbound only from IPs the host sent to; port-restricted = only from "
        "the exact IP:port (Linux masquerade, the default); symmetric = a new public port per destination "
        "(hard NAT)",
    )
    nat_types: dict[str, NatType] = Field(
        default_factory=dict,
        description='path nat: per-host NAT types overriding nat_type, e.g. {h1 = "symmetric", h2 = "full-cone"}',
    )
    hosts_per_vpn: dict[str, int] = Field(
        default_factory=dict,
        description="how many of the lab's hosts a VPN's mesh takes (the first ones, client and server among "
        "them), e.g. {softether = 101}: a VPN whose daemons cannot all fit the machine or come up in time at "
        "lab.hosts still runs the cases its hosts can take; a case that needs more hosts is skipped with the "
        "reason. Key: a driver name (every version of it) or NAME@VERSION",
    )
    plant_fault: Literal["udp-blocked"] | None = Field(
        None,
        description="test-only negative control of the path check: udp-blocked = the router drops UDP between "
        "the client and the server, so in a direct scenario a VPN that still connects them relays through "
        "another host and its cases must fail as 'path not direct'",
    )

    @model_validator(mode="after")
    def _placement(self) -> LabCfg:
        names = [f"h{i}" for i in range(1, self.hosts + 1)]
        for role in ("client", "server"):
            if getattr(self, role) not in names:
                raise ValueError(f"{role} must be one of {', '.join(names)} (got {getattr(self, role)!r})")
        if self.client == self.server:
            raise ValueError("client and server must be different hosts")
        if self.path != "direct":
            relay = self.relay or names[-1]
            if relay not in names or relay in (self.client, self.server):
                raise ValueError(
                    f"relay must be a host other than client and server, one of {', '.join(names)} "
                    f"(got {relay!r}; path {self.path!r} needs hosts >= 3)"
                )
        elif self.relay:
            raise ValueError('relay is only used with path = "relay" or "nat"')
        if self.path == "nat" and self.hosts > 256:
            raise ValueError(
                f'hosts: {self.hosts} with path = "nat"; each peer\'s NAT gets its own LAN 172.16.<i>.0/24, '
                "so at most 255 peers and the relay host: use hosts <= 256"
            )
        if self.path != "nat" and (self.nat_types or self.nat_type != "port-restricted"):
            raise ValueError('nat_type and nat_types are only used with path = "nat"')
        if self.nat_types:
            relay = self.relay or names[-1]
            bad = [h for h in self.nat_types if h not in names or h == relay]
            if bad:
                raise ValueError(
                    f"nat_types: {', '.join(bad)} is not a host behind a NAT (the peers but the relay "
                    f"host {relay}: {', '.join(n for n in names if n != relay)})"
                )
        need = max(names.index(self.client), names.index(self.server)) + 1
        for vpn, n in self.hosts_per_vpn.items():
            if not need <= n <= self.hosts:
                raise ValueError(
                    f"hosts_per_vpn.{vpn}: {n} is not between {need} (the client {self.client} and "
                    f"server {self.server} are among a VPN's hosts) and lab.hosts = {self.hosts}"
                )
        if self.hosts_per_vpn and self.path != "direct":
            raise ValueError(
                'hosts_per_vpn is only used with path = "direct" (the relay host is the last one)'
            )
        if self.plant_fault and self.backend != "netns":
            raise ValueError('plant_fault needs backend = "netns" (the lab\'s router drops the traffic)')
        if self.backend == "ssh" and not self.inventory:
            raise ValueError("backend 'ssh' needs inventory = \"path/to/inventory.yaml\" (or --inventory)")
        if self.backend == "netns" and self.inventory:
            raise ValueError('inventory is only used with backend = "ssh"')
        if self.clients_on != "kubernetes":
            for name in ("kubeconfig", "kube_namespace", "kube_image"):
                if getattr(self, name) is not None:
                    raise ValueError(f'{name} is only used with backend = "kubernetes" (or --kubeconfig)')
        elif self.kubeconfig is None and self.backend == "ssh":
            raise ValueError('backend = "kubernetes" with an inventory needs kubeconfig = "PATH" (or --kubeconfig): '
                             "the lab's own cluster runs in namespaces only")  # fmt: skip
        return self

    def kube_options(self) -> dict[str, str | None] | None:
        """What many_clients on Kubernetes is told (CaseContext.options["kube"]); None: not on Kubernetes."""
        if self.clients_on != "kubernetes":
            return None
        return {"kubeconfig": self.kubeconfig, "namespace": self.kube_namespace, "image": self.kube_image}
