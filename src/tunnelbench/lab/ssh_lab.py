"""The SSH lab: an inventory's machines as the lab's hosts (lab/ssh_host.py), their remote work folders, each
host's lock (one run drives a host at a time: taken before anything runs there, released by the teardown),
the off-lab guard's counters on each, and a teardown that undoes what the run journaled (lab/ssh_undo.py).
Where impairment goes on these hosts is impair/placement.py's business, the doctor's checks over SSH
doctor.py's: this module only runs commands and undoes."""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from tunnelbench.lab.addressing import TUNNEL_RANGES_V4, TUNNEL_RANGES_V6
from tunnelbench.lab.base import LabError
from tunnelbench.lab.counters import nft_counter
from tunnelbench.lab.host import THIS_MACHINE, CommandError, Host
from tunnelbench.lab.inventory import Inventory, InvHost
from tunnelbench.lab.journal import Journal, read_open_entries
from tunnelbench.lab.ssh_host import REMOTE_TOOLS, SshHost, take_lab_lock
from tunnelbench.lab.ssh_transport import SshError
from tunnelbench.lab.ssh_undo import undo_entries


# -- the lab ---------------------------------------------------------------------------------------------
def remote_workdir(inv: InvHost, run_id: str, name: str) -> PurePosixPath:
    return PurePosixPath(inv.workdir_root) / run_id / name


def _guard_rules(table: str) -> str:
    # count only, never drop: on real networks the "tunnel" ranges may be in legitimate use
    return f"""
table inet {table} {{
  counter offlab {{ }}
  counter tunnel_leak {{ }}
  chain forward {{
    type filter hook forward priority -300; policy accept;
    meta nfproto ipv4 ip daddr {{ {TUNNEL_RANGES_V4} }} counter name tunnel_leak
    meta nfproto ipv6 ip6 daddr {{ {TUNNEL_RANGES_V6} }} counter name tunnel_leak
  }}
}}
"""


class SshLab:
    """Peers h1..hN (and optionally a router, relays, a control server) from an inventory."""

    backend = "ssh"

    def __init__(self, inventory: Inventory, n_hosts: int, tag: str, run_dir: Path, journal: Journal):
        self.inventory = inventory
        self.tag = tag
        self.run_dir = run_dir
        self.journal = journal
        peers = inventory.peers()
        if len(peers) < n_hosts:
            raise ValueError(
                f"the scenario needs {n_hosts} peers but inventory {inventory.path} has {len(peers)} "
                f"({', '.join(p.name for p in peers)})"
            )
        rid = journal.run_id

        def mk(name: str, inv: InvHost) -> SshHost:
            return SshHost(name, inv, remote_workdir(inv, rid, name), journal)

        self.hosts: list[SshHost] = [mk(f"h{i}", inv) for i, inv in enumerate(peers[:n_hosts], start=1)]
        r = inventory.router()
        self.router: SshHost | None = mk("router", r) if r else None
        self.relays = [mk(f"relay{i}", inv) for i, inv in enumerate(inventory.with_role("relay"), start=1)]
        ctl = inventory.with_role("control")
        self.control: SshHost | None = mk("control", ctl[0]) if ctl else None
        self.nft_table = f"{tag}guard"
        self._guard = False
        self._entries: dict[str, list[dict[str, Any]]] = {}

    relay: SshHost | None = None  # lab.path must be "direct" here (lab.make_lab)
    path_policies = False

    def all_hosts(self) -> list[SshHost]:
        return [
            *self.hosts,
            *([self.router] if self.router else []),
            *self.relays,
            *([self.control] if self.control else []),
        ]

    def mapping(self) -> str:
        return ", ".join(f"{h.name}={h.inv.name}" for h in self.all_hosts())

    def offlab_destinations(self) -> dict[str, int]:
        return {}  # real hosts have other traffic: nothing off the lab is dropped or counted

    # -- path policies: not on real networks (Lab.path_policies is False) ---------------------------
    def _no_policies(self, what: str) -> LabError:
        return LabError(
            f"{what} needs the namespace lab's path policies; the SSH lab does not filter real "
            "networks (run it without --inventory)"
        )

    def block_udp_between_peers(self, except_host: Host | None = None) -> None:
        raise self._no_policies("blocking UDP between peers")

    def block_udp_pair(self, a: Host, b: Host) -> None:
        raise self._no_policies("blocking UDP between two hosts")

    def unblock(self) -> None:
        raise self._no_policies("unblocking UDP between peers")

    def watch_relay(self, relay: Host | None = None) -> None:
        raise self._no_policies("counting a relay's bytes")

    def relay_bytes(self, relay: Host | None = None) -> dict[str, int]:
        raise self._no_policies("counting a relay's bytes")

    # -- build -----------------------------------------------------------------------------------------
    def _check(self, h: SshHost) -> str | None:
        """Connect and look for the tools: what is missing on the host, or None."""
        h.connect()
        need = REMOTE_TOOLS if h in self.hosts else ("ip",)
        missing = [t for t, p in h.which(need).items() if p is None]
        return f"{h.name} ({h.inv.describe()}) is missing {', '.join(missing)}" if missing else None

    def _prepare(self, h: SshHost) -> None:
        assert h.journal is not None
        ents = self._entries[h.name]
        # journal first: clean finds half-made ones
        ents.append(h.journal.add({"kind": "remote_dir", "path": str(h.workdir)}))
        h.make_workdir()  # workdir_root checked: no one else can plant the lock there
        take_lab_lock(h, self.journal.run_id)  # before anything runs there; the teardown releases it
        ents.append(h.journal.add({"kind": "link_prefix", "prefix": self.tag}))
        links = h.run(["ip", "-o", "link", "show"]).stdout
        h.preexisting_links = frozenset(
            line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ":" in line
        )

    def build(self) -> None:
        self.build_hosts()
        self._routes_and_guard()

    def build_hosts(self) -> None:
        """Connect, check and prepare every host (its run folder, its links before the run)."""
        hosts = self.all_hosts()
        for h in hosts:
            self._entries.setdefault(h.name, [])
        # every host at once: the connections and checks are round trips, the hosts independent
        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            problems = [p for p in pool.map(self._check, hosts) if p]
            if problems:
                raise RuntimeError(
                    "hosts not ready: " + "; ".join(problems) + " (see `tunnelbench doctor --inventory`)"
                )
            list(pool.map(self._prepare, hosts))

    def _routes_and_guard(self) -> None:
        """Each peer's egress interface towards the next, and the router's counting table."""
        for i, h in enumerate(self.hosts):
            peer = self.hosts[(i + 1) % len(self.hosts)]
            with contextlib.suppress(CommandError, ValueError, IndexError, KeyError):
                route = json.loads(h.run(["ip", "-j", "route", "get", peer.underlay_ip]).stdout)
                h.underlay_if = route[0]["dev"]
        self._install_guard()

    def _install_guard(self) -> None:
        """Counting-only nft table on the router host (if there is one and it has nft): never drops."""
        r = self.router
        if r is None or r.which(["nft"])["nft"] is None:
            return
        assert r.journal is not None
        self._entries["router"].append(
            r.journal.add({"kind": "nft_table", "family": "inet", "name": self.nft_table})
        )
        r.run(["nft", "-f", "-"], input=_guard_rules(self.nft_table))
        self._guard = True

    def wait_links(self, timeout: float = 10.0) -> None:
        """Every peer reaches the next one's underlay address."""
        end = time.monotonic() + timeout
        for i, h in enumerate(self.hosts):
            peer = self.hosts[(i + 1) % len(self.hosts)]
            while h.run(["ping", "-c1", "-W1", peer.underlay_ip], check=False).returncode != 0:
                if time.monotonic() > end:
                    raise RuntimeError(f"{h.name} cannot reach {peer.name} at {peer.underlay_ip}")
                time.sleep(0.2)

    def offlab_drops(self, counter: str = "offlab") -> int:
        """Packets the router counted (-1: not measured). On real networks nothing is dropped and "offlab"
        is not defined (hosts have other traffic): only `tunnel_leak` is counted."""
        if not self._guard or self.router is None or counter == "offlab":
            return -1
        return nft_counter(self.router, self.nft_table, counter)

    def router_ifnames(self) -> dict[str, str]:
        """The router host's interface toward each peer, from its routing table."""
        assert self.router is not None
        out: dict[str, str] = {}
        for h in self.hosts:
            r = self.router.run(["ip", "-j", "route", "get", h.underlay_ip], check=False)
            try:
                out[h.name] = json.loads(r.stdout)[0]["dev"]
            except (json.JSONDecodeError, IndexError, KeyError):
                raise RuntimeError(
                    f"router {self.router.inv.name} has no route to {h.name} ({h.underlay_ip}): "
                    f"{r.stderr.strip()}"
                ) from None
            if out[h.name] == "lo":
                raise RuntimeError(
                    f"router {self.router.inv.name}: {h.underlay_ip} is its own address; "
                    "the router must be a separate box on the peers' path"
                )
        return out

    # -- teardown --------------------------------------------------------------------------------------
    def collect_logs(self) -> None:
        """Copy every *.log of the remote workdirs into <run_dir>/hosts/<host>/ (keys and configs stay)."""
        for h in self.all_hosts():
            with contextlib.suppress(CommandError, SshError, TimeoutError, OSError):
                found = h.run(
                    ["find", str(h.workdir), "-name", "*.log", "-size", "-20M", "-type", "f"], check=False
                )
                for line in found.stdout.splitlines():
                    rel = PurePosixPath(line).relative_to(str(h.workdir))
                    dest = self.run_dir / "hosts" / h.name / rel
                    THIS_MACHINE.write_file(dest, h.read_file(Path(line)), 0o600)  # logs may hold secrets

    def destroy(self) -> list[str]:
        """Stop everything this run started on every host (per the journal), remove interfaces it made,
        the guard table and the remote workdirs; return problems."""
        with contextlib.suppress(Exception):
            self.collect_logs()
        problems: list[str] = []
        open_entries = read_open_entries(self.journal.path)
        for h in self.all_hosts():
            mine = [
                e
                for e in open_entries
                if e.get("backend") == "ssh" and e.get("host") == h.name and e.get("address") == h.address
            ]
            try:
                rep = undo_entries(h, mine, self.journal)
                problems += rep.problems
            except (SshError, TimeoutError, OSError) as e:
                problems.append(f"{h.name}: {e}")
            h.close()
        self._guard = False
        return problems
