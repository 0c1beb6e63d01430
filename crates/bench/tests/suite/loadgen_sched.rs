//! The load generator runs under SCHED_FIFO where the machine allows it, and every experiment
//! says which scheduler it ran under: where `chrt -f` works (root with an RT budget) each
//! `headroom load` command line carries it; where it does not, the command is unchanged and the
//! manifest names the reason.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;

use headroom_bench::experiments::Experiment;
use headroom_bench::record::Options;
use headroom_bench::runner::{Placement, Runner, LOADGEN_FIFO_PRIORITY};

fn runner(dir: &std::path::Path) -> Runner {
    Runner::new(
        PathBuf::from("/opt/headroom"),
        Placement::default_for(2),
        dir.join("logs"),
    )
}

#[test]
fn load_commands_carry_the_fifo_wrapper_exactly_when_it_works() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = runner(tmp.path());
    let addr: SocketAddr = "127.0.0.1:11211".parse().unwrap();
    let before = r.load_argv(addr, 1000.0, 5.0, &tmp.path().join("x.json"));
    assert!(
        !before.iter().any(|a| a == "chrt"),
        "a new runner adds no scheduler wrapper: {before:?}"
    );
    match r.realtime_loadgen() {
        Ok(()) => {
            let argv = r.load_argv(addr, 1000.0, 5.0, &tmp.path().join("x.json"));
            let chrt = argv.iter().position(|a| a == "chrt").expect("chrt in argv");
            let bin = argv.iter().position(|a| a == "/opt/headroom").unwrap();
            assert_eq!(
                argv[chrt..bin],
                ["chrt", "-f", &LOADGEN_FIFO_PRIORITY.to_string()],
                "{argv:?}"
            );
            // Pinning wraps the scheduler wrapper, so both apply to the load generator.
            if r.pin {
                assert_eq!(argv[0], "taskset", "{argv:?}");
            }
        }
        Err(why) => {
            eprintln!("SCHED_FIFO is not allowed here ({why}); checking the fallback only");
            assert!(!why.to_string().is_empty());
            assert!(r.loadgen_prefix.is_empty());
            let argv = r.load_argv(addr, 1000.0, 5.0, &tmp.path().join("x.json"));
            assert_eq!(argv, before);
        }
    }
}

#[test]
fn the_manifest_names_the_load_generators_scheduler() {
    for realtime in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let mut opts = Options::defaults(
            Experiment::Isolation,
            true,
            tmp.path().join("no-such-headroom"),
        );
        opts.realtime_loadgen = realtime;
        let s = common::quiet_session(Experiment::Isolation, opts, &tmp.path().join("run"));
        let fifo = !s.runner.loadgen_prefix.is_empty();
        let note = s
            .manifest
            .notes
            .iter()
            .find(|n| n.starts_with("the load generator ran under"))
            .unwrap_or_else(|| panic!("no scheduler note in {:?}", s.manifest.notes));
        if fifo {
            assert!(realtime, "without --realtime-loadgen it stays normal");
            assert!(note.contains("SCHED_FIFO priority"), "{note}");
        } else {
            assert!(note.contains("normal scheduler ("), "{note}");
            if !realtime {
                assert!(note.contains("--realtime-loadgen"), "{note}");
            }
        }
    }
}
