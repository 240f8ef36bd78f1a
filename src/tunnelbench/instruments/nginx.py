"""Shared nginx plumbing: a private nginx (Debian's binary) on one host with its config, pid file, logs and
temp paths all in one folder on that host (CaseContext.folder_on: the run folder here, the host's work folder
over SSH), started as a journaled process with host.spawn and stopped after.
Serves a document root (file sets) and `/api`, a REST-style endpoint answering `200 OK`."""

from __future__ import annotations

import time
from pathlib import Path

from tunnelbench.core.results import WorkloadError
from tunnelbench.instruments.common import tool
from tunnelbench.instruments.iperf3 import wait_listening
from tunnelbench.lab.host import Host, Process

CONF = """worker_processes {workers};
user root;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
worker_rlimit_nofile 65536;
events {{ worker_connections 16384; }}
http {{
  access_log off;
{http_extra}  client_body_temp_path {d}/tmp/body;
  proxy_temp_path {d}/tmp/proxy;
  fastcgi_temp_path {d}/tmp/fastcgi;
  uwsgi_temp_path {d}/tmp/uwsgi;
  scgi_temp_path {d}/tmp/scgi;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  keepalive_timeout 30s;
  default_type application/octet-stream;
  server {{
    listen {ip}:{port}{ssl} backlog=4096;
{tls}    root {root};
    {api}
{server_extra}  }}
}}
"""
API_OK = 'location = /api { default_type text/plain; return 200 "OK\\n"; }'
API_JSON = "location = /api { default_type application/json; try_files /api.json =404; }"
TLS = """    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;
"""


def nginx_version() -> str:
    import subprocess

    p = subprocess.run([tool("nginx"), "-v"], capture_output=True, text=True, timeout=10)
    return (p.stderr or p.stdout).strip().split("/")[-1]


def make_certificate(host: Host, workdir: Path) -> tuple[Path, Path]:
    """A self-signed ECDSA P-256 certificate for one case's TLS endpoint (openssl; the key 0600, removed with
    the nginx folder's tmp by stop_nginx). hey does not verify certificates, as a benchmark client need not."""
    cert, key = workdir / "api-cert.pem", workdir / "api-key.pem"
    host.mkdir(workdir)
    host.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
              "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=tunnelbench-api"])  # fmt: skip
    host.run(["chmod", "600", str(key)])
    return cert, key


def start_nginx(
    host: Host,
    ip: str,
    port: int,
    workdir: Path,
    root: Path | None = None,
    workers: int = 1,
    tls: tuple[Path, Path] | None = None,
    api_json: bool = False,
    http_extra: str = "",
    server_extra: str = "",
) -> Process:
    """Start nginx on `host` listening on ip:port; everything it writes stays under `workdir`, a folder on
    `host`. `tls` = (certificate, key) serves HTTPS; `api_json` serves `<root>/api.json` at /api instead of
    "OK". `http_extra`, `server_extra`: lines added to the http and server blocks (many_clients' barrier)."""
    d = workdir
    root = root or d / "www"
    subs = ("tmp/body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi")
    host.run(["mkdir", "-p", "--", *(str(d / sub) for sub in subs), str(root)])  # one round trip over SSH
    conf = d / "nginx.conf"
    tls_conf = TLS.format(cert=tls[0], key=tls[1]) if tls else ""
    host.write_file(
        conf,
        CONF.format(
            workers=workers,
            d=d,
            ip=ip,
            port=port,
            root=root,
            ssl=" ssl" if tls else "",
            tls=tls_conf,
            api=API_JSON if api_json else API_OK,
            http_extra=http_extra,
            server_extra=server_extra,
        ),
    )
    argv = [tool("nginx"), "-p", str(d), "-c", str(conf), "-e", str(d / "error.log"), "-g", "daemon off;"]
    check = host.run([*argv, "-t"], check=False)
    if check.returncode != 0:
        raise WorkloadError(f"nginx config test failed: {(check.stdout + check.stderr)[-400:]}")
    proc = host.spawn(argv, label="nginx", log_path=d / "nginx.out")
    try:
        wait_listening(host, port, timeout=5, what="nginx")
    except WorkloadError:
        stop_nginx(proc, d)
        log = d / "error.log"
        said = host.read_file(log).decode(errors="replace")[-400:] if host.exists(log) else "no error.log"
        raise WorkloadError(f"nginx did not start: {said}") from None
    return proc


def stop_nginx(proc: Process, workdir: Path) -> None:
    """Stop the master (SIGTERM: fast shutdown, it takes its workers down) and wait for the pid file to go."""
    proc.stop(grace=5)
    pid_file = workdir / "nginx.pid"
    end = time.monotonic() + 5
    while proc.host.exists(pid_file) and time.monotonic() < end:
        time.sleep(0.05)
