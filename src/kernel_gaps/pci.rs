// SPDX-License-Identifier: GPL-2.0

//! PCI operations the 7.3 kernel crate lacks: disabling a function it
//! enabled (`pci_disable_device()`), turning its bus mastering off
//! (`pci_clear_master()`), reserving a BAR without mapping it
//! (`pci_request_region()`), MSI-X vectors shared by the interrupt
//! handlers registered on them with their affinity hints
//! (`irq_set_affinity_and_hint()`, `cpumask_local_spread()`), a driver's
//! `shutdown` callback (`struct pci_driver.shutdown`), which 7.3's
//! `pci::Driver` does not register (out of tree only: the series adds it to
//! `pci::Driver`, patches/rust/), and a DMA segment boundary
//! (`dma_set_seg_boundary()`), which 7.3's `dma::Device` cannot set.
//!
//! C headers: [`include/linux/pci.h`](srctree/include/linux/pci.h),
//! [`include/linux/dma-mapping.h`](srctree/include/linux/dma-mapping.h)

use kernel::{
    bindings,
    device::{
        Bound,
        Core, //
    },
    error::to_result,
    irq,
    pci,
    prelude::*,
    sync::Arc, //
};
// out of tree: begin
use kernel::{
    device::CoreInternal,
    driver::{
        DriverLayout,
        RegistrationOps, //
    },
    types::Opaque,
    ThisModule, //
};
// out of tree: end

use crate::rdma::mmap::IoPages;

/// The C `struct pci_dev` of a PCI device.
fn raw_pci(pdev: &pci::Device<Bound>) -> *mut bindings::pci_dev {
    // `pci::Device` is `#[repr(transparent)]` over `Opaque<struct pci_dev>`;
    // `as_raw()` is private to the kernel crate.
    core::ptr::from_ref(pdev).cast_mut().cast()
}

/// Lets the DMA layer hand the device scatter-gather segments that cross
/// any address line: `dma_set_seg_boundary(dev, ULONG_MAX)`.
///
/// The DMA layer's default boundary is 4 GiB. A device that is only ever
/// given lists of pages has no such limit, and keeping the default would
/// declare one that is not kept anyway: `ib_umem_get()` merges physically
/// contiguous pages up to the maximum segment size without splitting them
/// at the boundary, so a region whose pages straddle a 4 GiB line gets a
/// segment across it, which DMA-API debugging reports.
///
/// # Safety
///
/// The contract of [`kernel::dma::Device::dma_set_max_seg_size`], which
/// writes the same DMA parameters: no DMA allocation or mapping for the
/// device may run concurrently.
pub(crate) unsafe fn dma_set_no_seg_boundary(pdev: &pci::Device<Bound>) {
    // SAFETY: `pdev` is a bound PCI device, valid for the call, whose DMA
    // parameters the PCI core set up when it added the device (the C
    // function WARNs, and changes nothing, for a device without). Our
    // caller promises that nothing maps or allocates for it meanwhile, so
    // the write of its DMA parameters races with no reader.
    unsafe {
        super::bindings::dma_set_seg_boundary(
            &raw mut (*raw_pci(pdev)).dev,
            kernel::ffi::c_ulong::MAX,
        )
    }
}

/// A PCI function enabled for memory space access and bus mastering while
/// this lives; dropping it disables the function again, which also stops
/// its bus mastering.
pub(crate) struct EnabledFunction<'a> {
    pdev: &'a pci::Device<Bound>,
}

impl<'a> EnabledFunction<'a> {
    /// Enables `pdev`; called from probe.
    pub(crate) fn new(pdev: &'a pci::Device<Core<'_>>) -> Result<Self> {
        pdev.enable_device_mem()?;
        pdev.set_master();
        Ok(Self { pdev })
    }
}

impl Drop for EnabledFunction<'_> {
    fn drop(&mut self) {
        // SAFETY: `new` enabled the function, and this balances it exactly
        // once; the device is still bound (lifetime of `self.pdev`).
        unsafe { bindings::pci_disable_device(raw_pci(self.pdev)) };
    }
}

/// Turns the bus mastering of `pdev` off: the function can no longer reach
/// memory, whatever state it is in. For a device that did not acknowledge
/// its reset, before memory it was given is freed.
pub(crate) fn clear_master(pdev: &pci::Device<Bound>) {
    // SAFETY: `pdev` is a bound PCI device, valid for the call. As for
    // `pci_set_master()`, which the kernel crate wraps as a safe method
    // with the same argument, the C function only reads and writes the
    // command register through the config accessors, which take their own
    // lock, and updates `is_busmaster`.
    unsafe { bindings::pci_clear_master(raw_pci(pdev)) };
}

/// A memory BAR reserved for the driver but not mapped in the kernel:
/// device memory only userspace maps (doorbell pages), by physical address.
pub(crate) struct ReservedBar<'a> {
    pdev: &'a pci::Device<Bound>,
    index: kernel::ffi::c_int,
    start: u64,
    len: u64,
}

/// Whether BAR `bar` of `pdev` is memory space (`IORESOURCE_MEM`).
///
/// A device declares each BAR's kind in its config space; one that
/// declares I/O space has port numbers for its "addresses", which are not
/// physical addresses of anything: mapping them as pages would map RAM.
pub(crate) fn is_memory_bar(pdev: &pci::Device<Bound>, bar: u32) -> Result<bool> {
    // `resource_start` checks the index for the same array.
    pdev.resource_start(bar)?;
    let index = usize::try_from(bar).map_err(|_| EINVAL)?;
    // SAFETY: `pdev` is a live, bound `struct pci_dev`; `index` is a valid
    // BAR number (checked above), below the length of `resource`. The PCI
    // core sets a resource's flags when it enumerates the device, before
    // any driver is bound, and does not change them while one is.
    let flags = unsafe { (*raw_pci(pdev)).resource[index].flags };
    Ok(flags & bindings::IORESOURCE_MEM as kernel::ffi::c_ulong != 0)
}

impl<'a> ReservedBar<'a> {
    /// Reserves BAR `bar` of `pdev` as `name`. A BAR that is not memory
    /// space is `ENODEV`.
    pub(crate) fn new(pdev: &'a pci::Device<Bound>, bar: u32, name: &'static CStr) -> Result<Self> {
        if !is_memory_bar(pdev, bar)? {
            return Err(ENODEV);
        }
        let start = pdev.resource_start(bar)?;
        let len = pdev.resource_len(bar)?;
        if len == 0 {
            return Err(ENODEV);
        }
        let index = kernel::ffi::c_int::try_from(bar).map_err(|_| EINVAL)?;
        // SAFETY: `pdev` is bound and `name` is static; failure leaves
        // nothing reserved.
        to_result(unsafe {
            bindings::pci_request_region(raw_pci(pdev), index, name.as_char_ptr())
        })?;
        Ok(Self {
            pdev,
            index,
            start,
            len,
        })
    }

    /// The BAR's physical range, from which pages are handed to
    /// userspace ([`BarWindow::page`]).
    pub(crate) fn window(&self) -> BarWindow {
        // INVARIANT: The range of a memory BAR (checked in `new`) of a
        // device this driver has bound and reserved.
        BarWindow {
            start: self.start,
            len: self.len,
        }
    }
}

impl Drop for ReservedBar<'_> {
    fn drop(&mut self) {
        // SAFETY: Reserved in `new`, released exactly once here, while the
        // device is still bound (lifetime of `self.pdev`).
        unsafe { bindings::pci_release_region(raw_pci(self.pdev), self.index) };
    }
}

/// The physical range of a memory BAR reserved by [`ReservedBar`].
///
/// # Invariants
///
/// `start..start + len` is a memory BAR of a PCI device the driver bound
/// and reserved the BAR of: device memory, never RAM. Only
/// [`ReservedBar::window`] makes one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BarWindow {
    start: u64,
    len: u64,
}

impl BarWindow {
    /// Length of the BAR in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The whole pages of the BAR that hold the `len` bytes at `offset`
    /// (a place the device named, say): `EIO` unless every byte of those
    /// pages is inside the BAR.
    pub(crate) fn page(&self, offset: u64, len: u64) -> Result<IoPages> {
        let page = kernel::page::PAGE_SIZE as u64;
        let first = offset & !(page - 1);
        let end = offset.checked_add(len.max(1)).ok_or(EIO)?;
        let end = end.checked_next_multiple_of(page).ok_or(EIO)?;
        if end > self.len || self.start % page != 0 {
            return Err(EIO);
        }
        let phys = self.start.checked_add(first).ok_or(EIO)?;
        let len = usize::try_from(end - first).map_err(|_| EIO)?;
        // SAFETY: `phys` and `len` are whole pages (rounded above) of this
        // window, a memory BAR of a PCI device the driver bound (type
        // invariant), and the window's checked bounds contain them.
        Ok(unsafe { IoPages::new(phys, len) })
    }
}

/// The MSI-X vectors of a bound PCI device.
pub(crate) struct IrqVectors<'a> {
    vectors: Arc<pci::IrqVectorRegistration<'a>>,
    pdev: &'a pci::Device<Bound>,
}

impl<'a> IrqVectors<'a> {
    /// Allocates between `min` and `max` MSI-X vectors.
    pub(crate) fn alloc_msix(pdev: &'a pci::Device<Bound>, min: u32, max: u32) -> Result<Self> {
        let msix = pci::IrqTypes::default().with(pci::IrqType::MsiX);
        let vectors = pdev.alloc_irq_vectors(min, max, msix)?;
        Ok(Self {
            vectors: Arc::new(vectors, GFP_KERNEL)?,
            pdev,
        })
    }

    /// Number of vectors allocated.
    pub(crate) fn len(&self) -> usize {
        self.vectors.len()
    }

    /// Registers `handler` for vector `index`.
    ///
    /// # Safety
    ///
    /// The returned [`Irq`] must be dropped before `'a` ends, that is before
    /// the device unbinds: keep it in the bound device's driver data (or
    /// drop it earlier) and never leak it (`mem::forget`, `KBox::leak`,
    /// reference cycles). The handler may borrow resources of the binding,
    /// and the kernel calls it until the `Irq` is dropped. This is the
    /// contract of `irq::Registration::new`, which 7.3 has no safe,
    /// devres-managed form of.
    pub(crate) unsafe fn request<T: irq::Handler + 'a>(
        &self,
        index: usize,
        name: &'static CStr,
        handler: T,
    ) -> Result<Irq<'a, T>> {
        let request: irq::IrqRequest<'_> = self.vectors.index(index)?.into();
        let number = request.irq();
        // SAFETY: Only the lifetime changes. The request borrows the vector
        // allocation so that the handler cannot outlive it; the `Irq` built
        // below holds the allocation itself (an `Arc` clone, its last field)
        // and frees the handler first, which gives the same guarantee for
        // `'a`, the bound lifetime of the device the allocation already
        // carries.
        let request =
            unsafe { core::mem::transmute::<irq::IrqRequest<'_>, irq::IrqRequest<'a>>(request) };
        // SAFETY: The registration must not be leaked, so that the handler
        // is freed before `'a` ends. It is kept in the returned `Irq`, which
        // our caller promises to drop before `'a` ends.
        let registration = unsafe {
            irq::Registration::new(
                request,
                irq::Flags::TRIGGER_NONE,
                name,
                Ok::<T, Error>(handler),
            )
        };
        Ok(Irq {
            registration: KBox::pin_init(registration, GFP_KERNEL)?,
            number,
            pdev: self.pdev,
            hinted: false,
            _vectors: self.vectors.clone(),
        })
    }
}

/// An interrupt handler registered on an MSI-X vector of a bound device.
///
/// It must be dropped before the device is unbound: keep it in the
/// device's driver data. Dropping it waits for a running handler and
/// unregisters it, then releases its hold on the vector allocation.
pub(crate) struct Irq<'a, T: irq::Handler + 'a> {
    registration: Pin<KBox<irq::Registration<'a, T>>>,
    /// The Linux interrupt number of the vector.
    number: u32,
    pdev: &'a pci::Device<Bound>,
    /// An affinity hint is set (and must be cleared before the handler is
    /// freed: `free_irq()` WARNs about a hint left behind).
    hinted: bool,
    _vectors: Arc<pci::IrqVectorRegistration<'a>>,
}

impl<'a, T: irq::Handler + 'a> Irq<'a, T> {
    /// The registered handler.
    pub(crate) fn handler(&self) -> &T {
        self.registration.handler()
    }

    /// Points the interrupt at the `index`-th online CPU, counted from the
    /// device's NUMA node (`cpumask_local_spread()`), and hints that CPU to
    /// user space (irqbalance) as its affinity, as the C driver does for
    /// its vectors (`irq_set_affinity_and_hint()`). Returns the CPU. The
    /// hint is cleared when `self` is dropped, before the handler is freed.
    pub(crate) fn spread_affinity(&mut self, index: u32) -> u32 {
        // SAFETY: `self.pdev` is the bound device, valid for the call; its
        // node is read.
        let node = unsafe { super::bindings::dev_to_node(&raw mut (*raw_pci(self.pdev)).dev) };
        // SAFETY: Any index and node are accepted (the index wraps around
        // the online CPUs; an unknown node counts from anywhere).
        let cpu = unsafe { bindings::cpumask_local_spread(index, node) };
        // SAFETY: `self.number` is the interrupt of a vector this `Irq`
        // holds registered (`request_irq()` succeeded, `free_irq()` comes
        // with `self`'s drop, after the hint is cleared). The mask the hint
        // points to is `cpumask_of()` of a CPU, static storage of the
        // kernel's, so it outlives the hint. A failure only leaves the
        // interrupt where it was, as in efa.ko.
        unsafe {
            super::bindings::irq_set_affinity_and_hint(
                self.number,
                super::bindings::cpumask_of(cpu),
            )
        };
        self.hinted = true;
        cpu
    }
}

impl<'a, T: irq::Handler + 'a> Drop for Irq<'a, T> {
    fn drop(&mut self) {
        if self.hinted {
            // SAFETY: The interrupt is still requested (the registration is
            // a field, dropped after this); clearing its hint is what
            // `free_irq()` expects to find done.
            unsafe { super::bindings::irq_update_affinity_hint(self.number, core::ptr::null()) };
        }
    }
}

// out of tree: begin
/// A PCI driver with a `shutdown` callback.
///
/// At reboot, poweroff and kexec the PCI core does not unbind drivers; it
/// calls `shutdown` of each bound device's driver (`device_shutdown()`,
/// `pci_device_shutdown()`), so that devices stop DMA into memory that the
/// next kernel or the firmware owns. 7.3's [`pci::Driver`] has no such
/// callback; [`ShutdownAdapter`] registers it.
pub(crate) trait ShutdownDriver: pci::Driver {
    /// The system is going down while `dev` is bound to this driver, with
    /// the data its probe returned.
    ///
    /// The device lock is held: this never runs concurrently with probe or
    /// unbind. The device stays bound afterwards, and nothing in the
    /// kernel promises that unbind does not follow (a driver unbound late
    /// in shutdown, a device removed): `this` must stay fit for it.
    fn shutdown<'bound>(dev: &'bound pci::Device<Core<'_>>, this: Pin<&Self::Data<'bound>>);
}

/// The registration of a [`ShutdownDriver`]: [`pci::Adapter`]'s, with the
/// `shutdown` callback added. A module uses it in place of
/// `module_pci_driver!`:
/// `kernel::module_driver!(<T>, ShutdownAdapter<T>, { type: ..., ... })`.
pub(crate) struct ShutdownAdapter<T: ShutdownDriver>(T);

// SAFETY: The layout is `pci::Adapter<T>`'s, whose registration this is:
// `DriverType` is the C `struct pci_driver` (`repr(C)`), `DriverData` is
// the data `pci::Adapter<T>`'s probe stores in the device, and the offset
// is that of the `struct device_driver` embedded in `struct pci_driver`.
unsafe impl<T: ShutdownDriver> DriverLayout for ShutdownAdapter<T> {
    type DriverType = bindings::pci_driver;
    type DriverData<'bound> = <pci::Adapter<T> as DriverLayout>::DriverData<'bound>;
    const DEVICE_DRIVER_OFFSET: usize = <pci::Adapter<T> as DriverLayout>::DEVICE_DRIVER_OFFSET;
}

// SAFETY: `unregister` is `pci::Adapter<T>`'s, called only after `register`
// below succeeded, that is after `pci::Adapter<T>`'s `register` succeeded
// for the same driver.
unsafe impl<T: ShutdownDriver + 'static> RegistrationOps for ShutdownAdapter<T> {
    unsafe fn register(
        reg: &Opaque<bindings::pci_driver>,
        name: &'static CStr,
        module: &'static ThisModule,
    ) -> Result {
        // SAFETY: `reg` points to a valid `struct pci_driver` that is not
        // registered yet, so nothing else reads or writes it: the same
        // ground on which `pci::Adapter<T>`'s `register` sets the other
        // callbacks, and it leaves this one alone.
        unsafe { (*reg.get()).shutdown = Some(Self::shutdown_callback) };
        // SAFETY: Our caller keeps `reg` pinned and valid until the
        // matching `unregister`, which is what `pci::Adapter<T>` asks.
        unsafe { <pci::Adapter<T> as RegistrationOps>::register(reg, name, module) }
    }

    unsafe fn unregister(reg: &Opaque<bindings::pci_driver>) {
        // SAFETY: Our caller's promise: `register` above succeeded for
        // `reg`, so `pci::Adapter<T>`'s `register` did.
        unsafe { <pci::Adapter<T> as RegistrationOps>::unregister(reg) }
    }
}

impl<T: ShutdownDriver> ShutdownAdapter<T> {
    extern "C" fn shutdown_callback(pdev: *mut bindings::pci_dev) {
        // SAFETY: The PCI core calls `shutdown` with a valid `struct pci_dev`
        // from `device_shutdown()`, which holds the device lock for the
        // whole call, as for probe and remove: the core context of
        // `pci::Adapter`'s callbacks, valid for the duration of this call.
        let pdev = unsafe { &*pdev.cast::<pci::Device<CoreInternal<'_>>>() };
        // SAFETY: `pci_device_shutdown()` calls this only while
        // `pdev->driver` is this driver. The PCI core sets it just before
        // probe and clears it when probe fails and after remove, and the
        // driver core probes and unbinds under the device lock that is held
        // here. So probe returned successfully, which means
        // `pci::Adapter<T>`'s probe stored the driver's `Pin<KBox<T::Data>>`
        // with `set_drvdata`, and unbind has not begun, so the driver core
        // has not taken that data back (it does so after remove, under the
        // same lock): `drvdata_borrow`'s requirements.
        let data = unsafe { pdev.as_ref().drvdata_borrow::<T::Data<'_>>() };
        T::shutdown(pdev, data);
    }
}
// out of tree: end
