//! A gone knob's reconciliation error named its path three times ("reading X: X: reading X:
//! ENOENT", hostile pass 13, "Found, not fixed"): each layer added the path the one below had
//! said. Now named once, whatever layer says it; a reason that does not name it keeps it.

use headroom_control::actuation::ActuationError;
use headroom_control::node::NodeError;

const KNOB: &str = "/sys/fs/cgroup/cpu/l14/be/cpu.shares";

#[test]
fn a_gone_knobs_read_error_names_its_path_once() {
    // What the host layer says of the failed read (its HostError::Io text), as the agent's
    // node passes it on with the knob's description.
    let host = format!("reading {KNOB}: ENOENT (No such file or directory)");
    let node = NodeError {
        what: KNOB.into(),
        reason: host.clone(),
        not_found: true,
    };
    assert_eq!(node.to_string(), host);
    let read = ActuationError::Read {
        what: KNOB.into(),
        source: node,
    };
    let text = read.to_string();
    assert_eq!(text.matches(KNOB).count(), 1, "{text}");
    assert_eq!(text, host);

    // A reason that does not name the knob keeps the name in front, once.
    let node = NodeError::new(KNOB, "not driven on this host");
    assert_eq!(node.to_string(), format!("{KNOB}: not driven on this host"));
    let text = ActuationError::Read {
        what: KNOB.into(),
        source: node,
    }
    .to_string();
    assert_eq!(text, format!("reading {KNOB}: not driven on this host"));
}
