//! `-c auto`'s pool: the load connections to each server that may take a send whose own
//! connection is at its depth cap — the scheduled ones, the reserve opened before the run and
//! those grown during it — found in O(1) per send and per reply however many there are (a scan of
//! every connection per send made a run that grew to hundreds of connections spend its CPU
//! scanning, fall behind, and grow more).

use std::net::SocketAddr;

use super::{connect, connect_within, Conn, ConnPlan, Worker};
use crate::clock::now_ns;
use crate::error::LoadError;

/// One server's load connections: how many, and those that may have room (checked when taken).
#[derive(Debug)]
struct ServerPool {
    addr: SocketAddr,
    count: usize,
    may_have_room: Vec<usize>,
}

#[derive(Debug, Default)]
pub(super) struct ConnPool {
    servers: Vec<ServerPool>,
}

impl ConnPool {
    /// The pool index of `addr`'s connections, added on first use.
    pub(super) fn server(&mut self, addr: SocketAddr) -> usize {
        if let Some(s) = self.servers.iter().position(|p| p.addr == addr) {
            return s;
        }
        self.servers.push(ServerPool {
            addr,
            count: 0,
            may_have_room: Vec::new(),
        });
        self.servers.len() - 1
    }

    /// Counts one more load connection to server `s`.
    pub(super) fn add(&mut self, s: usize) {
        self.servers[s].count += 1;
    }

    /// Load connections to server `s` (the growth cap applies to this).
    pub(super) fn count(&self, s: usize) -> usize {
        self.servers[s].count
    }

    /// Lists connection `conn` of server `s` as one that may have room; the caller lists a
    /// connection once until it is taken.
    pub(super) fn offer(&mut self, s: usize, conn: usize) {
        self.servers[s].may_have_room.push(conn);
    }

    /// The most recently listed connection of server `s`, unlisted; the caller checks its room.
    pub(super) fn take(&mut self, s: usize) -> Option<usize> {
        self.servers[s].may_have_room.pop()
    }
}

impl Worker<'_> {
    /// Lists the load connections in their servers' pools and opens each server's reserve.
    pub(super) fn open_pool(&mut self) -> Result<(), LoadError> {
        let mut templates: Vec<(usize, ConnPlan)> = Vec::new();
        for i in 0..self.conns.len() {
            if !self.conns[i].plan.measure {
                let s = self.pool.server(self.conns[i].plan.addr);
                self.pool.add(s);
                self.conns[i].pool_server = Some(s);
                self.offer(i);
                if !templates.iter().any(|(t, _)| *t == s) {
                    templates.push((s, self.conns[i].plan.clone()));
                }
            }
        }
        for (s, template) in templates {
            for _ in 0..self.shared.reserve {
                let stream = connect(template.addr, self.shared.nodelay)?;
                let plan = ConnPlan {
                    rate: 0.0,
                    ia: None,
                    ..template.clone()
                };
                self.conns.push(Conn::new(plan, stream, 0, true));
                let j = self.conns.len() - 1;
                self.pool.add(s);
                self.conns[j].pool_server = Some(s);
                self.offer(j);
            }
        }
        Ok(())
    }

    /// `-c auto`: another connection to connection `i`'s server with room under its depth cap,
    /// or a new one (counted) while the worker has fewer than `grow_cap` to that server. None
    /// when every one is full and growth is at its cap (`count_refusal`: counted once per send).
    pub(super) fn pool_slot(&mut self, i: usize, count_refusal: bool) -> Option<usize> {
        let s = self.conns[i].pool_server?;
        while let Some(j) = self.pool.take(s) {
            let c = &mut self.conns[j];
            c.pooled = false;
            if j != i && c.stream.is_some() && c.inflight.len() < c.plan.depth {
                if c.inflight.len() + 1 < c.plan.depth {
                    // Room left after this send: still a candidate.
                    self.offer(j);
                }
                return Some(j);
            }
        }
        let now = now_ns();
        if self.pool.count(s) >= self.shared.grow_cap || now < self.grow_paused_until {
            if count_refusal {
                self.out.counters.growth_refused += 1;
            }
            return None;
        }
        let addr = self.conns[i].plan.addr;
        let timeout = self.shared.grow_connect_timeout;
        let stream = match connect_within(addr, self.shared.nodelay, timeout) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("growing the connections: {e}");
                self.grow_paused_until = now_ns() + crate::sizing::GROW_PAUSE.as_nanos() as u64;
                if count_refusal {
                    self.out.counters.growth_refused += 1;
                }
                return None;
            }
        };
        let plan = ConnPlan {
            rate: 0.0,
            ia: None,
            ..self.conns[i].plan.clone()
        };
        self.conns.push(Conn::new(plan, stream, 0, true));
        let j = self.conns.len() - 1;
        if self.attach(j).is_err() {
            self.conns[j].stream = None;
            return None;
        }
        self.out.counters.grown += 1;
        self.pool.add(s);
        self.conns[j].pool_server = Some(s);
        if self.conns[j].plan.depth > 1 {
            self.offer(j);
        }
        Some(j)
    }

    /// Lists connection `i` in its server's pool if it is pooled, open, not listed and has room.
    pub(super) fn offer(&mut self, i: usize) {
        let c = &mut self.conns[i];
        let Some(s) = c.pool_server else {
            return;
        };
        if !c.pooled && c.stream.is_some() && c.inflight.len() < c.plan.depth {
            c.pooled = true;
            self.pool.offer(s, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_kept_apart_and_taken_last_listed_first() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let mut p = ConnPool::default();
        let (sa, sb) = (p.server(a), p.server(b));
        assert_ne!(sa, sb);
        assert_eq!(p.server(a), sa);
        p.add(sa);
        p.add(sa);
        p.add(sb);
        assert_eq!((p.count(sa), p.count(sb)), (2, 1));
        p.offer(sa, 0);
        p.offer(sa, 1);
        p.offer(sb, 2);
        assert_eq!(p.take(sa), Some(1));
        assert_eq!(p.take(sa), Some(0));
        assert_eq!(p.take(sa), None);
        assert_eq!(p.take(sb), Some(2));
    }
}
