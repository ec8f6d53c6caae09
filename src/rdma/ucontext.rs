// SPDX-License-Identifier: GPL-2.0

//! User contexts (`struct ib_ucontext`): one per open of a uverbs device
//! file, the owner of every object and mapping userspace creates through
//! it.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! The core allocates the context with the size the layer registered and
//! zeroes it; [`DriverUContext::alloc`] initialises the driver's part in
//! place and [`DriverUContext::dealloc`] sees it last, after every object
//! created in the context is destroyed.
// series: begin mmap
//!
//! `mmap()` of the uverbs file comes to [`DriverUContext::mmap`], which
//! maps what an object of the context offered (see [`super::mmap`]).
// series: end mmap

use super::{
    bindings,
    device::{
        kind,
        Device,
        DriverObject,
        Layer,
        NewObject,
        Object,
        // series: begin mmap
        Operations,
        // series: end mmap
        RegData, //
    },
    // series: begin mmap
    mmap::{
        self,
        MmapRequest, //
    },
    // series: end mmap
    udata::UData, //
};
use core::ptr::NonNull;
use kernel::prelude::*;

/// A user context with the driver's data `T`.
pub(crate) type UContext<T> = Object<T>;

/// The driver's part of a user context.
pub(crate) trait DriverUContext: DriverObject<Kind = kind::UContext> {
    /// Creates the driver's part of a new user context; `udata` carries the
    /// driver's request and response.
    ///
    /// Whatever can fail happens before this returns: the initialiser cannot
    /// fail, so nothing the driver did on the device needs undoing once it
    /// returned `Ok`.
    fn alloc<'a>(
        dev: &Device<Self::Driver>,
        data: &RegData<'a, Self::Driver>,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self>>;

    /// Releases what the driver's part of a user context holds on the
    /// device. Called once, when every object created in the context is
    /// gone; the data is dropped after this.
    fn dealloc<'a>(
        ctx: &UContext<Self>,
        dev: &Device<Self::Driver>,
        data: &RegData<'a, Self::Driver>,
    );

    // series: begin mmap
    /// Maps what `request` asks for (a cookie and a length) into the
    /// process; by default, what an object of the context offered for the
    /// cookie ([`MmapRequest::map`]). A driver overrides this to count
    /// failures, say.
    fn mmap<'a>(
        _ctx: &UContext<Self>,
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
        request: MmapRequest<'_, <Self::Driver as Operations>::MmapPrivate>,
    ) -> Result {
        request.map()
    }
    // series: end mmap
}

/// `alloc_ucontext` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core with a zeroed allocation of `size_of::<UContext<T>>()`
/// bytes for a registered device of `T::Driver`, and `udata` null or the
/// driver udata of the user call creating it, valid for the call.
pub(super) unsafe extern "C" fn alloc_callback<T: DriverUContext>(
    ctx: *mut bindings::ib_ucontext,
    udata: *mut bindings::ib_udata,
) -> kernel::ffi::c_int {
    // SAFETY: The core set the device before this call; a non-null `udata`
    // is the driver udata of the user call, in the calling process.
    let Some(mut udata) = (unsafe { UData::from_raw((*ctx).device, udata) }) else {
        // No kernel verbs: kernel callers get no context.
        return EOPNOTSUPP.to_errno();
    };
    // SAFETY: `ctx` is the start of an allocation sized for `UContext<T>` for
    // a device of `T::Driver`, which nobody else uses before this returns and
    // which stays in place until `dealloc_callback`.
    let slot = unsafe { NewObject::<T>::new(NonNull::new_unchecked(ctx)) };
    let alloc = |dev: &Device<T::Driver>, data: &RegData<'_, T::Driver>| -> Result {
        let init = T::alloc(dev, data, &mut udata)?;
        slot.init(Layer::new(), init);
        Ok(())
    };
    // SAFETY: The core set the device, a registered device of `T::Driver`,
    // before this call.
    let ret = unsafe { UContext::<T>::with_driver(ctx, alloc) };
    kernel::error::from_result(|| ret.map(|()| 0))
}

/// `dealloc_ucontext` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core once, for a context `alloc_callback` initialised.
pub(super) unsafe extern "C" fn dealloc_callback<T: DriverUContext>(
    ctx: *mut bindings::ib_ucontext,
) {
    // SAFETY: An initialised `UContext<T>` per the safety requirements.
    let this = unsafe { UContext::<T>::from_raw(ctx) };
    // SAFETY: Operations run only while the device is registered.
    unsafe { UContext::<T>::with_driver(ctx, |dev, data| T::dealloc(this, dev, data)) };
    // SAFETY: The last use of the context: the core frees it after this
    // returns.
    unsafe { UContext::<T>::drop_in_place(ctx, true) };
}

/// `disassociate_ucontext` of the `ib_device_ops` table.
///
/// Having it tells the core that the device may be unregistered while
/// userspace still holds the context open: the core then destroys the
/// context's objects and zaps its I/O mappings itself, instead of waiting
/// for every process to close the device. The layer has nothing to add: it
/// maps device memory only through `rdma_user_mmap_io()`, which the core
/// tracks, and kernel pages, which mappings hold by reference.
///
/// # Safety
///
/// Called by the core for a live context.
pub(super) unsafe extern "C" fn disassociate_callback(_ctx: *mut bindings::ib_ucontext) {}

// series: begin mmap
/// `mmap` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core for a live context of a device of `T::Driver`, with
/// `vma` being set up by `mmap()` (the mm's lock held for writing).
pub(super) unsafe extern "C" fn mmap_callback<T: DriverUContext>(
    ctx: *mut bindings::ib_ucontext,
    vma: *mut bindings::vm_area_struct,
) -> kernel::ffi::c_int {
    // SAFETY: An initialised `UContext<T>`: the core maps only through
    // contexts whose creation succeeded.
    let this = unsafe { UContext::<T>::from_raw(ctx) };
    // SAFETY: The context and the mapping are valid for the call, and every
    // entry of a context of `T::Driver` was inserted through an
    // `MmapSetOf<T::Driver>`.
    let request = unsafe { MmapRequest::from_raw(ctx, vma) };
    // SAFETY: Operations run only while the device is registered.
    let ret =
        unsafe { UContext::<T>::with_driver(ctx, |dev, data| T::mmap(this, dev, data, request)) };
    kernel::error::from_result(|| ret.map(|()| 0))
}

/// `mmap_free` of the `ib_device_ops` table: frees an entry whose last
/// reference is gone, handing its token back to the driver.
///
/// # Safety
///
/// Called by the core once per inserted entry of a context of a device of
/// `T::Driver`, after its last reference.
pub(super) unsafe extern "C" fn mmap_free_callback<T: DriverUContext>(
    rdma: *mut bindings::rdma_user_mmap_entry,
) {
    // SAFETY: The core set the entry's context at insertion and keeps it
    // alive while the entry is (a context is destroyed only after its
    // mappings, which hold entries, are gone or disassociated).
    let ib = unsafe { (*(*rdma).ucontext).device };
    // SAFETY: Entries of contexts of `T::Driver` are inserted by an
    // `MmapSetOf<T::Driver>`, and nobody uses this one any more.
    let private = unsafe { mmap::free_entry::<<T::Driver as Operations>::MmapPrivate>(rdma) };
    if let Some(private) = private {
        // SAFETY: The context belongs to a device of `T::Driver`. An entry's
        // last reference goes while the device is registered: the object's
        // when it is destroyed (by an operation, or by the core's
        // disassociation while it unregisters), the mappings' when they are
        // unmapped or, at the latest, when the core disassociates them while
        // it unregisters the device.
        unsafe {
            Device::<T::Driver>::from_raw(ib).with_registration_data(|dev, data| {
                <T::Driver as Operations>::mmap_free(dev, data, private)
            })
        };
    }
}
// series: end mmap
