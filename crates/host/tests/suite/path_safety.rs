//! Group paths with `..`, absolute escapes or empty components are refused at construction,
//! so no write can ever leave the configured cgroup roots.

use headroom_host::resctrl::ResctrlGroup;
use headroom_types::GroupPath;

#[test]
fn escaping_paths_are_refused_naming_the_input() {
    for bad in [
        "",
        "/etc",
        "/sys/fs/cgroup/cpu/x",
        "..",
        "../x",
        "a/../../b",
        "a/./b",
        "a//b",
        "./a",
        "a\nb",
        "a\0b",
    ] {
        let err = GroupPath::new(bad).unwrap_err().to_string();
        assert!(err.contains("cgroup path"), "{bad:?}: {err}");
        assert!(
            err.contains(&format!("{bad:?}")),
            "{bad:?} not named in {err}"
        );
    }
}

#[test]
fn valid_paths_keep_their_shape() {
    let g = GroupPath::new("headroom/be/").unwrap();
    assert_eq!(g.as_str(), "headroom/be");
    assert_eq!(g.parent().unwrap().as_str(), "headroom");
    assert!(g.parent().unwrap().parent().unwrap().is_root());
    assert_eq!(g.lineage().len(), 2);
    assert_eq!(g.join("x").unwrap().as_str(), "headroom/be/x");
    assert!(g.join("..").is_err());
    assert!(g.join("a/b").is_err());
    assert_eq!(
        g.dir_in(std::path::Path::new("/m")),
        std::path::Path::new("/m/headroom/be")
    );
    assert_eq!("a.b-c_d".parse::<GroupPath>().unwrap().as_str(), "a.b-c_d");
}

#[test]
fn resctrl_group_names_are_single_components() {
    for bad in ["", "a/b", "..", ".", "info", "mon_data"] {
        assert!(ResctrlGroup::new(bad).is_err(), "{bad:?}");
    }
    assert_eq!(ResctrlGroup::new("be").unwrap().as_str(), "be");
}

#[test]
fn invalid_device_names_are_refused_before_running_tc() {
    let tc = headroom_host::tc::RecordingTc::new();
    assert!(headroom_host::tc::Egress::new(tc, "../eth0").is_err());
}
