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
//!
//! Completion events reach a CQ through a [`CqEvents`] table of the
//! device: the driver's interrupt handler looks the CQ up by the device's
//! number for it and calls the handler the core installed (for user CQs,
//! the one that wakes the completion channel). This module registers a CQ
//! in the table the driver names ([`Operations::cq_events`]) once its
//! creation succeeded and removes it in `destroy_cq` before anything else,
//! both under the table's lock, which the lookup holds while it calls the
//! handler: a CQ on its way out is never called.

use super::{
    bindings,
    device::{
        Device,
        Operations, //
    },
    ucontext::UContext,
    udata::UData,
    umem::{
        AccessFlags,
        Umem, //
    }, //
};
use core::ptr::NonNull;
use kernel::{
    new_spinlock_irq,
    prelude::*,
    rbtree::{
        RBTree,
        RBTreeNodeReservation, //
    },
    sync::{
        Arc,
        SpinLockIrq, //
    },
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

/// Memory userspace may have passed for a CQ's ring (the core's
/// `CREATE_CQ_BUFFER_*` attributes: an address range or a dma-buf), valid
/// for the duration of one `create_cq`.
pub(crate) struct CqBuffer<'a> {
    dev: *mut bindings::ib_device,
    attrs: *mut bindings::uverbs_attr_bundle,
    _call: core::marker::PhantomData<&'a ()>,
}

impl CqBuffer<'_> {
    /// Pins the buffer userspace passed for the ring, which must hold at
    /// least `min_len` bytes, writable by the device; `None` if it passed
    /// none and the driver allocates the ring itself.
    pub(crate) fn pin(&self, min_len: usize) -> Result<Option<Umem>> {
        let access = AccessFlags::LOCAL_WRITE.bits() as kernel::ffi::c_int;
        // SAFETY: `dev` and `attrs` are the device and the bundle of the
        // user call this buffer was made for, valid during it (the lifetime
        // of `self`); the core validates the attributes and the range.
        let raw = unsafe { bindings::ib_umem_get_cq_buf(self.dev, self.attrs, min_len, access) };
        let raw = kernel::error::from_err_ptr(raw)?;
        // SAFETY: A umem the core just made for the caller, owned by nobody
        // else.
        Ok(NonNull::new(raw).map(|raw| unsafe { Umem::from_raw(raw) }))
    }
}

/// The CQs of a device that take completion events, by the device's
/// number for them.
#[pin_data]
pub(crate) struct CqEvents {
    #[pin]
    cqs: SpinLockIrq<RBTree<u32, RegisteredCq>>,
}

/// A CQ in a [`CqEvents`] table.
struct RegisteredCq(NonNull<bindings::ib_cq>);

// SAFETY: The pointer is dereferenced only under the table's lock while
// the CQ is registered, which it is only while alive; the core's completion
// handler may be called from any context.
unsafe impl Send for RegisteredCq {}

impl CqEvents {
    /// An empty table.
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            cqs <- new_spinlock_irq!(RBTree::new(), "CqEvents::cqs"),
        })
    }

    /// Delivers a completion event to the CQ registered as `key`, from any
    /// context. Returns `false` if there is none: the CQ is gone, or never
    /// asked for events.
    pub(crate) fn notify(&self, key: u32) -> bool {
        let cqs = self.cqs.lock();
        let Some(cq) = cqs.get(&key) else {
            return false;
        };
        let cq = cq.0.as_ptr();
        // SAFETY: A registered CQ is alive: `Cq::destroy_callback` removes it
        // under this lock before the core frees it. The core set
        // `comp_handler` and `cq_context` before `create_user_cq` and does not
        // change them.
        unsafe {
            if let Some(handler) = (*cq).comp_handler {
                handler(cq, (*cq).cq_context);
            }
        }
        true
    }
}

/// Where a CQ is registered for completion events.
struct EventsEntry {
    table: Arc<CqEvents>,
    key: u32,
}

/// A completion queue with the driver's data `O::Cq`.
///
/// # Invariants
///
/// `ib` is at offset 0 of an allocation the core made with
/// `size_of::<Self>()` bytes; `data` and `events` are initialised from the
/// end of a successful `create_cq` until `destroy_cq` drops them. While
/// `events` names a table, the CQ is registered there under its key.
#[repr(C)]
#[pin_data]
pub(crate) struct Cq<O: Operations> {
    #[pin]
    ib: Opaque<bindings::ib_cq>,
    #[pin]
    data: O::Cq,
    events: Option<EventsEntry>,
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
        super::assert_core_allocated!("struct ib_cq must be at offset 0");
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
        // SAFETY: A user call's bundle has the context the call came
        // through, a live `UContext<O>` of this device.
        let ctx = unsafe { UContext::<O>::from_raw(bindings::refa_attrs_ucontext(attrs)) };
        // SAFETY: The driver udata lives in the bundle, valid for the call.
        let mut udata = unsafe { UData::from_raw(bindings::refa_attrs_driver_udata(attrs)) };
        let Some(cq_ptr) = NonNull::new(cq) else {
            return EINVAL.to_errno();
        };
        // Nothing may fail once the CQ exists on the device, so the table
        // entry for its events is allocated first.
        let reservation = match RBTreeNodeReservation::new(GFP_KERNEL) {
            Ok(r) => r,
            Err(e) => return e.to_errno(),
        };
        // SAFETY: `cq` is the start of an allocation sized for `Self`.
        let slot = unsafe { &raw mut (*cq.cast::<Self>()).data };
        // SAFETY: Operations are called only while the device is registered;
        // `slot` is valid, uninitialised memory that stays in place until
        // `destroy_callback` drops it.
        let ret = unsafe {
            dev.with_registration_data(|reg| {
                let buffer = CqBuffer {
                    dev: (*cq).device,
                    attrs,
                    _call: core::marker::PhantomData,
                };
                let (depth, init) = O::create_cq(reg, ctx, &attr, &buffer, &mut udata)?;
                pin_init::raw_try_init(slot, init)?;
                // SAFETY: Initialised just above.
                Ok::<_, Error>((depth, O::cq_events(reg, &*slot)))
            })
        };
        kernel::error::from_result(|| {
            let (depth, events) = ret?;
            let events = events.map(|(table, key)| {
                let node = reservation.into_node(key, RegisteredCq(cq_ptr));
                // A key still in use would be the device's double allocation;
                // the newer CQ is the live one.
                let stale = table.cqs.lock().insert(node);
                drop(stale);
                EventsEntry { table, key }
            });
            // SAFETY: `cq` is the start of an allocation sized for `Self` that
            // nothing else uses before this call returns; the field is
            // uninitialised (zeroed) memory without a destructor to run.
            unsafe { (&raw mut (*cq.cast::<Self>()).events).write(events) };
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
        // Events stop first: the handler is never called past this point.
        // SAFETY: Initialised by `create_callback` and read only here; it is
        // not dropped in place below.
        let events = unsafe { (&raw const (*cq.cast::<Self>()).events).read() };
        if let Some(entry) = events {
            let node = entry.table.cqs.lock().remove_node(&entry.key);
            drop(node);
        }
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
