"""ACL isolation check (a security conformance check, `tunnelbench run security`): the VPN's own access control must enforce the lab's policy
(vpns/acl.py, `vpn_options.<vpn>.acl = "isolate"`): the client reaches the server, every isolated host reaches
neither. Flows over the tunnel addresses, each bounded by `timeout_s`: ICMP (ping) and TCP (connect to a
listener on the target's tunnel address). Allowed: client -> server. Denied: isolated -> server and
isolated -> client, for every isolated host the driver's policy record names.

The policy comes from the driver's record (settings["acl"]), which also says whether it was enforced: a VPN
without the policy is an error ("policy not applied"), never a pass; the test-only control
("declared-not-applied-test-only": the groups/CIDRs exist, nothing is enforced) runs the full check and must
get acl_enforced = 0. A check whose allowed flows fail is not a pass either: a tunnel that carries nothing
"blocks" every denied flow.

Evidence: acl.json (every flow: source, target, protocol, expected, worked, seconds) in the case folder."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import Field

from tunnelbench.core.metrics import MetricSpec
from tunnelbench.core.results import Outcome
from tunnelbench.instruments.ping import parse_ping
from tunnelbench.lab.host import Host, Process
from tunnelbench.workloads.base import CaseContext, NotApplicable, Params, Workload, WorkloadError
from tunnelbench.workloads.leak import wait_log

PORT = 47041  # the TCP listener's port on each target's tunnel address
LISTEN = (
    "import socket,sys\n"
    "s=socket.create_server((sys.argv[1],int(sys.argv[2])),family=socket.AF_INET6 if ':' in sys.argv[1] "
    "else socket.AF_INET)\n"
    "print('ready',flush=True)\n"
    "while True:\n"
    "    c,_=s.accept(); c.sendall(b'ok'); c.close()\n"
)
CONNECT = (
    "import socket,sys\n"
    "c=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=float(sys.argv[3]))\n"
    "sys.exit(0 if c.recv(2)==b'ok' else 1)\n"
)


class AclParams(Params):
    timeout_s: float = Field(
        1.5, ge=0.2, le=10, description="seconds each flow gets to work (a blocked flow takes this long)"
    )


def python(host: Host) -> str:
    return "python3" if host.remote else sys.executable


class Acl(Workload):
    name = "acl"
    summary = (
        "ACL isolation: client -> server works, isolated hosts reach neither (ICMP and TCP, tunnel addresses)"
    )
    tools = ("ping",)
    Params = AclParams
    params: AclParams
    headline = ("acl_enforced", "acl_allowed_ok", "acl_denied_blocked")
    metrics = (
        MetricSpec(
            "acl_enforced",
            "bool",
            "higher",
            "1 = every allowed flow worked and every denied flow was blocked",
        ),
        MetricSpec("acl_allowed_ok", "fraction", "higher", "allowed flows that worked / allowed flows"),
        MetricSpec(
            "acl_denied_blocked", "fraction", "higher", "denied flows that were blocked / denied flows"
        ),
        MetricSpec("acl_flows", "flows", "none", "flows checked (allowed + denied)"),
        MetricSpec("acl_check_s", "s", "none", "seconds the whole check took"),
    )

    def expected_seconds(self) -> float:
        return 15 + 12 * (self.params.timeout_s + 0.5)

    def _policy(self, ctx: CaseContext) -> tuple[dict[str, Any], list[Host]]:
        """The driver's policy record and the isolated hosts, checked against the case's placement."""
        hosts = ctx.mesh.hosts
        vpn = ctx.mesh.vpn
        if len(hosts) < 3:
            raise WorkloadError(
                f"the acl check needs a third host to isolate: set [lab] hosts >= 3 (has {len(hosts)})"
            )
        if not getattr(ctx.mesh.driver, "acl_support", False):
            raise NotApplicable(f"{vpn} has no access control in this lab: acl is not supported")
        rec = ctx.mesh.driver.settings.get("acl")
        if not rec or rec.get("mode") == "off":
            raise WorkloadError(f"policy not applied: set vpn_options.{vpn}.acl = 'isolate'")
        if rec["allow"] != [[ctx.client.name, ctx.server.name]]:
            raise WorkloadError(
                f"{vpn}'s policy allows {rec['allow']}, but the case runs {ctx.client.name} -> "
                f"{ctx.server.name}: the policy's server is [lab] server"
            )
        by_name = {h.name: h for h in hosts}
        isolated = [by_name[n] for n in rec["isolated"]]
        if not isolated:
            raise WorkloadError(f"{vpn}'s policy isolates no host (exempt: {rec.get('exempt')}): add a host")
        return rec, isolated

    def run(self, ctx: CaseContext) -> Outcome:
        rec, isolated = self._policy(ctx)
        t0 = time.monotonic()
        flows = [(ctx.client, ctx.server, pr, True) for pr in ("icmp", "tcp")]
        flows += [
            (h, t, pr, False) for h in isolated for t in (ctx.server, ctx.client) for pr in ("icmp", "tcp")
        ]
        listeners = [self._listen(t, ctx) for t in (ctx.server, ctx.client)]
        try:
            # the allowed flows first (one may wait for a handshake), then every denied flow at once: a blocked
            # flow takes its whole timeout, so in parallel the check costs one timeout, not one per flow
            results = [self._flow(src, dst, pr, ctx) | {"expected": ok} for src, dst, pr, ok in flows if ok]
            denied_flows = [f for f in flows if not f[3]]
            with ThreadPoolExecutor(len(denied_flows)) as pool:
                results += pool.map(
                    lambda f: self._flow(f[0], f[1], f[2], ctx) | {"expected": False}, denied_flows
                )
        finally:
            for p in listeners:
                p.stop(grace=1)
        allowed = [r for r in results if r["expected"]]
        denied = [r for r in results if not r["expected"]]
        allowed_ok = sum(r["worked"] for r in allowed) / len(allowed)
        denied_blocked = sum(not r["worked"] for r in denied) / len(denied)
        elapsed = time.monotonic() - t0
        (ctx.artifact_dir / "acl.json").write_text(json.dumps({"policy": rec, "flows": results}, indent=1))
        out = Outcome(artifacts=[ctx.artifact_dir / "acl.json"], measure_s=elapsed)
        out.add("acl_enforced", 1 if allowed_ok == 1 and denied_blocked == 1 else 0)
        out.add("acl_allowed_ok", allowed_ok)
        out.add("acl_denied_blocked", denied_blocked)
        out.add("acl_flows", len(results))
        out.add("acl_check_s", elapsed)
        return out

    def _listen(self, host: Host, ctx: CaseContext) -> Process:
        ip = ctx.mesh.tunnel_ip(host)
        proc = host.spawn(
            [python(host), "-c", LISTEN, ip, str(PORT)],
            label=f"acl-listen-{host.name}",
            log_path=ctx.artifact_dir / f"acl-listen-{host.name}.log",
        )
        wait_log(proc, "ready", 15, f"acl listener on {host.name}")
        return proc

    def _flow(self, src: Host, dst: Host, proto: str, ctx: CaseContext) -> dict[str, Any]:
        ip = ctx.mesh.tunnel_ip(dst)
        t = self.params.timeout_s
        t0 = time.monotonic()
        if proto == "icmp":  # two probes: the first may wait for the VPN's handshake with a new peer
            r = src.run(
                ["ping", "-n", "-q", "-c", "2", "-i", "0.2", "-W", f"{t:g}", ip], check=False, timeout=t + 5
            )
            try:
                worked = parse_ping(r.stdout)["received"] > 0
            except WorkloadError:  # no summary: ping could not send at all (no route)
                worked = False
        else:
            r = src.run([python(src), "-c", CONNECT, ip, str(PORT), f"{t:g}"], check=False, timeout=t + 10)
            worked = r.returncode == 0
        return {
            "from": src.name,
            "to": dst.name,
            "to_ip": ip,
            "protocol": proto,
            "worked": worked,
            "seconds": round(time.monotonic() - t0, 3),
        }
