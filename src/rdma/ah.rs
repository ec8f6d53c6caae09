// SPDX-License-Identifier: GPL-2.0

//! Address handles (`struct ib_ah`) created by userspace.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! The core allocates the AH with the size the driver registered
//! (`size_ib_ah`) and zeroes it; [`Operations::create_ah`] initialises the
//! driver's part in place and [`Operations::destroy_ah`] sees it last. Only
//! user AHs exist (`create_user_ah`): the driver offers no kernel verbs.
//!
//! Operations may sleep, and the core says when the caller cannot
//! (`RDMA_CREATE_AH_SLEEPABLE`, `RDMA_DESTROY_AH_SLEEPABLE` clear): such
//! calls are refused with `EOPNOTSUPP` before the driver sees them. The
//! core keeps an AH whose destruction was refused.

use super::{
    bindings,
    device::{
        Device,
        Operations, //
    },
    pd::Pd,
    udata::UData,
    verbs::Gid, //
};
use kernel::{
    prelude::*,
    types::Opaque, //
};

/// The address an AH is created for (`struct rdma_ah_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AhAttr {
    /// The port the AH sends from.
    pub(crate) port: u32,
    /// Service level.
    pub(crate) sl: u8,
    /// The destination GID, when the attributes carry a global route
    /// header (`IB_AH_GRH`).
    pub(crate) dgid: Option<Gid>,
}

impl AhAttr {
    /// Reads the attributes the core passes.
    ///
    /// # Safety
    ///
    /// `attr` is valid for reads for the duration of the call.
    unsafe fn from_raw(attr: *const bindings::rdma_ah_attr) -> Self {
        // SAFETY: Valid per the safety requirements. `dgid` is a union of
        // byte arrays and integers, all valid for any bit pattern.
        let (port, sl, flags, dgid) = unsafe {
            (
                (*attr).port_num,
                (*attr).sl,
                (*attr).ah_flags,
                (*attr).grh.dgid.raw,
            )
        };
        let grh = u32::from(flags) & bindings::ib_ah_flags_IB_AH_GRH != 0;
        Self {
            port,
            sl,
            dgid: grh.then_some(Gid(dgid)),
        }
    }
}

/// An address handle with the driver's data `O::Ah`.
///
/// # Invariants
///
/// `ib` is at offset 0 of an allocation the core made with
/// `size_of::<Self>()` bytes; `data` is initialised from the end of a
/// successful `create_ah` until `destroy_ah` drops it.
#[repr(C)]
#[pin_data]
pub(crate) struct Ah<O: Operations> {
    #[pin]
    ib: Opaque<bindings::ib_ah>,
    #[pin]
    data: O::Ah,
}

impl<O: Operations> Ah<O> {
    /// The driver's data.
    pub(crate) fn data(&self) -> &O::Ah {
        &self.data
    }

    /// The protection domain the AH belongs to.
    pub(crate) fn pd(&self) -> &Pd<O> {
        // SAFETY: The core sets `pd` before calling the driver and keeps the
        // PD alive while the AH exists (it counts the AH as a user); the PD
        // belongs to the AH's device, a `Device<O>`.
        unsafe { Pd::from_raw((*self.ib.get()).pd) }
    }

    /// `create_user_ah` of the `ib_device_ops` table.
    ///
    /// # Safety
    ///
    /// Called by the core with a zeroed allocation of `size_of::<Ah<O>>()`
    /// bytes whose `device` is a registered `Device<O>` and whose `pd` is an
    /// initialised `Pd<O>`, `init` valid, and `udata` null or valid, for the
    /// call.
    pub(super) unsafe extern "C" fn create_callback(
        ah: *mut bindings::ib_ah,
        init: *mut bindings::rdma_ah_init_attr,
        udata: *mut bindings::ib_udata,
    ) -> kernel::ffi::c_int {
        super::assert_core_allocated!("struct ib_ah must be at offset 0");
        // SAFETY: `init` is valid for the call.
        let (flags, attr) = unsafe { ((*init).flags, (*init).ah_attr) };
        if flags & bindings::rdma_create_ah_flags_RDMA_CREATE_AH_SLEEPABLE == 0 {
            // Operations sleep (admin commands); the caller cannot.
            return EOPNOTSUPP.to_errno();
        }
        // SAFETY: The core passes valid attributes for the call.
        let attr = unsafe { AhAttr::from_raw(attr) };
        // SAFETY: The core set the device and PD pointers before this call;
        // the PD is an initialised `Pd<O>` of this device.
        let (dev, pd) = unsafe {
            (
                Device::<O>::from_raw((*ah).device),
                Pd::<O>::from_raw((*ah).pd),
            )
        };
        // SAFETY: Null or valid for the call.
        let mut udata = unsafe { UData::from_raw(udata) };
        // SAFETY: `ah` is the start of an allocation sized for `Self`.
        let slot = unsafe { &raw mut (*ah.cast::<Self>()).data };
        // SAFETY: Operations are called only while the device is registered;
        // `slot` is valid, uninitialised memory that stays in place until
        // `destroy_callback` drops it.
        let ret = unsafe {
            dev.with_registration_data(|reg| {
                let init = O::create_ah(reg, pd, &attr, &mut udata)?;
                pin_init::raw_try_init(slot, init)
            })
        };
        kernel::error::from_result(|| ret.map(|()| 0))
    }

    /// `destroy_ah` of the `ib_device_ops` table.
    ///
    /// Refuses callers that cannot sleep (the core then keeps the AH);
    /// otherwise always succeeds: failures to release the AH on the device
    /// are the driver's to report.
    ///
    /// # Safety
    ///
    /// Called by the core once per successful call, for an AH
    /// `create_callback` initialised.
    pub(super) unsafe extern "C" fn destroy_callback(
        ah: *mut bindings::ib_ah,
        flags: u32,
    ) -> kernel::ffi::c_int {
        if flags & bindings::rdma_destroy_ah_flags_RDMA_DESTROY_AH_SLEEPABLE == 0 {
            return EOPNOTSUPP.to_errno();
        }
        // SAFETY: An initialised `Ah<O>` per the safety requirements.
        let this = unsafe { &*ah.cast::<Self>() };
        // SAFETY: The core set the device before creating the AH, and the
        // device outlives it.
        let dev = unsafe { Device::<O>::from_raw((*ah).device) };
        // SAFETY: Operations are called only while the device is registered.
        unsafe { dev.with_registration_data(|reg| O::destroy_ah(reg, this)) };
        // SAFETY: The last use of the AH: the core frees it after this
        // returns 0, and `data` is not used again.
        unsafe { core::ptr::drop_in_place(&raw mut (*ah.cast::<Self>()).data) };
        0
    }
}
