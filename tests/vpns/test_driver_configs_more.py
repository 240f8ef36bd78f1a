"""Drivers' generated configs and keys for a 3-host mesh, without a lab (issue 18 item 3; the first drivers are
in test_driver_configs.py): configure() runs against hosts that are plain folders on this machine, nothing is
started. Each config is checked against a reference outside the driver wherever one exists: the VPN's own
config check (`ocserv --test-config`, `headscale configtest`, `headscale policy check`), its own parser
(swanctl parses swanctl.conf and sends what it would load to a stand-in vici socket; libstrongswan parses
strongswan.conf), the keys themselves (`wg pubkey` of every private key against what the peers list,
`openssl verify` of every certificate against the run's CA), the binaries' own option lists (`openvpn --help`,
`edge -h`, `vpncloud --help`), and shell syntax (`sh -n`) for generated scripts.

Drivers whose configuration is only a command line built in start() (wireguard-go, boringtun, kernel
WireGuard, n2n, vpncloud, MACsec) run start() against a `RecordingHost`: daemons are recorded instead of
spawned and `ip`/`ss`/`wg set` are recorded instead of run, so the test reads the exact argv the lab would run.
The kernel tunnels (gre, gretap, ipip, fou, gue, geneve, vxlan) render nothing: configure() is empty and
start() only runs `ip` commands, so they have no test here."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import socket
import sqlite3
import stat
import struct
import subprocess
import tempfile
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tunnelbench.catalog import DRIVERS
from tunnelbench.lab.host import THIS_MACHINE, Host, Process, Result
from tunnelbench.vpns.base import MeshSpec


class FolderHost(Host):
    """A host that is a folder: commands run on this machine, files go under `workdir`."""

    def __init__(self, i: int, root: Path):
        self.name, self.underlay_ip, self.journal = f"h{i}", f"10.99.0.{i}", None
        self.workdir = root / self.name

    def argv(self, argv):
        return list(argv)


@dataclass
class _Recorded(Process):
    def alive(self) -> bool:
        return True


class RecordingHost(FolderHost):
    """start() without a lab: spawn() records the daemon's argv and env and starts nothing; `ip`, `ss`,
    `cat /sys/...` and `wg set` are recorded and answered (tun_flags 0x1001: a TUN without IFF_VNET_HDR);
    everything else (key generation, version queries) runs here for real."""

    def __init__(self, i: int, root: Path):
        super().__init__(i, root)
        self.spawned: list[tuple[str, list[str], dict]] = []
        self.ran: list[list[str]] = []

    def spawn(self, argv, *, label, log_path, env=None, stdin_devnull=True):
        self.spawned.append((label, list(argv), dict(env or {})))
        return _Recorded(self, label, list(argv), 0, log_path)

    def run(self, argv, **kw):
        argv = list(argv)
        cmd = [
            os.path.basename(argv[0]),
            *argv[1:],
        ]  # drivers run binaries by their resolved path (/usr/bin/wg)
        if cmd[0] in ("ip", "ss", "cat") or cmd[:2] == ["wg", "set"]:
            self.ran.append(cmd)
            return Result(argv, 0, "0x1001\n" if cmd[0] == "cat" else "recorded\n", "", 0.0)
        return super().run(argv, **kw)

    def exists(self, path: Path) -> bool:  # wireguard-go's UAPI socket
        return str(path).startswith("/var/run/wireguard/") or super().exists(path)


def mesh(name: str, tmp_path: Path, host_cls=FolderHost, kernel: bool = True, **spec):
    """A configured driver for h1..h3. kernel=False: the config is rendered even where this kernel could not
    run the VPN (only the binaries configure() uses must be here)."""
    cls = DRIVERS[name]
    if kernel:
        a = cls.availability()
        if not a.ok:
            pytest.skip(f"{name}: {a.reason}")
    else:
        missing = [b for b in cls.binaries if shutil.which(THIS_MACHINE.binary(b, cls.installs)) is None]
        if missing:
            pytest.skip(f"{name}: missing binaries: {', '.join(missing)}")
    hosts = [host_cls(i, tmp_path) for i in (1, 2, 3)]
    d = cls(MeshSpec(hosts=hosts, tag="tbcf00", workdir=tmp_path, **spec))
    d.configure()
    return d, hosts


def started(d, hosts):
    """Run start() on every RecordingHost (no waiting: nothing runs)."""
    d.wait_for = lambda *a, **k: None
    for h in hosts:
        d.start(h)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def sh(*argv: str, **kw) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30, **kw).stdout


def opts(argv: list[str], prefix: str = "--") -> dict[str, list[str]]:
    """`--name arg...` (or `-x arg`) of a command line, as name -> args (the last one wins)."""
    out: dict[str, list[str]] = {}
    cur = None
    for a in argv[1:]:
        if a.startswith(prefix) or (prefix == "-" and re.fullmatch(r"-[A-Za-z]", a)):
            cur = a
            out[cur] = []
        elif cur is not None:
            out[cur].append(a)
    return out


# -- certificates (openvpn, openconnect) -------------------------------------------------------------------
def check_cert(d_host: Path, name: str, purpose: str, ip: str | None = None) -> None:
    """host.crt is signed by the run's CA for `purpose`, names `name` (and `ip`), and is host.key's."""
    ca, crt, key = d_host / "ca.crt", d_host / "host.crt", d_host / "host.key"
    r = subprocess.run(["openssl", "verify", "-CAfile", str(ca), "-purpose", purpose, str(crt)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
    subject = sh("openssl", "x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in", str(crt))
    assert subject.strip() == f"subject=CN={name}"
    assert sh("openssl", "pkey", "-pubout", "-in", str(key)) == sh(
        "openssl", "x509", "-noout", "-pubkey", "-in", str(crt)
    )
    if ip is not None:
        san = sh("openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(crt))
        assert f"IP Address:{ip}" in san, san
    assert mode(key) == 0o600


def test_openvpn_tunnels_for_3_hosts_pair_up_and_their_certificates_verify(tmp_path):
    d, hosts = mesh("openvpn", tmp_path, mtu=1400)
    help_text = subprocess.run(["openvpn", "--help"], capture_output=True, text=True).stdout
    ca = (d.host_dir(hosts[0]) / "ca.crt").read_bytes()
    ifnames = set()
    assert len(d.pairs) == 3
    for k, (srv, cli) in enumerate(d.pairs):
        s = opts(d._argv(srv, cli, k, True))
        c = opts(d._argv(cli, srv, k, False))
        for o, me, peer in ((s, srv, cli), (c, cli, srv)):
            unknown = [x for x in o if f"\n{x} " not in help_text and f"\n{x}\n" not in help_text]
            assert not unknown, f"options openvpn --help does not list: {unknown}"
            assert o["--port"] == [str(1194 + k)] and o["--proto"] == ["udp"]
            assert o["--remote"] == [peer.underlay_ip]
            assert o["--ifconfig"] == [f"10.77.0.{me.name[1]}", f"10.77.0.{peer.name[1]}"]
            assert o["--tun-mtu"] == ["1400"] and o["--cipher"] == o["--data-ciphers"] == ["AES-256-GCM"]
            assert o["--verify-x509-name"] == [peer.name, "name"]
            hd = d.host_dir(me)
            assert (o["--ca"], o["--cert"], o["--key"]) == ([str(hd / "ca.crt")], [str(hd / "host.crt")],
                                                           [str(hd / "host.key")])  # fmt: skip
            assert (hd / "ca.crt").read_bytes() == ca
            ifnames.add((me.name, o["--dev"][0]))
            assert len(o["--dev"][0]) <= 15
        # each end checks the other's certificate for the role it plays
        assert "--tls-server" in s and s["--remote-cert-tls"] == ["client"]
        assert "--tls-client" in c and c["--remote-cert-tls"] == ["server"]
        check_cert(d.host_dir(srv), srv.name, "sslserver")
        check_cert(d.host_dir(cli), cli.name, "sslclient")
    assert len(ifnames) == 6 and len({i for _, i in ifnames}) == 6  # one tun per host per peer
    assert mode(d.host_dir(hosts[0]) / "ca" / "ca.key") == 0o600


@pytest.mark.parametrize("name", ["wireguard-go", "boringtun", "wireguard"])
def test_wireguard_peers_carry_the_public_key_of_each_peers_private_key(tmp_path, name):
    # kernel WireGuard (absent from this kernel) renders the same keys and `wg set`: kernel=False
    d, hosts = mesh(name, tmp_path, host_cls=RecordingHost, kernel=name != "wireguard", mtu=1380)
    started(d, hosts)
    pub = {}
    for h in hosts:
        key = d.host_dir(h) / "private.key"
        assert mode(key) == 0o600
        pub[h.name] = sh("wg", "pubkey", input=key.read_text()).strip()
    assert len(set(pub.values())) == 3
    for h in hosts:
        ifname = f"tbcf00v{h.name[1]}"
        [cmd] = [a for a in h.ran if a[:2] == ["wg", "set"]]
        assert cmd[2:7] == [ifname, "listen-port", "51820", "private-key", str(d.host_dir(h) / "private.key")]
        peers, rest = {}, cmd[7:]
        while rest:
            assert rest[0] == "peer" and rest[2] == "endpoint" and rest[4] == "allowed-ips", rest
            peers[rest[1]] = (rest[3], rest[5])
            rest = rest[6:]
        assert peers == {
            pub[p.name]: (f"{p.underlay_ip}:51820", f"10.77.0.{p.name[1]}/32") for p in hosts if p is not h
        }
        assert ["ip", "addr", "add", f"10.77.0.{h.name[1]}/24", "dev", ifname] in h.ran
        assert ["ip", "link", "set", ifname, "mtu", "1380", "up"] in h.ran


def test_vpncloud_shares_one_password_and_dials_every_peer(tmp_path):
    d, hosts = mesh("vpncloud", tmp_path, host_cls=RecordingHost, mtu=1400)
    started(d, hosts)
    help_text = sh(THIS_MACHINE.binary("vpncloud", d.installs), "--help")
    passwords = set()
    for h in hosts:
        path = d.host_dir(h) / "vpncloud.yaml"
        conf = yaml.safe_load(path.read_text())
        assert mode(path) == 0o600 and set(conf) == {"crypto"} and set(conf["crypto"]) == {"password"}
        pw = conf["crypto"]["password"]
        assert len(pw) >= 24
        passwords.add(pw)
        [(label, argv, env)] = h.spawned
        assert pw not in " ".join(argv) and pw not in json.dumps(env)  # never on a command line
        flags = [a for a in argv[1:] if a.startswith("-")]
        assert all(re.search(rf"(^|[ ,]){re.escape(f)}\b", help_text, re.M) for f in flags), flags
        o = opts(argv, "-")
        assert o["--config"] == [str(path)] and o["-t"] == ["tun"] and o["-l"] == ["3210"]
        assert o["-d"] == [f"tbcf00v{h.name[1]}"] and o["--claim"] == [f"10.77.0.{h.name[1]}/32"]
        dialled = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
        assert sorted(dialled) == [f"{p.underlay_ip}:3210" for p in hosts if p is not h]
        assert ["ip", "link", "set", f"tbcf00v{h.name[1]}", "mtu", "1400", "up"] in h.ran
    assert len(passwords) == 1


def test_n2n_edges_register_with_one_supernode_and_share_the_community_key(tmp_path):
    d, hosts = mesh("n2n", tmp_path, host_cls=RecordingHost, mtu=1380)
    started(d, hosts)
    usage = subprocess.run([THIS_MACHINE.binary("edge", d.installs), "-h"], capture_output=True, text=True)
    usage = usage.stdout + usage.stderr
    supernodes = [(h, argv) for h in hosts for label, argv, _ in h.spawned if label == "supernode"]
    assert [(h.name, argv[1:]) for h, argv in supernodes] == [("h1", ["-l", "7654"])]
    keys, macs, communities = set(), set(), set()
    for h in hosts:
        key_file = d.host_dir(h) / "community.key"
        assert mode(key_file) == 0o600
        [(argv, env)] = [(a, e) for label, a, e in h.spawned if label == "edge"]
        o = opts(argv, "-")
        assert all(re.search(rf"^{f} ", usage, re.M) for f in o), f"edge -h does not list one of {list(o)}"
        assert "-k" not in o and key_file.read_text().strip() not in " ".join(argv)  # the key is in N2N_KEY
        assert env["N2N_KEY"] == key_file.read_text().strip()
        keys.add(env["N2N_KEY"])
        assert o["-d"] == [f"tbcf00v{h.name[1]}"] and o["-a"] == [f"10.77.0.{h.name[1]}"]
        assert o["-s"] == ["255.255.255.0"] and o["-M"] == ["1380"] and "-r" in o
        assert o["-l"] == [f"{hosts[0].underlay_ip}:7654"]
        mac = o["-m"][0]
        assert int(mac.split(":")[0], 16) & 0b11 == 0b10  # locally administered unicast
        macs.add(mac)
        communities.add(o["-c"][0])
    assert len(keys) == 1 and len(macs) == 3 and len(communities) == 1
    assert len(next(iter(keys))) == 32


# -- strongSwan: swanctl parses swanctl.conf and sends what it would load to a stand-in vici socket ---------
def _vici_message(buf: bytes) -> dict:
    out: dict = {}
    stack, cur, i, lst = [], out, 0, None
    while i < len(buf):
        t = buf[i]
        i += 1
        if t in (1, 3, 4):  # section start, key-value, list start: a name follows
            name = buf[i + 1 : i + 1 + buf[i]].decode()
            i += 1 + buf[i]
        if t == 1:
            stack.append(cur)
            cur[name] = cur = {}
        elif t == 2:
            cur = stack.pop()
        elif t in (3, 5):  # key-value, list item: a 16-bit length and the value
            (n,) = struct.unpack(">H", buf[i : i + 2])
            value = buf[i + 2 : i + 2 + n].decode("latin-1")
            i += 2 + n
            if t == 3:
                cur[name] = value
            else:
                lst.append(value)  # type: ignore[union-attr]
        elif t == 4:
            cur[name] = lst = []
    return out


def swanctl_load(swanctl_conf: Path, strongswan_conf: Path) -> tuple[str, list[tuple[str, dict]]]:
    """`swanctl --load-all --file swanctl_conf` against a stand-in vici socket that records every request
    and answers success: what swanctl parsed from the file, as charon would receive it."""
    got: list[tuple[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="tbvici") as tmp:
        path = f"{tmp}/vici"
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        srv.listen(1)
        srv.settimeout(20)

        def recv(c, n):
            b = b""
            while len(b) < n:
                x = c.recv(n - len(b))
                if not x:
                    raise EOFError
                b += x
            return b

        def serve():
            try:
                c, _ = srv.accept()
                with c:
                    while True:
                        (n,) = struct.unpack(">I", recv(c, 4))
                        pkt = recv(c, n)
                        if pkt[0] == 0:  # command request: name, message -> response success=yes
                            got.append((pkt[2 : 2 + pkt[1]].decode(), _vici_message(pkt[2 + pkt[1] :])))
                            body = b"\x01\x03\x07success\x00\x03yes"
                        else:  # event (un)register -> confirm
                            body = b"\x05"
                        c.sendall(struct.pack(">I", len(body)) + body)
            except (EOFError, OSError):
                pass

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        r = subprocess.run(["swanctl", "--load-all", "--noprompt", "--file", str(swanctl_conf), "--uri",
                            f"unix://{path}"], capture_output=True, text=True, timeout=30,
                           env={"STRONGSWAN_CONF": str(strongswan_conf), "PATH": "/usr/sbin:/usr/bin"})  # fmt: skip
        t.join(2)
        srv.close()
    out = "\n".join(x for x in (r.stdout + r.stderr).splitlines() if "failed to load" not in x)
    assert r.returncode == 0, out  # 64: libstrongswan could not parse strongswan.conf
    assert "invalid config file" not in out and "syntax error" not in out, out
    return out, got


IPSEC = [
    "strongswan",
    "ipsec-tunnel",
    "ipsec-transport",
    "ipsec-vti",
    "ipsec-xfrmi",
    "gre-ipsec",
    "vxlan-ipsec",
]


@pytest.mark.parametrize("name", IPSEC)
def test_strongswan_configs_load_through_swanctl_and_mirror_each_other(tmp_path, name):
    # the kernel IPsec drivers need ESP in the kernel to run, not to render: kernel=False
    d, hosts = mesh(name, tmp_path, kernel=False)
    plugins = {
        p.name.removeprefix("libstrongswan-").removesuffix(".so")
        for p in Path("/usr/lib/ipsec/plugins").glob("libstrongswan-*.so")
    }
    conns, secrets = {}, {}
    for h in hosts:
        hd = d.host_dir(h)
        assert mode(hd / "swanctl.conf") == 0o600  # holds the PSKs
        ss_conf = (hd / "strongswan.conf").read_text()
        load = re.search(r"^  load = (.*)$", ss_conf, re.M).group(1).split()
        assert set(load) <= plugins, set(load) - plugins  # every plugin charon loads is installed
        assert ("kernel-libipsec" in load) == (name == "strongswan")
        out, got = swanctl_load(hd / "swanctl.conf", hd / "strongswan.conf")
        loaded = [m for cmd, m in got if cmd == "load-conn"]
        assert len(loaded) == 2, out
        conns[h.name] = {k: v for m in loaded for k, v in m.items()}
        for cmd, m in got:
            if cmd == "load-shared":
                assert (m["type"], len(m["data"])) == ("ike", 32)
                secrets[(h.name, frozenset(m["owners"]))] = m["data"]
    for h in hosts:
        for p in hosts:
            if p is h:
                continue
            c, back = conns[h.name][p.name], conns[p.name][h.name]
            assert c["local_addrs"] == [h.underlay_ip] and c["remote_addrs"] == [p.underlay_ip]
            assert c["local"] == {"auth": "psk", "id": h.name} and c["remote"] == {
                "auth": "psk",
                "id": p.name,
            }
            assert c["version"] == "2" and c["proposals"] == ["aes256gcm16-prfsha256-x25519"]
            # the two ends' CHILD_SAs are each other's mirror image, in the same mode
            mine = {(tuple(k["local_ts"]), tuple(k["remote_ts"]), k["mode"]) for k in c["children"].values()}
            theirs = {
                (tuple(k["remote_ts"]), tuple(k["local_ts"]), k["mode"]) for k in back["children"].values()
            }
            assert mine == theirs and mine
            for kid in c["children"].values():
                assert kid["esp_proposals"] == ["aes256gcm16"]
                if name in ("strongswan", "ipsec-tunnel", "ipsec-vti", "ipsec-xfrmi"):
                    assert kid["mode"] == "tunnel"
                    assert kid["local_ts"] == [f"10.77.0.{h.name[1]}/32"]
                else:
                    assert kid["mode"] == "transport" and kid["local_ts"][0].startswith(f"{h.underlay_ip}/32")
                if name == "ipsec-vti":
                    assert kid["mark_in"] == kid["mark_out"] == str(100 + int(p.name[1]))
                if name == "ipsec-xfrmi":
                    assert kid["if_id_in"] == kid["if_id_out"] == str(100 + int(p.name[1]))
            # exactly one end starts the SA; under kernel ESP both ends trap
            starts = [k["start_action"] for k in (*c["children"].values(), *back["children"].values())]
            assert sum("start" in s for s in starts) == len(starts) // 2
            if name != "strongswan":
                assert all("trap" in s for s in starts)
            pair = frozenset((h.name, p.name))
            assert secrets[(h.name, pair)] == secrets[(p.name, pair)]  # both ends hold the pair's PSK
    assert len(set(secrets.values())) == 3  # one PSK per pair


def test_softether_clients_log_in_to_the_hub_with_the_passwords_the_hub_set(tmp_path):
    d, hosts = mesh("softether", tmp_path)
    hub = hosts[-1]
    server = (d.host_dir(hub) / "server.cmds").read_text().splitlines()
    assert mode(d.host_dir(hub) / "server.cmds") == 0o600 and not (d.host_dir(hub) / "client.cmds").exists()
    assert "BridgeCreate DEFAULT /DEVICE:tbcf00v3 /TAP:yes" in server and "Hub DEFAULT" in server
    assert server.index("Hub DEFAULT") < min(i for i, x in enumerate(server) if x.startswith("UserCreate"))
    users = {m[1]: m[2] for x in server if (m := re.fullmatch(r"UserPasswordSet (\S+) /PASSWORD:(\S+)", x))}
    assert {x.split()[1] for x in server if x.startswith("UserCreate ")} == set(users) == {"h1", "h2"}
    assert len(set(users.values())) == 2
    for h in hosts[:-1]:
        path = d.host_dir(h) / "client.cmds"
        assert mode(path) == 0o600
        lines = path.read_text().splitlines()
        nic = f"tbcf00v{h.name[1]}"
        assert lines[0] == f"NicCreate {nic}" and lines[-1] == "AccountConnect tb"
        create = dict(kv.split(":", 1) for kv in lines[1].split()[2:])
        assert lines[1].startswith("AccountCreate tb ")
        assert create == {
            "/SERVER": f"{hub.underlay_ip}:443",
            "/HUB": "DEFAULT",
            "/USERNAME": h.name,
            "/NICNAME": nic,
        }
        assert lines[2] == f"AccountPasswordSet tb /PASSWORD:{users[h.name]} /TYPE:standard"
        assert len(d._iface(h)) <= 15


@pytest.mark.parametrize("acl", ["isolate", "off"])
def test_tailscale_headscale_config_passes_configtest_and_its_policy_check(tmp_path, monkeypatch, acl):
    import tunnelbench.vpns.tailscale as ts

    monkeypatch.setattr(ts, "SOCK_DIR", tmp_path / "sock")  # not the machine's /run/tbsock
    d, hosts = mesh("tailscale", tmp_path, options={"acl": acl})
    infra = d.host_dir(hosts[-1]) / "infra"
    path = infra / "headscale.yaml"
    conf = yaml.safe_load(path.read_text())
    assert mode(path) == 0o600
    ip = hosts[-1].underlay_ip
    assert conf["server_url"] == f"http://{ip}:8080" and conf["listen_addr"] == f"{ip}:8080"
    assert conf["derp"]["server"]["enabled"] is False and conf["derp"]["urls"] == []  # no public DERP
    assert (
        conf["derp"]["paths"] == [str(infra / "derp.yaml")] and conf["derp"]["auto_update_enabled"] is False
    )
    assert conf["prefixes"]["v4"] == "100.64.0.0/10" and "v6" not in conf["prefixes"]
    assert conf["logtail"]["enabled"] is False and conf["disable_check_updates"] is True
    assert Path(conf["unix_socket"]).parent == tmp_path / "sock"
    for p in (conf["noise"]["private_key_path"], conf["database"]["sqlite"]["path"]):
        assert Path(p).parent == infra
    hs = [THIS_MACHINE.binary("headscale", d.installs), "-c", str(path), "--force"]
    r = subprocess.run([*hs, "configtest"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr  # headscale loads the config (and the policy file)
    if acl == "off":
        assert conf["policy"] == {"mode": "file", "path": ""} and not (infra / "policy.json").exists()
    else:
        policy = infra / "policy.json"
        assert conf["policy"] == {"mode": "file", "path": str(policy)} and mode(policy) == 0o600
        r = subprocess.run([*hs, "policy", "check", "-f", str(policy), "--bypass-grpc-and-access-database-directly"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
        assert r.returncode == 0 and "Policy is valid" in r.stdout + r.stderr, r.stdout + r.stderr
        p = json.loads(policy.read_text())
        # the tags the pre-auth keys get are the policy's, and only client -> server is allowed
        assert [d._tag(h) for h in hosts] == ["tag:tb-client", "tag:tb-server", "tag:tb-isolated"]
        assert set(p["tagOwners"]) == {d._tag(h) for h in hosts}
        assert p["acls"] == [{"action": "accept", "src": ["tag:tb-client"], "dst": ["tag:tb-server:*"]}]
    # the DERP map (written at start, once derper has named its certificate)
    d.certname = "sha256-raw:" + "ab" * 32
    derp = yaml.safe_load(d._derp_map())
    assert list(derp["regions"]) == [900]  # an integer key, as Headscale wants it
    [node] = derp["regions"][900]["nodes"]
    assert node["hostname"] == node["ipv4"] == ip and node["regionid"] == 900
    assert (node["derpport"], node["stunport"], node["certname"]) == (8443, 3478, d.certname)


@pytest.mark.root
def test_innernet_invitations_match_the_servers_database_and_keys(tmp_path):
    d, hosts = mesh("innernet", tmp_path)
    server = hosts[-1]
    net = "tbcf00v3"
    sconf_path = d.host_dir(server) / "etc" / f"{net}.conf"
    sconf = tomllib.loads(sconf_path.read_text())
    assert mode(sconf_path) == 0o600
    assert (sconf["listen-port"], sconf["address"], sconf["network-cidr-prefix"]) == (51820, "10.77.0.1", 24)
    server_pub = sh("wg", "pubkey", input=sconf["private-key"] + "\n").strip()
    db = sqlite3.connect(d.host_dir(server) / "data" / f"{net}.db")
    peers = {r[0]: r[1:] for r in db.execute("select name, ip, public_key, is_admin, cidr_id from peers")}
    cidrs = {r[0]: (r[1], r[2]) for r in db.execute("select id, ip, prefix from cidrs")}
    db.close()
    assert peers["innernet-server"][:2] == ("10.77.0.1", server_pub)
    assert not list(d.host_dir(server).glob("invite*"))  # the server keeps no invitation
    for h in hosts[:-1]:
        path = d.host_dir(h) / "invite.toml"
        assert mode(path) == 0o600  # carries the peer's WireGuard private key
        inv = tomllib.loads(path.read_text())
        ip = f"10.77.0.{128 + int(h.name[1])}"
        assert inv["interface"]["network-name"] == net and inv["interface"]["address"] == f"{ip}/24"
        assert inv["server"]["public-key"] == server_pub
        assert inv["server"]["external-endpoint"] == f"{server.underlay_ip}:51820"
        assert inv["server"]["internal-endpoint"] == "10.77.0.1:51820"
        pub = sh("wg", "pubkey", input=inv["interface"]["private-key"] + "\n").strip()
        ip_db, pub_db, admin, cidr = peers[h.name]
        assert (ip_db, pub_db, admin) == (ip, pub, 0)  # the server knows the invitation's key, no admin
        assert ipaddress.ip_address(ip) in ipaddress.ip_network("/".join(map(str, cidrs[cidr])))
    assert len({v[1] for v in peers.values()}) == 3  # three distinct WireGuard keys


def test_openconnect_ocserv_configs_pass_test_config_and_certificates_verify(tmp_path):
    d, hosts = mesh("openconnect", tmp_path, mtu=1400)
    empty = tmp_path / "empty-path"  # generated scripts run with nothing on PATH: no `ip` can run
    empty.mkdir()
    pool = None
    for k, (srv, cli) in enumerate(d.pairs):
        pd = d.host_dir(srv) / f"ocserv-{cli.name}"
        conf_path = pd / "ocserv.conf"
        r = subprocess.run(["ocserv", "--test-config", "--config", str(conf_path)], capture_output=True,
                           text=True, timeout=30)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        conf = {}
        for line in conf_path.read_text().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.partition(" = ")
                assert key not in conf, f"{key} twice"
                conf[key] = value.strip('"')
        assert conf["listen-host"] == srv.underlay_ip and conf["tcp-port"] == conf["udp-port"] == str(
            8443 + k
        )
        assert conf["auth"] == "certificate" and conf["cert-user-oid"] == "2.5.4.3"  # user = the cert's CN
        assert conf["mtu"] == str(1400 + 66)  # link MTU: the tun MTU + DTLS 1.2 AES-GCM over IPv4
        hd = d.host_dir(srv)
        assert (conf["server-cert"], conf["server-key"], conf["ca-cert"]) == (
            str(hd / "host.crt"),
            str(hd / "host.key"),
            str(hd / "ca.crt"),
        )
        assert len(conf["device"]) <= 13  # the kernel appends a number
        pool = ipaddress.ip_network(conf["ipv4-network"])
        # the client is leased exactly its tunnel address, inside the pool; the pool's first address (the
        # server's end until the connect-script runs) is no host's
        user = (pd / "users" / cli.name).read_text()
        assert user == f"explicit-ipv4 = 10.77.0.{cli.name[1]}\n"
        assert ipaddress.ip_address(f"10.77.0.{cli.name[1]}") in pool
        assert str(pool.network_address + 1) not in {f"10.77.0.{h.name[1]}" for h in hosts}
        check_cert(d.host_dir(srv), srv.name, "sslserver", ip=srv.underlay_ip)
        check_cert(d.host_dir(cli), cli.name, "sslclient", ip=cli.underlay_ip)
        # the scripts: valid shell, and each refuses what is not its peer before touching anything
        server_script, client_script = pd / "connect.sh", d.host_dir(cli) / f"client-{srv.name}.sh"
        for script in (server_script, client_script):
            sh("sh", "-n", str(script))
            assert mode(script) == 0o755
        env = {"PATH": str(empty), "REASON": "connect", "USERNAME": "intruder", "IP_REMOTE": "10.77.0.9"}
        r = subprocess.run(["/bin/sh", str(server_script)], capture_output=True, text=True, env=env)
        assert r.returncode == 1 and f"want {cli.name} with 10.77.0.{cli.name[1]}" in r.stderr
        env = {"PATH": str(empty), "reason": "connect", "INTERNAL_IP4_ADDRESS": "10.77.0.9"}
        r = subprocess.run(["/bin/sh", str(client_script)], capture_output=True, text=True, env=env)
        assert r.returncode == 1 and f"not 10.77.0.{cli.name[1]}" in r.stderr
        env = {"PATH": str(empty), "reason": "disconnect"}
        assert subprocess.run(["/bin/sh", str(client_script)], env=env).returncode == 0
    assert pool is not None and pool.network_address + 1 != ipaddress.ip_address("10.77.0.1")
    ca = {(d.host_dir(h) / "ca.crt").read_bytes() for h in hosts}
    assert len(ca) == 1 and mode(d.host_dir(hosts[0]) / "ca" / "ca.key") == 0o600


def test_macsec_key_batch_gives_each_peer_the_senders_transmit_key(tmp_path):
    # MACsec (absent from this kernel) makes its keys in configure() and writes them at start: kernel=False
    d, hosts = mesh("macsec", tmp_path, host_cls=RecordingHost, kernel=False)
    started(d, hosts)
    tx, rx, carrier_mac = {}, {}, {}
    for h in hosts:
        batch = d.host_dir(h) / "macsec-keys.batch"
        assert mode(batch) == 0o600 and ["ip", "-batch", str(batch)] in h.ran
        assert not any(d.keys[h.name] in " ".join(a) for a in h.ran)  # keys never on a command line
        for a in h.ran:
            if a[:3] == ["ip", "link", "add"] and "gretap" in a:
                carrier_mac[h.name] = a[a.index("address") + 1]
            if a[:3] == ["ip", "link", "add"] and "macsec" in a:
                assert a[a.index("cipher") + 1] == "gcm-aes-128" and a[a.index("encrypt") + 1] == "on"
        for line in batch.read_text().splitlines():
            if m := re.fullmatch(r"macsec add (\S+) tx sa 0 pn 1 on key 01 ([0-9a-f]{32})", line):
                tx.setdefault(h.name, set()).add(m.group(2))
            elif m := re.fullmatch(
                r"macsec add (\S+) rx port 1 address (\S+) sa 0 pn 1 on key 02 ([0-9a-f]{32})", line
            ):
                rx[(h.name, m.group(2))] = m.group(3)
    assert all(len(v) == 1 for v in tx.values()) and len({next(iter(v)) for v in tx.values()}) == 3
    for h in hosts:
        for p in hosts:
            if p is not h:  # p receives h's frames (source MAC: h's carrier) with h's transmit key
                assert rx[(p.name, carrier_mac[h.name])] == next(iter(tx[h.name]))


# the encapsulation each plain kernel tunnel asks the kernel for, written from ip-link(8) and the RFCs (gre:
# RFC 2784, gretap: GRE carrying Ethernet, ipip: RFC 2003, geneve: RFC 8926 with a VNI and the peer)
KERNEL_LINK = {
    "gre": ("gre", False),
    "gretap": ("gretap", True),
    "ipip": ("ipip", False),
    "geneve": ("geneve", True),
}


@pytest.mark.parametrize("name", sorted(KERNEL_LINK))
def test_kernel_tunnel_links_one_device_per_peer_of_its_kind(name, tmp_path):
    """What start() asks `ip` for on each host: one device per peer, of the tunnel's kind, toward that peer's
    underlay address, with the tunnel address, MTU and (L2 kinds) the peer's MAC pinned. The kernel lane
    brings gre (and fou, macsec, ...) up for real; gretap, ipip and geneve differ from gre only here, so
    their real bring-up is in the long lane."""
    kind, l2 = KERNEL_LINK[name]
    d, hosts = mesh(name, tmp_path, host_cls=RecordingHost, kernel=False, mtu=1400)
    started(d, hosts)
    for h in hosts:
        adds = [a for a in h.ran if a[:3] == ["ip", "link", "add"]]
        assert len(adds) == 2, h.ran  # one per peer
        for a, p in zip(adds, [p for p in hosts if p is not h], strict=True):
            assert a[a.index("type") + 1] == kind, a
            assert p.underlay_ip in a and (h.underlay_ip in a or kind == "geneve"), a  # geneve: remote only
            dev = a[3]
            assert ["ip", "addr", "add", d.tunnel_ip(h), "peer", f"{d.tunnel_ip(p)}/32", "dev", dev] in h.ran
            assert ["ip", "link", "set", dev, "mtu", "1400", "up"] in h.ran
            neigh = [x for x in h.ran if x[:3] == ["ip", "neigh", "replace"] and dev in x]
            assert (neigh != []) == l2 and ("address" in a) == l2, (a, neigh)
