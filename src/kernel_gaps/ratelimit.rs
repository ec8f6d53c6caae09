// SPDX-License-Identifier: GPL-2.0

// out of tree: begin
//! Rate-limited printing, out of tree only.
//!
//! C header: [`include/linux/ratelimit_types.h`](srctree/include/linux/ratelimit_types.h)
//!
//! C drivers print what a device or a user can repeat at will with
//! `dev_err_ratelimited()` and its siblings: each call site has its own
//! `struct ratelimit_state`, which lets [`DEFAULT_BURST`] messages through
//! per [`DEFAULT_INTERVAL`] and counts the rest. The 7.3 kernel crate has no
//! such thing; the series adds it (patches/rust/: `print::Ratelimit`, set
//! up on first use, and the `dev_*_ratelimited!` macros in the prelude).
//! This module stands in for it with the macros of the same names, so the
//! driver's calls are the same text, over the same policy with atomics:
//! [`Ratelimit`] is `const`-constructible and safe in interrupt context,
//! and [`dev_printk_ratelimited!`] gives every call site its own. One
//! difference shows: the count of suppressed messages is printed with the
//! next message's device and level (`N similar messages suppressed`), where
//! the C state prints it at warning level, named by the call site's module
//! (`refa::dev::admin: N callbacks suppressed`).
//!
//! Concurrent callers at a window boundary may let a message or two more
//! through than the burst; the C version, with its lock, would not. That
//! is the price of not taking a lock in an interrupt handler, and it is
//! bounded.

use kernel::{
    prelude::*,
    sync::atomic::{
        ordering::Relaxed,
        Atomic, //
    },
    time::{
        ClockSource,
        Delta,
        Monotonic, //
    }, //
};

/// The window of a rate limit, as `DEFAULT_RATELIMIT_INTERVAL` (5 s).
pub(crate) const DEFAULT_INTERVAL: Delta = Delta::from_secs(5);

/// Messages let through per window, as `DEFAULT_RATELIMIT_BURST`.
pub(crate) const DEFAULT_BURST: i32 = 10;

/// What a [`Ratelimit`] says of one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Print it; `missed` messages were suppressed since the last window
    /// began (say so first).
    Print {
        /// Messages suppressed in the window that ended.
        missed: u32,
    },
    /// Drop it: the burst of this window is spent.
    Suppress,
}

/// The rate limit of one call site.
pub(crate) struct Ratelimit {
    /// Start of the current window (`ktime`, nanoseconds); 0: none yet.
    begin: Atomic<i64>,
    /// Messages the current window still lets through.
    left: Atomic<i32>,
    /// Messages suppressed in the current window.
    missed: Atomic<i32>,
    interval_ns: i64,
    burst: i32,
}

impl Ratelimit {
    /// A rate limit of `burst` messages per `interval`.
    pub(crate) const fn new(interval: Delta, burst: i32) -> Self {
        Self {
            begin: Atomic::new(0),
            left: Atomic::new(0),
            missed: Atomic::new(0),
            interval_ns: interval.as_nanos(),
            burst,
        }
    }

    /// Whether a message may be printed now.
    pub(crate) fn admit(&self) -> Admit {
        self.admit_at(Monotonic::ktime_get())
    }

    /// Whether a message may be printed at time `now` (nanoseconds,
    /// positive).
    fn admit_at(&self, now: i64) -> Admit {
        let begin = self.begin.load(Relaxed);
        let mut missed = 0;
        if begin == 0 || now.saturating_sub(begin) >= self.interval_ns {
            // One caller opens the new window and reports the old one.
            if self.begin.cmpxchg(begin, now.max(1), Relaxed).is_ok() {
                self.left.store(self.burst, Relaxed);
                missed = self.missed.xchg(0, Relaxed);
            }
        }
        if self.left.fetch_sub(1, Relaxed) > 0 {
            Admit::Print {
                missed: missed.max(0) as u32,
            }
        } else {
            // Keep `left` from wandering towards overflow in a storm.
            self.left.store(0, Relaxed);
            self.missed.add(1, Relaxed);
            Admit::Suppress
        }
    }
}

/// Prints with the `dev_printk!` method `$method` (`pr_err`, `pr_warn`,
/// `pr_info`) unless this call site printed [`DEFAULT_BURST`] messages in
/// the last [`DEFAULT_INTERVAL`]; then counts the message, and reports the
/// count with the first message printed afterwards. The
/// `dev_*_ratelimited!` macros below use it, as the kernel crate's
/// `dev_printk_ratelimited!` in the series.
macro_rules! dev_printk_ratelimited {
    ($method:ident, $dev:expr, $($arg:tt)*) => {{
        static LIMIT: $crate::kernel_gaps::ratelimit::Ratelimit =
            $crate::kernel_gaps::ratelimit::Ratelimit::new(
                $crate::kernel_gaps::ratelimit::DEFAULT_INTERVAL,
                $crate::kernel_gaps::ratelimit::DEFAULT_BURST,
            );
        if let $crate::kernel_gaps::ratelimit::Admit::Print { missed } = LIMIT.admit() {
            let dev = $dev;
            if missed > 0 {
                kernel::dev_printk!($method, dev, "{} similar messages suppressed\n", missed);
            }
            kernel::dev_printk!($method, dev, $($arg)*);
        }
    }};
}
pub(crate) use dev_printk_ratelimited;

/// `dev_err!` unless this call site printed [`DEFAULT_BURST`] messages in
/// the last [`DEFAULT_INTERVAL`]: `dev_err_ratelimited()` in C.
macro_rules! dev_err_ratelimited {
    ($($arg:tt)*) => { $crate::kernel_gaps::ratelimit::dev_printk_ratelimited!(pr_err, $($arg)*) }
}
pub(crate) use dev_err_ratelimited;

/// `dev_warn!` unless this call site printed [`DEFAULT_BURST`] messages in
/// the last [`DEFAULT_INTERVAL`]: `dev_warn_ratelimited()` in C.
macro_rules! dev_warn_ratelimited {
    ($($arg:tt)*) => { $crate::kernel_gaps::ratelimit::dev_printk_ratelimited!(pr_warn, $($arg)*) }
}
pub(crate) use dev_warn_ratelimited;

/// `dev_info!` unless this call site printed [`DEFAULT_BURST`] messages in
/// the last [`DEFAULT_INTERVAL`]: `dev_info_ratelimited()` in C.
macro_rules! dev_info_ratelimited {
    ($($arg:tt)*) => { $crate::kernel_gaps::ratelimit::dev_printk_ratelimited!(pr_info, $($arg)*) }
}
pub(crate) use dev_info_ratelimited;

#[kunit_tests(refa_ratelimit)]
mod tests {
    use super::*;

    const SEC: i64 = 1_000_000_000;

    #[test]
    fn a_burst_per_window_then_the_count() {
        let limit = Ratelimit::new(Delta::from_secs(5), 3);
        let t0 = 100 * SEC;
        for _ in 0..3 {
            assert_eq!(limit.admit_at(t0), Admit::Print { missed: 0 });
        }
        // A storm within the window: all suppressed, all counted.
        for i in 0..1000 {
            assert_eq!(limit.admit_at(t0 + i), Admit::Suppress);
        }
        assert_eq!(limit.admit_at(t0 + 5 * SEC - 1), Admit::Suppress);
        // The next window reports the 1001 it dropped, once.
        assert_eq!(limit.admit_at(t0 + 5 * SEC), Admit::Print { missed: 1001 });
        assert_eq!(limit.admit_at(t0 + 5 * SEC + 1), Admit::Print { missed: 0 });
    }

    #[test]
    fn quiet_sites_are_not_limited() {
        let limit = Ratelimit::new(Delta::from_secs(5), 2);
        for i in 0..10 {
            assert_eq!(
                limit.admit_at((i + 1) * 6 * SEC),
                Admit::Print { missed: 0 }
            );
        }
    }
}
// out of tree: end
