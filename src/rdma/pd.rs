// SPDX-License-Identifier: GPL-2.0

//! Protection domains (`struct ib_pd`).
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! The core allocates the PD with the size the driver registered
//! (`size_ib_pd`) and zeroes it; [`Operations::alloc_pd`] initialises the
//! driver's part in place and [`Operations::dealloc_pd`] sees it last,
//! after every object using the PD is gone.

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

/// A protection domain with the driver's data `O::Pd`.
///
/// # Invariants
///
/// `ib` is at offset 0 of an allocation the core made with
/// `size_of::<Self>()` bytes; `data` is initialised from the end of a
/// successful `alloc_pd` until `dealloc_pd` drops it.
#[repr(C)]
#[pin_data]
pub(crate) struct Pd<O: Operations> {
    #[pin]
    ib: Opaque<bindings::ib_pd>,
    #[pin]
    data: O::Pd,
}

impl<O: Operations> Pd<O> {
    /// The driver's data.
    pub(crate) fn data(&self) -> &O::Pd {
        &self.data
    }

    /// The device the PD belongs to.
    pub(crate) fn device(&self) -> &Device<O> {
        // SAFETY: The core sets `device` before calling the driver and the
        // device outlives its PDs; it is a `Device<O>` because only devices
        // with this vtable create `Pd<O>`.
        unsafe { Device::from_raw((*self.ib.get()).device) }
    }

    /// Borrows the PD from its C pointer.
    ///
    /// # Safety
    ///
    /// `ptr` points to the `ib_pd` of a live, initialised `Pd<O>`.
    pub(crate) unsafe fn from_raw<'a>(ptr: *mut bindings::ib_pd) -> &'a Self {
        // SAFETY: `ib` is at offset 0; liveness is the caller's promise.
        unsafe { &*ptr.cast::<Self>() }
    }

    /// `alloc_pd` of the `ib_device_ops` table.
    ///
    /// # Safety
    ///
    /// Called by the core with a zeroed allocation of `size_of::<Pd<O>>()`
    /// bytes for a registered `Device<O>`, and `udata` null or valid for the
    /// call.
    pub(super) unsafe extern "C" fn alloc_callback(
        pd: *mut bindings::ib_pd,
        udata: *mut bindings::ib_udata,
    ) -> kernel::ffi::c_int {
        super::assert_core_allocated!("struct ib_pd must be at offset 0");
        // SAFETY: The core set the device pointer before this call.
        let dev = unsafe { Device::<O>::from_raw((*pd).device) };
        // SAFETY: Null or valid for the call.
        let mut udata = unsafe { UData::from_raw(udata) };
        // SAFETY: `pd` is the start of an allocation sized for `Self`.
        let slot = unsafe { &raw mut (*pd.cast::<Self>()).data };
        // SAFETY: Operations are called only while the device is registered;
        // `slot` is valid, uninitialised memory that stays in place until
        // `dealloc_callback` drops it.
        let ret = unsafe {
            dev.with_registration_data(|reg| {
                let init = O::alloc_pd(reg, &mut udata)?;
                pin_init::raw_try_init(slot, init)
            })
        };
        kernel::error::from_result(|| ret.map(|()| 0))
    }

    /// `dealloc_pd` of the `ib_device_ops` table.
    ///
    /// Always succeeds: the driver cannot keep a PD the core is done with,
    /// so failures to release it on the device are the driver's to report.
    ///
    /// # Safety
    ///
    /// Called by the core once, for a PD `alloc_callback` initialised, with
    /// `udata` null or valid for the call.
    pub(super) unsafe extern "C" fn dealloc_callback(
        pd: *mut bindings::ib_pd,
        udata: *mut bindings::ib_udata,
    ) -> kernel::ffi::c_int {
        // SAFETY: An initialised `Pd<O>` per the safety requirements.
        let this = unsafe { Self::from_raw(pd) };
        // SAFETY: Null or valid for the call.
        let mut udata = unsafe { UData::from_raw(udata) };
        let dev = this.device();
        // SAFETY: Operations are called only while the device is registered.
        unsafe { dev.with_registration_data(|reg| O::dealloc_pd(reg, this, &mut udata)) };
        // SAFETY: The last use of the PD: the core frees it after this
        // returns 0, and `data` is not used again.
        unsafe { core::ptr::drop_in_place(&raw mut (*pd.cast::<Self>()).data) };
        0
    }
}
