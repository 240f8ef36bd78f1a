"""Where a lab's impairment is applied, and the backend that applies it there.

The namespace lab: on its router namespace, which forwards every packet between the hosts. An SSH lab: where
the inventory says (`tunnelbench_impair`, one value for the whole inventory):

- "router": the router host's interfaces toward each peer (netem where its kernel has it, else the native
  engine copied there); the default when the inventory has a router host;
- "egress": netem on each peer's own underlay interface, impairing what it sends to the other peers (the
  ten-VPN thesis's placement); the default without a router host.

The runner asks `backend_for(lab, ...)` and records `plan(lab)`; it never looks at which kind of lab it has."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from tunnelbench.impair.backend import Backend, EgressNetemBackend, ImpairError, make_backend, netem_available

if TYPE_CHECKING:
    from tunnelbench.lab.base import Lab
    from tunnelbench.lab.ssh_lab import SshLab


def _on_ssh_hosts(lab: Lab) -> bool:
    return any(h.remote for h in lab.hosts)


def placement(lab: SshLab) -> str:
    """An SSH lab's placement: "router" or "egress" (inventory var tunnelbench_impair; default: router if the
    inventory has a router host). Raises ValueError naming the inventory for a value it cannot honour."""
    where = {
        str(h.inv.vars.get("tunnelbench_impair"))
        for h in lab.all_hosts()
        if h.inv.vars.get("tunnelbench_impair") is not None
    }
    if len(where) > 1:
        raise ValueError(
            f"inventory {lab.inventory.path}: tunnelbench_impair is set to {sorted(where)}; "
            "use one placement for the whole inventory"
        )
    mode = where.pop() if where else ("router" if lab.router else "egress")
    if mode not in ("router", "egress"):
        raise ValueError(
            f"inventory {lab.inventory.path}: tunnelbench_impair must be router or egress, not {mode!r}"
        )
    if mode == "router" and lab.router is None:
        raise ValueError(
            f"inventory {lab.inventory.path}: tunnelbench_impair: router needs a host in the routers group"
        )
    return mode


def plan(lab: Lab) -> str | None:
    """Where the impairment goes, in words, for the run's environment record; None for the namespace lab
    (always its router namespace)."""
    if not _on_ssh_hosts(lab):
        return None
    ssh = cast("SshLab", lab)  # an SSH host among the peers: the SSH lab
    if placement(ssh) == "router" and ssh.router is not None:
        return f"router host {ssh.router.inv.name} toward each peer"
    return "netem on each peer's egress: " + ", ".join(f"{h.name}:{h.underlay_if}" for h in ssh.hosts)


def backend_for(lab: Lab, choice: str, workdir: Path) -> Backend:
    """The impairment backend for `lab`: choice is auto | netem | native (impair.backend). `workdir` is the
    run's impair folder on this machine; a remote router keeps its files in its own workdir."""
    if not _on_ssh_hosts(lab):
        assert lab.router is not None
        return make_backend(choice, lab.router, lab.hosts, workdir)
    ssh = cast("SshLab", lab)  # an SSH host among the peers: the SSH lab
    if placement(ssh) == "router":
        assert ssh.router is not None
        return make_backend(
            choice, ssh.router, list(ssh.hosts), ssh.router.workdir / "impair", ssh.router_ifnames(), ssh.tag
        )
    if choice == "native":
        raise ImpairError(
            "tunnelbench_impair: egress uses netem on each peer; the native engine runs on a "
            "router host (tunnelbench_impair: router)"
        )
    missing = [h.name for h in ssh.hosts if not netem_available(h, f"{ssh.tag}nprobe")]
    if missing:
        raise ImpairError(
            f"tunnelbench_impair: egress needs netem on every peer; no netem on "
            f"{', '.join(missing)} (see `tunnelbench doctor --inventory`)"
        )
    return EgressNetemBackend(list(ssh.hosts), workdir)
