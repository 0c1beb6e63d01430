//! `[lc]`'s checks: every value of one LC service refused with its key, value and reason.

use crate::config::api::MAX_SOCKET_PATH;
use crate::config::checks::*;
use crate::config::lc::*;
use crate::config::{invalid, relative_path, Problems};

impl LcConfig {
    /// Refuses bad values under `key` (`lc`, or `lc[1]` among several): each error names the
    /// key, the value and the reason.
    pub(crate) fn validate_as(&self, key: &str, p: &mut Problems) {
        let mut mine = Problems::default();
        self.validate(&mut mine);
        for e in mine.0 {
            p.push(e.rekeyed("lc", key));
        }
    }

    /// The checks, keyed `lc.*` as in the single-table form.
    fn validate(&self, p: &mut Problems) {
        if self.name.trim().is_empty() {
            p.push(invalid("lc.name", &self.name, "must not be empty"));
        }
        if !self.pids.is_empty() && !self.command.is_empty() {
            p.push(invalid(
                "lc.command",
                &self.command,
                "give either lc.pids or lc.command, not both",
            ));
        }
        if self.pids.contains(&0) {
            p.push(invalid("lc.pids", &self.pids, "pid 0 is not a process"));
        }
        if let Some(f) = &self.pid_file {
            if !f.starts_with('/') {
                p.push(invalid(
                    "lc.pid_file",
                    f,
                    "must be an absolute path (the file the LC's service manager writes its pid to)",
                ));
            }
        }
        if self.listen_port == Some(0) {
            p.push(invalid("lc.listen_port", 0, "port 0 is not a port"));
        }
        let slo = &self.slo;
        if !(slo.percentile > 0.0 && slo.percentile < 100.0) {
            p.push(invalid(
                "lc.slo.percentile",
                slo.percentile,
                "must be in (0, 100)",
            ));
        }
        p.check(positive("lc.slo.target_us", slo.target_us));
        p.check(window("lc.slo.window_s", slo.window_s));
        if slo.window_s > MAX_WINDOW_S {
            p.push(invalid(
                "lc.slo.window_s",
                slo.window_s,
                format!("above {MAX_WINDOW_S} s: a latency that old cannot steer BE (Heracles uses 15 s)"),
            ));
        }
        if slo.min_samples == Some(0) {
            p.push(invalid("lc.slo.min_samples", 0, "must be at least 1"));
        }
        // The feed sockets the agent binds: `headroom load --feed` started elsewhere must find them.
        let feed_sockets = [
            (
                "lc.latency.socket",
                self.latency.as_ref().and_then(|l| l.socket.as_deref()),
            ),
            (
                "lc.load.socket",
                self.load.as_ref().and_then(|l| l.socket.as_deref()),
            ),
        ];
        for (key, socket) in feed_sockets {
            if let Some(s) = socket.filter(|s| !s.starts_with('/')) {
                p.push(relative_path(key, s, "`headroom load --feed`"));
            }
            // bind(2) refused it at start, after the config had passed (eighth hostile pass)
            if let Some(s) = socket.filter(|s| s.len() > MAX_SOCKET_PATH) {
                p.push(invalid(
                    key,
                    s,
                    format!(
                        "{} bytes: a Unix socket path holds at most {MAX_SOCKET_PATH}; give a shorter one",
                        s.len()
                    ),
                ));
            }
        }
        if let Some(lat) = &self.latency {
            match lat.source {
                LatencySource::Probe => p.check(require_address(
                    "lc.latency.address",
                    lat.address.as_deref(),
                )),
                LatencySource::Prometheus => {
                    p.check(require_some(
                        "lc.latency.url",
                        lat.url.as_deref(),
                        "source = \"prometheus\"",
                    ));
                    p.check(require_some(
                        "lc.latency.metric",
                        lat.metric.as_deref(),
                        "source = \"prometheus\"",
                    ));
                }
                LatencySource::Feed => {}
                LatencySource::Kernel => {
                    let ports = lat.kernel_ports();
                    if ports.is_empty() {
                        p.push(invalid(
                            "lc.latency.port",
                            lat.port,
                            "source = \"kernel\" needs the LC's TCP port (port = N or ports = [...])",
                        ));
                    } else if ports.contains(&0) {
                        p.push(invalid("lc.latency.ports", &ports, "port 0 is not a port"));
                    } else if ports.len() > headroom_types::resources::MAX_LATENCY_PORTS {
                        p.push(invalid(
                            "lc.latency.ports",
                            ports.len(),
                            format!(
                                "at most {} ports",
                                headroom_types::resources::MAX_LATENCY_PORTS
                            ),
                        ));
                    }
                    if lat.address.is_some() {
                        p.check(require_address(
                            "lc.latency.address",
                            lat.address.as_deref(),
                        ));
                    }
                }
            }
            if lat.source != LatencySource::Kernel {
                if lat.fallback.is_some() {
                    p.push(invalid(
                        "lc.latency.fallback",
                        "probe",
                        "only source = \"kernel\" has a fallback",
                    ));
                }
                if lat.port.is_some() || lat.ports.is_some() {
                    p.push(invalid(
                        "lc.latency.port",
                        lat.kernel_ports(),
                        "port/ports are the kernel sensor's (source = \"kernel\")",
                    ));
                }
            }
            p.check(positive("lc.latency.rate_hz", lat.rate_hz));
            if let Some(b) = lat.max_send_lag_us {
                p.check(positive("lc.latency.max_send_lag_us", b));
            }
            // The prober is load on the LC: bounded absolutely and, where the LC's peak is
            // known, to a small fraction of it (a 1e9 Hz prober pushed p99 from 200 µs to 4 ms).
            // Checked only against valid inputs: a bad peak or SLO is named once, as itself.
            let peak_ok = self
                .load
                .as_ref()
                .is_none_or(|l| l.peak_qps.is_finite() && l.peak_qps > 0.0);
            let slo_ok = slo.percentile > 0.0
                && slo.percentile < 100.0
                && slo.window_s.is_finite()
                && slo.window_s >= MIN_INTERVAL_S
                && slo.min_samples != Some(0);
            // The prober runs as the source or as the kernel sensor's fallback.
            let probes = lat.source == LatencySource::Probe || lat.fallback.is_some();
            if probes && peak_ok {
                let cap = self.load.as_ref().map_or(MAX_PROBE_HZ, |l| {
                    (l.peak_qps * MAX_PROBE_SHARE).min(MAX_PROBE_HZ)
                });
                if lat.rate_hz > cap {
                    p.push(invalid(
                        "lc.latency.rate_hz",
                        lat.rate_hz,
                        format!(
                            "above {cap:.0} Hz: the prober may add at most {:.0}% of lc.load.peak_qps and {MAX_PROBE_HZ:.0} Hz of load to the LC",
                            MAX_PROBE_SHARE * 100.0
                        ),
                    ));
                }
            }
            // A prober that cannot fill its window never yields a latency, and the agent would
            // run blind until the stale rule disables BE: refuse it at start instead. Probes can
            // only go missing at run time (a loaded host sends fewer than asked), so the count
            // must clear the minimum with a margin.
            let probes_per_window = lat.rate_hz * slo.window_s;
            let needed = headroom_types::resources::with_margin(slo.min_samples());
            if probes && slo_ok && probes_per_window < needed as f64 {
                p.push(invalid(
                    "lc.latency.rate_hz",
                    lat.rate_hz,
                    format!(
                        "{probes_per_window:.0} probes per {} s window (lc.slo.window_s) are fewer than {needed}: the {} the p{} needs (lc.slo.min_samples) with a {}x margin, since a loaded host sends fewer probes than asked; raise the rate to at least {:.0} Hz or the window",
                        slo.window_s,
                        slo.min_samples(),
                        slo.percentile,
                        headroom_types::resources::COUNT_MARGIN,
                        (needed as f64 / slo.window_s).ceil(),
                    ),
                ));
            }
        }
        if let Some(load) = &self.load {
            p.check(positive("lc.load.peak_qps", load.peak_qps));
            match load.source {
                LoadSource::MemcacheStats | LoadSource::RedisInfo => {
                    p.check(require_address("lc.load.address", load.address.as_deref()))
                }
                LoadSource::Prometheus => {
                    p.check(require_some(
                        "lc.load.url",
                        load.url.as_deref(),
                        "source = \"prometheus\"",
                    ));
                    p.check(require_some(
                        "lc.load.metric",
                        load.metric.as_deref(),
                        "source = \"prometheus\"",
                    ));
                }
                LoadSource::Feed => {}
            }
        }
        let threads = &self.threads;
        if let Some(prio) = threads.fifo_priority {
            if !(1..=99).contains(&prio) {
                p.push(invalid(
                    "lc.threads.fifo_priority",
                    prio,
                    "must be in 1..=99",
                ));
            }
            if threads.slice_us.is_some() {
                p.push(invalid(
                    "lc.threads.slice_us",
                    threads.slice_us,
                    "a slice request has no effect under SCHED_FIFO; give one of the two",
                ));
            }
        }
        if let Some(s) = threads.slice_us {
            if !(100..=100_000).contains(&s) {
                p.push(invalid(
                    "lc.threads.slice_us",
                    s,
                    "EEVDF accepts 100..=100000 µs",
                ));
            }
        }
    }
}
