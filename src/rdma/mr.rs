// SPDX-License-Identifier: GPL-2.0

//! Memory regions (`struct ib_mr`) registered by userspace.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! Unlike the other objects, MRs are allocated by the driver, here by the
//! layer: it allocates the object before calling [`DriverMr::reg_user`],
//! so that nothing can fail once the device has registered the region, and
//! hands the driver's data back to [`DriverMr::dereg`] by value, so the
//! driver decides what to release and what the device may still use (pages
//! a failed deregistration leaves pinned).
//!
//! A driver's own uverbs methods on MRs are answered through
//! [`mr_method!`].

use super::{
    bindings,
    device::{
        kind,
        Device,
        DriverObject,
        Layer,
        NewObject,
        Object,
        Operations,
        PdOf,
        RegData, //
    },
    udata::UData,
    umem::AccessFlags, //
};
use core::{
    mem::MaybeUninit,
    ptr::NonNull, //
};
use kernel::prelude::*;

/// A memory region with the driver's data `T`.
pub(crate) type Mr<T> = Object<T>;

/// What a registration asks for (`ib_uverbs_reg_mr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MrRequest {
    /// User address of the first byte.
    pub(crate) start: u64,
    /// Length in bytes.
    pub(crate) length: u64,
    /// The address the device knows the first byte by (same offset in its
    /// page as `start`; the core checks).
    pub(crate) iova: u64,
    /// Access rights; the core has checked their consistency
    /// (`ib_check_mr_access()`), not that the device supports them.
    pub(crate) access: AccessFlags,
}

/// Where the pages of a dma-buf registration come from
/// (`ib_uverbs_reg_dmabuf_mr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DmabufMrRequest {
    /// The dma-buf's file descriptor in the calling process.
    pub(crate) fd: i32,
    /// Offset of the first byte in the dma-buf.
    pub(crate) offset: u64,
    /// Length in bytes.
    pub(crate) length: u64,
    /// The address the device knows the first byte by.
    pub(crate) iova: u64,
    /// Access rights, as for [`MrRequest::access`].
    pub(crate) access: AccessFlags,
}

/// The keys the device gave a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MrKeys {
    /// Local key, used in the region's work requests.
    pub(crate) lkey: u32,
    /// Remote key, given to peers for RDMA.
    pub(crate) rkey: u32,
}

/// The driver's part of a memory region. It is [`Unpin`]: deregistration
/// hands it back by value.
#[vtable]
pub(crate) trait DriverMr: DriverObject<Kind = kind::Mr> + Unpin {
    /// Registers user memory as `req` asks, in protection domain `pd`;
    /// `udata` carries the driver's request and response, and lets the
    /// driver pin the memory ([`Umem::get`](super::umem::Umem::get)).
    /// Returns the keys the device gave the region and the driver's data.
    fn reg_user<'a>(
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
        _pd: &PdOf<Self::Driver>,
        _req: &MrRequest,
        _udata: &mut UData<'_>,
    ) -> Result<(MrKeys, Self)> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Registers part of a dma-buf as `req` asks, as
    /// [`DriverMr::reg_user`] does user memory.
    fn reg_dmabuf<'a>(
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
        _pd: &PdOf<Self::Driver>,
        _req: &DmabufMrRequest,
        _udata: &mut UData<'_>,
    ) -> Result<(MrKeys, Self)> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Deregisters a memory region; `mr` is the driver's data, given back.
    /// Called once. The region goes whatever happens on the device (see
    /// [`super::registration`] on destroys), so the driver keeps (rather
    /// than drops) whatever the device may still use.
    fn dereg<'a>(_mr: Self, _dev: &Device<Self::Driver>, _data: &RegData<'a, Self::Driver>) {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }
}

/// `reg_user_mr` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core with an initialised PD of a registered device of
/// `T::Driver`, and `udata` null or the driver udata of the user call
/// registering the region, valid for the call.
pub(super) unsafe extern "C" fn reg_callback<T: DriverMr>(
    pd: *mut bindings::ib_pd,
    start: u64,
    length: u64,
    iova: u64,
    access: kernel::ffi::c_int,
    dmah: *mut bindings::ib_dmah,
    udata: *mut bindings::ib_udata,
) -> *mut bindings::ib_mr {
    if !dmah.is_null() {
        // DMA handles (TPH steering) are not offered to drivers.
        return EOPNOTSUPP.to_ptr();
    }
    // SAFETY: The core passes a live PD whose device it set; a non-null
    // `udata` is the driver udata of the user call, in the calling process.
    let Some(mut udata) = (unsafe { UData::from_raw((*pd).device, udata) }) else {
        return EOPNOTSUPP.to_ptr();
    };
    // SAFETY: An initialised PD of a device of `T::Driver`.
    let pd_obj = unsafe { PdOf::<T::Driver>::from_raw(pd) };
    let req = MrRequest {
        start,
        length,
        iova,
        // The core passes `ib_access_flags` bits in an int.
        access: AccessFlags::from_raw(access as u32),
    };
    register::<T>(length, || {
        // SAFETY: The PD's device is a registered device of `T::Driver`.
        unsafe {
            PdOf::<T::Driver>::with_driver(pd, |dev, data| {
                T::reg_user(dev, data, pd_obj, &req, &mut udata)
            })
        }
    })
}

/// `reg_user_mr_dmabuf` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core with an initialised PD of a registered device of
/// `T::Driver`, and `attrs` the bundle of the user call registering the
/// region, valid for the call.
pub(super) unsafe extern "C" fn reg_dmabuf_callback<T: DriverMr>(
    pd: *mut bindings::ib_pd,
    offset: u64,
    length: u64,
    iova: u64,
    fd: kernel::ffi::c_int,
    access: kernel::ffi::c_int,
    dmah: *mut bindings::ib_dmah,
    attrs: *mut bindings::uverbs_attr_bundle,
) -> *mut bindings::ib_mr {
    if !dmah.is_null() {
        // DMA handles (TPH steering) are not offered to drivers.
        return EOPNOTSUPP.to_ptr();
    }
    // SAFETY: The core passes a live PD whose device it set, and the bundle
    // of the user call, in the calling process.
    let Some(mut udata) = (unsafe { UData::from_bundle((*pd).device, attrs) }) else {
        return EOPNOTSUPP.to_ptr();
    };
    // SAFETY: An initialised PD of a device of `T::Driver`.
    let pd_obj = unsafe { PdOf::<T::Driver>::from_raw(pd) };
    let req = DmabufMrRequest {
        fd,
        offset,
        length,
        iova,
        // The core passes `ib_access_flags` bits in an int.
        access: AccessFlags::from_raw(access as u32),
    };
    register::<T>(length, || {
        // SAFETY: The PD's device is a registered device of `T::Driver`.
        unsafe {
            PdOf::<T::Driver>::with_driver(pd, |dev, data| {
                T::reg_dmabuf(dev, data, pd_obj, &req, &mut udata)
            })
        }
    })
}

/// Allocates an MR and has the driver register it with `register_with`,
/// for the core.
fn register<T: DriverMr>(
    length: u64,
    register_with: impl FnOnce() -> Result<(MrKeys, T)>,
) -> *mut bindings::ib_mr {
    // Allocated first: once the driver has registered the region, nothing
    // may fail. Zeroed, as the core expects of a new `ib_mr`.
    let slot = match KBox::<Mr<T>>::new_uninit(GFP_KERNEL | kernel::alloc::flags::__GFP_ZERO) {
        Ok(slot) => slot,
        Err(_) => return ENOMEM.to_ptr(),
    };
    let (keys, data) = match register_with() {
        Ok(r) => r,
        Err(e) => return e.to_ptr(),
    };
    let raw = KBox::into_raw(slot).cast::<bindings::ib_mr>();
    // SAFETY: `raw` is a zeroed allocation of `size_of::<Mr<T>>()` bytes for a
    // device of `T::Driver`, whose ownership goes to the core (through the
    // `ib_mr` at offset 0) until `dereg_callback` takes it back; it does not
    // move, and nobody else knows of it yet.
    let slot = unsafe { NewObject::<T>::new(NonNull::new_unchecked(raw)) };
    // `T` is `Unpin`: a value is its own initialiser.
    slot.init(Layer::new(), data);
    // SAFETY: Just allocated; the core reads the keys after this returns and
    // sets the remaining fields itself.
    unsafe {
        (*raw).lkey = keys.lkey;
        (*raw).rkey = keys.rkey;
        (*raw).length = length;
    }
    raw
}

/// `dereg_mr` of the `ib_device_ops` table. Always succeeds: the driver
/// gets its data back and keeps whatever the device may still use.
///
/// # Safety
///
/// Called by the core once, for an MR `reg_callback` returned, whose device
/// is a registered device of `T::Driver`.
pub(super) unsafe extern "C" fn dereg_callback<T: DriverMr>(
    mr: *mut bindings::ib_mr,
    _udata: *mut bindings::ib_udata,
) -> kernel::ffi::c_int {
    // SAFETY: An initialised `Mr<T>`, handed back for the last time; `T` is
    // `Unpin` and the object is dropped without its data below.
    let data = unsafe { Mr::<T>::take_data(mr) };
    // SAFETY: The core set the device after registration; it outlives the MR
    // and is registered while operations run.
    unsafe { Mr::<T>::with_driver(mr, |dev, reg| T::dereg(data, dev, reg)) };
    // SAFETY: The last use of the MR; its data was moved out.
    unsafe { Mr::<T>::drop_in_place(mr, false) };
    // SAFETY: `mr` is the `KBox` `register` gave the core, whose contents are
    // dropped: freeing it as uninitialised memory drops nothing more.
    drop(unsafe { KBox::from_raw(mr.cast::<MaybeUninit<Mr<T>>>()) });
    0
}

/// Answers a driver's uverbs method on an MR: the C handler looked the MR up
/// and calls the function [`mr_method!`] defined.
///
/// # Safety
///
/// `attrs` is the bundle of the method call and `mr` an MR the handler
/// looked up through an attribute of it declared as an MR
/// (`UVERBS_OBJECT_MR`), held for the call; the method is in the uverbs
/// definitions of a device of the layer (some `Device<U>`).
pub(crate) unsafe fn method_callback<D: Operations>(
    attrs: *mut bindings::uverbs_attr_bundle,
    mr: *mut bindings::ib_mr,
    f: impl for<'a> FnOnce(&Mr<D::Mr>, &Device<D>, &'a RegData<'a, D>, &mut UData<'_>) -> Result,
) -> kernel::ffi::c_int
where
    D::Mr: DriverMr,
{
    // SAFETY: The MR is live for the call, and its device one of the layer's
    // (the definitions are installed on those only).
    let Some(dev) = (unsafe { Device::<D>::from_raw_checked((*mr).device) }) else {
        // The tree is shared with another driver type: not one of ours.
        return EINVAL.to_errno();
    };
    // SAFETY: Every MR of a device of `D` is an `Mr<D::Mr>` its table made,
    // initialised, and held by the method for the call.
    let this = unsafe { Mr::<D::Mr>::from_raw(mr) };
    // SAFETY: The bundle of a method call from userspace, in its process.
    let Some(mut udata) = (unsafe { UData::from_bundle(dev.as_raw(), attrs) }) else {
        return EINVAL.to_errno();
    };
    // SAFETY: Methods run only while the device is registered.
    let ret = unsafe { dev.with_registration_data(|dev, data| f(this, dev, data, &mut udata)) };
    kernel::error::from_result(|| ret.map(|()| 0))
}

/// Defines `$name`, the function a driver's C handler of a uverbs method on
/// MRs calls with the bundle of the call and the MR it looked up:
///
/// ```c
/// int $name(struct uverbs_attr_bundle *attrs, struct ib_mr *mr);
/// ```
///
/// It answers with `$f(mr, dev, data, udata)` if the MR belongs to a device
/// of driver `$driver`, and with `EINVAL` otherwise. The symbol is the
/// driver's, so several drivers (or modules) using the layer do not clash.
#[macro_export]
macro_rules! mr_method {
    ($(#[$meta:meta])* $name:ident: $driver:ty => $f:path) => {
        $(#[$meta])*
        ///
        /// # Safety
        ///
        /// Called by the driver's C handler of the method, with the bundle of
        /// the call and an MR it looked up through an attribute declared as an
        /// MR, held for the call.
        #[no_mangle]
        unsafe extern "C" fn $name(
            attrs: *mut $crate::rdma::bindings::uverbs_attr_bundle,
            mr: *mut $crate::rdma::bindings::ib_mr,
        ) -> ::kernel::ffi::c_int {
            // SAFETY: Per the function's safety requirements; the method is in
            // the definitions of `$driver`, installed on devices of the layer.
            unsafe { $crate::rdma::mr::method_callback::<$driver>(attrs, mr, $f) }
        }
    };
}
pub(crate) use crate::mr_method;
