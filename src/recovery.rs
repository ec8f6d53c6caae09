// SPDX-License-Identifier: GPL-2.0

//! Device failure and recovery: one path from every cause of failure to a
//! device that works again, with nobody unloading anything.
//!
//! # Causes and the one detection path
//!
//! Each cause ends in [`Reporter::report`]: a fatal-error AENQ event (the
//! admin interrupt handler), keep-alives that stopped (the watchdog's
//! timer), admin commands that time out [`ADMIN_TIMEOUTS_IN_A_ROW`] times
//! in a row, `DEV_STS` showing a fatal error or a reset the driver did
//! not ask for, or not answering at all (read when a command times out),
//! and an interrupt handler that keeps hitting its budget ([`StormWatch`]).
//! Whoever reports first marks the admin queue dead (every command fails at once with `ENODEV`, a
//! command in flight keeps what it handed the device until the reset) and
//! moves [`Health`] from `Up` to `Failed`, which queues its work item once;
//! later reports of the same incarnation find it not `Up` and only count.
//! A report carries the generation of the device's incarnation it comes
//! from, so that a late report from one already replaced (a watchdog
//! firing as it is being stopped) cannot fail the new one.
//!
//! # Recovery
//!
//! The work item, under the device lock (below), takes the device's
//! incarnation ([`crate::Live`]: its RDMA registration, event queues and
//! running admin queue) out of the driver data and drops it:
//!
//! 1. The RDMA device is unregistered. Its operations table has
//!    `disassociate_ucontext`, so the core does not wait for processes to
//!    close it: it zaps every user mapping (doorbells, queues), destroys
//!    every object of every context (our destroy operations run, their
//!    admin commands fail at once on the dead queue, and what the device
//!    may still use is kept until the reset), and delivers
//!    `IB_EVENT_DEVICE_FATAL` on each context's async event file
//!    (`uverbs_async_event_destroy_uobj()` with `RDMA_REMOVE_DRIVER_REMOVE`,
//!    7.3's `uverbs_std_types_async_fd.c`), the last event it will ever
//!    carry. Every later call on the old file fails with `EIO`; closing it
//!    works. The driver sends no event of its own: one more before this
//!    would be a second `IBV_EVENT_DEVICE_FATAL` for one failure.
//! 2. The event queues' handlers are freed and their rings kept if the
//!    device did not take their destruction.
//! 3. The device is reset, giving the cause as the reason
//!    ([`Cause::reset_reason`]); its bus mastering goes off if it does not
//!    acknowledge. Only then is the memory the device was given freed (the
//!    rule of "Memory the device was given", `Documentation/refa.md`).
//!
//! Then, at once for a first failure and after a back-off for repeated
//! ones ([`Failures`]), it brings the device up as probe does (reset,
//! admin queue, AENQ, features, watchdog, event queues) and registers a
//! new RDMA device under the old one's name. A process that reopens the
//! device by name gets the new one. After [`MAX_FAILURES`] failures (the
//! device's and its bring-ups') within the failure window (the
//! `recovery_window` parameter, 60 s by default), the device stays
//! down, unregistered, until an operator unbinds and binds the function;
//! so does a device that did not acknowledge a reset, whose bus mastering
//! then stays off (`Regs::stop_dma`).
//!
//! # Why re-register
//!
//! Keeping the registration would need the RDMA core to disassociate the
//! contexts of a device that stays registered, which 7.3 cannot: it
//! offers `rdma_user_mmap_disassociate()` (mappings only) but no way to
//! destroy the objects of live contexts and fail their later calls, which
//! is what unregistration does. mlx5 makes the same choice: its health
//! recovery unloads and reloads its IB device. The price is a new
//! `ib_device`: a new index, a new uverbs character device and sysfs
//! directory, and `refa_N` kept by registering under the old name.
//!
//! # Lifetimes: why this is sound without a lifetime transmute
//!
//! Everything of a binding is branded with its `'bound` lifetime
//! (`Binding<'bound>`, the PCI driver data): the BAR mapping, the MSI-X
//! vectors, the interrupt handlers, the RDMA registration. A work item
//! must be `'static` (`Queue::enqueue`), so it cannot hold any of it.
//! [`Health`], the work item, holds only `'static` things: a reference on
//! the PCI device (`ARef`), its state, its counters. To reach the binding
//! it does what the driver core does for every bus callback and the PCI
//! core for `reset_prepare()`/`reset_done()`: it takes the device lock
//! ([`DeviceLock`]), under which no probe, remove or shutdown runs, checks
//! that the binding it belongs to still is the device's driver data (its
//! state is not [`Phase::Stopped`]; `Binding`'s drop sets it, under the
//! same lock, before anything of the binding goes), and borrows the driver
//! data for the time it holds the lock, as the PCI adapter's remove
//! callback does (`drvdata_borrow()`). What it builds from the bound
//! device under the lock is stored into the driver data, which the driver
//! core drops before the device is unbound: the contract
//! `Registration::new` and `IrqVectorHandler::new` state.
//!
//! The work never outlives the binding: `Binding`'s drop (and the shutdown
//! callback) stops [`Health`] (nothing queues it any more) and flushes
//! the work item (`DelayedWork::flush()`). The work takes the lock with a
//! trylock and, if it is taken, retries later unless stopped; the unbind
//! that holds the lock while it flushes therefore never waits for a work
//! that waits for it. Recovery and unbind exclude each other through the
//! device lock; an unbind that comes while a recovery runs waits for it.

use crate::{
    hw::regs::ResetReason,
    kernel_gaps::pci::DeviceLock,
    RefaDriver, //
};
// out of tree: begin
use crate::kernel_gaps::ratelimit::dev_err_ratelimited;
use crate::kernel_gaps::workqueue::DelayedWorkExt as _;
// out of tree: end
use kernel::{
    device::Bound,
    impl_has_delayed_work,
    new_spinlock_irq,
    pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{
            ordering::Relaxed,
            Atomic, //
        },
        Arc,
        SpinLockIrq, //
    },
    time::{
        msecs_to_jiffies,
        Delta,
        Instant,
        Monotonic, //
    },
    workqueue::{
        self,
        new_delayed_work,
        DelayedWork,
        WorkItem, //
    }, //
};

/// Failures (of the device, or of a bring-up after one) within the
/// failure window (the `recovery_window` parameter) after which the device
/// stays down.
pub(crate) const MAX_FAILURES: usize = 8;
/// Back-off before the bring-up after a second failure within the window;
/// it doubles with each further one.
const FIRST_BACKOFF: Delta = Delta::from_millis(250);
/// Longest back-off.
const MAX_BACKOFF: Delta = Delta::from_secs(4);
/// How soon the work item looks again when the device lock is taken (a
/// probe, unbind or shutdown under way, or a sysfs reset).
const LOCK_RETRY: Delta = Delta::from_millis(10);
/// Admin commands timing out in a row, with no completion in between, that
/// declare the device failed. One timeout is a lost command (the queue goes
/// on, the late completion frees its context); a device that answers none
/// of three, each given the device's full timeout, is not answering.
pub(crate) const ADMIN_TIMEOUTS_IN_A_ROW: u32 = 3;

/// Why the device was declared failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The device posted a fatal-error AENQ event.
    FatalError {
        /// The event's syndrome.
        syndrome: u16,
    },
    /// No keep-alive event for longer than the watchdog's limit.
    KeepAlivesStopped,
    /// [`ADMIN_TIMEOUTS_IN_A_ROW`] admin commands timed out in a row.
    AdminTimeouts,
    /// `DEV_STS` shows a fatal error, or a reset the driver did not ask
    /// for.
    DeviceStatus {
        /// The register's value.
        status: u32,
    },
    /// A readless register read went unanswered after a command timed
    /// out.
    RegistersSilent,
    /// An interrupt handler kept hitting its budget ([`StormWatch`]).
    InterruptStorm {
        /// The ring whose handler did.
        queue: StormQueue,
    },
}

/// A ring whose interrupt handler has a budget, for [`Cause::InterruptStorm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StormQueue {
    /// The admin completion queue.
    AdminCompletions,
    /// The asynchronous event notification queue.
    Aenq,
    /// Completion event queue number `eqn`.
    Eq {
        /// Its number.
        eqn: u16,
    },
}

impl Cause {
    /// The reason the reset that ends the failed incarnation gives.
    pub(crate) fn reset_reason(self) -> ResetReason {
        match self {
            Self::FatalError { .. }
            | Self::DeviceStatus { .. }
            | Self::RegistersSilent
            | Self::InterruptStorm { .. } => ResetReason::DriverInvalidState,
            Self::KeepAlivesStopped => ResetReason::KeepAliveTo,
            Self::AdminTimeouts => ResetReason::AdminTo,
        }
    }

    /// The cause as the `last_failure_cause` counter shows it.
    pub(crate) fn code(self) -> u64 {
        match self {
            Self::FatalError { .. } => 1,
            Self::KeepAlivesStopped => 2,
            Self::AdminTimeouts => 3,
            Self::DeviceStatus { .. } => 4,
            Self::RegistersSilent => 5,
            Self::InterruptStorm { .. } => 6,
        }
    }
}

/// Longest pause between two over-budget passes of a handler within one
/// storm.
pub(crate) const STORM_PAUSE: Delta = Delta::from_millis(250);
/// How long over-budget passes may go on before the device is declared
/// failed.
pub(crate) const STORM_LIMIT: Delta = Delta::from_secs(1);

/// Watches the passes of one interrupt handler over its ring for a storm
/// that does not end.
///
/// Each handler takes at most a ring's worth of entries per interrupt (its
/// budget) and leaves the rest for the next one, so that a device that
/// writes entries as fast as they are consumed cannot keep it in hard-IRQ
/// context for ever. A device that works never gives a handler more than
/// that: it writes no further than the consumer doorbell allows. A pass
/// that finds entries left after its budget is a device that ignores the
/// doorbell; if it goes on, the interrupts alone take the CPU, a ring's
/// worth at a time, and nothing but a reset stops them. So over-budget
/// passes with no pause longer than [`STORM_PAUSE`] between them, for
/// longer than [`STORM_LIMIT`], are a failure ([`Cause::InterruptStorm`]):
/// the recovery's reset ends the storm, and its back-off and limit bound
/// a device that storms again after each bring-up.
///
/// A burst shorter than the limit costs at most a second of interrupts,
/// each pass bounded, and is only logged. Passes within the budget between
/// over-budget ones neither extend nor end a storm: a device that paces
/// itself to stay just ahead of the handler lets it catch up now and then.
/// The pause is long against the time between two passes of a storm (a
/// pass per interrupt, and the device raises it again at once; a vCPU
/// descheduled on a loaded host loses tens of milliseconds) and short
/// against the limit, so two bursts a while apart are not one storm.
///
/// One per ring, kept under the lock its handler consumes the ring with.
#[derive(Clone, Copy, Default)]
pub(crate) struct StormWatch {
    /// The first and the latest over-budget pass of the current storm.
    storm: Option<(Instant<Monotonic>, Instant<Monotonic>)>,
}

impl StormWatch {
    /// No storm yet.
    pub(crate) const fn new() -> Self {
        Self { storm: None }
    }

    /// A pass of the handler ended at `now`, having found entries left
    /// after its budget if `over_budget`. Returns whether the storm now
    /// lasted past [`STORM_LIMIT`]: the caller reports the failure. A
    /// storm reported is over for the watch; one that goes on is reported
    /// again a limit later (the report of a device already failed only
    /// counts).
    pub(crate) fn pass(&mut self, over_budget: bool, now: Instant<Monotonic>) -> bool {
        if !over_budget {
            return false;
        }
        match self.storm {
            Some((first, last)) if now - last <= STORM_PAUSE => {
                if now - first > STORM_LIMIT {
                    self.storm = None;
                    return true;
                }
                self.storm = Some((first, now));
            }
            _ => self.storm = Some((now, now)),
        }
        false
    }
}

/// What to do after a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Bring the device up after this delay.
    Retry(Delta),
    /// Too many failures: stay down until the operator rebinds.
    StayDown,
}

/// The times of the last failures, and the back-off they call for. Times
/// are offsets from a fixed origin, so that tests can feed any.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Failures {
    /// The last `MAX_FAILURES` failure times, oldest first once full.
    times: [Delta; MAX_FAILURES],
    /// How many of `times` are set.
    len: usize,
    /// The window in which [`MAX_FAILURES`] failures leave the device down.
    window: Delta,
}

impl Failures {
    /// No failure yet; `window` must be longer than zero, or a bring-up
    /// failing at once would be retried without a pause for ever.
    pub(crate) const fn new(window: Delta) -> Self {
        Self {
            times: [Delta::ZERO; MAX_FAILURES],
            len: 0,
            window,
        }
    }

    /// The window in which [`MAX_FAILURES`] failures leave the device down.
    pub(crate) fn window(&self) -> Delta {
        self.window
    }

    /// A failure at `now`: what to do about it.
    pub(crate) fn record(&mut self, now: Delta) -> Next {
        if self.len == MAX_FAILURES {
            self.times.copy_within(1.., 0);
            self.len -= 1;
        }
        self.times[self.len] = now;
        self.len += 1;
        let recent = self.times[..self.len]
            .iter()
            .filter(|&&t| now - t < self.window)
            .count();
        if recent >= MAX_FAILURES {
            return Next::StayDown;
        }
        if recent <= 1 {
            return Next::Retry(Delta::ZERO);
        }
        let doublings = (recent - 2).min(16) as u32;
        let backoff = Delta::from_nanos(FIRST_BACKOFF.as_nanos().saturating_mul(1 << doublings));
        Next::Retry(if backoff > MAX_BACKOFF {
            MAX_BACKOFF
        } else {
            backoff
        })
    }
}

/// Where the device is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Probe or a bring-up is building incarnation `generation`; a
    /// failure it reports is remembered until the bring-up ends.
    Starting {
        generation: u64,
        pending: Option<Cause>,
    },
    /// Incarnation `generation` works.
    Up { generation: u64 },
    /// Declared failed; the work item tears the incarnation down.
    Failed { cause: Cause },
    /// Torn down; the work item brings the device up (after the back-off).
    Waiting,
    /// Too many failures: down until the function is unbound and bound.
    Down,
    /// The binding is going away, or the system is going down: nothing is
    /// queued any more.
    Stopped,
}

/// What the work item is to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Tear down the failed incarnation.
    TearDown(Cause),
    /// Bring the device up.
    BringUp,
}

struct State {
    phase: Phase,
    /// The last incarnation started.
    generation: u64,
    failures: Failures,
    /// When the device was declared failed, for the time to recovery.
    failed_at: Option<Instant<Monotonic>>,
}

/// The health of one bound device: its phase, its failures, and the work
/// item that recovers it. `'static`: see the module's documentation.
#[pin_data]
pub(crate) struct Health {
    #[pin]
    work: DelayedWork<Health>,
    #[pin]
    state: SpinLockIrq<State>,
    origin: Instant<Monotonic>,
    pdev: ARef<pci::Device>,
    /// Failures declared (not counting repeated reports of one).
    failures: Atomic<u64>,
    /// Incarnations brought up after a failure.
    recoveries: Atomic<u64>,
    /// [`Cause::code`] of the last failure; 0 before any.
    last_cause: Atomic<u64>,
}

impl_has_delayed_work! {
    impl HasDelayedWork<Self> for Health { self.work }
}

impl Health {
    /// The health of `pdev`, being probed.
    pub(crate) fn new(pdev: &pci::Device<Bound>) -> Result<Arc<Self>> {
        let window = crate::module_parameters::recovery_window.value();
        if window == 0 {
            dev_err!(
                pdev.as_ref(),
                "recovery_window=0: the failure window must be at least 1 s\n"
            );
            return Err(EINVAL);
        }
        Arc::pin_init(
            pin_init!(Self {
                work <- new_delayed_work!("refa_recovery"),
                state <- new_spinlock_irq!(
                    State {
                        phase: Phase::Starting {
                            generation: 0,
                            pending: None,
                        },
                        generation: 0,
                        failures: Failures::new(Delta::from_secs(window.into())),
                        failed_at: None,
                    },
                    "refa_health"
                ),
                origin: Instant::now(),
                pdev: pdev.into(),
                failures: Atomic::new(0),
                recoveries: Atomic::new(0),
                last_cause: Atomic::new(0),
            }),
            GFP_KERNEL,
        )
    }

    fn now(&self) -> Delta {
        Instant::<Monotonic>::now() - self.origin
    }

    /// A bring-up (probe's or a recovery's) begins a new incarnation;
    /// returns the reporter its parts report failures through.
    pub(crate) fn starting(self: &Arc<Self>) -> Reporter {
        let mut state = self.state.lock();
        state.generation += 1;
        let generation = state.generation;
        if state.phase != Phase::Stopped {
            state.phase = Phase::Starting {
                generation,
                pending: None,
            };
        }
        Reporter {
            health: self.clone(),
            generation,
        }
    }

    /// The incarnation being brought up works; if it reported a failure
    /// meanwhile, it is declared failed now. Returns the time since the
    /// failure it recovers from, if it does.
    pub(crate) fn up(self: &Arc<Self>) -> Option<Delta> {
        let mut state = self.state.lock();
        let Phase::Starting {
            generation,
            pending,
        } = state.phase
        else {
            return None;
        };
        state.phase = Phase::Up { generation };
        let since = state.failed_at.take().map(|t| Instant::now() - t);
        if since.is_some() {
            self.recoveries.add(1, Relaxed);
        }
        if let Some(cause) = pending {
            self.declare_failed(&mut state, cause);
        }
        since
    }

    /// Incarnation `generation` reports `cause`; any context.
    fn report(self: &Arc<Self>, generation: u64, cause: Cause) -> bool {
        let mut state = self.state.lock();
        match state.phase {
            Phase::Up { generation: g } if g == generation => {
                self.declare_failed(&mut state, cause);
                true
            }
            Phase::Starting {
                generation: g,
                pending: None,
            } if g == generation => {
                state.phase = Phase::Starting {
                    generation,
                    pending: Some(cause),
                };
                false
            }
            _ => false,
        }
    }

    fn declare_failed(self: &Arc<Self>, state: &mut State, cause: Cause) {
        self.failures.add(1, Relaxed);
        self.last_cause.store(cause.code(), Relaxed);
        if !crate::module_parameters::recovery.value() {
            // The operator wants a failed device left as it failed (to
            // look at it, or to test what a dead device keeps): its admin
            // queue stays dead, its RDMA device registered, until unbind.
            state.phase = Phase::Down;
            dev_err!(
                &*self.pdev,
                "device failed ({:?}); recovery is off (refa.recovery=0), it stays down\n",
                cause
            );
            return;
        }
        state.phase = Phase::Failed { cause };
        state.failed_at = Some(Instant::now());
        dev_err_ratelimited!(&*self.pdev, "device failed ({:?}); recovering\n", cause);
        self.queue(state, Delta::ZERO);
    }

    /// Queues the work item after `delay`, unless stopped.
    fn queue(self: &Arc<Self>, state: &State, delay: Delta) {
        if state.phase == Phase::Stopped {
            return;
        }
        let ms = u32::try_from(delay.as_millis_ceil()).unwrap_or(u32::MAX);
        // Already queued: that run will find the new phase.
        let _ = workqueue::system_unbound().enqueue_delayed(self.clone(), msecs_to_jiffies(ms));
    }

    /// What the work item is to do next, by the phase. A teardown is done
    /// once: [`Self::after_failure`] moves the phase on from `Failed`, and
    /// reports find it not `Up`.
    pub(crate) fn step(&self) -> Option<Step> {
        let state = self.state.lock();
        match state.phase {
            Phase::Failed { cause } => Some(Step::TearDown(cause)),
            Phase::Waiting => Some(Step::BringUp),
            _ => None,
        }
    }

    /// The failed incarnation is gone, or the bring-up failed: records the
    /// failure; returns the delay before the next bring-up, or `None` if
    /// the device stays down.
    pub(crate) fn after_failure(&self) -> Option<Delta> {
        let now = self.now();
        let mut state = self.state.lock();
        if state.phase == Phase::Stopped {
            return None;
        }
        match state.failures.record(now) {
            Next::Retry(delay) => {
                state.phase = Phase::Waiting;
                Some(delay)
            }
            Next::StayDown => {
                state.phase = Phase::Down;
                dev_err!(
                    &*self.pdev,
                    "{} failures within {} s; the device stays down until the driver is unbound and bound again\n",
                    MAX_FAILURES,
                    state.failures.window().as_millis() / 1000
                );
                None
            }
        }
    }

    /// The device did not acknowledge a reset and its bus mastering is
    /// off for good: it stays down, whatever the failures so far.
    pub(crate) fn stay_down(&self) {
        let mut state = self.state.lock();
        if state.phase == Phase::Stopped {
            return;
        }
        state.phase = Phase::Down;
        dev_err!(
            &*self.pdev,
            "the device did not acknowledge its reset, its bus mastering is off; it stays down until the driver is unbound and bound again\n"
        );
    }

    /// Queues the next bring-up after `delay`.
    pub(crate) fn retry_after(self: &Arc<Self>, delay: Delta) {
        let state = self.state.lock();
        if state.phase == Phase::Waiting {
            self.queue(&state, delay);
        }
    }

    /// No recovery any more: the binding is going away or the system is
    /// going down. Returns once the work item is idle, and nothing queues
    /// it again.
    pub(crate) fn stop(&self) {
        self.state.lock().phase = Phase::Stopped;
        // Every path that queues the work checks the phase under the lock
        // just taken: none queues it from here on, so the flush leaves it
        // idle. A run it waits for finds the device lock taken (our caller
        // holds it) and `Stopped`, and returns at once.
        self.work.flush();
    }

    fn is_stopped(&self) -> bool {
        self.state.lock().phase == Phase::Stopped
    }

    /// (failures, recoveries, last cause) so far.
    pub(crate) fn counters(&self) -> (u64, u64, u64) {
        (
            self.failures.load(Relaxed),
            self.recoveries.load(Relaxed),
            self.last_cause.load(Relaxed),
        )
    }
}

impl WorkItem for Health {
    type Pointer = Arc<Health>;

    fn run(this: Arc<Health>) {
        let Some(lock) = DeviceLock::try_lock(&this.pdev) else {
            // A probe, unbind or shutdown of the device is under way (or a
            // reset through sysfs): look again shortly. An unbind stops
            // `this` before it flushes, which ends the retries.
            this.retry_locked(LOCK_RETRY);
            return;
        };
        // Under the device lock, the phase tells whether the binding
        // `this` belongs to is the device's driver data: `Binding::probe`
        // made `this` (under the lock), and `Binding`'s drop stops it first
        // (under the lock); a probe that fails drops the binding's
        // `HealthGuard`, which stops it too.
        if this.is_stopped() {
            return;
        }
        // SAFETY: The device lock is held (`lock`) and `this` is not
        // stopped, so the `Binding` that made `this` has not begun to drop
        // and was returned by a successful `RefaDriver` probe: every
        // `Binding` is made by `Binding::probe` only, whose result the PCI
        // adapter of `RefaDriver` stores as the driver data before
        // releasing the lock (a failure to store it drops the binding,
        // stopping `this`, before the lock is released). The driver core
        // takes the data back only in an unbind, under the lock held here.
        unsafe {
            lock.with_bound::<RefaDriver, _>(|pdev, binding| {
                binding.get_ref().recover(pdev, &this);
            })
        };
    }
}

impl Health {
    /// Queues the work again after `delay` unless stopped; for a run that
    /// could not take the device lock.
    fn retry_locked(self: &Arc<Self>, delay: Delta) {
        let state = self.state.lock();
        self.queue(&state, delay);
    }

    /// Whether `self` is the health `other` holds.
    pub(crate) fn is(&self, other: &Arc<Health>) -> bool {
        core::ptr::eq(self, &**other)
    }

    /// Logs a recovery, `took` after the failure.
    pub(crate) fn log_recovered(&self, name: &CStr, took: Delta) {
        dev_info!(
            &*self.pdev,
            "{}: recovered {} ms after the failure (recovery {})\n",
            name.to_str().unwrap_or("?"),
            took.as_millis(),
            self.recoveries.load(Relaxed)
        );
    }
}

/// How the parts of one incarnation of a device (its admin queue, AENQ
/// handler, watchdog) report a failure: [`Health`] with the incarnation's
/// generation.
#[derive(Clone)]
pub(crate) struct Reporter {
    health: Arc<Health>,
    generation: u64,
}

impl Reporter {
    /// The incarnation failed for `cause`; any context. Returns whether
    /// this report declared the failure (the first for a working device).
    pub(crate) fn report(&self, cause: Cause) -> bool {
        self.health.report(self.generation, cause)
    }

    /// The device's health.
    pub(crate) fn health(&self) -> &Arc<Health> {
        &self.health
    }
}

/// Stops [`Health`] when dropped: the first thing a `Binding` drops, and
/// what a failed probe drops.
pub(crate) struct HealthGuard(pub(crate) Arc<Health>);

impl Drop for HealthGuard {
    fn drop(&mut self) {
        self.0.stop();
    }
}

#[kunit_tests(refa_recovery)]
mod tests {
    use super::*;

    fn s(secs: i64) -> Delta {
        Delta::from_secs(secs)
    }

    fn ms(ms: i64) -> Delta {
        Delta::from_millis(ms)
    }

    /// The default failure window (`recovery_window`).
    const WINDOW: Delta = Delta::from_secs(60);

    #[test]
    fn a_first_failure_is_recovered_at_once() {
        let mut f = Failures::new(WINDOW);
        assert_eq!(f.record(s(100)), Next::Retry(Delta::ZERO));
        // Long after: a first failure again.
        assert_eq!(f.record(s(100) + WINDOW), Next::Retry(Delta::ZERO));
    }

    #[test]
    fn repeated_failures_back_off_exponentially_up_to_the_cap() {
        let mut f = Failures::new(WINDOW);
        let delays: [Next; 7] = core::array::from_fn(|i| f.record(s(i as i64)));
        assert_eq!(
            delays,
            [
                Next::Retry(Delta::ZERO),
                Next::Retry(ms(250)),
                Next::Retry(ms(500)),
                Next::Retry(ms(1000)),
                Next::Retry(ms(2000)),
                Next::Retry(ms(4000)),
                Next::Retry(MAX_BACKOFF),
            ]
        );
        // The eighth within the window: down.
        assert_eq!(f.record(s(7)), Next::StayDown);
    }

    /// Feeds `watch` a pass every `every` from `from` for `count` passes,
    /// over budget if `over`; returns the offset of the first pass that
    /// reported, if one did.
    fn passes(
        watch: &mut StormWatch,
        t0: Instant<Monotonic>,
        from: Delta,
        every: Delta,
        count: i64,
        over: bool,
    ) -> Option<Delta> {
        (0..count)
            .map(|i| from + Delta::from_nanos(every.as_nanos() * i))
            .find(|&at| watch.pass(over, t0 + at))
    }

    #[test]
    fn over_budget_passes_for_more_than_the_limit_report() {
        let t0 = Instant::now();
        let mut w = StormWatch::new();
        // A pass every 10 ms: the first past the limit reports, once.
        assert_eq!(passes(&mut w, t0, ms(0), ms(10), 300, true), Some(ms(1010)));
        // The storm goes on: reported again a limit later.
        assert_eq!(
            passes(&mut w, t0, ms(1020), ms(10), 300, true),
            Some(ms(1020 + 1010))
        );
        // Sparse passes, each within the pause of the one before, add up
        // to a storm too.
        let mut w = StormWatch::new();
        assert_eq!(passes(&mut w, t0, ms(0), ms(240), 10, true), Some(ms(1200)));
    }

    #[test]
    fn a_pause_longer_than_the_limit_restarts_the_storm() {
        let t0 = Instant::now();
        let mut w = StormWatch::new();
        // 900 ms of storm, a pause of 260 ms, 900 ms more: never a second
        // without a pause.
        assert_eq!(passes(&mut w, t0, ms(0), ms(10), 91, true), None);
        assert_eq!(passes(&mut w, t0, ms(1160), ms(10), 91, true), None);
        // Exactly the pause is no pause: it goes on from 1160 ms.
        assert_eq!(
            passes(&mut w, t0, ms(1160 + 900 + 250), ms(10), 30, true),
            Some(ms(1160 + 900 + 250))
        );
        // A storm that ends before the limit leaves nothing behind.
        let mut w = StormWatch::new();
        assert_eq!(passes(&mut w, t0, ms(0), ms(1), 400, true), None);
        assert!(!w.pass(true, t0 + ms(5000)));
        assert_eq!(passes(&mut w, t0, ms(5001), ms(1), 1000, true), None);
    }

    #[test]
    fn passes_within_budget_never_report() {
        let t0 = Instant::now();
        let mut w = StormWatch::new();
        // Ten seconds of passes within budget, one every millisecond.
        assert_eq!(passes(&mut w, t0, ms(0), ms(1), 10_000, false), None);
        // Nor do they end a storm or extend one: over-budget passes every
        // 200 ms with passes within budget between them report as they
        // would alone, at 1200 ms ...
        let mut w = StormWatch::new();
        let mut reported = None;
        for i in 0..8 {
            if w.pass(true, t0 + ms(200 * i)) {
                reported = Some(200 * i);
                break;
            }
            assert_eq!(passes(&mut w, t0, ms(200 * i + 1), ms(1), 199, false), None);
        }
        assert_eq!(reported, Some(1200));
        // ... and passes within budget after a last over-budget one do not
        // keep the storm going past the pause.
        let mut w = StormWatch::new();
        assert_eq!(passes(&mut w, t0, ms(0), ms(10), 80, true), None);
        assert_eq!(passes(&mut w, t0, ms(791), ms(1), 500, false), None);
        assert!(!w.pass(true, t0 + ms(1300)));
    }

    #[test]
    fn a_storm_is_cause_6() {
        let cause = Cause::InterruptStorm {
            queue: StormQueue::Aenq,
        };
        assert_eq!(cause.code(), 6);
        assert_eq!(cause.reset_reason(), ResetReason::DriverInvalidState);
    }

    #[test]
    fn failures_outside_the_window_do_not_count() {
        let mut f = Failures::new(WINDOW);
        for i in 0..(MAX_FAILURES as i64 - 1) {
            f.record(s(i));
        }
        // The first fell out of the window: seven recent ones, not eight.
        assert_eq!(f.record(s(0) + WINDOW), Next::Retry(MAX_BACKOFF));
        // And long after, all are old.
        assert_eq!(f.record(s(1000)), Next::Retry(Delta::ZERO));
    }
}
