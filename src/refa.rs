// SPDX-License-Identifier: GPL-2.0

//! refa: a driver for devices with the Elastic Fabric Adapter interface.
//!
//! Binds EFA PCI functions, brings them up through their admin queue and
//! registers them with the RDMA core, speaking the uAPI of
//! `include/uapi/rdma/efa-abi.h` so that rdma-core's `efa` provider works
//! unchanged.
//!
//! - [`hw`]: the device interface (registers, admin commands, events), shared
//!   with the device model.
//! - `dev`: the device below the RDMA layer: registers, admin queue, AENQ,
//!   keep-alive watchdog, event queues.
//! - `ib`: the RDMA device the verbs see: the driver of the abstractions.
//! - `rdma`: the abstractions over the C RDMA core, which know nothing of
//!   EFA.
//! - `kernel_gaps`: what the 7.3 kernel crate lacks (the device lock taken
//!   outside a bus callback, `FromBytes`/`AsBytes` for C structures, the
//!   kernel version; out of tree also what the series' rust/kernel patches
//!   add, such as interrupt handlers on shared vectors and rate-limited
//!   printing).
//!
//! `unsafe` code lives in `rdma` and `kernel_gaps`, except where the
//! driver takes on a contract of the kernel's that no type can carry for
//! it, each at the one place that can keep it: the DMA mask (probe, before
//! anything else uses the device), the RDMA device's registration (kept in
//! the bound device's driver data, like a DRM registration), the two
//! interrupt registrations in `dev` (the contract of
//! `pci::IrqVectorHandler::new`, that of `irq::Registration::new`, which
//! has no safe form in 7.3), and the
//! driver data borrowed under the device lock by the recovery work
//! (`recovery`, the one place that knows the binding is still there).

use kernel::{
    device::{
        Bound,
        Core, //
    },
    dma::{
        Device as _,
        DmaMask, //
    },
    io::resource::Flags,
    new_mutex,
    pci,
    prelude::*,
    str::CString,
    sync::{
        Arc,
        Mutex, //
    },
    time::Delta, //
};

mod dev;
mod ib;
mod kernel_gaps;
mod recovery;
// in tree: use kernel::rdma;
// out of tree: begin
mod rdma;
// out of tree: end
mod ring;

pub mod hw;

use dev::{
    eq::EventQueue,
    features::{
        DeviceAttrs,
        Hints, //
    },
    regs::{
        Caps,
        Regs, //
    },
    Core as DeviceCore,
    Running, //
};
use hw::{
    admin::FeatureId,
    regs::{
        self as hwregs,
        ResetReason, //
    }, //
};
use ib::BarWindow;
// in tree: use kernel::pci::{
// in tree:     BarRegion,
// in tree:     EnabledDevice, //
// in tree: };
// out of tree: begin
use kernel_gaps::dma::DeviceExt as _;
use kernel_gaps::pci::{
    BarRegion,
    BoundExt as _,
    CoreExt as _,
    EnabledDevice,
    ShutdownAdapter,
    ShutdownDriver, //
};
// out of tree: end
use rdma::{
    completion::CompletionTable,
    registration::{
        Registration,
        UnregisteredDevice, //
    }, //
};
use recovery::{
    Health,
    HealthGuard,
    Step, //
};

/// Largest event queue the driver creates: its ring positions count in 16
/// bits.
const MAX_EQ_DEPTH: u32 = 1 << 15;

struct RefaDriver;

/// The completion event queues of a device, torn down last to first.
struct EventQueues<'a>(KVec<EventQueue<'a, CompletionTable>>);

impl Drop for EventQueues<'_> {
    fn drop(&mut self) {
        while let Some(eq) = self.0.pop() {
            drop(eq);
        }
    }
}

/// What probe built for a bound EFA function: the PCI driver's data.
///
/// It has two parts. What a device's recovery keeps (the health and its
/// work item, the enabled function, the register BAR and its readless
/// buffer, the reserved BARs, the MSI-X vectors) lives as long as the
/// binding. The device's current incarnation ([`Live`]: the RDMA
/// registration, the event queues, the running admin queue and the
/// interrupt handlers on the vectors) sits in `live`, which recovery
/// empties and fills again, under the device lock (`crate::recovery`).
///
/// Fields are in teardown order, the reverse of bring-up: probe builds
/// them in the opposite order, and a probe that fails drops what it built
/// so far the same way. `health` goes first: once it is stopped nothing
/// rebuilds `live`, and no recovery runs after the binding.
struct Binding<'bound> {
    health: HealthGuard,
    live: Pin<KBox<Mutex<Incarnation<'bound>>>>,
    doorbells: Arc<BarRegion<'bound>>,
    llq: Option<Arc<BarRegion<'bound>>>,
    regs: Arc<Regs<'bound>>,
    vectors: Arc<pci::IrqVectorRegistration<'bound>>,
    _enabled: EnabledDevice<'bound>,
    /// What the first incarnation found, which later ones must match.
    first: FirstUp,
}

/// What the first bring-up (probe's) found.
struct FirstUp {
    attrs: DeviceAttrs,
    dma_addr_width: u32,
}

/// The slot of the device's current incarnation.
struct Incarnation<'bound> {
    /// `None` while the device is torn down after a failure, or stays
    /// down.
    live: Option<Live<'bound>>,
    /// The name of the RDMA device of the last incarnation torn down, which
    /// the next one is registered under.
    name: Option<CString>,
}

/// One incarnation of the device, in teardown order: the RDMA device is
/// unregistered (every user context disassociated, its objects
/// destroyed), then the event queues go, then the device is reset; only
/// then does the memory it was given (queues, kept buffers) go, with the
/// last reference on the `Core`.
struct Live<'bound> {
    ib: Registration<'bound, ib::RdmaDriver>,
    eqs: EventQueues<'bound>,
    running: Running<'bound>,
}

/// A device brought up to just before its RDMA registration.
///
/// Fields in teardown order: the event queues before the running admin
/// queue, whose drop resets the device.
struct Started<'bound> {
    eqs: EventQueues<'bound>,
    running: Running<'bound>,
    core: Arc<DeviceCore<'bound>>,
    attrs: DeviceAttrs,
    eqns: KVec<u16>,
    cq_events: Arc<CompletionTable>,
}

/// The PCI id of EFA device `device`.
const fn efa_id(device: u16) -> pci::DeviceId {
    pci::DeviceId::from_id(pci::Vendor::AMAZON, device as u32)
}

kernel::pci_device_table!(
    PCI_TABLE,
    <RefaDriver as pci::Driver>::IdInfo,
    [
        (efa_id(hwregs::PCI_DEV_ID_EFA0_VF), ()),
        (efa_id(hwregs::PCI_DEV_ID_EFA1_VF), ()),
        (efa_id(hwregs::PCI_DEV_ID_EFA2_VF), ()),
        (efa_id(hwregs::PCI_DEV_ID_EFA3_VF), ()),
        (efa_id(hwregs::PCI_DEV_ID_EFA4_VF), ()),
    ]
);

impl pci::Driver for RefaDriver {
    type IdInfo = ();
    type Data<'bound> = Binding<'bound>;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        Binding::probe(pdev)
    }

    // in tree: fn shutdown<'bound>(_: &'bound pci::Device<Core<'_>>, this: Pin<&Binding<'bound>>) {
    // in tree:     this.shutdown();
    // in tree: }
}

// out of tree: begin
// 7.3's `pci::Driver` has no `shutdown`; the kernel gap's trait adds it.
impl ShutdownDriver for RefaDriver {
    fn shutdown<'bound>(_: &'bound pci::Device<Core<'_>>, this: Pin<&Binding<'bound>>) {
        this.shutdown();
    }
}
// out of tree: end

/// Refuses a device whose BAR `bar` is not memory space: its "addresses"
/// would be port numbers, and the pages userspace maps from them RAM.
fn require_memory_bar(pdev: &pci::Device<Bound>, bar: u32) -> Result {
    if pdev.resource(bar)?.flags().contains(Flags::IORESOURCE_MEM) {
        return Ok(());
    }
    dev_err!(
        pdev,
        "BAR {} is not memory space; refusing the device\n",
        bar
    );
    Err(ENODEV)
}

impl<'bound> Binding<'bound> {
    fn probe(pdev: &'bound pci::Device<Core<'_>>) -> Result<Self> {
        let bound: &'bound pci::Device<Bound> = pdev;
        // First, so that it is dropped last: a probe that fails stops it.
        let health = HealthGuard(Health::new(bound)?);
        let enabled = pdev.enable_device_mem_guard()?;
        pdev.set_master();
        require_memory_bar(bound, hwregs::REG_BAR.into())?;
        let bar = bound.iomap_region_sized(hwregs::REG_BAR.into(), c"refa")?;
        let regs = Arc::pin_init(Regs::new(bound, bar)?, GFP_KERNEL)?;

        // A device slow to come out of reset may be ready later.
        let caps = regs.reset(ResetReason::Normal).map_err(|e| {
            if e == ETIMEDOUT {
                EPROBE_DEFER
            } else {
                e
            }
        })?;
        let api_version = check_versions(&regs)?;
        if !(hwregs::MIN_DMA_ADDR_WIDTH..=hwregs::MAX_DMA_ADDR_WIDTH).contains(&caps.dma_addr_width)
        {
            dev_err!(
                pdev,
                "device reports a DMA width of {} bits\n",
                caps.dma_addr_width
            );
            return Err(EINVAL);
        }
        let mask = DmaMask::try_new(caps.dma_addr_width)?;
        // SAFETY: The kernel's contract is that no DMA allocation or mapping
        // for the device runs concurrently. Nothing of this driver runs for
        // the device on another thread yet: no interrupt handler is
        // registered, no RDMA device, no recovery (`health` is not up), and
        // no other code has the bound device (probe holds the device lock).
        // The one DMA allocation so far, the readless-read response buffer
        // (`Regs::new`, needed to read the DMA width at all), was made by
        // this thread, before, under the default 32-bit mask and segment
        // limits, which this only widens.
        unsafe {
            pdev.dma_set_mask_and_coherent(mask)?;
            // The device is given page lists, never scatter-gather segments:
            // the DMA layer's 64 KiB default would only make exporters of
            // dma-bufs it maps split (and DMA-API debugging complain about)
            // longer ones. For the same reason it has no 4 GiB segment
            // boundary: `ib_umem_get()` merges contiguous pages up to the
            // maximum segment size whatever the boundary, so keeping it would
            // declare a limit not kept, which DMA-API debugging reports.
            pdev.dma_set_max_seg_size(u32::MAX);
            pdev.dma_set_seg_boundary(DmaMask::new::<64>());
        }

        // The admin vector and one per CPU for completion events, as the C
        // driver asks (it counts online CPUs, which the kernel crate does
        // not expose; possible CPUs are at least as many).
        let msix = pci::IrqTypes::default().with(pci::IrqType::MsiX);
        let vectors = bound.alloc_irq_vectors(1, kernel::cpu::nr_cpu_ids() + 1, msix)?;
        let vectors = Arc::new(vectors, GFP_KERNEL)?;
        let started = Started::bring_up(&regs, &vectors, caps, api_version, &health.0)?;

        // Userspace maps its doorbell pages from this BAR; the kernel never
        // touches them.
        let db_bar = started.attrs.device.db_bar;
        require_memory_bar(bound, db_bar.into())?;
        let doorbells = Arc::new(bound.request_region(db_bar.into(), c"refa")?, GFP_KERNEL)?;
        // Send queues (LLQs) are in the memory BAR, which DEVICE_ATTR does
        // not name: it is always BAR 2, as for the C driver. The device may
        // put its doorbells there too (efa-emu does), then it is reserved
        // once.
        let llq = if db_bar == u16::from(hwregs::MEM_BAR) {
            None
        } else {
            require_memory_bar(bound, hwregs::MEM_BAR.into())?;
            let llq = bound.request_region(hwregs::MEM_BAR.into(), c"refa")?;
            Some(Arc::new(llq, GFP_KERNEL)?)
        };
        let first = FirstUp {
            attrs: started.attrs,
            dma_addr_width: caps.dma_addr_width,
        };
        let (doorbell_bar, llq_bar) = bar_windows(&doorbells, llq.as_ref())?;
        let mut live = started.register(bound, doorbell_bar, llq_bar, c"refa_%d")?;
        live.running.probe_done();
        dev_info!(
            pdev,
            "{}: EFA API {}.{}, {} event queues\n",
            live.ib.device().name(),
            hwregs::VERSION_MAJOR_VERSION.get(api_version),
            hwregs::VERSION_MINOR_VERSION.get(api_version),
            live.eqs.0.len()
        );
        let live = KBox::pin_init(
            new_mutex!(
                Incarnation {
                    live: Some(live),
                    name: None,
                },
                "refa_live"
            ),
            GFP_KERNEL,
        )?;
        // Failures reach recovery from here on.
        health.0.up();

        Ok(Self {
            health,
            live,
            doorbells,
            llq,
            regs,
            vectors,
            _enabled: enabled,
            first,
        })
    }

    /// The system is going down: no recovery any more, and the device is
    /// reset (`Running::shutdown`).
    fn shutdown(&self) {
        self.health.0.stop();
        if let Some(live) = &self.live.lock().live {
            live.running.shutdown();
        }
    }

    /// The recovery work of `health`, under the device lock with the
    /// device `pdev` bound to this binding: the next steps of the
    /// recovery, as far as they can go now.
    fn recover(&'bound self, pdev: &'bound pci::Device<Core<'_>>, health: &Arc<Health>) {
        if !health.is(&self.health.0) {
            return;
        }
        while let Some(step) = health.step() {
            match step {
                Step::TearDown(cause) => self.tear_down(cause),
                Step::BringUp => match self.bring_up_again(pdev, health) {
                    Ok(()) => return,
                    Err(e) => dev_err!(
                        pdev,
                        "bringing the device up again failed: {}\n",
                        e.to_errno()
                    ),
                },
            }
            if self.regs.dma_stopped() {
                // No bring-up can turn bus mastering on again safely.
                return health.stay_down();
            }
            match health.after_failure() {
                None => return,
                Some(delay) if delay.is_zero() => {}
                Some(delay) => return health.retry_after(delay),
            }
        }
    }

    /// Ends the failed incarnation: unregisters the RDMA device (users get
    /// `IBV_EVENT_DEVICE_FATAL`, their contexts are disassociated), then
    /// resets the device giving `cause`, then frees what it was given.
    fn tear_down(&self, cause: recovery::Cause) {
        let mut slot = self.live.lock();
        let Some(mut live) = slot.live.take() else {
            return;
        };
        // Registered again under the same name; without memory for it,
        // under the next free `refa_N`.
        slot.name = CString::try_from_fmt(fmt!("{}", live.ib.device().name())).ok();
        live.running.set_reset_reason(cause.reset_reason());
        drop(live);
    }

    /// Brings the device up as probe did, with the same attributes, and
    /// registers it under the name it had.
    fn bring_up_again(
        &'bound self,
        pdev: &'bound pci::Device<Core<'_>>,
        health: &Arc<Health>,
    ) -> Result {
        let bound: &'bound pci::Device<Bound> = pdev;
        if self.regs.dma_stopped() {
            // A reset went unacknowledged: bus mastering is off, and the
            // device may still hold addresses of memory freed since.
            return Err(EIO);
        }
        let caps = self
            .regs
            .reset(ResetReason::Normal)
            .inspect_err(|_| self.regs.stop_dma())?;
        let api_version = check_versions(&self.regs)?;
        if caps.dma_addr_width != self.first.dma_addr_width {
            dev_err!(
                pdev,
                "device came back with a DMA width of {} bits, not {}\n",
                caps.dma_addr_width,
                self.first.dma_addr_width
            );
            return Err(EINVAL);
        }
        let started = Started::bring_up(&self.regs, &self.vectors, caps, api_version, health)?;
        if started.attrs != self.first.attrs {
            dev_err!(pdev, "device came back with other attributes\n");
            return Err(EINVAL);
        }
        let name = self.live.lock().name.take();
        let (doorbell_bar, llq_bar) = bar_windows(&self.doorbells, self.llq.as_ref())?;
        let mut live = started.register(
            bound,
            doorbell_bar,
            llq_bar,
            name.as_deref().unwrap_or(c"refa_%d"),
        )?;
        live.running.probe_done();
        let name = CString::try_from_fmt(fmt!("{}", live.ib.device().name()));
        self.live.lock().live = Some(live);
        if let (Some(took), Ok(name)) = (health.up(), name) {
            health.log_recovered(&name, took);
        }
        Ok(())
    }
}

/// The doorbell BAR and the LLQ BAR (the same when the device has its
/// doorbells there), for the verbs.
fn bar_windows<'a>(
    doorbells: &Arc<BarRegion<'a>>,
    llq: Option<&Arc<BarRegion<'a>>>,
) -> Result<(BarWindow<'a>, BarWindow<'a>)> {
    let doorbell_bar = BarWindow::new(doorbells)?;
    let llq_bar = match llq {
        Some(llq) => BarWindow::new(llq)?,
        None => doorbell_bar.clone(),
    };
    Ok((doorbell_bar, llq_bar))
}

impl<'bound> Started<'bound> {
    /// Brings up a device just reset (which said `caps`, with API version
    /// `api_version`) behind `regs`: admin queue, interrupt handler, AENQ,
    /// features, watchdog, event queues, host information. A new
    /// incarnation of `health`'s device.
    fn bring_up(
        regs: &Arc<Regs<'bound>>,
        vectors: &Arc<pci::IrqVectorRegistration<'bound>>,
        caps: Caps,
        api_version: u32,
        health: &Arc<Health>,
    ) -> Result<Self> {
        let admin_timeout = caps.admin_timeout.unwrap_or(Delta::from_micros(
            hwregs::DEFAULT_ADMIN_CMD_TIMEOUT_US.into(),
        ));
        let core = DeviceCore::new(regs.clone(), api_version, admin_timeout, health.starting())?;
        let mut running = Running::new(core.clone());
        running.enable_admin_interrupt(vectors)?;

        let attrs = DeviceAttrs::query(&core)?;
        let supported = attrs.device.supported_features;
        if let Some(resp) = core.get_optional_feature(FeatureId::HwHints, supported)? {
            let hints = Hints::from(resp.hw_hints());
            if let Some(timeout) = hints.mmio_read_timeout {
                core.regs().set_read_timeout(timeout);
            }
            core.admin()
                .set_timeouts(hints.admin_timeout, hints.poll_interval);
            core.watchdog().set_device_limit(hints.watchdog_timeout);
        }
        core.enable_aenq_groups(supported)?;
        running.start_watchdog();

        let cq_events = Arc::pin_init(CompletionTable::new(), GFP_KERNEL)?;
        let eqs = create_event_queues(&core, vectors, &attrs, &cq_events)?;
        let mut eqns = KVec::with_capacity(eqs.0.len(), GFP_KERNEL)?;
        for eq in &eqs.0 {
            eqns.push(eq.eqn(), GFP_KERNEL)?;
        }
        if attrs.supports(FeatureId::HostInfo) {
            core.set_host_info();
        }
        Ok(Self {
            eqs,
            running,
            core,
            attrs,
            eqns,
            cq_events,
        })
    }

    /// Registers the RDMA device as `name` (a name, or a pattern such as
    /// `refa_%d`), with its doorbell and LLQ BARs.
    fn register(
        mut self,
        bound: &'bound pci::Device<Bound>,
        doorbell_bar: BarWindow<'bound>,
        llq_bar: BarWindow<'bound>,
        name: &CStr,
    ) -> Result<Live<'bound>> {
        // On failure `self` drops in its fields' order: the event queues,
        // then the running admin queue.
        let mut ib = UnregisteredDevice::<ib::RdmaDriver>::new(bound.as_ref())?;
        ib.set_node_guid(self.attrs.device.guid);
        ib.set_num_comp_vectors((self.eqns.len() as u32).max(1));
        let eqns = core::mem::replace(&mut self.eqns, KVec::new());
        let data = ib::VerbsData::new(
            self.core.clone(),
            self.attrs,
            eqns,
            self.cq_events.clone(),
            doorbell_bar,
            llq_bar,
        );
        // SAFETY: The registration goes into the returned `Live`, which is
        // kept in the `Binding`, the driver data of the bound device, until
        // recovery or the PCI core drops it (at unbind), or dropped here on
        // a later failure; nothing forgets it.
        let ib = unsafe { Registration::new(bound.as_ref(), ib, name, Ok::<_, Error>(data)) }?;
        Ok(Live {
            ib,
            eqs: self.eqs,
            running: self.running,
        })
    }
}

/// Checks that the driver speaks the device's versions; returns the
/// device's API version (`VERSION`).
fn check_versions(regs: &Regs<'_>) -> Result<u32> {
    let version = regs.read(hwregs::VERSION_OFF)?;
    let controller = regs.read(hwregs::CONTROLLER_VERSION_OFF)?;
    if version < hwregs::MIN_API_VERSION {
        dev_err!(
            regs.device(),
            "device API version {}.{} is older than the driver supports\n",
            hwregs::VERSION_MAJOR_VERSION.get(version),
            hwregs::VERSION_MINOR_VERSION.get(version)
        );
        return Err(EOPNOTSUPP);
    }
    // Compared as a version, without the implementation id. (The C driver
    // ORs the three parts together, which only asks for one to be non-zero.)
    let controller = controller & !hwregs::CONTROLLER_VERSION_IMPL_ID.mask();
    if controller < hwregs::MIN_CTRL_VERSION {
        dev_err!(
            regs.device(),
            "device controller version {:#x} is older than the driver supports\n",
            controller
        );
        return Err(EOPNOTSUPP);
    }
    Ok(version)
}

/// Creates one event queue per MSI-X vector after the admin one, as many as
/// the device allows.
fn create_event_queues<'a>(
    core: &Arc<DeviceCore<'a>>,
    vectors: &Arc<pci::IrqVectorRegistration<'a>>,
    attrs: &DeviceAttrs,
    cq_events: &Arc<CompletionTable>,
) -> Result<EventQueues<'a>> {
    let mut eqs = EventQueues(KVec::new());
    let Some(limits) = attrs.event_queues else {
        return Ok(eqs);
    };
    let count = (vectors.len() - 1).min(limits.max_eq as usize);
    // The device's largest depth, rounded down to what the rings handle.
    let depth = limits.max_eq_depth.min(MAX_EQ_DEPTH);
    if depth == 0 {
        return Ok(eqs);
    }
    let depth = 1u16 << depth.ilog2();
    for i in 0..count {
        let vector = hwregs::COMP_EQS_VEC_BASE + i as u16;
        let eq = EventQueue::new(core, vectors, vector, depth, cq_events)?;
        eqs.0.push(eq, GFP_KERNEL)?;
    }
    Ok(eqs)
}

// in tree: kernel::module_pci_driver! {
// out of tree: begin
// `module_pci_driver!`, with the `shutdown` callback 7.3's `pci::Driver`
// lacks.
kernel::module_driver!(<T>, ShutdownAdapter<T>, {
// out of tree: end
    type: RefaDriver,
    name: "refa",
    authors: ["The refa developers"],
    description: "Rust driver for Elastic Fabric Adapter devices",
    license: "GPL",
    params: {
        recovery: bool {
            default: true,
            description: "Recover a device that fails; 0: it stays down until unbound and bound",
        },
        recovery_window: u32 {
            default: 60,
            description: "Seconds (at least 1) in which 8 failures leave a device down",
        },
    },
// in tree: }
// out of tree: begin
});
// out of tree: end
