// SPDX-License-Identifier: GPL-2.0

//! Completion queues (`struct ib_cq`) created by userspace.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! The core allocates the CQ with the size the driver registered
//! (`size_ib_cq`) and zeroes it; [`Operations::create_cq`] initialises the
//! driver's part in place and [`Operations::destroy_cq`] sees it last,
//! after every QP using the CQ is gone. Only user CQs exist: the driver
//! offers no kernel verbs.

use super::{
    bindings,
    device::{
        Device,
        Operations, //
    },
    ucontext::UContext,
    udata::UData, //
};
use kernel::{
    prelude::*,
    types::Opaque, //
};

/// What the creator of a CQ asked for (`struct ib_cq_init_attr`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CqInitAttr {
    /// Entries wanted.
    pub(crate) cqe: u32,
    /// Completion vector for events.
    pub(crate) comp_vector: u32,
    /// `enum ib_uverbs_ex_create_cq_flags`.
    pub(crate) flags: u32,
}

/// A completion queue with the driver's data `O::Cq`.
///
/// # Invariants
///
/// `ib` is at offset 0 of an allocation the core made with
/// `size_of::<Self>()` bytes; `data` is initialised from the end of a
/// successful `create_cq` until `destroy_cq` drops it.
#[repr(C)]
#[pin_data]
pub(crate) struct Cq<O: Operations> {
    #[pin]
    ib: Opaque<bindings::ib_cq>,
    #[pin]
    data: O::Cq,
}

impl<O: Operations> Cq<O> {
    /// The driver's data.
    pub(crate) fn data(&self) -> &O::Cq {
        &self.data
    }

    /// Borrows the CQ from its C pointer.
    ///
    /// # Safety
    ///
    /// `ptr` points to the `ib_cq` of a live, initialised `Cq<O>`.
    pub(crate) unsafe fn from_raw<'a>(ptr: *mut bindings::ib_cq) -> &'a Self {
        // SAFETY: `ib` is at offset 0; liveness is the caller's promise.
        unsafe { &*ptr.cast::<Self>() }
    }

    /// `create_user_cq` of the `ib_device_ops` table.
    ///
    /// # Safety
    ///
    /// Called by the core with a zeroed allocation of `size_of::<Cq<O>>()`
    /// bytes whose `device` is a registered `Device<O>`, `attr` valid, and
    /// `attrs` the bundle of a user call, valid for the call.
    pub(super) unsafe extern "C" fn create_callback(
        cq: *mut bindings::ib_cq,
        attr: *const bindings::ib_cq_init_attr,
        attrs: *mut bindings::uverbs_attr_bundle,
    ) -> kernel::ffi::c_int {
        const_assert!(
            core::mem::offset_of!(Self, ib) == 0,
            "struct ib_cq must be at offset 0"
        );
        // kmalloc() guarantees this alignment and no more.
        const_assert!(core::mem::align_of::<Self>() <= 8);
        // SAFETY: The core set the device pointer before this call.
        let dev = unsafe { Device::<O>::from_raw((*cq).device) };
        // SAFETY: `attr` is valid for the call.
        let attr = unsafe {
            CqInitAttr {
                cqe: (*attr).cqe,
                comp_vector: (*attr).comp_vector,
                flags: (*attr).flags,
            }
        };
        // Userspace may pass its own memory for the ring. This abstraction
        // does not hand such buffers to drivers yet, so refuse them rather
        // than give the device a ring userspace does not poll.
        // SAFETY: `attrs` is valid for the call and `device` registered. A
        // minimum length of zero accepts any buffer; the result is released
        // at once.
        let umem = unsafe {
            bindings::ib_umem_get_cq_buf(
                (*cq).device,
                attrs,
                0,
                bindings::ib_access_flags_IB_ACCESS_LOCAL_WRITE as kernel::ffi::c_int,
            )
        };
        match kernel::error::from_err_ptr(umem) {
            Err(e) => return e.to_errno(),
            Ok(umem) if !umem.is_null() => {
                // SAFETY: Pinned just above and not used otherwise.
                unsafe { bindings::ib_umem_release(umem) };
                return EOPNOTSUPP.to_errno();
            }
            Ok(_) => (),
        }
        // SAFETY: A user call's bundle has the context the call came
        // through, a live `UContext<O>` of this device.
        let ctx = unsafe { UContext::<O>::from_raw(bindings::refa_attrs_ucontext(attrs)) };
        // SAFETY: The driver udata lives in the bundle, valid for the call.
        let mut udata = unsafe { UData::from_raw(bindings::refa_attrs_driver_udata(attrs)) };
        // SAFETY: `cq` is the start of an allocation sized for `Self`.
        let slot = unsafe { &raw mut (*cq.cast::<Self>()).data };
        // SAFETY: Operations are called only while the device is registered;
        // `slot` is valid, uninitialised memory that stays in place until
        // `destroy_callback` drops it.
        let ret = unsafe {
            dev.with_registration_data(|reg| {
                let (depth, init) = O::create_cq(reg, ctx, &attr, &mut udata)?;
                pin_init::raw_try_init(slot, init)?;
                Ok::<_, Error>(depth)
            })
        };
        kernel::error::from_result(|| {
            let depth = ret?;
            // SAFETY: The CQ is not visible to anyone else before this call
            // returns; `cqe` is what the core reports to userspace.
            unsafe { (*cq).cqe = depth.try_into().unwrap_or(i32::MAX) };
            Ok(0)
        })
    }

    /// `destroy_cq` of the `ib_device_ops` table.
    ///
    /// Always succeeds: the core cannot keep a CQ it is done with, so
    /// failures to release it on the device are the driver's to report.
    ///
    /// # Safety
    ///
    /// Called by the core once, for a CQ `create_callback` initialised, with
    /// `udata` null or valid for the call.
    pub(super) unsafe extern "C" fn destroy_callback(
        cq: *mut bindings::ib_cq,
        udata: *mut bindings::ib_udata,
    ) -> kernel::ffi::c_int {
        // SAFETY: An initialised `Cq<O>` per the safety requirements.
        let this = unsafe { &*cq.cast::<Self>() };
        // SAFETY: Null or valid for the call.
        let mut udata = unsafe { UData::from_raw(udata) };
        // SAFETY: The core set the device before creating the CQ, and the
        // device outlives it.
        let dev = unsafe { Device::<O>::from_raw((*cq).device) };
        // SAFETY: Operations are called only while the device is registered.
        unsafe { dev.with_registration_data(|reg| O::destroy_cq(reg, this, &mut udata)) };
        // SAFETY: The last use of the CQ: the core frees it after this
        // returns 0, and `data` is not used again.
        unsafe { core::ptr::drop_in_place(&raw mut (*cq.cast::<Self>()).data) };
        0
    }
}
