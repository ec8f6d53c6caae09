// SPDX-License-Identifier: GPL-2.0

//! Address handles (`struct ib_ah`) created by userspace.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! The core allocates the AH with the size the layer registered and zeroes
//! it; [`DriverAh::create`] initialises the driver's part in place and
//! [`DriverAh::destroy`] sees it last. Only user AHs exist
//! (`create_user_ah`): the layer offers no kernel verbs.
//!
//! Operations may sleep, and the core says when the caller cannot
//! (`RDMA_CREATE_AH_SLEEPABLE`, `RDMA_DESTROY_AH_SLEEPABLE` clear): such
//! calls are refused with `EOPNOTSUPP` before the driver sees them. The
//! core keeps an AH whose destruction was refused.

use super::{
    bindings,
    device::{
        kind,
        Device,
        DriverObject,
        Layer,
        NewObject,
        Object,
        PdOf,
        RegData, //
    },
    udata::UData,
    verbs::Gid, //
};
use core::ptr::NonNull;
use kernel::prelude::*;

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

/// An address handle with the driver's data `T`.
pub(crate) type Ah<T> = Object<T>;

/// The driver's part of an address handle.
#[vtable]
pub(crate) trait DriverAh: DriverObject<Kind = kind::Ah> {
    /// Creates the driver's part of a new address handle for `attr` in
    /// protection domain `pd`; `udata` carries the driver's request and
    /// response. Called only where the caller may sleep. The initialiser
    /// cannot fail: whatever can, happens before this returns.
    fn create<'a>(
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
        _pd: &PdOf<Self::Driver>,
        _attr: &AhAttr,
        _udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self>> {
        // Not in the table unless implemented (`HAS_CREATE`).
        Err::<Self, _>(EOPNOTSUPP)
    }

    /// Releases what the driver's part of an address handle holds on the
    /// device. Called once, where the caller may sleep; the data is dropped
    /// after this. The AH goes whatever happens on the device (see
    /// [`super::registration`] on destroys).
    fn destroy<'a>(_ah: &Ah<Self>, _dev: &Device<Self::Driver>, _data: &RegData<'a, Self::Driver>) {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }
}

/// `create_user_ah` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core with a zeroed allocation of `size_of::<Ah<T>>()` bytes
/// for a registered device of `T::Driver` whose `pd` is an initialised PD of
/// it, `init` valid, and `udata` null or the driver udata of the user call
/// creating it, valid for the call.
pub(super) unsafe extern "C" fn create_callback<T: DriverAh>(
    ah: *mut bindings::ib_ah,
    init: *mut bindings::rdma_ah_init_attr,
    udata: *mut bindings::ib_udata,
) -> kernel::ffi::c_int {
    // SAFETY: `init` is valid for the call.
    let (flags, attr) = unsafe { ((*init).flags, (*init).ah_attr) };
    if flags & bindings::rdma_create_ah_flags_RDMA_CREATE_AH_SLEEPABLE == 0 {
        // Operations sleep; the caller cannot.
        return EOPNOTSUPP.to_errno();
    }
    // SAFETY: The core set the device before this call; a non-null `udata`
    // is the driver udata of the user call, in the calling process.
    let Some(mut udata) = (unsafe { UData::from_raw((*ah).device, udata) }) else {
        // No kernel verbs: kernel callers get no AH.
        return EOPNOTSUPP.to_errno();
    };
    // SAFETY: The core passes valid attributes for the call.
    let attr = unsafe { AhAttr::from_raw(attr) };
    // SAFETY: The core set the PD before this call, an initialised PD of this
    // device, alive while the AH is.
    let pd = unsafe { PdOf::<T::Driver>::from_raw((*ah).pd) };
    // SAFETY: `ah` is the start of an allocation sized for `Ah<T>` for a
    // device of `T::Driver`, which nobody else uses before this returns and
    // which stays in place until `destroy_callback`.
    let slot = unsafe { NewObject::<T>::new(NonNull::new_unchecked(ah)) };
    let create = |dev: &Device<T::Driver>, data: &RegData<'_, T::Driver>| -> Result {
        let init = T::create(dev, data, pd, &attr, &mut udata)?;
        slot.init(Layer::new(), init);
        Ok(())
    };
    // SAFETY: The core set the device, a registered device of `T::Driver`.
    let ret = unsafe { Ah::<T>::with_driver(ah, create) };
    kernel::error::from_result(|| ret.map(|()| 0))
}

/// `destroy_ah` of the `ib_device_ops` table.
///
/// Refuses callers that cannot sleep (the core then keeps the AH);
/// otherwise always succeeds.
///
/// # Safety
///
/// Called by the core for an AH `create_callback` initialised, once per
/// successful call.
pub(super) unsafe extern "C" fn destroy_callback<T: DriverAh>(
    ah: *mut bindings::ib_ah,
    flags: u32,
) -> kernel::ffi::c_int {
    if flags & bindings::rdma_destroy_ah_flags_RDMA_DESTROY_AH_SLEEPABLE == 0 {
        return EOPNOTSUPP.to_errno();
    }
    // SAFETY: An initialised `Ah<T>` per the safety requirements.
    let this = unsafe { Ah::<T>::from_raw(ah) };
    // SAFETY: Operations run only while the device is registered.
    unsafe { Ah::<T>::with_driver(ah, |dev, data| T::destroy(this, dev, data)) };
    // SAFETY: The last use of the AH: the core frees it after this returns 0.
    unsafe { Ah::<T>::drop_in_place(ah, true) };
    0
}
