// SPDX-License-Identifier: GPL-2.0

//! Completion counters (`struct ib_comp_cntr`).
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! A completion counter is a pair of 64-bit values, one counting the
//! successful completions and one the failed ones of the operations of the
//! QPs attached to it. Userspace creates one through the core's
//! `COMP_CNTR` object (ioctl only), attaches it to QPs for a set of
//! operations, and may set or add to either value; how it reads them is
//! the driver's uAPI (memory userspace passes in a driver attribute of the
//! creation, say, which [`Umem::from_buffer_attr`] pins).
//!
//! The core allocates the counter with the size the layer registered and
//! zeroes it; [`DriverCompCntr::create`] returns the driver's part, which
//! [`DriverCompCntr::destroy`] gets back by value once no QP uses the
//! counter any more (the core counts attachments and refuses to destroy an
//! attached counter; a QP's attachments end with the QP). There is no
//! detach verb.
//!
//! [`Umem::from_buffer_attr`]: super::umem::Umem::from_buffer_attr

use super::{
    bindings,
    device::{
        kind,
        Device,
        DriverObject,
        Layer,
        NewObject,
        Object,
        QpOf,
        RegData,
        UContextOf, //
    },
    udata::UData, //
};
use core::ptr::NonNull;
use kernel::prelude::*;

kernel::impl_flags!(
    /// Operations of a QP a completion counter can count
    /// (`enum ib_qp_attach_comp_cntr_op`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub(crate) struct QpCounterOps(u32);

    /// One operation of a QP a completion counter can count.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum QpCounterOp {
        /// Sends the QP posts.
        Send = bindings::ib_qp_attach_comp_cntr_op_IB_QP_ATTACH_COMP_CNTR_OP_SEND,
        /// Receives of the QP.
        Recv = bindings::ib_qp_attach_comp_cntr_op_IB_QP_ATTACH_COMP_CNTR_OP_RECV,
        /// RDMA reads the QP posts.
        RdmaRead = bindings::ib_qp_attach_comp_cntr_op_IB_QP_ATTACH_COMP_CNTR_OP_RDMA_READ,
        /// RDMA reads of the QP's memory by remote QPs.
        RemoteRdmaRead =
            bindings::ib_qp_attach_comp_cntr_op_IB_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_READ,
        /// RDMA writes the QP posts.
        RdmaWrite = bindings::ib_qp_attach_comp_cntr_op_IB_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE,
        /// RDMA writes to the QP's memory by remote QPs.
        RemoteRdmaWrite =
            bindings::ib_qp_attach_comp_cntr_op_IB_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE,
    }
);

impl QpCounterOps {
    /// The operations as the core passes them, unknown bits included.
    pub(crate) const fn from_raw(raw: u32) -> Self {
        Self(raw)
    }

    /// The raw bits, unknown ones included.
    pub(crate) const fn bits(self) -> u32 {
        self.0
    }
}

/// One of the two values of a completion counter
/// (`enum ib_comp_cntr_entry`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CompCntrEntry {
    /// Successful completions.
    Completions,
    /// Failed completions.
    Errors,
}

impl CompCntrEntry {
    /// The entry the core names; `EINVAL` for values of the uAPI enum this
    /// kernel does not know (the core passes any).
    fn from_raw(raw: bindings::ib_comp_cntr_entry) -> Result<Self> {
        const COMP: u32 = bindings::ib_comp_cntr_entry::IB_COMP_CNTR_ENTRY_COMP.0;
        const ERR: u32 = bindings::ib_comp_cntr_entry::IB_COMP_CNTR_ENTRY_ERR.0;
        match raw.0 {
            COMP => Ok(Self::Completions),
            ERR => Ok(Self::Errors),
            _ => Err(EINVAL),
        }
    }
}

/// How a modification changes a value (`enum ib_comp_cntr_modify_op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CompCntrModifyOp {
    /// The value becomes the operand.
    Set,
    /// The operand is added to the value.
    Add,
}

impl CompCntrModifyOp {
    /// The operation the core names; `EINVAL` for values of the uAPI enum
    /// this kernel does not know.
    fn from_raw(raw: bindings::ib_comp_cntr_modify_op) -> Result<Self> {
        const SET: u32 = bindings::ib_comp_cntr_modify_op::IB_COMP_CNTR_MODIFY_OP_SET.0;
        const INC: u32 = bindings::ib_comp_cntr_modify_op::IB_COMP_CNTR_MODIFY_OP_INC.0;
        match raw.0 {
            SET => Ok(Self::Set),
            INC => Ok(Self::Add),
            _ => Err(EINVAL),
        }
    }
}

/// What a device offers of completion counters (`struct
/// ib_comp_cntr_caps`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CompCntrCaps {
    /// Most counters.
    pub(crate) max_counters: u32,
    /// Values wrap to 0 after this one.
    pub(crate) max_value: u64,
    /// The operations a counter can count.
    pub(crate) qp_ops: QpCounterOps,
}

/// A completion counter with the driver's data `T`.
pub(crate) type CompCntr<T> = Object<T>;

/// The driver's part of a completion counter. It is [`Unpin`]: destruction
/// hands it back by value.
#[vtable]
pub(crate) trait DriverCompCntr: DriverObject<Kind = kind::CompCntr> + Unpin {
    /// What the device offers of completion counters. Required with
    /// [`DriverCompCntr::create`].
    fn caps<'a>(
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
    ) -> Result<CompCntrCaps> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Creates the driver's part of a new completion counter in user context
    /// `ctx`; `udata` is the call, with its driver attributes. Completion
    /// counters are offered when this is implemented.
    fn create<'a>(
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
        _ctx: &UContextOf<Self::Driver>,
        _udata: &mut UData<'_>,
    ) -> Result<Self> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Releases a completion counter; `cc` is the driver's data, given back.
    /// Called once, when no QP uses the counter. The counter goes whatever
    /// happens on the device (see [`super::registration`] on destroys), so
    /// the driver keeps (rather than drops) whatever the device may still
    /// write to. Required with [`DriverCompCntr::create`].
    fn destroy<'a>(_cc: Self, _dev: &Device<Self::Driver>, _data: &RegData<'a, Self::Driver>) {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Sets or adds to one value of a completion counter.
    fn modify<'a>(
        _cc: &CompCntr<Self>,
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
        _entry: CompCntrEntry,
        _op: CompCntrModifyOp,
        _value: u64,
    ) -> Result {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Makes a completion counter count operations `ops` of `qp`, which
    /// counts none of them yet (the core checks): all of them or, on
    /// failure, none. The attachment ends with the QP. Required with
    /// [`DriverCompCntr::create`].
    fn attach<'a>(
        _cc: &CompCntr<Self>,
        _qp: &QpOf<Self::Driver>,
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
        _ops: QpCounterOps,
    ) -> Result {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }
}

/// `create_comp_cntr` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core with a zeroed allocation of `size_of::<CompCntr<T>>()`
/// bytes for a registered device of `T::Driver`, and `attrs` the bundle of
/// the user call creating it, valid for the call.
pub(super) unsafe extern "C" fn create_callback<T: DriverCompCntr>(
    cc: *mut bindings::ib_comp_cntr,
    attrs: *mut bindings::uverbs_attr_bundle,
) -> kernel::ffi::c_int {
    // SAFETY: The core set the device before this call, and `attrs` is the
    // bundle of the user call, in the calling process.
    let Some(mut udata) = (unsafe { UData::from_bundle((*cc).device, attrs) }) else {
        return EINVAL.to_errno();
    };
    let ctx = udata.ucontext_raw();
    if ctx.is_null() {
        return EINVAL.to_errno();
    }
    // SAFETY: The bundle of a user call that creates an object has the
    // context the call came through, a live, initialised context of this
    // device (so of `T::Driver`).
    let ctx = unsafe { UContextOf::<T::Driver>::from_raw(ctx) };
    // SAFETY: `cc` is the start of an allocation sized for `CompCntr<T>` for
    // a device of `T::Driver`, which nobody else uses before this returns and
    // which stays in place until `destroy_callback`.
    let slot = unsafe { NewObject::<T>::new(NonNull::new_unchecked(cc)) };
    let create = |dev: &Device<T::Driver>, data: &RegData<'_, T::Driver>| -> Result {
        // `T` is `Unpin`: a value is its own initialiser.
        let data = T::create(dev, data, ctx, &mut udata)?;
        slot.init(Layer::new(), data);
        Ok(())
    };
    // SAFETY: The core set the device, a registered device of `T::Driver`.
    let ret = unsafe { CompCntr::<T>::with_driver(cc, create) };
    kernel::error::from_result(|| ret.map(|()| 0))
}

/// `destroy_comp_cntr` of the `ib_device_ops` table. Always succeeds.
///
/// # Safety
///
/// Called by the core once, for a counter `create_callback` initialised that
/// no QP uses.
pub(super) unsafe extern "C" fn destroy_callback<T: DriverCompCntr>(
    cc: *mut bindings::ib_comp_cntr,
) -> kernel::ffi::c_int {
    // SAFETY: An initialised `CompCntr<T>`; `T` is `Unpin` and the object is
    // dropped without its data below.
    let data = unsafe { CompCntr::<T>::take_data(cc) };
    // SAFETY: Operations run only while the device is registered.
    unsafe { CompCntr::<T>::with_driver(cc, |dev, reg| T::destroy(data, dev, reg)) };
    // SAFETY: The last use of the counter; its data was moved out, and the
    // core frees the memory after this returns 0.
    unsafe { CompCntr::<T>::drop_in_place(cc, false) };
    0
}

/// `modify_comp_cntr` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core for an initialised counter, which it holds for the
/// call.
pub(super) unsafe extern "C" fn modify_callback<T: DriverCompCntr>(
    cc: *mut bindings::ib_comp_cntr,
    entry: bindings::ib_comp_cntr_entry,
    op: bindings::ib_comp_cntr_modify_op,
    value: u64,
) -> kernel::ffi::c_int {
    // SAFETY: An initialised `CompCntr<T>` per the safety requirements.
    let this = unsafe { CompCntr::<T>::from_raw(cc) };
    kernel::error::from_result(|| {
        let entry = CompCntrEntry::from_raw(entry)?;
        let op = CompCntrModifyOp::from_raw(op)?;
        // SAFETY: Operations run only while the device is registered.
        unsafe {
            CompCntr::<T>::with_driver(cc, |dev, data| T::modify(this, dev, data, entry, op, value))
        }?;
        Ok(0)
    })
}

// out of tree: begin
/// [`modify_callback`] for `rust_rdma_modify_comp_cntr()`, which passes the
/// enums as integers (kCFI, see `include/rust/compat/rdma.h`).
///
/// # Safety
///
/// As for [`modify_callback`].
pub(super) unsafe extern "C" fn modify_callback_compat<T: DriverCompCntr>(
    cc: *mut bindings::ib_comp_cntr,
    entry: u32,
    op: u32,
    value: u64,
) -> kernel::ffi::c_int {
    let entry = bindings::ib_comp_cntr_entry(entry);
    let op = bindings::ib_comp_cntr_modify_op(op);
    // SAFETY: Per the function's safety requirements.
    unsafe { modify_callback::<T>(cc, entry, op, value) }
}
// out of tree: end

/// `qp_attach_comp_cntr` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core for an initialised counter and an initialised QP of
/// the same device, both held for the call, and `attr` valid.
pub(super) unsafe extern "C" fn qp_attach_callback<T: DriverCompCntr>(
    qp: *mut bindings::ib_qp,
    cc: *mut bindings::ib_comp_cntr,
    attr: *mut bindings::ib_qp_attach_comp_cntr_attr,
) -> kernel::ffi::c_int {
    // SAFETY: An initialised `CompCntr<T>` per the safety requirements.
    let this = unsafe { CompCntr::<T>::from_raw(cc) };
    // SAFETY: An initialised QP of the same device, so of `T::Driver`.
    let qp = unsafe { QpOf::<T::Driver>::from_raw(qp) };
    // SAFETY: `attr` is valid for the call.
    let ops = QpCounterOps::from_raw(unsafe { (*attr).op_mask });
    // SAFETY: Operations run only while the device is registered.
    let ret =
        unsafe { CompCntr::<T>::with_driver(cc, |dev, data| T::attach(this, qp, dev, data, ops)) };
    kernel::error::from_result(|| ret.map(|()| 0))
}

/// `query_comp_cntr_caps` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core for a registered device of `T::Driver`, with `caps`
/// valid for writes.
pub(super) unsafe extern "C" fn query_caps_callback<T: DriverCompCntr>(
    dev: *mut bindings::ib_device,
    caps: *mut bindings::ib_comp_cntr_caps,
    _attrs: *mut bindings::uverbs_attr_bundle,
) -> kernel::ffi::c_int {
    // SAFETY: Per the safety requirements.
    let dev = unsafe { Device::<T::Driver>::from_raw(dev) };
    // SAFETY: Operations run only while the device is registered.
    let ret = unsafe { dev.with_registration_data(|dev, data| T::caps(dev, data)) };
    kernel::error::from_result(|| {
        let value = ret?;
        // SAFETY: `caps` is valid for writes for the call.
        unsafe {
            *caps = bindings::ib_comp_cntr_caps {
                max_value: value.max_value,
                max_counters: value.max_counters,
                supported_qp_attach_ops: value.qp_ops.bits(),
            }
        };
        Ok(0)
    })
}
