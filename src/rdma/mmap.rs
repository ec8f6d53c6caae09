// SPDX-License-Identifier: GPL-2.0

//! User mappings through `rdma_user_mmap_entry` cookies.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! An object created in a user context offers memory to it while it is
//! being created: the create operation inserts entries through the
//! [`MmapSet`] it is given, and gets back the cookies (the offsets
//! userspace passes to `mmap()`). The entries then belong to the object,
//! never to the driver: the layer withdraws them when the object is
//! destroyed (or earlier, when the driver asks,
//! [`Object::withdraw_mappings`](super::device::Object::withdraw_mappings)),
//! and the core destroys every object of a context before the context. So
//! no entry outlives its context, by construction: the driver holds only
//! cookies, which are plain numbers.
//!
//! The `mmap` operation looks a cookie up in the context that maps
//! ([`MmapRequest`]), checks the length and maps what the entry holds.
//! Cookies are per context: another context's cookie is unknown there.
//!
//! Lifetimes follow the core's reference count on the entry. The object
//! holds one reference until it withdraws the entry; each I/O mapping
//! holds another until it is unmapped, or until the core zaps it when the
//! device goes away. Withdrawing does not take existing mappings away: the
//! entry, and what it owns, is freed in `mmap_free` when the last
//! reference goes, and a driver that must not reuse what a mapping still
//! reaches (device memory another process would get next) learns the
//! moment from [`Operations::mmap_free`](super::device::Operations::mmap_free),
//! which gets back the token the entry was inserted with
//! ([`MmapSet::insert_with_private`]). Kernel pages are different: a
//! mapping of them holds page references, not the entry, so the pages
//! outlive the entry for as long as userspace maps them, and the device
//! stops using them when the driver destroys the object that owned them.

use super::bindings;
// in tree: use kernel::io::IoPages;
// out of tree: begin
use crate::kernel_gaps::pci::IoPages;
// out of tree: end
use core::{
    marker::PhantomData,
    ptr::NonNull, //
};
use kernel::{
    bindings as kbindings,
    device,
    error::to_result,
    mm::virt::VmaNew,
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
    task::Task,
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
        PAGE_SIZE << kbindings::MAX_PAGE_ORDER
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
        let cpu = unsafe { bindings::alloc_pages_exact(size, gfp) };
        let cpu = NonNull::new(cpu.cast::<u8>()).ok_or(ENOMEM)?;
        let raw_dev = bindings::device_raw(dev);
        // SAFETY: `cpu` is `size` bytes of kernel memory that stay allocated
        // until the mapping is undone; `dev` is bound, so it can map DMA.
        let dma =
            unsafe { bindings::dma_map_single(raw_dev, cpu.as_ptr().cast(), size, dir.into_raw()) };
        // SAFETY: `dma` was just returned for `dev`.
        if unsafe { bindings::dma_mapping_error(raw_dev, dma) } != 0 {
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
        let raw_dev = bindings::device_raw(&*self.dev);
        // SAFETY: Mapped for this device with this size and direction (type
        // invariant); the owner of the last reference has made sure the
        // device no longer writes to it.
        unsafe { bindings::dma_unmap_single(raw_dev, self.dma, self.size, self.dir.into_raw()) };
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

/// What an mmap entry maps.
pub(crate) enum Backing {
    /// Pages of a device's BAR (a doorbell page), uncached.
    IoUncached(IoPages),
    /// Pages of a device's BAR (a push buffer), write-combining.
    IoWriteCombining(IoPages),
    /// Kernel pages, shared with the driver.
    Pages(Arc<DmaPages>),
}

/// The entry the core tracks, with what it maps and the driver's token `P`.
///
/// # Invariants
///
/// `rdma` is at offset 0. Once inserted, the allocation belongs to the
/// core's reference count and is freed by [`free_entry`].
#[repr(C)]
struct Entry<P> {
    rdma: Opaque<bindings::rdma_user_mmap_entry>,
    backing: Backing,
    /// Handed back to the driver when the entry is freed.
    private: Option<P>,
    /// For an entry with a token: the thread that created its object,
    /// which maps it first.
    creator: Option<Creator>,
}

/// The thread that created an object, and whether it has mapped the entry
/// yet.
///
/// # Invariants
///
/// `pid` is a `struct pid` this holds a reference on.
struct Creator {
    pid: NonNull<bindings::pid>,
    mapped: AtomicFlag,
}

impl Creator {
    /// The calling thread.
    fn current() -> Option<Self> {
        // SAFETY: The calling thread is live while it runs, and so is its
        // pid, on which this takes a reference.
        let pid = NonNull::new(unsafe {
            bindings::get_pid(bindings::task_pid(Task::current_raw().cast()))
        })?;
        // INVARIANT: The reference just taken.
        Some(Self {
            pid,
            mapped: AtomicFlag::new(false),
        })
    }

    /// Whether the calling thread may map the entry: the creator may, and
    /// anyone once the creator has.
    fn lets_current_map(&self) -> bool {
        if self.mapped.load(Relaxed) {
            return true;
        }
        // SAFETY: The calling thread is live while it runs; only its pid's
        // address is read, to compare it with `pid`.
        if unsafe { bindings::task_pid(Task::current_raw().cast()) } != self.pid.as_ptr() {
            return false;
        }
        self.mapped.store(true, Relaxed);
        true
    }
}

impl Drop for Creator {
    fn drop(&mut self) {
        // SAFETY: The reference `current` took (type invariant).
        unsafe { bindings::put_pid(self.pid.as_ptr()) };
    }
}

// SAFETY: `struct pid` references may be taken, compared and dropped from
// any thread.
unsafe impl Send for Creator {}
// SAFETY: Shared references only compare the pointer and use the atomic.
unsafe impl Sync for Creator {}

/// An inserted entry and whether its reference was dropped already.
struct Inserted {
    entry: NonNull<bindings::rdma_user_mmap_entry>,
    withdrawn: AtomicFlag,
}

/// The mmap entries of one object.
///
/// # Invariants
///
/// Every entry was inserted in a user context that outlives `self`; until
/// its `withdrawn` flag is set, `self` holds the reference the insertion
/// created.
pub(crate) struct Mappings {
    entries: KVec<Inserted>,
}

impl Mappings {
    /// No entries.
    pub(super) const fn new() -> Self {
        Self {
            entries: KVec::new(),
        }
    }

    /// Takes every cookie away from userspace now: later `mmap()` calls with
    /// them fail, mappings made with them stay until unmapped. Entries
    /// without mappings are freed (and their tokens handed back) before this
    /// returns. Withdrawing twice does nothing more.
    pub(super) fn withdraw(&self) {
        for inserted in self.entries.iter() {
            if inserted.withdrawn.xchg(true, Relaxed) {
                continue;
            }
            // SAFETY: Inserted, and this reference is still held (type
            // invariant: the flag was clear and is set now, once). This drops
            // it; the core frees the entry through `mmap_free` when the
            // mappings holding it are gone. The context is alive (type
            // invariant), and with it its table of entries.
            unsafe { bindings::rdma_user_mmap_entry_remove(inserted.entry.as_ptr()) };
        }
    }
}

impl Drop for Mappings {
    fn drop(&mut self) {
        self.withdraw();
    }
}

// SAFETY: The core's entry functions may be called from any thread, and the
// entries' backings and tokens are `Send`.
unsafe impl Send for Mappings {}
// SAFETY: Shared references only withdraw entries, each once, under its
// atomic flag.
unsafe impl Sync for Mappings {}

/// Memory an object being created offers to its user context.
///
/// Entries inserted here belong to the object once it is created, and are
/// withdrawn if its creation fails. `P` is the driver's token type
/// ([`Operations::MmapPrivate`](super::device::Operations::MmapPrivate)).
///
/// # Invariants
///
/// `ctx` is the live user context of the call creating the object, and the
/// context of every entry of `mappings`.
pub(crate) struct MmapSet<'a, P> {
    ctx: NonNull<bindings::ib_ucontext>,
    mappings: Mappings,
    _call: PhantomData<(&'a bindings::ib_ucontext, P)>,
}

impl<P: Send + Sync + 'static> MmapSet<'_, P> {
    // series: begin cq
    /// An empty set for an object of `ctx`.
    ///
    /// # Safety
    ///
    /// `ctx` is the user context of a call creating an object, alive for the
    /// lifetime of the set and longer than the object it is handed to.
    pub(super) unsafe fn new(ctx: NonNull<bindings::ib_ucontext>) -> Self {
        // INVARIANT: Per the safety requirements; no entries yet.
        Self {
            ctx,
            mappings: Mappings::new(),
            _call: PhantomData,
        }
    }
    // series: end cq

    /// Offers `length` bytes of `backing` to the context, rounded up to whole
    /// pages: a mapping must have exactly that size. Returns the cookie.
    pub(crate) fn insert(&mut self, backing: Backing, length: usize) -> Result<u64> {
        self.insert_entry(backing, length, None)
    }

    /// As [`MmapSet::insert`], with a token for
    /// [`Operations::mmap_free`](super::device::Operations::mmap_free), which
    /// gets it when the entry is freed: once it is withdrawn and no mapping
    /// of it is left. If the insertion fails the token is dropped.
    ///
    /// Such an entry keeps something alive for as long as it is mapped, so
    /// it is mapped first by the thread creating the object, as every
    /// userspace library does, right after the creation returns; until
    /// then other threads get `EAGAIN`. The core may still undo a creation
    /// after the driver's part succeeded (when it cannot copy its own
    /// response out), as if userspace destroyed the object: the thread
    /// that created it is still in that call, so nothing of the object can
    /// be mapped, and nothing is kept, when that happens. Another thread
    /// could otherwise map the entry in that window (its cookie is in the
    /// response, or guessed), and the object would be kept with nobody
    /// able to refuse it.
    pub(crate) fn insert_with_private(
        &mut self,
        backing: Backing,
        length: usize,
        private: P,
    ) -> Result<u64> {
        self.insert_entry(backing, length, Some(private))
    }

    fn insert_entry(&mut self, backing: Backing, length: usize, private: Option<P>) -> Result<u64> {
        // The mapping has the entry's length rounded up to whole pages,
        // which must all be the backing's.
        let size = match &backing {
            Backing::Pages(pages) => pages.size(),
            Backing::IoUncached(io) | Backing::IoWriteCombining(io) => io.len(),
        };
        if length > size {
            return Err(EINVAL);
        }
        // Room first: once inserted, the entry must be recorded.
        self.mappings.entries.reserve(1, GFP_KERNEL)?;
        let creator = match private {
            Some(_) => Some(Creator::current().ok_or(EINVAL)?),
            None => None,
        };
        let entry = KBox::new(
            Entry::<P> {
                rdma: Opaque::zeroed(),
                backing,
                private,
                creator,
            },
            GFP_KERNEL,
        )?;
        let raw = KBox::into_raw(entry);
        // SAFETY: `ctx` is a live context (type invariant); the entry is
        // zeroed as the core wants and stays allocated until `free_entry`,
        // or until below if the insertion fails.
        let ret = unsafe {
            bindings::rdma_user_mmap_entry_insert(self.ctx.as_ptr(), (*raw).rdma.get(), length)
        };
        if let Err(e) = to_result(ret) {
            // SAFETY: Not inserted, so still ours; from `into_raw` above.
            drop(unsafe { KBox::from_raw(raw) });
            return Err(e);
        }
        // SAFETY: Inserted, and the insertion's reference keeps it alive;
        // the core set `start_pgoff` and never changes it.
        let pgoff = unsafe { (*(*raw).rdma.get()).start_pgoff };
        // SAFETY: `raw` is from `KBox::into_raw`, never null, and `rdma` is a
        // field of it.
        let entry = unsafe { NonNull::new_unchecked((*raw).rdma.get()) };
        // INVARIANT: Inserted in `ctx`; the insertion's reference is the set's.
        self.mappings
            .entries
            .push_within_capacity(Inserted {
                entry,
                withdrawn: AtomicFlag::new(false),
            })
            .map_err(|_| ENOMEM)?;
        Ok((pgoff as u64) << kernel::page::PAGE_SHIFT)
    }

    // series: begin cq
    /// The entries, for the object they were inserted for.
    pub(super) fn into_mappings(self) -> Mappings {
        self.mappings
    }
    // series: end cq
}

/// A user's `mmap()` of a context, being set up: a cookie (the offset) and
/// a length.
///
/// # Invariants
///
/// `ctx` is a live user context whose entries are `Entry<P>`s, and `vma` a
/// mapping of it being set up by `mmap()`, with the mm's lock held for
/// writing, for `'a`.
pub(crate) struct MmapRequest<'a, P> {
    ctx: *mut bindings::ib_ucontext,
    vma: *mut bindings::vm_area_struct,
    _call: PhantomData<(&'a bindings::vm_area_struct, P)>,
}

impl<P> MmapRequest<'_, P> {
    /// The request of an `mmap` call.
    ///
    /// # Safety
    ///
    /// `ctx` and `vma` are as the type invariants say, for the lifetime of
    /// the request.
    pub(super) unsafe fn from_raw(
        ctx: *mut bindings::ib_ucontext,
        vma: *mut bindings::vm_area_struct,
    ) -> Self {
        // INVARIANT: Per the safety requirements.
        Self {
            ctx,
            vma,
            _call: PhantomData,
        }
    }

    /// Maps the entry whose cookie is the offset of the mapping, if the
    /// context has one and the length is the entry's; `EINVAL` otherwise.
    pub(crate) fn map(self) -> Result {
        let (ctx, vma) = (self.ctx, self.vma);
        // SAFETY: Per the type invariants. The lookup fails for unknown
        // cookies and for a length other than the entry's, and takes a
        // reference on success.
        let rdma = unsafe { bindings::rdma_user_mmap_entry_get(ctx, vma) };
        if rdma.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: Every entry of the context is an `Entry<P>` (type
        // invariant), with `rdma` at offset 0, and the reference keeps it
        // alive.
        let entry = unsafe { &*rdma.cast::<Entry<P>>() };
        if entry
            .creator
            .as_ref()
            .is_some_and(|c| !c.lets_current_map())
        {
            // SAFETY: Drops the reference the lookup took.
            unsafe { bindings::rdma_user_mmap_entry_put(rdma) };
            return Err(EAGAIN);
        }
        // SAFETY: `vma` is valid (type invariant), and while it is set up its
        // range is the `vm_start`/`vm_end` variant of the union (the RCU head
        // is used only when it is freed).
        let (start, end, prot) = unsafe {
            let range = &(*vma).__bindgen_anon_1.__bindgen_anon_1;
            (range.vm_start, range.vm_end, (*vma).vm_page_prot)
        };
        let length = end - start;
        let io = |pages: &IoPages, prot| {
            // fork() copies the page table entries of a device mapping
            // after the core's open operation ran for the child's copy;
            // when that cannot track the copy (its allocation fails, or it
            // races the device's removal), it zaps the copy before there is
            // anything to zap, and the child keeps the device pages
            // untracked: the core never zaps them, they hold no reference
            // on the entry, and once the object is destroyed they reach
            // whatever the device puts there next, maybe another process's
            // queue (tests/vm/test_fork_zap.py). So fork() gives a child no
            // copy of a device mapping; the child of a verbs process cannot
            // use its parent's objects anyway, and userspace cannot undo it
            // (`MADV_DOFORK` refuses device mappings).
            // SAFETY: `vma` is being set up by `mmap()` for the lifetime of
            // the request (type invariant).
            unsafe { VmaNew::from_raw(vma.cast()) }.set_dontcopy();
            // SAFETY: `ctx`, `vma` and the referenced `rdma` entry are valid.
            // The length is the entry's (checked by the lookup), at most the
            // length of `pages` (checked at insertion), which are whole pages
            // of a device's BAR, never RAM (invariant of `IoPages`). The core
            // ties the mapping to the entry and zaps it when the device is
            // unregistered.
            to_result(unsafe {
                bindings::rdma_user_mmap_io(
                    ctx,
                    vma,
                    (pages.phys() >> kernel::page::PAGE_SHIFT) as usize,
                    length,
                    prot,
                    rdma,
                )
            })
        };
        let ret = match &entry.backing {
            Backing::IoUncached(pages) => {
                // SAFETY: Only computes a page protection value.
                io(pages, unsafe { bindings::pgprot_noncached(prot) })
            }
            Backing::IoWriteCombining(pages) => {
                // SAFETY: Only computes a page protection value.
                io(pages, unsafe { bindings::pgprot_writecombine(prot) })
            }
            Backing::Pages(pages) => (0..length / PAGE_SIZE).try_for_each(|i| {
                let offset = i * PAGE_SIZE;
                // SAFETY: `offset` is within the allocation, whose pages the
                // entry keeps alive while referenced; the lookup checked that
                // `length` is the entry's, at most the allocation's size.
                let page = unsafe { bindings::virt_to_page(pages.cpu.as_ptr().add(offset).cast()) };
                // SAFETY: `vma` is being set up with the mm lock held; the page
                // is an order-0 page from `alloc_pages_exact()`, which may be
                // inserted, and the mapping takes its own page reference.
                to_result(unsafe {
                    kbindings::vm_insert_page(vma.cast(), start + offset, page.cast())
                })
            }),
        };
        // SAFETY: Drops the reference the lookup took.
        unsafe { bindings::rdma_user_mmap_entry_put(rdma) };
        ret
    }
}

/// Frees an entry whose last reference is gone (`mmap_free`); returns its
/// token.
///
/// # Safety
///
/// `rdma` is an entry the core hands back once, after its last reference,
/// inserted by an [`MmapSet<'_, P>`] and not used by anyone any more.
pub(super) unsafe fn free_entry<P>(rdma: *mut bindings::rdma_user_mmap_entry) -> Option<P> {
    // SAFETY: Per the safety requirements: a `KBox<Entry<P>>` leaked by
    // `MmapSet::insert_entry`, with `rdma` at offset 0, used by nobody else.
    let entry = KBox::into_inner(unsafe { KBox::from_raw(rdma.cast::<Entry<P>>()) });
    entry.private
}
