// SPDX-License-Identifier: GPL-2.0

//! The admin queue: submission (AQ) and completion (ACQ) rings in DMA
//! memory, and the commands in flight.
//!
//! Any number of threads may execute commands at once. Each takes a
//! completion context ([`CommandSlots`]); when all are taken it waits for
//! one to come free. Its entry goes into the AQ at the producer position,
//! the producer counter goes to the doorbell, and the thread sleeps until
//! its completion arrives (the device answers in any order; completions are
//! matched to contexts by command id), the device is declared dead, or its
//! timeout passes. A timeout fails only that command: its context stays
//! reserved until the late completion arrives, and the queue goes on.
//!
//! Until the admin interrupt is registered the queue runs in polling mode
//! (the device raises no interrupt, the waiting thread drains the ACQ
//! itself); afterwards the interrupt handler drains it and wakes the
//! waiters.
//!
//! Ring positions, contexts and mode live in [`AdminSync`], which the
//! keep-alive watchdog shares to mark the queue dead.

use super::{
    regs::Regs,
    slots::{
        Answer,
        CommandSlots,
        SlotId, //
    }, //
};
use crate::{
    hw::{
        admin::{
            self,
            AcqCommonDesc,
            AcqEntry,
            AdminOpcode,
            AdminStatus,
            AqCommonDesc,
            AqCommonDescV2,
            AqEntry,
            AqEntryV2, //
        },
        regs,
        wire::Wire, //
    },
    recovery::StormWatch,
    ring::RingPos, //
};
// out of tree: begin
use crate::kernel_gaps::ratelimit::{
    dev_err_ratelimited,
    dev_info_ratelimited,
    dev_warn_ratelimited, //
};
// out of tree: end
use kernel::{
    device::Bound,
    dma::Coherent,
    io::{
        io_project,
        io_read,
        Io, //
    },
    new_condvar,
    new_spinlock_irq,
    pci,
    prelude::*,
    sync::{
        atomic::{
            ordering::Relaxed,
            Atomic, //
        },
        barrier::{
            dma_mb,
            Read, //
        },
        Arc,
        CondVar,
        CondVarTimeoutResult,
        SpinLockIrq,
        SpinLockIrqGuard, //
    },
    time::{
        delay::fsleep,
        msecs_to_jiffies,
        Delta,
        Instant,
        Monotonic, //
    }, //
};

/// Entries in the AQ and the ACQ, and completion contexts.
const DEPTH: usize = admin::DRIVER_AQ_DEPTH as usize;
/// Byte offset of the phase flags in an ACQ entry.
const ACQ_FLAGS_OFFSET: usize = 3;
/// While a signal is pending a wait cannot sleep interruptibly; it sleeps
/// this long at a time instead.
const SIGNAL_PENDING_NAP: Delta = Delta::from_millis(1);

/// Where the queue is, and who waits for what.
struct AdminState {
    slots: CommandSlots<AcqEntry, DEPTH>,
    sq: RingPos,
    cq: RingPos,
    /// No admin interrupt: waiters drain the ACQ themselves.
    polling: bool,
    /// The device stopped answering (watchdog) or reported a fatal error:
    /// no command is sent any more, and commands in flight are given up.
    dead: bool,
    /// A reset is about to take the queue away: no command is sent any
    /// more, but commands in flight wait for the reset (or their timeout).
    closed: bool,
    /// Resets the device acknowledged while the queue lived: a command
    /// submitted before one of them can no longer be acted on.
    resets: u64,
    /// Commands given up on for want of an answer since the device last
    /// answered one (late answers count).
    timeouts_in_a_row: u32,
    timeout: Delta,
    poll_interval: Delta,
    /// The interrupt handler's passes that hit their budget.
    storm: StormWatch,
}

/// The part of the admin queue that lives as long as anyone may wait on it
/// or declare the device dead: ring positions, completion contexts, mode.
#[pin_data]
pub(crate) struct AdminSync {
    #[pin]
    state: SpinLockIrq<AdminState>,
    /// Notified whenever a completion arrives, a context comes free, or the
    /// queue dies.
    #[pin]
    changed: CondVar,
}

impl AdminSync {
    fn new(timeout: Delta) -> Result<Arc<Self>> {
        let depth = DEPTH as u32;
        let state = AdminState {
            slots: CommandSlots::new(),
            sq: RingPos::new(depth)?,
            cq: RingPos::new(depth)?,
            polling: true,
            dead: false,
            closed: false,
            resets: 0,
            timeouts_in_a_row: 0,
            timeout,
            poll_interval: Delta::from_millis(admin::DRIVER_POLL_INTERVAL_MS.into()),
            storm: StormWatch::new(),
        };
        Arc::pin_init(
            pin_init!(Self {
                state <- new_spinlock_irq!(state, "refa_admin"),
                changed <- new_condvar!("refa_admin_changed"),
            }),
            GFP_KERNEL,
        )
    }

    /// Fails every command in flight and every later one with `ENODEV`.
    /// Returns whether the queue was alive until now.
    ///
    /// The device is not reset by this: commands in flight are given up,
    /// not forgotten, and their callers keep what they handed the device
    /// (see [`Failed::in_flight`]).
    pub(crate) fn mark_dead(&self) -> bool {
        let was_alive = !core::mem::replace(&mut self.state.lock().dead, true);
        self.changed.notify_all();
        was_alive
    }

    /// Lets no new command through; commands in flight go on waiting for
    /// their answer, the reset that is to follow, or their timeout.
    pub(crate) fn close(&self) {
        self.state.lock().closed = true;
    }

    /// Sleeps until something changes or `deadline` passes, releasing the
    /// lock meanwhile. Returns the lock re-taken.
    fn sleep<'g>(
        &'g self,
        mut state: SpinLockIrqGuard<'g, AdminState>,
        deadline: Instant<Monotonic>,
    ) -> SpinLockIrqGuard<'g, AdminState> {
        let left = deadline - Instant::now();
        if left <= Delta::ZERO {
            return state;
        }
        let left = if state.polling {
            left.min(state.poll_interval)
        } else {
            left
        };
        let jiffies = msecs_to_jiffies(u32::try_from(left.as_millis_ceil()).unwrap_or(u32::MAX));
        match self.changed.wait_interruptible_timeout(&mut state, jiffies) {
            CondVarTimeoutResult::Signal { .. } => {
                // A command is never given up because the caller got a
                // signal (the device would act on it with nobody to undo
                // it); with the signal pending every interruptible sleep
                // returns at once, so nap instead.
                drop(state);
                fsleep(SIGNAL_PENDING_NAP.min(left));
                self.state.lock()
            }
            CondVarTimeoutResult::Timeout | CondVarTimeoutResult::Woken { .. } => state,
        }
    }
}

/// Submission entry formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EntryFormat {
    /// 64-byte [`AqEntry`].
    V1,
    /// 128-byte [`AqEntryV2`] with a CRC-16, from API version 0.3.
    V2,
}

impl EntryFormat {
    fn size(self) -> usize {
        match self {
            Self::V1 => AqEntry::SIZE,
            Self::V2 => AqEntryV2::SIZE,
        }
    }

    /// The entry for `cmd`, as bytes (only the first [`Self::size`] count).
    fn encode<C: Wire>(
        self,
        cmd_id: u16,
        opcode: AdminOpcode,
        flags: u8,
        phase: u8,
        cmd: &C,
    ) -> Result<[u8; AqEntryV2::SIZE]> {
        let common = AqCommonDesc {
            command_id: cmd_id,
            opcode: opcode.raw(),
            flags: AqCommonDesc::PHASE.with(flags, phase),
        };
        let mut bytes = [0u8; AqEntryV2::SIZE];
        match self {
            Self::V1 => {
                let mut entry = AqEntry {
                    aq_common_descriptor: common,
                    ..AqEntry::ZERO
                };
                entry.set_payload(cmd).map_err(|_| EINVAL)?;
                entry.encode(&mut bytes).map_err(|_| EINVAL)?;
            }
            Self::V2 => {
                let mut entry = AqEntryV2 {
                    aq_common_descriptor: AqCommonDescV2 {
                        common,
                        ..AqCommonDescV2::ZERO
                    },
                    ..AqEntryV2::ZERO
                };
                entry.set_payload(cmd).map_err(|_| EINVAL)?;
                entry.seal();
                entry.encode(&mut bytes).map_err(|_| EINVAL)?;
            }
        }
        Ok(bytes)
    }
}

/// A failed command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Failed {
    /// What the caller reports.
    pub(crate) error: Error,
    /// The command went to the device, got no answer, and no reset has
    /// been acknowledged since: the device may still act on it (read or
    /// write the memory it named, create the object it asked for), so
    /// that memory must stay allocated until the device is reset.
    /// `false` when the command never reached the device, was answered,
    /// or was overtaken by an acknowledged reset.
    pub(crate) in_flight: bool,
}

impl Failed {
    /// A failure the device cannot act on any more.
    fn settled(error: Error) -> Self {
        Self {
            error,
            in_flight: false,
        }
    }
}

impl From<Failed> for Error {
    fn from(f: Failed) -> Self {
        f.error
    }
}

/// What the admin queue counted, for the device's statistics.
pub(crate) struct AdminCounters {
    /// Commands handed to the device.
    pub(crate) submitted: Atomic<u64>,
    /// Commands the device answered (late answers included).
    pub(crate) completed: Atomic<u64>,
    /// Answers with an error status.
    pub(crate) failed: Atomic<u64>,
    /// Commands given up on for want of an answer.
    pub(crate) no_completion: Atomic<u64>,
}

/// The admin queue of one device.
pub(crate) struct AdminQueue {
    sync: Arc<AdminSync>,
    counters: AdminCounters,
    sq: Coherent<[u8]>,
    cq: Coherent<[u8]>,
    format: EntryFormat,
    /// Completions carry a checksum worth checking (API version 0.2 on).
    check_crc: bool,
}

impl AdminQueue {
    /// Allocates the rings of a device with API version `api_version` and
    /// gives them to the device, in polling mode; commands time out after
    /// `timeout`.
    pub(crate) fn new(regs: &Regs<'_>, api_version: u32, timeout: Delta) -> Result<Self> {
        let dev = regs.device().as_ref();
        let format = if api_version >= regs::ADMIN_V2_MIN_API_VERSION {
            EntryFormat::V2
        } else {
            EntryFormat::V1
        };
        let sync = AdminSync::new(timeout)?;
        let sq = Coherent::<u8>::zeroed_slice(dev, DEPTH * format.size(), GFP_KERNEL)?;
        let cq = Coherent::<u8>::zeroed_slice(dev, DEPTH * AcqEntry::SIZE, GFP_KERNEL)?;

        regs.write(regs::INTR_MASK_OFF, regs::INTR_MASK_EN.prep(1));

        let sq_addr = sq.dma_address();
        regs.write(regs::AQ_BASE_LO_OFF, sq_addr as u32);
        regs.write(regs::AQ_BASE_HI_OFF, (sq_addr >> 32) as u32);
        regs.write(
            regs::AQ_CAPS_OFF,
            regs::AQ_CAPS_AQ_DEPTH.prep(DEPTH as u32)
                | regs::AQ_CAPS_AQ_ENTRY_SIZE.prep(format.size() as u32),
        );

        let cq_addr = cq.dma_address();
        regs.write(regs::ACQ_BASE_LO_OFF, cq_addr as u32);
        regs.write(regs::ACQ_BASE_HI_OFF, (cq_addr >> 32) as u32);
        regs.write(
            regs::ACQ_CAPS_OFF,
            regs::ACQ_CAPS_ACQ_DEPTH.prep(DEPTH as u32)
                | regs::ACQ_CAPS_ACQ_ENTRY_SIZE.prep(AcqEntry::SIZE as u32)
                | regs::ACQ_CAPS_ACQ_MSIX_VECTOR.prep(regs::MGMNT_MSIX_VEC_IDX.into()),
        );

        Ok(Self {
            sync,
            counters: AdminCounters {
                submitted: Atomic::new(0),
                completed: Atomic::new(0),
                failed: Atomic::new(0),
                no_completion: Atomic::new(0),
            },
            sq,
            cq,
            format,
            check_crc: api_version >= regs::CRC_MIN_API_VERSION,
        })
    }

    /// What the queue counted.
    pub(crate) fn counters(&self) -> &AdminCounters {
        &self.counters
    }

    /// The state the watchdog shares.
    pub(crate) fn sync(&self) -> &Arc<AdminSync> {
        &self.sync
    }

    /// Commands given up on for want of an answer since the device last
    /// answered one.
    pub(crate) fn timeouts_in_a_row(&self) -> u32 {
        self.sync.state.lock().timeouts_in_a_row
    }

    /// Switches between polling mode and interrupt mode; interrupt mode
    /// needs the admin interrupt handler registered.
    pub(crate) fn set_polling(&self, regs: &Regs<'_>, polling: bool) {
        let mut state = self.sync.state.lock();
        regs.write(regs::INTR_MASK_OFF, regs::INTR_MASK_EN.prep(polling.into()));
        state.polling = polling;
    }

    /// Sets the command timeout and the polling interval (from the device's
    /// hints).
    pub(crate) fn set_timeouts(&self, timeout: Option<Delta>, poll_interval: Option<Delta>) {
        let mut state = self.sync.state.lock();
        if let Some(timeout) = timeout {
            state.timeout = timeout;
        }
        if let Some(interval) = poll_interval {
            state.poll_interval = interval;
        }
    }

    /// Lets no command through any more: a reset took (or tried to take)
    /// the queue away from the device. If the device `acknowledged` the
    /// reset, the commands abandoned before it, which it will never
    /// answer, are forgotten, and commands still waiting fail as settled;
    /// otherwise they are given up as in flight, and whoever handed the
    /// device memory with them keeps it.
    pub(crate) fn after_device_reset(&self, acknowledged: bool) {
        let mut state = self.sync.state.lock();
        if acknowledged {
            state.slots.forget_abandoned();
            state.resets += 1;
        }
        state.dead = true;
        drop(state);
        self.sync.changed.notify_all();
    }

    /// Executes `cmd` with `opcode` and header `flags` (`CTRL_DATA` bits;
    /// the phase is added here) and returns the device's completion, whose
    /// status is known to be success. A failure says whether the device
    /// may still act on the command.
    pub(crate) fn exec<C: Wire>(
        &self,
        regs: &Regs<'_>,
        opcode: AdminOpcode,
        flags: u8,
        cmd: &C,
    ) -> Result<AcqEntry, Failed> {
        let sync = &*self.sync;
        let mut state = sync.state.lock();
        // Waiting for a context is bounded by one command timeout: contexts
        // come free at least that often unless the device stopped answering.
        let deadline = Instant::now() + state.timeout;
        let (slot, cmd_id) = loop {
            if state.dead || state.closed {
                return Err(Failed::settled(ENODEV));
            }
            let producer = state.sq.doorbell();
            if let Some(taken) = state.slots.submit(producer) {
                break taken;
            }
            if passed(deadline) {
                dev_err_ratelimited!(
                    regs.device(),
                    "no admin context came free for {:?} ({} abandoned)\n",
                    opcode,
                    state.slots.abandoned()
                );
                return Err(Failed::settled(EBUSY));
            }
            state = sync.sleep(state, deadline);
        };

        if let Err(e) = self.post(regs, &mut state, cmd_id, opcode, flags, cmd) {
            // Nothing reached the device: the context is simply free again.
            state.slots.withdraw(slot);
            return Err(Failed::settled(e));
        }
        self.counters.submitted.add(1, Relaxed);
        let resets = state.resets;

        let deadline = Instant::now() + state.timeout;
        let completion = loop {
            if state.polling {
                self.drain(regs.device(), &mut state);
            }
            if let Some(completion) = state.slots.collect(slot) {
                break completion;
            }
            if state.dead {
                // Nothing was collected under this lock: no answer to return.
                let _ = state.slots.abandon(slot);
                // Given up, not answered: unless the device was reset
                // meanwhile it may still act on the command.
                return Err(Failed {
                    error: ENODEV,
                    in_flight: state.resets == resets,
                });
            }
            if passed(deadline) {
                break self
                    .time_out(regs, &mut state, slot, cmd_id, opcode)
                    .map_err(|error| {
                        self.counters.no_completion.add(1, Relaxed);
                        Failed {
                            error,
                            in_flight: true,
                        }
                    })?;
            }
            state = sync.sleep(state, deadline);
        };
        drop(state);
        self.counters.completed.add(1, Relaxed);
        // A context came free.
        sync.changed.notify_all();

        let status = completion.acq_common_descriptor.status;
        status_to_result(status)
            .inspect_err(|e| {
                self.counters.failed.add(1, Relaxed);
                dev_dbg!(
                    regs.device(),
                    "admin command {:?} failed: status {} ({})\n",
                    opcode,
                    status,
                    e.to_errno()
                );
            })
            .map_err(Failed::settled)?;
        Ok(completion)
    }

    /// Writes the entry at the producer position and rings the doorbell.
    fn post<C: Wire>(
        &self,
        regs: &Regs<'_>,
        state: &mut AdminState,
        cmd_id: u16,
        opcode: AdminOpcode,
        flags: u8,
        cmd: &C,
    ) -> Result {
        let size = self.format.size();
        let bytes = self
            .format
            .encode(cmd_id, opcode, flags, state.sq.phase(), cmd)?;
        let offset = state.sq.slot() * size;
        io_project!(&self.sq, [try: offset..offset + size]).copy_from_slice(&bytes[..size]);
        state.sq = state.sq.advanced(1);
        // The MMIO write is ordered after the entry's stores to memory.
        regs.write(regs::AQ_PROD_DB_OFF, state.sq.doorbell().into());
        Ok(())
    }

    /// The deadline of the command in `slot` passed: looks one last time
    /// (an interrupt may have gone missing), then gives up on it.
    fn time_out(
        &self,
        regs: &Regs<'_>,
        state: &mut AdminState,
        slot: SlotId,
        cmd_id: u16,
        opcode: AdminOpcode,
    ) -> Result<AcqEntry> {
        self.drain(regs.device(), state);
        if let Some(completion) = state.slots.abandon(slot) {
            dev_warn_ratelimited!(
                regs.device(),
                "admin command {:?} completed without an interrupt\n",
                opcode
            );
            return Ok(completion);
        }
        state.timeouts_in_a_row = state.timeouts_in_a_row.saturating_add(1);
        dev_err_ratelimited!(
            regs.device(),
            "admin command {:?} (id {:#x}) timed out after {} ms; {} await a late completion\n",
            opcode,
            cmd_id,
            state.timeout.as_millis(),
            state.slots.abandoned()
        );
        Err(ETIMEDOUT)
    }

    /// Consumes the completions the device posted, at most a ring's worth;
    /// returns what it found.
    ///
    /// A device has no more answers to give at once than there are
    /// contexts, which is the ring's depth. One that flips phase bits as
    /// fast as they are consumed would keep an unbounded loop, and the
    /// interrupt handler it runs in, going for ever; past the budget the
    /// rest waits for the next interrupt or poll.
    fn drain(&self, dev: &pci::Device<Bound>, state: &mut AdminState) -> Drained {
        let mut any = false;
        for _ in 0..DEPTH {
            let Some(completion) = self.next_completion(state) else {
                return Drained {
                    any,
                    over_budget: false,
                };
            };
            any = true;
            state.cq = state.cq.advanced(1);
            if self.check_crc && !completion.checksum_ok() {
                dev_err_ratelimited!(dev, "admin completion with a bad checksum, dropped\n");
                continue;
            }
            let cmd_id = AcqCommonDesc::COMMAND_ID.get(completion.acq_common_descriptor.command);
            let answer = state.slots.complete(cmd_id, completion);
            if !matches!(answer, Answer::Unexpected) {
                state.timeouts_in_a_row = 0;
            }
            match answer {
                Answer::Delivered(_) => {}
                Answer::Late(slot) => dev_info_ratelimited!(
                    dev,
                    "late admin completion (id {:#x}) frees context {}\n",
                    cmd_id,
                    slot.index()
                ),
                Answer::Unexpected => dev_err_ratelimited!(
                    dev,
                    "admin completion for unknown command id {:#x}, dropped\n",
                    cmd_id
                ),
            }
        }
        let over_budget = self.next_completion(state).is_some();
        if over_budget {
            dev_err_ratelimited!(
                dev,
                "more than {} admin completions at once; the rest waits\n",
                DEPTH
            );
        }
        Drained { any, over_budget }
    }

    /// The completion at the consumer position, if the device wrote it.
    fn next_completion(&self, state: &AdminState) -> Option<AcqEntry> {
        let offset = state.cq.slot() * AcqEntry::SIZE;
        let read = || -> Result<Option<AcqEntry>> {
            let flags: u8 = io_read!(&self.cq, [try: offset + ACQ_FLAGS_OFFSET]);
            if AcqCommonDesc::PHASE.get(flags) != state.cq.phase() {
                return Ok(None);
            }
            // Read the entry only after seeing its phase flip.
            dma_mb(Read);
            let mut bytes = [0u8; AcqEntry::SIZE];
            io_project!(&self.cq, [try: offset..offset + AcqEntry::SIZE]).copy_to_slice(&mut bytes);
            Ok(Some(AcqEntry::from_bytes(&bytes)))
        };
        // The ring holds `DEPTH` entries, so the projection cannot fail.
        read().ok().flatten()
    }

    /// The admin interrupt: completions for waiting threads. Returns
    /// whether the handler has been hitting its budget for too long (a
    /// storm, [`StormWatch`]): the device has failed.
    pub(crate) fn handle_interrupt(&self, dev: &pci::Device<Bound>) -> bool {
        let mut state = self.sync.state.lock();
        let drained = self.drain(dev, &mut state);
        let storm = state.storm.pass(drained.over_budget, Instant::now());
        drop(state);
        if drained.any {
            self.sync.changed.notify_all();
        }
        storm
    }
}

/// What a pass over the admin completion queue found.
struct Drained {
    /// Completions.
    any: bool,
    /// More completions than its budget, a ring's worth.
    over_budget: bool,
}

/// Whether `deadline` has passed.
fn passed(deadline: Instant<Monotonic>) -> bool {
    deadline - Instant::now() <= Delta::ZERO
}

/// The errno of a completion status. The C driver folds `RESOURCE_BUSY`
/// into `EINVAL`; `EBUSY` says what happened.
fn status_to_result(status: u8) -> Result {
    match AdminStatus::from_raw(status) {
        Some(AdminStatus::Success) => Ok(()),
        Some(AdminStatus::ResourceAllocationFailure) => Err(ENOMEM),
        Some(AdminStatus::UnsupportedOpcode) => Err(EOPNOTSUPP),
        Some(AdminStatus::ResourceBusy) => Err(EBUSY),
        Some(
            AdminStatus::BadOpcode
            | AdminStatus::MalformedRequest
            | AdminStatus::IllegalParameter
            | AdminStatus::UnknownError,
        )
        | None => Err(EINVAL),
    }
}

#[kunit_tests(refa_admin_format)]
mod tests {
    use super::*;
    use crate::hw::admin::{
        FeatureId,
        GetFeatureCmd, //
    };

    fn get_device_attr() -> GetFeatureCmd {
        let mut cmd = GetFeatureCmd::ZERO;
        cmd.feature_common.feature_id = FeatureId::DeviceAttr.raw();
        cmd
    }

    #[test]
    fn v1_entries_carry_id_opcode_phase() {
        let bytes = EntryFormat::V1
            .encode(0x123, AdminOpcode::GetFeature, 0, 1, &get_device_attr())
            .unwrap();
        assert_eq!(&bytes[..4], &[0x23, 0x01, 0x0b, 0x01]);
        assert_eq!(bytes[4 + 13], FeatureId::DeviceAttr.raw());
        assert!(bytes[64..].iter().all(|&b| b == 0));
    }

    #[test]
    fn v2_entries_are_sealed() {
        let bytes = EntryFormat::V2
            .encode(
                7,
                AdminOpcode::GetFeature,
                AqCommonDesc::CTRL_DATA.prep(1),
                0,
                &get_device_attr(),
            )
            .unwrap();
        let entry = AqEntryV2::from_bytes(&bytes);
        assert!(entry.checksum_ok());
        assert_eq!(entry.aq_common_descriptor.common.flags, 0x02);
        assert_eq!(entry.payload::<GetFeatureCmd>(), get_device_attr());
    }

    #[test]
    fn statuses_map_to_errnos() {
        assert_eq!(status_to_result(0), Ok(()));
        assert_eq!(status_to_result(1), Err(ENOMEM));
        assert_eq!(status_to_result(3), Err(EOPNOTSUPP));
        assert_eq!(status_to_result(5), Err(EINVAL));
        assert_eq!(status_to_result(7), Err(EBUSY));
        assert_eq!(status_to_result(200), Err(EINVAL));
    }
}
