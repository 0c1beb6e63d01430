//! What the config refusal tests share: a good config to break, and the refusal to expect.
#![allow(dead_code)] // each test file uses its own part

use headroom_control::config::Config;

pub const GOOD: &str = r#"
[lc]
name = "memcached"
cgroup = "headroom/lc"
[lc.latency]
source = "probe"
address = "127.0.0.1:11211"
[lc.load]
source = "memcache-stats"
address = "127.0.0.1:11211"
peak_qps = 100000
[[be]]
name = "batch"
cgroup = "headroom/be"
[policy]
kind = "heracles"
"#;

pub fn refuse(text: &str) -> String {
    match Config::from_toml_str(text) {
        Ok(c) => panic!("accepted a bad config: {c:?}\n{text}"),
        Err(e) => e.to_string(),
    }
}

/// Replaces `from` in the good config (which must contain it) and expects a refusal naming `key`.
pub fn refused_with(from: &str, to: &str, key: &str) -> String {
    assert!(GOOD.contains(from), "{from:?} not in the base config");
    let msg = refuse(&GOOD.replacen(from, to, 1));
    assert!(msg.contains(key), "error does not name {key:?}: {msg}");
    msg
}
