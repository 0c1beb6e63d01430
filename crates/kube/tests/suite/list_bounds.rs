//! Discovery's list answers are bounded (issue 42, item 6): an endless chunked pod list is cut
//! at the byte cap with an error naming it (before, `kube-discover` grew to 3.1 GB in 8 s), and
//! a server that never answers is cut at the list deadline, naming it. Hostile stand-in servers
//! on 127.0.0.1; each sends at most a bounded amount for a bounded time.

use crate::list;

use std::io::BufReader;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use headroom_hostile_server::{chunk, hold, read_request, serve, start_chunked, Server};
use headroom_kube::watch::ApiBounds;

/// How a hostile server answers a request.
#[derive(Clone, Copy)]
enum Hostile {
    /// A chunked `PodList` whose items never end (until `limit` bytes, then it closes).
    Endless { limit: usize },
    /// Reads the request and never answers (until the test ends, at most 30 s).
    Hangs,
}

fn serve_how(how: Hostile) -> Server {
    serve(16, (), move |conn, stop, _| answer(conn, how, stop))
}

fn answer(conn: TcpStream, how: Hostile, stop: &AtomicBool) {
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let _ = read_request(&mut r);
    let mut w = conn;
    match how {
        Hostile::Hangs => hold(stop, Duration::from_secs(30)),
        Hostile::Endless { limit } => {
            let _ = start_chunked(&mut w);
            let head = r#"{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"1"},"items":["#;
            let pod = r#"{"metadata":{"namespace":"shop","name":"p","uid":"u","resourceVersion":"1"},"spec":{"nodeName":"node-a","containers":[{"name":"c","image":"x"}]},"status":{"phase":"Running"}},"#;
            let mut sent = 0;
            let mut data = String::from(head);
            while sent < limit && !stop.load(Ordering::SeqCst) {
                while data.len() < 64 * 1024 {
                    data.push_str(pod);
                }
                if chunk(&mut w, &data).is_err() {
                    return; // the client cut it
                }
                sent += data.len();
                data.clear();
            }
        }
    }
}

fn bounds() -> ApiBounds {
    ApiBounds {
        max_list_bytes: 1 << 20,
        list_deadline: Duration::from_secs(3),
        warn_after: Duration::from_secs(1),
        // the byte cap is what these tests cut at (small pods would pass the items cap first)
        max_list_items: u64::MAX,
        ..ApiBounds::default()
    }
}

#[test]
fn an_endless_pod_list_is_cut_at_the_cap_naming_it() {
    // 8 times the cap, then the server closes (before, the client read it all and failed
    // on the truncated JSON, or, from a server that never closed, grew without end)
    let server = serve_how(Hostile::Endless { limit: 8 << 20 });
    let (got, took) = list::once_with(server.port, bounds(), Duration::from_secs(20));
    let err = got.expect_err("an endless list is an error");
    assert!(
        err.contains(&format!("cap of {} bytes", 1 << 20)),
        "the error names the cap: {err}"
    );
    assert!(took < Duration::from_secs(15), "cut in {took:?}");
}

#[test]
fn a_list_the_server_never_answers_is_cut_at_the_deadline_naming_it() {
    let server = serve_how(Hostile::Hangs);
    let (got, took) = list::once_with(server.port, bounds(), Duration::from_secs(20));
    let err = got.expect_err("no answer is an error");
    assert!(
        err.contains("3 s deadline"),
        "the error names the deadline: {err}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(15),
        "cut at the deadline, after {took:?}"
    );
}
