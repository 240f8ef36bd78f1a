//! impaird: userspace netem replacement on an iptables NFQUEUE.

mod config;
mod engine;
mod gso;
mod model;
mod nfq;

use config::Config;
use std::process::ExitCode;

const USAGE: &str = "usage: impaird --config CONFIG.json
       impaird --check-config CONFIG.json
       impaird --version";

extern "C" fn on_signal(_: libc::c_int) {
    engine::STOP.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn install_signals() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic; no SA_RESTART so
        // ppoll returns EINTR and the loop notices at once.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn set_realtime() -> Result<(), String> {
    let p = libc::sched_param { sched_priority: 50 };
    // SAFETY: plain syscall.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

fn run(path: &str) -> ExitCode {
    let (cfg, rules) = match Config::load(path) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("impaird: config error: {e}");
            return ExitCode::from(2);
        }
    };
    install_signals();
    // Timer slack 1 ns: ppoll wakeups as precise as the kernel allows.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };

    // Only copy whole packets when some rule may need the bytes
    // (duplicate / corrupt); otherwise 128 bytes cover the IPv4 addresses.
    let seedless = rules
        .iter()
        .map(|r| model::RuleModel::new(&r.cfg, 0))
        .collect::<Vec<_>>();
    let need_payload = seedless.iter().any(|m| m.needs_payload());
    drop(seedless);
    // GSO mode: the main queue never needs more than the headers (a packet
    // whose bytes are needed is re-queued to the split queue, which copies
    // whole wire packets when some rule duplicates or corrupts).
    let full: u32 = if need_payload { 0xffff } else { 128 };
    let (copy_range, split) = if cfg.gso {
        (128, Some((cfg.effective_split_queue(), full)))
    } else {
        (full, None)
    };
    let nbufs = if need_payload { 64 } else { 256 };

    let q = match nfq::Queue::open(
        cfg.queue,
        copy_range,
        cfg.queue_maxlen,
        nbufs,
        cfg.gso,
        split,
    ) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("impaird: {e}");
            return ExitCode::from(1);
        }
    };
    let mut eng = match engine::Engine::new(&cfg, rules, q) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("impaird: {e}");
            return ExitCode::from(1);
        }
    };
    // The Python side health-checks this file: refuse to run without it.
    if let Err(e) = eng.write_stats() {
        eprintln!("impaird: cannot write stats_path {}: {e}", cfg.stats_path);
        return ExitCode::from(1);
    }
    if cfg.realtime {
        match set_realtime() {
            Ok(()) => {
                eprintln!("impaird: realtime: SCHED_FIFO priority 50 set");
                eng.realtime_ok = true;
            }
            Err(e) => eprintln!("impaird: realtime: SCHED_FIFO failed ({e}); running SCHED_OTHER"),
        }
    } else {
        eprintln!("impaird: realtime: off (config)");
    }
    eprintln!(
        "impaird {}: pid {} bound NFQUEUE {} (copy_range {}, queue_maxlen {}, max_held {}, {} rules, fail-closed, {})",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        cfg.queue,
        copy_range,
        cfg.queue_maxlen,
        cfg.effective_max_held(),
        cfg.rules.len(),
        if cfg.gso {
            format!(
                "GSO packets whole, decided per wire packet, split on NFQUEUE {}",
                cfg.effective_split_queue()
            )
        } else {
            "kernel segments before queueing".to_string()
        }
    );
    match eng.run() {
        Ok(()) => {
            eprintln!("impaird: stopped by signal");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("impaird: {e}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["--version"] | ["-V"] => {
            println!("impaird {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        ["--check-config", path] => match Config::load(path) {
            Ok((cfg, _)) => {
                println!("config ok: {} rules", cfg.rules.len());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("impaird: config error: {e}");
                ExitCode::from(2)
            }
        },
        ["--config", path] => run(path),
        ["--help"] | ["-h"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
