//! quicperf: the QUIC tool of tunnelbench's `quic` workload (seed 003's qperf: connection set-up time and time
//! to first byte, with retries; plus a bulk download for goodput), on quinn (pinned in Cargo.toml/Cargo.lock).
//!
//! The wire protocol is the QUIC perf protocol (draft-banks-quic-performance, ALPN "perf"): the client opens a
//! bidirectional stream, sends the number of bytes it wants back as an 8-byte big-endian integer (and nothing
//! else here), and closes its side; the server reads to the end of the stream and answers with that many bytes.
//!
//!   quicperf version
//!       one JSON line: this tool's version and quinn's
//!   quicperf server -listen IP:PORT
//!       prints `ready` once listening; on SIGTERM/SIGINT prints one JSON line {"server": {...}} with its own
//!       counts (connections accepted after a completed handshake, streams, payload bytes sent and received,
//!       errors) and its largest response (bytes; CLOCK_MONOTONIC before its first write, before its last write
//!       and when the client had acknowledged all of it; CPU seconds over that; the connection's packet
//!       counters), and exits 0
//!   quicperf client -server IP:PORT [-handshakes N] [-retries R] [-timeout D] [-ttfb-bytes B]
//!                   [-bulk-bytes N] [-bulk-timeout D] [-interval D]          (D: 2s, 150ms, 500us)
//!       N probes, each a new connection from a new UDP socket (made before the clock starts) without session
//!       resumption, so a full 1-RTT handshake: the handshake time is from connect until the client's handshake
//!       is complete; the time to first byte from connect until the first byte of a B-byte response on the
//!       connection's first stream (so it includes the handshake, as qperf's). A probe whose handshake or
//!       request fails (an error, or no answer within the timeout) is retried up to R times, each failure
//!       counted; one that still fails is given up. Then, with -bulk-bytes, one more connection downloads N
//!       bytes, timed from the request until the last byte (CLOCK_MONOTONIC stamps printed, to compare with the
//!       server's). One JSON line on stdout; exit 1 when nothing at all was measured.
//!
//! One thread (tokio's current-thread runtime) per side: on a 2-core lab the peer, the kernel's packet path
//! and the VPN need the other core.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{ConnectionError, Endpoint, ReadError, VarInt, WriteError};
use serde::Serialize;

const TOOL_VERSION: &str = "1";
const QUINN_VERSION: &str = "0.11.12"; // Cargo.toml's exact pin
const ALPN: &[u8] = b"perf";

fn mono() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn cpu_seconds() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn ms(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

fn fail(msg: &str) -> ! {
    eprintln!("quicperf: {msg}");
    std::process::exit(2)
}

fn version() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([("quicperf", TOOL_VERSION), ("quinn", QUINN_VERSION)])
}

/// Go-style durations as the workload writes them: 2s, 0.5s, 150ms, 500us, 0s
fn duration(s: &str) -> Duration {
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => fail(&format!("duration {s:?} needs a unit (s, ms, us)")),
    };
    let n: f64 = num
        .parse()
        .unwrap_or_else(|_| fail(&format!("bad duration {s:?}")));
    let secs = match unit {
        "s" => n,
        "ms" => n / 1e3,
        "us" => n / 1e6,
        _ => fail(&format!("bad duration unit in {s:?}")),
    };
    if !(secs >= 0.0 && secs.is_finite()) {
        fail(&format!("bad duration {s:?}"));
    }
    Duration::from_secs_f64(secs)
}

/// `-name value` pairs
fn flags(args: &[String], known: &[&str]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let name = a.trim_start_matches('-');
        if !a.starts_with('-') || !known.contains(&name) {
            fail(&format!(
                "unknown argument {a:?} (flags: {})",
                known.join(", ")
            ));
        }
        let v = it
            .next()
            .unwrap_or_else(|| fail(&format!("{a} needs a value")));
        out.insert(name.to_string(), v.clone());
    }
    out
}

fn num<T: std::str::FromStr>(f: &BTreeMap<String, String>, name: &str, default: T) -> T {
    match f.get(name) {
        Some(v) => v
            .parse()
            .unwrap_or_else(|_| fail(&format!("-{name}: bad number {v:?}"))),
        None => default,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match args.get(1).map(String::as_str) {
        Some("version") => println!("{}", serde_json::to_string(&version()).unwrap()),
        Some("server") => {
            let f = flags(&args[2..], &["listen"]);
            let listen = f
                .get("listen")
                .unwrap_or_else(|| fail("server: -listen IP:PORT is required"));
            let addr: SocketAddr = listen
                .parse()
                .unwrap_or_else(|_| fail(&format!("bad address {listen:?}")));
            rt.block_on(server(addr));
        }
        Some("client") => {
            let known = [
                "server",
                "handshakes",
                "retries",
                "timeout",
                "ttfb-bytes",
                "bulk-bytes",
                "bulk-timeout",
                "interval",
            ];
            let f = flags(&args[2..], &known);
            let server = f
                .get("server")
                .unwrap_or_else(|| fail("client: -server IP:PORT is required"));
            let o = ClientOpts {
                server: server
                    .parse()
                    .unwrap_or_else(|_| fail(&format!("bad address {server:?}"))),
                handshakes: num(&f, "handshakes", 20),
                retries: num(&f, "retries", 2),
                timeout: f
                    .get("timeout")
                    .map_or(Duration::from_secs(2), |s| duration(s)),
                ttfb_bytes: num(&f, "ttfb-bytes", 1),
                bulk_bytes: num(&f, "bulk-bytes", 0),
                bulk_timeout: f
                    .get("bulk-timeout")
                    .map_or(Duration::from_secs(60), |s| duration(s)),
                interval: f.get("interval").map_or(Duration::ZERO, |s| duration(s)),
            };
            if o.ttfb_bytes < 1 {
                fail("client: -ttfb-bytes must be at least 1");
            }
            let res = rt.block_on(client(o));
            println!("{}", serde_json::to_string(&res).unwrap());
            if res.probes.is_empty() && res.bulk.as_ref().is_none_or(|b| b.error.is_some()) {
                std::process::exit(1);
            }
        }
        _ => fail(
            "usage: quicperf version | server -listen IP:PORT | client -server IP:PORT [options]",
        ),
    }
}

/// A UDP socket with 8 MiB buffers each way (forced past net.core.{r,w}mem_max as root, as quic-go does): with
/// the kernel's default of about 200 KiB a receiver descheduled for half a millisecond at a few Gbit/s drops
/// datagrams (UdpRcvbufErrors), which the sender takes for congestion.
fn endpoint(bind: SocketAddr, server: Option<quinn::ServerConfig>) -> std::io::Result<Endpoint> {
    let sock = std::net::UdpSocket::bind(bind)?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    let size: libc::c_int = 8 << 20;
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        let set = |opt| unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &size as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if set(force) != 0 {
            set(plain); // not root: as far as the *mem_max sysctl lets it
        }
    }
    Endpoint::new(
        quinn::EndpointConfig::default(),
        server,
        sock,
        Arc::new(quinn::TokioRuntime),
    )
}

fn transport() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    // room for a long fat path (a 50 ms RTT at a few Gbit/s); quinn's defaults would cap it
    t.stream_receive_window(VarInt::from_u32(32 << 20));
    t.receive_window(VarInt::from_u32(48 << 20));
    t.send_window(32 << 20);
    t.max_idle_timeout(Some(VarInt::from_u32(30_000).into()));
    t
}

fn conn_kind(e: &ConnectionError) -> String {
    match e {
        ConnectionError::TimedOut => "timeout".into(),
        ConnectionError::ApplicationClosed(a) => format!("application_{}", a.error_code),
        ConnectionError::ConnectionClosed(c) => format!("transport_{:?}", c.error_code),
        ConnectionError::Reset => "reset".into(),
        ConnectionError::VersionMismatch => "version_mismatch".into(),
        ConnectionError::TransportError(t) => format!("transport_{:?}", t.code),
        ConnectionError::LocallyClosed => "locally_closed".into(),
        ConnectionError::CidsExhausted => "cids_exhausted".into(),
    }
}

fn read_kind(e: &ReadError) -> String {
    match e {
        ReadError::ConnectionLost(c) => conn_kind(c),
        ReadError::Reset(_) => "stream_reset".into(),
        other => format!("{other}").chars().take(60).collect(),
    }
}

fn write_kind(e: &WriteError) -> String {
    match e {
        WriteError::ConnectionLost(c) => conn_kind(c),
        WriteError::Stopped(_) => "stream_stopped".into(),
        other => format!("{other}").chars().take(60).collect(),
    }
}

fn clean_close(e: &ConnectionError) -> bool {
    matches!(e, ConnectionError::ApplicationClosed(a) if a.error_code == VarInt::from_u32(0))
        || matches!(e, ConnectionError::LocallyClosed)
}

// -- server ---------------------------------------------------------------------------------------------------

#[derive(Serialize, Clone, Default)]
struct Response {
    bytes: u64,
    start_mono: f64, // before the first write
    end_mono: f64,   // before the last write: its bytes cannot reach the client before then
    // when the client had acknowledged every byte (writes return once the data is in quinn's send buffer)
    acked_mono: f64,
    cpu_s: f64, // the server's CPU from the first write until acked_mono
    // the connection's counters when the response was written
    packets_sent: u64,
    packets_lost: u64,
    bytes_lost: u64,
    congestion_events: u64,
    min_rtt_ms: f64,
    mtu: u16,
}

#[derive(Serialize, Default)]
struct ServerStats {
    #[serde(skip)]
    active: u64, // streams being answered
    connections: u64, // accepted with a completed handshake
    streams: u64,
    answered: u64, // responses sent whole
    bytes_sent: u64,
    bytes_received: u64, // stream payload read, the 8-byte requests included
    errors: u64,
    error_kinds: BTreeMap<String, u64>,
    largest: Option<Response>,
    version: BTreeMap<&'static str, &'static str>,
}

type Shared = Arc<Mutex<ServerStats>>;

fn server_err(st: &Shared, kind: String) {
    let mut s = st.lock().unwrap();
    s.errors += 1;
    *s.error_kinds.entry(kind).or_default() += 1;
}

async fn server(addr: SocketAddr) {
    let cert = rcgen::generate_simple_self_signed(vec!["quicperf".into()])
        .unwrap_or_else(|e| fail(&e.to_string()));
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap_or_else(|e| fail(&e.to_string()));
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.send_tls13_tickets = 0; // no session tickets: no client can resume, every handshake is a full one
    let mut sc =
        quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls).unwrap()));
    sc.transport_config(Arc::new(transport()));
    let ep = endpoint(addr, Some(sc)).unwrap_or_else(|e| fail(&format!("listen {addr}: {e}")));
    let st: Shared = Arc::new(Mutex::new(ServerStats {
        version: version(),
        ..Default::default()
    }));
    println!("ready");
    let accept = {
        let (ep, st) = (ep.clone(), st.clone());
        async move {
            while let Some(inc) = ep.accept().await {
                let st = st.clone();
                tokio::spawn(async move {
                    match inc.await {
                        Ok(conn) => {
                            st.lock().unwrap().connections += 1;
                            serve_conn(conn, st).await;
                        }
                        Err(e) => server_err(&st, format!("handshake:{}", conn_kind(&e))),
                    }
                });
            }
        }
    };
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    tokio::select! {
        _ = accept => {},
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    // a response whose acknowledgement is still on its way is recorded before the counts are printed
    let end = Instant::now() + Duration::from_secs(1);
    while st.lock().unwrap().active > 0 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ep.close(VarInt::from_u32(0), b"");
    let s = st.lock().unwrap();
    println!(
        "{}",
        serde_json::to_string(&BTreeMap::from([("server", &*s)])).unwrap()
    );
}

async fn serve_conn(conn: quinn::Connection, st: Shared) {
    loop {
        match conn.accept_bi().await {
            Ok((send, recv)) => {
                let mut s = st.lock().unwrap();
                s.streams += 1;
                s.active += 1;
                drop(s);
                tokio::spawn(serve_stream(conn.clone(), send, recv, st.clone()));
            }
            Err(e) => {
                if !clean_close(&e) {
                    server_err(&st, conn_kind(&e));
                }
                return;
            }
        }
    }
}

async fn serve_stream(
    conn: quinn::Connection,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    st: Shared,
) {
    answer(conn, send, recv, &st).await;
    st.lock().unwrap().active -= 1;
}

async fn answer(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    st: &Shared,
) {
    let st = st.clone();
    let mut hdr = [0u8; 8];
    if recv.read_exact(&mut hdr).await.is_err() {
        server_err(&st, "short_request".into());
        let _ = send.reset(VarInt::from_u32(1));
        return;
    }
    // the perf protocol's upload (none from our client), up to the end of the stream
    let mut up = 0u64;
    loop {
        match recv.read_chunk(1 << 20, true).await {
            Ok(Some(c)) => up += c.bytes.len() as u64,
            Ok(None) => break,
            Err(e) => {
                st.lock().unwrap().bytes_received += 8 + up;
                server_err(&st, read_kind(&e));
                return;
            }
        }
    }
    st.lock().unwrap().bytes_received += 8 + up;
    let want = u64::from_be_bytes(hdr);
    let buf = Bytes::from(
        (0..256 << 10)
            .map(|i: u32| (i.wrapping_mul(131)) as u8)
            .collect::<Vec<u8>>(),
    );
    let mut r = Response {
        start_mono: mono(),
        ..Default::default()
    };
    let cpu0 = cpu_seconds();
    let mut err = None;
    while r.bytes < want {
        let n = (want - r.bytes).min(buf.len() as u64) as usize;
        if r.bytes + n as u64 == want {
            r.end_mono = mono();
        }
        if let Err(e) = send.write_chunk(buf.slice(..n)).await {
            err = Some(write_kind(&e));
            break;
        }
        r.bytes += n as u64;
    }
    if r.bytes < want || want == 0 {
        r.end_mono = mono();
    }
    let _ = send.finish();
    if err.is_none() {
        match send.stopped().await {
            Ok(None) => {}
            Ok(Some(code)) => err = Some(format!("stopped_{code}")),
            // the client closed once it had everything, before its last acknowledgement arrived
            Err(quinn::StoppedError::ConnectionLost(e)) if clean_close(&e) => {}
            Err(quinn::StoppedError::ConnectionLost(e)) => err = Some(conn_kind(&e)),
            Err(e) => err = Some(format!("{e}")),
        }
    }
    r.acked_mono = mono();
    r.cpu_s = cpu_seconds() - cpu0;
    let p = conn.stats().path;
    (
        r.packets_sent,
        r.packets_lost,
        r.bytes_lost,
        r.congestion_events,
    ) = (
        p.sent_packets,
        p.lost_packets,
        p.lost_bytes,
        p.congestion_events,
    );
    (r.min_rtt_ms, r.mtu) = (ms(p.min_rtt), p.current_mtu);
    {
        let mut s = st.lock().unwrap();
        s.bytes_sent += r.bytes;
        if r.bytes == want {
            s.answered += 1;
        }
        if s.largest.as_ref().is_none_or(|l| r.bytes > l.bytes) {
            s.largest = Some(r.clone());
        }
    }
    if let Some(kind) = err {
        server_err(&st, format!("short_response:{kind}"));
    }
}

// -- client ---------------------------------------------------------------------------------------------------

struct ClientOpts {
    server: SocketAddr,
    handshakes: u32,
    retries: u32,
    timeout: Duration,
    ttfb_bytes: u64,
    bulk_bytes: u64,
    bulk_timeout: Duration,
    interval: Duration,
}

#[derive(Serialize)]
struct Probe {
    start_s: f64, // since the client started
    attempt: u32, // 0 = the first try
    handshake_ms: f64,
    ttfb_ms: f64,
    total_ms: f64, // until the whole response arrived
    rtt_ms: f64,   // quinn's RTT estimate (smoothed) once the response arrived
}

#[derive(Serialize, Default)]
struct Bulk {
    requested_bytes: u64,
    bytes: u64, // payload received
    seconds: f64,
    start_mono: f64, // before the request was sent
    end_mono: f64,   // after its last byte arrived
    handshake_ms: f64,
    ttfb_ms: f64, // from the request (not the connect) to the first byte
    cpu_s: f64,
    min_rtt_ms: f64,
    rtt_ms: f64,
    udp_datagrams_received: u64,
    udp_bytes_received: u64, // QUIC packets' bytes, UDP/IP headers excluded
    attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Serialize)]
struct ClientResult {
    version: BTreeMap<&'static str, &'static str>,
    server: String,
    handshakes_requested: u32,
    retries_allowed: u32,
    timeout_s: f64,
    ttfb_bytes: u64,
    probes: Vec<Probe>,
    handshake_failures: u32, // attempts whose handshake failed
    request_failures: u32,   // attempts that failed after the handshake
    retries: u32,
    gave_up: u32, // probes that failed every attempt
    error_kinds: BTreeMap<String, u32>,
    elapsed_s: f64,
    bulk: Option<Bulk>,
}

struct Dialed {
    ep: Endpoint,
    conn: quinn::Connection,
}

impl Dialed {
    /// close, and let the endpoint drain in the background (the next probe does not wait for it)
    fn close(self, drains: &mut Vec<tokio::task::JoinHandle<()>>) {
        self.conn.close(VarInt::from_u32(0), b"");
        drop(self.conn);
        let ep = self.ep;
        drains.push(tokio::spawn(async move { ep.wait_idle().await }));
    }
}

fn client_config() -> quinn::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.resumption = rustls::client::Resumption::disabled(); // every probe a full handshake
    tls.enable_early_data = false;
    let mut cc = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap()));
    cc.transport_config(Arc::new(transport()));
    cc
}

/// a fresh UDP socket (made before the clock starts) and a full handshake; the time it took
async fn dial(
    o: &ClientOpts,
    cc: &quinn::ClientConfig,
) -> (Instant, Duration, Result<Dialed, String>) {
    let bind: SocketAddr = if o.server.is_ipv6() {
        "[::]:0".parse().unwrap()
    } else {
        "0.0.0.0:0".parse().unwrap()
    };
    let t0 = Instant::now();
    let ep = match endpoint(bind, None) {
        Ok(ep) => ep,
        Err(e) => return (t0, Duration::ZERO, Err(format!("socket: {e}"))),
    };
    let t0 = Instant::now();
    let connecting = match ep.connect_with(cc.clone(), o.server, "quicperf") {
        Ok(c) => c,
        Err(e) => {
            return (
                t0,
                t0.elapsed(),
                Err(format!("connect_{e}").chars().take(60).collect()),
            )
        }
    };
    let r = tokio::time::timeout(o.timeout, connecting).await;
    let hs = t0.elapsed();
    match r {
        Ok(Ok(conn)) => (t0, hs, Ok(Dialed { ep, conn })),
        Ok(Err(e)) => (t0, hs, Err(conn_kind(&e))),
        Err(_) => (t0, hs, Err("timeout".into())),
    }
}

async fn request(send: &mut quinn::SendStream, n: u64) -> Result<(), String> {
    send.write_all(&n.to_be_bytes())
        .await
        .map_err(|e| write_kind(&e))?;
    send.finish().map_err(|_| "closed_stream".to_string())
}

/// one probe: handshake, then a ttfb_bytes response on the first stream; the error says which stage failed
async fn probe_once(
    o: &ClientOpts,
    cc: &quinn::ClientConfig,
    start: Instant,
    drains: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Result<Probe, (&'static str, String)> {
    let (t0, hs, d) = dial(o, cc).await;
    let d = d.map_err(|e| ("handshake", e))?;
    let mut p = Probe {
        start_s: (t0 - start).as_secs_f64(),
        attempt: 0,
        handshake_ms: ms(hs),
        ttfb_ms: 0.0,
        total_ms: 0.0,
        rtt_ms: 0.0,
    };
    let conn = d.conn.clone();
    let r = tokio::time::timeout(o.timeout, async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| conn_kind(&e))?;
        request(&mut send, o.ttfb_bytes).await?;
        let mut got = 0u64;
        while got < o.ttfb_bytes {
            match recv.read_chunk(64 << 10, true).await {
                Ok(Some(c)) => {
                    if got == 0 {
                        p.ttfb_ms = ms(t0.elapsed());
                    }
                    got += c.bytes.len() as u64;
                }
                Ok(None) => return Err("short_response".to_string()),
                Err(e) => return Err(read_kind(&e)),
            }
        }
        p.total_ms = ms(t0.elapsed());
        Ok(())
    })
    .await;
    p.rtt_ms = ms(conn.rtt());
    d.close(drains);
    match r {
        Ok(Ok(())) => Ok(p),
        Ok(Err(e)) => Err(("request", e)),
        Err(_) => Err(("request", "timeout".into())),
    }
}

async fn client(o: ClientOpts) -> ClientResult {
    let cc = client_config();
    let mut res = ClientResult {
        version: version(),
        server: o.server.to_string(),
        handshakes_requested: o.handshakes,
        retries_allowed: o.retries,
        timeout_s: o.timeout.as_secs_f64(),
        ttfb_bytes: o.ttfb_bytes,
        probes: vec![],
        handshake_failures: 0,
        request_failures: 0,
        retries: 0,
        gave_up: 0,
        error_kinds: BTreeMap::new(),
        elapsed_s: 0.0,
        bulk: None,
    };
    let mut drains = vec![];
    let start = Instant::now();
    for i in 0..o.handshakes {
        if i > 0 && !o.interval.is_zero() {
            tokio::time::sleep(o.interval).await;
        }
        let mut ok = false;
        for attempt in 0..=o.retries {
            if attempt > 0 {
                res.retries += 1;
            }
            match probe_once(&o, &cc, start, &mut drains).await {
                Ok(mut p) => {
                    p.attempt = attempt;
                    res.probes.push(p);
                    ok = true;
                    break;
                }
                Err((stage, kind)) => {
                    if stage == "handshake" {
                        res.handshake_failures += 1;
                    } else {
                        res.request_failures += 1;
                    }
                    *res.error_kinds
                        .entry(format!("{stage}:{kind}"))
                        .or_default() += 1;
                }
            }
        }
        if !ok {
            res.gave_up += 1;
        }
    }
    if o.bulk_bytes > 0 {
        res.bulk = Some(bulk_download(&o, &cc, &mut res, &mut drains).await);
    }
    res.elapsed_s = start.elapsed().as_secs_f64();
    // the closed connections' endpoints drain (their CONNECTION_CLOSE sent), not counted in elapsed_s
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        for h in drains {
            let _ = h.await;
        }
    })
    .await;
    res
}

async fn bulk_download(
    o: &ClientOpts,
    cc: &quinn::ClientConfig,
    res: &mut ClientResult,
    drains: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Bulk {
    let mut b = Bulk {
        requested_bytes: o.bulk_bytes,
        ..Default::default()
    };
    let mut dialed = None;
    for attempt in 0..=o.retries {
        b.attempts += 1;
        if attempt > 0 {
            res.retries += 1;
        }
        let (_, hs, d) = dial(o, cc).await;
        match d {
            Ok(d) => {
                b.handshake_ms = ms(hs);
                dialed = Some(d);
                break;
            }
            Err(kind) => {
                res.handshake_failures += 1;
                *res.error_kinds
                    .entry(format!("handshake:{kind}"))
                    .or_default() += 1;
                b.error = Some(format!("handshake: {kind}"));
            }
        }
    }
    let Some(d) = dialed else { return b };
    b.error = None;
    let conn = d.conn.clone();
    let cpu0 = cpu_seconds();
    b.start_mono = mono();
    let t0 = Instant::now();
    let r = tokio::time::timeout(o.bulk_timeout, async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| conn_kind(&e))?;
        request(&mut send, o.bulk_bytes).await?;
        while b.bytes < o.bulk_bytes {
            match recv.read_chunk(1 << 20, true).await {
                Ok(Some(c)) => {
                    if b.bytes == 0 {
                        b.ttfb_ms = ms(t0.elapsed());
                    }
                    b.bytes += c.bytes.len() as u64;
                }
                Ok(None) => return Err("short_response".to_string()),
                Err(e) => return Err(read_kind(&e)),
            }
        }
        Ok(())
    })
    .await;
    b.seconds = t0.elapsed().as_secs_f64();
    b.end_mono = mono();
    b.cpu_s = cpu_seconds() - cpu0;
    let s = conn.stats();
    (b.min_rtt_ms, b.rtt_ms) = (ms(s.path.min_rtt), ms(s.path.rtt));
    (b.udp_datagrams_received, b.udp_bytes_received) = (s.udp_rx.datagrams, s.udp_rx.bytes);
    d.close(drains);
    let err = match r {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some("timeout".to_string()),
    };
    if let Some(kind) = err {
        res.request_failures += 1;
        *res.error_kinds.entry(format!("bulk:{kind}")).or_default() += 1;
        b.error = Some(format!("download: {kind}"));
    }
    b
}

/// The client takes the server's self-signed certificate as it is (a benchmark, as qperf does), but checks
/// its signatures, so the handshake does the same public-key work as with a verified certificate chain.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
