//! Timers on `CLOCK_MONOTONIC` for loops that keep a µs schedule: a one-shot absolute timer as
//! a pollable descriptor (`timerfd`: epoll's own timeout is in milliseconds, too coarse for µs
//! send schedules) and an absolute sleep (`clock_nanosleep`, `TIMER_ABSTIME`). Deadlines are
//! `CLOCK_MONOTONIC` ns, as `clock_gettime` gives them.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A one-shot absolute CLOCK_MONOTONIC timer as a pollable file descriptor.
pub struct Timer {
    fd: OwnedFd,
    armed_at: u64,
}

impl Timer {
    pub fn new() -> std::io::Result<Timer> {
        // SAFETY: plain syscall; the returned descriptor is checked and then owned.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        Ok(Timer {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            armed_at: 0,
        })
    }

    /// Fires at absolute monotonic time `at_ns` (re-arming also clears a pending expiry, so the
    /// next expiry is a fresh edge for edge-triggered epoll). No syscall if already armed there.
    pub fn arm(&mut self, at_ns: u64) -> std::io::Result<()> {
        if at_ns == self.armed_at {
            return Ok(());
        }
        let at = at_ns.max(1);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (at / 1_000_000_000) as libc::time_t,
                tv_nsec: (at % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: valid fd and itimerspec we own.
        let rc = unsafe {
            libc::timerfd_settime(
                self.fd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.armed_at = at_ns;
        Ok(())
    }

    /// The absolute time the timer was last armed for (0 after it fired).
    pub fn armed_at(&self) -> u64 {
        self.armed_at
    }

    /// Forget the armed time so the next `arm` re-arms (after the timer fired).
    pub fn fired(&mut self) {
        self.armed_at = 0;
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Sleeps until absolute CLOCK_MONOTONIC time `at_ns` (clock_nanosleep, TIMER_ABSTIME).
pub fn sleep_until(at_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (at_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (at_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: clock_nanosleep reads the timespec we own; no remainder with TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if rc != libc::EINTR {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    #[test]
    fn timer_fires_at_its_deadline() {
        let mut t = Timer::new().unwrap();
        let deadline = now_ns() + 2_000_000;
        t.arm(deadline).unwrap();
        assert_eq!(t.armed_at(), deadline);
        let mut pfd = libc::pollfd {
            fd: t.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, 1000) };
        assert_eq!(rc, 1);
        assert!(now_ns() >= deadline);
        t.fired();
        assert_eq!(t.armed_at(), 0);
    }

    #[test]
    fn an_absolute_sleep_ends_after_its_deadline() {
        let deadline = now_ns() + 1_000_000;
        sleep_until(deadline);
        assert!(now_ns() >= deadline);
        // A deadline already past returns at once.
        sleep_until(1);
    }
}
