// SPDX-License-Identifier: GPL-2.0

//! Protection domains (`struct ib_pd`).
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! The core allocates the PD with the size the layer registered and zeroes
//! it; [`DriverPd::alloc`] initialises the driver's part in place and
//! [`DriverPd::dealloc`] sees it last, after every object using the PD is
//! gone.

use super::{
    bindings,
    device::{
        kind,
        Device,
        DriverObject,
        Layer,
        NewObject,
        Object,
        RegData, //
    },
    udata::{
        destroys_what_is_left,
        UData, //
    }, //
};
use core::ptr::NonNull;
use kernel::prelude::*;

/// A protection domain with the driver's data `T`.
pub(crate) type Pd<T> = Object<T>;

/// The driver's part of a protection domain.
pub(crate) trait DriverPd: DriverObject<Kind = kind::Pd> {
    /// Creates the driver's part of a new protection domain; `udata`
    /// carries the driver's request and response. The initialiser cannot
    /// fail: whatever can, happens before this returns.
    fn alloc<'a>(
        dev: &Device<Self::Driver>,
        data: &RegData<'a, Self::Driver>,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self>>;

    /// Releases what the driver's part of a protection domain holds on the
    /// device. Called once, when no object uses the PD; the data is dropped
    /// after this. The PD goes whatever happens on the device (see
    /// [`super::registration`] on destroys), so a driver reports failures
    /// and keeps what the device may still use.
    fn dealloc<'a>(pd: &Pd<Self>, dev: &Device<Self::Driver>, data: &RegData<'a, Self::Driver>);

    /// Called when userspace deallocates the PD, before
    /// [`DriverPd::dealloc`]: an error refuses it, and the core keeps the
    /// PD as it is and returns the error. Never called where a destroy
    /// cannot fail (close, device removal; see [`super::registration`] on
    /// destroys). By default nothing is refused.
    fn may_dealloc<'a>(
        _pd: &Pd<Self>,
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
    ) -> Result {
        Ok(())
    }
}

/// `alloc_pd` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core with a zeroed allocation of `size_of::<Pd<T>>()` bytes
/// for a registered device of `T::Driver`, and `udata` null or the driver
/// udata of the user call creating it, valid for the call.
pub(super) unsafe extern "C" fn alloc_callback<T: DriverPd>(
    pd: *mut bindings::ib_pd,
    udata: *mut bindings::ib_udata,
) -> kernel::ffi::c_int {
    // SAFETY: The core set the device before this call; a non-null `udata`
    // is the driver udata of the user call, in the calling process.
    let Some(mut udata) = (unsafe { UData::from_raw((*pd).device, udata) }) else {
        // No kernel verbs: kernel callers get no PD.
        return EOPNOTSUPP.to_errno();
    };
    // SAFETY: `pd` is the start of an allocation sized for `Pd<T>` for a
    // device of `T::Driver`, which nobody else uses before this returns and
    // which stays in place until `dealloc_callback`.
    let slot = unsafe { NewObject::<T>::new(NonNull::new_unchecked(pd)) };
    let alloc = |dev: &Device<T::Driver>, data: &RegData<'_, T::Driver>| -> Result {
        let init = T::alloc(dev, data, &mut udata)?;
        slot.init(Layer::new(), init);
        Ok(())
    };
    // SAFETY: The core set the device, a registered device of `T::Driver`.
    let ret = unsafe { Pd::<T>::with_driver(pd, alloc) };
    kernel::error::from_result(|| ret.map(|()| 0))
}

/// `dealloc_pd` of the `ib_device_ops` table. Fails only where the driver
/// refuses a user's dealloc ([`DriverPd::may_dealloc`]).
///
/// # Safety
///
/// Called by the core for a PD `alloc_callback` initialised, with `udata`
/// null or the driver udata of the call's bundle; once more after it
/// failed, until it succeeds.
pub(super) unsafe extern "C" fn dealloc_callback<T: DriverPd>(
    pd: *mut bindings::ib_pd,
    udata: *mut bindings::ib_udata,
) -> kernel::ffi::c_int {
    // SAFETY: An initialised `Pd<T>` per the safety requirements.
    let this = unsafe { Pd::<T>::from_raw(pd) };
    // SAFETY: `udata` is as `destroys_what_is_left` wants.
    if !unsafe { destroys_what_is_left(udata) } {
        // SAFETY: Operations run only while the device is registered.
        let ret = unsafe { Pd::<T>::with_driver(pd, |dev, data| T::may_dealloc(this, dev, data)) };
        if let Err(e) = ret {
            return e.to_errno();
        }
    }
    // SAFETY: Operations run only while the device is registered.
    unsafe { Pd::<T>::with_driver(pd, |dev, data| T::dealloc(this, dev, data)) };
    // SAFETY: The last use of the PD: the core frees it after this returns 0.
    unsafe { Pd::<T>::drop_in_place(pd, true) };
    0
}
