"""VPNs the field uses that cannot run on this kind of machine at all, with the exact reason.

They have no driver (a driver that can never start would only be dead code); `tunnelbench list` and
`tunnelbench doctor` show them so that a reader of a report knows they were considered, not forgotten.
The reasons were checked on the machine tunnelbench is developed on, whose only reachable registries are
Debian, the Go module proxy, crates.io and npm."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Impossible:
    name: str
    summary: str
    reason: str


IMPOSSIBLE: dict[str, Impossible] = {
    i.name: i
    for i in (
        Impossible(
            "netbird",
            "NetBird (WireGuard mesh with a management server; coturn as TURN relay)",
            "every version of github.com/netbirdio/netbird is refused by the Go module proxy "
            "(403 Forbidden), and it is not packaged in Debian or on crates.io",
        ),
        Impossible(
            "hyprspace",
            "Hyprspace (libp2p-based mesh VPN)",
            "every version of github.com/hyprspace/hyprspace is refused by the Go module proxy "
            "(403 Forbidden), and it is not packaged in Debian",
        ),
        Impossible(
            "mycelium",
            "Mycelium (threefoldtech end-to-end encrypted IPv6 overlay)",
            "the crates.io crate named `mycelium` is an unrelated project; threefoldtech's mycelium is "
            "not published to crates.io, Debian or the Go proxy",
        ),
        Impossible(
            "zerotier",
            "ZeroTier One",
            "in no registry reachable here (not in Debian 12, not a Go module or crate; its own apt "
            "repository at download.zerotier.com is off the allowed network)",
        ),
    )
}
