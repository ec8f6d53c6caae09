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
//! the driver's uAPI (EFA devices write them to user memory).
//!
//! The core allocates the counter with the size the driver registered
//! (`size_ib_comp_cntr`) and zeroes it; [`Operations::create_comp_cntr`]
//! returns the driver's part, which [`Operations::destroy_comp_cntr`] gets
//! back once no QP uses the counter any more (the core counts attachments
//! and refuses to destroy an attached counter; a QP's attachments end with
//! the QP). There is no detach verb.

use super::{
    bindings,
    device::{
        Device,
        Operations, //
    },
    qp::Qp,
    ucontext::UContext,
    umem::{
        AccessFlags,
        Umem, //
    }, //
};
use core::{
    marker::PhantomData,
    ptr::NonNull, //
};
use kernel::{
    prelude::*,
    types::Opaque, //
};

super::flags_type! {
    /// Operations of a QP a completion counter can count
    /// (`enum ib_qp_attach_comp_cntr_op`).
    pub(crate) struct QpCounterOps {
        /// Sends the QP posts.
        const SEND = bindings::ib_qp_attach_comp_cntr_op_IB_QP_ATTACH_COMP_CNTR_OP_SEND;
        /// Receives of the QP.
        const RECV = bindings::ib_qp_attach_comp_cntr_op_IB_QP_ATTACH_COMP_CNTR_OP_RECV;
        /// RDMA reads the QP posts.
        const RDMA_READ = bindings::ib_qp_attach_comp_cntr_op_IB_QP_ATTACH_COMP_CNTR_OP_RDMA_READ;
        /// RDMA reads of the QP's memory by remote QPs.
        const REMOTE_RDMA_READ =
            bindings::ib_qp_attach_comp_cntr_op_IB_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_READ;
        /// RDMA writes the QP posts.
        const RDMA_WRITE = bindings::ib_qp_attach_comp_cntr_op_IB_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE;
        /// RDMA writes to the QP's memory by remote QPs.
        const REMOTE_RDMA_WRITE =
            bindings::ib_qp_attach_comp_cntr_op_IB_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE;
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
        use bindings::{
            ib_comp_cntr_entry_IB_COMP_CNTR_ENTRY_COMP as COMP,
            ib_comp_cntr_entry_IB_COMP_CNTR_ENTRY_ERR as ERR, //
        };
        match raw {
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
        use bindings::{
            ib_comp_cntr_modify_op_IB_COMP_CNTR_MODIFY_OP_INC as INC,
            ib_comp_cntr_modify_op_IB_COMP_CNTR_MODIFY_OP_SET as SET, //
        };
        match raw {
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

/// The attributes of a user call that creates a completion counter, valid
/// for the duration of one [`Operations::create_comp_cntr`]; the core has
/// checked them against the method's declaration, driver attributes
/// included.
pub(crate) struct CompCntrAttrs<'a> {
    dev: *mut bindings::ib_device,
    attrs: *mut bindings::uverbs_attr_bundle,
    _call: PhantomData<&'a ()>,
}

impl CompCntrAttrs<'_> {
    /// Pins the memory userspace described in buffer attribute `id` (a
    /// `struct ib_uverbs_buffer_desc`: an address range or a dma-buf),
    /// which must hold at least `min_len` bytes with `access` rights.
    /// `EINVAL` if userspace passed no such attribute.
    pub(crate) fn pin_buffer(&self, id: u16, min_len: usize, access: AccessFlags) -> Result<Umem> {
        let access = kernel::ffi::c_int::try_from(access.bits()).map_err(|_| EINVAL)?;
        // SAFETY: `dev` and `attrs` are the device and the bundle of the
        // user call this was made for, valid during it (the lifetime of
        // `self`); the core validates the descriptor and the range.
        let raw = unsafe { bindings::ib_umem_get_attr(self.dev, self.attrs, id, min_len, access) };
        let raw = NonNull::new(kernel::error::from_err_ptr(raw)?).ok_or(EINVAL)?;
        // SAFETY: A umem the core just made for the caller, owned by nobody
        // else.
        Ok(unsafe { Umem::from_raw(raw) })
    }
}

/// A completion counter with the driver's data `O::CompCntr`.
///
/// # Invariants
///
/// `ib` is at offset 0 of an allocation the core made with
/// `size_of::<Self>()` bytes; `data` is initialised from the end of a
/// successful `create_comp_cntr` until `destroy_comp_cntr` moves it out.
#[repr(C)]
pub(crate) struct CompCntr<O: Operations> {
    ib: Opaque<bindings::ib_comp_cntr>,
    data: O::CompCntr,
}

impl<O: Operations> CompCntr<O> {
    /// The driver's data.
    pub(crate) fn data(&self) -> &O::CompCntr {
        &self.data
    }

    /// Borrows the counter from its C pointer.
    ///
    /// # Safety
    ///
    /// `ptr` points to the `ib_comp_cntr` of a live, initialised
    /// `CompCntr<O>`.
    unsafe fn from_raw<'a>(ptr: *mut bindings::ib_comp_cntr) -> &'a Self {
        // SAFETY: `ib` is at offset 0; liveness is the caller's promise.
        unsafe { &*ptr.cast::<Self>() }
    }

    /// The device of the counter.
    ///
    /// # Safety
    ///
    /// `ptr` points to an `ib_comp_cntr` whose `device` the core set to a
    /// registered `Device<O>`.
    unsafe fn device_of<'a>(ptr: *mut bindings::ib_comp_cntr) -> &'a Device<O> {
        // SAFETY: Per the function's safety requirements.
        unsafe { Device::from_raw((*ptr).device) }
    }

    /// `create_comp_cntr` of the `ib_device_ops` table.
    ///
    /// # Safety
    ///
    /// Called by the core with a zeroed allocation of
    /// `size_of::<CompCntr<O>>()` bytes whose `device` is a registered
    /// `Device<O>`, and `attrs` the bundle of the user call, valid for the
    /// call.
    pub(super) unsafe extern "C" fn create_callback(
        cc: *mut bindings::ib_comp_cntr,
        attrs: *mut bindings::uverbs_attr_bundle,
    ) -> kernel::ffi::c_int {
        super::assert_core_allocated!("struct ib_comp_cntr must be at offset 0");
        // SAFETY: Per the function's safety requirements.
        let dev = unsafe { Self::device_of(cc) };
        // SAFETY: A user call's bundle has the context the call came
        // through, a live `UContext<O>` of this device.
        let ctx = unsafe { UContext::<O>::from_raw(bindings::refa_attrs_ucontext(attrs)) };
        let call = CompCntrAttrs {
            dev: dev.as_raw(),
            attrs,
            _call: PhantomData,
        };
        // SAFETY: Operations are called only while the device is registered.
        let ret = unsafe { dev.with_registration_data(|reg| O::create_comp_cntr(reg, ctx, &call)) };
        kernel::error::from_result(|| {
            let data = ret?;
            // SAFETY: `cc` is the start of an allocation sized for `Self`
            // that nothing else uses before this call returns; the field is
            // uninitialised (zeroed) memory.
            unsafe { (&raw mut (*cc.cast::<Self>()).data).write(data) };
            Ok(0)
        })
    }

    /// `destroy_comp_cntr` of the `ib_device_ops` table.
    ///
    /// Always succeeds: an error would leave the object with userspace,
    /// which cannot do better than the driver about a device that refuses
    /// to let go of it; failures are the driver's to report.
    ///
    /// # Safety
    ///
    /// Called by the core once, for a counter `create_callback`
    /// initialised that no QP uses.
    pub(super) unsafe extern "C" fn destroy_callback(
        cc: *mut bindings::ib_comp_cntr,
    ) -> kernel::ffi::c_int {
        // SAFETY: Initialised by `create_callback`; moved out once, here,
        // and the core frees the memory without looking at it.
        let data = unsafe { (&raw const (*cc.cast::<Self>()).data).read() };
        // SAFETY: Per the function's safety requirements.
        let dev = unsafe { Self::device_of(cc) };
        // SAFETY: Operations are called only while the device is registered.
        unsafe { dev.with_registration_data(|reg| O::destroy_comp_cntr(reg, data)) };
        0
    }

    /// `modify_comp_cntr` of the `ib_device_ops` table.
    ///
    /// # Safety
    ///
    /// Called by the core for an initialised counter, which it holds for
    /// the call.
    pub(super) unsafe extern "C" fn modify_callback(
        cc: *mut bindings::ib_comp_cntr,
        entry: bindings::ib_comp_cntr_entry,
        op: bindings::ib_comp_cntr_modify_op,
        value: u64,
    ) -> kernel::ffi::c_int {
        // SAFETY: Per the function's safety requirements.
        let (this, dev) = unsafe { (Self::from_raw(cc), Self::device_of(cc)) };
        kernel::error::from_result(|| {
            let entry = CompCntrEntry::from_raw(entry)?;
            let op = CompCntrModifyOp::from_raw(op)?;
            // SAFETY: Operations are called only while the device is
            // registered.
            unsafe {
                dev.with_registration_data(|reg| {
                    O::modify_comp_cntr(reg, this.data(), entry, op, value)
                })
            }?;
            Ok(0)
        })
    }

    /// `qp_attach_comp_cntr` of the `ib_device_ops` table.
    ///
    /// # Safety
    ///
    /// Called by the core for an initialised counter and an initialised QP
    /// of the same device, both held for the call, and `attr` valid.
    pub(super) unsafe extern "C" fn qp_attach_callback(
        qp: *mut bindings::ib_qp,
        cc: *mut bindings::ib_comp_cntr,
        attr: *mut bindings::ib_qp_attach_comp_cntr_attr,
    ) -> kernel::ffi::c_int {
        // SAFETY: Per the function's safety requirements.
        let (this, dev) = unsafe { (Self::from_raw(cc), Self::device_of(cc)) };
        // SAFETY: An initialised `Qp<O>` of the same device.
        let qp = unsafe { Qp::<O>::from_raw(qp) };
        // SAFETY: `attr` is valid for the call.
        let ops = QpCounterOps::from_raw(unsafe { (*attr).op_mask });
        // SAFETY: Operations are called only while the device is registered.
        let ret = unsafe {
            dev.with_registration_data(|reg| O::qp_attach_comp_cntr(reg, qp, this.data(), ops))
        };
        kernel::error::from_result(|| ret.map(|()| 0))
    }

    /// `query_comp_cntr_caps` of the `ib_device_ops` table.
    ///
    /// # Safety
    ///
    /// Called by the core for a registered `Device<O>`, with `caps` valid
    /// for writes.
    pub(super) unsafe extern "C" fn query_caps_callback(
        dev: *mut bindings::ib_device,
        caps: *mut bindings::ib_comp_cntr_caps,
        _attrs: *mut bindings::uverbs_attr_bundle,
    ) -> kernel::ffi::c_int {
        // SAFETY: Per the function's safety requirements.
        let dev = unsafe { Device::<O>::from_raw(dev) };
        // SAFETY: Operations are called only while the device is registered.
        let ret = unsafe { dev.with_registration_data(|reg| O::query_comp_cntr_caps(reg)) };
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
}
