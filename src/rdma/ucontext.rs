// SPDX-License-Identifier: GPL-2.0

//! User contexts (`struct ib_ucontext`): one per open of a uverbs device
//! file, the owner of every object and mapping userspace creates through
//! it.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! The core allocates the context with the size the driver registered and
//! zeroes it; [`Operations::alloc_ucontext`] initialises the driver's part
//! in place and [`Operations::dealloc_ucontext`] sees it last, after every
//! object created in the context is destroyed.

use super::{
    bindings,
    device::{
        Device,
        Operations, //
    },
    udata::UData, //
};
use kernel::{
    prelude::*,
    types::Opaque, //
};

/// A user context with the driver's data `O::UContext`.
///
/// # Invariants
///
/// `ib` is at offset 0 of an allocation the core made with
/// `size_of::<Self>()` bytes; `data` is initialised from the end of a
/// successful `alloc_ucontext` until `dealloc_ucontext` drops it.
#[repr(C)]
#[pin_data]
pub(crate) struct UContext<O: Operations> {
    #[pin]
    ib: Opaque<bindings::ib_ucontext>,
    #[pin]
    data: O::UContext,
}

impl<O: Operations> UContext<O> {
    /// The driver's data.
    pub(crate) fn data(&self) -> &O::UContext {
        &self.data
    }

    /// The device the context belongs to.
    pub(crate) fn device(&self) -> &Device<O> {
        // SAFETY: The core sets `device` before calling the driver and the
        // device outlives its contexts; it is a `Device<O>` because only
        // devices with this vtable create `UContext<O>`.
        unsafe { Device::from_raw((*self.ib.get()).device) }
    }

    /// The C `struct ib_ucontext`.
    pub(crate) fn as_raw(&self) -> *mut bindings::ib_ucontext {
        self.ib.get()
    }

    /// Borrows the context from its C pointer.
    ///
    /// # Safety
    ///
    /// `ptr` points to the `ib_ucontext` of a live, initialised
    /// `UContext<O>`.
    pub(crate) unsafe fn from_raw<'a>(ptr: *mut bindings::ib_ucontext) -> &'a Self {
        // SAFETY: `ib` is at offset 0; liveness is the caller's promise.
        unsafe { &*ptr.cast::<Self>() }
    }

    /// `alloc_ucontext` of the `ib_device_ops` table.
    ///
    /// # Safety
    ///
    /// Called by the core with a zeroed allocation of
    /// `size_of::<UContext<O>>()` bytes for a registered `Device<O>`, and
    /// `udata` valid for the call.
    pub(super) unsafe extern "C" fn alloc_callback(
        ctx: *mut bindings::ib_ucontext,
        udata: *mut bindings::ib_udata,
    ) -> kernel::ffi::c_int {
        super::assert_core_allocated!("struct ib_ucontext must be at offset 0");
        // SAFETY: The core set the device pointer before this call.
        let dev = unsafe { Device::<O>::from_raw((*ctx).device) };
        // SAFETY: Valid for the call.
        let mut udata = unsafe { UData::from_raw(udata) };
        // SAFETY: `ctx` is the start of an allocation sized for `Self`.
        let slot = unsafe { &raw mut (*ctx.cast::<Self>()).data };
        // SAFETY: Operations are called only while the device is registered;
        // `slot` is valid, uninitialised memory that stays in place until
        // `dealloc_callback` drops it.
        let ret = unsafe {
            dev.with_registration_data(|reg| {
                let init = O::alloc_ucontext(reg, &mut udata)?;
                pin_init::raw_try_init(slot, init)
            })
        };
        kernel::error::from_result(|| ret.map(|()| 0))
    }

    /// `dealloc_ucontext` of the `ib_device_ops` table.
    ///
    /// # Safety
    ///
    /// Called by the core once, for a context `alloc_callback` initialised.
    pub(super) unsafe extern "C" fn dealloc_callback(ctx: *mut bindings::ib_ucontext) {
        // SAFETY: An initialised `UContext<O>` per the safety requirements.
        let this = unsafe { Self::from_raw(ctx) };
        let dev = this.device();
        // SAFETY: Operations are called only while the device is registered.
        unsafe { dev.with_registration_data(|reg| O::dealloc_ucontext(reg, this)) };
        // SAFETY: The last use of the context: the core frees it after this
        // returns, and `data` is not used again.
        unsafe { core::ptr::drop_in_place(&raw mut (*ctx.cast::<Self>()).data) };
    }

    /// `disassociate_ucontext` of the `ib_device_ops` table.
    ///
    /// Having it tells the core that the device may be unregistered while
    /// userspace still holds the context open: the core then destroys the
    /// context's objects and zaps its I/O mappings itself, instead of
    /// waiting for every process to close the device. The driver has
    /// nothing to add: it maps device memory only through
    /// [`rdma_user_mmap_io()`](super::mmap), which the core tracks, and
    /// kernel pages, which mappings hold by reference.
    ///
    /// # Safety
    ///
    /// Called by the core for a live context.
    pub(super) unsafe extern "C" fn disassociate_callback(_ctx: *mut bindings::ib_ucontext) {}
}
