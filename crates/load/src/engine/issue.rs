//! Issuing a worker's requests: every due send of a connection under its depth cap (`pump`),
//! a broken connection's lost requests and back-off (`fault`), and its re-opening.

use super::*;

impl Worker<'_> {
    pub(super) fn reconnect_due(&mut self, now: u64) {
        for i in 0..self.scheduled {
            if self.conns[i].stream.is_some() || now < self.conns[i].reconnect_at {
                continue;
            }
            if self.conns[i].done_sending {
                continue;
            }
            let addr = self.conns[i].plan.addr;
            match connect(addr, self.shared.nodelay) {
                Ok(s) => {
                    self.conns[i].stream = Some(s);
                    self.conns[i].arm_stamps();
                    self.conns[i].room = Room::opened(now_ns());
                    if self.attach(i).is_ok() {
                        self.out.counters.reconnects += 1;
                        self.offer(i);
                    } else {
                        self.conns[i].stream = None;
                        self.conns[i].back_off(now);
                    }
                }
                Err(e) => {
                    tracing::debug!("reconnecting: {e}");
                    self.conns[i].back_off(now);
                }
            }
        }
    }

    /// Issues every request of connection `i` that is due and fits under its depth cap.
    pub(super) fn pump(&mut self, i: usize, now: u64) {
        let sh = self.shared;
        let mut issued = false;
        {
            let c = &mut self.conns[i];
            if c.done_sending {
                return;
            }
        }
        let mut now = now;
        let mut first = true;
        // When the send before this one in this pass could go, where it waited for room: a
        // request due meanwhile waited behind it, the server's wait too (hostile pass 32: a
        // burst of replies after a server's pause freed several slots at once, and every send
        // but the first was charged the whole pause as the client's own lateness).
        let mut waited_until: Option<u64> = None;
        // The send lag of the request whose reply made that room (the client's share).
        let mut waited_room_client = 0;
        loop {
            if !first {
                // Each send is stamped when it is made, not when the pass began: a second send in
                // one pass is later than the first (its lag and its gap say so), and one that fell
                // due meanwhile goes now.
                now = now_ns();
            }
            first = false;
            let c = &mut self.conns[i];
            let sched = if c.plan.ia.is_some() {
                c.next_sched
            } else {
                now
            };
            if sched >= sh.end || now >= sh.end {
                c.done_sending = true;
                break;
            }
            if sched > now {
                break;
            }
            let own_room = c.stream.is_some() && c.inflight.len() < c.plan.depth;
            let target = if own_room {
                Some(i)
            } else if sh.grow && c.plan.ia.is_some() && !c.plan.measure {
                let first_try = !c.late_marked;
                self.pool_slot(i, first_try)
            } else {
                None
            };
            let Some(t) = target else {
                let c = &mut self.conns[i];
                if c.plan.ia.is_some() && !c.late_marked {
                    c.late_marked = true;
                    if sched >= sh.warm_end {
                        self.out.counters.late += 1;
                    }
                }
                break;
            };
            if sh.moderate && now < self.conns[i].last_rx + MODERATE_NS {
                break;
            }
            // A send that fell due while its connection sat at its depth cap, and was never
            // marked late because the thread slept on the full connection until a reply made
            // room: it waited for that room all the same (its lateness was charged to the
            // client, and to every send that waited behind its reply).
            let c = &mut self.conns[i];
            let waited_unseen = c.room.full_at(sched);
            if t == i && !c.late_marked && c.plan.ia.is_some() && waited_unseen {
                c.late_marked = true;
                if sched >= sh.warm_end {
                    self.out.counters.late += 1;
                }
            }
            // When the server let this send go: at once, unless it waited for room (the reply
            // or reconnect that made room on the connection that takes it), or for `--moderate`'s
            // gap after a reply. What follows until its transmit stamp is the client's own.
            let mut room = None;
            if self.conns[i].late_marked {
                let made = self.conns[t].room;
                room = Some((made.at.clamp(sched, now.max(sched)), made.client_ns));
            } else if let Some(w) = waited_until {
                room = Some((w.clamp(sched, now.max(sched)), waited_room_client));
            }
            let mut ready = sched;
            if let Some((room_at, room_client)) = room {
                if room_at > sched {
                    waited_until = Some(room_at);
                    waited_room_client = room_client;
                }
                // The server held the wait for room, but for the room's request's own send lag:
                // a thread that sent that request late got its reply that much later, its own
                // doing (a late thread's wait was charged to the server, and the verdict named
                // the server for the client's lateness).
                let wait = room_at - sched;
                ready = sched + (wait - wait.min(room_client));
            }
            let mut could_go = room.map_or(sched, |(room_at, _)| room_at);
            if sh.moderate {
                let gap_end = (self.conns[i].last_rx + MODERATE_NS).min(now);
                ready = ready.max(gap_end);
                could_go = could_go.max(gap_end);
            }
            let c = &mut self.conns[t];
            // Issue the request due at `sched`.
            let index = sh.chooser.choose(&mut self.rng);
            self.key.clear();
            sh.keys.write_key(index, &mut self.key);
            let is_set = sh.update > 0.0 && self.rng.random::<f64>() < sh.update;
            let before = c.wbuf.len();
            if is_set {
                let len = sh
                    .valuesize
                    .sample(&mut self.rng)
                    .round()
                    .clamp(0.0, MAX_VALUE_LEN as f64) as usize;
                sh.protocol.encode(Op::Set, &self.key, len, &mut c.wbuf);
            } else {
                sh.protocol.encode(Op::Get, &self.key, 0, &mut c.wbuf);
            }
            let op = if is_set { Op::Set } else { Op::Get };
            c.tx_bytes += (c.wbuf.len() - before) as u64;
            c.inflight.push_back(Inflight {
                op,
                sched,
                sent: now,
                ready,
                could_go,
                end: c.tx_bytes.saturating_sub(1),
                tx: 0,
                waited_for_room: room.is_some_and(|(room_at, _)| room_at > sched),
            });
            if c.inflight.len() >= c.plan.depth {
                c.room.filled(now);
            }
            if now >= sh.warm_end && now < sh.end {
                self.out.counters.bytes_tx += (c.wbuf.len() - before) as u64;
            }
            // A measured request (due after the warmup), as its reply, lateness and loss are
            // counted: a warmup backlog sent in the measured interval was counted as sent and
            // its replies not, and the server was blamed for them (hostile pass 32).
            if sched >= sh.warm_end {
                self.out.counters.sent += 1;
            }
            if t != i {
                // Sent on another connection to the same server: it goes out with this turn.
                self.flush(t, now);
            }
            let c = &mut self.conns[i];
            if sched >= sh.warm_end {
                self.out.counters.scheduled += 1;
            }
            if let Some(ia) = &c.plan.ia {
                if let Some(prev) = c.last_sent {
                    // Reservoir sample of actual send gaps, normalized to unit rate.
                    let x = (now - prev) as f64 * 1e-9 * c.plan.rate;
                    self.ia_seen += 1;
                    if self.out.ia_samples.len() < MAX_IA_SAMPLES {
                        self.out.ia_samples.push(x);
                    } else {
                        let j = self.rng.random_range(0..self.ia_seen);
                        if (j as usize) < MAX_IA_SAMPLES {
                            self.out.ia_samples[j as usize] = x;
                        }
                    }
                }
                c.last_sent = Some(now);
                c.next_sched = sched + secs_to_ns(ia.sample(&mut self.rng)).max(1);
                if sh.skip
                    && now > c.next_sched + SKIP_BEHIND_NS
                    && c.inflight.len() >= c.plan.depth
                {
                    while c.next_sched + SKIP_TO_NS < now && c.next_sched < sh.end {
                        if c.next_sched >= sh.warm_end {
                            self.out.counters.skipped += 1;
                            self.out.counters.scheduled += 1;
                        }
                        c.next_sched += secs_to_ns(ia.sample(&mut self.rng)).max(1);
                    }
                }
            }
            c.late_marked = false;
            issued |= t == i;
        }
        if issued {
            self.flush(i, now);
        }
    }

    /// [`Worker::fault`] for a failed read or send (`what`), counted as the server closing the
    /// connection when it hung up ([`super::server_hung_up`]).
    pub(super) fn io_fault(&mut self, i: usize, now: u64, what: &str, e: &std::io::Error) {
        if super::server_hung_up(e) {
            self.out.counters.closed += 1;
        }
        self.fault(i, now, &format!("{what}: {e}"));
    }

    /// A broken connection: its outstanding requests are lost (errors); it is re-opened and its
    /// schedule goes on (requests due meanwhile wait and count late).
    pub(super) fn fault(&mut self, i: usize, now: u64, why: &str) {
        let warm_end = self.shared.warm_end;
        let c = &mut self.conns[i];
        tracing::debug!("connection to {}: {why}; re-opening", c.plan.addr);
        let lost = c.inflight.iter().filter(|r| r.sched >= warm_end).count() as u64;
        self.out.counters.errors += lost.max(1);
        if c.grown && c.last_rx == 0 && self.grow_paused_until != u64::MAX {
            // A connection opened beside the schedule that never answered: the server's
            // connection limit, most likely. Opening more would lose more requests.
            tracing::warn!(
                "{}: a connection opened beside the schedule failed before its first reply ({why}); no more are opened in this run",
                c.plan.addr
            );
            self.grow_paused_until = u64::MAX;
        }
        c.inflight.clear();
        c.wbuf.clear();
        c.wpos = 0;
        c.rpos = 0;
        c.rend = 0;
        c.back_off(now);
        match self.io {
            Io::Epoll(_) => self.epoll_detach(i),
            Io::Uring(_) => self.uring_detach(i),
        }
    }
}
