// SPDX-License-Identifier: GPL-2.0

//! Queue pairs: SRD (`IB_QPT_DRIVER` with `EFA_QP_DRIVER_TYPE_SRD`) and UD.
//!
//! A QP's send queue is a low-latency queue (LLQ) in the device's memory
//! BAR, which userspace writes descriptors to (write-combining); its
//! receive queue is a ring of kernel pages the device reads and userspace
//! fills. Each queue has a doorbell in the doorbell BAR (uncached). All
//! four go to userspace as `rdma_user_mmap_entry` cookies and are
//! withdrawn when the QP is destroyed.
//!
//! Mappings made before that stay (the RDMA core cannot take them back).
//! The doorbells belong to the context's UAR, which lives as long as the
//! context, and the context as long as any mapping of it; the receive
//! ring is kernel pages that each mapping holds a reference to. The send
//! queue is device memory the device would give to the next QP: so the
//! mapping of the LLQ holds the QP on the device ([`crate::dev::lifetime`]),
//! which stops it (error state) when its verbs object is destroyed and
//! destroys it when the last mapping is gone.
//!
//! The state machine is the core's for UD (`ib_modify_qp_is_ok()`) and
//! the C driver's table for SRD; attributes the device has no use for are
//! refused with `EOPNOTSUPP`, illegal transitions with `EINVAL`.

use super::{
    data::{
        counted,
        VerbsData, //
    },
    pd::PdData,
    uapi::*,
    ucontext::UContextData,
    RdmaDriver, //
};
use crate::{
    dev::lifetime::{
        ObjectId,
        PageOwner,
        RecordSlot, //
    },
    hw::{
        admin::{
            CreateQpCmd,
            DeviceAttr as HwDeviceAttr,
            ModifyQpCmd,
            QpAllocSize,
            QpType as HwQpType, //
        },
        io::RX_DESC_SIZE, //
    },
    rdma::{
        cgroup::HcaCharge,
        device::{
            kind,
            Device,
            DriverObject,
            MmapSetOf,
            RegData, //
        },
        mmap::{
            Backing,
            DmaDirection,
            DmaPages, //
        },
        pd::Pd,
        qp::{
            attr_mask,
            ib_modify_qp_is_ok,
            DriverQp,
            Qp,
            QpAttr,
            QpCap,
            QpInitAttr,
            QpQuery,
            QpState,
            QpType, //
        },
        ucontext::UContext,
        udata::UData, //
    }, //
};
// out of tree: begin
use crate::kernel_gaps::ratelimit::{
    dev_err_ratelimited,
    dev_warn_ratelimited, //
};
// out of tree: end
use kernel::{
    new_mutex,
    page::{
        PAGE_MASK,
        PAGE_SIZE, //
    },
    prelude::*,
    sync::Mutex, //
};

/// The one port.
const PORT: u32 = super::PORT;

/// The end of the first version of `efa_ibv_create_qp`: userspace that
/// sends less is refused.
const CREATE_QP_MIN_LEN: usize =
    core::mem::offset_of!(efa_ibv_create_qp, driver_qp_type) + core::mem::size_of::<u32>();

/// Attributes `modify_qp` may change.
const MODIFY_SUPPORTED: u32 = attr_mask::STATE
    | attr_mask::CUR_STATE
    | attr_mask::EN_SQD_ASYNC_NOTIFY
    | attr_mask::PKEY_INDEX
    | attr_mask::PORT
    | attr_mask::QKEY
    | attr_mask::SQ_PSN
    | attr_mask::RNR_RETRY;

/// Attributes `query_qp` reports.
const QUERY_SUPPORTED: u32 = attr_mask::STATE
    | attr_mask::PKEY_INDEX
    | attr_mask::PORT
    | attr_mask::QKEY
    | attr_mask::SQ_PSN
    | attr_mask::CAP
    | attr_mask::RNR_RETRY;

/// The driver's part of a queue pair, held in the device's records, which
/// keep its receive ring for as long as the device has the QP. Its four
/// mappings (SQ and RQ doorbells, LLQ, RQ ring) belong to the QP's layer
/// part, which withdraws them.
#[pin_data]
pub(crate) struct QpData {
    qp_handle: u32,
    cap: QpCap,
    /// The state the device has the QP in, as far as the driver knows;
    /// held across a MODIFY_QP so that transitions are checked against
    /// the state they start from.
    #[pin]
    state: Mutex<QpState>,
}

impl QpData {
    /// The device's handle for the QP.
    pub(super) fn handle(&self) -> u32 {
        self.qp_handle
    }
}

impl DriverObject for QpData {
    type Driver = RdmaDriver;
    type Kind = kind::Qp;
}

#[vtable]
impl DriverQp for QpData {
    fn create<'a>(
        _dev: &Device<RdmaDriver>,
        data: &RegData<'a, RdmaDriver>,
        ctx: &UContext<UContextData>,
        pd: &Pd<PdData>,
        attr: &QpInitAttr<'_, RdmaDriver>,
        udata: &mut UData<'_>,
        mmaps: &mut MmapSetOf<'_, RdmaDriver>,
    ) -> Result<(u32, impl PinInit<Self>)> {
        counted(
            &data.errors.create_qp,
            create_qp(data, ctx, pd, attr, udata, mmaps),
        )
    }

    fn modify<'a>(
        qp: &Qp<Self>,
        _dev: &Device<RdmaDriver>,
        data: &VerbsData<'a>,
        attr: &QpAttr<'_>,
        mask: u32,
        udata: Option<&mut UData<'_>>,
    ) -> Result {
        modify_qp(data, qp, attr, mask, udata)
    }

    fn query<'a>(
        qp: &Qp<Self>,
        _dev: &Device<RdmaDriver>,
        data: &VerbsData<'a>,
        mask: u32,
    ) -> Result<QpQuery> {
        query_qp(data, qp, mask)
    }

    fn destroy<'a>(qp: &Qp<Self>, _dev: &Device<RdmaDriver>, data: &VerbsData<'a>) {
        destroy_qp(data, qp);
    }

    fn may_destroy<'a>(qp: &Qp<Self>, dev: &Device<RdmaDriver>, data: &VerbsData<'a>) -> Result {
        may_destroy_qp(dev, data, qp)
    }
}

fn in_page(offset: u32) -> u32 {
    offset & !(PAGE_MASK as u32)
}

fn page_align(n: u64) -> Option<u64> {
    n.checked_next_multiple_of(PAGE_SIZE as u64)
}

/// The largest receive ring a QP with `cap` has a use for, in bytes: what
/// the efa provider asks for, a descriptor per scatter-gather element of
/// every receive work request, in a power-of-two ring.
fn max_rq_ring_size(cap: &QpCap) -> u64 {
    let descriptors = u64::from(cap.max_recv_wr) * u64::from(cap.max_recv_sge.max(1));
    descriptors.max(1).next_power_of_two() * RX_DESC_SIZE as u64
}

/// Checks the queue sizes asked for against the device's limits.
fn check_cap(dev: &VerbsData<'_>, cap: &QpCap, sq_ring_size: u32) -> Result {
    let q = &dev.attrs.queues;
    let ok = cap.max_send_wr <= q.max_sq_depth
        && sq_ring_size <= q.max_llq_size
        && cap.max_recv_wr <= q.max_rq_depth
        && cap.max_send_sge <= q.max_wr_send_sges.into()
        && cap.max_recv_sge <= q.max_wr_recv_sges.into()
        && cap.max_inline_data <= dev.attrs.inline_buf_size_ex();
    if !ok {
        dev_dbg!(
            dev.core.dev(),
            "QP capabilities {:?} exceed the device's\n",
            cap
        );
        return Err(EINVAL);
    }
    Ok(())
}

/// The device QP type for a verbs QP type and the driver type of the
/// request.
fn device_qp_type(qp_type: QpType, driver_qp_type: u32) -> Result<HwQpType> {
    match qp_type {
        QpType::Ud => Ok(HwQpType::Ud),
        QpType::Driver if driver_qp_type == EFA_QP_DRIVER_TYPE_SRD => Ok(HwQpType::Srd),
        _ => Err(EOPNOTSUPP),
    }
}

/// The create flags of `efa-abi.h` a device with `dev`'s capabilities
/// honours.
fn supported_create_flags(dev: &VerbsData<'_>) -> u32 {
    let mut flags = 0;
    if dev.attrs.has_cap(HwDeviceAttr::UNSOLICITED_WRITE_RECV) {
        flags |= EFA_CREATE_QP_WITH_UNSOLICITED_WRITE_RECV;
    }
    if dev.attrs.has_cap(HwDeviceAttr::SQ_64_BIT_REQ_ID) {
        flags |= EFA_CREATE_QP_WITH_SQ_64_BIT_REQ_ID;
    }
    flags
}

fn create_qp(
    dev: &VerbsData<'_>,
    ctx: &UContext<UContextData>,
    pd: &Pd<PdData>,
    attr: &QpInitAttr<'_, RdmaDriver>,
    udata: &mut UData<'_>,
    mmaps: &mut MmapSetOf<'_, RdmaDriver>,
) -> Result<(u32, impl PinInit<QpData>)> {
    let cmd: efa_ibv_create_qp = udata.read::<Uapi<_>>(CREATE_QP_MIN_LEN)?.0;
    udata.check_comp_mask(cmd.comp_mask.into(), 0)?;
    if cmd.reserved_98 != [0; 5] {
        return Err(EINVAL);
    }
    let flags = u32::from(cmd.flags);
    if flags & !supported_create_flags(dev) != 0 {
        return Err(EOPNOTSUPP);
    }
    check_cap(dev, &attr.cap, cmd.sq_ring_size)?;
    if attr.srq || attr.create_flags != 0 {
        return Err(EOPNOTSUPP);
    }
    let qp_type = device_qp_type(attr.qp_type, cmd.driver_qp_type)?;
    let (Some(send_cq), Some(recv_cq)) = (attr.send_cq, attr.recv_cq) else {
        return Err(EINVAL);
    };

    // The ring is kernel memory the user sizes: bounded by what the QP can
    // use before anything is allocated (and by one block of the page
    // allocator, which `DmaPages` refuses beyond).
    if u64::from(cmd.rq_ring_size) > max_rq_ring_size(&attr.cap) {
        dev_dbg!(
            dev.core.dev(),
            "receive ring of {} bytes for {} WRs of {} SGEs\n",
            cmd.rq_ring_size,
            attr.cap.max_recv_wr,
            attr.cap.max_recv_sge
        );
        return Err(EINVAL);
    }
    let rq_size = page_align(cmd.rq_ring_size.into()).ok_or(EINVAL)?;
    let rq_ring = if rq_size > 0 {
        Some(DmaPages::new(
            dev.core.dev().as_ref(),
            rq_size as usize,
            DmaDirection::ToDevice,
        )?)
    } else {
        None
    };
    let slot = RecordSlot::new(rq_ring.clone())?;
    let mut cmd_flags = 0u8;
    CreateQpCmd::UNSOLICITED_WRITE_RECV.set(
        &mut cmd_flags,
        (flags & EFA_CREATE_QP_WITH_UNSOLICITED_WRITE_RECV != 0).into(),
    );
    CreateQpCmd::SQ_64_BIT_REQ_ID.set(
        &mut cmd_flags,
        (flags & EFA_CREATE_QP_WITH_SQ_64_BIT_REQ_ID != 0).into(),
    );
    let (pdn, uar) = (pd.data().pdn, ctx.data().uar);
    let (send_cq_idx, recv_cq_idx) = (send_cq.data().cq_idx, recv_cq.data().cq_idx);
    let created = dev.core.create_qp(
        &CreateQpCmd {
            pd: pdn,
            qp_type: qp_type.raw(),
            flags: cmd_flags,
            sq_base_addr: 0,
            rq_base_addr: rq_ring.as_ref().map_or(0, |r| r.dma_addr()),
            send_cq_idx: send_cq_idx.into(),
            recv_cq_idx: recv_cq_idx.into(),
            sq_l_key: 0,
            rq_l_key: 0,
            qp_alloc_size: QpAllocSize {
                send_queue_ring_size: cmd.sq_ring_size,
                send_queue_depth: attr.cap.max_send_wr,
                recv_queue_ring_size: cmd.rq_ring_size,
                recv_queue_depth: attr.cap.max_recv_wr,
            },
            uar,
            sl: cmd.sl,
            reserved: 0,
            reserved2: 0,
        },
        rq_ring.clone(),
    )?;
    // From here on the device may read the receive ring, which the QP's
    // record keeps until the device destroyed the QP; the QP holds its
    // PD, CQs and UAR on the device. Failures release the QP.
    let qp_id = dev.core.record(
        slot,
        ObjectId::Qp(created.qp_handle),
        &[
            ObjectId::Pd(pdn),
            ObjectId::Cq(send_cq_idx),
            ObjectId::Cq(recv_cq_idx),
            ObjectId::Uar(uar),
        ],
    )?;
    let destroy = |e: Error| {
        dev.core.release(qp_id);
        e
    };

    // The sub-CQ indexes go to userspace, which indexes its sub-CQs with
    // them: a device answering past the CQs' sub-CQs fails the QP.
    let sub_cqs = [
        (send_cq.data().num_sub_cqs, created.send_sub_cq_idx),
        (recv_cq.data().num_sub_cqs, created.recv_sub_cq_idx),
    ];
    if let Some((_, bad)) = sub_cqs.iter().find(|(count, idx)| idx >= count) {
        dev_err_ratelimited!(
            dev.core.dev(),
            "QP {:#x}: sub-CQ index {} out of range\n",
            created.qp_handle,
            bad
        );
        return Err(destroy(EIO));
    }

    let sq_db = dev
        .device_pages(&dev.doorbell_bar, "send doorbell", created.sq_db_offset, 4)
        .map_err(destroy)?;
    dev.core
        .claim_pages(sq_db.phys(), 1, PageOwner::Doorbells(uar))
        .map_err(destroy)?;
    let sq_doorbell = mmaps
        .insert(Backing::IoUncached(sq_db), PAGE_SIZE)
        .map_err(destroy)?;
    let llq_len = page_align(
        u64::from(cmd.sq_ring_size) + u64::from(in_page(created.llq_descriptors_offset)),
    )
    .ok_or(EINVAL)
    .map_err(destroy)?;
    let llq_page = dev
        .device_pages(
            &dev.llq_bar,
            "send queue",
            created.llq_descriptors_offset,
            cmd.sq_ring_size.into(),
        )
        .map_err(destroy)?;
    dev.core
        .claim_pages(
            llq_page.phys(),
            (llq_page.len() / PAGE_SIZE) as u64,
            PageOwner::SendQueue(created.qp_handle),
        )
        .map_err(destroy)?;
    // The mapping of the send queue holds the QP on the device until the
    // last mapping made with it is gone (see the module's documentation).
    let llq = mmaps
        .insert_with_private(Backing::IoWriteCombining(llq_page), llq_len as usize, qp_id)
        .map_err(destroy)?;
    dev.core.hold(qp_id);
    let rq = match &rq_ring {
        Some(ring) => {
            let rq_db = dev
                .device_pages(
                    &dev.doorbell_bar,
                    "receive doorbell",
                    created.rq_db_offset,
                    4,
                )
                .map_err(destroy)?;
            dev.core
                .claim_pages(rq_db.phys(), 1, PageOwner::Doorbells(uar))
                .map_err(destroy)?;
            let doorbell = mmaps
                .insert(Backing::IoUncached(rq_db), PAGE_SIZE)
                .map_err(destroy)?;
            let ring_mapping = mmaps
                .insert(Backing::Pages(ring.clone()), ring.size())
                .map_err(destroy)?;
            Some((ring_mapping, doorbell))
        }
        None => None,
    };
    let resp = efa_ibv_create_qp_resp {
        comp_mask: 0,
        rq_db_offset: if rq.is_some() {
            in_page(created.rq_db_offset)
        } else {
            created.rq_db_offset
        },
        sq_db_offset: in_page(created.sq_db_offset),
        llq_desc_offset: in_page(created.llq_descriptors_offset),
        rq_mmap_key: rq.map_or(0, |(ring, _)| ring),
        rq_mmap_size: rq_ring.as_ref().map_or(0, |r| r.size() as u64),
        rq_db_mmap_key: rq.map_or(0, |(_, db)| db),
        sq_db_mmap_key: sq_doorbell,
        llq_desc_mmap_key: llq,
        send_sub_cq_idx: created.send_sub_cq_idx,
        recv_sub_cq_idx: created.recv_sub_cq_idx,
        reserved_1e0: [0; 4],
    };
    // The layer withdraws the cookies if this fails.
    udata.respond(&Uapi(resp)).map_err(destroy)?;
    let cap = attr.cap;
    Ok((
        created.qp_num.into(),
        pin_init!(QpData {
            qp_handle: created.qp_handle,
            cap,
            state <- new_mutex!(QpState::Reset, "refa_qp_state"),
        }),
    ))
}

/// A user's destroy of a QP whose send queue userspace may still map, which
/// would keep the QP on the device: the QP is charged to the destroying
/// task's rdma cgroup for as long as it is kept, or the destroy is refused
/// (`EBUSY`) when the cgroup is at its limit, so that the QPs a cgroup has
/// live and kept never number more than `rdma.max` allows. The efa
/// provider unmaps a QP's queues before it destroys it: only a process
/// that keeps its mappings on purpose ever pays this.
fn may_destroy_qp(dev: &Device<RdmaDriver>, data: &VerbsData<'_>, qp: &Qp<QpData>) -> Result {
    let id = ObjectId::Qp(qp.data().qp_handle);
    match HcaCharge::try_new(dev) {
        Ok(charge) => {
            // Dropped at once by `destroy_qp` if no mapping keeps the QP.
            data.core.charge_kept(id, charge);
            Ok(())
        }
        Err(_) => {
            // At the limit: the destroy goes on only if nothing keeps the
            // QP. Withdrawn first, the cookies can make no new mapping
            // after the check (a refused QP keeps the mappings it has and
            // loses its cookies, which rdma-core never uses again).
            qp.withdraw_mappings();
            if data.core.holders(id) > 1 {
                Err(EBUSY)
            } else {
                Ok(())
            }
        }
    }
}

fn destroy_qp(dev: &VerbsData<'_>, qp: &Qp<QpData>) {
    let data = qp.data();
    // Withdrawing the cookies now, rather than after this returns, frees
    // the entries nobody maps: a send queue nobody maps any more lets go of
    // the QP here.
    qp.withdraw_mappings();
    let id = ObjectId::Qp(data.qp_handle);
    if dev.core.holders(id) > 1 {
        // Userspace kept a mapping of the send queue: the QP stays on the
        // device until it is unmapped, so that no other QP gets its pages.
        // Nothing may run on it meanwhile.
        stop(dev, &data);
    }
    dev.core.release(id);
}

/// Moves a QP that outlives its verbs object to the error state, in which
/// the device processes nothing it is given. A QP in RESET processes
/// nothing either.
fn stop(dev: &VerbsData<'_>, data: &QpData) {
    let state = data.state.lock();
    if *state == QpState::Reset || *state == QpState::Error {
        return;
    }
    let mut cmd = ModifyQpCmd {
        modify_mask: 0,
        qp_handle: data.qp_handle,
        qp_state: QpState::Error as u32,
        cur_qp_state: *state as u32,
        qkey: 0,
        sq_psn: 0,
        sq_drained_async_notify: 0,
        rnr_retry: 0,
        reserved2: 0,
    };
    ModifyQpCmd::QP_STATE.set(&mut cmd.modify_mask, 1);
    ModifyQpCmd::CUR_QP_STATE.set(&mut cmd.modify_mask, 1);
    if let Err(e) = dev.core.modify_qp(&cmd) {
        dev_warn_ratelimited!(
            dev.core.dev(),
            "QP {:#x} outlives its verbs object and could not be stopped: {}\n",
            data.qp_handle,
            e.to_errno()
        );
    }
}

/// The attributes an SRD transition from `cur` to `next` requires and
/// allows besides the state (the C driver's table); `None` if the
/// transition is illegal.
fn srd_transition(cur: QpState, next: QpState) -> Option<(u32, u32)> {
    use attr_mask::{CUR_STATE, EN_SQD_ASYNC_NOTIFY, PKEY_INDEX, PORT, QKEY, RNR_RETRY, SQ_PSN};
    use QpState::*;
    let any_to_reset_or_err = matches!(next, Reset | Error) && cur != Reset;
    if any_to_reset_or_err {
        return Some((0, 0));
    }
    match (cur, next) {
        (Reset, Reset) => Some((0, 0)),
        (Reset, Init) => Some((PKEY_INDEX | PORT | QKEY, 0)),
        (Init, Init) => Some((0, PKEY_INDEX | PORT | QKEY)),
        (Init, Rtr) => Some((0, PKEY_INDEX | QKEY)),
        (Rtr, Rts) => Some((SQ_PSN, CUR_STATE | QKEY | RNR_RETRY)),
        (Rts, Rts) | (Sqd, Rts) | (Sqe, Rts) => Some((0, CUR_STATE | QKEY)),
        (Rts, Sqd) => Some((0, EN_SQD_ASYNC_NOTIFY)),
        (Sqd, Sqd) => Some((0, PKEY_INDEX | QKEY)),
        _ => None,
    }
}

/// `efa_modify_srd_qp_is_ok()` of the C driver.
fn srd_modify_is_ok(cur: QpState, next: QpState, mask: u32) -> bool {
    if mask & attr_mask::CUR_STATE != 0
        && !matches!(
            cur,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    {
        return false;
    }
    let Some((required, optional)) = srd_transition(cur, next) else {
        return false;
    };
    mask & required == required && mask & !(required | optional | attr_mask::STATE) == 0
}

fn modify_qp(
    dev: &VerbsData<'_>,
    qp: &Qp<QpData>,
    attr: &QpAttr<'_>,
    mask: u32,
    udata: Option<&mut UData<'_>>,
) -> Result {
    if mask & !attr_mask::STANDARD_BITS != 0 {
        return Err(EOPNOTSUPP);
    }
    if let Some(udata) = udata {
        udata.require_no_request()?;
    }
    if mask & !MODIFY_SUPPORTED != 0 {
        dev_dbg!(
            dev.core.dev(),
            "QP attribute mask {:#x}, supported {:#x}\n",
            mask,
            MODIFY_SUPPORTED
        );
        return Err(EOPNOTSUPP);
    }
    let data = qp.data();
    let mut state = data.state.lock();
    let cur = if mask & attr_mask::CUR_STATE != 0 {
        QpState::from_raw(attr.cur_qp_state())?
    } else {
        *state
    };
    let next = if mask & attr_mask::STATE != 0 {
        QpState::from_raw(attr.qp_state())?
    } else {
        cur
    };
    let ok = match qp.qp_type() {
        QpType::Driver => srd_modify_is_ok(cur, next, mask),
        qp_type => ib_modify_qp_is_ok(cur, next, qp_type, mask),
    };
    if !ok {
        return Err(EINVAL);
    }
    if mask & attr_mask::PORT != 0 && attr.port_num() != PORT {
        return Err(EOPNOTSUPP);
    }
    if mask & attr_mask::PKEY_INDEX != 0 && attr.pkey_index() != 0 {
        return Err(EOPNOTSUPP);
    }

    let mut cmd = ModifyQpCmd {
        modify_mask: 0,
        qp_handle: data.qp_handle,
        qp_state: 0,
        cur_qp_state: 0,
        qkey: 0,
        sq_psn: 0,
        sq_drained_async_notify: 0,
        rnr_retry: 0,
        reserved2: 0,
    };
    if mask & attr_mask::STATE != 0 {
        ModifyQpCmd::QP_STATE.set(&mut cmd.modify_mask, 1);
        ModifyQpCmd::CUR_QP_STATE.set(&mut cmd.modify_mask, 1);
        cmd.cur_qp_state = cur as u32;
        cmd.qp_state = next as u32;
    }
    if mask & attr_mask::EN_SQD_ASYNC_NOTIFY != 0 {
        ModifyQpCmd::SQ_DRAINED_ASYNC_NOTIFY.set(&mut cmd.modify_mask, 1);
        cmd.sq_drained_async_notify = attr.en_sqd_async_notify();
    }
    if mask & attr_mask::QKEY != 0 {
        ModifyQpCmd::QKEY.set(&mut cmd.modify_mask, 1);
        cmd.qkey = attr.qkey();
    }
    if mask & attr_mask::SQ_PSN != 0 {
        ModifyQpCmd::SQ_PSN.set(&mut cmd.modify_mask, 1);
        cmd.sq_psn = attr.sq_psn();
    }
    if mask & attr_mask::RNR_RETRY != 0 {
        ModifyQpCmd::RNR_RETRY.set(&mut cmd.modify_mask, 1);
        cmd.rnr_retry = attr.rnr_retry();
    }
    dev.core.modify_qp(&cmd)?;
    *state = next;
    Ok(())
}

fn query_qp(dev: &VerbsData<'_>, qp: &Qp<QpData>, mask: u32) -> Result<QpQuery> {
    if mask & !QUERY_SUPPORTED != 0 {
        dev_dbg!(
            dev.core.dev(),
            "QP query mask {:#x}, supported {:#x}\n",
            mask,
            QUERY_SUPPORTED
        );
        return Err(EOPNOTSUPP);
    }
    let data = qp.data();
    let resp = dev.core.query_qp(data.qp_handle)?;
    Ok(QpQuery {
        state: QpState::from_raw(resp.qp_state).map_err(|_| EIO)?,
        qkey: resp.qkey,
        sq_psn: resp.sq_psn,
        sq_draining: resp.sq_draining != 0,
        rnr_retry: resp.rnr_retry,
        port_num: PORT,
        cap: data.cap,
    })
}

#[kunit_tests(refa_ib_qp)]
mod tests {
    use super::*;
    use attr_mask::{CUR_STATE, PKEY_INDEX, PORT, QKEY, SQ_PSN, STATE};
    use QpState::*;

    #[test]
    fn srd_state_machine_is_the_c_drivers() {
        assert!(srd_modify_is_ok(
            Reset,
            Init,
            STATE | PKEY_INDEX | PORT | QKEY
        ));
        // Required attributes missing, or ones the transition does not take.
        assert!(!srd_modify_is_ok(Reset, Init, STATE | QKEY));
        assert!(!srd_modify_is_ok(
            Reset,
            Init,
            STATE | PKEY_INDEX | PORT | QKEY | SQ_PSN
        ));
        assert!(srd_modify_is_ok(Init, Rtr, STATE));
        assert!(srd_modify_is_ok(Rtr, Rts, STATE | SQ_PSN));
        assert!(!srd_modify_is_ok(Rtr, Rts, STATE));
        assert!(srd_modify_is_ok(Rts, Error, STATE));
        assert!(srd_modify_is_ok(Error, Reset, STATE));
        // Illegal transitions.
        assert!(!srd_modify_is_ok(Reset, Rts, STATE | SQ_PSN));
        assert!(!srd_modify_is_ok(Reset, Error, STATE));
        assert!(!srd_modify_is_ok(Init, Rts, STATE | SQ_PSN));
        // A current state only where the table allows naming it.
        assert!(!srd_modify_is_ok(Init, Init, STATE | CUR_STATE));
        assert!(srd_modify_is_ok(Rts, Rts, STATE | CUR_STATE));
    }

    #[test]
    fn qp_types_map_to_the_device() {
        assert_eq!(device_qp_type(QpType::Ud, 7), Ok(HwQpType::Ud));
        assert_eq!(
            device_qp_type(QpType::Driver, EFA_QP_DRIVER_TYPE_SRD),
            Ok(HwQpType::Srd)
        );
        assert_eq!(device_qp_type(QpType::Driver, 1), Err(EOPNOTSUPP));
        assert_eq!(device_qp_type(QpType::Other(2), 0), Err(EOPNOTSUPP));
    }
}
