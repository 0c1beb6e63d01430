//! `-c auto`'s pool: the load connections to each server that may take a send whose own
//! connection is at its depth cap, found in O(1) per send and per reply however many the run
//! grew to (a scan of every connection per send made a run that grew to hundreds of
//! connections spend its CPU scanning, fall behind, and grow more).

use std::net::SocketAddr;

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
