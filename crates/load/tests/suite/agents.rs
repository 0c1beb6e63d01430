//! Distributed mode over loopback: a master with two agents merges their histograms; a version
//! mismatch is refused by both sides with a clear error.

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use headroom_load::agent::{serve, AgentMessage, AGENT_PROTOCOL_VERSION};
use headroom_load::{run_report, LoadError, LoadOptions};
use support::{Behaviour, TestServer};

/// An agent serving `sessions` masters on a loopback port, in a thread.
fn start_agent(sessions: usize) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let h = std::thread::spawn(move || serve(listener, Some(sessions)).unwrap());
    (port, h)
}

#[test]
fn master_with_two_agents_merges_histograms() {
    let server = TestServer::start(Behaviour::Prompt);
    let (p1, a1) = start_agent(1);
    let (p2, a2) = start_agent(1);
    let o = LoadOptions {
        servers: vec![server.spec()],
        qps: 1500,
        time_s: 1.0,
        noload: true,
        agents: vec![format!("127.0.0.1:{p1}"), format!("127.0.0.1:{p2}")],
        seed: Some(3),
        drain_ms: 500,
        ..LoadOptions::default()
    };
    let r = run_report(&o, &mut |_| {}).expect("distributed run");
    a1.join().unwrap();
    a2.join().unwrap();
    assert_eq!(r.clients, 3);
    assert_eq!(r.result.target_qps, 1500.0);
    let n = r.result.read.count as f64;
    // Three clients at 500/s each for 1 s: one merged histogram of ~1500 requests.
    assert!((1300.0..1700.0).contains(&n), "merged count {n}");
    assert_eq!(r.result.errors, 0);
}

#[test]
fn master_with_measurement_connections_leaves_the_load_to_agents() {
    let server = TestServer::start(Behaviour::Prompt);
    let (p1, a1) = start_agent(1);
    let o = LoadOptions {
        servers: vec![server.spec()],
        qps: 1200,
        time_s: 1.0,
        noload: true,
        agents: vec![format!("127.0.0.1:{p1}")],
        measure_connections: Some(1),
        measure_qps: Some(200),
        drain_ms: 500,
        ..LoadOptions::default()
    };
    let r = run_report(&o, &mut |_| {}).expect("distributed run");
    a1.join().unwrap();
    assert!(r.measurement_connections);
    let reported = r.result.read.count as f64;
    assert!((150.0..250.0).contains(&reported), "measured {reported}");
    assert!(r.completed > 1000, "completed {}", r.completed);
}

#[test]
fn agent_refuses_a_master_of_another_version() {
    let (port, agent) = start_agent(1);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let hello = serde_json::to_string(&AgentMessage::Hello {
        version: AGENT_PROTOCOL_VERSION + 1,
        lambda_mul: 1,
    })
    .unwrap();
    s.write_all(format!("{hello}\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    agent.join().unwrap();
    match serde_json::from_str::<AgentMessage>(&line).unwrap() {
        AgentMessage::Error { message } => {
            assert!(message.contains("version mismatch"), "{message}");
            assert!(message.contains(&(AGENT_PROTOCOL_VERSION + 1).to_string()));
        }
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn master_refuses_an_agent_of_another_version() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut line = String::new();
        BufReader::new(s.try_clone().unwrap())
            .read_line(&mut line)
            .unwrap();
        s.write_all(b"{\"type\":\"hello\",\"version\":99}\n")
            .unwrap();
        // The master says why it hangs up.
        let mut reply = String::new();
        let _ = BufReader::new(s).read_line(&mut reply);
        reply
    });
    let server = TestServer::start(Behaviour::Prompt);
    let o = LoadOptions {
        servers: vec![server.spec()],
        qps: 100,
        time_s: 0.5,
        noload: true,
        agents: vec![format!("127.0.0.1:{port}")],
        ..LoadOptions::default()
    };
    let err = run_report(&o, &mut |_| {}).unwrap_err();
    assert!(matches!(err, LoadError::Agent { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("version mismatch") && msg.contains("99"),
        "{msg}"
    );
    let reply = fake.join().unwrap();
    assert!(reply.contains("version mismatch"), "{reply}");
}
