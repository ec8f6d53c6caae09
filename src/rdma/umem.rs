// SPDX-License-Identifier: GPL-2.0

//! User memory pinned for a device (`struct ib_umem`).
//!
//! C headers: [`include/rdma/ib_umem.h`](srctree/include/rdma/ib_umem.h),
//! [`include/rdma/iter.h`](srctree/include/rdma/iter.h)
//!
//! [`Umem::get`] and its siblings pin memory of the calling process and maps it
//! for DMA by the device; dropping the [`Umem`] unmaps and unpins it. The
//! device sees the range as blocks of one page size, which
//! [`Umem::best_page_size`] picks among those the device supports and
//! [`Umem::dma_blocks`] lists, with the core's block iterator.

use super::{
    bindings,
    udata::{
        AttrId,
        UData, //
    }, //
};
use core::ptr::NonNull;
use kernel::{
    prelude::*,
    sync::aref::ARef, //
};

kernel::impl_flags!(
    /// Access rights of memory registered with a device
    /// (`enum ib_access_flags`); none is local read only.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub(crate) struct AccessFlags(u32);

    /// One access right (`enum ib_access_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Access {
        /// The device may write to the memory (receives, RDMA read targets).
        LocalWrite = bindings::ib_access_flags_IB_ACCESS_LOCAL_WRITE,
        /// Remote peers may write to the memory (RDMA write).
        RemoteWrite = bindings::ib_access_flags_IB_ACCESS_REMOTE_WRITE,
        /// Remote peers may read the memory (RDMA read).
        RemoteRead = bindings::ib_access_flags_IB_ACCESS_REMOTE_READ,
        /// Remote peers may do atomic operations on the memory.
        RemoteAtomic = bindings::ib_access_flags_IB_ACCESS_REMOTE_ATOMIC,
        /// Memory windows may be bound to the region.
        MwBind = bindings::ib_access_flags_IB_ACCESS_MW_BIND,
        /// The device may reorder writes to the memory (a hint).
        RelaxedOrdering = bindings::ib_access_flags_IB_ACCESS_RELAXED_ORDERING,
        /// Hints a device may ignore (`IB_ACCESS_OPTIONAL`, relaxed ordering
        /// among them): never a reason to refuse a registration.
        Optional = bindings::ib_access_flags_IB_ACCESS_OPTIONAL,
    }
);

impl AccessFlags {
    // series: begin mr
    /// The rights as the core passes them, unknown bits included.
    pub(super) const fn from_raw(raw: u32) -> Self {
        Self(raw)
    }
    // series: end mr

    /// The raw bits, unknown ones included.
    pub(crate) const fn bits(self) -> u32 {
        self.0
    }

    /// The bits of `self` outside `known`, unknown ones included (unlike
    /// `self & !known`, which keeps only the bits of declared rights).
    pub(crate) const fn outside(self, known: AccessFlags) -> u32 {
        self.0 & !known.0
    }
}

/// A range of user memory pinned and mapped for DMA by a device.
///
/// # Invariants
///
/// `raw` came from a successful `ib_umem_get*()` and is released only by
/// the drop. This holds a reference on the memory of the `ib_device` the
/// umem was made for (`umem->ibdev`), and `_dma_device` one on its DMA
/// device (`ibdev->dma_device`), which the release unmaps the pages for:
/// both stay allocated until the release, even after an unbind.
pub(crate) struct Umem {
    raw: NonNull<bindings::ib_umem>,
    _dma_device: Option<ARef<kernel::device::Device>>,
    /// The page size [`Umem::best_page_size`] found last, 0 before.
    best: usize,
}

impl Umem {
    /// Pins `length` bytes of the calling process's memory at `addr` for
    /// the device of `call`, with `access` rights (writable memory for any
    /// write right).
    ///
    /// `call` proves that this runs in the system call of the process whose
    /// memory it is ([`UData`]): the core pins the current task's pages.
    pub(crate) fn get(
        call: &UData<'_>,
        addr: u64,
        length: u64,
        access: AccessFlags,
    ) -> Result<Self> {
        let addr = usize::try_from(addr).map_err(|_| EINVAL)?;
        let length = usize::try_from(length).map_err(|_| EINVAL)?;
        let access = kernel::ffi::c_int::try_from(access.bits()).map_err(|_| EINVAL)?;
        // SAFETY: The device of a live call. The current task is the calling
        // process (the invariant of `UData`), so `current->mm` is its address
        // space; the core checks the range against it and fails cleanly.
        let raw = unsafe { bindings::ib_umem_get_va(call.device_raw(), addr, length, access) };
        let raw = kernel::error::from_err_ptr(raw)?;
        let raw = NonNull::new(raw).ok_or(EINVAL)?;
        // SAFETY: A umem the core just made, owned by nobody else.
        Ok(unsafe { Self::from_raw(raw) })
    }

    /// Pins `length` bytes at `offset` of the calling process's dma-buf
    /// `fd` for the device of `call`, with `access` rights: the exporter
    /// keeps the pages in place until the drop (the core's pinned dma-buf
    /// attachment).
    pub(crate) fn get_dmabuf(
        call: &UData<'_>,
        offset: u64,
        length: u64,
        fd: i32,
        access: AccessFlags,
    ) -> Result<Self> {
        let offset = kernel::ffi::c_ulong::try_from(offset).map_err(|_| EINVAL)?;
        let length = usize::try_from(length).map_err(|_| EINVAL)?;
        let access = kernel::ffi::c_int::try_from(access.bits()).map_err(|_| EINVAL)?;
        // SAFETY: The device of a live call; the current task is the calling
        // process (the invariant of `UData`), in whose file table the core
        // looks the descriptor up, and it checks the range against the buffer.
        let raw = unsafe {
            bindings::ib_umem_dmabuf_get_pinned(call.device_raw(), offset, length, fd, access)
        };
        let raw = kernel::error::from_err_ptr(raw)?;
        let raw = NonNull::new(raw).ok_or(EINVAL)?;
        // SAFETY: The umem is the first member of the dma-buf umem the core
        // just made, owned by nobody else; `ib_umem_release()` recognises it
        // as a dma-buf one and releases the whole.
        Ok(unsafe { Self::from_raw(NonNull::from(&mut (*raw.as_ptr()).umem)) })
    }

    /// Pins the memory userspace passed for a CQ's ring with the call (the
    /// core's `CREATE_CQ_BUFFER_*` attributes: an address range or a
    /// dma-buf), which must hold at least `min_len` bytes, writable by the
    /// device; `None` if it passed none.
    pub(crate) fn from_cq_buffer(call: &UData<'_>, min_len: usize) -> Result<Option<Self>> {
        let access = AccessFlags::from(Access::LocalWrite).bits() as kernel::ffi::c_int;
        // SAFETY: The device and the bundle of a live user call, in the
        // calling process (the invariant of `UData`); the core validates the
        // attributes and the range, and returns null when there are none.
        let raw = unsafe {
            bindings::ib_umem_get_cq_buf(call.device_raw(), call.bundle_raw(), min_len, access)
        };
        let raw = kernel::error::from_err_ptr(raw)?;
        // SAFETY: A umem the core just made for the caller, owned by nobody
        // else.
        Ok(NonNull::new(raw).map(|raw| unsafe { Self::from_raw(raw) }))
    }

    /// Pins the memory userspace described in buffer attribute `id` of the
    /// call (a `struct ib_uverbs_buffer_desc`: an address range or a
    /// dma-buf), which must hold at least `min_len` bytes with `access`
    /// rights. An error if the call has no such attribute.
    pub(crate) fn from_buffer_attr(
        call: &UData<'_>,
        id: AttrId,
        min_len: usize,
        access: AccessFlags,
    ) -> Result<Self> {
        let access = kernel::ffi::c_int::try_from(access.bits()).map_err(|_| EINVAL)?;
        // SAFETY: The device and the bundle of a live user call, in the
        // calling process (the invariant of `UData`). The core reads the
        // attribute through `uverbs_get_buffer_desc()`, whose lookup indexes
        // the bundle's bitmap with the id, in bounds for an `AttrId` (its
        // invariant); it checks that the call has the attribute and that it
        // is a buffer descriptor, and validates the range.
        let raw = unsafe {
            bindings::ib_umem_get_attr(
                call.device_raw(),
                call.bundle_raw(),
                id.raw(),
                min_len,
                access,
            )
        };
        let raw = NonNull::new(kernel::error::from_err_ptr(raw)?).ok_or(EINVAL)?;
        // SAFETY: A umem the core just made for the caller, owned by nobody
        // else.
        Ok(unsafe { Self::from_raw(raw) })
    }

    /// Takes ownership of `raw`.
    ///
    /// # Safety
    ///
    /// `raw` is a umem the core made (`ib_umem_get*()`), owned by the caller
    /// and released by nobody else.
    unsafe fn from_raw(raw: NonNull<bindings::ib_umem>) -> Self {
        // SAFETY: `umem->ibdev` is the live device the umem was made for;
        // the reference is dropped after the umem is released.
        let ibdev = unsafe {
            let ibdev = (*raw.as_ptr()).ibdev;
            bindings::ib_device_get(ibdev);
            ibdev
        };
        // SAFETY: The device is live (above). Its DMA device is set once,
        // by `ib_register_device()`; the umem was made in a call on the
        // registered device, which cannot be unregistered during the call, and
        // while registered its `struct device` holds a reference on its
        // parent, the DMA device the layer registers it with. Null only for
        // devices without DMA (software devices).
        let dma_device = unsafe { (*ibdev).dma_device };
        let dma_device = if dma_device.is_null() {
            None
        } else {
            // SAFETY: Non-null, valid and referenced (above); a `struct
            // device` may be released from any thread. The cast is between
            // the bindings' and the kernel crate's copies of the same C
            // `struct device`.
            Some(unsafe { kernel::device::Device::get_device(dma_device.cast()) })
        };
        // INVARIANT: An owned umem from the core, and the device references.
        Self {
            raw,
            _dma_device: dma_device,
            best: 0,
        }
    }

    /// The DMA address of the range if the device sees it as one
    /// contiguous block, `None` otherwise.
    pub(crate) fn contiguous_dma_address(&mut self) -> Option<u64> {
        // SAFETY: The umem is live (type invariant) and exclusively borrowed:
        // the check looks for the best page size, which sets its `iova`.
        if !unsafe { bindings::ib_umem_is_contiguous(self.raw.as_ptr()) } {
            return None;
        }
        // A later `dma_blocks()` must not rely on a page size from before.
        self.best = 0;
        Some(self.start_dma_address())
    }

    /// The DMA address of the first byte of the range.
    pub(crate) fn start_dma_address(&self) -> u64 {
        // SAFETY: The umem is live (type invariant); the helper only reads
        // its scatterlist.
        unsafe { bindings::ib_umem_start_dma_addr(self.raw.as_ptr()) }
    }

    /// The largest page size in `page_sizes` (bit `n` = `1 << n` bytes)
    /// that can describe the range when the device sees its first byte at
    /// I/O virtual address `iova`, or `None` if none can. Records `iova` as
    /// the range's address for [`Self::dma_blocks`].
    pub(crate) fn best_page_size(&mut self, page_sizes: u64, iova: u64) -> Option<usize> {
        let page_sizes = kernel::ffi::c_ulong::try_from(page_sizes).ok()?;
        // SAFETY: The umem is live (type invariant) and exclusively borrowed:
        // the function reads its scatterlist and sets its `iova`.
        let size = unsafe { bindings::ib_umem_find_best_pgsz(self.raw.as_ptr(), page_sizes, iova) };
        self.best = size;
        (self.best != 0).then_some(self.best)
    }

    /// The DMA addresses of the blocks of `page_size` bytes that cover the
    /// range, in order, from the block holding the recorded I/O virtual
    /// address on. `page_size` must be the one [`Self::best_page_size`]
    /// found last, or at most `PAGE_SIZE`, as the core's iterator requires
    /// (`EINVAL` otherwise).
    pub(crate) fn dma_blocks(&self, page_size: usize) -> Result<DmaBlocks<'_>> {
        let valid = page_size.is_power_of_two()
            && (page_size <= kernel::page::PAGE_SIZE || page_size == self.best);
        if !valid {
            return Err(EINVAL);
        }
        let pgsz = page_size as kernel::ffi::c_ulong;
        // SAFETY: The umem is live; the helper only reads its fields.
        let count = unsafe { bindings::ib_umem_num_dma_blocks(self.raw.as_ptr(), pgsz) };
        let mut iter = bindings::ib_block_iter::default();
        // SAFETY: The umem is live and its scatterlist stays unchanged while
        // the iterator borrows it; `page_size` is valid as checked above.
        unsafe { bindings::__rdma_umem_block_iter_start(&mut iter, self.raw.as_ptr(), pgsz) };
        Ok(DmaBlocks {
            iter,
            left: count,
            _umem: self,
        })
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        let raw = self.raw.as_ptr();
        // SAFETY: The umem is live; its device stays allocated through the
        // reference this holds.
        let ibdev = unsafe { (*raw).ibdev };
        // SAFETY: Released once, here; nothing uses it afterwards.
        unsafe { bindings::ib_umem_release(raw) };
        // SAFETY: The reference taken in `from_raw()`.
        unsafe { bindings::ib_device_put(ibdev) };
    }
}

// SAFETY: A umem may be used and released from any thread; the process it
// was pinned for is recorded in it (`owning_mm`).
unsafe impl Send for Umem {}
// SAFETY: Shared access only reads the umem.
unsafe impl Sync for Umem {}

/// The DMA addresses of the blocks of a [`Umem`] (the core's
/// `rdma_umem_for_each_dma_block()`).
pub(crate) struct DmaBlocks<'a> {
    iter: bindings::ib_block_iter,
    left: usize,
    _umem: &'a Umem,
}

impl Iterator for DmaBlocks<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.left == 0 {
            return None;
        }
        // SAFETY: The iterator was started on the umem this borrows, which
        // stays live and unchanged.
        if !unsafe { bindings::__rdma_umem_block_iter_next(&mut self.iter) } {
            self.left = 0;
            return None;
        }
        self.left -= 1;
        // SAFETY: The iterator holds a current block after a successful step.
        Some(unsafe { bindings::rdma_block_iter_dma_address(&mut self.iter) })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for DmaBlocks<'_> {}

// series: begin mr
#[kunit_tests(refa_rdma_umem)]
mod tests {
    use super::*;

    /// Rights outside the known ones include the bits no right declares,
    /// which `impl_flags!`'s `!` would drop.
    #[test]
    fn unknown_access_bits_are_outside_every_set() {
        let local = AccessFlags::from(Access::LocalWrite);
        let asked = AccessFlags::from_raw(u32::from(local) | 1 << 30);
        assert_eq!(asked.outside(local | Access::Optional), 1 << 30);
        assert_eq!(local.outside(local | Access::Optional), 0);
        assert!(asked.contains(Access::LocalWrite));
    }
}
// series: end mr
