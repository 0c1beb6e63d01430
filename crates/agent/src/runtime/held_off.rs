//! "No silent zero": when BE is off because no trustworthy LC latency is at hand, say why —
//! in `ctl status` and as `headroom_be_held_off_reason{reason}`. Pure: the caller passes what
//! the latency source said and the ages.

use std::time::Duration;

use crate::sensors::lc_signal::Refusal;

/// Every reason label the metric carries.
pub const REASONS: [&str; 7] = [
    "send_lag",
    "too_few_samples",
    "source_error",
    "no_window",
    "kube_not_synced",
    "kube_no_lc",
    "kube_no_latency_port",
];

/// What the latency source said (a snapshot of its cell).
#[derive(Debug, Clone, Default)]
pub struct SourceSays {
    /// The last window's refusal.
    pub refusal: Option<(Refusal, String)>,
    pub last_error: Option<String>,
    /// The prober's send lag p99, µs.
    pub send_lag_us: Option<f64>,
    /// The source is the prober (a kernel-side sensor is the remedy for a late one).
    pub is_probe: bool,
}

/// Why BE is held off, as `(metric label, ctl status line)`; `None` while BE may run or the
/// latency is fresh (BE off for a measured reason, a violation, is the policy's, not this).
/// `unseen_for`: time since the last accepted window (since start when none was).
pub fn held_off(
    be_enabled: bool,
    latency_fresh: bool,
    unseen_for: Duration,
    says: &SourceSays,
) -> Option<(&'static str, String)> {
    if be_enabled || latency_fresh {
        return None;
    }
    let (label, why) = match (&says.refusal, &says.last_error) {
        (Some((Refusal::SendLag, _)), _) => {
            let late = says
                .send_lag_us
                .map_or_else(String::new, |l| format!(" {l:.0} µs"));
            let hint = if says.is_probe {
                "; try source = \"kernel\""
            } else {
                ""
            };
            (
                "send_lag",
                format!("the prober's sends are{late} late{hint}"),
            )
        }
        (Some((Refusal::TooFewSamples, m)), _) => ("too_few_samples", m.clone()),
        (None, Some(e)) => ("source_error", e.clone()),
        (None, None) => ("no_window", "no window has completed yet".to_string()),
    };
    Some((
        label,
        format!(
            "BE held off: no accepted latency window for {} s: {why}",
            unseen_for.as_secs()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_prober_is_named_with_its_lateness_and_the_remedy() {
        let says = SourceSays {
            refusal: Some((Refusal::SendLag, "window refused".into())),
            send_lag_us: Some(200.0),
            is_probe: true,
            ..SourceSays::default()
        };
        let (label, line) = held_off(false, false, Duration::from_secs(34), &says).unwrap();
        assert_eq!(label, "send_lag");
        assert_eq!(
            line,
            "BE held off: no accepted latency window for 34 s: the prober's sends are 200 µs late; try source = \"kernel\""
        );
        assert!(REASONS.contains(&label));
    }

    #[test]
    fn nothing_is_said_while_be_runs_or_the_latency_is_fresh() {
        let says = SourceSays::default();
        assert!(held_off(true, false, Duration::from_secs(9), &says).is_none());
        assert!(held_off(false, true, Duration::from_secs(9), &says).is_none());
        let (label, _) = held_off(false, false, Duration::from_secs(9), &says).unwrap();
        assert_eq!(label, "no_window");
    }
}
