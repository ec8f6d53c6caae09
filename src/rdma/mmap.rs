// SPDX-License-Identifier: GPL-2.0

//! User mappings through `rdma_user_mmap_entry` cookies.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! A driver offers memory to a user context by inserting an [`MmapEntry`]:
//! the core hands out a cookie (the offset userspace passes to `mmap()`),
//! and the `mmap` operation of this module looks the cookie up in the
//! context that maps, checks the length and maps what the entry holds.
//! Cookies are per context: another context's cookie is unknown here.
//!
//! Lifetimes follow the core's reference count on the entry. The driver's
//! [`MmapEntry`] is one reference, dropped when the driver withdraws the
//! entry (when the object it belongs to is destroyed); each I/O mapping
//! holds another until it is unmapped, or until the core zaps it when the
//! device goes away. Withdrawing does not take existing mappings away: the
//! entry, and what it owns, is freed in `mmap_free` when the last
//! reference goes, and a driver that must not reuse what a mapping still
//! reaches (device memory another process would get next) learns the
//! moment from [`Operations::mmap_free`], which gets back the token the
//! entry was inserted with. Kernel pages are different: a mapping of them
//! holds page references, not the entry, so the pages outlive the entry
//! for as long as userspace maps them, and the device stops using them
//! when the driver destroys the object that owned them.

use super::{
    bindings,
    device::Operations,
    ucontext::UContext, //
};
use core::ptr::NonNull;
use kernel::{
    bindings as kbindings,
    device,
    error::to_result,
    page::PAGE_SIZE,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{
            ordering::Relaxed,
            AtomicFlag, //
        },
        Arc, //
    },
    types::Opaque, //
};

/// Which way the device moves data through [`DmaPages`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DmaDirection {
    /// The device writes (a completion ring userspace polls).
    FromDevice,
    /// The device reads (a receive ring userspace fills).
    ToDevice,
}

impl DmaDirection {
    fn into_raw(self) -> bindings::dma_data_direction {
        match self {
            Self::FromDevice => bindings::dma_data_direction::DMA_FROM_DEVICE,
            Self::ToDevice => bindings::dma_data_direction::DMA_TO_DEVICE,
        }
    }
}

/// Zeroed, physically contiguous kernel pages mapped for DMA with the
/// device, which userspace may map too (a completion ring it polls, a
/// receive ring it fills).
///
/// # Invariants
///
/// `cpu` is the start of `size` bytes (a whole number of pages) from
/// `alloc_pages_exact()`, mapped for DMA from `dev` at `dma`.
pub(crate) struct DmaPages {
    dev: ARef<device::Device>,
    cpu: NonNull<u8>,
    dma: u64,
    size: usize,
    dir: DmaDirection,
}

impl DmaPages {
    /// The largest allocation: one physically contiguous block.
    pub(crate) fn max_size() -> usize {
        // SAFETY: Reads a constant.
        unsafe { bindings::refa_max_pages_exact() }
    }

    /// Allocates `size` bytes, rounded up to whole pages, for DMA with
    /// `dev` in direction `dir`.
    ///
    /// The memory is charged to the caller's memory cgroup: it is what a
    /// user asked for. A size of zero or beyond [`DmaPages::max_size`] is
    /// `EINVAL`; running out of memory (or of the cgroup's allowance) is an
    /// ordinary `ENOMEM`, without a warning.
    pub(crate) fn new(
        dev: &device::Device<device::Bound>,
        size: usize,
        dir: DmaDirection,
    ) -> Result<Arc<Self>> {
        let size = size.checked_next_multiple_of(PAGE_SIZE).ok_or(EINVAL)?;
        if size == 0 || size > Self::max_size() {
            return Err(EINVAL);
        }
        let gfp = kbindings::GFP_KERNEL_ACCOUNT | kbindings::__GFP_ZERO | kbindings::__GFP_NOWARN;
        // SAFETY: Any size up to the largest block and these flags are
        // valid; the result is checked.
        let cpu = unsafe { bindings::refa_alloc_pages_exact(size, gfp) };
        let cpu = NonNull::new(cpu.cast::<u8>()).ok_or(ENOMEM)?;
        let raw_dev = super::device::raw_device(dev);
        // SAFETY: `cpu` is `size` bytes of kernel memory that stay allocated
        // until the mapping is undone; `dev` is bound, so it can map DMA.
        let dma = unsafe {
            bindings::refa_dma_map_single(raw_dev, cpu.as_ptr().cast(), size, dir.into_raw())
        };
        // SAFETY: `dma` was just returned for `dev`.
        if unsafe { bindings::refa_dma_mapping_error(raw_dev, dma) } != 0 {
            // SAFETY: Allocated above with this size and not mapped.
            unsafe { kbindings::free_pages_exact(cpu.as_ptr().cast(), size) };
            return Err(ENOMEM);
        }
        let pages = Self {
            dev: dev.into(),
            cpu,
            dma,
            size,
            dir,
        };
        Ok(Arc::new(pages, GFP_KERNEL)?)
    }

    /// The address the device uses.
    pub(crate) fn dma_addr(&self) -> u64 {
        self.dma
    }

    /// Size in bytes, a multiple of the page size.
    pub(crate) fn size(&self) -> usize {
        self.size
    }
}

impl Drop for DmaPages {
    fn drop(&mut self) {
        let raw_dev = super::device::raw_device(&self.dev);
        // SAFETY: Mapped for this device with this size and direction (type
        // invariant); the owner of the last reference has made sure the
        // device no longer writes to it.
        unsafe {
            bindings::refa_dma_unmap_single(raw_dev, self.dma, self.size, self.dir.into_raw())
        };
        // SAFETY: Allocated with this size (type invariant). Pages that a
        // user mapping still holds keep their own references and are freed
        // when it goes.
        unsafe { kbindings::free_pages_exact(self.cpu.as_ptr().cast(), self.size) };
    }
}

// SAFETY: The pages are plain memory and the device reference may be
// dropped from any thread.
unsafe impl Send for DmaPages {}
// SAFETY: Shared references only read the addresses.
unsafe impl Sync for DmaPages {}

/// What an [`MmapEntry`] maps.
pub(crate) enum Backing {
    /// Device memory at a physical address (a doorbell page), uncached.
    IoUncached(u64),
    /// Device memory at a physical address (a push buffer),
    /// write-combining.
    IoWriteCombining(u64),
    /// Kernel pages, shared with the driver.
    Pages(Arc<DmaPages>),
}

/// The entry the core tracks, with what it maps and the driver's token.
///
/// # Invariants
///
/// `rdma` is at offset 0. Once inserted, the allocation belongs to the
/// core's reference count and is freed by [`mmap_free`].
#[repr(C)]
struct Entry<O: Operations> {
    rdma: Opaque<bindings::rdma_user_mmap_entry>,
    backing: Backing,
    /// Handed back to [`Operations::mmap_free`] when the entry is freed.
    private: Option<O::MmapPrivate>,
}

/// Memory offered to a user context for `mmap()`, withdrawn from it when
/// dropped (or by [`MmapEntry::withdraw`]).
///
/// Withdrawing takes the cookie away; mappings made with it stay until
/// userspace unmaps them (the core does not zap them), and the entry, with
/// what it owns, lives until the last is gone. A driver that must know
/// when that is gives the entry a token ([`MmapEntry::insert_with_private`]),
/// which [`Operations::mmap_free`] gets back then.
///
/// # Invariants
///
/// `entry` was inserted in a user context; until `withdrawn` is set this
/// holds the reference the insertion created.
pub(crate) struct MmapEntry {
    entry: NonNull<bindings::rdma_user_mmap_entry>,
    /// The cookie, read at insertion: once withdrawn, the entry may be
    /// freed at any time.
    offset: u64,
    withdrawn: AtomicFlag,
}

impl MmapEntry {
    /// Offers `length` bytes of `backing` to `ctx`, rounded up to whole
    /// pages: a mapping must have exactly that size.
    pub(crate) fn insert<O: Operations>(
        ctx: &UContext<O>,
        backing: Backing,
        length: usize,
    ) -> Result<Self> {
        Self::insert_entry::<O>(ctx, backing, length, None)
    }

    /// As [`MmapEntry::insert`], with a token for
    /// [`Operations::mmap_free`], which gets it when the entry is freed:
    /// once it is withdrawn and no mapping of it is left. If the insertion
    /// fails the token is dropped.
    pub(crate) fn insert_with_private<O: Operations>(
        ctx: &UContext<O>,
        backing: Backing,
        length: usize,
        private: O::MmapPrivate,
    ) -> Result<Self> {
        Self::insert_entry::<O>(ctx, backing, length, Some(private))
    }

    fn insert_entry<O: Operations>(
        ctx: &UContext<O>,
        backing: Backing,
        length: usize,
        private: Option<O::MmapPrivate>,
    ) -> Result<Self> {
        if let Backing::Pages(pages) = &backing {
            if length > pages.size() {
                return Err(EINVAL);
            }
        }
        let entry = KBox::new(
            Entry::<O> {
                rdma: Opaque::zeroed(),
                backing,
                private,
            },
            GFP_KERNEL,
        )?;
        let raw = KBox::into_raw(entry);
        // SAFETY: `ctx` is a live context; the entry is zeroed as the core
        // wants and stays allocated until `mmap_free`, or until below if the
        // insertion fails.
        let ret = unsafe {
            bindings::rdma_user_mmap_entry_insert(ctx.as_raw(), (*raw).rdma.get(), length)
        };
        if let Err(e) = to_result(ret) {
            // SAFETY: Not inserted, so still ours; from `into_raw` above.
            drop(unsafe { KBox::from_raw(raw) });
            return Err(e);
        }
        // SAFETY: Inserted, and the insertion's reference keeps it alive;
        // the core set `start_pgoff` and never changes it.
        let pgoff = unsafe { (*(*raw).rdma.get()).start_pgoff };
        // INVARIANT: Inserted; the insertion's reference is this one.
        Ok(Self {
            // SAFETY: `raw` is from `KBox::into_raw`, never null, and `rdma`
            // is a field of it.
            entry: unsafe { NonNull::new_unchecked((*raw).rdma.get()) },
            offset: (pgoff as u64) << kernel::page::PAGE_SHIFT,
            withdrawn: AtomicFlag::new(false),
        })
    }

    /// The cookie userspace passes to `mmap()` as the offset.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// Takes the cookie away from userspace now, rather than when this is
    /// dropped: later `mmap()` calls with it fail, mappings made with it
    /// stay until unmapped. If there are none, the entry is freed (and its
    /// token handed back) before this returns.
    pub(crate) fn withdraw(&self) {
        if self.withdrawn.xchg(true, Relaxed) {
            return;
        }
        // SAFETY: Inserted, and this reference is still held (type
        // invariant; `withdrawn` was clear and is set now, once). This
        // drops it; the core frees the entry through `mmap_free` when the
        // mappings holding it are gone.
        unsafe { bindings::rdma_user_mmap_entry_remove(self.entry.as_ptr()) };
    }
}

impl Drop for MmapEntry {
    fn drop(&mut self) {
        self.withdraw();
    }
}

// SAFETY: The core's entry functions may be called from any thread, and the
// entry's backing and token are `Send`.
unsafe impl Send for MmapEntry {}
// SAFETY: Shared references read the immutable cookie or withdraw the entry
// once, under the atomic flag.
unsafe impl Sync for MmapEntry {}

/// `mmap` of the `ib_device_ops` table: maps the entry whose cookie is the
/// offset of `vma`, if `ctx` has one and the length is the entry's.
///
/// # Safety
///
/// Called by the core for a live user context, with `vma` being set up by
/// `mmap()` (the mm's lock held for writing).
pub(super) unsafe extern "C" fn mmap<O: Operations>(
    ctx: *mut bindings::ib_ucontext,
    vma: *mut bindings::vm_area_struct,
) -> kernel::ffi::c_int {
    // SAFETY: Per the function's safety requirements.
    let ret = unsafe { map::<O>(ctx, vma) };
    if let Err(e) = ret {
        // SAFETY: The context belongs to a registered `Device<O>` (only
        // its vtable has this callback), and the core calls operations only
        // while it is registered.
        unsafe {
            super::device::Device::<O>::from_raw((*ctx).device)
                .with_registration_data(|reg| O::mmap_failed(reg, e))
        };
    }
    kernel::error::from_result(|| ret.map(|()| 0))
}

/// Maps the entry whose cookie is the offset of `vma`.
///
/// # Safety
///
/// As for [`mmap`].
unsafe fn map<O: Operations>(
    ctx: *mut bindings::ib_ucontext,
    vma: *mut bindings::vm_area_struct,
) -> Result {
    // SAFETY: Per the function's safety requirements. The lookup fails for
    // unknown cookies and for a length other than the entry's, and takes a
    // reference on success.
    let rdma = unsafe { bindings::rdma_user_mmap_entry_get(ctx, vma) };
    if rdma.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: Every entry of a context of a `Device<O>` is an `Entry<O>`
    // (only `MmapEntry::insert_entry::<O>` inserts into such contexts), and
    // the reference keeps it alive.
    let entry = unsafe { &*rdma.cast::<Entry<O>>() };
    // SAFETY: `vma` is valid (the function's safety requirements), and
    // while it is set up its range is the `vm_start`/`vm_end` variant of
    // the union (the RCU head is used only when it is freed).
    let (start, end, prot) = unsafe {
        let range = &(*vma).__bindgen_anon_1.__bindgen_anon_1;
        (range.vm_start, range.vm_end, (*vma).vm_page_prot)
    };
    let length = end - start;
    let io = |phys: u64, prot| {
        // SAFETY: `ctx`, `vma` and the referenced `rdma` entry are valid;
        // the length is the entry's (checked by the lookup) and `phys` a
        // device range of that length the entry was created for. The core
        // ties the mapping to the entry and zaps it if the device goes away.
        to_result(unsafe {
            bindings::rdma_user_mmap_io(
                ctx,
                vma,
                (phys >> kernel::page::PAGE_SHIFT) as usize,
                length,
                prot,
                rdma,
            )
        })
    };
    let ret = match &entry.backing {
        // SAFETY: Only computes a page protection value.
        Backing::IoUncached(phys) => io(*phys, unsafe { bindings::refa_pgprot_noncached(prot) }),
        Backing::IoWriteCombining(phys) => {
            // SAFETY: Only computes a page protection value.
            io(*phys, unsafe { bindings::refa_pgprot_writecombine(prot) })
        }
        Backing::Pages(pages) => (0..length / PAGE_SIZE).try_for_each(|i| {
            let offset = i * PAGE_SIZE;
            // SAFETY: `offset` is within the allocation, whose pages the
            // entry keeps alive while referenced; the lookup checked that
            // `length` is the entry's, at most the allocation's size.
            let page =
                unsafe { bindings::refa_virt_to_page(pages.cpu.as_ptr().add(offset).cast()) };
            // SAFETY: `vma` is being set up with the mm lock held; the page
            // is an order-0 page from `alloc_pages_exact()`, which may be
            // inserted, and the mapping takes its own page reference.
            to_result(unsafe { kbindings::vm_insert_page(vma.cast(), start + offset, page.cast()) })
        }),
    };
    // SAFETY: Drops the reference the lookup took.
    unsafe { bindings::rdma_user_mmap_entry_put(rdma) };
    ret
}

/// `mmap_free` of the `ib_device_ops` table: frees an entry whose last
/// reference is gone, handing its token back to the driver.
///
/// # Safety
///
/// Called by the core once per inserted entry of a context of a
/// `Device<O>`, after its last reference.
pub(super) unsafe extern "C" fn mmap_free<O: Operations>(
    rdma: *mut bindings::rdma_user_mmap_entry,
) {
    // SAFETY: The core set the entry's context at insertion and keeps it
    // alive while the entry is (a context is destroyed only after its
    // mappings, which hold entries, are gone or disassociated).
    let ib = unsafe { (*(*rdma).ucontext).device };
    // SAFETY: Inserted entries of contexts of a `Device<O>` are `Entry<O>`
    // allocations from `MmapEntry::insert_entry::<O>`, with `rdma` at offset
    // 0, and nobody uses this one any more.
    let entry = KBox::into_inner(unsafe { KBox::from_raw(rdma.cast::<Entry<O>>()) });
    if let Some(private) = entry.private {
        // SAFETY: The context belongs to a `Device<O>`. An entry's last
        // reference goes while the device is registered: the driver's own
        // with the object it belongs to (destroyed by an operation, or by
        // the core's disassociation while it unregisters), the mappings'
        // when they are unmapped or, at the latest, when the core
        // disassociates them while it unregisters the device.
        unsafe {
            super::device::Device::<O>::from_raw(ib)
                .with_registration_data(|reg| O::mmap_free(reg, private))
        };
    }
}
