// SPDX-License-Identifier: GPL-2.0

//! Queue pairs (`struct ib_qp`) created by userspace.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! The core allocates the QP with the size the layer registered and zeroes
//! it; [`DriverQp::create`] initialises the driver's part in place and
//! [`DriverQp::destroy`] sees it last. Only user QPs exist: kernel callers
//! (no udata) are refused, as the layer offers no kernel verbs.

use super::{
    bindings,
    device::{
        kind,
        CqOf,
        Device,
        DriverObject,
        Layer,
        MmapSetOf,
        NewObject,
        Object,
        Operations,
        PdOf,
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

/// A QP type (`enum ib_qp_type`), as the driver sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpType {
    /// Unreliable datagram.
    Ud,
    /// A driver-defined type, told apart by the driver's udata.
    Driver,
    /// Any other type, by its C value.
    Other(u32),
}

impl QpType {
    fn from_raw(raw: bindings::ib_qp_type) -> Self {
        match raw {
            bindings::ib_qp_type_IB_QPT_UD => Self::Ud,
            bindings::ib_qp_type_IB_QPT_DRIVER => Self::Driver,
            other => Self::Other(other),
        }
    }

    fn into_raw(self) -> bindings::ib_qp_type {
        match self {
            Self::Ud => bindings::ib_qp_type_IB_QPT_UD,
            Self::Driver => bindings::ib_qp_type_IB_QPT_DRIVER,
            Self::Other(raw) => raw,
        }
    }
}

/// A QP state (`enum ib_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum QpState {
    /// Reset.
    Reset = bindings::ib_qp_state_IB_QPS_RESET,
    /// Initialised.
    Init = bindings::ib_qp_state_IB_QPS_INIT,
    /// Ready to receive.
    Rtr = bindings::ib_qp_state_IB_QPS_RTR,
    /// Ready to send.
    Rts = bindings::ib_qp_state_IB_QPS_RTS,
    /// Send queue drained.
    Sqd = bindings::ib_qp_state_IB_QPS_SQD,
    /// Send queue error.
    Sqe = bindings::ib_qp_state_IB_QPS_SQE,
    /// Error.
    Error = bindings::ib_qp_state_IB_QPS_ERR,
}

impl QpState {
    /// All states, in the order of their C values.
    pub(crate) const ALL: [Self; 7] = [
        Self::Reset,
        Self::Init,
        Self::Rtr,
        Self::Rts,
        Self::Sqd,
        Self::Sqe,
        Self::Error,
    ];

    /// The state with C value `raw`; `EINVAL` for values that name none.
    pub(crate) fn from_raw(raw: u32) -> Result<Self> {
        Self::ALL.get(raw as usize).copied().ok_or(EINVAL)
    }
}

/// Bits of `enum ib_qp_attr_mask`.
pub(crate) mod attr_mask {
    use super::bindings;

    /// `IB_QP_STATE`.
    pub(crate) const STATE: u32 = bindings::ib_qp_attr_mask_IB_QP_STATE;
    /// `IB_QP_CUR_STATE`.
    pub(crate) const CUR_STATE: u32 = bindings::ib_qp_attr_mask_IB_QP_CUR_STATE;
    /// `IB_QP_EN_SQD_ASYNC_NOTIFY`.
    pub(crate) const EN_SQD_ASYNC_NOTIFY: u32 = bindings::ib_qp_attr_mask_IB_QP_EN_SQD_ASYNC_NOTIFY;
    /// `IB_QP_PKEY_INDEX`.
    pub(crate) const PKEY_INDEX: u32 = bindings::ib_qp_attr_mask_IB_QP_PKEY_INDEX;
    /// `IB_QP_PORT`.
    pub(crate) const PORT: u32 = bindings::ib_qp_attr_mask_IB_QP_PORT;
    /// `IB_QP_QKEY`.
    pub(crate) const QKEY: u32 = bindings::ib_qp_attr_mask_IB_QP_QKEY;
    /// `IB_QP_RNR_RETRY`.
    pub(crate) const RNR_RETRY: u32 = bindings::ib_qp_attr_mask_IB_QP_RNR_RETRY;
    /// `IB_QP_SQ_PSN`.
    pub(crate) const SQ_PSN: u32 = bindings::ib_qp_attr_mask_IB_QP_SQ_PSN;
    /// `IB_QP_CAP`.
    pub(crate) const CAP: u32 = bindings::ib_qp_attr_mask_IB_QP_CAP;
    /// `IB_QP_ATTR_STANDARD_BITS`: every attribute the core defines.
    pub(crate) const STANDARD_BITS: u32 = bindings::ib_qp_attr_mask_IB_QP_ATTR_STANDARD_BITS;
}

/// Whether the core's QP state machine for `qp_type` allows going from
/// `cur` to `next` with the attributes in `mask` (`ib_modify_qp_is_ok()`).
/// Types the core's table does not know (`IB_QPT_DRIVER` among them, and
/// any [`QpType::Other`] value past `IB_QPT_MAX`) are never allowed.
pub(crate) fn ib_modify_qp_is_ok(cur: QpState, next: QpState, qp_type: QpType, mask: u32) -> bool {
    let qp_type = qp_type.into_raw();
    // The core indexes its per-type tables with the type, unchecked.
    if qp_type >= bindings::ib_qp_type_IB_QPT_MAX {
        return false;
    }
    // SAFETY: A pure function of its arguments. The states are valid
    // `enum ib_qp_state` values (`QpState`), which index its state table,
    // and the type is below `IB_QPT_MAX` (checked above), which indexes the
    // per-type parameters; mask bits it does not know make it return false.
    unsafe { bindings::ib_modify_qp_is_ok(cur as u32, next as u32, qp_type, mask) }
}

/// The sizes of a QP's queues (`struct ib_qp_cap`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct QpCap {
    /// Send work requests.
    pub(crate) max_send_wr: u32,
    /// Receive work requests.
    pub(crate) max_recv_wr: u32,
    /// Scatter/gather entries per send work request.
    pub(crate) max_send_sge: u32,
    /// Scatter/gather entries per receive work request.
    pub(crate) max_recv_sge: u32,
    /// Inline data per send work request, in bytes.
    pub(crate) max_inline_data: u32,
}

impl QpCap {
    fn from_raw(cap: &bindings::ib_qp_cap) -> Self {
        Self {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        }
    }

    fn into_raw(self) -> bindings::ib_qp_cap {
        bindings::ib_qp_cap {
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline_data: self.max_inline_data,
            max_rdma_ctxs: 0,
        }
    }
}

/// What the creator of a QP asked for (`struct ib_qp_init_attr`), for a QP
/// of driver `D`.
pub(crate) struct QpInitAttr<'a, D: Operations> {
    /// The QP type.
    pub(crate) qp_type: QpType,
    /// The CQ of send completions.
    pub(crate) send_cq: Option<&'a CqOf<D>>,
    /// The CQ of receive completions.
    pub(crate) recv_cq: Option<&'a CqOf<D>>,
    /// A shared receive queue is wanted.
    pub(crate) srq: bool,
    /// `enum ib_qp_create_flags`.
    pub(crate) create_flags: u32,
    /// Queue sizes.
    pub(crate) cap: QpCap,
}

/// New attributes of a QP (`struct ib_qp_attr`), for `modify_qp`; only
/// those the mask names are meaningful.
pub(crate) struct QpAttr<'a>(&'a bindings::ib_qp_attr);

impl QpAttr<'_> {
    /// The new state, raw (`IB_QP_STATE`).
    pub(crate) fn qp_state(&self) -> u32 {
        self.0.qp_state
    }

    /// The state the caller believes the QP is in, raw (`IB_QP_CUR_STATE`).
    pub(crate) fn cur_qp_state(&self) -> u32 {
        self.0.cur_qp_state
    }

    /// Queue key (`IB_QP_QKEY`).
    pub(crate) fn qkey(&self) -> u32 {
        self.0.qkey
    }

    /// Send packet sequence number (`IB_QP_SQ_PSN`).
    pub(crate) fn sq_psn(&self) -> u32 {
        self.0.sq_psn
    }

    /// Asynchronous event when the send queue is drained
    /// (`IB_QP_EN_SQD_ASYNC_NOTIFY`).
    pub(crate) fn en_sqd_async_notify(&self) -> u8 {
        self.0.en_sqd_async_notify
    }

    /// RNR retry count (`IB_QP_RNR_RETRY`).
    pub(crate) fn rnr_retry(&self) -> u8 {
        self.0.rnr_retry
    }

    /// Port (`IB_QP_PORT`).
    pub(crate) fn port_num(&self) -> u32 {
        self.0.port_num
    }

    /// P_Key index (`IB_QP_PKEY_INDEX`).
    pub(crate) fn pkey_index(&self) -> u16 {
        self.0.pkey_index
    }
}

/// What `query_qp` reports of a QP.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpQuery {
    /// Current state.
    pub(crate) state: QpState,
    /// Queue key.
    pub(crate) qkey: u32,
    /// Send packet sequence number.
    pub(crate) sq_psn: u32,
    /// The send queue is draining.
    pub(crate) sq_draining: bool,
    /// RNR retry count.
    pub(crate) rnr_retry: u8,
    /// The QP's port.
    pub(crate) port_num: u32,
    /// Queue sizes.
    pub(crate) cap: QpCap,
}

/// A queue pair with the driver's data `T`.
pub(crate) type Qp<T> = Object<T>;

impl<T: DriverQp> Qp<T> {
    /// The QP's type.
    pub(crate) fn qp_type(&self) -> QpType {
        // SAFETY: Set by the core before `create_qp`, never changed after.
        QpType::from_raw(unsafe { (*self.as_raw()).qp_type })
    }
}

/// The driver's part of a queue pair.
#[vtable]
pub(crate) trait DriverQp: DriverObject<Kind = kind::Qp> {
    /// Creates the driver's part of a new queue pair in user context `ctx`
    /// and protection domain `pd`, as `attr` asks; `udata` carries the
    /// driver's request and response, and `mmaps` takes what the QP offers
    /// the context to map. Returns the QP number with the initialiser, which
    /// cannot fail: whatever can, happens before this returns.
    fn create<'a>(
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
        _ctx: &UContextOf<Self::Driver>,
        _pd: &PdOf<Self::Driver>,
        _attr: &QpInitAttr<'_, Self::Driver>,
        _udata: &mut UData<'_>,
        _mmaps: &mut MmapSetOf<'_, Self::Driver>,
    ) -> Result<(u32, impl PinInit<Self>)> {
        // Not in the table unless implemented (`HAS_CREATE`).
        Err::<(u32, Self), _>(EOPNOTSUPP)
    }

    /// Changes the attributes of `qp` that `mask` names to those of `attr`;
    /// `udata` carries the driver's request, if the call has one. Required
    /// with [`DriverQp::create`].
    fn modify<'a>(
        _qp: &Qp<Self>,
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
        _attr: &QpAttr<'_>,
        _mask: u32,
        _udata: Option<&mut UData<'_>>,
    ) -> Result {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Reports the attributes of `qp`; `mask` says which the caller wants.
    fn query<'a>(
        _qp: &Qp<Self>,
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
        _mask: u32,
    ) -> Result<QpQuery> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Releases what the driver's part of a queue pair holds on the device.
    /// Called once; the QP's remaining mmap entries are withdrawn and its
    /// data dropped after this. The QP goes whatever happens on the device
    /// (see [`super::registration`] on destroys). Required with
    /// [`DriverQp::create`].
    fn destroy<'a>(_qp: &Qp<Self>, _dev: &Device<Self::Driver>, _data: &RegData<'a, Self::Driver>) {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Called when userspace destroys the QP, before
    /// [`DriverQp::destroy`]: an error refuses it, and the core keeps the
    /// QP and returns the error. Never called where a destroy cannot fail
    /// (close, device removal; see [`super::registration`] on destroys).
    /// The core also undoes a creation that failed after the driver's part
    /// (its response could not be copied, say) through this path; then
    /// nothing of the QP is mapped yet ([`MmapSet::insert_with_private`]).
    /// By default nothing is refused.
    fn may_destroy<'a>(
        _qp: &Qp<Self>,
        _dev: &Device<Self::Driver>,
        _data: &RegData<'a, Self::Driver>,
    ) -> Result {
        Ok(())
    }
}

/// `create_qp` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core with a zeroed allocation of `size_of::<Qp<T>>()` bytes
/// for a registered device of `T::Driver` whose `pd` is an initialised PD of
/// it, `attr` valid with its CQs null or initialised CQs of the device, and
/// `udata` null or the driver udata of the user call creating it, for the
/// call.
pub(super) unsafe extern "C" fn create_callback<T: DriverQp>(
    qp: *mut bindings::ib_qp,
    attr: *mut bindings::ib_qp_init_attr,
    udata: *mut bindings::ib_udata,
) -> kernel::ffi::c_int {
    // SAFETY: The core set the device before this call; a non-null `udata`
    // is the driver udata of the user call, in the calling process.
    let Some(mut udata) = (unsafe { UData::from_raw((*qp).device, udata) }) else {
        // No kernel verbs: kernel callers get no QP.
        return EOPNOTSUPP.to_errno();
    };
    let Some(ctx_raw) = NonNull::new(udata.ucontext_raw()) else {
        return EINVAL.to_errno();
    };
    // SAFETY: The bundle of a user call that creates an object has the
    // context the call came through, a live, initialised context of this
    // device (so of `T::Driver`).
    let ctx = unsafe { UContextOf::<T::Driver>::from_raw(ctx_raw.as_ptr()) };
    // SAFETY: The core set the PD before this call, an initialised PD of this
    // device.
    let pd = unsafe { PdOf::<T::Driver>::from_raw((*qp).pd) };
    // SAFETY: `attr` is valid for the call; the CQs are null or initialised
    // CQs of this device, which the core keeps while QPs use them.
    let init = unsafe {
        let a = &*attr;
        QpInitAttr::<T::Driver> {
            qp_type: QpType::from_raw(a.qp_type),
            send_cq: (!a.send_cq.is_null()).then(|| CqOf::<T::Driver>::from_raw(a.send_cq)),
            recv_cq: (!a.recv_cq.is_null()).then(|| CqOf::<T::Driver>::from_raw(a.recv_cq)),
            srq: !a.srq.is_null(),
            create_flags: a.create_flags,
            cap: QpCap::from_raw(&a.cap),
        }
    };
    // SAFETY: The context outlives the QP (the core destroys a context's
    // objects before it), and the set lives for this call.
    let mut mmaps = unsafe { MmapSet::new(ctx_raw) };
    // SAFETY: `qp` is the start of an allocation sized for `Qp<T>` for a
    // device of `T::Driver`, which nobody else uses before this returns and
    // which stays in place until `destroy_callback`.
    let slot = unsafe { NewObject::<T>::new(NonNull::new_unchecked(qp)) };
    let create = |dev: &Device<T::Driver>, data: &RegData<'_, T::Driver>| -> Result<u32> {
        let (qp_num, data) = T::create(dev, data, ctx, pd, &init, &mut udata, &mut mmaps)?;
        let layer = slot.init(Layer::new(), data);
        // The entries belong to the QP from here on; until here, a failure
        // dropped the set, which withdrew them.
        layer.mappings = mmaps.into_mappings();
        Ok(qp_num)
    };
    // SAFETY: The core set the device, a registered device of `T::Driver`.
    let ret = unsafe { Qp::<T>::with_driver(qp, create) };
    kernel::error::from_result(|| {
        let qp_num = ret?;
        // SAFETY: The QP is not visible to anyone else before this returns.
        unsafe { (*qp).qp_num = qp_num };
        Ok(0)
    })
}

/// `modify_qp` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core for a QP `create_callback` initialised, with `attr`
/// valid and `udata` null or the driver udata of the user call, for the
/// call.
pub(super) unsafe extern "C" fn modify_callback<T: DriverQp>(
    qp: *mut bindings::ib_qp,
    attr: *mut bindings::ib_qp_attr,
    mask: kernel::ffi::c_int,
    udata: *mut bindings::ib_udata,
) -> kernel::ffi::c_int {
    // SAFETY: An initialised `Qp<T>` per the safety requirements.
    let this = unsafe { Qp::<T>::from_raw(qp) };
    // SAFETY: Valid for reads for the call.
    let attr = QpAttr(unsafe { &*attr });
    // SAFETY: A non-null `udata` is the driver udata of the user call, in
    // the calling process.
    let mut udata = unsafe { UData::from_raw((*qp).device, udata) };
    // SAFETY: Operations run only while the device is registered.
    let ret = unsafe {
        Qp::<T>::with_driver(qp, |dev, data| {
            T::modify(this, dev, data, &attr, mask as u32, udata.as_mut())
        })
    };
    kernel::error::from_result(|| ret.map(|()| 0))
}

/// `query_qp` of the `ib_device_ops` table.
///
/// # Safety
///
/// Called by the core for a QP `create_callback` initialised, with `attr`
/// and `init` valid for writes for the call.
pub(super) unsafe extern "C" fn query_callback<T: DriverQp>(
    qp: *mut bindings::ib_qp,
    attr: *mut bindings::ib_qp_attr,
    mask: kernel::ffi::c_int,
    init: *mut bindings::ib_qp_init_attr,
) -> kernel::ffi::c_int {
    // SAFETY: An initialised `Qp<T>` per the safety requirements.
    let this = unsafe { Qp::<T>::from_raw(qp) };
    // SAFETY: Operations run only while the device is registered.
    let ret =
        unsafe { Qp::<T>::with_driver(qp, |dev, data| T::query(this, dev, data, mask as u32)) };
    kernel::error::from_result(|| {
        let q = ret?;
        let cap = q.cap.into_raw();
        // SAFETY: Both are valid for writes for the call; the fields of the
        // QP are set by the core and stable while it lives. Zero is a valid
        // value of both structures.
        unsafe {
            *attr = bindings::ib_qp_attr {
                qp_state: q.state as u32,
                qkey: q.qkey,
                sq_psn: q.sq_psn,
                sq_draining: q.sq_draining.into(),
                port_num: q.port_num,
                rnr_retry: q.rnr_retry,
                cap,
                ..Default::default()
            };
            *init = bindings::ib_qp_init_attr {
                qp_type: (*qp).qp_type,
                send_cq: (*qp).send_cq,
                recv_cq: (*qp).recv_cq,
                qp_context: (*qp).qp_context,
                cap,
                ..Default::default()
            };
        }
        Ok(0)
    })
}

/// `destroy_qp` of the `ib_device_ops` table. Fails only where the driver
/// refuses a user's destroy ([`DriverQp::may_destroy`]).
///
/// # Safety
///
/// Called by the core for a QP `create_callback` initialised, with `udata`
/// null or the driver udata of the call's bundle; once more after it
/// failed, until it succeeds.
pub(super) unsafe extern "C" fn destroy_callback<T: DriverQp>(
    qp: *mut bindings::ib_qp,
    udata: *mut bindings::ib_udata,
) -> kernel::ffi::c_int {
    // SAFETY: An initialised `Qp<T>` per the safety requirements.
    let this = unsafe { Qp::<T>::from_raw(qp) };
    // SAFETY: `udata` is as `destroys_what_is_left` wants.
    if !unsafe { destroys_what_is_left(udata) } {
        // SAFETY: Operations run only while the device is registered.
        let ret = unsafe { Qp::<T>::with_driver(qp, |dev, data| T::may_destroy(this, dev, data)) };
        if let Err(e) = ret {
            return e.to_errno();
        }
    }
    // SAFETY: Operations run only while the device is registered.
    unsafe { Qp::<T>::with_driver(qp, |dev, data| T::destroy(this, dev, data)) };
    // SAFETY: The last use of the QP: the core frees it after this returns 0.
    unsafe { Qp::<T>::drop_in_place(qp, true) };
    0
}

#[kunit_tests(refa_rdma_qp)]
mod tests {
    use super::*;

    /// Types past the core's per-type table (the driver type, unknown
    /// values) are refused before the core indexes the table with them.
    #[test]
    fn modify_checks_stay_in_the_cores_table() {
        let init = attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT | attr_mask::QKEY;
        assert!(ib_modify_qp_is_ok(
            QpState::Reset,
            QpState::Init,
            QpType::Ud,
            init
        ));
        assert!(!ib_modify_qp_is_ok(
            QpState::Reset,
            QpState::Init,
            QpType::Ud,
            attr_mask::STATE
        ));
        for qp_type in [
            QpType::Driver,
            QpType::Other(bindings::ib_qp_type_IB_QPT_MAX),
            QpType::Other(u32::MAX),
        ] {
            assert!(!ib_modify_qp_is_ok(
                QpState::Reset,
                QpState::Init,
                qp_type,
                init
            ));
        }
    }
}
