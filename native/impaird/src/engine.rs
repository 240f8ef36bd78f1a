//! The packet loop: receive from NFQUEUE, decide per rule, hold packets in a
//! release-time heap (netem's tfifo), issue verdicts / inject duplicates.

use crate::config::{Config, Rule};
use crate::gso::{self, FlowKey, Plan, SegFate, Split};
use crate::model::{Decision, RuleModel};
use crate::nfq::{self, Msg, Queue, VerdictBuf, NF_ACCEPT, NF_DROP};
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering as AO};

pub static STOP: AtomicBool = AtomicBool::new(false);

/// Upper bound of the early timer wake-up (and so of one spin).
const MAX_EARLY_NS: u64 = 200_000;
/// A re-queued super-packet whose wire packets have not all come back by
/// then is given up (the kernel could not queue them: split queue full).
const SPLIT_TIMEOUT_NS: u64 = 20_000_000;
/// Bound of the learned per-flow segment sizes (cleared when exceeded).
const MAX_FLOWS: usize = 16_384;

#[inline]
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[derive(Default, Clone, Copy, Serialize, Debug)]
pub struct Counters {
    pub packets_in: u64,
    /// ACCEPT verdicts for original packets.
    pub accepted: u64,
    pub dropped_loss: u64,
    pub dropped_overflow: u64,
    /// Duplicate copies created (netem: duplicate event and no loss event).
    pub duplicated: u64,
    /// Duplicate copies actually injected on the wire.
    pub duplicates_sent: u64,
    pub corrupted: u64,
    pub reordered: u64,
}

enum Action {
    /// A verdict for a packet of the main queue (`split` false; `count` wire
    /// packets: a super-packet passed whole counts all of its) or of the
    /// split queue (`split` true: one wire packet of a segmented super-packet).
    Verdict {
        id: u32,
        payload: Option<Box<[u8]>>,
        split: bool,
        count: u32,
    },
    Inject {
        pkt: Box<[u8]>,
        dst: u32,
    },
}

struct Held {
    at: u64,
    seq: u64,
    rule: u16,
    action: Action,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at && self.seq == o.seq
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    // Min-heap on (release time, arrival sequence): netem tfifo order,
    // FIFO among equal release times.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Metadata of one queued packet.
struct PktMeta {
    queue: u16,
    id: u32,
    len: usize,
    skb_info: u32,
    outdev: u32,
}

/// MTU of the interface with index `ifindex` (SIOCGIFMTU).
fn if_mtu(ifindex: u32) -> Option<usize> {
    if ifindex == 0 {
        return None;
    }
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buffer of IF_NAMESIZE bytes as required.
    if unsafe { libc::if_indextoname(ifindex, name.as_mut_ptr()) }.is_null() {
        return None;
    }
    // SAFETY: plain syscalls; ifreq zeroed and its name NUL-terminated.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(name.iter()) {
            *d = *s;
        }
        let r = libc::ioctl(fd, libc::SIOCGIFMTU, &mut ifr);
        libc::close(fd);
        if r < 0 {
            return None;
        }
        let m = ifr.ifr_ifru.ifru_mtu;
        (m > 0).then_some(m as usize)
    }
}

/// Offset of the first payload byte after IP + L4 headers, and the IP
/// header length. Returns None when the packet is not IPv4.
pub fn l4_payload_offset(p: &[u8]) -> Option<(usize, usize)> {
    if p.len() < 20 || p[0] >> 4 != 4 {
        return None;
    }
    let ihl = ((p[0] & 0x0f) as usize) * 4;
    if ihl < 20 || ihl > p.len() {
        return None;
    }
    let frag_off = u16::from_be_bytes([p[6], p[7]]) & 0x1fff;
    let l4 = &p[ihl..];
    let l4len = if frag_off != 0 {
        0
    } else {
        match p[9] {
            6 if l4.len() >= 20 => ((l4[12] >> 4) as usize) * 4,
            17 | 1 => 8,
            _ => 0,
        }
    };
    Some(((ihl + l4len).min(p.len()), ihl))
}

/// Flip one random bit after the IP+L4 headers; if there is no payload,
/// in the L4 header; failing that anywhere in the packet.
pub fn corrupt_packet(p: &mut [u8], model: &mut RuleModel) {
    if p.is_empty() {
        return;
    }
    let (start, ihl) = l4_payload_offset(p).unwrap_or((0, 0));
    let start = if start < p.len() {
        start
    } else if ihl < p.len() {
        ihl
    } else {
        0
    };
    let span = (p.len() - start) as u32;
    let idx = start + model.prng.below(span) as usize;
    let bit = model.prng.below(8);
    p[idx] ^= 1 << bit;
}

struct RawSock {
    fd: i32,
}

impl RawSock {
    fn open() -> io::Result<RawSock> {
        // IPPROTO_RAW implies IP_HDRINCL.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::IPPROTO_RAW,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RawSock { fd })
    }

    fn send(&self, pkt: &[u8], dst: u32) -> bool {
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sa.sin_family = libc::AF_INET as u16;
        sa.sin_addr.s_addr = dst.to_be();
        let r = unsafe {
            libc::sendto(
                self.fd,
                pkt.as_ptr() as *const libc::c_void,
                pkt.len(),
                0,
                &sa as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        };
        r >= 0
    }
}

impl Drop for RawSock {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}

#[derive(Serialize)]
struct StatsOut<'a> {
    version: &'static str,
    pid: u32,
    uptime_s: f64,
    packets_in: u64,
    accepted: u64,
    dropped_loss: u64,
    dropped_overflow: u64,
    duplicated: u64,
    duplicates_sent: u64,
    corrupted: u64,
    reordered: u64,
    unmatched: u64,
    queue_depth: usize,
    max_queue_depth: usize,
    max_held: usize,
    cpu_s: f64,
    cpu_user_s: f64,
    cpu_sys_s: f64,
    realtime: bool,
    netlink_errors: u64,
    enobufs: u64,
    inject_errors: u64,
    wakeups: u64,
    recv_calls: u64,
    verdict_sends: u64,
    /// Mean / max lateness of held-packet releases (whole run), microseconds.
    release_late_us_mean: f64,
    release_late_us_max: f64,
    /// Held packets released, and their lateness summed (whole run, microseconds): two
    /// samples give the mean lateness between them (a case's), which the run-long mean cannot.
    releases_held: u64,
    release_late_us_sum: f64,
    /// Running mean of timer wake-up overshoot, and total time spent
    /// spinning for exact release times.
    timer_overshoot_us: f64,
    spin_s: f64,
    busy_poll_s: f64,
    /// The part of busy_poll_s whose polls found nothing: waiting, not work.
    busy_poll_idle_s: f64,
    kernel_queue_total: Option<u64>,
    kernel_queue_dropped: Option<u64>,
    kernel_user_dropped: Option<u64>,
    /// Super-packets taken whole (GSO mode): see `GsoCounters`.
    gso: bool,
    #[serde(flatten)]
    gso_counters: GsoCounters,
    rules: BTreeMap<&'a str, Counters>,
}

/// What happened to queued packets in GSO mode. Per-rule counters above
/// count wire packets; these count super-packets (queued packets that stand
/// for more than one wire packet) and the wire packets split out of them.
#[derive(Default, Clone, Copy, Serialize, Debug)]
pub struct GsoCounters {
    /// Queued packets standing for >1 wire packet.
    pub gso_packets: u64,
    /// ... passed whole with one verdict (the fast path).
    pub gso_whole: u64,
    /// ... dropped whole (every wire packet lost).
    pub gso_dropped_whole: u64,
    /// ... re-queued for segmentation (wire packets with different fates).
    pub gso_segmented: u64,
    /// Single wire packets re-queued to get their bytes (corrupt, duplicate).
    pub single_requeued: u64,
    /// Wire packets released from segmented super-packets (ACCEPT on the split queue).
    pub segments_injected: u64,
    /// Wire packets that came back from the split queue.
    pub segments_in: u64,
    /// Segmentations where the kernel made a different number of wire
    /// packets than counted (segment size not known yet for the flow).
    pub gso_size_mismatch: u64,
    /// Segment sizes learned per flow (differing from the MTU-derived one).
    pub gso_size_learned: u64,
    /// Re-queued packets whose wire packets never came back.
    pub split_lost: u64,
    /// Packets on the split queue that matched no re-queued packet.
    pub split_unmatched: u64,
}

/// (user, system) CPU seconds of this process.
fn cpu_seconds() -> (f64, f64) {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// (queue_total, queue_dropped, user_dropped) from
/// /proc/net/netfilter/nfnetlink_queue for our queue (per netns).
fn kernel_queue_stats(queue: u16) -> Option<(u64, u64, u64)> {
    let s = std::fs::read_to_string("/proc/net/netfilter/nfnetlink_queue").ok()?;
    for line in s.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 7 && f[0].parse::<u16>().ok() == Some(queue) {
            return Some((f[2].parse().ok()?, f[5].parse().ok()?, f[6].parse().ok()?));
        }
    }
    None
}

pub struct Engine {
    q: Queue,
    /// GSO mode: super-packets whole on `q.queue`, segmentation on `split_q`.
    gso: bool,
    split_q: u16,
    wire_mtu: Option<usize>,
    mtu_cache: HashMap<u32, usize>,
    flow_gso: HashMap<FlowKey, u16>,
    splits: VecDeque<Split>,
    fates: Vec<SegFate>,
    gc: GsoCounters,
    /// Verdicts for split-queue packets in vbuf (not counted as outstanding).
    vbuf_split: usize,
    /// Split-queue wire packets waiting in the heap.
    split_held: usize,
    raw: Option<RawSock>,
    rules: Vec<Rule>,
    models: Vec<RuleModel>,
    names: Vec<String>,
    counters: Vec<Counters>,
    unmatched: u64,
    heap: BinaryHeap<Held>,
    seq: u64,
    max_held: usize,
    max_depth: usize,
    vbuf: VerdictBuf,
    /// Plain ACCEPT ids collected for the next flush.
    accepts: Vec<u32>,
    accepts_sorted: bool,
    vbuf_has_accept: bool,
    /// Originals received from the kernel without a verdict sent yet.
    outstanding: usize,
    last_id: u32,
    use_batch: bool,
    netlink_errors: u64,
    enobufs: u64,
    inject_errors: u64,
    wakeups: u64,
    recv_calls: u64,
    verdict_sends: u64,
    /// Release lateness (now - release time) of held packets, ns.
    late_sum_ns: u64,
    late_n: u64,
    late_max_ns: u64,
    overshoot_ewma_ns: u64,
    spin_ns: u64,
    busy_poll_ns: u64,
    last_rx_ns: u64,
    busy_ns: u64,
    busy_idle_ns: u64,
    stats_path: String,
    stats_tmp: String,
    stats_error_logged: bool,
    stats_interval_ns: u64,
    start_ns: u64,
    pub realtime_ok: bool,
}

impl Engine {
    pub fn new(cfg: &Config, rules: Vec<Rule>, q: Queue) -> io::Result<Engine> {
        let seed = cfg.seed.unwrap_or_else(|| {
            let mut b = [0u8; 8];
            unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 8, 0) };
            u64::from_ne_bytes(b)
        });
        let models: Vec<RuleModel> = rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                RuleModel::new(
                    &r.cfg,
                    seed.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                )
            })
            .collect();
        let need_raw = models.iter().any(|m| m.needs_payload());
        let raw = if need_raw {
            Some(RawSock::open().map_err(|e| {
                io::Error::new(e.kind(), format!("raw IPv4 socket for duplicates: {e}"))
            })?)
        } else {
            None
        };
        let names = rules.iter().map(|r| r.cfg.name.clone()).collect();
        let n = rules.len();
        let queue = q.queue;
        let pid = std::process::id();
        Ok(Engine {
            q,
            gso: cfg.gso,
            split_q: cfg.effective_split_queue(),
            wire_mtu: cfg.wire_mtu.map(|m| m as usize),
            mtu_cache: HashMap::new(),
            flow_gso: HashMap::new(),
            splits: VecDeque::new(),
            fates: Vec::with_capacity(128),
            gc: GsoCounters::default(),
            vbuf_split: 0,
            split_held: 0,
            raw,
            rules,
            models,
            names,
            counters: vec![Counters::default(); n],
            unmatched: 0,
            heap: BinaryHeap::with_capacity(cfg.effective_max_held().min(1 << 20)),
            seq: 0,
            max_held: cfg.effective_max_held(),
            max_depth: 0,
            vbuf: VerdictBuf::new(queue),
            accepts: Vec::with_capacity(4096),
            accepts_sorted: true,
            vbuf_has_accept: false,
            outstanding: 0,
            last_id: 0,
            use_batch: std::env::var_os("IMPAIRD_NO_BATCH").is_none(),
            netlink_errors: 0,
            enobufs: 0,
            inject_errors: 0,
            wakeups: 0,
            recv_calls: 0,
            verdict_sends: 0,
            late_sum_ns: 0,
            late_n: 0,
            late_max_ns: 0,
            overshoot_ewma_ns: 50_000,
            spin_ns: 0,
            busy_poll_ns: cfg.busy_poll_us * 1000,
            last_rx_ns: 0,
            busy_ns: 0,
            busy_idle_ns: 0,
            stats_tmp: format!("{}.tmp.{}", cfg.stats_path, pid),
            stats_path: cfg.stats_path.clone(),
            stats_error_logged: false,
            stats_interval_ns: cfg.stats_interval_ms * 1_000_000,
            start_ns: mono_ns(),
            realtime_ok: false,
        })
    }

    #[inline]
    fn accept_now(&mut self, id: u32) {
        if let Some(&prev) = self.accepts.last() {
            if (id.wrapping_sub(prev) as i32) <= 0 {
                self.accepts_sorted = false;
            }
        }
        self.accepts.push(id);
        if self.accepts.len() >= 1800 {
            self.flush();
        }
    }

    #[inline]
    fn verdict_now(&mut self, id: u32, verdict: u32, payload: Option<&[u8]>) {
        if verdict == NF_ACCEPT {
            // Keep wire order: plain accepts collected so far go first.
            for i in 0..self.accepts.len() {
                let a = self.accepts[i];
                self.vbuf.push(a, NF_ACCEPT, None);
            }
            self.accepts.clear();
            self.accepts_sorted = true;
            self.vbuf_has_accept = true;
        }
        self.vbuf.push(id, verdict, payload);
        if self.vbuf.buf.len() >= nfq::VERDICT_FLUSH_AT {
            self.flush();
        }
    }

    /// Send all pending verdicts (one sendto).
    fn flush(&mut self) {
        // vbuf.count counts individual verdict messages (one per packet);
        // those for split-queue packets are not among `outstanding`.
        let total = self.accepts.len() + self.vbuf.count - self.vbuf_split;
        if total == 0 && self.vbuf_split == 0 {
            return;
        }
        if self.use_batch
            && self.accepts.len() > 1
            && self.accepts_sorted
            && !self.vbuf_has_accept
            && self.outstanding == total
        {
            // Every packet the kernel holds for us gets its verdict now: one
            // VERDICT_BATCH (applies to all queued ids <= last_id, in queue
            // order) after the individual DROP messages.
            self.vbuf.push_batch(self.last_id, NF_ACCEPT);
        } else {
            for i in 0..self.accepts.len() {
                let id = self.accepts[i];
                self.vbuf.push(id, NF_ACCEPT, None);
            }
        }
        self.verdict_sends += 1;
        if let Err(e) = self.q.send(&self.vbuf.buf) {
            self.netlink_errors += 1;
            eprintln!("impaird: verdict send failed: {e}");
        }
        self.outstanding -= total;
        self.vbuf_split = 0;
        self.accepts.clear();
        self.accepts_sorted = true;
        self.vbuf_has_accept = false;
        self.vbuf.clear();
    }

    /// The packet as modified by its outcome (a corrupted copy, or None to send it as
    /// it came), with the rule's corrupt and reorder counters advanced.
    fn corrupt_and_count(&mut self, ri: usize, payload: &[u8], o: &Decision) -> Option<Box<[u8]>> {
        if o.reordered {
            self.counters[ri].reordered += 1;
        }
        if !o.corrupt {
            return None;
        }
        self.counters[ri].corrupted += 1;
        let mut p: Box<[u8]> = payload.into();
        corrupt_packet(&mut p, &mut self.models[ri]);
        Some(p)
    }

    fn push_held(&mut self, at: u64, rule: u16, action: Action) {
        self.seq += 1;
        self.push_held_seq(at, self.seq, rule, action);
    }

    fn push_held_seq(&mut self, at: u64, seq: u64, rule: u16, action: Action) {
        self.heap.push(Held {
            at,
            seq,
            rule,
            action,
        });
        if self.heap.len() > self.max_depth {
            self.max_depth = self.heap.len();
        }
    }

    fn inject(&mut self, rule: u16, pkt: &[u8], dst: u32) {
        // keep wire order with verdicts issued before this copy
        self.flush();
        let ok = self.raw.as_ref().map(|r| r.send(pkt, dst)).unwrap_or(false);
        if ok {
            self.counters[rule as usize].duplicates_sent += 1;
        } else {
            self.inject_errors += 1;
        }
    }

    /// A verdict for a wire packet on the split queue.
    fn verdict_split(&mut self, id: u32, verdict: u32, payload: Option<&[u8]>) {
        if verdict == NF_ACCEPT && !self.accepts.is_empty() {
            // Keep wire order: plain accepts collected so far go first.
            for i in 0..self.accepts.len() {
                let a = self.accepts[i];
                self.vbuf.push(a, NF_ACCEPT, None);
            }
            self.accepts.clear();
            self.accepts_sorted = true;
            self.vbuf_has_accept = true;
        }
        self.vbuf.push_q(self.split_q, id, verdict, payload);
        self.vbuf_split += 1;
        if self.vbuf.buf.len() >= nfq::VERDICT_FLUSH_AT {
            self.flush();
        }
    }

    fn release_due(&mut self, now: u64) {
        while let Some(top) = self.heap.peek() {
            if top.at > now {
                break;
            }
            // Order barrier: nothing queued after a re-queued super-packet
            // leaves before its wire packets have come back from the split
            // queue (they return within the same loop turn; a timeout guards
            // against a kernel that could not queue them).
            if let Some(s) = self.splits.front() {
                if top.seq > s.seq_end {
                    if now.saturating_sub(s.t0) > SPLIT_TIMEOUT_NS {
                        self.splits.pop_front();
                        self.gc.split_lost += 1;
                        continue;
                    }
                    break;
                }
            }
            let h = self.heap.pop().unwrap();
            let late = now - h.at;
            self.late_sum_ns += late;
            self.late_n += 1;
            if late > self.late_max_ns {
                self.late_max_ns = late;
            }
            match h.action {
                Action::Verdict {
                    id,
                    payload,
                    split: true,
                    count,
                } => {
                    self.counters[h.rule as usize].accepted += count as u64;
                    self.gc.segments_injected += 1;
                    self.split_held -= 1;
                    self.verdict_split(id, NF_ACCEPT, payload.as_deref());
                }
                Action::Verdict {
                    id,
                    payload: None,
                    count,
                    ..
                } => {
                    self.counters[h.rule as usize].accepted += count as u64;
                    self.accept_now(id);
                }
                Action::Verdict {
                    id,
                    payload: Some(p),
                    count,
                    ..
                } => {
                    self.counters[h.rule as usize].accepted += count as u64;
                    self.verdict_now(id, NF_ACCEPT, Some(&p));
                }
                Action::Inject { pkt, dst } => self.inject(h.rule, &pkt, dst),
            }
        }
    }

    /// Handle one queued packet.
    fn on_packet(&mut self, id: u32, payload: &[u8], now: u64) {
        self.outstanding += 1;
        self.last_id = id;
        let (src, dst) = if payload.len() >= 20 && payload[0] >> 4 == 4 {
            (
                u32::from_be_bytes(payload[12..16].try_into().unwrap()),
                u32::from_be_bytes(payload[16..20].try_into().unwrap()),
            )
        } else {
            self.unmatched += 1;
            self.accept_now(id);
            return;
        };
        let Some(ri) = self
            .rules
            .iter()
            .position(|r| r.src.contains(src) && r.dst.contains(dst))
        else {
            self.unmatched += 1;
            self.accept_now(id);
            return;
        };
        let rule = ri as u16;
        self.counters[ri].packets_in += 1;
        let (orig, clone) = self.models[ri].process();
        let Some(o) = orig else {
            self.counters[ri].dropped_loss += 1;
            self.verdict_now(id, NF_DROP, None);
            return;
        };
        // The clone is taken before the original is corrupted (as netem).
        if let Some(c) = clone {
            self.counters[ri].duplicated += 1;
            if c.drop {
                self.counters[ri].dropped_loss += 1;
            } else if self.heap.len() >= self.max_held {
                self.counters[ri].dropped_overflow += 1;
            } else {
                let copy = self
                    .corrupt_and_count(ri, payload, &c)
                    .unwrap_or_else(|| payload.into());
                if c.delay_ns <= 0 {
                    self.inject(rule, &copy, dst);
                } else {
                    self.push_held(
                        now + c.delay_ns as u64,
                        rule,
                        Action::Inject { pkt: copy, dst },
                    );
                }
            }
        }
        let payload_mod = self.corrupt_and_count(ri, payload, &o);
        if o.delay_ns <= 0 {
            // Reordered (or zero delay): out at once, like netem's
            // head-of-queue insert.
            self.counters[ri].accepted += 1;
            match payload_mod {
                None => self.accept_now(id),
                Some(p) => self.verdict_now(id, NF_ACCEPT, Some(&p)),
            }
            return;
        }
        if self.heap.len() >= self.max_held {
            self.counters[ri].dropped_overflow += 1;
            self.verdict_now(id, NF_DROP, None);
            return;
        }
        self.push_held(
            now + o.delay_ns as u64,
            rule,
            Action::Verdict {
                id,
                payload: payload_mod,
                split: false,
                count: 1,
            },
        );
    }

    /// Wire MTU of the output interface (config `wire_mtu` overrides).
    fn mtu_of(&mut self, outdev: u32) -> usize {
        if let Some(m) = self.wire_mtu {
            return m;
        }
        if let Some(&m) = self.mtu_cache.get(&outdev) {
            return m;
        }
        let m = if_mtu(outdev).unwrap_or(1500);
        self.mtu_cache.insert(outdev, m);
        m
    }

    /// Accept a main-queue packet now; behind a pending split it waits in
    /// the heap (due at once) so that it does not overtake the split's wire
    /// packets.
    fn accept_or_queue(&mut self, id: u32, rule: u16, count: u32, now: u64) {
        if self.splits.is_empty() && self.split_held == 0 {
            self.counters[rule as usize].accepted += count as u64;
            self.accept_now(id);
        } else {
            self.push_held(
                now,
                rule,
                Action::Verdict {
                    id,
                    payload: None,
                    split: false,
                    count,
                },
            );
        }
    }

    /// GSO mode: one packet of the main queue (a super-packet or a single
    /// wire packet); decide per wire packet, then pass it whole, drop it
    /// whole, or re-queue it to the split queue.
    fn on_gso_packet(&mut self, m: &PktMeta, payload: &[u8], now: u64) {
        let id = m.id;
        self.outstanding += 1;
        self.last_id = id;
        let Some(h) = gso::parse_headers(payload) else {
            self.unmatched += 1;
            self.accept_now(id);
            return;
        };
        let (src, dst) = (h.key.src, h.key.dst);
        let Some(ri) = self
            .rules
            .iter()
            .position(|r| r.src.contains(src) && r.dst.contains(dst))
        else {
            self.unmatched += 1;
            self.accept_now(id);
            return;
        };
        let rule = ri as u16;
        let is_gso = m.skb_info & nfq::NFQA_SKB_GSO != 0;
        let (n, gso_size) = if is_gso {
            let mtu = self.mtu_of(m.outdev);
            let learned = self.flow_gso.get(&h.key).copied();
            gso::segment_count(m.len, &h, true, mtu, learned)
        } else {
            (1, 0)
        };
        if n > 1 {
            self.gc.gso_packets += 1;
        }
        let mut fates = std::mem::take(&mut self.fates);
        let plan = gso::decide(&mut self.models[ri], n, &mut fates);
        let c = &mut self.counters[ri];
        match plan {
            Plan::Whole {
                delay_ns,
                reordered,
            } => {
                self.fates = fates;
                c.packets_in += n as u64;
                if reordered {
                    c.reordered += n as u64;
                }
                if n > 1 {
                    self.gc.gso_whole += 1;
                }
                if delay_ns <= 0 {
                    self.accept_or_queue(id, rule, n, now);
                } else if self.heap.len() >= self.max_held {
                    self.counters[ri].dropped_overflow += n as u64;
                    self.verdict_now(id, NF_DROP, None);
                } else {
                    self.push_held(
                        now + delay_ns as u64,
                        rule,
                        Action::Verdict {
                            id,
                            payload: None,
                            split: false,
                            count: n,
                        },
                    );
                }
            }
            Plan::Drop => {
                self.fates = fates;
                c.packets_in += n as u64;
                c.dropped_loss += n as u64;
                if n > 1 {
                    self.gc.gso_dropped_whole += 1;
                }
                self.verdict_now(id, NF_DROP, None);
            }
            Plan::Split => {
                if n > 1 {
                    self.gc.gso_segmented += 1;
                } else {
                    self.gc.single_requeued += 1;
                }
                // Reserve heap sequence numbers for the wire packets (with
                // room for a few more than counted), so that they keep their
                // place among packets queued after the super-packet.
                let reserve = (2 * n as u64).max(128);
                let seq_base = self.seq + 1;
                self.seq += reserve;
                let expected = if n > 1
                    || h.key.proto == gso::IPPROTO_TCP
                    || h.key.proto == gso::IPPROTO_UDP
                {
                    m.len.saturating_sub(h.hdr)
                } else {
                    m.len.saturating_sub(h.ihl)
                };
                self.splits.push_back(Split {
                    key: h.key,
                    rule,
                    t0: now,
                    seq_base,
                    seq_end: seq_base + reserve - 1,
                    expected,
                    seen: 0,
                    gso_size,
                    next: 0,
                    fates,
                });
                self.fates = Vec::with_capacity(128);
                self.verdict_now(id, nfq::nf_queue_nr(self.split_q), None);
            }
        }
    }

    /// A wire packet back from the split queue: apply the fate decided for it.
    fn on_split_packet(&mut self, m: &PktMeta, payload: &[u8], now: u64) {
        self.gc.segments_in += 1;
        let h = gso::parse_headers(payload);
        let key = h.map(|h| h.key).unwrap_or_default();
        let k = self.splits.iter().take(64).position(|s| s.key == key);
        let Some(k) = k else {
            // Not from a re-queued packet we know of: decide it afresh as one
            // wire packet (its rule by address), or pass it if none matches.
            self.gc.split_unmatched += 1;
            let ri = self
                .rules
                .iter()
                .position(|r| r.src.contains(key.src) && r.dst.contains(key.dst));
            match ri {
                Some(ri) if h.is_some() => {
                    let (orig, clone) = self.models[ri].process();
                    let seq = self.seq + 1;
                    self.seq += 1;
                    self.apply_split_fate(
                        ri as u16,
                        m.id,
                        payload,
                        SegFate { orig, clone },
                        now,
                        seq,
                    );
                }
                _ => self.verdict_split(m.id, NF_ACCEPT, None),
            }
            return;
        };
        // Wire packets come back in re-queue order: earlier splits that
        // got none are lost (the kernel could not queue them).
        for _ in 0..k {
            self.splits.pop_front();
            self.gc.split_lost += 1;
        }
        let h = h.unwrap();
        let s = self.splits.front_mut().unwrap();
        let idx = s.next;
        s.next += 1;
        let seg_payload =
            if s.gso_size > 0 || key.proto == gso::IPPROTO_TCP || key.proto == gso::IPPROTO_UDP {
                m.len.saturating_sub(h.hdr)
            } else {
                m.len.saturating_sub(h.ihl)
            };
        s.seen += seg_payload;
        let done = s.seen >= s.expected;
        let rule = s.rule;
        let t0 = s.t0;
        let seq = (s.seq_base + idx as u64).min(s.seq_end);
        // learn the flow's real segment size from its first wire packet
        if idx == 0 && s.gso_size > 0 && !done && seg_payload as u32 != s.gso_size {
            if self.flow_gso.len() >= MAX_FLOWS {
                self.flow_gso.clear();
            }
            self.flow_gso
                .insert(key, seg_payload.min(u16::MAX as usize) as u16);
            self.gc.gso_size_learned += 1;
        }
        let fate = if idx < s.fates.len() {
            s.fates[idx]
        } else {
            // more wire packets than counted: decide the extra ones now, with
            // the shared delay of the others
            let shared = s
                .fates
                .iter()
                .filter_map(|f| f.orig)
                .find(|o| !o.reordered)
                .map(|o| o.delay_ns);
            let (mut orig, clone) = self.models[rule as usize].process();
            if let (Some(o), Some(sh)) = (orig.as_mut(), shared) {
                if !o.reordered {
                    o.delay_ns = sh;
                }
            }
            SegFate { orig, clone }
        };
        let s = self.splits.front().unwrap();
        if done && idx + 1 != s.fates.len() {
            // the kernel made more or fewer wire packets than counted
            self.gc.gso_size_mismatch += 1;
        }
        if done {
            self.splits.pop_front();
        }
        self.apply_split_fate(rule, m.id, payload, fate, t0, seq);
    }

    /// Apply one wire packet's fate on the split queue (netem_enqueue's
    /// effects, as on_packet does for a per-wire queue). Releases go through
    /// the heap, so they keep the order of the sequence numbers reserved.
    fn apply_split_fate(
        &mut self,
        rule: u16,
        id: u32,
        payload: &[u8],
        f: SegFate,
        t0: u64,
        seq: u64,
    ) {
        let ri = rule as usize;
        self.counters[ri].packets_in += 1;
        let Some(o) = f.orig else {
            self.counters[ri].dropped_loss += 1;
            self.verdict_split(id, NF_DROP, None);
            return;
        };
        if let Some(c) = f.clone {
            self.counters[ri].duplicated += 1;
            let dst = gso::parse_headers(payload).map_or(0, |h| h.key.dst);
            if c.drop {
                self.counters[ri].dropped_loss += 1;
            } else if self.heap.len() >= self.max_held {
                self.counters[ri].dropped_overflow += 1;
            } else {
                let copy = self
                    .corrupt_and_count(ri, payload, &c)
                    .unwrap_or_else(|| payload.into());
                self.push_held(
                    t0 + c.delay_ns.max(0) as u64,
                    rule,
                    Action::Inject { pkt: copy, dst },
                );
            }
        }
        let payload_mod = self.corrupt_and_count(ri, payload, &o);
        if self.heap.len() >= self.max_held {
            self.counters[ri].dropped_overflow += 1;
            self.verdict_split(id, NF_DROP, None);
            return;
        }
        self.split_held += 1;
        self.push_held_seq(
            t0 + o.delay_ns.max(0) as u64,
            seq,
            rule,
            Action::Verdict {
                id,
                payload: payload_mod,
                split: true,
                count: 1,
            },
        );
    }

    fn handle_datagram(&mut self, d: &[u8], now: u64) {
        // One queued packet per datagram (nfnetlink_queue unicasts one
        // skb per packet); collect it, then act outside the closure.
        let mut pkt: Option<(PktMeta, usize, usize)> = None;
        let mut errs = 0u64;
        let base = d.as_ptr() as usize;
        nfq::parse_datagram(d, |m| match m {
            Msg::Packet(p) => {
                let off = p.payload.as_ptr() as usize - base;
                let meta = PktMeta {
                    queue: p.queue,
                    id: p.id,
                    len: p.len as usize,
                    skb_info: p.skb_info,
                    outdev: p.outdev,
                };
                pkt = Some((meta, off, p.payload.len()));
            }
            Msg::Error { errno, .. } if errno != 0 => errs += 1,
            _ => {}
        });
        self.netlink_errors += errs;
        if let Some((m, off, len)) = pkt {
            let payload = &d[off..off + len];
            if !self.gso {
                self.on_packet(m.id, payload, now);
            } else if m.queue == self.split_q && m.queue != self.q.queue {
                self.on_split_packet(&m, payload, now);
            } else {
                self.on_gso_packet(&m, payload, now);
            }
        }
    }

    fn drain(&mut self) -> usize {
        let mut total = 0;
        // Bounded so that due releases are not starved by a flood.
        while total < 1024 {
            self.recv_calls += 1;
            let n = match self.q.recv_batch() {
                Ok(n) => n,
                Err(e) => {
                    if e.raw_os_error() == Some(libc::ENOBUFS) {
                        self.enobufs += 1;
                        continue;
                    }
                    eprintln!("impaird: netlink recv error: {e}");
                    self.netlink_errors += 1;
                    break;
                }
            };
            if n == 0 {
                break;
            }
            let now = mono_ns();
            for i in 0..n {
                // SAFETY of the aliasing: the datagram buffer belongs to
                // self.q and is not touched by on_packet (which only sends).
                let d: &[u8] = self.q.datagram(i);
                let d: &[u8] = unsafe { std::slice::from_raw_parts(d.as_ptr(), d.len()) };
                self.handle_datagram(d, now);
            }
            total += n;
            // Do not let a long drain delay packets that became due.
            let now = mono_ns();
            if self.heap.peek().is_some_and(|h| h.at <= now) {
                self.release_due(now);
                self.flush();
            }
        }
        total
    }

    pub fn write_stats(&mut self) -> io::Result<()> {
        let now = mono_ns();
        let mut tot = Counters::default();
        let mut rules = BTreeMap::new();
        for (i, c) in self.counters.iter().enumerate() {
            tot.packets_in += c.packets_in;
            tot.accepted += c.accepted;
            tot.dropped_loss += c.dropped_loss;
            tot.dropped_overflow += c.dropped_overflow;
            tot.duplicated += c.duplicated;
            tot.duplicates_sent += c.duplicates_sent;
            tot.corrupted += c.corrupted;
            tot.reordered += c.reordered;
            rules.insert(self.names[i].as_str(), *c);
        }
        let k = kernel_queue_stats(self.q.queue);
        let cpu = cpu_seconds();
        let s = StatsOut {
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
            uptime_s: (now - self.start_ns) as f64 / 1e9,
            packets_in: tot.packets_in + self.unmatched,
            accepted: tot.accepted + self.unmatched,
            dropped_loss: tot.dropped_loss,
            dropped_overflow: tot.dropped_overflow,
            duplicated: tot.duplicated,
            duplicates_sent: tot.duplicates_sent,
            corrupted: tot.corrupted,
            reordered: tot.reordered,
            unmatched: self.unmatched,
            queue_depth: self.heap.len(),
            max_queue_depth: self.max_depth,
            max_held: self.max_held,
            cpu_s: cpu.0 + cpu.1,
            cpu_user_s: cpu.0,
            cpu_sys_s: cpu.1,
            realtime: self.realtime_ok,
            netlink_errors: self.netlink_errors,
            enobufs: self.enobufs,
            inject_errors: self.inject_errors,
            wakeups: self.wakeups,
            recv_calls: self.recv_calls,
            verdict_sends: self.verdict_sends,
            release_late_us_mean: if self.late_n > 0 {
                self.late_sum_ns as f64 / self.late_n as f64 / 1e3
            } else {
                0.0
            },
            release_late_us_max: self.late_max_ns as f64 / 1e3,
            releases_held: self.late_n,
            release_late_us_sum: self.late_sum_ns as f64 / 1e3,
            timer_overshoot_us: self.overshoot_ewma_ns as f64 / 1e3,
            spin_s: self.spin_ns as f64 / 1e9,
            busy_poll_s: self.busy_ns as f64 / 1e9,
            busy_poll_idle_s: self.busy_idle_ns as f64 / 1e9,
            kernel_queue_total: k.map(|k| k.0),
            kernel_queue_dropped: k.map(|k| k.1),
            kernel_user_dropped: k.map(|k| k.2),
            gso: self.gso,
            gso_counters: self.gc,
            rules,
        };
        let mut json = serde_json::to_vec_pretty(&s).map_err(io::Error::other)?;
        json.push(b'\n');
        let r = std::fs::write(&self.stats_tmp, &json)
            .and_then(|_| std::fs::rename(&self.stats_tmp, &self.stats_path));
        match &r {
            Err(e) if !self.stats_error_logged => {
                eprintln!("impaird: cannot write stats {}: {e}", self.stats_path);
                self.stats_error_logged = true;
            }
            Ok(()) => self.stats_error_logged = false,
            _ => {}
        }
        r
    }

    pub fn run(&mut self) -> io::Result<()> {
        // Packets that arrived while the queue was being configured.
        let stash = std::mem::take(&mut self.q.stash);
        let now = mono_ns();
        for d in &stash {
            self.handle_datagram(d, now);
        }
        self.flush();
        let mut next_stats = mono_ns();
        loop {
            let now = mono_ns();
            self.release_due(now);
            self.flush();
            if now >= next_stats {
                let _ = self.write_stats();
                next_stats = now + self.stats_interval_ns;
            }
            if STOP.load(AO::Relaxed) {
                break;
            }
            // Wake-up latency of this VM is ~50-200 us even for SCHED_FIFO,
            // so aim the timer `early` ns before the next release (early =
            // 3/4 of the running mean of measured timer overshoot, capped)
            // and spin (draining the socket) for the rest.
            let early = (self.overshoot_ewma_ns * 3 / 4).min(MAX_EARLY_NS);
            let mut wake = next_stats;
            let mut for_heap = false;
            if let Some(top) = self.heap.peek() {
                let t = top.at.saturating_sub(early);
                if t < wake {
                    wake = t;
                    for_heap = true;
                }
            }
            let now = mono_ns();
            if self.busy_poll_ns > 0 && now.saturating_sub(self.last_rx_ns) < self.busy_poll_ns {
                // Busy-poll: no sleep, so no wake-up for the next packet; the
                // loop top releases what is due and flushes verdicts.
                let n = self.drain();
                let t = mono_ns();
                if n > 0 {
                    self.last_rx_ns = t;
                } else {
                    std::hint::spin_loop();
                    self.busy_idle_ns += t - now;
                }
                self.busy_ns += t - now;
                continue;
            }
            if wake > now {
                let dt = wake - now;
                let ts = libc::timespec {
                    tv_sec: (dt / 1_000_000_000) as libc::time_t,
                    tv_nsec: (dt % 1_000_000_000) as libc::c_long,
                };
                let mut pfd = libc::pollfd {
                    fd: self.q.fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: valid pointers; EINTR just loops.
                let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
                if r == 0 && for_heap {
                    let over = mono_ns().saturating_sub(wake).min(400_000);
                    // EWMA (alpha 1/16) of overshoot samples clipped at 400 us, so
                    // rare multi-ms stalls do not dominate
                    self.overshoot_ewma_ns = (self.overshoot_ewma_ns * 15 + over) / 16;
                    // Spin until the release is due (bounded by `early`).
                    let t0 = mono_ns();
                    loop {
                        let now = mono_ns();
                        match self.heap.peek() {
                            Some(top) if top.at > now && top.at - now <= early => {}
                            _ => break,
                        }
                        self.drain();
                        std::hint::spin_loop();
                    }
                    self.spin_ns += mono_ns() - t0;
                }
            }
            self.wakeups += 1;
            if self.drain() > 0 {
                self.last_rx_ns = mono_ns();
            }
            // Releases due meanwhile go out before the loop top flushes;
            // new immediate verdicts are flushed together with them.
        }
        self.flush();
        let _ = self.write_stats();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_offsets() {
        let mut p = vec![0u8; 60];
        p[0] = 0x45;
        p[9] = 17;
        assert_eq!(l4_payload_offset(&p), Some((28, 20)));
        p[9] = 6;
        p[20 + 12] = 0x80; // 32-byte TCP header
        assert_eq!(l4_payload_offset(&p), Some((52, 20)));
        p[6] = 0x00;
        p[7] = 0x10; // fragment offset != 0
        assert_eq!(l4_payload_offset(&p), Some((20, 20)));
        assert_eq!(l4_payload_offset(&[0x60; 40]), None);
    }

    #[test]
    fn corrupt_flips_one_payload_bit() {
        let mut c = crate::config::RuleCfg::for_tests();
        c.corrupt = Some(crate::config::Prob {
            p: 1.0,
            correlation: 0.0,
            gap: None,
        });
        let mut m = RuleModel::new(&c, 1);
        for _ in 0..1000 {
            let mut p = vec![0u8; 100];
            p[0] = 0x45;
            p[9] = 17;
            let orig = p.clone();
            corrupt_packet(&mut p, &mut m);
            let diff: Vec<usize> = (0..100).filter(|&i| p[i] != orig[i]).collect();
            assert_eq!(diff.len(), 1);
            assert!(diff[0] >= 28);
            assert_eq!((p[diff[0]] ^ orig[diff[0]]).count_ones(), 1);
        }
    }

    #[test]
    fn heap_order_is_time_then_fifo() {
        let mut h = BinaryHeap::new();
        for (at, seq) in [(5u64, 1u64), (3, 2), (5, 3), (1, 4), (3, 5)] {
            h.push(Held {
                at,
                seq,
                rule: 0,
                action: Action::Verdict {
                    id: seq as u32,
                    payload: None,
                    split: false,
                    count: 1,
                },
            });
        }
        let order: Vec<u64> = std::iter::from_fn(|| h.pop().map(|x| x.seq)).collect();
        assert_eq!(order, vec![4, 2, 5, 1, 3]);
    }
}
