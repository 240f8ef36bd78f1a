"""Cut one host off the lab: the router drops (and counts) every packet it would forward to or from the host's
public address, in a table of its own (`<tag>cut`), so it never collides with the path policies
(`<tag>path`), the guard (`<tag>guard`) or the path watch (`<tag>pathwatch`).

Used by the resilience workload's control_loss / relay_loss events (the control server or the relay host
goes dark while the mesh is up). Every underlay packet between two hosts crosses the router, so the host is
cut from all others both ways; its own namespace, processes and tunnel interface are untouched.

    with Blackhole(lab.router, lab.tag, host):
        ...  # host unreachable
    # the table is gone again, even when the body raised"""

from __future__ import annotations

from tunnelbench.lab.counters import nft_counter
from tunnelbench.lab.host import Host


def table_name(tag: str) -> str:
    return f"{tag}cut"


class Blackhole:
    def __init__(self, router: Host, tag: str, host: Host):
        self.router, self.host = router, host
        self.table = table_name(tag)
        self.address = (
            host.public_ip
        )  # behind a NAT (lab path nat): its NAT's WAN address, what the router sees

    def rules(self) -> str:
        a = self.address
        return f"""table inet {self.table} {{
  counter dropped {{ }}
  chain forward {{
    type filter hook forward priority -20; policy accept;
    meta nfproto ipv4 ip saddr {a} counter name dropped drop
    meta nfproto ipv4 ip daddr {a} counter name dropped drop
  }}
}}
"""

    def cut(self) -> None:
        self.restore()
        self.router.run(["nft", "-f", "-"], input=self.rules())

    def restore(self) -> None:
        self.router.run(["nft", "delete", "table", "inet", self.table], check=False)

    def active(self) -> bool:
        return self.router.run(["nft", "list", "table", "inet", self.table], check=False).returncode == 0

    def dropped(self) -> int:
        """Packets dropped since cut(); -1 when the table is not there."""
        return nft_counter(self.router, self.table, "dropped")

    def __enter__(self) -> Blackhole:
        self.cut()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()
