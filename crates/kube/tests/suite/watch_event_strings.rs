//! A watch event's JSON strings were not capped as a list answer's are
//! (`ApiBounds::max_list_strings`): one 16 MiB line of `"k":"v",` (4 Mi strings) parsed to
//! ~250 MB. Now one event holds at most `ApiBounds::max_watch_event_strings` (512 Ki, more than
//! any pod etcd stores); a normal event before it still comes through. A hostile server on
//! 127.0.0.1 sends two lines and closes.

use std::io::BufReader;
use std::net::TcpStream;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use futures::StreamExt;
use headroom_hostile_server::{
    answer_json, chunk, error_chain, kubeconfig, read_request, serve, start_chunked, EMPTY_POD_LIST,
};
use headroom_kube::watch::{client_bounded, ApiBounds};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, WatchEvent, WatchParams};

/// One ADDED event of a pod named `name` with `annotations` `"k<i>":""` pairs, as one line.
fn event(name: &str, annotations: usize) -> String {
    let mut ann = String::with_capacity(annotations * 12);
    for i in 0..annotations {
        if i > 0 {
            ann.push(',');
        }
        ann.push_str(&format!("\"{i:x}\":\"\""));
    }
    format!(
        "{{\"type\":\"ADDED\",\"object\":{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"d\",\"uid\":\"u-{name}\",\"resourceVersion\":\"5\",\"annotations\":{{{ann}}}}}}}}}\n"
    )
}

#[test]
fn a_watch_event_of_too_many_strings_is_cut_naming_the_cap() {
    let cap = ApiBounds::default().max_watch_event_strings;
    // Twice the cap in pairs (each pair two strings): ~4.6 MB, under the 16 MiB line cap.
    let huge = event("deep", cap as usize);
    let small = event("ok", 3);
    let server = serve(8, (), move |conn: TcpStream, _: &AtomicBool, _| {
        let mut r = BufReader::new(conn.try_clone().unwrap());
        let mut w = conn;
        while let Some(req) = read_request(&mut r) {
            if !req.line.contains("watch=true") {
                if answer_json(&mut w, "200 OK", EMPTY_POD_LIST).is_err() {
                    return;
                }
                continue;
            }
            if start_chunked(&mut w).is_err() {
                return;
            }
            let _ = chunk(&mut w, &small);
            for part in huge.as_bytes().chunks(64 << 10) {
                if chunk(&mut w, std::str::from_utf8(part).unwrap()).is_err() {
                    return; // the client cut it
                }
            }
            let _ = std::io::Write::write_all(&mut w, b"0\r\n\r\n");
            return;
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path(), server.port);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let got: Vec<Result<String, String>> = rt.block_on(async {
        let client = client_bounded(Some(&config), ApiBounds::default())
            .await
            .map_err(|e| e.to_string())
            .unwrap();
        let api: Api<Pod> = Api::all(client);
        let mut stream = api
            .watch(&WatchParams::default(), "0")
            .await
            .map_err(|e| error_chain(&e))
            .unwrap()
            .boxed();
        let mut out = Vec::new();
        // bounded: two events and the end; a hang guard far past reading 5 MB on loopback
        for _ in 0..3 {
            match tokio::time::timeout(Duration::from_secs(30), stream.next()).await {
                Ok(Some(Ok(WatchEvent::Added(p)))) => {
                    out.push(Ok(p.metadata.name.unwrap_or_default()))
                }
                Ok(Some(Ok(other))) => out.push(Ok(format!("{other:?}"))),
                Ok(Some(Err(e))) => out.push(Err(error_chain(&e))),
                Ok(None) => break,
                Err(_) => {
                    out.push(Err("no end within 30 s".into()));
                    break;
                }
            }
        }
        out
    });
    assert!(
        got.first()
            .is_some_and(|r| r.as_ref().is_ok_and(|e| e.contains("ok"))),
        "the small event first: {got:?}"
    );
    let err = got
        .iter()
        .find_map(|r| r.as_ref().err())
        .unwrap_or_else(|| panic!("an event of {} strings came whole: {got:?}", 2 * cap));
    assert!(
        err.contains(&format!("cap of {cap} JSON strings")),
        "the error names the cap: {err}"
    );
}
