// SPDX-License-Identifier: GPL-2.0

//! What the verbs know of the device: the data of the RDMA device's
//! registration, which every operation gets.

use super::RdmaDriver;
use crate::{
    dev::{
        features::DeviceAttrs,
        lifetime::ObjectId,
        Core, //
    },
    rdma::{
        cgroup::HcaCharge,
        completion::CompletionTable,
        device::Device, //
    },
};
// in tree: use kernel::io::IoPages;
// out of tree: begin
use crate::kernel_gaps::ratelimit::dev_err_ratelimited;
// out of tree: end
// in tree: use kernel::pci::BarRegion;
// out of tree: begin
use crate::kernel_gaps::pci::{
    BarRegion,
    IoPages, //
};
// out of tree: end
use kernel::{
    io::resource::Flags,
    prelude::*,
    sync::{
        atomic::{
            ordering::Relaxed,
            Atomic, //
        },
        Arc, //
    }, //
};

/// The device as the verbs see it.
pub(crate) struct VerbsData<'a> {
    pub(super) core: Arc<Core<'a>>,
    pub(super) attrs: DeviceAttrs,
    /// The completion event queues, by completion vector.
    pub(super) eqns: KVec<u16>,
    /// The CQs the event queues' interrupt handlers deliver events to.
    pub(super) cq_events: Arc<CompletionTable>,
    pub(super) vendor_id: u16,
    pub(super) device_id: u16,
    pub(super) subsystem_device_id: u16,
    /// The BAR with the doorbell pages.
    pub(super) doorbell_bar: BarWindow<'a>,
    /// The BAR with the send queues (LLQs).
    pub(super) llq_bar: BarWindow<'a>,
    pub(super) errors: VerbErrors,
}

impl<'a> VerbsData<'a> {
    /// The device behind `core`, with `attrs`, the event queues `eqns` (one
    /// per completion vector) that deliver events to `cq_events`, its
    /// doorbell BAR and its LLQ BAR.
    pub(crate) fn new(
        core: Arc<Core<'a>>,
        attrs: DeviceAttrs,
        eqns: KVec<u16>,
        cq_events: Arc<CompletionTable>,
        doorbell_bar: BarWindow<'a>,
        llq_bar: BarWindow<'a>,
    ) -> Self {
        let pdev = core.dev();
        Self {
            doorbell_bar,
            llq_bar,
            errors: VerbErrors::new(),
            vendor_id: pdev.vendor_id().as_raw(),
            device_id: pdev.device_id(),
            subsystem_device_id: pdev.subsystem_device_id(),
            core,
            attrs,
            eqns,
            cq_events,
        }
    }

    /// The number of completion event queues.
    pub(super) fn eqs(&self) -> u32 {
        self.eqns.len() as u32
    }
}

impl VerbsData<'_> {
    /// The pages of `bar` that hold the `len` bytes at `offset`, where the
    /// device placed `what`: `EIO` if they are not all inside the BAR (else
    /// userspace would map whatever follows it), which is logged.
    pub(super) fn device_pages(
        &self,
        bar: &BarWindow<'_>,
        what: &str,
        offset: u32,
        len: u64,
    ) -> Result<IoPages> {
        bar.page(offset.into(), len).inspect_err(|_| {
            dev_err_ratelimited!(
                self.core.dev(),
                "the device placed a {} at {:#x} (+{}), outside its BAR ({:#x} bytes)\n",
                what,
                offset,
                len,
                bar.len()
            )
        })
    }

    /// For a user's destroy of the verbs object of `id`, which the device
    /// keeps after it because others still hold it there (a QP whose send
    /// queue userspace maps uses it): charges it to the rdma cgroup of the
    /// destroying task for as long as it is kept, or refuses the destroy
    /// (`EBUSY`, nothing changed) if that cgroup is at its `hca_object`
    /// limit. Nothing to charge for an object nobody else holds.
    pub(super) fn charge_if_kept(&self, dev: &Device<RdmaDriver>, id: ObjectId) -> Result {
        if self.core.holders(id) <= 1 {
            return Ok(());
        }
        let charge = HcaCharge::try_new(dev).map_err(|_| EBUSY)?;
        self.core.charge_kept(id, charge);
        Ok(())
    }
}

/// A memory BAR the driver reserved, from which pages are handed to
/// userspace ([`BarWindow::page`]). The verbs share the reservation with
/// the binding, which keeps the BAR reserved as long as anything may still
/// hand out its pages.
#[derive(Clone)]
pub(crate) struct BarWindow<'a>(Arc<BarRegion<'a>>);

impl<'a> BarWindow<'a> {
    /// The BAR `region` reserved: `ENODEV` unless it is memory space. A
    /// device declares each BAR's kind in its config space; the start of
    /// one it declares I/O space is a port number, not the physical address
    /// of anything: mapping it as pages would map RAM.
    pub(crate) fn new(region: &Arc<BarRegion<'a>>) -> Result<Self> {
        if !region.resource().flags().contains(Flags::IORESOURCE_MEM) {
            return Err(ENODEV);
        }
        Ok(Self(region.clone()))
    }

    /// Length of the BAR in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.0.resource().size()
    }

    /// The whole pages of the BAR that hold the `len` bytes at `offset`
    /// (a place the device named, say): `EIO` unless every byte of those
    /// pages is inside the BAR.
    pub(crate) fn page(&self, offset: u64, len: u64) -> Result<IoPages> {
        let page = kernel::page::PAGE_SIZE as u64;
        let first = offset & !(page - 1);
        let end = offset.checked_add(len.max(1)).ok_or(EIO)?;
        let end = end.checked_next_multiple_of(page).ok_or(EIO)?;
        let len = usize::try_from(end - first).map_err(|_| EIO)?;
        self.0.io_pages(first, len).map_err(|_| EIO)
    }
}

/// Failed verbs, by kind, for the statistics.
pub(super) struct VerbErrors {
    pub(super) alloc_ucontext: Atomic<u64>,
    pub(super) alloc_pd: Atomic<u64>,
    pub(super) create_cq: Atomic<u64>,
    pub(super) create_qp: Atomic<u64>,
    pub(super) reg_mr: Atomic<u64>,
    pub(super) create_ah: Atomic<u64>,
    pub(super) mmap: Atomic<u64>,
}

impl VerbErrors {
    pub(super) const fn new() -> Self {
        Self {
            alloc_ucontext: Atomic::new(0),
            alloc_pd: Atomic::new(0),
            create_cq: Atomic::new(0),
            create_qp: Atomic::new(0),
            reg_mr: Atomic::new(0),
            create_ah: Atomic::new(0),
            mmap: Atomic::new(0),
        }
    }
}

/// Counts a failure of a verb in `counter`.
pub(super) fn counted<T>(counter: &Atomic<u64>, result: Result<T>) -> Result<T> {
    if result.is_err() {
        counter.add(1, Relaxed);
    }
    result
}
