//! Waiting on descriptors with a timeout (`ppoll`: ns precision, where epoll's timeout is in ms)
//! and a doorbell (`eventfd`) another thread rings to end such a wait early. A wait allocates
//! nothing: the caller's [`Wait`]s are the kernel's `pollfd`s.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// What a [`Wait`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Read,
    Write,
}

/// One descriptor to wait on, and after [`wait`], whether it is ready.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct Wait(libc::pollfd);

impl std::fmt::Debug for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wait")
            .field("fd", &self.0.fd)
            .field("events", &self.0.events)
            .field("revents", &self.0.revents)
            .finish()
    }
}

impl Wait {
    /// No descriptor: ignored by [`wait`] (a slot of a fixed array left unused).
    pub const NONE: Wait = Wait(libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    });

    pub const fn new(fd: RawFd, want: Want) -> Wait {
        let events = match want {
            Want::Read => libc::POLLIN,
            Want::Write => libc::POLLOUT,
        };
        Wait(libc::pollfd {
            fd,
            events,
            revents: 0,
        })
    }

    /// Whether the last [`wait`] found anything on it (what was asked for, a hang-up or an
    /// error: the next read or write says which).
    pub fn ready(&self) -> bool {
        self.0.revents != 0
    }

    /// Whether the last [`wait`] found it readable.
    pub fn readable(&self) -> bool {
        self.0.revents & libc::POLLIN != 0
    }
}

/// Waits up to `timeout` until one of `waits` is ready; each then says whether it is. Returns
/// how many are (0: the timeout passed, or a signal ended the wait).
pub fn wait(waits: &mut [Wait], timeout: Duration) -> io::Result<usize> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `Wait` is a transparent `pollfd`, so `waits` is a valid array of them for the
    // call; a valid timespec; no signal mask.
    let n = unsafe {
        libc::ppoll(
            waits.as_mut_ptr().cast::<libc::pollfd>(),
            waits.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(0),
            _ => Err(e),
        };
    }
    Ok(n as usize)
}

/// An eventfd that client threads ring after queueing work, so that a loop asleep in [`wait`]
/// (or epoll) beside it wakes at once.
#[derive(Debug)]
pub struct Doorbell(OwnedFd);

impl Doorbell {
    pub fn new() -> io::Result<Doorbell> {
        // SAFETY: eventfd has no preconditions; a non-negative result is a new fd we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        Ok(Doorbell(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the fd readable (a full counter, EAGAIN, is readable already).
    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets the counter (not readable until the next ring).
    pub fn clear(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd.
        unsafe { libc::read(self.raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }

    pub fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rung_bell_ends_a_wait_and_a_cleared_one_lets_it_time_out() {
        let bell = Doorbell::new().expect("eventfd");
        let mut w = [Wait::NONE, Wait::new(bell.raw_fd(), Want::Read)];
        assert_eq!(wait(&mut w, Duration::from_millis(1)).unwrap(), 0);
        assert!(!w[1].ready());
        bell.ring();
        bell.ring();
        assert_eq!(wait(&mut w, Duration::from_secs(5)).unwrap(), 1);
        assert!(w[1].ready() && w[1].readable());
        assert!(!w[0].ready(), "an unused slot is never ready");
        bell.clear();
        assert_eq!(wait(&mut w, Duration::ZERO).unwrap(), 0);
        assert!(!w[1].readable());
    }

    #[test]
    fn a_ringing_thread_wakes_the_waiter() {
        let bell = std::sync::Arc::new(Doorbell::new().expect("eventfd"));
        let ringer = {
            let bell = bell.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                bell.ring();
            })
        };
        let mut w = [Wait::new(bell.raw_fd(), Want::Read)];
        // Bounded (a hang detector): the ring comes long before.
        let mut woke = false;
        for _ in 0..10 {
            if wait(&mut w, Duration::from_secs(1)).unwrap() == 1 {
                woke = true;
                break;
            }
        }
        ringer.join().unwrap();
        assert!(woke && w[0].readable());
    }

    #[test]
    fn a_socket_with_room_is_ready_to_write() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut w = [Wait::new(a.as_raw_fd(), Want::Write)];
        assert_eq!(wait(&mut w, Duration::from_secs(5)).unwrap(), 1);
        assert!(w[0].ready() && !w[0].readable());
    }
}
