//! Worker threads and connection dispatch over epoll.
//!
//! A *lane* is one epoll set plus the connections registered in it.
//! - `static`: one lane per worker; an acceptor thread hands each new connection to the next lane
//!   round-robin (memcached's dispatcher). Level-triggered; re-armed only when interest changes.
//! - `shared`: one lane for all workers, listener included; every fd is armed `EPOLLONESHOT`, so
//!   an event goes to exactly one waiting thread, which re-arms the fd when done with it. Each
//!   wait takes a single event, so a busy thread never hoards ready connections that an idle
//!   thread could serve.

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::topology::{allowed_cpus, pin_current_thread};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use super::conn::{Conn, Drive, Interest};
use super::stats::Counters;
use super::{Ctx, Dispatch, ServeConfig, ServeError, Shared};

const LISTENER: u64 = u64::MAX;

/// How often blocked threads look at the stop flag.
const WAIT_MS: u16 = 100;

struct Lane {
    epoll: Epoll,
    oneshot: bool,
    conns: RwLock<HashMap<u64, Arc<Mutex<Conn>>>>,
}

impl Lane {
    fn new(oneshot: bool) -> Result<Self, ServeError> {
        let epoll =
            Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|source| ServeError::Sys {
                what: "epoll_create1".into(),
                source,
            })?;
        Ok(Lane {
            epoll,
            oneshot,
            conns: RwLock::new(HashMap::new()),
        })
    }

    fn flags(&self, interest: Interest) -> EpollFlags {
        let mut f = match interest {
            Interest::Read => EpollFlags::EPOLLIN,
            Interest::ReadWrite => EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT,
            Interest::Write => EpollFlags::EPOLLOUT,
        };
        f |= EpollFlags::EPOLLRDHUP;
        if self.oneshot {
            f |= EpollFlags::EPOLLONESHOT;
        }
        f
    }

    fn get(&self, token: u64) -> Option<Arc<Mutex<Conn>>> {
        self.conns
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&token)
            .cloned()
    }

    fn insert(&self, token: u64, stream: TcpStream) -> Result<(), nix::Error> {
        let conn = Arc::new(Mutex::new(Conn::new(stream)));
        let guard = conn.lock().unwrap_or_else(|p| p.into_inner());
        // Insert before arming so the thread that receives the first event finds it.
        self.conns
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token, Arc::clone(&conn));
        let ev = EpollEvent::new(self.flags(Interest::Read), token);
        let r = self.epoll.add(guard.stream.as_fd(), ev);
        drop(guard);
        if r.is_err() {
            self.remove(token);
        }
        r
    }

    fn remove(&self, token: u64) {
        self.conns
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&token);
    }
}

struct Acceptor {
    listener: TcpListener,
    next_token: AtomicU64,
    next_lane: AtomicU64,
}

impl Acceptor {
    /// Accepts every pending connection and places each in a lane.
    fn accept_all(&self, lanes: &[Arc<Lane>], shared: &Shared) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    let c = &shared.counters;
                    if c.curr_connections.load(Ordering::Relaxed) as usize
                        >= shared.config.max_connections
                    {
                        Counters::bump(&c.rejected_connections);
                        tracing::warn!(%peer, "connection limit reached; closing new connection");
                        continue;
                    }
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let token = self.next_token.fetch_add(1, Ordering::Relaxed);
                    let lane = &lanes
                        [(self.next_lane.fetch_add(1, Ordering::Relaxed) as usize) % lanes.len()];
                    match lane.insert(token, stream) {
                        Ok(()) => {
                            Counters::bump(&c.curr_connections);
                            Counters::bump(&c.total_connections);
                        }
                        Err(e) => {
                            tracing::warn!(%peer, error = %e, "registering connection with epoll")
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning on a ready listener.
                    tracing::warn!(error = %e, "accept failed");
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
            }
        }
    }
}

/// Spawns the worker threads (and, for static dispatch, the acceptor).
pub(crate) fn spawn(
    listener: TcpListener,
    config: &ServeConfig,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
) -> Result<Vec<JoinHandle<()>>, ServeError> {
    let cpus = if config.pin {
        allowed_cpus()?
    } else {
        Vec::new()
    };
    let acceptor = Arc::new(Acceptor {
        listener,
        next_token: AtomicU64::new(0),
        next_lane: AtomicU64::new(0),
    });
    let lanes: Vec<Arc<Lane>> = match config.dispatch {
        Dispatch::Static => (0..config.threads)
            .map(|_| Lane::new(false).map(Arc::new))
            .collect::<Result<_, _>>()?,
        Dispatch::Shared => {
            let lane = Lane::new(true)?;
            lane.epoll
                .add(
                    acceptor.listener.as_fd(),
                    EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT, LISTENER),
                )
                .map_err(|source| ServeError::Sys {
                    what: "adding the listener to the shared epoll set".into(),
                    source,
                })?;
            vec![Arc::new(lane)]
        }
    };
    let mut handles = Vec::new();
    let spawn_err = |source: std::io::Error| ServeError::Io {
        what: "spawning a server thread".into(),
        source,
    };
    for i in 0..config.threads {
        let lane = Arc::clone(&lanes[i % lanes.len()]);
        let shared = Arc::clone(&shared);
        let thread_stop = Arc::clone(&stop);
        let acceptor = Arc::clone(&acceptor);
        let pin = (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::Builder::new()
            .name(format!("serve-w{i}"))
            .spawn(move || {
                let pinned = pin
                    .map(pin_current_thread)
                    .unwrap_or(Ok(()))
                    .map_err(ServeError::from);
                let failed = pinned.is_err();
                let _ = tx.send(pinned);
                if !failed {
                    worker(&lane, &acceptor, &shared, &thread_stop);
                }
            })
            .map_err(spawn_err)?;
        handles.push(h);
        if let Ok(Err(e)) = rx.recv() {
            stop.store(true, Ordering::SeqCst);
            for h in handles {
                let _ = h.join();
            }
            return Err(e);
        }
    }
    if config.dispatch == Dispatch::Static {
        let shared = Arc::clone(&shared);
        let stop = Arc::clone(&stop);
        let lanes = lanes.clone();
        let accept_epoll =
            Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|source| ServeError::Sys {
                what: "epoll_create1 for the acceptor".into(),
                source,
            })?;
        accept_epoll
            .add(
                acceptor.listener.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, LISTENER),
            )
            .map_err(|source| ServeError::Sys {
                what: "adding the listener to the acceptor's epoll set".into(),
                source,
            })?;
        let h = std::thread::Builder::new()
            .name("serve-accept".into())
            .spawn(move || {
                let mut events = [EpollEvent::empty(); 4];
                while !stop.load(Ordering::Relaxed) {
                    match accept_epoll.wait(&mut events, EpollTimeout::from(WAIT_MS)) {
                        Ok(n) if n > 0 => acceptor.accept_all(&lanes, &shared),
                        _ => {}
                    }
                }
            })
            .map_err(spawn_err)?;
        handles.push(h);
    }
    Ok(handles)
}

fn worker(lane: &Arc<Lane>, acceptor: &Acceptor, shared: &Shared, stop: &AtomicBool) {
    let mut rng = rand::rng();
    let mut ctx = Ctx {
        shared,
        rng: &mut rng,
    };
    // Shared dispatch takes one event per wait (see the module comment).
    let mut events = vec![EpollEvent::empty(); if lane.oneshot { 1 } else { 64 }];
    let lanes = std::slice::from_ref(lane);
    while !stop.load(Ordering::Relaxed) {
        let n = match lane.epoll.wait(&mut events, EpollTimeout::from(WAIT_MS)) {
            Ok(n) => n,
            Err(nix::Error::EINTR) => continue,
            Err(e) => {
                tracing::error!(error = %e, "epoll_wait failed; worker exits");
                return;
            }
        };
        for ev in &events[..n] {
            let token = ev.data();
            if token == LISTENER {
                acceptor.accept_all(lanes, shared);
                let mut rearm =
                    EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT, LISTENER);
                if let Err(e) = lane.epoll.modify(acceptor.listener.as_fd(), &mut rearm) {
                    tracing::error!(error = %e, "re-arming the listener");
                }
                continue;
            }
            let Some(conn) = lane.get(token) else {
                continue;
            };
            let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
            match c.drive(&mut ctx) {
                Drive::Close => {
                    let _ = lane.epoll.delete(c.stream.as_fd());
                    drop(c);
                    lane.remove(token);
                    shared
                        .counters
                        .curr_connections
                        .fetch_sub(1, Ordering::Relaxed);
                }
                Drive::Keep(interest) => {
                    if lane.oneshot || interest != c.registered {
                        let mut ev = EpollEvent::new(lane.flags(interest), token);
                        if lane.epoll.modify(c.stream.as_fd(), &mut ev).is_ok() {
                            c.registered = interest;
                        }
                    }
                }
            }
        }
    }
}
