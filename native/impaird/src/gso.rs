//! Per-wire-packet decisions for GSO/GRO super-packets taken whole.
//!
//! The queue hands us super-packets whole (NFQA_CFG_F_GSO). For each one we
//! work out how many wire packets it stands for, run the rule's netem model
//! once per wire packet (so loss / duplicate / corrupt / reorder statistics
//! are per wire packet, exactly the model's), and then:
//!
//! - every wire packet passes unchanged with the same release time
//!   -> one verdict for the whole super-packet (`Plan::Whole`, the fast path);
//! - every wire packet is lost -> one DROP verdict (`Plan::Drop`);
//! - otherwise -> `Plan::Split`: the engine re-queues the super-packet to the
//!   split queue (bound without NFQA_CFG_F_GSO), where the kernel segments it
//!   exactly as it would on transmit and queues each wire packet; the engine
//!   applies the fates decided here to them in order.
//!
//! nfnetlink_queue does not export `gso_size` (NFQA_SKB_INFO carries only the
//! NFQA_SKB_GSO / CSUMNOTREADY / CSUM_NOTVERIFIED flags), so the count is
//! derived: the wire MTU of the output interface bounds each wire packet, so
//! a TCP super-packet is cut into segments of `mtu - ip header - tcp header
//! (incl. options)` payload bytes (= the MSS the kernel used when the path MTU
//! is the wire MTU), a UDP GSO one (UDP_SEGMENT) into datagrams of at most
//! `mtu - ip header - 8` payload bytes. Where the sender chose a smaller
//! segment (a smaller peer MSS, a VPN's own packet size under UDP_SEGMENT),
//! the real size is learned per flow from the first super-packet of that flow
//! the kernel segments for us, and used from then on.

use crate::model::{Decision, RuleModel};

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    pub src: u32,
    pub dst: u32,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
}

/// Header facts of an IPv4 packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headers {
    pub key: FlowKey,
    /// IP header length.
    pub ihl: usize,
    /// IP + L4 header bytes (TCP with options, UDP 8); IP only for other
    /// protocols and fragments.
    pub hdr: usize,
}

/// Parse the IPv4 + TCP/UDP headers from the first bytes of a packet.
pub fn parse_headers(p: &[u8]) -> Option<Headers> {
    if p.len() < 20 || p[0] >> 4 != 4 {
        return None;
    }
    let ihl = ((p[0] & 0x0f) as usize) * 4;
    if ihl < 20 || ihl > p.len() {
        return None;
    }
    let src = u32::from_be_bytes(p[12..16].try_into().unwrap());
    let dst = u32::from_be_bytes(p[16..20].try_into().unwrap());
    let frag = u16::from_be_bytes([p[6], p[7]]) & 0x3fff; // MF + offset
    let proto = p[9];
    let l4 = &p[ihl..];
    let mut key = FlowKey {
        src,
        dst,
        proto,
        sport: 0,
        dport: 0,
    };
    let mut hdr = ihl;
    if frag == 0 && l4.len() >= 8 && (proto == IPPROTO_TCP || proto == IPPROTO_UDP) {
        key.sport = u16::from_be_bytes([l4[0], l4[1]]);
        key.dport = u16::from_be_bytes([l4[2], l4[3]]);
        if proto == IPPROTO_UDP {
            hdr = ihl + 8;
        } else if l4.len() >= 20 {
            hdr = ihl + ((l4[12] >> 4) as usize) * 4;
        } else {
            key.proto = 0; // TCP header cut off: count it as one packet
        }
    }
    Some(Headers { key, ihl, hdr })
}

/// Number of wire packets a queued packet of `len` bytes stands for, and the
/// segment payload size used (0 when it is one wire packet). `gso` is the
/// NFQA_SKB_GSO flag; `learned` a segment size seen for this flow before.
pub fn segment_count(
    len: usize,
    h: &Headers,
    gso: bool,
    mtu: usize,
    learned: Option<u16>,
) -> (u32, u32) {
    if !gso || len <= mtu || !(h.key.proto == IPPROTO_TCP || h.key.proto == IPPROTO_UDP) {
        return (1, 0);
    }
    let payload = len.saturating_sub(h.hdr);
    let g = match learned {
        Some(g) if g > 0 => g as usize,
        _ => mtu.saturating_sub(h.hdr),
    };
    if g == 0 || payload == 0 {
        return (1, 0);
    }
    (payload.div_ceil(g).max(1) as u32, g as u32)
}

/// The netem decisions for one wire packet: the original (None = lost) and
/// a duplicate copy (netem's clone), as `RuleModel::process` returns them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegFate {
    pub orig: Option<Decision>,
    pub clone: Option<Decision>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// One verdict for the whole packet: release after `delay_ns`.
    Whole { delay_ns: i64, reordered: bool },
    /// Every wire packet lost.
    Drop,
    /// Wire packets have different fates (or need their bytes: corrupt,
    /// duplicate): segment and apply `fates` one by one.
    Split,
}

/// Run the rule model once per wire packet (netem's draws in netem's order,
/// wire packet after wire packet) and choose the plan.
///
/// Delay: the wire packets of one super-packet left the sender back to back;
/// they share the delay drawn for the first of them that is not reordered
/// (netem delays a GSO skb as one, too), so jitter does not reorder a
/// super-packet's own segments and does not by itself force a split. A
/// reordered wire packet (netem: sent at once, skipping the delay) keeps
/// delay 0. The delay draws of the other segments still happen, so the PRNG
/// sequence per wire packet is the model's.
pub fn decide(model: &mut RuleModel, n: u32, fates: &mut Vec<SegFate>) -> Plan {
    fates.clear();
    for _ in 0..n {
        let (orig, clone) = model.process();
        fates.push(SegFate { orig, clone });
    }
    plan_of(fates)
}

/// Apply the shared delay to `fates` and choose the plan (see [`decide`]).
pub fn plan_of(fates: &mut [SegFate]) -> Plan {
    let shared = fates
        .iter()
        .filter_map(|f| f.orig)
        .find(|o| !o.reordered)
        .map_or(0, |o| o.delay_ns);
    let mut all_lost = true;
    let mut whole = true;
    let mut first_reordered: Option<bool> = None;
    for f in fates.iter_mut() {
        if let Some(o) = f.orig.as_mut() {
            all_lost = false;
            if !o.reordered {
                o.delay_ns = shared;
            }
            let fr = *first_reordered.get_or_insert(o.reordered);
            if o.corrupt || f.clone.is_some() || o.reordered != fr {
                whole = false;
            }
        } else {
            whole = false;
        }
    }
    if all_lost {
        return Plan::Drop;
    }
    if whole {
        let reordered = first_reordered.unwrap_or(false);
        return Plan::Whole {
            delay_ns: if reordered { 0 } else { shared },
            reordered,
        };
    }
    Plan::Split
}

/// A super-packet re-queued to the split queue, awaiting its wire packets.
pub struct Split {
    pub key: FlowKey,
    pub rule: u16,
    /// When the super-packet was read (delays count from here).
    pub t0: u64,
    /// Heap sequence numbers reserved for its wire packets: seq_base.. seq_end.
    pub seq_base: u64,
    pub seq_end: u64,
    /// L4 payload bytes of the super-packet, and those seen in wire packets.
    pub expected: usize,
    pub seen: usize,
    /// Segment payload size assumed when counting (0 = one wire packet).
    pub gso_size: u32,
    pub next: usize,
    pub fates: Vec<SegFate>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LossCfg, Prob, RuleCfg};

    /// Hand-made IPv4/TCP super-packet header: 20-byte IP, TCP with
    /// timestamps (32-byte header), `len` total bytes.
    fn tcp_pkt(len: usize, seq: u32) -> Vec<u8> {
        let mut p = vec![0u8; 52];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        p[8] = 63;
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 50, 1, 2]);
        p[16..20].copy_from_slice(&[10, 50, 2, 2]);
        p[20..22].copy_from_slice(&40000u16.to_be_bytes());
        p[22..24].copy_from_slice(&5201u16.to_be_bytes());
        p[24..28].copy_from_slice(&seq.to_be_bytes());
        p[32] = 8 << 4; // data offset 8 words = 32 bytes
        p[33] = 0x18; // PSH ACK
        p
    }

    fn udp_pkt(len: usize) -> Vec<u8> {
        let mut p = vec![0u8; 28];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        p[9] = 17;
        p[12..16].copy_from_slice(&[10, 50, 1, 2]);
        p[16..20].copy_from_slice(&[10, 50, 2, 2]);
        p[20..22].copy_from_slice(&51820u16.to_be_bytes());
        p[22..24].copy_from_slice(&51821u16.to_be_bytes());
        p
    }

    #[test]
    fn headers_tcp_udp_other() {
        let h = parse_headers(&tcp_pkt(65226, 1)).unwrap();
        assert_eq!((h.ihl, h.hdr, h.key.proto), (20, 52, 6));
        assert_eq!((h.key.sport, h.key.dport), (40000, 5201));
        let h = parse_headers(&udp_pkt(60000)).unwrap();
        assert_eq!((h.hdr, h.key.sport), (28, 51820));
        let mut icmp = udp_pkt(84);
        icmp[9] = 1;
        let h = parse_headers(&icmp).unwrap();
        assert_eq!((h.hdr, h.key.sport), (20, 0));
        let mut frag = tcp_pkt(1500, 1);
        frag[6] = 0x20; // MF
        assert_eq!(parse_headers(&frag).unwrap().hdr, 20);
        assert!(parse_headers(&[0x60; 40]).is_none());
    }

    #[test]
    fn tcp_segment_count_is_payload_over_mss() {
        // MTU 1500, 20 IP + 32 TCP (timestamps) -> 1448-byte segments, as
        // Linux TCP sends with MSS 1460 and timestamps.
        let h = parse_headers(&tcp_pkt(0, 0)).unwrap();
        // 45 full segments: 52 + 45 * 1448 = 65212 bytes
        assert_eq!(
            segment_count(52 + 45 * 1448, &h, true, 1500, None),
            (45, 1448)
        );
        // one byte more is a 46th (short) segment
        assert_eq!(
            segment_count(52 + 45 * 1448 + 1, &h, true, 1500, None),
            (46, 1448)
        );
        // a packet that fits the MTU is one wire packet, flag or not
        assert_eq!(segment_count(1500, &h, true, 1500, None), (1, 0));
        // without NFQA_SKB_GSO: one packet whatever its length
        assert_eq!(segment_count(9000, &h, false, 1500, None), (1, 0));
        // a learned (smaller) MSS wins over the MTU-derived one
        assert_eq!(
            segment_count(52 + 10 * 1200, &h, true, 1500, Some(1200)),
            (10, 1200)
        );
        // MTU 1400
        assert_eq!(
            segment_count(52 + 20 * 1348, &h, true, 1400, None),
            (20, 1348)
        );
    }

    #[test]
    fn udp_gso_segment_count() {
        let h = parse_headers(&udp_pkt(0)).unwrap();
        // MTU-bounded datagrams: 1472 payload bytes each
        assert_eq!(
            segment_count(28 + 44 * 1472, &h, true, 1500, None),
            (44, 1472)
        );
        // wireguard-go style: 1452-byte datagrams (inner MTU 1420 + 32),
        // 45 of them; MTU-derived count agrees below 73 segments
        assert_eq!(segment_count(28 + 45 * 1452, &h, true, 1500, None).0, 45);
        // tailscale: 1312-byte datagrams; the MTU-derived count is short
        // until the size is learned
        assert_eq!(segment_count(28 + 45 * 1312, &h, true, 1500, None).0, 41);
        assert_eq!(
            segment_count(28 + 45 * 1312, &h, true, 1500, Some(1312)).0,
            45
        );
        // last datagram shorter
        assert_eq!(
            segment_count(28 + 3 * 1312 + 100, &h, true, 1500, Some(1312)).0,
            4
        );
    }

    fn d(delay_ns: i64) -> Option<Decision> {
        Some(Decision {
            delay_ns,
            ..Default::default()
        })
    }

    #[test]
    fn plan_whole_only_when_every_segment_passes_alike() {
        // all pass, different jitter draws: one whole verdict at the first delay
        let mut f: Vec<SegFate> = (0..40)
            .map(|i| SegFate {
                orig: d(1000 + i),
                clone: None,
            })
            .collect();
        assert_eq!(
            plan_of(&mut f),
            Plan::Whole {
                delay_ns: 1000,
                reordered: false
            }
        );
        assert!(f.iter().all(|x| x.orig.unwrap().delay_ns == 1000));
        // one segment lost -> split
        f[7].orig = None;
        assert_eq!(plan_of(&mut f), Plan::Split);
        // all lost -> one drop
        let mut f = vec![SegFate::default(); 40];
        assert_eq!(plan_of(&mut f), Plan::Drop);
        // one corrupted, one duplicated, one reordered -> split each
        for k in 0..3 {
            let mut f: Vec<SegFate> = (0..10)
                .map(|_| SegFate {
                    orig: d(5),
                    clone: None,
                })
                .collect();
            match k {
                0 => f[3].orig.as_mut().unwrap().corrupt = true,
                1 => f[3].clone = d(9),
                _ => {
                    let o = f[3].orig.as_mut().unwrap();
                    o.reordered = true;
                    o.delay_ns = 0;
                }
            }
            assert_eq!(plan_of(&mut f), Plan::Split, "case {k}");
            if k == 2 {
                // the reordered one keeps delay 0, the others share 5
                assert_eq!(f[3].orig.unwrap().delay_ns, 0);
                assert_eq!(f[4].orig.unwrap().delay_ns, 5);
            }
        }
    }

    fn loss_rule(p: f64) -> RuleCfg {
        let mut c = RuleCfg::for_tests();
        c.loss = Some(LossCfg::Random {
            p,
            correlation: 0.0,
        });
        c
    }

    #[test]
    fn clean_super_packet_gives_exactly_one_whole_verdict() {
        // no per-wire impairment at all: every super-packet whole, the model
        // consulted once per wire packet
        let mut m = RuleModel::new(&RuleCfg::for_tests(), 7);
        let mut fates = Vec::new();
        for n in [1u32, 2, 45, 64] {
            assert_eq!(
                decide(&mut m, n, &mut fates),
                Plan::Whole {
                    delay_ns: 0,
                    reordered: false
                }
            );
            assert_eq!(fates.len(), n as usize);
        }
    }

    #[test]
    fn loss_is_per_wire_packet_and_matches_the_model_sequence() {
        // Deciding super-packets of 45 must lose exactly the wire packets
        // the model loses when asked packet by packet (same seed), i.e. the
        // per-wire loss statistics are the model's own.
        let cfg = loss_rule(0.01);
        let mut a = RuleModel::new(&cfg, 99);
        let mut b = RuleModel::new(&cfg, 99);
        let mut fates = Vec::new();
        let (mut lost, mut total, mut whole, mut split) = (0u64, 0u64, 0u64, 0u64);
        for _ in 0..20_000 {
            let plan = decide(&mut a, 45, &mut fates);
            for f in &fates {
                let (o, _) = b.process();
                assert_eq!(f.orig.is_none(), o.is_none());
                lost += f.orig.is_none() as u64;
                total += 1;
            }
            match plan {
                Plan::Whole { .. } => whole += 1,
                Plan::Split => split += 1,
                Plan::Drop => {}
            }
        }
        let rate = lost as f64 / total as f64;
        // 900 000 wire packets: sd of the rate 1.05e-4
        assert!((rate - 0.01).abs() < 5e-4, "loss {rate}");
        // P(no loss among 45) = 0.99^45 = 0.636
        let fw = whole as f64 / 20_000.0;
        assert!((fw - 0.636).abs() < 0.02, "whole share {fw}");
        assert_eq!(whole + split, 20_000);
    }

    #[test]
    fn reorder_and_duplicate_rates_per_wire() {
        let mut c = RuleCfg::for_tests();
        c.delay_us = 1000;
        c.reorder = Some(Prob {
            p: 0.05,
            correlation: 0.0,
            gap: None,
        });
        c.duplicate = Some(Prob {
            p: 0.02,
            correlation: 0.0,
            gap: None,
        });
        let mut m = RuleModel::new(&c, 3);
        let mut fates = Vec::new();
        let (mut re, mut dup, mut total) = (0u64, 0u64, 0u64);
        for _ in 0..10_000 {
            decide(&mut m, 40, &mut fates);
            for f in &fates {
                total += 1;
                dup += f.clone.is_some() as u64;
                re += f.orig.is_some_and(|o| o.reordered) as u64;
            }
        }
        let (r, dd) = (re as f64 / total as f64, dup as f64 / total as f64);
        assert!((r - 0.05).abs() < 0.002, "reorder {r}");
        assert!((dd - 0.02).abs() < 0.001, "duplicate {dd}");
    }
}
