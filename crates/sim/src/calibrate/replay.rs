//! A bench point replayed on the model: the server's CPUs, where the BE ran, how the LC and BE
//! were weighted, at the point's achieved rate. The fits compare the model's tail here with the
//! point's measured tail, so a fitted parameter means in `sim` what it meant in the bench.

use headroom_types::allocation::{Allocation, CpuWeight};
use headroom_types::CpuSet;

use crate::host::SimHost;
use crate::model::{BeKind, ServerModel};

/// How the LC and the BE sharing its CPUs were weighted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Weighting {
    /// Kernel defaults (`cpu.shares` 1024 each): the scheduling bench's `equal`.
    Equal,
    /// `lc` and `be` shares (the bench's `weights-10000:2`).
    Shares { lc: u64, be: u64 },
    /// BE in the `cpu.idle` class (`be-cpu.idle`).
    Idle,
}

impl Weighting {
    /// The order the fits take the series in (and what makes two points the same series):
    /// equal first, since the low-weight delay is interpolated towards the fair one.
    pub fn rank(self) -> u8 {
        match self {
            Weighting::Equal => 0,
            Weighting::Shares { .. } => 1,
            Weighting::Idle => 2,
        }
    }

    /// The scheduling bench's series name (`equal`, `weights-10000:2 (spin)`, `be-cpu.idle`).
    pub fn from_series(series: &str) -> Option<Weighting> {
        let name = series.split_whitespace().next().unwrap_or(series);
        if name == "equal" {
            return Some(Weighting::Equal);
        }
        if name.contains("cpu.idle") {
            return Some(Weighting::Idle);
        }
        let (lc, be) = name.strip_prefix("weights-")?.split_once(':')?;
        Some(Weighting::Shares {
            lc: lc.parse().ok()?,
            be: be.parse().ok()?,
        })
    }
}

/// Where a bench point's processes ran, as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// CPUs of the replayed server: the bench's server CPUs, plus the BE's where they differ.
    pub cores: u32,
    /// The LC's CPUs among them (the bench pins it to its server CPUs).
    pub lc: CpuSet,
    /// The BE's CPUs among them.
    pub be: CpuSet,
}

impl Placement {
    /// From the bench manifest's CPU lists (`be_cpus` empty: BE on the server CPUs).
    pub fn from_bench(server_cpus: &[usize], be_cpus: &[usize]) -> Placement {
        let server: Vec<usize> = if server_cpus.is_empty() {
            vec![0]
        } else {
            server_cpus.to_vec()
        };
        let extra: Vec<usize> = be_cpus
            .iter()
            .copied()
            .filter(|c| !server.contains(c))
            .collect();
        let lc: CpuSet = (0..server.len() as u32).collect();
        let be: CpuSet = if be_cpus.is_empty() {
            lc.clone()
        } else {
            let mut all = server.clone();
            all.extend(&extra);
            be_cpus
                .iter()
                .filter_map(|c| all.iter().position(|x| x == c))
                .map(|i| i as u32)
                .collect()
        };
        Placement {
            cores: (server.len() + extra.len()) as u32,
            lc,
            be,
        }
    }
}

/// The model's `q`-quantile (µs) of the LC at `qps` with BE kind `be` (`None`: LC alone)
/// placed and weighted as given.
pub fn predicted_tail(
    model: &ServerModel,
    placement: &Placement,
    be: Option<&BeKind>,
    weighting: Weighting,
    qps: f64,
    q: f64,
) -> f64 {
    let kind = be.cloned().unwrap_or_default();
    let mut host = SimHost::new(model, placement.cores, &kind, 1.0);
    let mut a = Allocation {
        be_enabled: be.is_some(),
        be_cpus: Some(placement.be.clone()),
        ..Allocation::default()
    };
    a.lc.pin_cpus = Some(placement.lc.clone());
    match weighting {
        Weighting::Equal => {}
        Weighting::Shares { lc, be } => {
            a.lc.cpu_weight = Some(CpuWeight {
                shares: lc,
                weight: CpuWeight::DEFAULT.weight,
            });
            a.be_cpu_weight = Some(CpuWeight {
                shares: be,
                weight: CpuWeight::DEFAULT.weight,
            });
        }
        Weighting::Idle => a.be_cpu_idle = Some(true),
    }
    host.apply(&a);
    host.evaluate(qps).tail.quantile(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_names_give_the_weighting() {
        assert_eq!(Weighting::from_series("equal"), Some(Weighting::Equal));
        assert_eq!(
            Weighting::from_series("weights-10000:2 (spin)"),
            Some(Weighting::Shares { lc: 10000, be: 2 })
        );
        assert_eq!(Weighting::from_series("be-cpu.idle"), Some(Weighting::Idle));
        assert_eq!(Weighting::from_series("be-nice-19"), None);
    }

    #[test]
    fn placement_follows_the_bench_cpu_lists() {
        let shared = Placement::from_bench(&[1], &[]);
        assert_eq!(
            (shared.cores, shared.lc.to_vec(), shared.be.to_vec()),
            (1, vec![0], vec![0])
        );
        let apart = Placement::from_bench(&[1, 2], &[3]);
        assert_eq!(
            (apart.cores, apart.lc.to_vec(), apart.be.to_vec()),
            (3, vec![0, 1], vec![2])
        );
    }

    #[test]
    fn be_on_the_lc_cpu_costs_the_lc_more_under_equal_weights_than_when_idle() {
        let m = ServerModel::default();
        let p = Placement::from_bench(&[1], &[]);
        let spin = m.be.get("spin").cloned();
        let q = 0.99;
        let alone = predicted_tail(&m, &p, None, Weighting::Equal, 5000.0, q);
        let equal = predicted_tail(&m, &p, spin.as_ref(), Weighting::Equal, 5000.0, q);
        let idle = predicted_tail(&m, &p, spin.as_ref(), Weighting::Idle, 5000.0, q);
        assert!(alone < idle && idle < equal, "{alone} {idle} {equal}");
    }
}
