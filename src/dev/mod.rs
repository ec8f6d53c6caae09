// SPDX-License-Identifier: GPL-2.0

//! The EFA device below the RDMA layer: registers, admin queue, AENQ,
//! keep-alive watchdog and completion event queues.
//!
//! [`Core`] is what every part of the driver shares (through an `Arc`): the
//! registers and the queues through which admin commands run. [`Running`]
//! stands for a device whose queues are live: dropping it resets the
//! device, which stops its DMA, before the queues' memory can go.

pub(crate) mod admin;
pub(crate) mod eq;
pub(crate) mod features;
pub(crate) mod lifetime;
pub(crate) mod objects;
pub(crate) mod pbl;
pub(crate) mod regs;
mod slots;
pub(crate) mod watchdog;

use self::{
    admin::AdminQueue,
    lifetime::Lifetimes,
    objects::AhCache,
    regs::Regs,
    watchdog::{
        Watchdog,
        WatchdogHandle, //
    }, //
};
use crate::{
    hw::{
        admin::{
            AcqEntry,
            AdminOpcode,
            AenqConfig,
            AllocPdResp,
            AllocUarResp,
            AqCommonDesc,
            CreateCqCmd,
            CreateCqResp,
            CreateEqCmd,
            CreateEqResp,
            CreateQpCmd,
            CreateQpResp,
            CtrlBuffInfo,
            DeallocPdCmd,
            DeallocUarCmd,
            DestroyCqCmd,
            DestroyEqCmd,
            DestroyQpCmd,
            FeatureId,
            GetFeatureCmd,
            GetFeatureResp,
            GetStatsCmd,
            GetStatsResp,
            GetStatsScope,
            GetStatsType,
            HostInfo,
            MemAddr,
            ModifyQpCmd,
            OsType,
            QueryQpCmd,
            QueryQpResp,
            SetFeatureCmd,
            COMMON_SPEC_VERSION_MAJOR,
            COMMON_SPEC_VERSION_MINOR,
            DRIVER_AENQ_DEPTH, //
        },
        aenq::{
            AenqCommonDesc,
            AenqEntry,
            AenqGroup, //
        },
        regs::{
            self as hwregs,
            ResetReason, //
        },
        wire::Wire, //
    },
    kernel_gaps::uts::kernel_version,
    recovery::{
        Cause,
        Reporter,
        StormQueue,
        StormWatch,
        ADMIN_TIMEOUTS_IN_A_ROW, //
    },
    ring::RingPos, //
};
// in tree: use kernel::pci::IrqVectorHandler;
// out of tree: begin
use crate::kernel_gaps::pci::IrqVectorHandler;
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
    irq::{
        self,
        IrqReturn, //
    },
    new_mutex,
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
        Mutex,
        SpinLockIrq, //
    },
    time::{
        Delta,
        Instant, //
    }, //
};

/// Byte offset of the phase flags in an AENQ entry.
const AENQ_FLAGS_OFFSET: usize = 4;

/// The asynchronous event notification queue, which the device writes.
#[pin_data]
struct Aenq {
    ring: Coherent<[u8]>,
    /// Consumed by the admin interrupt handler only.
    #[pin]
    consumer: SpinLockIrq<Consumer>,
}

/// Where an interrupt handler consumes the ring the device writes, and
/// the handler's passes that hit their budget.
pub(crate) struct Consumer {
    pub(crate) pos: RingPos,
    pub(crate) storm: StormWatch,
}

impl Consumer {
    /// At the start of a ring of `depth` entries, no storm seen.
    pub(crate) fn new(depth: u32) -> Result<Self> {
        Ok(Self {
            pos: RingPos::new(depth)?,
            storm: StormWatch::new(),
        })
    }
}

impl Aenq {
    /// Allocates the ring and gives it to the device.
    fn new(regs: &Regs<'_>) -> Result<impl PinInit<Self, Error>> {
        let depth = DRIVER_AENQ_DEPTH;
        let consumer = Consumer::new(depth.into())?;
        let ring = Coherent::<u8>::zeroed_slice(
            regs.device().as_ref(),
            usize::from(depth) * AenqEntry::SIZE,
            GFP_KERNEL,
        )?;
        let addr = ring.dma_address();
        regs.write(hwregs::AENQ_BASE_LO_OFF, addr as u32);
        regs.write(hwregs::AENQ_BASE_HI_OFF, (addr >> 32) as u32);
        regs.write(
            hwregs::AENQ_CAPS_OFF,
            hwregs::AENQ_CAPS_AENQ_DEPTH.prep(depth.into())
                | hwregs::AENQ_CAPS_AENQ_ENTRY_SIZE.prep(AenqEntry::SIZE as u32)
                | hwregs::AENQ_CAPS_AENQ_MSIX_VECTOR.prep(hwregs::MGMNT_MSIX_VEC_IDX.into()),
        );
        // Every entry is free for the device.
        regs.write(hwregs::AENQ_CONS_DB_OFF, consumer.pos.counter());
        Ok(try_pin_init!(Self {
            ring,
            consumer <- new_spinlock_irq!(consumer, "refa_aenq"),
        }? Error))
    }

    /// The event at the consumer position, if the device wrote it.
    fn next(&self, pos: RingPos) -> Result<Option<AenqEntry>> {
        let offset = pos.slot() * AenqEntry::SIZE;
        let flags: u8 = io_read!(&self.ring, [try: offset + AENQ_FLAGS_OFFSET]);
        if AenqCommonDesc::PHASE.get(flags) != pos.phase() {
            return Ok(None);
        }
        dma_mb(Read);
        let mut bytes = [0u8; AenqEntry::SIZE];
        io_project!(&self.ring, [try: offset..offset + AenqEntry::SIZE]).copy_to_slice(&mut bytes);
        Ok(Some(AenqEntry::from_bytes(&bytes)))
    }
}

/// A completion queue the device created.
pub(crate) struct CreatedCq {
    /// Its number.
    pub(crate) cq_idx: u16,
    /// Entries per sub-CQ it really has.
    pub(crate) depth: u16,
    /// Offset of its doorbell in the doorbell BAR, if it has one.
    pub(crate) doorbell: Option<u32>,
}

/// The shared core of a device: registers, admin queue, AENQ, watchdog.
#[pin_data]
pub(crate) struct Core<'a> {
    admin: AdminQueue,
    #[pin]
    aenq: Aenq,
    watchdog: Arc<Watchdog>,
    /// Memory the device failed to give back; freed after the reset.
    #[pin]
    orphans: Mutex<KVec<KBox<dyn Send>>>,
    /// Buffers kept in `orphans` so far, for the statistics.
    kept: Atomic<u64>,
    /// Buffers leaked on purpose: there was no room to keep them.
    leaked: Atomic<u64>,
    /// Address handles and their users.
    #[pin]
    ahs: AhCache,
    /// UARs, PDs, CQs and QPs the device has, and who holds them.
    #[pin]
    lifetimes: Lifetimes,
    /// Where failures go; the registers outlive this incarnation.
    reporter: Reporter,
    regs: Arc<Regs<'a>>,
}

impl<'a> Core<'a> {
    /// Sets up the admin queue and the AENQ of a device with API version
    /// `api_version` behind `regs`, in polling mode; failures are reported
    /// to `reporter`.
    pub(crate) fn new(
        regs: Arc<Regs<'a>>,
        api_version: u32,
        admin_timeout: Delta,
        reporter: Reporter,
    ) -> Result<Arc<Self>> {
        let status = regs.read(hwregs::DEV_STS_OFF)?;
        if !hwregs::DEV_STS_READY.is_set(status) {
            dev_err!(regs.device(), "device not ready for its admin queue\n");
            return Err(ENODEV);
        }
        let admin = AdminQueue::new(&regs, api_version, admin_timeout)?;
        let aenq = Aenq::new(&regs)?;
        let watchdog = Watchdog::new(
            regs.device().as_ref(),
            admin.sync().clone(),
            reporter.clone(),
        )?;
        Arc::pin_init(
            try_pin_init!(Self {
                admin,
                aenq <- aenq,
                watchdog,
                orphans <- new_mutex!(KVec::new(), "refa_orphans"),
                kept: Atomic::new(0),
                leaked: Atomic::new(0),
                ahs <- objects::AhCache::new(),
                lifetimes <- Lifetimes::new(),
                reporter,
                regs,
            }? Error),
            GFP_KERNEL,
        )
    }

    /// The PCI device.
    pub(crate) fn dev(&self) -> &'a pci::Device<Bound> {
        self.regs.device()
    }

    /// The registers.
    pub(crate) fn regs(&self) -> &Regs<'a> {
        &self.regs
    }

    /// The admin queue.
    pub(crate) fn admin(&self) -> &AdminQueue {
        &self.admin
    }

    /// The keep-alive watchdog.
    pub(crate) fn watchdog(&self) -> &Arc<Watchdog> {
        &self.watchdog
    }

    /// Where this incarnation's failures go.
    pub(crate) fn reporter(&self) -> &Reporter {
        &self.reporter
    }

    /// The device failed for `cause`: no command goes out any more, those
    /// in flight are given up (keeping what they handed the device), and
    /// recovery is scheduled (once, whatever reports it first). Any
    /// context.
    pub(crate) fn fail(&self, cause: Cause) {
        self.admin.sync().mark_dead();
        self.reporter.report(cause);
    }

    /// A command failed with `failed`: if it timed out, looks whether the
    /// device is failing (the timeouts in a row, `DEV_STS`).
    fn check_failed_command(&self, failed: &admin::Failed) {
        if failed.error != ETIMEDOUT {
            return;
        }
        if self.admin.timeouts_in_a_row() >= ADMIN_TIMEOUTS_IN_A_ROW {
            return self.fail(Cause::AdminTimeouts);
        }
        // A device that reset itself or hit a fatal error without posting
        // the event (or whose AENQ is wedged) says so in `DEV_STS`.
        match self.regs.read(hwregs::DEV_STS_OFF) {
            Ok(status) => {
                if hwregs::DEV_STS_FATAL_ERROR.is_set(status)
                    || hwregs::DEV_STS_RESET_IN_PROGRESS.is_set(status)
                    || !hwregs::DEV_STS_READY.is_set(status)
                {
                    self.fail(Cause::DeviceStatus { status });
                }
            }
            // Readless reads that stop answering: the device is gone.
            Err(_) => self.fail(Cause::RegistersSilent),
        }
    }

    /// Keeps `memory` until the device is reset; for queues and buffers the
    /// device did not give back.
    ///
    /// Kept memory goes when the `Core` does, which is after [`Running`]
    /// reset the device, or turned its bus mastering off when the reset
    /// failed.
    pub(crate) fn keep_until_reset<T: Send + 'static>(&self, memory: T) {
        // Out of memory, there is nowhere to keep it, and freeing it would
        // let the device use freed memory: leaking is the lesser evil.
        let leak = |()| {
            self.leaked.add(1, Relaxed);
            dev_err!(self.dev(), "cannot keep orphaned memory; leaking it\n")
        };
        let Ok(slot) = KBox::<T>::new_uninit(GFP_KERNEL) else {
            core::mem::forget(memory);
            return leak(());
        };
        let kept: KBox<dyn Send> = KBox::write(slot, memory);
        let mut orphans = self.orphans.lock();
        if orphans.reserve(1, GFP_KERNEL).is_err() {
            drop(orphans);
            core::mem::forget(kept);
            return leak(());
        }
        if let Err(e) = orphans.push_within_capacity(kept) {
            core::mem::forget(e);
        }
        self.kept.add(1, Relaxed);
    }

    /// (Buffers kept until the device is reset, buffers leaked on
    /// purpose) so far.
    pub(crate) fn kept_memory(&self) -> (u64, u64) {
        (self.kept.load(Relaxed), self.leaked.load(Relaxed))
    }

    /// Executes an admin command that hands the device no memory; see
    /// [`AdminQueue::exec`].
    pub(crate) fn exec<C: Wire>(
        &self,
        opcode: AdminOpcode,
        flags: u8,
        cmd: &C,
    ) -> Result<AcqEntry> {
        self.admin
            .exec(&self.regs, opcode, flags, cmd)
            .map_err(|failed| {
                self.check_failed_command(&failed);
                failed.error
            })
    }

    /// Executes an admin command that hands the device `memory` (a buffer
    /// the command names, or that the object it creates will use), and
    /// gives `memory` back with the completion. If the command failed
    /// while the device may still act on it (given up without an answer
    /// and no reset since: a timeout, or a queue declared dead under it),
    /// `memory` is kept until the device is reset; otherwise it is
    /// dropped.
    pub(crate) fn exec_with<C: Wire, M: Send + 'static>(
        &self,
        opcode: AdminOpcode,
        flags: u8,
        cmd: &C,
        memory: M,
    ) -> Result<(AcqEntry, M)> {
        match self.admin.exec(&self.regs, opcode, flags, cmd) {
            Ok(entry) => Ok((entry, memory)),
            Err(failed) => {
                if failed.in_flight {
                    self.keep_until_reset(memory);
                }
                self.check_failed_command(&failed);
                Err(failed.error)
            }
        }
    }

    /// Reads a feature the device must have (`supported` is the device's
    /// `supported_features`; `DEVICE_ATTR` needs none).
    pub(crate) fn get_feature(&self, id: FeatureId, supported: u64) -> Result<GetFeatureResp> {
        self.get_optional_feature(id, supported)?.ok_or_else(|| {
            dev_err!(self.dev(), "device lacks feature {:?}\n", id);
            EOPNOTSUPP
        })
    }

    /// Reads a feature if the device has it.
    pub(crate) fn get_optional_feature(
        &self,
        id: FeatureId,
        supported: u64,
    ) -> Result<Option<GetFeatureResp>> {
        if !id.is_supported(supported) {
            return Ok(None);
        }
        let mut cmd = GetFeatureCmd::ZERO;
        cmd.feature_common.feature_id = id.raw();
        let entry = self
            .exec(AdminOpcode::GetFeature, 0, &cmd)
            .inspect_err(|e| {
                dev_err!(
                    self.dev(),
                    "GET_FEATURE {:?} failed: {}\n",
                    id,
                    e.to_errno()
                )
            })?;
        Ok(Some(entry.resp()))
    }

    /// Enables the AENQ event groups the driver handles: all four.
    pub(crate) fn enable_aenq_groups(&self, supported: u64) -> Result {
        let wanted = crate::hw::aenq::DRIVER_ENABLED_GROUPS;
        let current = self.get_feature(FeatureId::AenqConfig, supported)?.aenq();
        if current.supported_groups & wanted != wanted {
            dev_err!(
                self.dev(),
                "device supports AENQ groups {:#x}, the driver needs {:#x}\n",
                current.supported_groups,
                wanted
            );
            return Err(EOPNOTSUPP);
        }
        let mut cmd = SetFeatureCmd::ZERO;
        cmd.feature_common.feature_id = FeatureId::AenqConfig.raw();
        cmd.set_aenq(&AenqConfig {
            supported_groups: 0,
            enabled_groups: wanted,
        });
        self.exec(AdminOpcode::SetFeature, 0, &cmd)
            .inspect_err(|e| {
                dev_err!(
                    self.dev(),
                    "enabling AENQ groups failed: {}\n",
                    e.to_errno()
                )
            })?;
        Ok(())
    }

    /// Tells the device about the host. Best effort: a device that cannot
    /// take it works just as well.
    pub(crate) fn set_host_info(&self) {
        if let Err(e) = self.try_set_host_info() {
            dev_warn!(
                self.dev(),
                "could not pass host information: {}\n",
                e.to_errno()
            );
        }
    }

    fn try_set_host_info(&self) -> Result {
        let (release, version, version_code) = kernel_version();
        let mut info = HostInfo {
            os_type: OsType::Linux.raw(),
            kernel_ver: version_code,
            driver_ver: HostInfo::DRIVER_MAJOR.prep(0) | HostInfo::DRIVER_MINOR.prep(1),
            bdf: self.dev().dev_id(),
            spec_ver: HostInfo::SPEC_MAJOR.prep(COMMON_SPEC_VERSION_MAJOR as u16)
                | HostInfo::SPEC_MINOR.prep(COMMON_SPEC_VERSION_MINOR as u16),
            // Not the in-tree driver; no GPUDirect.
            flags: 0,
            ..HostInfo::ZERO
        };
        copy_cstr(&mut info.os_dist_str, release);
        copy_cstr(&mut info.kernel_ver_str, version);

        let buf = Coherent::<u8>::from_slice(self.dev().as_ref(), &info.to_bytes(), GFP_KERNEL)?;
        let mut cmd = SetFeatureCmd::ZERO;
        cmd.feature_common.feature_id = FeatureId::HostInfo.raw();
        cmd.control_buffer = CtrlBuffInfo {
            length: HostInfo::SIZE as u32,
            address: MemAddr::new(buf.dma_address()),
        };
        // A device that has not answered may still read the buffer.
        self.exec_with(
            AdminOpcode::SetFeature,
            AqCommonDesc::CTRL_DATA.prep(1),
            &cmd,
            buf,
        )?;
        Ok(())
    }

    /// Creates an event queue whose ring is `ring`; returns its number.
    pub(crate) fn create_eq<M: Send + 'static>(&self, cmd: &CreateEqCmd, ring: M) -> Result<u16> {
        let (entry, _) = self
            .exec_with(AdminOpcode::CreateEq, 0, cmd, ring)
            .inspect_err(|e| dev_err!(self.dev(), "CREATE_EQ failed: {}\n", e.to_errno()))?;
        Ok(entry.resp::<CreateEqResp>().eqn)
    }

    /// Destroys event queue `eqn`.
    pub(crate) fn destroy_eq(&self, eqn: u16) -> Result {
        let cmd = DestroyEqCmd { eqn, reserved: 0 };
        self.exec(AdminOpcode::DestroyEq, 0, &cmd).map(|_| ())
    }

    /// Allocates a user access region (a doorbell page); returns its number.
    pub(crate) fn alloc_uar(&self) -> Result<u16> {
        let entry = self.exec(AdminOpcode::AllocUar, 0, &NO_PAYLOAD)?;
        Ok(entry.resp::<AllocUarResp>().uar)
    }

    /// Frees user access region `uar`.
    pub(crate) fn dealloc_uar(&self, uar: u16) -> Result {
        let cmd = DeallocUarCmd { uar, reserved: 0 };
        self.exec(AdminOpcode::DeallocUar, 0, &cmd).map(|_| ())
    }

    /// Allocates a protection domain; returns its number.
    pub(crate) fn alloc_pd(&self) -> Result<u16> {
        let entry = self.exec(AdminOpcode::AllocPd, 0, &NO_PAYLOAD)?;
        Ok(entry.resp::<AllocPdResp>().pd)
    }

    /// Frees protection domain `pd`.
    pub(crate) fn dealloc_pd(&self, pd: u16) -> Result {
        let cmd = DeallocPdCmd { pd, reserved: 0 };
        self.exec(AdminOpcode::DeallocPd, 0, &cmd).map(|_| ())
    }

    /// Creates a completion queue whose ring is `ring`.
    pub(crate) fn create_cq<M: Send + 'static>(
        &self,
        cmd: &CreateCqCmd,
        ring: M,
    ) -> Result<CreatedCq> {
        let (entry, _) = self.exec_with(AdminOpcode::CreateCq, 0, cmd, ring)?;
        let resp = entry.resp::<CreateCqResp>();
        Ok(CreatedCq {
            cq_idx: resp.cq_idx,
            depth: resp.sub_cq_actual_depth,
            doorbell: (CreateCqResp::DB_VALID.get(resp.flags) != 0).then_some(resp.db_offset),
        })
    }

    /// Reads the device-wide statistics of set `type_`.
    pub(crate) fn get_stats(&self, type_: GetStatsType) -> Result<GetStatsResp> {
        let cmd = GetStatsCmd {
            type_: type_.raw(),
            scope: GetStatsScope::All.raw(),
            ..GetStatsCmd::ZERO
        };
        let entry = self.exec(AdminOpcode::GetStats, 0, &cmd)?;
        Ok(entry.resp::<GetStatsResp>())
    }

    /// Creates a queue pair whose receive ring is `rq_ring`.
    pub(crate) fn create_qp<M: Send + 'static>(
        &self,
        cmd: &CreateQpCmd,
        rq_ring: M,
    ) -> Result<CreateQpResp> {
        let (entry, _) = self.exec_with(AdminOpcode::CreateQp, 0, cmd, rq_ring)?;
        Ok(entry.resp::<CreateQpResp>())
    }

    /// Changes the state and attributes of a queue pair.
    pub(crate) fn modify_qp(&self, cmd: &ModifyQpCmd) -> Result {
        self.exec(AdminOpcode::ModifyQp, 0, cmd).map(|_| ())
    }

    /// Reads the state and attributes of queue pair `qp_handle`.
    pub(crate) fn query_qp(&self, qp_handle: u32) -> Result<QueryQpResp> {
        let entry = self.exec(AdminOpcode::QueryQp, 0, &QueryQpCmd { qp_handle })?;
        Ok(entry.resp::<QueryQpResp>())
    }

    /// Destroys queue pair `qp_handle`.
    pub(crate) fn destroy_qp(&self, qp_handle: u32) -> Result {
        self.exec(AdminOpcode::DestroyQp, 0, &DestroyQpCmd { qp_handle })
            .map(|_| ())
    }

    /// Destroys completion queue `cq_idx`.
    pub(crate) fn destroy_cq(&self, cq_idx: u16) -> Result {
        let cmd = DestroyCqCmd {
            cq_idx,
            reserved1: 0,
        };
        self.exec(AdminOpcode::DestroyCq, 0, &cmd).map(|_| ())
    }

    /// The admin interrupt: admin completions, then asynchronous events.
    fn handle_admin_interrupt(&self) {
        if self.admin.handle_interrupt(self.dev()) {
            self.fail(Cause::InterruptStorm {
                queue: StormQueue::AdminCompletions,
            });
        }
        self.drain_aenq();
    }

    /// Handles the events the device posted, at most a ring's worth: the
    /// device may post no further than the consumer doorbell allows, and
    /// one that flips phase bits as fast as they are consumed must not
    /// keep the interrupt handler going for ever. The rest waits for the
    /// next interrupt; a device that keeps this up fails ([`StormWatch`]).
    fn drain_aenq(&self) {
        let mut consumer = self.aenq.consumer.lock();
        let start = consumer.pos;
        let mut pos = start;
        for _ in 0..pos.depth() {
            let Ok(Some(event)) = self.aenq.next(pos) else {
                break;
            };
            pos = pos.advanced(1);
            self.handle_event(&event.aenq_common_desc);
        }
        consumer.pos = pos;
        let over_budget =
            pos.distance_from(start) == pos.depth() && matches!(self.aenq.next(pos), Ok(Some(_)));
        if over_budget {
            dev_err_ratelimited!(
                self.dev(),
                "more than {} AENQ events at once; the rest waits\n",
                pos.depth()
            );
        }
        if pos != start {
            self.regs.write(hwregs::AENQ_CONS_DB_OFF, pos.counter());
        }
        let storm = consumer.storm.pass(over_budget, Instant::now());
        drop(consumer);
        if storm {
            self.fail(Cause::InterruptStorm {
                queue: StormQueue::Aenq,
            });
        }
    }

    fn handle_event(&self, event: &AenqCommonDesc) {
        match AenqGroup::from_raw(event.group) {
            Some(AenqGroup::KeepAlive) => self.watchdog.keep_alive(),
            Some(AenqGroup::FatalError) => self.fail(Cause::FatalError {
                syndrome: event.syndrome,
            }),
            Some(AenqGroup::Warning) => {
                dev_warn_ratelimited!(
                    self.dev(),
                    "device warning (syndrome {:#x})\n",
                    event.syndrome
                )
            }
            Some(AenqGroup::Notification) => {
                dev_info_ratelimited!(
                    self.dev(),
                    "device notification (syndrome {:#x})\n",
                    event.syndrome
                )
            }
            None => dev_warn_ratelimited!(self.dev(), "event of unknown group {}\n", event.group),
        }
    }
}

/// The payload of commands that have none.
const NO_PAYLOAD: [u8; 0] = [];

/// Copies `src` into the C string buffer `dst`, truncated, NUL-terminated.
fn copy_cstr(dst: &mut [u8], src: &CStr) {
    let bytes = src.to_bytes();
    let len = bytes.len().min(dst.len().saturating_sub(1));
    dst[..len].copy_from_slice(&bytes[..len]);
    dst[len..].fill(0);
}

/// The admin interrupt handler (MSI-X vector 0).
pub(crate) struct AdminIrq<'a> {
    core: Arc<Core<'a>>,
}

impl irq::Handler for AdminIrq<'_> {
    fn handle(&self) -> IrqReturn {
        self.core.handle_admin_interrupt();
        IrqReturn::Handled
    }
}

/// A device whose queues are live: the device may write to their memory
/// and raise the admin interrupt.
///
/// Dropping it resets the device, giving the reason the driver set, then
/// unregisters the admin interrupt handler. Only then can the queues'
/// memory go.
pub(crate) struct Running<'a> {
    core: Arc<Core<'a>>,
    reset_reason: ResetReason,
    // Dropped after the reset in `drop()`.
    admin_irq: Option<Pin<KBox<IrqVectorHandler<'a, AdminIrq<'a>>>>>,
    watchdog: Option<WatchdogHandle>,
}

impl<'a> Running<'a> {
    /// The queues of `core` just went live. Until [`Self::probe_done`], a
    /// drop reports an initialisation error in its reset.
    pub(crate) fn new(core: Arc<Core<'a>>) -> Self {
        Self {
            core,
            reset_reason: ResetReason::InitErr,
            admin_irq: None,
            watchdog: None,
        }
    }

    /// Registers the admin interrupt handler on vector 0 and leaves polling
    /// mode.
    pub(crate) fn enable_admin_interrupt(
        &mut self,
        vectors: &Arc<pci::IrqVectorRegistration<'a>>,
    ) -> Result {
        // SAFETY: The handler is stored in `self.admin_irq`; `Running` lives in
        // the device's incarnation (`Live`) in the bound device's driver data
        // and drops it when recovery ends the incarnation or at unbind, after
        // the EQs and after the reset; nothing leaks it. No cycle keeps it alive
        // either: the handler's `Arc<Core>` points at the `Core`, which holds
        // no `Running`.
        let irq = unsafe {
            IrqVectorHandler::new(
                vectors,
                hwregs::MGMNT_MSIX_VEC_IDX.into(),
                irq::Flags::TRIGGER_NONE,
                c"refa-mgmnt",
                Ok::<_, Error>(AdminIrq {
                    core: self.core.clone(),
                }),
            )
        };
        let irq = KBox::pin_init(irq, GFP_KERNEL)?;
        // The first CPU, as the C driver; a failure leaves the interrupt
        // where it was, as in efa.ko.
        let _ = irq.spread_affinity(0);
        self.admin_irq = Some(irq);
        self.core.admin().set_polling(self.core.regs(), false);
        Ok(())
    }

    /// Starts the keep-alive watchdog; it stops before the reset.
    pub(crate) fn start_watchdog(&mut self) {
        self.watchdog = Some(self.core.watchdog().start());
    }

    /// Probe succeeded: a later reset is a normal one.
    pub(crate) fn probe_done(&mut self) {
        self.reset_reason = ResetReason::Normal;
    }

    /// The reset that ends this incarnation gives `reason`.
    pub(crate) fn set_reset_reason(&mut self, reason: ResetReason) {
        self.reset_reason = reason;
    }

    /// The system is going down (reboot, poweroff, kexec) with the device
    /// bound: resets it with reason `SHUTDOWN`, so that it stops DMA into
    /// memory the next kernel or the firmware owns, as the C driver does.
    ///
    /// Everything else stays as it is, so that an unbind that may still
    /// follow tears down as usual (its own reset is then a second one):
    /// the admin queue takes no command from here on, so verbs still
    /// running fail with `ENODEV` once the reset is acknowledged, and a
    /// teardown's commands fail at once, keeping their memory until that
    /// reset. The C driver also destroys its event
    /// queues first and frees its interrupts; the reset ends the event
    /// queues on the device, and a reset device raises no interrupts.
    pub(crate) fn shutdown(&self) {
        // No command goes out from now on; those in flight go on waiting
        // until the reset is acknowledged, so that nobody frees what they
        // handed the device while it may still act on it (a queue marked
        // dead first would fail them at once, before the reset).
        self.core.admin().sync().close();
        let acknowledged = self.reset(ResetReason::Shutdown);
        self.core.admin().after_device_reset(acknowledged);
    }

    /// Resets the device giving `reason`; returns whether it acknowledged
    /// the reset. If it did not, its bus mastering goes off here, before
    /// anything it was given can be freed: the queues' memory goes with
    /// the `Core`, after this, and so does what was kept until a reset.
    fn reset(&self, reason: ResetReason) -> bool {
        match self.core.regs().reset(reason) {
            Ok(_) => true,
            Err(e) => {
                dev_err!(
                    self.core.dev(),
                    "device reset ({:?}) failed: {}; turning its bus mastering off\n",
                    reason,
                    e.to_errno()
                );
                self.core.regs().stop_dma();
                false
            }
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        // A dead device stays dead: stop watching before the reset.
        drop(self.watchdog.take());
        let acknowledged = self.reset(self.reset_reason);
        self.core.admin().after_device_reset(acknowledged);
    }
}
