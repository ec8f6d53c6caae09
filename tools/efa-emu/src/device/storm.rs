//! Interrupt storm: a fault for tests, NOT part of EFA.
//!
//! For a bounded time the device writes keep-alive AENQ events with the
//! right phase as fast as the driver takes them, ignoring the consumer
//! doorbell, and raises the AENQ's interrupt after each of the driver's
//! passes. A driver whose interrupt handler takes events for as long as
//! it finds new ones is kept in that (hard-IRQ) handler; one that takes at
//! most a ring's worth per interrupt returns, and its doorbell says so.
//!
//! The device cannot see where the driver reads: the driver tells it only
//! with `AENQ_CONS_DB`, at the end of a pass. To stay ahead of the driver
//! without lapping it (an entry rewritten before the driver read it has
//! the next lap's phase, which ends the pass), the storm paces its writes
//! and adjusts the pace after each pass: faster when the driver caught up
//! with it, slower when it had lapped the driver. What a driver did is
//! measured from the doorbell: the most events it took between two
//! doorbell writes during the storm (`STORM_MAX_PASS` in the control
//! window). A driver with a budget of a ring's worth never exceeds the
//! ring's depth.
//!
//! At the end the storm waits for the driver to settle and, if it left the
//! ring inconsistent with the doorbell (lapped), rewrites the whole ring
//! as consumed, so that the AENQ works as before. A device reset ends a
//! storm.

use std::sync::Arc;
use std::time::{Duration, Instant};

use efa_hw::aenq::AenqGroup;

use super::{Inner, State};
use crate::report;

/// The longest storm the control window starts.
pub const MAX_MS: u32 = 60_000;
/// The first pace: an entry every 2 us.
const FIRST_PERIOD_NS: u64 = 2_000;
/// Bounds of the pace.
const MIN_PERIOD_NS: u64 = 50;
const MAX_PERIOD_NS: u64 = 1_000_000;
/// With no pass ended for this long, the interrupt is raised again (a
/// driver lapped before its first read saw nothing and wrote no doorbell).
const RESIGNAL: Duration = Duration::from_millis(5);
/// With no pass ended for this long and the storm more than a ring ahead
/// of the doorbell, the driver is taken to have been lapped before its
/// first read: production starts over from its consumer, slower. (A
/// driver kept in its handler that long has shown what it does.)
const RESYNC: Duration = Duration::from_millis(50);
/// At the end: how long the doorbell must stay still, and how long to wait
/// for that at most.
const SETTLED: Duration = Duration::from_millis(20);
const SETTLE_AT_MOST: Duration = Duration::from_secs(2);

/// The storm's state, under the device lock.
#[derive(Debug, Default)]
pub(crate) struct Storm {
    /// When the storm ends (None: it was stopped or never started).
    until: Option<Instant>,
    /// A storm thread runs (storming or settling).
    running: bool,
    /// A thread must be started (the control window asked; the caller of
    /// the window starts it once the device lock is released).
    spawn: bool,
    /// Events the last storm wrote.
    pub(super) events: u32,
    /// AENQ_CONS_DB writes that moved the consumer during the last storm.
    pub(super) passes: u32,
    /// The most events the driver took between two AENQ_CONS_DB writes
    /// during the last storm.
    pub(super) max_pass: u32,
}

impl Storm {
    /// `STORM_MS` written: a storm of `ms` milliseconds (at most
    /// [`MAX_MS`]), or none (0).
    pub(super) fn request(&mut self, ms: u32) {
        if ms == 0 {
            self.until = None;
            return;
        }
        self.until = Some(Instant::now() + Duration::from_millis(ms.min(MAX_MS).into()));
        self.events = 0;
        self.passes = 0;
        self.max_pass = 0;
        if !self.running {
            self.running = true;
            self.spawn = true;
        }
    }

    /// `STORM_MS` read: milliseconds left, at least 1 while the storm
    /// thread still runs (settling), 0 once it is over.
    pub(super) fn remaining_ms(&self) -> u32 {
        if !self.running {
            return 0;
        }
        let left = self.until.map_or(0, |u| {
            u.saturating_duration_since(Instant::now()).as_millis()
        });
        u32::try_from(left).unwrap_or(u32::MAX).max(1)
    }

    /// Whether a storm thread must be started now.
    pub(super) fn take_spawn(&mut self) -> bool {
        std::mem::take(&mut self.spawn)
    }

    /// The driver wrote `new` to AENQ_CONS_DB over `old`: the events it
    /// took in the pass that just ended.
    pub(super) fn doorbell(&mut self, old: u32, new: u32) {
        let taken = new.wrapping_sub(old);
        if self.running && taken != 0 && taken <= i32::MAX as u32 {
            self.passes = self.passes.wrapping_add(1);
            self.max_pass = self.max_pass.max(taken);
        }
    }

    /// A device reset ends the storm (the AENQ it wrote to is gone).
    pub(super) fn reset(&mut self) {
        self.until = None;
    }
}

/// Starts the storm thread the control window asked for.
pub(super) fn spawn(inner: &Arc<Inner>) {
    let i = inner.clone();
    let name = format!("efa{}-storm", inner.cfg.index);
    if let Err(e) = std::thread::Builder::new()
        .name(name)
        .spawn(move || run(&i))
    {
        log::error!("{}: cannot start the storm thread: {e}", inner.name());
        inner.lock().storm.running = false;
    }
}

fn run(inner: &Inner) {
    report!(
        inner.health(),
        Info,
        None,
        "storm",
        "{}: AENQ interrupt storm begins",
        inner.name()
    );
    let mut period = FIRST_PERIOD_NS;
    let mut seen_db = None;
    let mut signalled = Instant::now();
    let mut pass_ended = Instant::now();
    let mut next = Instant::now();
    loop {
        {
            let mut st = inner.lock();
            let now = Instant::now();
            let live = !st.stop
                && !st.fatal
                && !st.reset_in_progress
                && st.storm.until.is_some_and(|u| now < u);
            let Some((_, depth, vector)) = st.aenq_ready().filter(|_| live) else {
                break;
            };
            let db = st.regs.aenq_cons_db;
            let ahead = st.aenq_pc.wrapping_sub(db);
            if seen_db != Some(db) {
                // A pass ended (or the storm begins): the driver is out of
                // its handler. Ahead of it by more than the ring, the
                // storm had overwritten what it had not read yet.
                seen_db = Some(db);
                pass_ended = now;
                if ahead > depth {
                    period = (period * 5 / 4).min(MAX_PERIOD_NS);
                    st.aenq_pc = db;
                } else {
                    period = (period * 4 / 5).max(MIN_PERIOD_NS);
                }
                inner.irq.signal(vector);
                signalled = now;
            } else if now.duration_since(pass_ended) > RESYNC && ahead > depth {
                period = (period * 5 / 4).min(MAX_PERIOD_NS);
                st.aenq_pc = db;
                pass_ended = now;
                inner.irq.signal(vector);
                signalled = now;
            } else if now.duration_since(signalled) > RESIGNAL {
                inner.irq.signal(vector);
                signalled = now;
            }
            if let Err(e) = st.write_aenq(inner, AenqGroup::KeepAlive.raw(), 0) {
                st.enter_fatal(inner, None, &format!("AENQ write: {e}"));
                break;
            }
            st.storm.events = st.storm.events.wrapping_add(1);
        }
        next += Duration::from_nanos(period);
        let now = Instant::now();
        if next < now {
            next = now;
        } else if next - now > Duration::from_micros(200) {
            std::thread::sleep(next - now);
        } else {
            while Instant::now() < next {
                std::hint::spin_loop();
            }
        }
    }
    settle(inner);
    let mut st = inner.lock();
    st.storm.until = None;
    st.storm.running = false;
    report!(
        inner.health(),
        Info,
        None,
        "storm",
        "{}: AENQ interrupt storm over: {} events, {} passes of the driver, at most {} in one",
        inner.name(),
        st.storm.events,
        st.storm.passes,
        st.storm.max_pass
    );
}

/// Waits for the driver's doorbell to stand still, then leaves the AENQ
/// as a well-behaved device would have it: the driver's consumer at or
/// behind the producer by at most the ring. If the storm lapped the
/// driver, every entry is rewritten with the phase of the lap before the
/// consumer's, that is as consumed, and production goes on from the
/// consumer.
fn settle(inner: &Inner) {
    let start = Instant::now();
    let mut last = None;
    let mut still_since = start;
    loop {
        let db = inner.lock().regs.aenq_cons_db;
        let now = Instant::now();
        if last != Some(db) {
            last = Some(db);
            still_since = now;
        } else if now.duration_since(still_since) >= SETTLED
            || now.duration_since(start) >= SETTLE_AT_MOST
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut st = inner.lock();
    let Some((_, depth, vector)) = st.aenq_ready() else {
        return;
    };
    let db = st.regs.aenq_cons_db;
    if let Err(e) = st.clear_aenq(inner, db, depth) {
        st.enter_fatal(inner, None, &format!("AENQ write: {e}"));
    }
    // What is left for the driver, it takes at this interrupt.
    inner.irq.signal(vector);
}

impl State {
    /// Rewrites as consumed every slot of the AENQ the driver has no event
    /// in: each with the phase of the lap before the one the consumer will
    /// read it in. If the storm lapped the consumer, that is every slot,
    /// and the next event goes to the consumer's; otherwise the slots from
    /// the producer on, which may still hold entries of a lap the storm
    /// wrote before it moved the producer back to the consumer (`RESYNC`):
    /// left so, they would look like events as soon as the producer's
    /// next entry joined them to what the driver reads.
    fn clear_aenq(
        &mut self,
        inner: &Inner,
        consumer: u32,
        depth: u32,
    ) -> Result<(), crate::transport::DmaError> {
        let ahead = self.aenq_pc.wrapping_sub(consumer);
        let (from, slots) = if ahead > depth {
            (consumer, depth)
        } else {
            (self.aenq_pc, depth - ahead)
        };
        self.aenq_pc = from.wrapping_sub(depth);
        for _ in 0..slots {
            self.write_aenq(inner, AenqGroup::KeepAlive.raw(), 0)?;
        }
        self.aenq_pc = from;
        Ok(())
    }
}
