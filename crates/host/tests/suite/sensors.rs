//! Sensors on procfs/sysfs fakes and on the real machine.

use crate::support;

use std::path::Path;

use headroom_host::sensors::{parse_psi, PolledFile};
use headroom_host::{LinuxHost, PsiResource};
use support::Fake;

const PROC_STAT: &str = "cpu  300 0 100 600 0 0 0 0 0 0\n\
cpu0 100 0 50 300 0 0 0 0 0 0\n\
cpu1 200 0 50 300 0 0 0 0 0 0\n\
intr 1 2 3\nctxt 55\n";

#[test]
fn proc_stat_reader_parses_per_cpu_lines_and_rereads_in_place() {
    let fake = Fake::v1();
    fake.write("/proc/stat", PROC_STAT);
    let mut reader = fake.host().proc_stat().unwrap();
    let cpus = reader.read().unwrap();
    assert_eq!(cpus.len(), 2);
    assert_eq!((cpus[1].cpu, cpus[1].user, cpus[1].idle), (1, 200, 300));
    assert_eq!(cpus[0].busy_ticks(), 150);
    // The same open file sees new content (pread from 0, not a stale buffer).
    fake.write(
        "/proc/stat",
        &PROC_STAT.replace("cpu1 200 0 50 300", "cpu1 250 0 50 350"),
    );
    assert_eq!(reader.read().unwrap()[1].idle, 350);
}

#[test]
fn idle_sampler_reports_per_cpu_idle_fraction_between_samples() {
    let fake = Fake::v1();
    fake.write("/proc/stat", PROC_STAT);
    let mut sampler = fake.host().idle_sampler().unwrap();
    // cpu0: +100 idle of +100 total; cpu1: +0 idle of +100 total.
    fake.write(
        "/proc/stat",
        "cpu  0 0 0 0\ncpu0 100 0 50 400 0 0 0 0 0 0\ncpu1 300 0 50 300 0 0 0 0 0 0\n",
    );
    let idle = sampler.sample().unwrap().to_vec();
    assert_eq!(idle, vec![(0, 1.0), (1, 0.0)]);
    // Counters that did not move keep the previous fraction.
    assert_eq!(sampler.sample().unwrap().to_vec(), idle);
}

#[test]
fn malformed_proc_stat_names_the_file() {
    let fake = Fake::v1();
    fake.write("/proc/stat", "cpu0 1 2 x\n");
    let err = fake
        .host()
        .proc_stat()
        .unwrap()
        .read()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("proc/stat") && err.contains("cpu0 1 2 x"),
        "{err}"
    );
    let missing = tempfile::tempdir().unwrap();
    let err = LinuxHost::new(missing.path()).proc_stat().unwrap_err();
    assert!(
        err.is_not_found() && err.to_string().contains("proc/stat"),
        "{err}"
    );
}

#[test]
fn schedstat_psi_meminfo_and_net_dev_on_fakes() {
    let fake = Fake::v1();
    fake.write("/proc/10/task/11/schedstat", "5000 700 3\n");
    let s = fake.host().schedstat(10, 11).unwrap().read().unwrap();
    assert_eq!((s.run_ns, s.wait_ns, s.timeslices), (5000, 700, 3));

    fake.write(
        "/proc/pressure/memory",
        "some avg10=0.25 avg60=0.10 avg300=0.00 total=999\nfull avg10=0.05 avg60=0.00 avg300=0.00 total=10\n",
    );
    let psi = fake.host().psi(PsiResource::Memory).unwrap();
    assert_eq!(psi.some.avg10, 0.25);
    assert_eq!(psi.full.unwrap().total_us, 10);
    assert!(parse_psi(Path::new("x"), "bogus\n").is_err());

    fake.write(
        "/proc/meminfo",
        "MemTotal: 1000 kB\nMemFree: 200 kB\nMemAvailable: 500 kB\n",
    );
    let m = fake.host().meminfo().unwrap();
    assert_eq!(
        (m.total, m.free, m.available),
        (1_024_000, 204_800, 512_000)
    );

    fake.write(
        "/proc/net/dev",
        "Inter-|   Receive                                                |  Transmit\n \
         face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n  \
         eth0: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n",
    );
    let n = fake.host().net_dev("eth0").unwrap();
    assert_eq!((n.rx_bytes, n.tx_bytes, n.tx_packets), (1000, 2000, 20));
    for (f, v) in [
        ("rx_bytes", "5"),
        ("rx_packets", "6"),
        ("tx_bytes", "7"),
        ("tx_packets", "8"),
    ] {
        fake.write(&format!("/sys/class/net/eth1/statistics/{f}"), v);
    }
    assert_eq!(fake.host().net_dev("eth1").unwrap().tx_bytes, 7);
    assert!(fake
        .host()
        .net_dev("eth9")
        .unwrap_err()
        .to_string()
        .contains("eth9"));
    assert!(fake.host().net_dev("../x").is_err());
}

#[test]
fn topology_from_a_fake_sysfs_with_smt_and_numa() {
    let fake = Fake::v1();
    fake.write("/sys/devices/system/cpu/online", "0-3\n");
    for (cpu, sib) in [(0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")] {
        fake.write(
            &format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"),
            sib,
        );
    }
    fake.write("/sys/devices/system/node/online", "0-1\n");
    for (i, level, kind, size) in [
        (0, "1", "Data", "32K"),
        (1, "1", "Instruction", "32K"),
        (2, "2", "Unified", "1024K"),
        (3, "3", "Unified", "32768K"),
    ] {
        let d = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        fake.write(&format!("{d}/level"), level);
        fake.write(&format!("{d}/type"), kind);
        fake.write(&format!("{d}/size"), size);
    }
    let t = fake.host().topology().unwrap();
    assert!(t.smt());
    assert_eq!(t.smt_siblings.len(), 2);
    assert_eq!(t.siblings_of(2).unwrap().to_list(), "0,2");
    assert_eq!(t.numa_nodes, 2);
    assert_eq!(t.llc_bytes, Some(32 << 20));
}

#[test]
fn llc_falls_back_to_cpuinfo() {
    let fake = Fake::v1();
    fake.write("/sys/devices/system/cpu/online", "0\n");
    fake.write("/proc/cpuinfo", "processor\t: 0\ncache size\t: 16384 KB\n");
    let t = fake.host().topology().unwrap();
    assert_eq!(t.llc_bytes, Some(16 << 20));
    assert!(!t.smt());
    assert_eq!(t.numa_nodes, 1);
}

#[test]
fn real_sensors_read_this_machine() {
    let host = LinuxHost::system();
    let mut reader = host.proc_stat().unwrap();
    let n = reader.read().unwrap().len();
    assert_eq!(n, host.topology().unwrap().cpus_online.len());
    let mut sampler = host.idle_sampler().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(30));
    for (_, idle) in sampler.sample().unwrap() {
        assert!((0.0..=1.0).contains(idle));
    }
    let pid = std::process::id() as i32;
    let tid = nix::unistd::gettid().as_raw();
    match host.schedstat(pid, tid) {
        Ok(mut s) => assert!(s.read().unwrap().run_ns > 0),
        Err(e) => eprintln!("SKIP schedstat: {e}"),
    }
    match host.psi(PsiResource::Cpu) {
        Ok(p) => assert!(p.some.avg10 >= 0.0),
        Err(e) => eprintln!("SKIP psi: {e}"),
    }
    assert!(host.meminfo().unwrap().available > 0);
    assert!(host.net_dev("lo").is_ok());
    assert!(!host.kernel_release().unwrap().is_empty());
    let mut f = PolledFile::open("/proc/loadavg").unwrap();
    assert!(!f.read().unwrap().is_empty());
}
