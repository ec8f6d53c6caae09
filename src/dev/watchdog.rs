// SPDX-License-Identifier: GPL-2.0

//! The keep-alive watchdog.
//!
//! A live EFA device posts a keep-alive event to the AENQ periodically (every
//! second on the devices we know of). When they stop, the device is gone or
//! wedged, and every admin command would sit out its full timeout (30 s by
//! default) before failing. The C driver only counts keep-alives; refa
//! watches them:
//!
//! - The limit is the device's own `driver_watchdog_timeout` hint when it
//!   gives one, otherwise three keep-alive periods, the period being measured
//!   between the first two keep-alives.
//! - The watchdog arms at the first keep-alive, so a device that sends none
//!   (or before the driver enabled them) is never declared dead for it.
//! - When the limit passes without a keep-alive, it logs once, marks the
//!   admin queue dead (commands in flight and every later one fail at once
//!   with `ENODEV`) and reports the failure, which recovers the device
//!   (`crate::recovery`).
//!
//! A high-resolution timer checks the state periodically; it is cancelled
//! (waiting for a running check) when its handle is dropped at unbind.

use super::admin::AdminSync;
use crate::recovery::{
    Cause,
    Reporter, //
};
use kernel::{
    device,
    impl_has_hr_timer,
    prelude::*,
    sync::{
        aref::ARef,
        new_spinlock_irq,
        Arc,
        ArcBorrow,
        SpinLockIrq, //
    },
    time::{
        hrtimer::{
            ArcHrTimerHandle,
            HrTimer,
            HrTimerCallback,
            HrTimerCallbackContext,
            HrTimerPointer,
            HrTimerRestart,
            RelativeMode, //
        },
        Delta,
        Instant,
        Monotonic, //
    }, //
};

/// Keep-alive periods the watchdog waits for when the device gives no limit.
const PERIODS_BEFORE_DEAD: i64 = 3;
/// Keep-alives closer than this came from one backlog drained at once; they
/// say nothing about the device's period.
const MIN_PERIOD: Delta = Delta::from_millis(10);
/// Lower bound of a limit derived from the measured period.
const MIN_DERIVED_TIMEOUT: Delta = Delta::from_secs(1);
/// How often the watchdog looks before it is armed.
const IDLE_CHECK_PERIOD: Delta = Delta::from_secs(1);

/// What the watchdog concludes when it looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No keep-alive yet, or no limit known yet: nothing to watch.
    NotArmed,
    /// The last keep-alive is recent enough.
    Alive {
        /// The limit in force.
        timeout: Delta,
    },
    /// Nothing for longer than the limit.
    Silent {
        /// Time since the last keep-alive.
        silent_for: Delta,
        /// The limit in force.
        timeout: Delta,
    },
}

/// Keep-alive bookkeeping. Times are offsets from an arbitrary fixed origin,
/// so that tests can feed any.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KeepAlives {
    device_limit: Option<Delta>,
    last: Option<Delta>,
    period: Option<Delta>,
    count: u64,
}

impl KeepAlives {
    /// The limit the device asks for (`driver_watchdog_timeout`), if any.
    pub(crate) fn set_device_limit(&mut self, limit: Option<Delta>) {
        self.device_limit = limit.filter(|l| !l.is_zero());
    }

    /// A keep-alive arrived at `now`.
    pub(crate) fn record(&mut self, now: Delta) {
        if let (Some(last), None) = (self.last, self.period) {
            let gap = now - last;
            if gap >= MIN_PERIOD {
                self.period = Some(gap);
            }
        }
        self.last = Some(now);
        self.count += 1;
    }

    /// Keep-alives received.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// The limit in force, once there is one.
    pub(crate) fn timeout(&self) -> Option<Delta> {
        self.device_limit.or_else(|| {
            let derived =
                Delta::from_nanos(self.period?.as_nanos().saturating_mul(PERIODS_BEFORE_DEAD));
            Some(if derived < MIN_DERIVED_TIMEOUT {
                MIN_DERIVED_TIMEOUT
            } else {
                derived
            })
        })
    }

    /// Looks at the state at `now`.
    pub(crate) fn check(&self, now: Delta) -> Verdict {
        let (Some(last), Some(timeout)) = (self.last, self.timeout()) else {
            return Verdict::NotArmed;
        };
        let silent_for = now - last;
        if silent_for > timeout {
            Verdict::Silent {
                silent_for,
                timeout,
            }
        } else {
            Verdict::Alive { timeout }
        }
    }
}

/// How long the timer waits before looking again: a quarter of the limit,
/// so that a silence is noticed within 125% of it.
fn check_period(verdict: Verdict) -> Delta {
    match verdict {
        Verdict::Alive { timeout } => {
            let quarter = Delta::from_nanos(timeout.as_nanos() / 4);
            quarter.clamp(MIN_PERIOD, IDLE_CHECK_PERIOD)
        }
        Verdict::NotArmed | Verdict::Silent { .. } => IDLE_CHECK_PERIOD,
    }
}

/// The watchdog of one device.
#[pin_data]
pub(crate) struct Watchdog {
    #[pin]
    timer: HrTimer<Self>,
    #[pin]
    keep_alives: SpinLockIrq<KeepAlives>,
    origin: Instant<Monotonic>,
    admin: Arc<AdminSync>,
    reporter: Reporter,
    dev: ARef<device::Device>,
}

impl_has_hr_timer! {
    impl HasHrTimer<Self> for Watchdog {
        mode: RelativeMode<Monotonic>,
        field: self.timer
    }
}

/// A running watchdog; dropping it stops the watchdog.
pub(crate) type WatchdogHandle = ArcHrTimerHandle<Watchdog>;

impl Watchdog {
    /// A watchdog that marks `admin` dead and tells `reporter` when
    /// keep-alives stop; `dev` names the device in the log.
    pub(crate) fn new(
        dev: &device::Device,
        admin: Arc<AdminSync>,
        reporter: Reporter,
    ) -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                timer <- HrTimer::new(),
                keep_alives <- new_spinlock_irq!(KeepAlives::default(), "refa_keep_alives"),
                origin: Instant::now(),
                admin,
                reporter,
                dev: dev.into(),
            }),
            GFP_KERNEL,
        )
    }

    fn now(&self) -> Delta {
        Instant::<Monotonic>::now() - self.origin
    }

    /// Starts watching; the returned handle stops it when dropped.
    pub(crate) fn start(self: &Arc<Self>) -> WatchdogHandle {
        self.clone().start(IDLE_CHECK_PERIOD)
    }

    /// The device's own limit, from its hardware hints.
    pub(crate) fn set_device_limit(&self, limit: Option<Delta>) {
        self.keep_alives.lock().set_device_limit(limit);
    }

    /// Records a keep-alive event; called from the AENQ handler.
    pub(crate) fn keep_alive(&self) {
        let now = self.now();
        self.keep_alives.lock().record(now);
    }

    /// Keep-alive events received so far.
    pub(crate) fn keep_alives_received(&self) -> u64 {
        self.keep_alives.lock().count()
    }
}

impl HrTimerCallback for Watchdog {
    type Pointer<'a> = Arc<Self>;

    fn run(this: ArcBorrow<'_, Self>, mut ctx: HrTimerCallbackContext<'_, Self>) -> HrTimerRestart {
        let (verdict, count) = {
            let keep_alives = this.keep_alives.lock();
            (keep_alives.check(this.now()), keep_alives.count())
        };
        if let Verdict::Silent {
            silent_for,
            timeout,
        } = verdict
        {
            if this.admin.mark_dead() {
                dev_err!(
                    this.dev,
                    "keep-alives stopped after {}: none for {} ms (limit {} ms), commands fail\n",
                    count,
                    silent_for.as_millis(),
                    timeout.as_millis()
                );
            }
            this.reporter.report(Cause::KeepAlivesStopped);
            return HrTimerRestart::NoRestart;
        }
        ctx.forward_now(check_period(verdict));
        HrTimerRestart::Restart
    }
}

#[kunit_tests(refa_watchdog)]
mod tests {
    use super::*;

    fn ms(ms: i64) -> Delta {
        Delta::from_millis(ms)
    }

    #[test]
    fn unarmed_until_the_first_keep_alive() {
        let mut k = KeepAlives::default();
        k.set_device_limit(Some(ms(5000)));
        assert_eq!(k.check(ms(1_000_000)), Verdict::NotArmed);
        k.record(ms(100));
        assert_eq!(k.check(ms(5100)), Verdict::Alive { timeout: ms(5000) });
        assert_eq!(
            k.check(ms(5101)),
            Verdict::Silent {
                silent_for: ms(5001),
                timeout: ms(5000)
            }
        );
        k.record(ms(5101));
        assert_eq!(k.check(ms(6000)), Verdict::Alive { timeout: ms(5000) });
        assert_eq!(k.count(), 2);
    }

    #[test]
    fn without_a_device_limit_three_measured_periods() {
        let mut k = KeepAlives::default();
        k.set_device_limit(Some(ms(0)));
        k.record(ms(0));
        // One keep-alive tells no period yet.
        assert_eq!(k.check(ms(60_000)), Verdict::NotArmed);
        k.record(ms(2000));
        assert_eq!(k.timeout(), Some(ms(6000)));
        assert_eq!(k.check(ms(8000)), Verdict::Alive { timeout: ms(6000) });
        assert!(matches!(k.check(ms(8001)), Verdict::Silent { .. }));
    }

    #[test]
    fn a_drained_backlog_is_not_a_period() {
        let mut k = KeepAlives::default();
        k.record(ms(1000));
        k.record(ms(1000));
        k.record(ms(1001));
        assert_eq!(k.timeout(), None);
        k.record(ms(1101));
        // 100 ms measured: three periods are below the floor.
        assert_eq!(k.timeout(), Some(MIN_DERIVED_TIMEOUT));
    }

    #[test]
    fn checks_come_at_a_quarter_of_the_limit() {
        assert_eq!(check_period(Verdict::NotArmed), IDLE_CHECK_PERIOD);
        assert_eq!(check_period(Verdict::Alive { timeout: ms(2000) }), ms(500));
        assert_eq!(
            check_period(Verdict::Alive {
                timeout: ms(60_000)
            }),
            IDLE_CHECK_PERIOD
        );
        assert_eq!(check_period(Verdict::Alive { timeout: ms(1) }), MIN_PERIOD);
    }
}
