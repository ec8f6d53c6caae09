// SPDX-License-Identifier: GPL-2.0

//! PCI operations the 7.3 kernel crate lacks: disabling a function it
//! enabled (`pci_disable_device()`), reserving a BAR without mapping it
//! (`pci_request_region()`), and MSI-X vectors shared by the interrupt
//! handlers registered on them.
//!
//! C header: [`include/linux/pci.h`](srctree/include/linux/pci.h)

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

/// The C `struct pci_dev` of a PCI device.
fn raw_pci(pdev: &pci::Device<Bound>) -> *mut bindings::pci_dev {
    // `pci::Device` is `#[repr(transparent)]` over `Opaque<struct pci_dev>`;
    // `as_raw()` is private to the kernel crate.
    core::ptr::from_ref(pdev).cast_mut().cast()
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

/// A memory BAR reserved for the driver but not mapped in the kernel:
/// device memory only userspace maps (doorbell pages), by physical address.
pub(crate) struct ReservedBar<'a> {
    pdev: &'a pci::Device<Bound>,
    index: kernel::ffi::c_int,
    start: u64,
    len: u64,
}

impl<'a> ReservedBar<'a> {
    /// Reserves BAR `bar` of `pdev` as `name`.
    pub(crate) fn new(pdev: &'a pci::Device<Bound>, bar: u32, name: &'static CStr) -> Result<Self> {
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
        // INVARIANT: The range of a memory BAR of a device this driver has
        // bound and reserved.
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
        // INVARIANT: Whole pages, inside the BAR (checked above).
        Ok(IoPages { phys, len })
    }
}

/// Whole pages of a memory BAR, which may be mapped to userspace.
///
/// # Invariants
///
/// `phys` is page aligned, `len` a non-zero multiple of the page size, and
/// `phys..phys + len` inside a memory BAR of a PCI device the driver bound
/// (device memory, never RAM). Only [`BarWindow::page`] makes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IoPages {
    phys: u64,
    len: usize,
}

impl IoPages {
    /// Physical address of the first page.
    pub(crate) fn phys(&self) -> u64 {
        self.phys
    }

    /// Length in bytes, a multiple of the page size.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// The MSI-X vectors of a bound PCI device.
pub(crate) struct IrqVectors<'a>(Arc<pci::IrqVectorRegistration<'a>>);

impl<'a> IrqVectors<'a> {
    /// Allocates between `min` and `max` MSI-X vectors.
    pub(crate) fn alloc_msix(pdev: &'a pci::Device<Bound>, min: u32, max: u32) -> Result<Self> {
        let msix = pci::IrqTypes::default().with(pci::IrqType::MsiX);
        let vectors = pdev.alloc_irq_vectors(min, max, msix)?;
        Ok(Self(Arc::new(vectors, GFP_KERNEL)?))
    }

    /// Number of vectors allocated.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
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
        let request: irq::IrqRequest<'_> = self.0.index(index)?.into();
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
            _vectors: self.0.clone(),
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
    _vectors: Arc<pci::IrqVectorRegistration<'a>>,
}

impl<'a, T: irq::Handler + 'a> Irq<'a, T> {
    /// The registered handler.
    pub(crate) fn handler(&self) -> &T {
        self.registration.handler()
    }
}
