//! Minimal NFQUEUE (nfnetlink_queue) client on raw netlink sockets.
//!
//! Only what impaird needs: bind one queue, copy-packet mode, queue maxlen,
//! flags (GSO and FAIL_OPEN explicitly cleared), batched receive with
//! recvmmsg, and verdict messages packed many per sendmsg.

use std::io;
use std::os::fd::RawFd;

pub const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_QUEUE: u16 = 3;
pub const NFQNL_MSG_PACKET: u16 = NFNL_SUBSYS_QUEUE << 8;
const NFQNL_MSG_VERDICT: u16 = (NFNL_SUBSYS_QUEUE << 8) | 1;
const NFQNL_MSG_CONFIG: u16 = (NFNL_SUBSYS_QUEUE << 8) | 2;
const NFQNL_MSG_VERDICT_BATCH: u16 = (NFNL_SUBSYS_QUEUE << 8) | 3;

const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;
const NFQA_CFG_F_FAIL_OPEN: u32 = 1;
const NFQA_CFG_F_GSO: u32 = 4;

const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_IFINDEX_OUTDEV: u16 = 6;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CAP_LEN: u16 = 13;
const NFQA_SKB_INFO: u16 = 14;
/// NFQA_SKB_INFO flags.
/// Not needed by the engine: it never sends a super-packet's bytes back, and the
/// split queue (no GSO flag) gets wire packets with their checksums completed
/// by the kernel (skb_checksum_help / software segmentation).
#[allow(dead_code)]
pub const NFQA_SKB_CSUMNOTREADY: u32 = 1;
pub const NFQA_SKB_GSO: u32 = 2;

pub const NF_DROP: u32 = 0;
pub const NF_ACCEPT: u32 = 1;
const NF_QUEUE: u32 = 3;

/// Verdict that re-queues the packet to NFQUEUE `queue` (the kernel's
/// `NF_QUEUE_NR`): nf_reinject() hands it to nf_queue() at the same hook.
pub const fn nf_queue_nr(queue: u16) -> u32 {
    ((queue as u32) << 16) | NF_QUEUE
}

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;

#[inline]
fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn put_nlhdr(buf: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, queue: u16) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u32.to_ne_bytes()); // len, patched later
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: family, version, res_id (big endian)
    buf.push(libc::AF_UNSPEC as u8);
    buf.push(0);
    buf.extend_from_slice(&queue.to_be_bytes());
    start
}

fn put_attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = 4 + data.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(data);
    buf.resize(buf.len() + align4(len) - len, 0);
}

fn finish_msg(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// One parsed NFQNL_MSG_PACKET.
pub struct Packet<'a> {
    /// Queue number (nfgenmsg res_id).
    pub queue: u16,
    pub id: u32,
    /// Link-layer protocol (0x0800 for IPv4).
    #[allow(dead_code)]
    pub hw_protocol: u16,
    /// Copied bytes (possibly truncated by copy_range).
    pub payload: &'a [u8],
    /// Length of the whole packet (NFQA_CAP_LEN when truncated).
    pub len: u32,
    /// NFQA_SKB_INFO flags (NFQA_SKB_GSO, NFQA_SKB_CSUMNOTREADY), 0 if absent.
    pub skb_info: u32,
    /// Output interface index (0 if absent).
    pub outdev: u32,
}

pub enum Msg<'a> {
    Packet(Packet<'a>),
    /// NLMSG_ERROR with errno (0 = ACK).
    Error {
        errno: i32,
        seq: u32,
    },
    Other,
}

/// Iterate over netlink messages in one datagram.
pub fn parse_datagram(mut d: &[u8], mut f: impl FnMut(Msg)) {
    while d.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(d[0..4].try_into().unwrap()) as usize;
        if len < NLMSG_HDRLEN || len > d.len() {
            // truncated datagram: try to parse what is there
            parse_one(d, d.len(), &mut f);
            return;
        }
        parse_one(d, len, &mut f);
        let adv = align4(len).min(d.len());
        d = &d[adv..];
    }
}

fn parse_one(d: &[u8], len: usize, f: &mut impl FnMut(Msg)) {
    let ty = u16::from_ne_bytes([d[4], d[5]]);
    let seq = u32::from_ne_bytes(d[8..12].try_into().unwrap());
    let body = &d[NLMSG_HDRLEN..len];
    if ty == NLMSG_ERROR {
        let errno = if body.len() >= 4 {
            i32::from_ne_bytes(body[0..4].try_into().unwrap())
        } else {
            0
        };
        f(Msg::Error { errno: -errno, seq });
        return;
    }
    if ty != NFQNL_MSG_PACKET || body.len() < 4 {
        f(Msg::Other);
        return;
    }
    let queue = u16::from_be_bytes([body[2], body[3]]);
    let mut a = &body[4..];
    let mut id = None;
    let mut hw = 0u16;
    let mut payload: &[u8] = &[];
    let mut cap_len = None;
    let mut skb_info = 0u32;
    let mut outdev = 0u32;
    while a.len() >= 4 {
        let alen = u16::from_ne_bytes([a[0], a[1]]) as usize;
        let aty = u16::from_ne_bytes([a[2], a[3]]) & 0x3fff;
        if alen < 4 {
            break;
        }
        let end = alen.min(a.len());
        let data = &a[4..end];
        match aty {
            NFQA_PACKET_HDR if data.len() >= 6 => {
                id = Some(u32::from_be_bytes(data[0..4].try_into().unwrap()));
                hw = u16::from_be_bytes([data[4], data[5]]);
            }
            NFQA_PAYLOAD => payload = data,
            NFQA_CAP_LEN if data.len() >= 4 => {
                cap_len = Some(u32::from_be_bytes(data[0..4].try_into().unwrap()))
            }
            NFQA_SKB_INFO if data.len() >= 4 => {
                skb_info = u32::from_be_bytes(data[0..4].try_into().unwrap())
            }
            NFQA_IFINDEX_OUTDEV if data.len() >= 4 => {
                outdev = u32::from_be_bytes(data[0..4].try_into().unwrap())
            }
            _ => {}
        }
        let adv = align4(alen);
        if adv >= a.len() {
            break;
        }
        a = &a[adv..];
    }
    match id {
        Some(id) => f(Msg::Packet(Packet {
            queue,
            id,
            hw_protocol: hw,
            payload,
            len: cap_len.unwrap_or(payload.len() as u32),
            skb_info,
            outdev,
        })),
        None => f(Msg::Other),
    }
}

pub struct Queue {
    pub fd: RawFd,
    pub queue: u16,
    seq: u32,
    /// Receive buffers for recvmmsg.
    bufs: Vec<u8>,
    buf_size: usize,
    nbufs: usize,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    lens: Vec<usize>,
    /// Datagrams that arrived while we waited for config ACKs.
    pub stash: Vec<Vec<u8>>,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl Queue {
    /// Open the netlink socket and bind the queue.
    pub fn open(
        queue: u16,
        copy_range: u32,
        maxlen: u32,
        nbufs: usize,
        gso: bool,
        split: Option<(u16, u32)>,
    ) -> io::Result<Queue> {
        // SAFETY: plain syscalls with valid arguments.
        let fd = cvt(unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                NETLINK_NETFILTER,
            )
        })?;
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        cvt(unsafe {
            libc::bind(
                fd,
                &sa as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        })?;
        for (opt, val) in [
            (libc::SO_RCVBUFFORCE, 64 << 20),
            (libc::SO_SNDBUFFORCE, 8 << 20),
        ] {
            let v: libc::c_int = val;
            // Ignore failure (non-root): the defaults still work, slower.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    &v as *const _ as *const libc::c_void,
                    4,
                )
            };
        }
        let widest = split.map_or(copy_range, |(_, c)| c.max(copy_range));
        let buf_size = align4(widest as usize + 1024).max(2048);
        let mut q = Queue {
            fd,
            queue,
            seq: 1,
            bufs: vec![0u8; buf_size * nbufs],
            buf_size,
            nbufs,
            iovs: Vec::new(),
            hdrs: Vec::new(),
            lens: vec![0; nbufs],
            stash: Vec::new(),
        };
        q.setup_mmsg();

        q.bind_one(queue, copy_range, maxlen, gso)?;
        if let Some((sq, sq_copy)) = split {
            // The split queue: no GSO flag, so the kernel segments every
            // super-packet re-queued to it (skb_gso_segment) and queues the
            // wire packets one by one, checksums completed.
            q.bind_one(sq, sq_copy, maxlen, false)?;
        }
        Ok(q)
    }

    fn bind_one(&mut self, queue: u16, copy_range: u32, maxlen: u32, gso: bool) -> io::Result<()> {
        // BIND (pf 0, as libnetfilter_queue does).
        let mut cmd = [0u8; 4];
        cmd[0] = NFQNL_CFG_CMD_BIND;
        self.config(queue, NFQA_CFG_CMD, &cmd).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("binding NFQUEUE {queue} failed: {e} (EBUSY = queue already bound by another process; EPERM = need CAP_NET_ADMIN)"),
            )
        })?;
        let mut params = [0u8; 5];
        params[0..4].copy_from_slice(&copy_range.to_be_bytes());
        params[4] = NFQNL_COPY_PACKET;
        self.config(queue, NFQA_CFG_PARAMS, &params)?;
        self.config(queue, NFQA_CFG_QUEUE_MAXLEN, &maxlen.to_be_bytes())?;
        // Flags: always clear FAIL_OPEN (fail closed). Without GSO the kernel
        // segments GSO packets before queueing (one message per wire packet);
        // with it they arrive whole.
        let mask = NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO;
        let flags = if gso { NFQA_CFG_F_GSO } else { 0 };
        let mut buf = Vec::new();
        let seq = self.next_seq();
        let st = put_nlhdr(
            &mut buf,
            NFQNL_MSG_CONFIG,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            queue,
        );
        put_attr(&mut buf, NFQA_CFG_FLAGS, &flags.to_be_bytes());
        put_attr(&mut buf, NFQA_CFG_MASK, &mask.to_be_bytes());
        finish_msg(&mut buf, st);
        self.send(&buf)?;
        self.wait_ack(seq)
    }

    fn setup_mmsg(&mut self) {
        self.iovs.clear();
        self.hdrs.clear();
        for i in 0..self.nbufs {
            self.iovs.push(libc::iovec {
                iov_base: unsafe { self.bufs.as_mut_ptr().add(i * self.buf_size) }
                    as *mut libc::c_void,
                iov_len: self.buf_size,
            });
        }
        for i in 0..self.nbufs {
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_iov = &mut self.iovs[i] as *mut libc::iovec;
            h.msg_hdr.msg_iovlen = 1;
            self.hdrs.push(h);
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn config(&mut self, queue: u16, attr: u16, data: &[u8]) -> io::Result<()> {
        let mut buf = Vec::new();
        let seq = self.next_seq();
        let st = put_nlhdr(
            &mut buf,
            NFQNL_MSG_CONFIG,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            queue,
        );
        put_attr(&mut buf, attr, data);
        finish_msg(&mut buf, st);
        self.send(&buf)?;
        self.wait_ack(seq)
    }

    fn wait_ack(&mut self, seq: u32) -> io::Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let mut pfd = libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            unsafe { libc::poll(&mut pfd, 1, 100) };
            let mut buf = vec![0u8; self.buf_size];
            let n = unsafe {
                libc::recv(
                    self.fd,
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            } else {
                buf.truncate(n as usize);
                let mut result = None;
                let mut is_pkt = false;
                parse_datagram(&buf, |m| match m {
                    Msg::Error { errno, seq: s } if s == seq => result = Some(errno),
                    Msg::Packet(_) => is_pkt = true,
                    _ => {}
                });
                if is_pkt {
                    self.stash.push(buf);
                }
                match result {
                    Some(0) => return Ok(()),
                    Some(e) => return Err(io::Error::from_raw_os_error(e)),
                    None => {}
                }
            }
            if std::time::Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no ACK from nfnetlink_queue",
                ));
            }
        }
    }

    pub fn send(&self, buf: &[u8]) -> io::Result<()> {
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        loop {
            let r = unsafe {
                libc::sendto(
                    self.fd,
                    buf.as_ptr() as *const libc::c_void,
                    buf.len(),
                    0,
                    &sa as *const _ as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_nl>() as u32,
                )
            };
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
    }

    /// Receive up to nbufs datagrams without blocking. Returns the count
    /// (0 = nothing pending). ENOBUFS is reported as Err.
    pub fn recv_batch(&mut self) -> io::Result<usize> {
        for h in self.hdrs.iter_mut() {
            h.msg_len = 0;
            h.msg_hdr.msg_flags = 0;
        }
        let r = unsafe {
            libc::recvmmsg(
                self.fd,
                self.hdrs.as_mut_ptr(),
                self.nbufs as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(e);
        }
        let n = r as usize;
        for i in 0..n {
            self.lens[i] = (self.hdrs[i].msg_len as usize).min(self.buf_size);
        }
        Ok(n)
    }

    /// Datagram i of the last recv_batch.
    pub fn datagram(&self, i: usize) -> &[u8] {
        &self.bufs[i * self.buf_size..i * self.buf_size + self.lens[i]]
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}

/// Builder for many verdict messages sent in one sendto().
pub struct VerdictBuf {
    pub buf: Vec<u8>,
    queue: u16,
    pub count: usize,
}

pub const VERDICT_FLUSH_AT: usize = 60 * 1024;

impl VerdictBuf {
    pub fn new(queue: u16) -> Self {
        VerdictBuf {
            buf: Vec::with_capacity(128 * 1024),
            queue,
            count: 0,
        }
    }

    #[inline]
    pub fn push(&mut self, id: u32, verdict: u32, payload: Option<&[u8]>) {
        self.push_ty(NFQNL_MSG_VERDICT, self.queue, id, verdict, payload)
    }

    /// A verdict for a packet of another queue (the split queue).
    #[inline]
    pub fn push_q(&mut self, queue: u16, id: u32, verdict: u32, payload: Option<&[u8]>) {
        self.push_ty(NFQNL_MSG_VERDICT, queue, id, verdict, payload)
    }

    /// NFQNL_MSG_VERDICT_BATCH: verdict for every queued id <= `id`.
    pub fn push_batch(&mut self, id: u32, verdict: u32) {
        self.push_ty(NFQNL_MSG_VERDICT_BATCH, self.queue, id, verdict, None)
    }

    #[inline]
    fn push_ty(&mut self, ty: u16, queue: u16, id: u32, verdict: u32, payload: Option<&[u8]>) {
        let st = put_nlhdr(&mut self.buf, ty, NLM_F_REQUEST, 0, queue);
        let mut vh = [0u8; 8];
        vh[0..4].copy_from_slice(&verdict.to_be_bytes());
        vh[4..8].copy_from_slice(&id.to_be_bytes());
        put_attr(&mut self.buf, NFQA_VERDICT_HDR, &vh);
        if let Some(p) = payload {
            put_attr(&mut self.buf, NFQA_PAYLOAD, p);
        }
        finish_msg(&mut self.buf, st);
        self.count += 1;
    }

    pub fn clear(&mut self) {
        self.buf.clear();
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_roundtrip_layout() {
        let mut v = VerdictBuf::new(7);
        v.push(0x01020304, NF_ACCEPT, None);
        assert_eq!(v.buf.len(), 32);
        assert_eq!(u32::from_ne_bytes(v.buf[0..4].try_into().unwrap()), 32);
        assert_eq!(&v.buf[18..20], &7u16.to_be_bytes());
        assert_eq!(&v.buf[24..28], &NF_ACCEPT.to_be_bytes());
        assert_eq!(&v.buf[28..32], &0x01020304u32.to_be_bytes());
        v.push(5, NF_ACCEPT, Some(&[1, 2, 3, 4, 5]));
        assert_eq!(v.buf.len(), 32 + 32 + 12);
    }

    #[test]
    fn parse_packet_msg() {
        let mut b = Vec::new();
        let st = put_nlhdr(&mut b, NFQNL_MSG_PACKET, 0, 0, 0);
        let mut ph = [0u8; 7];
        ph[0..4].copy_from_slice(&42u32.to_be_bytes());
        ph[4..6].copy_from_slice(&0x0800u16.to_be_bytes());
        put_attr(&mut b, NFQA_PACKET_HDR, &ph);
        put_attr(&mut b, NFQA_PAYLOAD, &[0x45, 0, 0, 20]);
        finish_msg(&mut b, st);
        let mut got = None;
        parse_datagram(&b, |m| {
            if let Msg::Packet(p) = m {
                got = Some((p.id, p.hw_protocol, p.payload.to_vec()));
            }
        });
        assert_eq!(got, Some((42, 0x0800, vec![0x45, 0, 0, 20])));
        // queue number, NFQA_CAP_LEN, NFQA_SKB_INFO, outdev
        let mut b = Vec::new();
        let st = put_nlhdr(&mut b, NFQNL_MSG_PACKET, 0, 0, 7);
        put_attr(&mut b, NFQA_PACKET_HDR, &ph);
        put_attr(&mut b, NFQA_IFINDEX_OUTDEV, &3u32.to_be_bytes());
        put_attr(&mut b, NFQA_PAYLOAD, &[0x45, 0, 0, 20]);
        put_attr(&mut b, NFQA_CAP_LEN, &65000u32.to_be_bytes());
        put_attr(
            &mut b,
            NFQA_SKB_INFO,
            &(NFQA_SKB_GSO | NFQA_SKB_CSUMNOTREADY).to_be_bytes(),
        );
        finish_msg(&mut b, st);
        let mut got = None;
        parse_datagram(&b, |m| {
            if let Msg::Packet(p) = m {
                got = Some((p.queue, p.id, p.len, p.skb_info, p.outdev));
            }
        });
        assert_eq!(got, Some((7, 42, 65000, 3, 3)));
        assert_eq!(nf_queue_nr(1), 0x0001_0003);
    }
}
