//! Real egress throttling: two network namespaces joined by a veth pair (169.254.77.0/24, made
//! and deleted by this test). A bulk sender classified as BE by its cgroup (a cgroup BPF egress
//! program sets its packets' priority to the HTB BE class) is held to the BE ceil ±10%, then to
//! a new ceil after `tc class change`, while an unclassified (LC) sender beside it is not.

use crate::real;

use std::fs::File;
use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use headroom_host::bpf::EgressPriority;
use headroom_host::tc::{Egress, HtbConfig, SystemTc};
use nix::sched::CloneFlags;

const TEST: &str = "tc_htb_holds_a_be_classified_sender_to_its_ceil";
const BE_CEIL: u64 = 20_000_000;
const BE_CEIL_CHANGED: u64 = 40_000_000;

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Network namespaces deleted on drop.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

fn enter(ns: &str) {
    let f = File::open(format!("/run/netns/{ns}")).expect("netns file");
    nix::sched::setns(f, CloneFlags::CLONE_NEWNET).expect("setns");
}

fn skip(reason: &str) {
    eprintln!("SKIP {TEST}: {reason}");
}

#[test]
fn tc_htb_holds_a_be_classified_sender_to_its_ceil() {
    let _serial = real::SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !nix::unistd::geteuid().is_root() {
        return skip("not root");
    }
    if Command::new("tc").arg("-V").output().is_err() {
        return skip("tc (iproute2) not installed");
    }
    let (a, b) = (
        format!("hr-tc-{}-a", std::process::id()),
        format!("hr-tc-{}-b", std::process::id()),
    );
    let mut namespaces = Namespaces(Vec::new());
    for ns in [&a, &b] {
        if let Err(e) = ip(&["netns", "add", ns]) {
            return skip(&format!("cannot create a network namespace: {e}"));
        }
        namespaces.0.push(ns.clone());
    }
    let setup = [
        vec![
            "-n", &a, "link", "add", "veth-a", "type", "veth", "peer", "name", "veth-b", "netns",
            &b,
        ],
        vec!["-n", &a, "addr", "add", "169.254.77.1/24", "dev", "veth-a"],
        vec!["-n", &b, "addr", "add", "169.254.77.2/24", "dev", "veth-b"],
        vec!["-n", &a, "link", "set", "veth-a", "up"],
        vec!["-n", &b, "link", "set", "veth-b", "up"],
    ];
    for args in &setup {
        if let Err(e) = ip(args) {
            return skip(&format!("cannot build the veth pair: {e}"));
        }
    }

    // Classification by cgroup: a cgroup BPF egress program on the group's cgroup2 directory
    // sets skb->priority to the BE class id (cls_cgroup is missing on this kernel, and net_prio
    // only maps devices of the initial network namespace).
    let Some(cgroups) = real::real_cgroups(TEST, &[]) else {
        return;
    };
    let group = real::ScratchGroup::new(&cgroups, "be-net").unwrap();
    let v2_dir = match cgroups.ensure_v2_group(&group.path) {
        Ok(d) => d,
        Err(e) => return skip(&format!("no cgroup2 directory for cgroup BPF: {e}")),
    };
    let egress = Egress::new(SystemTc::in_netns(&a), "veth-a").unwrap();
    let config = HtbConfig::new(10_000_000_000, BE_CEIL);
    if let Err(e) = egress.setup(&config) {
        return skip(&format!("HTB unavailable: {e}"));
    }
    let classifier = match EgressPriority::attach(&v2_dir, config.be_classid()) {
        Ok(c) => c,
        Err(e) => return skip(&format!("cgroup BPF unavailable: {e}")),
    };

    // Receiver in `b`: counts bytes per connection (first byte B = BE, L = LC).
    let (port_tx, port_rx) = mpsc::channel();
    let received: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let receiver = {
        let (ns, received) = (b.clone(), received.clone());
        std::thread::spawn(move || {
            enter(&ns);
            let listener = TcpListener::bind("169.254.77.2:0").unwrap();
            port_tx.send(listener.local_addr().unwrap().port()).unwrap();
            let mut readers = Vec::new();
            for _ in 0..2 {
                let (mut stream, _) = listener.accept().unwrap();
                let received = received.clone();
                readers.push(std::thread::spawn(move || {
                    let mut tag = [0u8; 1];
                    stream.read_exact(&mut tag).unwrap();
                    let slot = &received[usize::from(tag[0] != b'B')];
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        slot.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }));
            }
            for r in readers {
                r.join().unwrap();
            }
        })
    };
    let port = port_rx.recv().unwrap();
    // Bulk senders in `a` (bash's /dev/tcp, then `cat /dev/zero`), gated on stdin so the BE one
    // joins its cgroup before it creates its socket.
    let sender = |tag: char| {
        let script = format!(
            "read go; exec 3<>/dev/tcp/169.254.77.2/{port}; printf {tag} >&3; exec cat /dev/zero >&3"
        );
        real::ChildGuard(
            Command::new("ip")
                .args(["netns", "exec", &a, "bash", "-c", &script])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn ip netns exec"),
        )
    };
    let mut be_sender = sender('B');
    let mut lc_sender = sender('L');
    cgroups.move_process(&group.path, be_sender.pid()).unwrap();
    be_sender.release();
    lc_sender.release();

    let be_bytes = || -> u64 {
        egress
            .class_stats()
            .unwrap()
            .iter()
            .find(|c| c.handle == "1:20")
            .map_or(0, |c| c.bytes)
    };
    std::thread::sleep(Duration::from_millis(300));
    let (t0, be0, lc0) = (
        Instant::now(),
        be_bytes(),
        received[1].load(Ordering::Relaxed),
    );
    std::thread::sleep(Duration::from_secs(2));
    let (t1, be1, lc1) = (
        Instant::now(),
        be_bytes(),
        received[1].load(Ordering::Relaxed),
    );
    egress.set_be_ceil(&config, BE_CEIL_CHANGED).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (t2, be2) = (Instant::now(), be_bytes());
    std::thread::sleep(Duration::from_millis(1200));
    let (t3, be3) = (Instant::now(), be_bytes());
    drop(be_sender);
    drop(lc_sender);
    receiver.join().unwrap();
    drop(classifier);

    let rate =
        |bytes: u64, from: Instant, to: Instant| bytes as f64 * 8.0 / (to - from).as_secs_f64();
    let be_rate = rate(be1 - be0, t0, t1);
    let lc_rate = rate(lc1 - lc0, t0, t1);
    let be_rate_changed = rate(be3 - be2, t2, t3);
    eprintln!(
        "BE {:.1} Mbit/s (ceil {}), LC {:.1} Mbit/s, BE after change {:.1} Mbit/s (ceil {})",
        be_rate / 1e6,
        BE_CEIL / 1_000_000,
        lc_rate / 1e6,
        be_rate_changed / 1e6,
        BE_CEIL_CHANGED / 1_000_000
    );
    let within = |measured: f64, ceil: u64| (measured / ceil as f64 - 1.0).abs() <= 0.10;
    assert!(within(be_rate, BE_CEIL), "BE {be_rate} vs ceil {BE_CEIL}");
    assert!(
        within(be_rate_changed, BE_CEIL_CHANGED),
        "BE {be_rate_changed} vs ceil {BE_CEIL_CHANGED}"
    );
    assert!(
        lc_rate > 3.0 * BE_CEIL as f64,
        "LC sender was restricted: {lc_rate}"
    );
    assert!(received[0].load(Ordering::Relaxed) > 0);
    drop(group);
    drop(namespaces);
}
