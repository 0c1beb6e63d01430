// The tests read the shipped files and time nothing the crate does: the purity rule
// (crates/control/clippy.toml) is for the crate itself.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]
//! Paths the agent makes or opens (the state file, sockets, the decision log, feeds): refused
//! when relative, aliasing each other, or too long for a Unix socket.

use crate::config_support;

use config_support::{refuse, refused_with, GOOD};
use headroom_control::config::Config;

/// The second hostile pass: the socket and the state file (or the decision log) spelled
/// differently but naming one file (`./`, `//`, `a/../`) passed, and the first state write
/// replaced the control socket (the kill switch unreachable, nothing said). The same for the
/// socket on the state file's lock or temporary file.
#[test]
fn paths_that_alias_each_other_are_refused() {
    let cases = [
        ("/tmp/hr/state.json", "/tmp/hr/./state.json", "api.socket"),
        ("/tmp/hr/state.json", "/tmp//hr/state.json", "api.socket"),
        (
            "/tmp/hr/state.json",
            "/tmp/x/../hr/state.json",
            "api.socket",
        ),
        (
            "/tmp/hr/state.json",
            "/tmp/hr/state.json.lock",
            "api.socket",
        ),
        ("/tmp/hr/state.json", "/tmp/hr/state.json.tmp", "api.socket"),
    ];
    for (state, socket, key) in cases {
        refused_with(
            "kind = \"heracles\"",
            &format!(
                "kind = \"heracles\"\n[safety]\nstate_file = \"{state}\"\n[api]\nsocket = \"{socket}\""
            ),
            key,
        );
    }
    refused_with(
        "kind = \"heracles\"",
        "kind = \"heracles\"\n[api]\nsocket = \"/tmp/hr/ctl.sock\"\ndecision_log = \"/tmp/hr/./ctl.sock\"",
        "api.decision_log",
    );
}

/// A control socket path longer than a Unix socket can hold passed the checks and failed at
/// start, in bind(2) (fifth hostile pass).
#[test]
fn a_socket_path_too_long_for_a_unix_socket_is_refused() {
    let long = format!("/run/{}/headroom.sock", "d".repeat(100));
    let msg = refuse(&format!("{GOOD}[api]\nsocket = \"{long}\"\n"));
    assert!(msg.contains("api.socket"), "{msg}");
    assert!(msg.contains("at most 107"), "{msg}");
    let fits = format!("/run/{}/h.sock", "d".repeat(90));
    Config::from_toml_str(&format!("{GOOD}[api]\nsocket = \"{fits}\"\n")).expect("fits");
}

/// A whole section of the wrong type (`be = 5`) is set aside and the rest read: the problems
/// its stand-in causes are dropped, but they were matched as words, so every message saying
/// "must be" went too and `lc.slo.target_us = -5` was never named (fifth hostile pass).
#[test]
fn a_section_set_aside_hides_no_other_error() {
    let text =
        GOOD.replacen(
            "[[be]]\nname = \"batch\"\ncgroup = \"headroom/be\"\n",
            "",
            1,
        )
        .replacen(
            "[lc]",
            "be = 5\n[safety]\nviolation_cooldown_s = -1\n[lc]",
            1,
        ) + "[lc.slo]\ntarget_us = -5\n";
    let msg = refuse(&text);
    for key in ["be = 5", "lc.slo.target_us", "safety.violation_cooldown_s"] {
        assert!(msg.contains(key), "{key} not named:\n{msg}");
    }
}

/// Seventh hostile pass: `safety.state_file = "state.json"` was accepted and resolved against
/// the working directory; a restart from another one (a unit file's `/` after an operator's
/// shell) found no state, a first start that took the confined settings as originals.
#[test]
fn a_relative_state_file_is_refused() {
    for rel in ["state.json", "./state.json", "../lib/headroom/state.json"] {
        let to = format!("kind = \"heracles\"\n[safety]\nstate_file = \"{rel}\"");
        let msg = refused_with("kind = \"heracles\"", &to, "safety.state_file");
        assert!(msg.contains("absolute"), "{msg}");
    }
}

/// Eighth hostile pass (a seventh-pass low): `api.socket`, `api.decision_log` and the feed
/// sockets were accepted relative and resolved against the agent's working directory, so
/// `ctl`, a log reader or `headroom load --feed` started elsewhere looked in another place.
#[test]
fn relative_socket_log_and_feed_paths_are_refused() {
    for rel in ["ctl.sock", "./run/ctl.sock", "../ctl.sock"] {
        let to = format!("kind = \"heracles\"\n[api]\nsocket = \"{rel}\"");
        let msg = refused_with("kind = \"heracles\"", &to, "api.socket");
        assert!(msg.contains("give an absolute path"), "{msg}");
    }
    for rel in ["decisions.jsonl", "./log/d.jsonl"] {
        let to = format!("kind = \"heracles\"\n[api]\ndecision_log = \"{rel}\"");
        let msg = refused_with("kind = \"heracles\"", &to, "api.decision_log");
        assert!(msg.contains("give an absolute path"), "{msg}");
    }
    let to = "kind = \"heracles\"\n[api]\ndecision_log = \"\"";
    let msg = refused_with("kind = \"heracles\"", to, "api.decision_log");
    assert!(msg.contains("must not be empty"), "{msg}");
    let feed = GOOD
        .replace(
            "source = \"probe\"\naddress = \"127.0.0.1:11211\"",
            "source = \"feed\"\nsocket = \"feed.sock\"",
        )
        .replace(
            "source = \"memcache-stats\"\naddress = \"127.0.0.1:11211\"",
            "source = \"feed\"\nsocket = \"load.sock\"",
        );
    assert!(feed.contains("feed.sock") && feed.contains("load.sock"));
    let msg = refuse(&feed);
    for key in [
        "lc.latency.socket",
        "lc.load.socket",
        "give an absolute path",
    ] {
        assert!(msg.contains(key), "{key} not named:\n{msg}");
    }
    // Absolute ones pass.
    let ok = GOOD.replace(
        "kind = \"heracles\"",
        "kind = \"heracles\"\n[api]\nsocket = \"/run/x/ctl.sock\"\ndecision_log = \"/var/log/d.jsonl\"",
    );
    Config::from_toml_str(&ok).expect("absolute paths are accepted");
}

/// Eighth hostile pass: a feed socket (`lc.latency.socket`) on the control socket's path was
/// accepted; the feed's bind replaced the control socket, so `ctl off` reached the feed.
#[test]
fn a_feed_socket_on_the_control_socket_or_state_file_is_refused() {
    let base = GOOD.replace(
        "source = \"probe\"\naddress = \"127.0.0.1:11211\"",
        "source = \"feed\"\nsocket = \"/run/headroom/x.sock\"",
    );
    assert!(base.contains("/run/headroom/x.sock"));
    Config::from_toml_str(&base).expect("the base feed config is good");
    for (api, feed) in [
        ("socket = \"/run/headroom/x.sock\"", "/run/headroom/x.sock"),
        (
            "socket = \"/run/headroom//./ctl.sock\"",
            "/run/headroom/ctl.sock",
        ),
    ] {
        let text = base.replace("/run/headroom/x.sock", feed).replace(
            "kind = \"heracles\"",
            &format!("kind = \"heracles\"\n[api]\n{api}"),
        );
        let msg = refuse(&text);
        assert!(msg.contains("lc.latency.socket"), "{msg}");
    }
    let text = base.replace("/run/headroom/x.sock", "/var/lib/headroom/state.json.tmp");
    let msg = refuse(&text);
    assert!(msg.contains("lc.latency.socket"), "{msg}");
}

/// Eighth hostile pass (host, low): a feed socket longer than a Unix socket path holds passed
/// validation and failed at start in bind(2); it is refused as `api.socket` is.
#[test]
fn a_feed_socket_too_long_for_a_unix_path_is_refused() {
    let long = format!("/run/headroom/{}.sock", "f".repeat(100));
    let text = GOOD.replace(
        "source = \"probe\"\naddress = \"127.0.0.1:11211\"",
        &format!("source = \"feed\"\nsocket = \"{long}\""),
    );
    assert!(text.contains(&long));
    let msg = refuse(&text);
    assert!(msg.contains("lc.latency.socket"), "{msg}");
    assert!(msg.contains("holds at most 107"), "{msg}");
    let ok = format!("/run/headroom/{}.sock", "f".repeat(107 - 19));
    assert_eq!(ok.len(), 107);
    Config::from_toml_str(&text.replace(&long, &ok)).expect("107 bytes fit");
}
