//! CONFIG.json schema and validation.

use serde::Deserialize;
use std::fmt;

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    #[default]
    Uniform,
    Normal,
    Pareto,
    Paretonormal,
}

/// `{"p": .., "correlation": ..}` (reorder also accepts netem's `gap`).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prob {
    pub p: f64,
    #[serde(default)]
    pub correlation: f64,
    /// Only meaningful for `reorder` (netem `gap`, default 1).
    #[serde(default)]
    pub gap: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "model", rename_all = "lowercase", deny_unknown_fields)]
pub enum LossCfg {
    Random {
        p: f64,
        #[serde(default)]
        correlation: f64,
    },
    Gemodel {
        p: f64,
        #[serde(default)]
        r: Option<f64>,
        #[serde(default)]
        h: Option<f64>,
        #[serde(default)]
        k: Option<f64>,
    },
    State {
        p13: f64,
        #[serde(default)]
        p31: Option<f64>,
        #[serde(default)]
        p32: Option<f64>,
        #[serde(default)]
        p23: Option<f64>,
        #[serde(default)]
        p14: Option<f64>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub net: u32,
    pub mask: u32,
}

impl Cidr {
    pub const ANY: Cidr = Cidr { net: 0, mask: 0 };

    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: std::net::Ipv4Addr = a
            .trim()
            .parse()
            .map_err(|_| format!("not an IPv4 CIDR: {s:?}"))?;
        let len: u32 = match l {
            None => 32,
            Some(l) => l
                .trim()
                .parse()
                .ok()
                .filter(|n| *n <= 32)
                .ok_or_else(|| format!("bad prefix length in {s:?}"))?,
        };
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        Ok(Cidr {
            net: u32::from(addr) & mask,
            mask,
        })
    }

    #[inline]
    pub fn contains(&self, a: u32) -> bool {
        a & self.mask == self.net
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            std::net::Ipv4Addr::from(self.net),
            self.mask.count_ones()
        )
    }
}

/// How `correlation` acts on loss, duplicate, corrupt and reorder decisions.
/// `netem`: netem's `get_crandom` (averages uniform draws, which also lowers the
/// event rate: 1% loss at 50% correlation drops far fewer than 1%).
/// `markov`: a two-state chain with the configured long-run rate `p` and
/// lag-1 correlation `correlation` (P(event | event) = p + c(1 - p),
/// P(event | no event) = p(1 - c)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CorrelationModel {
    #[default]
    Netem,
    Markov,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleCfg {
    pub name: String,
    #[serde(default)]
    pub correlation_model: CorrelationModel,
    #[serde(default)]
    pub src: Option<String>,
    #[serde(default)]
    pub dst: Option<String>,
    #[serde(default)]
    pub delay_us: u64,
    #[serde(default)]
    pub jitter_us: u64,
    #[serde(default)]
    pub distribution: Distribution,
    #[serde(default)]
    pub delay_correlation: f64,
    #[serde(default)]
    pub loss: Option<LossCfg>,
    #[serde(default)]
    pub reorder: Option<Prob>,
    #[serde(default)]
    pub duplicate: Option<Prob>,
    #[serde(default)]
    pub corrupt: Option<Prob>,
}

impl RuleCfg {
    #[cfg(test)]
    pub fn for_tests() -> RuleCfg {
        RuleCfg {
            name: "t".into(),
            correlation_model: CorrelationModel::Netem,
            src: None,
            dst: None,
            delay_us: 0,
            jitter_us: 0,
            distribution: Distribution::Uniform,
            delay_correlation: 0.0,
            loss: None,
            reorder: None,
            duplicate: None,
            corrupt: None,
        }
    }
}

fn default_maxlen() -> u32 {
    4096
}
fn default_interval() -> u64 {
    200
}
fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub queue: u16,
    #[serde(default = "default_maxlen")]
    pub queue_maxlen: u32,
    /// Bound on packets held by the daemon itself (originals + duplicates).
    /// Default: 2 * queue_maxlen.
    #[serde(default)]
    pub max_held: Option<usize>,
    pub stats_path: String,
    #[serde(default = "default_interval")]
    pub stats_interval_ms: u64,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub realtime: bool,
    /// Queue GSO/GRO super-packets whole (NFQA_CFG_F_GSO) and decide per
    /// wire packet inside them (default). A super-packet whose wire packets
    /// all pass alike gets one verdict; otherwise it is re-queued to
    /// `split_queue`, where the kernel segments it. `false`: the old mode,
    /// the kernel segments every super-packet before queueing (one message
    /// per wire packet; slower, kept for comparison).
    #[serde(default = "default_true")]
    pub gso: bool,
    /// NFQUEUE number for segmentation (gso mode): bound by the engine with
    /// no iptables rule pointing at it. Default: `queue + 1`.
    #[serde(default)]
    pub split_queue: Option<u16>,
    /// Wire MTU used to count the wire packets in a super-packet. Default:
    /// the MTU of each packet's output interface (read once per interface).
    #[serde(default)]
    pub wire_mtu: Option<u32>,
    /// Busy-poll the queue for this long after the last packet before
    /// sleeping (0 = sleep at once). For an engine with a CPU of its own:
    /// a sleeping engine costs every burst a cross-CPU wake-up (an IPI, a
    /// VM exit in a VM) and 50-200 us of wake-up latency.
    #[serde(default)]
    pub busy_poll_us: u64,
    #[serde(default)]
    pub rules: Vec<RuleCfg>,
}

/// A validated rule with parsed CIDRs.
#[derive(Debug, Clone)]
pub struct Rule {
    pub cfg: RuleCfg,
    pub src: Cidr,
    pub dst: Cidr,
}

#[derive(Debug)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(field: &str, msg: impl fmt::Display) -> Result<T, ConfigError> {
    Err(ConfigError(format!("{field}: {msg}")))
}

fn check_p(field: &str, p: f64) -> Result<(), ConfigError> {
    if !(0.0..=1.0).contains(&p) || p.is_nan() {
        return err(
            field,
            format_args!("must be a fraction within 0..1 (got {p})"),
        );
    }
    Ok(())
}

pub const MAX_DELAY_US: u64 = 60_000_000;
pub const MAX_JITTER_US: u64 = 2_000_000;

impl Config {
    pub fn parse(text: &str) -> Result<(Config, Vec<Rule>), ConfigError> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let cfg: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path.is_empty() || path == "." {
                ConfigError(format!("{inner}"))
            } else {
                ConfigError(format!("{path}: {inner}"))
            }
        })?;
        let rules = cfg.validate()?;
        Ok((cfg, rules))
    }

    pub fn load(path: &str) -> Result<(Config, Vec<Rule>), ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read config {path}: {e}")))?;
        Config::parse(&text)
    }

    pub fn effective_split_queue(&self) -> u16 {
        self.split_queue.unwrap_or(self.queue.wrapping_add(1))
    }

    pub fn effective_max_held(&self) -> usize {
        self.max_held.unwrap_or(self.queue_maxlen as usize * 2)
    }

    fn validate(&self) -> Result<Vec<Rule>, ConfigError> {
        if self.queue_maxlen == 0 {
            return err("queue_maxlen", "must be >= 1");
        }
        if self.max_held == Some(0) {
            return err("max_held", "must be >= 1");
        }
        if !self.stats_path.starts_with('/') {
            return err("stats_path", "must be an absolute path");
        }
        if self.gso && self.effective_split_queue() == self.queue {
            return err("split_queue", "must differ from queue");
        }
        if let Some(m) = self.wire_mtu {
            if !(68..=65535).contains(&m) {
                return err("wire_mtu", "must be within 68..65535");
            }
        }
        if self.stats_interval_ms < 10 {
            return err("stats_interval_ms", "must be >= 10");
        }
        let mut names = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (i, r) in self.rules.iter().enumerate() {
            let f = |s: &str| format!("rules[{i}].{s}");
            if r.name.is_empty() {
                return err(&f("name"), "must not be empty");
            }
            if !names.insert(r.name.clone()) {
                return err(&f("name"), format_args!("duplicate rule name {:?}", r.name));
            }
            let src = match &r.src {
                None => Cidr::ANY,
                Some(s) => Cidr::parse(s).or_else(|e| err(&f("src"), e))?,
            };
            let dst = match &r.dst {
                None => Cidr::ANY,
                Some(s) => Cidr::parse(s).or_else(|e| err(&f("dst"), e))?,
            };
            if r.delay_us > MAX_DELAY_US {
                return err(&f("delay_us"), format_args!("must be <= {MAX_DELAY_US}"));
            }
            if r.jitter_us > MAX_JITTER_US {
                return err(&f("jitter_us"), format_args!("must be <= {MAX_JITTER_US}"));
            }
            check_p(&f("delay_correlation"), r.delay_correlation)?;
            match &r.loss {
                None => {}
                Some(LossCfg::Random { p, correlation }) => {
                    check_p(&f("loss.p"), *p)?;
                    check_p(&f("loss.correlation"), *correlation)?;
                }
                Some(LossCfg::Gemodel { p, r: rr, h, k }) => {
                    check_p(&f("loss.p"), *p)?;
                    for (n, v) in [("r", rr), ("h", h), ("k", k)] {
                        if let Some(v) = v {
                            check_p(&f(&format!("loss.{n}")), *v)?;
                        }
                    }
                }
                Some(LossCfg::State {
                    p13,
                    p31,
                    p32,
                    p23,
                    p14,
                }) => {
                    check_p(&f("loss.p13"), *p13)?;
                    for (n, v) in [("p31", p31), ("p32", p32), ("p23", p23), ("p14", p14)] {
                        if let Some(v) = v {
                            check_p(&f(&format!("loss.{n}")), *v)?;
                        }
                    }
                    if p13 + p14.unwrap_or(0.0) > 1.0 {
                        return err(&f("loss.p13"), "p13 + p14 must be <= 1");
                    }
                    if p31.unwrap_or(1.0 - p13) + p32.unwrap_or(0.0) > 1.0 {
                        return err(&f("loss.p31"), "p31 + p32 must be <= 1");
                    }
                }
            }
            for (n, v) in [
                ("reorder", &r.reorder),
                ("duplicate", &r.duplicate),
                ("corrupt", &r.corrupt),
            ] {
                if let Some(v) = v {
                    check_p(&f(&format!("{n}.p")), v.p)?;
                    check_p(&f(&format!("{n}.correlation")), v.correlation)?;
                    if n != "reorder" && v.gap.is_some() {
                        return err(&f(&format!("{n}.gap")), "only valid for reorder");
                    }
                }
            }
            if let Some(ro) = &r.reorder {
                if ro.p > 0.0 && r.delay_us == 0 {
                    return err(
                        &f("reorder"),
                        "reordering needs delay_us > 0 (as netem: reordered packets skip the delay)",
                    );
                }
                if ro.gap == Some(0) {
                    return err(&f("reorder.gap"), "must be >= 1");
                }
            }
            out.push(Rule {
                cfg: r.clone(),
                src,
                dst,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{
      "queue": 0, "queue_maxlen": 4096, "stats_path": "/tmp/x.json",
      "stats_interval_ms": 200, "seed": 12345, "realtime": true,
      "rules": [
        {"name": "h1->h2", "src": "10.50.1.0/24", "dst": "10.50.2.0/24",
         "delay_us": 25000, "jitter_us": 0, "distribution": "uniform",
         "delay_correlation": 0.0,
         "loss": {"model": "random", "p": 0.05, "correlation": 0.0},
         "reorder": {"p": 0.25, "correlation": 0.0},
         "duplicate": {"p": 0.0, "correlation": 0.0},
         "corrupt": {"p": 0.0, "correlation": 0.0}},
        {"name": "ge", "loss": {"model": "gemodel", "p": 0.01, "r": 0.3}},
        {"name": "4s", "loss": {"model": "state", "p13": 0.01, "p31": 0.5, "p32": 0.1, "p23": 0.2, "p14": 0.0}},
        {"name": "none", "loss": null}
      ]}"#;

    #[test]
    fn parses_example() {
        let (c, r) = Config::parse(GOOD).unwrap();
        assert_eq!(r.len(), 4);
        assert_eq!(c.queue_maxlen, 4096);
        assert_eq!(r[0].src, Cidr::parse("10.50.1.0/24").unwrap());
        assert!(r[0]
            .src
            .contains(u32::from(std::net::Ipv4Addr::new(10, 50, 1, 2))));
        assert!(!r[0]
            .src
            .contains(u32::from(std::net::Ipv4Addr::new(10, 50, 2, 2))));
        assert_eq!(r[1].src, Cidr::ANY);
    }

    #[test]
    fn gso_with_per_wire_rules() {
        // gso is the default and accepts per-wire rules (loss, reorder, ...)
        let (c, _) = Config::parse(GOOD).unwrap();
        assert!(c.gso);
        assert_eq!(c.effective_split_queue(), 1);
        let on = GOOD.replace(
            "\"realtime\": true,",
            "\"realtime\": true, \"gso\": true, \"wire_mtu\": 1400, \"split_queue\": 9,",
        );
        let (c, r) = Config::parse(&on).unwrap();
        assert!(c.gso && r.len() == 4);
        assert_eq!((c.wire_mtu, c.effective_split_queue()), (Some(1400), 9));
        let off = GOOD.replace("\"realtime\": true,", "\"realtime\": true, \"gso\": false,");
        assert!(!Config::parse(&off).unwrap().0.gso);
        let bad = GOOD.replace("\"queue\": 0,", "\"queue\": 3, \"split_queue\": 3,");
        let e = Config::parse(&bad).unwrap_err().0;
        assert!(e.contains("split_queue"), "{e}");
        let bad = GOOD.replace("\"queue\": 0,", "\"queue\": 0, \"wire_mtu\": 20,");
        let e = Config::parse(&bad).unwrap_err().0;
        assert!(e.contains("wire_mtu"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        let bad = GOOD.replace("\"p\": 0.05", "\"p\": 5");
        let e = Config::parse(&bad).unwrap_err().0;
        assert!(e.contains("rules[0].loss.p"), "{e}");
        let bad = GOOD.replace("\"delay_us\": 25000", "\"delay_us\": \"x\"");
        let e = Config::parse(&bad).unwrap_err().0;
        assert!(e.contains("rules[0].delay_us"), "{e}");
        let bad = GOOD.replace("\"jitter_us\"", "\"jiter_us\"");
        let e = Config::parse(&bad).unwrap_err().0;
        assert!(e.contains("jiter_us"), "{e}");
        let bad = GOOD.replace("10.50.1.0/24", "10.50.1.0/33");
        let e = Config::parse(&bad).unwrap_err().0;
        assert!(e.contains("rules[0].src"), "{e}");
        let bad = GOOD.replace("\"delay_us\": 25000", "\"delay_us\": 0");
        let e = Config::parse(&bad).unwrap_err().0;
        assert!(e.contains("rules[0].reorder"), "{e}");
        let bad = GOOD.replace("gemodel", "gilbert");
        let e = Config::parse(&bad).unwrap_err().0;
        assert!(e.contains("rules[1].loss"), "{e}");
        let bad = GOOD.replace("/tmp/x.json", "x.json");
        let e = Config::parse(&bad).unwrap_err().0;
        assert!(e.starts_with("stats_path"), "{e}");
    }
}
