//! Where an experiment's processes run: the load generator (and the agent) on CPUs of their own,
//! the LC on the server CPUs with one thread each, the BE on the same CPUs (the agent gives it
//! the ones the LC can spare) unless `--be-cpus` moves it.

use headroom_report::format::cpu_list;

/// Where the experiment's processes run.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// The load generator (and the agent): kept off the experiment's CPUs.
    pub loadgen: Vec<usize>,
    /// The LC service and the BE workloads.
    pub server: Vec<usize>,
    /// The BE workloads, where they differ from `server` (empty: on `server`, sharing the LC's
    /// CPUs). Heracles Fig. 1 runs antagonists on other cores than the LC, sharing its LLC, memory
    /// and network but not its CPU time.
    pub be: Vec<usize>,
}

/// Host CPUs per load-generator CPU in the default layout. One load-generator thread keeps
/// about 50k QPS valid, and on a 16-vCPU VM `headroom serve` carried ~17k QPS per server CPU
/// (capacity 240k on 14): with one client CPU per 8 (2 of 16) the demo's 87%-of-peak windows
/// could not be offered validly (docs/results.md, 2026-11-26). One per 4 gives 4 of 16 — the
/// 12 + 4 split issue 30's run chose by hand. A run that needs more still fails its
/// `client_cpu` check and stops with the fix (`--loadgen-cpus`).
pub const HOST_CPUS_PER_LOADGEN_CPU: usize = 4;
/// The most CPUs the default layout gives the load generator.
pub const MAX_LOADGEN_CPUS: usize = 8;

impl Placement {
    /// The CPUs the bench places BE workloads on.
    pub fn be_cpus(&self) -> &[usize] {
        if self.be.is_empty() {
            &self.server
        } else {
            &self.be
        }
    }

    /// The load generator's threads: one per CPU of its own.
    pub fn loadgen_threads(&self) -> usize {
        self.loadgen.len().max(1)
    }

    /// How many of `cpus` the default layout gives the load generator: one per
    /// [`HOST_CPUS_PER_LOADGEN_CPU`], at least 1, at most [`MAX_LOADGEN_CPUS`].
    pub fn loadgen_cpus_for(cpus: usize) -> usize {
        (cpus / HOST_CPUS_PER_LOADGEN_CPU).clamp(1, MAX_LOADGEN_CPUS)
    }

    /// The default layout of an N-CPU host: the first CPUs for the load generator (CPU 0 on up
    /// to 15 CPUs), the rest for the LC and BE; everything on CPU 0 on a 1-CPU box.
    pub fn default_for(cpus: usize) -> Placement {
        if cpus >= 2 {
            let k = Self::loadgen_cpus_for(cpus).min(cpus - 1);
            Placement {
                loadgen: (0..k).collect(),
                server: (k..cpus).collect(),
                be: Vec::new(),
            }
        } else {
            Placement {
                loadgen: vec![0],
                server: vec![0],
                be: Vec::new(),
            }
        }
    }

    /// The layout with `--loadgen-cpus` / `--server-cpus` applied: a side given alone gets the
    /// other side's CPUs as the rest of the host's (`--server-cpus 0-11` on 16 CPUs leaves
    /// 12-15 to the load generator), or the default's where nothing is left.
    pub fn with_overrides(
        cpus: usize,
        loadgen: Option<Vec<usize>>,
        server: Option<Vec<usize>>,
    ) -> Placement {
        let default = Placement::default_for(cpus);
        let rest = |taken: &[usize]| -> Vec<usize> {
            (0..cpus.max(1)).filter(|c| !taken.contains(c)).collect()
        };
        let (loadgen, server) = match (loadgen, server) {
            (Some(l), Some(s)) => (l, s),
            (Some(l), None) => {
                let s = rest(&l);
                (l, if s.is_empty() { default.server } else { s })
            }
            (None, Some(s)) => {
                let l = rest(&s);
                let l = if l.is_empty() {
                    default.loadgen
                } else {
                    l.into_iter().take(MAX_LOADGEN_CPUS).collect()
                };
                (l, s)
            }
            (None, None) => (default.loadgen, default.server),
        };
        Placement {
            loadgen,
            server,
            be: Vec::new(),
        }
    }

    /// One line for the operator: which CPUs run what.
    pub fn describe(&self) -> String {
        let shared = self.loadgen.iter().any(|c| self.server.contains(c));
        let be = if self.be.is_empty() {
            "BE on the LC's CPUs (the agent gives it those the LC can spare)".to_string()
        } else {
            format!("BE on CPU {}", cpu_list(&self.be))
        };
        format!(
            "load generator ({} thread{}) + agent on CPU {}, LC ({} thread{}) on CPU {}, {be}{}",
            self.loadgen_threads(),
            if self.loadgen_threads() == 1 { "" } else { "s" },
            cpu_list(&self.loadgen),
            self.server.len().max(1),
            if self.server.len() == 1 { "" } else { "s" },
            cpu_list(&self.server),
            if shared {
                "; the load generator SHARES CPUs with the LC: its send lag shows what that costs"
            } else {
                ""
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Placement;

    #[test]
    fn the_load_generator_gets_its_own_cpus_on_any_host() {
        let p = Placement::default_for(2);
        assert_eq!((p.loadgen, p.server), (vec![0], vec![1]));
        let p = Placement::default_for(4);
        assert_eq!((p.loadgen, p.server), (vec![0], vec![1, 2, 3]));
        let p = Placement::default_for(8);
        assert_eq!((p.loadgen, p.server), (vec![0, 1], (2..8).collect()));
        let p = Placement::default_for(16);
        assert_eq!(p.loadgen, vec![0, 1, 2, 3]);
        assert_eq!(p.server, (4..16).collect::<Vec<_>>());
        assert_eq!(p.loadgen_threads(), 4);
        let p = Placement::default_for(64);
        assert_eq!(p.loadgen, (0..8).collect::<Vec<_>>());
        assert_eq!(p.server, (8..64).collect::<Vec<_>>());
        let p = Placement::default_for(1);
        assert_eq!((p.loadgen, p.server), (vec![0], vec![0]));
        for n in [2, 4, 16, 64, 256] {
            let p = Placement::default_for(n);
            assert_eq!(
                p.loadgen.len() + p.server.len(),
                n,
                "{n} CPUs: every CPU used once"
            );
            assert!(p.loadgen.iter().all(|c| !p.server.contains(c)), "{n}");
            assert!(p.describe().contains("LC ("), "{}", p.describe());
        }
    }

    #[test]
    fn one_side_given_leaves_the_rest_to_the_other() {
        let p = Placement::with_overrides(16, None, Some((0..12).collect()));
        assert_eq!(p.loadgen, vec![12, 13, 14, 15]);
        let p = Placement::with_overrides(16, Some(vec![15]), None);
        assert_eq!(p.server, (0..15).collect::<Vec<_>>());
        let p = Placement::with_overrides(2, None, Some(vec![0, 1]));
        assert_eq!(p.loadgen, vec![0], "nothing left: the default's");
        assert!(p.describe().contains("SHARES"), "{}", p.describe());
        let p = Placement::with_overrides(64, None, None);
        assert_eq!(p, Placement::default_for(64));
    }
}
