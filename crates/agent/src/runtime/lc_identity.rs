//! Whose process may be taken as an LC when it is found again (by its pid file, its port or
//! its command): the rules [`super::follow`] applies before it moves a process into an LC
//! group, and what they remember from one look to the next.
//!
//! With `[lc] user` set, a process is the LC's only if it runs as exactly that user (real
//! and effective uid), and, found by its port, only if the listening socket was made by that
//! user, root or the agent's user (a daemon binds as root, then becomes its user): the
//! operator named the LC's user, so root's and the agent's own processes are not taken
//! unless that user is theirs. Without it, the users the LC was seen running as in
//! its group count, with root and the agent's user; a group empty since the start takes the
//! first process found (said once in the log: set `user` to close it).

use std::collections::{BTreeMap, BTreeSet};

use headroom_control::config::LcConfig;
use headroom_host::pids;
use headroom_types::UserSpec;

use super::Agent;

/// What the follower remembers about the processes it found as LCs.
#[derive(Default)]
pub(super) struct LcFollow {
    /// Pids found as an LC but left in another agent's group (each warned about once).
    pub(super) foreign_lc_pids: BTreeSet<u32>,
    /// Pids found as an LC that are BE's own processes, left in BE (each said once).
    pub(super) be_lc_pids: BTreeSet<u32>,
    /// LC pid files found not to be regular files (a FIFO, a device), said once each until
    /// the path is a regular file (or gone) again.
    pub(super) pid_files_not_regular: BTreeSet<String>,
    /// The users each LC (by index) was seen running as, in its group: without `[lc] user`,
    /// a process found as the LC (pid file, port or command) runs as one of them, or as root.
    pub(super) lc_uids: BTreeMap<usize, BTreeSet<u32>>,
    /// Pids found as an LC that run as another user, left where they are (each said once).
    pub(super) stranger_lc_pids: BTreeSet<u32>,
    /// `[lc] user` names looked up (`None`: the host knows no such user now).
    user_uids: BTreeMap<String, Option<u32>>,
    /// LCs (by name) that can be found again but name no `user`: said once in the log.
    said_no_user: BTreeSet<String>,
}

impl Agent {
    /// Says once per LC that can be found again (pid file, port or command) without a
    /// `user` key which processes the follower takes as it.
    pub(super) fn say_lc_user_rule(&mut self, lc: &LcConfig) {
        let findable = lc.pid_file.is_some() || lc.listen_port.is_some() || !lc.command.is_empty();
        if lc.user.is_some() || !findable || !self.lc_follow.said_no_user.insert(lc.name.clone()) {
            return;
        }
        tracing::info!(lc = %lc.name, "no [lc] user: a process found again by the LC's pid file, port or command is taken if it runs as root, this agent's user or a user the LC was seen running as in its group (while its group has been empty since the start, the first one found, whoever runs it); set lc.user to the LC's user to take exactly that user's");
    }

    /// Why `pid` (found as LC `i`, `lc`; holding listening sockets on the LC's port made by
    /// `sockets` when it was found by that port) is not taken as the LC, or `None` when it
    /// may be (or is gone). The text is said in the log and `ctl status`.
    pub(super) fn stranger(
        &mut self,
        i: usize,
        lc: &LcConfig,
        pid: u32,
        sockets: Option<&BTreeSet<u32>>,
    ) -> Option<String> {
        let (real, effective) = pids::uids(&self.options.root, pid)?;
        let port = lc.listen_port.unwrap_or(0);
        let me = headroom_host::process::effective_uid();
        let socket_by = |known: &dyn Fn(u32) -> bool| {
            sockets.into_iter().flatten().copied().find(|&u| !known(u))
        };
        if let Some(spec) = &lc.user {
            let Some(u) = self.lc_user_uid(spec) else {
                return Some(format!(
                    "lc.user {spec} is not a user on this host now: no process is taken as the LC"
                ));
            };
            if real != u || effective != u {
                let other = if real != u { real } else { effective };
                return Some(format!("runs as uid {other}, not lc.user {spec} (uid {u})"));
            }
            // Root's socket (or the agent's user's) may be the LC's: a daemon binds as root
            // and then becomes its user (`memcached -u`), a socket unit passes its own.
            return socket_by(&|x| x == u || x == 0 || x == me).map(|x| {
                format!("its listening socket on port {port} was made by uid {x}, neither lc.user {spec} (uid {u}) nor root")
            });
        }
        let seen = self.lc_follow.lc_uids.get(&i).cloned().unwrap_or_default();
        // Nothing learned yet (the group empty since the start): the first process found is
        // taken, and teaches its user; its socket must still be its own (or root's).
        let known = |u: u32| {
            u == 0
                || u == me
                || seen.contains(&u)
                || (seen.is_empty() && (u == real || u == effective))
        };
        if !known(real) || !known(effective) {
            let other = if known(real) { effective } else { real };
            return Some(format!("runs as uid {other}, not the LC's user"));
        }
        socket_by(&known).map(|x| {
            format!("its listening socket on port {port} was made by uid {x}, not the LC's user")
        })
    }

    /// The uid `spec` names (a name looked up once, and again while the host does not know
    /// it: it was checked at start, so that is a user removed since).
    fn lc_user_uid(&mut self, spec: &UserSpec) -> Option<u32> {
        match spec {
            UserSpec::Uid(u) => Some(*u),
            UserSpec::Name(n) => {
                if let Some(Some(u)) = self.lc_follow.user_uids.get(n) {
                    return Some(*u);
                }
                let uid = headroom_host::process::uid_of_user(n).ok().flatten();
                if uid.is_none() && !self.lc_follow.user_uids.contains_key(n) {
                    tracing::warn!(user = %n, "lc.user names no user on this host now: no process found again is taken as the LC");
                }
                self.lc_follow.user_uids.insert(n.clone(), uid);
                uid
            }
        }
    }

    /// Why the process a pid file names (`read`) is not taken as `lc`'s: the file could have
    /// been written (or put there, or linked) by a user besides root and this agent's, and
    /// the process runs as root or this agent's user, whom such a user cannot speak for.
    /// `None` when root vouches for the file, or the process runs as someone else (the uid
    /// rule, [`Self::stranger`], then applies to it as to any process found as the LC).
    pub(super) fn pid_file_doubt(&self, lc: &LcConfig, read: &pids::PidFileRead) -> Option<String> {
        let me = headroom_host::process::effective_uid();
        let file = lc.pid_file.as_deref()?;
        let dir = std::path::Path::new(file).parent()?;
        let dir = self.options.root.join(dir.strip_prefix("/").unwrap_or(dir));
        let vouched =
            headroom_types::other_writers::other_writer(read.uid, read.gid, read.mode, &[me])
                .is_none()
                && crate::trusted_dir::doubt(&dir, me).is_ok();
        if vouched {
            return None;
        }
        let Some((real, effective)) = pids::uids(&self.options.root, read.pid) else {
            return Some("gone".into());
        };
        let privileged = |u: u32| u == 0 || u == me;
        (privileged(real) || privileged(effective)).then(|| {
            format!(
                "{file} (owner uid {}, mode {:04o}) may be written by a user other than root, and names a process of uid {real}/{effective}",
                read.uid, read.mode
            )
        })
    }
}
