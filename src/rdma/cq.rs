// SPDX-License-Identifier: GPL-2.0

//! Completion queues (`struct ib_cq`) created by userspace.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! The core allocates the CQ with the size the layer registered and zeroes
//! it; [`DriverCq::create`] initialises the driver's part in place and
//! [`DriverCq::destroy`] sees it last, after every QP using the CQ is gone.
//! Only user CQs exist: the layer offers no kernel verbs.
//!
//! A CQ that takes completion events names its table and number
//! ([`CqCreated::events`]); the layer enters it there once its creation
//! succeeded and takes it out before the driver destroys it (see
//! [`super::completion`]).

use super::{
    bindings,
    completion::{
        CompletionEvents,
        Registered, //
    },
    device::{
        kind,
        Device,
        DriverObject,
        Layer,
        MmapSetOf,
        NewObject,
        Object,
        RegData,
        UContextOf, //
    },
    mmap::MmapSet,
    udata::{
        destroys_what_is_left,
        UData, //
    }, //
};
use core::ptr::NonNull;
use kernel::prelude::*;

/// A completion queue with the driver's data `T`.
pub(crate) type Cq<T> = Object<T>;

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

/// What [`DriverCq::create`] made.
pub(crate) struct CqCreated<I> {
    /// The number of entries the CQ really has.
    pub(crate) entries: u32,
    /// Where its completion events come from, if it takes any.
    pub(crate) events: Option<CompletionEvents>,
    /// The initialiser of the driver's data, which cannot fail.
    pub(crate) data: I,
}

/// The driver's part of a completion queue.
pub(crate) trait DriverCq: DriverObject<Kind = kind::Cq> {
    /// Creates the driver's part of a new completion queue in user context
    /// `ctx`, as `attr` asks; `udata` carries the driver's request and
    /// response, and the ring memory userspace may have passed
    /// ([`Umem::from_cq_buffer`](super::umem::Umem::from_cq_buffer));
    /// `mmaps` takes what the CQ offers the context to map. The initialiser
    /// cannot fail: whatever can, happens before this returns.
    fn create<'a>(
        dev: &Device<Self::Driver>,
        data: &RegData<'a, Self::Driver>,
        ctx: &UContextOf<Self::Driver>,
        attr: &CqInitAttr,
        udata: &mut UData<'_>,
        mmaps: &mut MmapSetOf<'_, Self::Driver>,
    ) -> Result<CqCreated<impl PinInit<Self>>>;

    /// Releases what the driver's part of a completion queue holds on the
    /// device. Called once, when no QP uses the CQ and no event reaches it
    /// any more; its mmap entries are withdrawn and the data dropped after
    /// this. The CQ goes whatever happens on the device (see
    /// [`super::registration`] on destroys).
    fn destroy<'a>(cq: &Cq<Self>, dev: &Device<Self::Driver>, data: &RegData<'a, Self::Driver>);

    /// Called when userspace destroys the CQ, before anything else of the
    /// destroy (its events still come): an error refuses it, and the core
    /// keeps the CQ as it is and returns the error. Never called where a
    /// destroy cannot fail (close, device removal; see
    /// [`super::registration`] on destroys). By default nothing is refused.
    fn may_destroy<'a>(
        _cq: &Cq<Self>,
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
    ) -> Result {
        Ok(())
    }
}

/// `create_user_cq` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core with a zeroed allocation of `size_of::<Cq<T>>()` bytes
/// for a registered device of `T::Driver`, `attr` valid, and `attrs` the
/// bundle of the user call creating it, valid for the call.
pub(super) unsafe extern "C" fn create_callback<T: DriverCq>(
    cq: *mut bindings::ib_cq,
    attr: *const bindings::ib_cq_init_attr,
    attrs: *mut bindings::uverbs_attr_bundle,
) -> kernel::ffi::c_int {
    // SAFETY: The core set the device before this call, and `attrs` is the
    // bundle of the user call, in the calling process.
    let Some(mut udata) = (unsafe { UData::from_bundle((*cq).device, attrs) }) else {
        return EOPNOTSUPP.to_errno();
    };
    let Some(ctx_raw) = NonNull::new(udata.ucontext_raw()) else {
        return EINVAL.to_errno();
    };
    // SAFETY: The bundle of a user call that creates an object has the
    // context the call came through, a live, initialised context of this
    // device (so of `T::Driver`).
    let ctx = unsafe { UContextOf::<T::Driver>::from_raw(ctx_raw.as_ptr()) };
    // SAFETY: `attr` is valid for the call.
    let attr = unsafe {
        CqInitAttr {
            cqe: (*attr).cqe,
            comp_vector: (*attr).comp_vector,
            flags: (*attr).flags,
        }
    };
    let Some(cq_ptr) = NonNull::new(cq) else {
        return EINVAL.to_errno();
    };
    // Nothing may fail once the CQ exists on the device but the one thing
    // the layer undoes itself, so the room in a table of CQs is allocated
    // first.
    let room = match Registered::reserve() {
        Ok(room) => room,
        Err(e) => return e.to_errno(),
    };
    // SAFETY: The context outlives the CQ (the core destroys a context's
    // objects before it), and the set lives for this call.
    let mut mmaps = unsafe { MmapSet::new(ctx_raw) };
    // SAFETY: `cq` is the start of an allocation sized for `Cq<T>` for a
    // device of `T::Driver`, which nobody else uses before this returns and
    // which stays in place until `destroy_callback`.
    let slot = unsafe { NewObject::<T>::new(cq_ptr) };
    let create = |dev: &Device<T::Driver>, data: &RegData<'_, T::Driver>| {
        let CqCreated {
            entries,
            events,
            data: init,
        } = T::create(dev, data, ctx, &attr, &mut udata, &mut mmaps)?;
        let layer = slot.init(Layer::new(), init);
        // The entries belong to the CQ from here on; until here, a failure
        // dropped the set, which withdrew them.
        layer.mappings = mmaps.into_mappings();
        Ok::<_, Error>((entries, events, layer))
    };
    // SAFETY: The core set the device, a registered device of `T::Driver`.
    let (entries, events, layer) = match unsafe { Cq::<T>::with_driver(cq, create) } {
        Ok(created) => created,
        Err(e) => return e.to_errno(),
    };
    if let Some(events) = events {
        // SAFETY: The CQ was created and stays alive until its layer part,
        // which keeps the registration, is dropped.
        match unsafe { Registered::insert(events, cq_ptr, room) } {
            Ok(registered) => layer.events = Some(registered),
            Err(e) => {
                // The device gave out a number still in use: the CQ that has
                // it keeps its events; this one is destroyed again.
                // SAFETY: An initialised `Cq<T>` nobody else knows of.
                unsafe { destroy::<T>(cq) };
                return e.to_errno();
            }
        }
    }
    // SAFETY: The CQ is not visible to anyone else before this call returns;
    // `cqe` is what the core reports to userspace.
    unsafe { (*cq).cqe = entries.try_into().unwrap_or(i32::MAX) };
    0
}

/// Destroys a CQ `create_callback` initialised.
///
/// # Safety
///
/// `cq` is an initialised `Cq<T>` that nobody uses any more.
unsafe fn destroy<T: DriverCq>(cq: *mut bindings::ib_cq) {
    // Events stop first: the core's handler is never called past this
    // point.
    // SAFETY: Per the safety requirements.
    unsafe { Cq::<T>::leave_events(cq) };
    // SAFETY: An initialised `Cq<T>` per the safety requirements.
    let this = unsafe { Cq::<T>::from_raw(cq) };
    // SAFETY: Operations run only while the device is registered.
    unsafe { Cq::<T>::with_driver(cq, |dev, data| T::destroy(this, dev, data)) };
    // SAFETY: The last use of the CQ.
    unsafe { Cq::<T>::drop_in_place(cq, true) };
}

/// `destroy_cq` of the `ib_device_ops` table. Fails only where the driver
/// refuses a user's destroy ([`DriverCq::may_destroy`]).
///
/// # Safety
///
/// Called by the core for a CQ `create_callback` initialised, with `udata`
/// null or the driver udata of the call's bundle; once more after it
/// failed, until it succeeds.
pub(super) unsafe extern "C" fn destroy_callback<T: DriverCq>(
    cq: *mut bindings::ib_cq,
    udata: *mut bindings::ib_udata,
) -> kernel::ffi::c_int {
    // SAFETY: `udata` is as `destroys_what_is_left` wants.
    if !unsafe { destroys_what_is_left(udata) } {
        // SAFETY: An initialised `Cq<T>` per the safety requirements.
        let this = unsafe { Cq::<T>::from_raw(cq) };
        // SAFETY: Operations run only while the device is registered.
        let ret = unsafe { Cq::<T>::with_driver(cq, |dev, data| T::may_destroy(this, dev, data)) };
        if let Err(e) = ret {
            return e.to_errno();
        }
    }
    // SAFETY: Per the safety requirements; the core frees the CQ after this
    // returns 0.
    unsafe { destroy::<T>(cq) };
    0
}
