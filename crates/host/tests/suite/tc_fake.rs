//! The HTB command sequence, run-time ceil changes, JSON counters and failures, against a
//! recording `tc` double.

use headroom_host::tc::{net_cls_classid, parse_class_stats, Egress, HtbConfig, RecordingTc};

#[test]
fn setup_installs_root_qdisc_lc_default_class_and_be_class() {
    let egress = Egress::new(RecordingTc::new(), "eth0").unwrap();
    let config = HtbConfig::new(10_000_000_000, 100_000_000);
    egress.setup(&config).unwrap();
    assert_eq!(
        egress.runner().calls(),
        vec![
            "qdisc replace dev eth0 root handle 1: htb default 10",
            "class replace dev eth0 parent 1: classid 1:1 htb rate 10000000000bit ceil 10000000000bit",
            "class replace dev eth0 parent 1:1 classid 1:10 htb rate 10000000000bit ceil 10000000000bit",
            "class replace dev eth0 parent 1:1 classid 1:20 htb rate 100000000bit ceil 100000000bit",
        ]
    );
    egress.set_be_ceil(&config, 50_000_000).unwrap();
    egress.add_net_cls_filter().unwrap();
    egress.teardown().unwrap();
    let calls = egress.runner().calls();
    assert_eq!(
        calls[4],
        "class change dev eth0 parent 1:1 classid 1:20 htb rate 50000000bit ceil 50000000bit"
    );
    assert_eq!(
        calls[5],
        "filter replace dev eth0 parent 1: protocol all prio 10 handle 1: cgroup"
    );
    assert_eq!(calls[6], "qdisc del dev eth0 root");
    assert_eq!(config.be_classid(), 0x0001_0020);
    assert_eq!(config.lc_classid(), net_cls_classid(1, 0x10));
}

#[test]
fn class_counters_are_parsed_from_tc_json() {
    let egress = Egress::new(RecordingTc::new(), "eth0").unwrap();
    egress.runner().set_show_reply(
        r#"[{"class":"htb","handle":"1:1","root":true,"rate":1250000000,"ceil":1250000000,
             "stats":{"bytes":5000,"packets":5,"drops":0,"overlimits":0,"requeues":0}},
            {"class":"htb","handle":"1:20","parent":"1:1","leaf":"8001:",
             "stats":{"bytes":123456,"packets":99,"drops":7,"overlimits":12,"requeues":0,"backlog":0,"qlen":0}}]"#,
    );
    let stats = egress.class_stats().unwrap();
    assert_eq!(stats.len(), 2);
    assert_eq!(
        (
            stats[1].handle.as_str(),
            stats[1].bytes,
            stats[1].packets,
            stats[1].drops
        ),
        ("1:20", 123_456, 99, 7)
    );
    assert_eq!(egress.runner().calls(), vec!["-s -j class show dev eth0"]);
    let err = parse_class_stats("not json").unwrap_err().to_string();
    assert!(err.contains("not json"), "{err}");
}

#[test]
fn flat_json_and_iproute2_6_1_text_output_are_parsed_too() {
    let flat =
        parse_class_stats(r#"[{"class":"htb","handle":"1:20","bytes":42,"packets":2,"drops":1}]"#)
            .unwrap();
    assert_eq!((flat[0].bytes, flat[0].packets, flat[0].drops), (42, 2, 1));
    let text = "class htb 1:10 parent 1:1 prio 0 rate 10Gbit ceil 10Gbit burst 0b cburst 0b \n \
                Sent 301902648 bytes 199437 pkt (dropped 3, overlimits 4533 requeues 0) \n \
                backlog 1836482b 27p requeues 0\n lended: 4547 borrowed: 0 giants: 0\n\n\
                class htb 1:20 parent 1:1 prio 0 rate 1Mbit ceil 20Mbit burst 1600b cburst 1600b \n \
                Sent 5000 bytes 4 pkt (dropped 0, overlimits 0 requeues 0) \n";
    let stats = parse_class_stats(text).unwrap();
    assert_eq!(stats.len(), 2);
    assert_eq!(
        (
            stats[0].handle.as_str(),
            stats[0].bytes,
            stats[0].packets,
            stats[0].drops
        ),
        ("1:10", 301_902_648, 199_437, 3)
    );
    assert_eq!((stats[1].handle.as_str(), stats[1].bytes), ("1:20", 5000));
}

#[test]
fn a_failing_tc_command_is_reported_with_the_command_line() {
    let egress = Egress::new(RecordingTc::new(), "eth0").unwrap();
    egress
        .runner()
        .fail_when("change", "RTNETLINK answers: No such file or directory");
    let config = HtbConfig::new(1_000_000_000, 1_000_000);
    let err = egress
        .set_be_ceil(&config, 2_000_000)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("class change dev eth0")
            && err.contains("2000000bit")
            && err.contains("No such file"),
        "{err}"
    );
    assert!(egress.set_be_ceil(&config, 0).is_err());
    assert!(egress.setup(&HtbConfig::new(0, 1)).is_err());
}
