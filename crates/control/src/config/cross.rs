//! Checks across sections: values each fine alone that pass the start and then fail or
//! misbehave together (issue 42).

use crate::config::{invalid, Config, Problems};

/// Knob files a cgroup directory holds: a group path ending in one is a file, not a group.
const KNOB_PREFIXES: &[&str] = &[
    "cgroup.",
    "cpuset.",
    "cpu.",
    "cpuacct.",
    "memory.",
    "freezer.",
    "blkio.",
    "io.",
    "pids.",
    "net_cls.",
    "net_prio.",
    "hugetlb.",
    "perf_event.",
    "rdma.",
    "misc.",
];
const KNOB_NAMES: &[&str] = &["tasks", "notify_on_release", "release_agent"];

/// The name of a knob file, when a component of `group` is one (the last, or one above it:
/// `a/cpu.shares/be` cannot be made where `a/cpu.shares` is a file — found at start, after
/// the groups above it were made, in the fourth hostile pass).
fn knob_file(group: &str) -> Option<&str> {
    group.trim_end_matches('/').split('/').find(|part| {
        KNOB_NAMES.contains(part)
            || KNOB_PREFIXES
                .iter()
                .any(|p| part.starts_with(p) && part.len() > p.len())
    })
}

impl Config {
    pub(crate) fn validate_across(&self, p: &mut Problems) {
        let api = &self.api;
        // Compared spelled out (`./`, `//`, `a/../`): one file by two spellings is one file.
        // The state file's lock and temporary file are the state file's too.
        let state = lexical(&self.safety.state_file);
        let state_files = [
            state.clone(),
            format!("{state}.lock"),
            format!("{state}.tmp"),
        ];
        let socket = lexical(&api.socket);
        if state_files.contains(&socket) {
            p.push(invalid(
                "api.socket",
                &api.socket,
                "is also safety.state_file (or its .lock/.tmp): the first state write would replace the socket; give them different paths",
            ));
        }
        let log = api.decision_log.as_deref().map(lexical);
        if log
            .as_ref()
            .is_some_and(|l| *l == socket || state_files.contains(l))
        {
            p.push(invalid(
                "api.decision_log",
                &api.decision_log,
                "is also the control socket or the state file: give it a path of its own",
            ));
        }
        // A feed socket is bound where its path names, replacing a stale socket there: on the
        // control socket it took `ctl off` away (eighth hostile pass).
        for (i, lc) in self.lcs.iter().enumerate() {
            let key = self.lc_key(i);
            let latency = lc.latency.as_ref().and_then(|l| l.socket.as_deref());
            let load = lc.load.as_ref().and_then(|l| l.socket.as_deref());
            for (what, feed) in [("latency", latency), ("load", load)] {
                let Some(feed) = feed else { continue };
                let f = lexical(feed);
                if f == socket || state_files.contains(&f) || log.as_ref() == Some(&f) {
                    p.push(invalid(
                        &format!("{key}.{what}.socket"),
                        feed,
                        "is also api.socket, the state file or the decision log: the feed's socket would replace it; give it a path of its own",
                    ));
                }
            }
        }
        // The prober or a load source on the agent's own metrics endpoint measures the agent.
        if let Some(metrics) = api.metrics.as_deref() {
            for (i, lc) in self.lcs.iter().enumerate() {
                let key = self.lc_key(i);
                let latency = lc.latency.as_ref().and_then(|l| l.address.as_deref());
                let load = lc.load.as_ref().and_then(|l| l.address.as_deref());
                for (what, addr) in [("latency", latency), ("load", load)] {
                    if addr.is_some_and(|a| same_endpoint(a, metrics)) {
                        p.push(invalid(
                            "api.metrics",
                            metrics,
                            format!("is {key}.{what}.address: the agent would measure its own metrics endpoint; move one of them"),
                        ));
                    }
                }
            }
        }
        let groups = self
            .lcs
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("{}.cgroup", self.lc_key(i)), l.cgroup.to_string()))
            .chain(
                self.be
                    .iter()
                    .enumerate()
                    .map(|(i, b)| (format!("be[{i}].cgroup"), b.cgroup.to_string())),
            );
        for (key, group) in groups {
            if let Some(file) = knob_file(&group) {
                p.push(invalid(
                    &key,
                    &group,
                    format!("names {file:?}, a cgroup knob file, not a group: name the group's directory (e.g. \"headroom/be\")"),
                ));
            }
        }
        let commands = self
            .lcs
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("{}.command", self.lc_key(i)), &l.command))
            .chain(
                self.be
                    .iter()
                    .enumerate()
                    .map(|(i, b)| (format!("be[{i}].command"), &b.command)),
            );
        for (key, command) in commands {
            if command.first().is_some_and(|c| c.trim().is_empty()) {
                p.push(invalid(
                    &key,
                    command,
                    "the program (its first word) is empty: name it, or leave the command out",
                ));
            } else if command.iter().any(|a| a.contains('\0')) {
                // No argv can carry it: the launch failed at start, after BE was confined.
                p.push(invalid(
                    &key,
                    command,
                    "an argument holds a NUL byte, which no program can be given",
                ));
            }
        }
    }
}

/// A path spelled out lexically: `.` and empty components dropped, `a/..` folded (no file is
/// read: the control crate does no I/O).
fn lexical(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            ".." if path.starts_with('/') => {}
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    if path.starts_with('/') {
        format!("/{joined}")
    } else {
        joined
    }
}

/// Whether two `host:port` texts name the same endpoint (an unspecified host matches any).
fn same_endpoint(a: &str, b: &str) -> bool {
    let split = |s: &str| {
        s.rsplit_once(':')
            .map(|(h, p)| (h.trim_matches(['[', ']']).to_string(), p.to_string()))
    };
    match (split(a), split(b)) {
        (Some((ha, pa)), Some((hb, pb))) => {
            let any = |h: &str| h == "0.0.0.0" || h == "::" || h.is_empty();
            let local = |h: &str| h == "localhost" || h == "127.0.0.1" || h == "::1";
            pa == pb && (ha == hb || any(&ha) || any(&hb) || (local(&ha) && local(&hb)))
        }
        _ => false,
    }
}

/// `policy.kind = "multi"`: every service needs its latency and its load (each bounds BE), and
/// pinned services may not share CPUs (a CPU moves from one owner to another).
pub(crate) fn validate_services(config: &Config, p: &mut Problems) {
    for (i, lc) in config.lcs.iter().enumerate() {
        let key = config.lc_key(i);
        if crate::config::kubernetes::is_holder(lc) {
            continue;
        }
        if lc.latency.is_none() {
            p.push(invalid(
                &format!("{key}.latency"),
                &lc.name,
                "policy.kind = \"multi\" needs every service's [lc.latency]: each service's slack bounds BE",
            ));
        }
        if lc.load.is_none() {
            p.push(invalid(
                &format!("{key}.load"),
                &lc.name,
                "policy.kind = \"multi\" needs every service's [lc.load] (with peak_qps)",
            ));
        }
        if !lc.threads.pin || lc.threads.cpus.is_empty() {
            continue;
        }
        for (j, other) in config.lcs.iter().enumerate().take(i) {
            if !other.threads.pin {
                continue;
            }
            let shared: Vec<u32> = lc
                .threads
                .cpus
                .iter()
                .filter(|c| other.threads.cpus.contains(*c))
                .collect();
            if !shared.is_empty() {
                p.push(invalid(
                    &format!("{key}.threads.cpus"),
                    lc.threads.cpus.to_string(),
                    format!(
                        "shares CPUs {shared:?} with {}.threads.cpus ({:?}): policy.kind = \"multi\" moves CPUs between services, each CPU needs one owner",
                        config.lc_key(j),
                        other.name
                    ),
                ));
            }
        }
    }
}
