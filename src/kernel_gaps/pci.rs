// SPDX-License-Identifier: GPL-2.0

//! The device lock of a PCI device taken from outside a bus callback, with
//! the driver's data borrowed under it as the bus callbacks do
//! ([`DeviceLock`]), which the 7.3 kernel crate leaves to the bus
//! callbacks.
// out of tree: begin
//!
//! Out of tree also what the series adds to `rust/kernel` (patches/rust/),
//! with the same names and signatures, so that the driver calls them the
//! same way: a driver's `shutdown` callback (`struct pci_driver.shutdown`),
//! which 7.3's `pci::Driver` does not register; a BAR's resource
//! (`pci_resource_n()`), reserving a BAR without mapping it
//! (`pci_request_region()`) and its pages for userspace ([`IoPages`]);
//! disabling a function it enabled (`pci_disable_device()`) and turning
//! its bus mastering off (`pci_clear_master()`); interrupt handlers on
//! MSI-X vectors shared through an `Arc`, with their affinity hints
//! ([`IrqVectorHandler`]). The methods the series adds to `pci::Device`
//! are the traits [`BoundExt`] and [`CoreExt`] here.
// out of tree: end
//!
//! C header: [`include/linux/pci.h`](srctree/include/linux/pci.h)

use kernel::{
    bindings,
    device::{
        Core,
        CoreInternal, //
    },
    pci,
    prelude::*, //
};
// out of tree: begin
use kernel::{
    cpu::CpuId,
    device::Bound,
    driver::{
        DriverLayout,
        RegistrationOps, //
    },
    error::to_result,
    io::{
        resource::Flags,
        PhysAddr,
        Resource,
        ResourceSize, //
    },
    irq,
    page::PAGE_SIZE,
    sync::Arc,
    types::Opaque,
    ThisModule, //
};

/// The C `struct pci_dev` of a PCI device.
fn raw_pci(pdev: &pci::Device<Bound>) -> *mut bindings::pci_dev {
    // `pci::Device` is `#[repr(transparent)]` over `Opaque<struct pci_dev>`;
    // `as_raw()` is private to the kernel crate.
    core::ptr::from_ref(pdev).cast_mut().cast()
}
// out of tree: end

/// The C `struct pci_dev` of a PCI device in any context.
fn raw_pci_any<Ctx: kernel::device::DeviceContext>(
    pdev: &pci::Device<Ctx>,
) -> *mut bindings::pci_dev {
    core::ptr::from_ref(pdev).cast_mut().cast()
}

/// The device lock of a PCI device (`device_lock()`), taken by a driver
/// outside the bus callbacks, which the driver core runs under it: probe,
/// remove (and with it the drop of the driver's data), shutdown.
///
/// While it is held, nobody binds or unbinds the device. A driver that
/// knows, under the lock, that its own probe stored the data and that the
/// data's drop has not begun (a flag of its own, set by probe and cleared
/// by the data's drop, both under this lock) may borrow the data as the
/// remove callback does, through [`DeviceLock::with_bound`]. This is what
/// the PCI core does itself when it calls `reset_prepare()` and
/// `reset_done()` of a bound driver from `pci_reset_function()`, under
/// the same lock; 7.3's `pci::Driver` has neither callback.
pub(crate) struct DeviceLock<'a> {
    pdev: &'a pci::Device,
    /// A mutex is released by the task that took it.
    _not_send: kernel::types::NotThreadSafe,
}

impl<'a> DeviceLock<'a> {
    /// Takes the device lock of `pdev` if nobody holds it
    /// (`device_trylock()`).
    ///
    /// There is no blocking form: a driver that waits for the lock from a
    /// work item its unbind flushes would deadlock with that unbind, which
    /// holds the lock while it waits for the work.
    pub(crate) fn try_lock(pdev: &'a pci::Device) -> Option<Self> {
        // SAFETY: `pdev` is a live device (we hold a reference); its
        // `struct device`'s mutex was initialised with the device
        // (`device_initialize()`) and lives as long as it.
        let locked =
            unsafe { bindings::mutex_trylock(&raw mut (*raw_pci_any(pdev)).dev.mutex) } != 0;
        locked.then_some(Self {
            pdev,
            _not_send: kernel::types::NotThreadSafe,
        })
    }

    /// Runs `f` with the device as the driver's bus callbacks see it and
    /// the data its probe returned.
    ///
    /// # Safety
    ///
    /// The device is bound to driver `T` through `pci::Adapter<T>` (out of
    /// tree, `ShutdownAdapter<T>`, which registers it): its probe returned
    /// successfully (so the adapter stored `T`'s data as the device's driver
    /// data), and the unbind that takes the data back has not begun. The
    /// lock held by `self` keeps it so until `self` is dropped, which cannot
    /// happen while `f` runs.
    pub(crate) unsafe fn with_bound<T: pci::Driver, R>(
        &self,
        f: impl for<'b, 'c> FnOnce(&'b pci::Device<Core<'c>>, Pin<&'b T::Data<'b>>) -> R,
    ) -> R {
        // SAFETY: A valid `struct pci_dev` (we hold a reference). Its device
        // lock is held, and by our caller's promise the device is bound to
        // `T`: the core context of `pci::Adapter`'s callbacks, for as long
        // as `self` holds the lock, which outlasts the reference (it is
        // only handed to `f`).
        let pdev = unsafe { &*raw_pci_any(self.pdev).cast::<pci::Device<CoreInternal<'_>>>() };
        // SAFETY: Our caller's promise: the adapter of `T` stored a
        // `Pin<KBox<T::Data>>` with `set_drvdata` after `T`'s probe
        // succeeded, and the driver core has not taken it back (it does so
        // after remove, under the lock held here). `drvdata_borrow`'s
        // requirements; the lifetime is the callback's, as in
        // `pci::Adapter`'s remove callback.
        let data = unsafe { pdev.as_ref().drvdata_borrow::<T::Data<'_>>() };
        f(pdev, data)
    }
}

impl Drop for DeviceLock<'_> {
    fn drop(&mut self) {
        // SAFETY: `try_lock` took the mutex for this `DeviceLock`, which
        // releases it exactly once, from the task that took it (it is not
        // `Send`).
        unsafe { bindings::mutex_unlock(&raw mut (*raw_pci_any(self.pdev)).dev.mutex) };
    }
}

// out of tree: begin
/// An interrupt handler registered on a vector of an
/// [`pci::IrqVectorRegistration`] shared through an [`Arc`]: the vectors are
/// freed after the last handler registered on them. As the series'
/// `pci::IrqVectorHandler`, which builds the request of the vector for the
/// bound lifetime of the vectors' device; out of tree only the request of a
/// borrowed vector can be had, whose lifetime is changed here.
#[pin_data(PinnedDrop)]
pub(crate) struct IrqVectorHandler<'a, T: irq::Handler> {
    // Dropped before `vectors`: the handler is freed before the vectors.
    #[pin]
    registration: irq::Registration<'a, T>,
    irq: u32,
    vectors: Arc<pci::IrqVectorRegistration<'a>>,
}

impl<'a, T: irq::Handler + 'a> IrqVectorHandler<'a, T> {
    /// Registers `handler` for the vector at `index` of `vectors`.
    ///
    /// # Safety
    ///
    /// The returned handler must not be leaked (`mem::forget`, `KBox::leak`,
    /// reference cycles): the contract of `irq::Registration::new`.
    pub(crate) unsafe fn new(
        vectors: &Arc<pci::IrqVectorRegistration<'a>>,
        index: usize,
        flags: irq::Flags,
        name: &'static CStr,
        handler: impl PinInit<T, Error> + 'a,
    ) -> impl PinInit<Self, Error> + 'a {
        let vectors = vectors.clone();
        pin_init::pin_init_scope(move || {
            let request: irq::IrqRequest<'_> = vectors.index(index)?.into();
            let irq = request.irq();
            // SAFETY: Only the lifetime changes. The request borrows the
            // vector allocation so that the handler cannot outlive it; `Self`
            // holds the allocation itself (`vectors`, dropped after the
            // registration), which gives the same guarantee for `'a`, the
            // bound lifetime of the device the allocation already carries.
            let request = unsafe {
                core::mem::transmute::<irq::IrqRequest<'_>, irq::IrqRequest<'a>>(request)
            };
            Ok(try_pin_init!(Self {
                // SAFETY: The registration is a field of `Self`, which our
                // caller does not leak.
                registration <- unsafe { irq::Registration::new(request, flags, name, handler) },
                irq,
                vectors,
            }? Error))
        })
    }

    /// The registered handler.
    pub(crate) fn handler(&self) -> &T {
        self.registration.handler()
    }

    /// Points the interrupt at the `index`-th online CPU counted from the
    /// device's NUMA node (`cpumask_local_spread()`) and hints that CPU to
    /// userspace as its affinity (`irq_set_affinity_and_hint()`). Returns
    /// the CPU; the hint is cleared when `self` is dropped.
    pub(crate) fn spread_affinity(&self, index: u32) -> Result<CpuId> {
        // The vectors' device is private to the kernel crate: its node is
        // the node of the interrupt's descriptor, which the MSI core
        // allocates there (`dev_to_node()`).
        // SAFETY: `self.irq` is an interrupt with a handler registered (a
        // field of `self`), so it has a descriptor, which lives as long.
        let node =
            unsafe { super::bindings::irq_data_get_node(bindings::irq_get_irq_data(self.irq)) };
        // SAFETY: Any index and node are valid: the index wraps around the
        // online CPUs; a node without CPUs counts from all of them.
        let cpu = unsafe { bindings::cpumask_local_spread(index, node) };
        let cpu = CpuId::from_u32(cpu).ok_or(ENODEV)?;
        // SAFETY: `self.irq` has a handler registered, which is freed only
        // after the hint is cleared in `drop`. The mask is `cpumask_of()` a
        // CPU, static storage of the kernel's, so it outlives the hint.
        to_result(unsafe {
            super::bindings::irq_set_affinity_and_hint(
                self.irq,
                super::bindings::cpumask_of(cpu.as_u32()),
            )
        })?;
        Ok(cpu)
    }
}

#[pinned_drop]
impl<T: irq::Handler> PinnedDrop for IrqVectorHandler<'_, T> {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: `self.irq` has a handler registered, freed after this with
        // `self.registration`: `free_irq()` expects the hint to be cleared
        // by then. Clearing a hint never set changes nothing.
        unsafe { super::bindings::irq_update_affinity_hint(self.irq, core::ptr::null()) };
    }
}

/// The methods patches/rust/ adds to `pci::Device` for any bound device.
pub(crate) trait BoundExt {
    /// The resource of BAR `bar`: its range and its flags. `EINVAL` for a
    /// BAR number out of range.
    fn resource(&self, bar: u32) -> Result<&Resource>;

    /// Reserves BAR `bar` for the driver as `name`, without mapping it,
    /// until the returned [`BarRegion`] is dropped. `ENODEV` for a BAR the
    /// device does not implement.
    fn request_region<'a>(&'a self, bar: u32, name: &'static CStr) -> Result<BarRegion<'a>>;

    /// Turns the device's bus mastering off (`pci_clear_master()`).
    fn clear_master(&self);
}

impl BoundExt for pci::Device<Bound> {
    fn resource(&self, bar: u32) -> Result<&Resource> {
        // `resource_start` checks the index for the same array.
        self.resource_start(bar)?;
        let index = usize::try_from(bar)?;
        // SAFETY: `self` is a valid `struct pci_dev` and `index` a valid
        // index into its `resource` array (checked above).
        let resource = unsafe { &raw mut (*raw_pci(self)).resource[index] };
        // SAFETY: `Resource` is `#[repr(transparent)]` over
        // `Opaque<struct resource>` (its invariant), so the cast keeps the
        // layout. `resource` is inside the `struct pci_dev` of `self`, valid
        // for as long as `self` is borrowed; this is the only reference this
        // function makes to it, and `Opaque` lets the PCI core's own updates
        // of it (when it assigns or resizes BARs) alias no Rust reference.
        Ok(unsafe { &*resource.cast::<Resource>() })
    }

    fn request_region<'a>(&'a self, bar: u32, name: &'static CStr) -> Result<BarRegion<'a>> {
        let resource = self.resource(bar)?;
        let flags = resource.flags();
        // `pci_request_region()` reserves nothing for a BAR that the device
        // does not implement, and succeeds.
        if self.resource_len(bar)? == 0
            || !(flags.contains(Flags::IORESOURCE_MEM) || flags.contains(Flags::IORESOURCE_IO))
        {
            return Err(ENODEV);
        }
        let num = i32::try_from(bar)?;
        // SAFETY: `self` is a valid `struct pci_dev`, `num` a valid BAR
        // number (checked by `resource` above) and `name` a string that
        // lives as long as the kernel, as it must: the reservation keeps a
        // pointer to it.
        to_result(unsafe { bindings::pci_request_region(raw_pci(self), num, name.as_char_ptr()) })?;
        // INVARIANT: Reserved just above, a memory or I/O BAR of non-zero
        // length (checked above).
        Ok(BarRegion {
            pdev: self,
            resource,
            num,
        })
    }

    fn clear_master(&self) {
        // SAFETY: `self` is a valid `struct pci_dev`. As for
        // `alloc_irq_vectors()`, which the kernel crate offers for a bound
        // device, the C function only does a read-modify-write of the
        // command register through the config accessors, which take their
        // own lock, and writes a bit field of the device (`is_busmaster`).
        unsafe { bindings::pci_clear_master(raw_pci(self)) };
    }
}

/// A PCI BAR reserved for the driver, without a kernel mapping
/// ([`BoundExt::request_region`]). Dropping it releases the reservation.
///
/// # Invariants
///
/// `resource` is BAR `num` of `pdev`, a memory or I/O BAR of non-zero
/// length, which `pci_request_region()` reserved; the reservation belongs
/// to this `BarRegion`.
pub(crate) struct BarRegion<'a> {
    pdev: &'a pci::Device<Bound>,
    resource: &'a Resource,
    num: i32,
}

impl<'a> BarRegion<'a> {
    /// The resource of the reserved BAR: its range and its flags.
    pub(crate) fn resource(&self) -> &'a Resource {
        self.resource
    }

    /// The `len` bytes at `offset` in the reserved BAR as whole pages of
    /// device memory. `EINVAL` unless `offset` and `len` are multiples of
    /// the page size, `len` non-zero and the pages inside the BAR; `ENODEV`
    /// for an I/O BAR or one whose start is not page aligned.
    pub(crate) fn io_pages(&self, offset: ResourceSize, len: usize) -> Result<IoPages> {
        let flags = self.resource.flags();
        let start = self.resource.start();
        let page = ResourceSize::try_from(PAGE_SIZE)?;
        if !flags.contains(Flags::IORESOURCE_MEM) || start % page != 0 {
            return Err(ENODEV);
        }
        let size = ResourceSize::try_from(len)?;
        let end = offset.checked_add(size).ok_or(EINVAL)?;
        if len == 0 || offset % page != 0 || size % page != 0 || end > self.resource.size() {
            return Err(EINVAL);
        }
        // `resource_size_t` is `phys_addr_t`.
        let phys = start.checked_add(offset).ok_or(EINVAL)?;
        // INVARIANT: `offset..end` are whole pages (checked above) inside
        // BAR `self.num`, a memory BAR with a page aligned start, which
        // `self` holds reserved.
        Ok(IoPages { phys, len })
    }
}

/// Whole pages of a PCI memory BAR by physical address, from
/// [`BarRegion::io_pages`]: device memory, never RAM.
///
/// # Invariants
///
/// `phys` is page aligned, `len` a non-zero multiple of the page size, and
/// `phys..phys + len` lies inside a memory BAR of a bound device, which a
/// [`BarRegion`] held reserved when this was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IoPages {
    phys: PhysAddr,
    len: usize,
}

impl IoPages {
    /// Physical address of the first page.
    pub(crate) fn phys(&self) -> PhysAddr {
        self.phys
    }

    /// Length in bytes, a non-zero multiple of the page size.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for BarRegion<'_> {
    fn drop(&mut self) {
        // SAFETY: By the type invariants, `self.pdev` is a valid
        // `struct pci_dev` and BAR `self.num` is reserved by this
        // `BarRegion`, which releases it exactly once, here.
        unsafe { bindings::pci_release_region(raw_pci(self.pdev), self.num) };
    }
}

/// The methods patches/rust/ adds to `pci::Device` in the core context.
pub(crate) trait CoreExt {
    /// Enables the device's memory space (`pci_enable_device_mem()`) until
    /// the returned [`EnabledDevice`] is dropped.
    fn enable_device_mem_guard(&self) -> Result<EnabledDevice<'_>>;
}

impl CoreExt for pci::Device<Core<'_>> {
    fn enable_device_mem_guard(&self) -> Result<EnabledDevice<'_>> {
        self.enable_device_mem()?;
        // INVARIANT: `pci_enable_device_mem()` succeeded just above.
        Ok(EnabledDevice { pdev: self })
    }
}

/// A PCI device enabled by [`CoreExt::enable_device_mem_guard`]; dropping
/// it disables the device again (`pci_disable_device()`).
///
/// # Invariants
///
/// `pdev` has been enabled by `pci_enable_device_mem()`, and that enable
/// belongs to this `EnabledDevice`.
pub(crate) struct EnabledDevice<'a> {
    pdev: &'a pci::Device<Bound>,
}

impl Drop for EnabledDevice<'_> {
    fn drop(&mut self) {
        // SAFETY: By the type invariant, `self.pdev` is a valid
        // `struct pci_dev` with an enable that belongs to this
        // `EnabledDevice`; this disable balances it, once.
        unsafe { bindings::pci_disable_device(raw_pci(self.pdev)) };
    }
}

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
