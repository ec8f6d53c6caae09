// SPDX-License-Identifier: GPL-2.0

//! The RDMA device: what the verbs see of an EFA device.
//!
//! Registered as `refa_%d` with driver id `RDMA_DRIVER_EFA` and the uAPI of
//! `efa-abi.h`, so that rdma-core's `efa` provider drives it. One port, no
//! standard link layer, and none of the kernel-only verbs (`post_send`,
//! `poll_cq`, ...): the RDMA core then does not offer the device to kernel
//! ULPs (`kverbs_provider` stays off), as for the C driver.

mod comp_cntr;
mod objects;
mod qp;

pub(crate) use self::qp::BarWindow;
use self::{
    comp_cntr::CompCntrData,
    objects::{
        AhData,
        MrData, //
    },
    qp::QpData, //
};
use crate::{
    dev::{
        features::DeviceAttrs,
        lifetime::{
            ObjectId,
            PageOwner,
            RecordSlot, //
        },
        Core, //
    },
    hw::{
        admin::{
            CreateCqCmd,
            DeviceAttr as HwDeviceAttr,
            GetStatsType,
            MemAddr,
            QueueAttr1,
            RdmaWriteStats, //
        },
        io::{
            CDESC_EX_SIZE,
            CDESC_SIZE, //
        },
        wire::Wire, //
    },
    kernel_gaps::ratelimit::dev_ratelimited,
    rdma::{
        ah::{
            Ah,
            AhAttr, //
        },
        comp_cntr::{
            CompCntrAttrs,
            CompCntrCaps,
            CompCntrEntry,
            CompCntrModifyOp,
            QpCounterOps, //
        },
        cq::{
            Cq,
            CqBuffer,
            CqEvents,
            CqInitAttr, //
        },
        device::{
            DriverId,
            Operations,
            RegData, //
        },
        efa_abi::*,
        mmap::{
            Backing,
            DmaDirection,
            DmaPages,
            MmapEntry, //
        },
        mr::{
            mr_query_method,
            DmabufMrRequest,
            MrInterconnects,
            MrKeys,
            MrRequest, //
        },
        pd::Pd,
        qp::{
            Qp,
            QpAttr,
            QpInitAttr,
            QpQuery, //
        },
        stats::{
            hw_counters,
            HwCounters,
            HwStatsValues,
            StatsScope, //
        },
        ucontext::UContext,
        udata::UData,
        umem::Umem,
        verbs::{
            DeviceAttr,
            Gid,
            LinkLayer,
            Mtu,
            PhysState,
            PortAttr,
            PortImmutable,
            PortState,
            Speed,
            Width, //
        }, //
    }, //
};
use kernel::{
    page::{
        PAGE_MASK,
        PAGE_SIZE, //
    },
    prelude::*,
    sync::atomic::{
        ordering::Relaxed,
        Atomic, //
    },
    sync::Arc, //
};

/// The one port.
const PORT: u32 = 1;
/// GID and P_Key tables have one entry each.
const TABLE_LEN: u16 = 1;
/// The one P_Key: the default, full-membership one.
const DEFAULT_PKEY: u16 = 0xffff;

/// The RDMA device operations of refa.
pub(crate) struct RefaIb;

mr_query_method!(RefaIb);

/// What the operations know of the device.
pub(crate) struct IbDevice<'a> {
    core: Arc<Core<'a>>,
    attrs: DeviceAttrs,
    /// The completion event queues, by completion vector.
    eqns: KVec<u16>,
    /// The CQs the event queues' interrupt handlers deliver events to.
    cq_events: Arc<CqEvents>,
    vendor_id: u16,
    device_id: u16,
    subsystem_device_id: u16,
    /// The BAR with the doorbell pages.
    doorbell_bar: BarWindow,
    /// The BAR with the send queues (LLQs).
    llq_bar: BarWindow,
    errors: VerbErrors,
}

/// Failed verbs, by kind, for the device's statistics.
struct VerbErrors {
    alloc_ucontext: Atomic<u64>,
    alloc_pd: Atomic<u64>,
    create_cq: Atomic<u64>,
    create_qp: Atomic<u64>,
    reg_mr: Atomic<u64>,
    create_ah: Atomic<u64>,
    mmap: Atomic<u64>,
}

impl VerbErrors {
    const fn new() -> Self {
        Self {
            alloc_ucontext: Atomic::new(0),
            alloc_pd: Atomic::new(0),
            create_cq: Atomic::new(0),
            create_qp: Atomic::new(0),
            reg_mr: Atomic::new(0),
            create_ah: Atomic::new(0),
            mmap: Atomic::new(0),
        }
    }
}

/// Counts a failure of a verb in `counter`.
fn counted<T>(counter: &Atomic<u64>, result: Result<T>) -> Result<T> {
    if result.is_err() {
        counter.add(1, Relaxed);
    }
    result
}

// The names the C driver gives the same counters, so that tools see the
// same statistics under either driver.
hw_counters!(
    DEVICE_COUNTERS = [
        c"submitted_cmds",
        c"completed_cmds",
        c"cmds_err",
        c"no_completion_cmds",
        c"keep_alive_rcvd",
        c"alloc_pd_err",
        c"create_qp_err",
        c"create_cq_err",
        c"reg_mr_err",
        c"alloc_ucontext_err",
        c"create_ah_err",
        c"mmap_err",
    ]
);

hw_counters!(
    PORT_COUNTERS = [
        c"tx_bytes",
        c"tx_pkts",
        c"rx_bytes",
        c"rx_pkts",
        c"rx_drops",
        c"send_bytes",
        c"send_wrs",
        c"recv_bytes",
        c"recv_wrs",
        c"rdma_read_wrs",
        c"rdma_read_bytes",
        c"rdma_read_wr_err",
        c"rdma_read_resp_bytes",
        c"rdma_write_wrs",
        c"rdma_write_bytes",
        c"rdma_write_wr_err",
        c"rdma_write_recv_bytes",
        c"retrans_bytes",
        c"retrans_pkts",
        c"retrans_timeout_events",
        c"unresponsive_remote_events",
        c"impaired_remote_conn_events",
    ]
);

impl IbDevice<'_> {
    /// The values of [`DEVICE_COUNTERS`], in order.
    fn device_counters(&self) -> [u64; DEVICE_COUNTERS.len()] {
        let admin = self.core.admin().counters();
        let e = &self.errors;
        [
            admin.submitted.load(Relaxed),
            admin.completed.load(Relaxed),
            admin.failed.load(Relaxed),
            admin.no_completion.load(Relaxed),
            self.core.watchdog().keep_alives_received(),
            e.alloc_pd.load(Relaxed),
            e.create_qp.load(Relaxed),
            e.create_cq.load(Relaxed),
            e.reg_mr.load(Relaxed),
            e.alloc_ucontext.load(Relaxed),
            e.create_ah.load(Relaxed),
            e.mmap.load(Relaxed),
        ]
    }

    /// The values of [`PORT_COUNTERS`], in order, from the device. Sets
    /// the device does not have (RDMA write without the capability) read
    /// as zero.
    fn port_counters(&self) -> Result<[u64; PORT_COUNTERS.len()]> {
        let basic = self.core.get_stats(GetStatsType::Basic)?.basic_stats();
        let msgs = self
            .core
            .get_stats(GetStatsType::Messages)?
            .messages_stats();
        let read = self
            .core
            .get_stats(GetStatsType::RdmaRead)?
            .rdma_read_stats();
        let write = if self.attrs.has_cap(HwDeviceAttr::RDMA_WRITE) {
            self.core
                .get_stats(GetStatsType::RdmaWrite)?
                .rdma_write_stats()
        } else {
            RdmaWriteStats::ZERO
        };
        let net = self.core.get_stats(GetStatsType::Network)?.network_stats();
        Ok([
            basic.tx_bytes,
            basic.tx_pkts,
            basic.rx_bytes,
            basic.rx_pkts,
            basic.rx_drops,
            msgs.send_bytes,
            msgs.send_wrs,
            msgs.recv_bytes,
            msgs.recv_wrs,
            read.read_wrs,
            read.read_bytes,
            read.read_wr_err,
            read.read_resp_bytes,
            write.write_wrs,
            write.write_bytes,
            write.write_wr_err,
            write.write_recv_bytes,
            net.retrans_bytes,
            net.retrans_pkts,
            net.retrans_timeout_events,
            net.unresponsive_remote_events,
            net.impaired_remote_conn_events,
        ])
    }
}

impl<'a> IbDevice<'a> {
    /// The device behind `core`, with `attrs`, the event queues `eqns`
    /// (one per completion vector) that deliver events to `cq_events`, its
    /// doorbell BAR and its LLQ BAR.
    pub(crate) fn new(
        core: Arc<Core<'a>>,
        attrs: DeviceAttrs,
        eqns: KVec<u16>,
        cq_events: Arc<CqEvents>,
        doorbell_bar: BarWindow,
        llq_bar: BarWindow,
    ) -> Self {
        let pdev = core.dev();
        Self {
            doorbell_bar,
            llq_bar,
            errors: VerbErrors::new(),
            vendor_id: pdev.vendor_id().as_raw(),
            device_id: pdev.device_id(),
            subsystem_device_id: pdev.subsystem_device_id(),
            core,
            attrs,
            eqns,
            cq_events,
        }
    }

    /// The number of completion event queues.
    fn eqs(&self) -> u32 {
        self.eqns.len() as u32
    }
}

/// The `efa-abi.h` capabilities of a device with `attrs` and `eqs` event
/// queues, as the C driver derives them.
fn user_device_caps(attrs: &DeviceAttrs, eqs: u32) -> u32 {
    let caps = [
        (HwDeviceAttr::RDMA_READ, EFA_QUERY_DEVICE_CAPS_RDMA_READ),
        (HwDeviceAttr::RNR_RETRY, EFA_QUERY_DEVICE_CAPS_RNR_RETRY),
        (
            HwDeviceAttr::DATA_POLLING_128,
            EFA_QUERY_DEVICE_CAPS_DATA_POLLING_128,
        ),
        (HwDeviceAttr::RDMA_WRITE, EFA_QUERY_DEVICE_CAPS_RDMA_WRITE),
        (
            HwDeviceAttr::UNSOLICITED_WRITE_RECV,
            EFA_QUERY_DEVICE_CAPS_UNSOLICITED_WRITE_RECV,
        ),
        (
            HwDeviceAttr::SQ_64_BIT_REQ_ID,
            EFA_QUERY_DEVICE_CAPS_SQ_64_BIT_REQ_ID,
        ),
    ];
    // Every EFA device can fill in source GIDs and use CQ rings in memory
    // userspace provides.
    let mut user = EFA_QUERY_DEVICE_CAPS_CQ_WITH_SGID | EFA_QUERY_DEVICE_CAPS_CQ_WITH_EXT_MEM;
    for (device, uapi) in caps {
        if attrs.has_cap(device) {
            user |= uapi;
        }
    }
    if comp_cntr::caps(attrs).is_some() {
        user |= EFA_QUERY_DEVICE_CAPS_COMP_CNTR;
    }
    if eqs > 0 {
        user |= EFA_QUERY_DEVICE_CAPS_CQ_NOTIFICATIONS;
    }
    user
}

/// Refuses userspace that cannot honour a limit the device sets (a transmit
/// batch size, a minimum send queue size), given the capabilities it
/// announces. Unknown capability bits are fine: they say what userspace can
/// do, not what it asks for.
fn check_user_caps(queues: &QueueAttr1, supported_caps: u32) -> Result {
    let needs = [
        (
            queues.max_tx_batch != 0,
            EFA_ALLOC_UCONTEXT_CMD_SUPP_CAPS_TX_BATCH,
        ),
        (
            queues.min_sq_depth != 0,
            EFA_ALLOC_UCONTEXT_CMD_SUPP_CAPS_MIN_SQ_WR,
        ),
    ];
    if needs
        .iter()
        .any(|&(needed, cap)| needed && supported_caps & cap == 0)
    {
        return Err(EOPNOTSUPP);
    }
    Ok(())
}

/// Lane speed and width for a link of `gbps` Gbit/s, as the C driver
/// reports them.
pub(crate) fn link_speed_and_width(gbps: u16) -> (Speed, Width) {
    match gbps {
        1600.. => (Speed::Xdr, Width::X8),
        800.. => (Speed::Ndr, Width::X8),
        400.. => (Speed::Hdr, Width::X8),
        200.. => (Speed::Hdr, Width::X4),
        120.. => (Speed::Fdr10, Width::X12),
        100.. => (Speed::Edr, Width::X4),
        60.. => (Speed::Ddr, Width::X12),
        50.. => (Speed::Hdr, Width::X1),
        40.. => (Speed::Fdr10, Width::X4),
        30.. => (Speed::Sdr, Width::X12),
        _ => (Speed::Edr, Width::X1),
    }
}

/// The deepest CQ a user can create on a device with `attrs`: the
/// device's limit, unless a ring of the largest entries (the efa provider
/// asks for them when it wants source GIDs or 64-bit request ids) in all
/// sub-CQs would not fit the largest block of kernel pages, `max_ring`
/// bytes, or CREATE_CQ's 16-bit depth. (The C driver reports the device's
/// limit, and the page allocator WARNs when a user asks for it.)
fn max_cqe(attrs: &DeviceAttrs, max_ring: usize) -> u32 {
    let per_entry = CDESC_EX_SIZE * usize::from(attrs.queues.sub_cqs_per_cq.max(1));
    let fits = u32::try_from(max_ring / per_entry).unwrap_or(u32::MAX);
    attrs.queues.max_cq_depth.min(fits).min(u16::MAX.into())
}

fn saturate_u16(value: u32) -> u16 {
    value.try_into().unwrap_or(u16::MAX)
}

/// The driver's part of a user context: its doorbell page (UAR), held
/// in the device's records (see [`crate::dev::lifetime`]).
pub(crate) struct UContextData {
    uar: u16,
}

/// The driver's part of a protection domain, held in the device's records.
pub(crate) struct PdData {
    pdn: u16,
}

/// The driver's part of a completion queue, held in the device's records,
/// which keep its ring for as long as the device has the CQ. Dropping it
/// withdraws the mappings from the user context.
pub(crate) struct CqData {
    cq_idx: u16,
    /// Sub-CQs in the ring.
    num_sub_cqs: u16,
    /// Whether the device sends completion events for the CQ.
    events: bool,
    /// The ring's mapping, for a ring in kernel pages.
    _ring_mapping: Option<MmapEntry>,
    _doorbell_mapping: MmapEntry,
}

/// Where a CQ's ring lives.
#[derive(Clone)]
enum CqRing {
    /// Kernel pages userspace maps.
    Kernel(Arc<DmaPages>),
    /// Memory userspace passed at creation, pinned while the CQ exists.
    User { _pinned: Arc<Umem> },
}

/// The end of the first version of `efa_ibv_create_cq`: userspace that
/// sends less is refused.
const CREATE_CQ_MIN_LEN: usize =
    core::mem::offset_of!(efa_ibv_create_cq, num_sub_cqs) + core::mem::size_of::<u16>();

/// What a CQ creation request asks of the device, checked against it.
#[derive(Debug, PartialEq, Eq)]
struct CqRequest {
    entry_size: u32,
    source_gid: bool,
    req_id_64: bool,
    /// Completion events through an event queue.
    events: bool,
}

/// Checks a CQ creation request against what a device with `eqs` event
/// queues can do. The C driver ignores unknown flags, accepts 64-bit
/// request ids from any device and completion channels without event
/// queues; all are refused here.
fn check_cq_request(cmd: &efa_ibv_create_cq, attrs: &DeviceAttrs, eqs: u32) -> Result<CqRequest> {
    let known = EFA_CREATE_CQ_WITH_COMPLETION_CHANNEL
        | EFA_CREATE_CQ_WITH_SGID
        | EFA_CREATE_CQ_WITH_SQ_COMP_64_BIT_REQ_ID;
    let flags = u32::from(cmd.flags);
    if flags & !known != 0 || cmd.reserved_58 != [0; 5] {
        return Err(EINVAL);
    }
    let events = flags & EFA_CREATE_CQ_WITH_COMPLETION_CHANNEL != 0;
    if events && eqs == 0 {
        return Err(EOPNOTSUPP);
    }
    let req_id_64 = flags & EFA_CREATE_CQ_WITH_SQ_COMP_64_BIT_REQ_ID != 0;
    if req_id_64 && !attrs.has_cap(HwDeviceAttr::SQ_64_BIT_REQ_ID) {
        return Err(EOPNOTSUPP);
    }
    let source_gid = flags & EFA_CREATE_CQ_WITH_SGID != 0;
    // Source GIDs need the extended entry.
    match cmd.cq_entry_size as usize {
        CDESC_EX_SIZE => (),
        CDESC_SIZE if !source_gid => (),
        _ => return Err(EINVAL),
    }
    if cmd.num_sub_cqs != attrs.queues.sub_cqs_per_cq {
        return Err(EINVAL);
    }
    Ok(CqRequest {
        entry_size: cmd.cq_entry_size,
        source_gid,
        req_id_64,
        events,
    })
}

/// The event queue for a CQ's completion events on `comp_vector`, as
/// CREATE_CQ names it: the device has one EQ per completion vector, in
/// order (as the C driver spreads CQs by the vector userspace chose); a CQ
/// without events names none (0). The core checked the vector against the
/// number of vectors it was told, which is `eqns.len()` when there are
/// EQs, so `EINVAL` is a defence only.
fn cq_eqn(eqns: &[u16], events: bool, comp_vector: u32) -> Result<u16> {
    if !events {
        return Ok(0);
    }
    let index = usize::try_from(comp_vector).map_err(|_| EINVAL)?;
    eqns.get(index).copied().ok_or(EINVAL)
}

impl RefaIb {
    fn new_ucontext<'a>(
        dev: &IbDevice<'a>,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<UContextData, Error>> {
        // Every field of the request is optional: old userspace sends none.
        let cmd: efa_ibv_alloc_ucontext_cmd = udata.read(0)?;
        if cmd.reserved_20 != [0; 4] {
            return Err(EINVAL);
        }
        check_user_caps(&dev.attrs.queues, cmd.supported_caps).inspect_err(|_| {
            dev_dbg!(
                dev.core.dev(),
                "userspace capabilities {:#x} lack what the device needs\n",
                cmd.supported_caps
            )
        })?;

        let slot = RecordSlot::new::<()>(None)?;
        let uar = dev.core.alloc_uar()?;
        dev.core.record(slot, ObjectId::Uar(uar), &[])?;
        let a = &dev.attrs;
        let q = &a.queues;
        let resp = efa_ibv_alloc_ucontext_resp {
            comp_mask: 0,
            cmds_supp_udata_mask: EFA_USER_CMDS_SUPP_UDATA_QUERY_DEVICE
                | EFA_USER_CMDS_SUPP_UDATA_CREATE_AH,
            sub_cqs_per_cq: q.sub_cqs_per_cq,
            inline_buf_size: saturate_u16(q.inline_buf_size),
            max_llq_size: q.max_llq_size,
            max_tx_batch: q.max_tx_batch,
            min_sq_wr: q.min_sq_depth,
            inline_buf_size_ex: saturate_u16(a.inline_buf_size_ex()),
            reserved_b0: [0; 2],
        };
        if let Err(e) = udata.respond(&resp) {
            dev.core.release(ObjectId::Uar(uar));
            return Err(e);
        }
        Ok(try_init!(UContextData { uar }? Error))
    }

    fn new_pd<'a>(
        dev: &IbDevice<'a>,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<PdData, Error>> {
        udata.require_no_request()?;
        let slot = RecordSlot::new::<()>(None)?;
        let pdn = dev.core.alloc_pd()?;
        dev.core.record(slot, ObjectId::Pd(pdn), &[])?;
        let resp = efa_ibv_alloc_pd_resp {
            comp_mask: 0,
            pdn,
            reserved_30: [0; 2],
        };
        if let Err(e) = udata.respond(&resp) {
            dev.core.release(ObjectId::Pd(pdn));
            return Err(e);
        }
        Ok(try_init!(PdData { pdn }? Error))
    }

    fn new_cq<'a>(
        dev: &IbDevice<'a>,
        ctx: &UContext<RefaIb>,
        attr: &CqInitAttr,
        buffer: &CqBuffer<'_>,
        udata: &mut UData<'_>,
    ) -> Result<(u32, impl PinInit<CqData, Error>)> {
        if attr.flags != 0 {
            return Err(EOPNOTSUPP);
        }
        if attr.cqe == 0 || attr.cqe > dev.attrs.queues.max_cq_depth {
            return Err(EINVAL);
        }
        let cmd: efa_ibv_create_cq = udata.read(CREATE_CQ_MIN_LEN)?;
        udata.check_comp_mask(cmd.comp_mask.into(), 0)?;
        let req = check_cq_request(&cmd, &dev.attrs, dev.eqs())?;
        let depth = u16::try_from(attr.cqe).map_err(|_| EINVAL)?;

        let size = (req.entry_size as usize)
            .checked_mul(attr.cqe as usize)
            .and_then(|n| n.checked_mul(cmd.num_sub_cqs.into()))
            .ok_or(EINVAL)?;
        // The device writes the ring as one block: memory userspace passed
        // must be contiguous for it, and cover whole pages as a ring in
        // kernel pages does (the C driver's rules too, so that userspace
        // refa accepts works with efa.ko).
        let whole_pages = size.checked_next_multiple_of(PAGE_SIZE).ok_or(EINVAL)?;
        let (ring, ring_dma) = match buffer.pin(whole_pages)? {
            Some(mut umem) => {
                let dma = umem.contiguous_dma_address().ok_or(EINVAL)?;
                (
                    CqRing::User {
                        _pinned: Arc::new(umem, GFP_KERNEL)?,
                    },
                    dma,
                )
            }
            None => {
                // One block of the page allocator: a size past the largest
                // is `EINVAL`, whatever depth the device allows (see
                // `max_cqe()`, which query_device reports).
                let pages = DmaPages::new(dev.core.dev().as_ref(), size, DmaDirection::FromDevice)?;
                let dma = pages.dma_addr();
                (CqRing::Kernel(pages), dma)
            }
        };

        let eqn = cq_eqn(&dev.eqns, req.events, attr.comp_vector)?;
        let slot = RecordSlot::new(Some(ring.clone()))?;
        let mut caps_1 = 0u8;
        CreateCqCmd::INTERRUPT_MODE_ENABLED.set(&mut caps_1, req.events.into());
        let mut caps_2 = 0u8;
        CreateCqCmd::CQ_ENTRY_SIZE_WORDS.set(&mut caps_2, (req.entry_size / 4) as u8);
        CreateCqCmd::SET_SRC_ADDR.set(&mut caps_2, req.source_gid.into());
        CreateCqCmd::SQ_COMP_64_BIT_REQ_ID.set(&mut caps_2, req.req_id_64.into());
        let created = dev.core.create_cq(&CreateCqCmd {
            cq_caps_1: caps_1,
            cq_caps_2: caps_2,
            sub_cq_depth: depth,
            eqn,
            reserved: 0,
            cq_ba: MemAddr::new(ring_dma),
            l_key: 0,
            num_sub_cqs: cmd.num_sub_cqs,
            uar: ctx.data().uar,
        })?;
        // From here on the device may write to the ring, which its record
        // keeps until the CQ is destroyed: failures destroy the CQ.
        let cq_id = dev.core.record(
            slot,
            ObjectId::Cq(created.cq_idx),
            &[ObjectId::Uar(ctx.data().uar)],
        )?;
        let destroy = |e: Error| {
            dev.core.release(cq_id);
            e
        };
        let (Some(db_offset), true) = (created.doorbell, created.depth == depth) else {
            dev_ratelimited!(
                dev_err,
                dev.core.dev(),
                "CQ {}: {} entries instead of {}, doorbell {:?}\n",
                created.cq_idx,
                created.depth,
                depth,
                created.doorbell
            );
            return Err(destroy(EIO));
        };
        // Userspace has the ring already when it passed the memory.
        let ring_mapping = match &ring {
            CqRing::Kernel(pages) => Some(
                MmapEntry::insert(ctx, Backing::Pages(pages.clone()), pages.size())
                    .map_err(destroy)?,
            ),
            CqRing::User { .. } => None,
        };
        // The device says where the doorbell is: it must be in the BAR
        // (else userspace would map whatever follows it).
        let db_page = dev.doorbell_bar.page_of(db_offset, 4).inspect_err(|_| {
            dev_ratelimited!(
                dev_err,
                dev.core.dev(),
                "CQ {}: doorbell offset {:#x} outside the doorbell BAR\n",
                created.cq_idx,
                db_offset
            )
        });
        let db_page = db_page.map_err(destroy)?;
        dev.core
            .claim_pages(db_page, 1, PageOwner::Doorbells(ctx.data().uar))
            .map_err(destroy)?;
        let doorbell_mapping =
            MmapEntry::insert(ctx, Backing::IoUncached(db_page), PAGE_SIZE).map_err(destroy)?;
        let resp = efa_ibv_create_cq_resp {
            comp_mask: EFA_CREATE_CQ_RESP_DB_OFF,
            reserved_20: [0; 4],
            q_mmap_key: ring_mapping.as_ref().map_or(0, |m| m.offset()),
            q_mmap_size: match &ring {
                CqRing::Kernel(pages) => pages.size() as u64,
                CqRing::User { .. } => 0,
            },
            cq_idx: created.cq_idx,
            reserved_d0: [0; 2],
            db_off: db_offset & !(PAGE_MASK as u32),
            db_mmap_key: doorbell_mapping.offset(),
        };
        if let Err(e) = udata.respond(&resp) {
            drop((ring_mapping, doorbell_mapping));
            return Err(destroy(e));
        }
        Ok((
            created.depth.into(),
            try_init!(CqData {
                cq_idx: created.cq_idx,
                num_sub_cqs: cmd.num_sub_cqs,
                events: req.events,
                _ring_mapping: ring_mapping,
                _doorbell_mapping: doorbell_mapping,
            }? Error),
        ))
    }
}

#[vtable]
impl Operations for RefaIb {
    type RegistrationData<'a> = IbDevice<'a>;
    type UContext = UContextData;
    type Pd = PdData;
    type Cq = CqData;
    type Ah = AhData;
    type Mr = MrData;
    type Qp = QpData;
    type CompCntr = CompCntrData;
    type MmapPrivate = ObjectId;

    const DRIVER_ID: DriverId = DriverId::Efa;
    const ABI_VERSION: u32 = EFA_UVERBS_ABI_VERSION;

    fn query_device<'a>(
        dev: &IbDevice<'a>,
        attr: &mut DeviceAttr,
        udata: &mut UData<'_>,
    ) -> Result {
        udata.require_no_request()?;
        let a = &dev.attrs;
        let q = &a.queues;
        let max_mr_size = u64::from(q.max_mr_pages).saturating_mul(PAGE_SIZE as u64);
        attr.set_max_mr_size(max_mr_size)
            .set_page_size_cap(a.device.page_size_cap)
            .set_vendor_id(dev.vendor_id.into())
            .set_vendor_part_id(dev.device_id.into())
            .set_hw_ver(dev.subsystem_device_id.into())
            .set_max_qp(q.max_qp)
            .set_max_cq(q.max_cq)
            .set_max_pd(q.max_pd)
            .set_max_mr(q.max_mr)
            .set_max_ah(q.max_ah)
            .set_max_cqe(max_cqe(a, DmaPages::max_size()))
            .set_max_qp_wr(q.max_sq_depth.min(q.max_rq_depth))
            .set_max_send_sge(q.max_wr_send_sges.into())
            .set_max_recv_sge(q.max_wr_recv_sges.into())
            .set_max_sge_rd(q.max_wr_rdma_sges.into())
            .set_max_pkeys(TABLE_LEN);

        udata.respond(&efa_ibv_ex_query_device_resp {
            comp_mask: 0,
            max_sq_wr: q.max_sq_depth,
            max_rq_wr: q.max_rq_depth,
            max_sq_sge: q.max_wr_send_sges,
            max_rq_sge: q.max_wr_recv_sges,
            max_rdma_size: a.device.max_rdma_size,
            device_caps: user_device_caps(&dev.attrs, dev.eqs()),
        })
    }

    fn query_port<'a>(dev: &IbDevice<'a>, port: u32, attr: &mut PortAttr) -> Result {
        if port != PORT {
            return Err(EINVAL);
        }
        let mtu = dev.attrs.network.mtu;
        // Below 256 bytes the core's own conversion says 256 too.
        let ib_mtu = Mtu::at_most(mtu).unwrap_or(Mtu::Mtu256);
        let (speed, width) = link_speed_and_width(dev.attrs.link_speed_gbps());
        attr.set_state(PortState::Active, PhysState::LinkUp)
            .set_mtu(ib_mtu, ib_mtu)
            .set_speed(speed, width)
            .set_max_msg_sz(mtu)
            .set_gid_tbl_len(TABLE_LEN.into())
            .set_pkey_tbl_len(TABLE_LEN)
            // What the C driver reports, so that userspace sees the same.
            .set_lmc(1)
            .set_max_vl_num(1);
        Ok(())
    }

    fn query_port_speed<'a>(dev: &IbDevice<'a>, port: u32) -> Result<u64> {
        if port != PORT {
            return Err(EINVAL);
        }
        // The link rate query_port reports, in the core's 100 Mb/s units.
        Ok(u64::from(dev.attrs.link_speed_gbps()) * 10)
    }

    fn get_port_immutable<'a>(_dev: &IbDevice<'a>, port: u32) -> Result<PortImmutable> {
        if port != PORT {
            return Err(EINVAL);
        }
        Ok(PortImmutable {
            pkey_tbl_len: TABLE_LEN,
            gid_tbl_len: TABLE_LEN,
            core_cap_flags: 0,
            max_mad_size: 0,
        })
    }

    fn get_link_layer<'a>(_dev: &IbDevice<'a>, _port: u32) -> LinkLayer {
        LinkLayer::Unspecified
    }

    fn query_gid<'a>(dev: &IbDevice<'a>, port: u32, index: u32) -> Result<Gid> {
        if port != PORT || index != 0 {
            return Err(EINVAL);
        }
        Ok(Gid(dev.attrs.network.addr))
    }

    fn query_pkey<'a>(_dev: &IbDevice<'a>, port: u32, index: u16) -> Result<u16> {
        if port != PORT || index != 0 {
            return Err(EINVAL);
        }
        Ok(DEFAULT_PKEY)
    }

    fn alloc_ucontext<'a>(
        dev: &RegData<'a, Self>,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<UContextData, Error>> {
        counted(&dev.errors.alloc_ucontext, Self::new_ucontext(dev, udata))
    }

    fn dealloc_ucontext<'a>(dev: &IbDevice<'a>, ctx: &UContext<Self>) {
        dev.core.release(ObjectId::Uar(ctx.data().uar));
    }

    fn alloc_pd<'a>(
        dev: &RegData<'a, Self>,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<PdData, Error>> {
        counted(&dev.errors.alloc_pd, Self::new_pd(dev, udata))
    }

    fn create_cq<'a>(
        dev: &RegData<'a, Self>,
        ctx: &UContext<Self>,
        attr: &CqInitAttr,
        buffer: &CqBuffer<'_>,
        udata: &mut UData<'_>,
    ) -> Result<(u32, impl PinInit<CqData, Error>)> {
        counted(
            &dev.errors.create_cq,
            Self::new_cq(dev, ctx, attr, buffer, udata),
        )
    }

    fn mmap_free<'a>(dev: &IbDevice<'a>, holder_of: ObjectId) {
        // The last mapping of a QP's send queue is gone.
        dev.core.release(holder_of);
    }

    fn mmap_failed<'a>(dev: &IbDevice<'a>, _err: Error) {
        dev.errors.mmap.add(1, Relaxed);
    }

    fn hw_counters(scope: StatsScope) -> Option<&'static HwCounters> {
        match scope {
            StatsScope::Device => Some(&DEVICE_COUNTERS),
            StatsScope::Port(PORT) => Some(&PORT_COUNTERS),
            StatsScope::Port(_) => None,
        }
    }

    fn get_hw_stats<'a>(
        dev: &IbDevice<'a>,
        scope: StatsScope,
        values: &mut HwStatsValues<'_>,
    ) -> Result<usize> {
        let filled: &[u64] = match scope {
            StatsScope::Device => &dev.device_counters(),
            StatsScope::Port(PORT) => &dev.port_counters()?,
            StatsScope::Port(_) => return Err(EINVAL),
        };
        let values = values.values();
        let n = values.len().min(filled.len());
        values[..n].copy_from_slice(&filled[..n]);
        Ok(n)
    }

    fn cq_events<'a>(dev: &IbDevice<'a>, cq: &CqData) -> Option<(Arc<CqEvents>, u32)> {
        cq.events.then(|| (dev.cq_events.clone(), cq.cq_idx.into()))
    }

    fn destroy_cq<'a>(dev: &IbDevice<'a>, cq: &Cq<Self>, _udata: &mut UData<'_>) {
        // The device keeps the CQ (and its ring) while a QP that outlives
        // its verbs object still uses it; see `crate::dev::lifetime`.
        dev.core.release(ObjectId::Cq(cq.data().cq_idx));
    }

    fn create_ah<'a>(
        dev: &RegData<'a, Self>,
        pd: &Pd<Self>,
        attr: &AhAttr,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<AhData, Error>> {
        counted(
            &dev.errors.create_ah,
            objects::create_ah(dev, pd.data().pdn, attr, udata),
        )
    }

    fn destroy_ah<'a>(dev: &IbDevice<'a>, ah: &Ah<Self>) {
        objects::destroy_ah(dev, ah);
    }

    fn reg_user_mr<'a>(
        dev: &RegData<'a, Self>,
        pd: &Pd<Self>,
        req: &MrRequest,
        udata: &mut UData<'_>,
    ) -> Result<(MrKeys, MrData)> {
        counted(
            &dev.errors.reg_mr,
            objects::reg_user_mr(dev, pd, req, udata),
        )
    }

    fn reg_user_mr_dmabuf<'a>(
        dev: &RegData<'a, Self>,
        pd: &Pd<Self>,
        req: &DmabufMrRequest,
        udata: &mut UData<'_>,
    ) -> Result<(MrKeys, MrData)> {
        counted(
            &dev.errors.reg_mr,
            objects::reg_user_mr_dmabuf(dev, pd, req, udata),
        )
    }

    fn query_mr<'a>(_dev: &IbDevice<'a>, mr: &MrData) -> Result<MrInterconnects> {
        Ok(objects::query_mr(mr))
    }

    fn dereg_mr<'a>(dev: &IbDevice<'a>, mr: MrData, _udata: &mut UData<'_>) {
        objects::dereg_mr(dev, mr);
    }

    fn dealloc_pd<'a>(dev: &IbDevice<'a>, pd: &Pd<Self>, _udata: &mut UData<'_>) {
        dev.core.release(ObjectId::Pd(pd.data().pdn));
    }

    fn create_qp<'a>(
        dev: &RegData<'a, Self>,
        ctx: &UContext<Self>,
        pd: &Pd<Self>,
        attr: &QpInitAttr<'_, Self>,
        udata: &mut UData<'_>,
    ) -> Result<(u32, impl PinInit<QpData, Error>)> {
        counted(
            &dev.errors.create_qp,
            qp::create_qp(dev, ctx, pd, attr, udata),
        )
    }

    fn modify_qp<'a>(
        dev: &IbDevice<'a>,
        qp: &Qp<Self>,
        attr: &QpAttr<'_>,
        mask: u32,
        udata: &mut UData<'_>,
    ) -> Result {
        qp::modify_qp(dev, qp, attr, mask, udata)
    }

    fn query_qp<'a>(dev: &IbDevice<'a>, qp: &Qp<Self>, mask: u32) -> Result<QpQuery> {
        qp::query_qp(dev, qp, mask)
    }

    fn destroy_qp<'a>(dev: &IbDevice<'a>, qp: &Qp<Self>, _udata: &mut UData<'_>) {
        qp::destroy_qp(dev, qp);
    }

    fn query_comp_cntr_caps<'a>(dev: &IbDevice<'a>) -> Result<CompCntrCaps> {
        comp_cntr::query_caps(dev)
    }

    fn create_comp_cntr<'a>(
        dev: &IbDevice<'a>,
        ctx: &UContext<Self>,
        attrs: &CompCntrAttrs<'_>,
    ) -> Result<CompCntrData> {
        comp_cntr::create(dev, ctx, attrs)
    }

    fn destroy_comp_cntr<'a>(dev: &IbDevice<'a>, cc: CompCntrData) {
        comp_cntr::destroy(dev, cc);
    }

    fn modify_comp_cntr<'a>(
        dev: &IbDevice<'a>,
        cc: &CompCntrData,
        entry: CompCntrEntry,
        op: CompCntrModifyOp,
        value: u64,
    ) -> Result {
        comp_cntr::modify(dev, cc, entry, op, value)
    }

    fn qp_attach_comp_cntr<'a>(
        dev: &IbDevice<'a>,
        qp: &Qp<Self>,
        cc: &CompCntrData,
        ops: QpCounterOps,
    ) -> Result {
        comp_cntr::attach(dev, qp, cc, ops)
    }
}

#[kunit_tests(refa_ib)]
mod tests {
    use super::*;
    use crate::hw::wire::Wire;

    #[test]
    fn link_speeds_map_as_in_the_c_driver() {
        let table = [
            (0, Speed::Edr, Width::X1),
            (25, Speed::Edr, Width::X1),
            (30, Speed::Sdr, Width::X12),
            (40, Speed::Fdr10, Width::X4),
            (50, Speed::Hdr, Width::X1),
            (60, Speed::Ddr, Width::X12),
            (99, Speed::Ddr, Width::X12),
            (100, Speed::Edr, Width::X4),
            (120, Speed::Fdr10, Width::X12),
            (200, Speed::Hdr, Width::X4),
            (400, Speed::Hdr, Width::X8),
            (800, Speed::Ndr, Width::X8),
            (1600, Speed::Xdr, Width::X8),
            (u16::MAX, Speed::Xdr, Width::X8),
        ];
        for (gbps, speed, width) in table {
            assert_eq!(link_speed_and_width(gbps), (speed, width));
        }
    }

    #[test]
    fn user_caps_follow_device_caps_and_event_queues() {
        let always = EFA_QUERY_DEVICE_CAPS_CQ_WITH_SGID | EFA_QUERY_DEVICE_CAPS_CQ_WITH_EXT_MEM;
        assert_eq!(
            user_device_caps(&DeviceAttrs::with_device_caps(0), 0),
            always
        );
        let device = HwDeviceAttr::RDMA_READ.mask()
            | HwDeviceAttr::RDMA_WRITE.mask()
            | HwDeviceAttr::SQ_64_BIT_REQ_ID.mask();
        assert_eq!(
            user_device_caps(&DeviceAttrs::with_device_caps(device), 2),
            always
                | EFA_QUERY_DEVICE_CAPS_RDMA_READ
                | EFA_QUERY_DEVICE_CAPS_RDMA_WRITE
                | EFA_QUERY_DEVICE_CAPS_SQ_64_BIT_REQ_ID
                | EFA_QUERY_DEVICE_CAPS_CQ_NOTIFICATIONS
        );
        let all = HwDeviceAttr::RNR_RETRY.mask()
            | HwDeviceAttr::DATA_POLLING_128.mask()
            | HwDeviceAttr::UNSOLICITED_WRITE_RECV.mask()
            | HwDeviceAttr::EVENT_COUNTERS.mask();
        assert_eq!(
            user_device_caps(&DeviceAttrs::with_device_caps(all), 0),
            always
                | EFA_QUERY_DEVICE_CAPS_RNR_RETRY
                | EFA_QUERY_DEVICE_CAPS_DATA_POLLING_128
                | EFA_QUERY_DEVICE_CAPS_UNSOLICITED_WRITE_RECV
        );
        // Event counters need QUEUE_ATTR_2's limits as well.
        let mut counters = DeviceAttrs::with_device_caps(HwDeviceAttr::EVENT_COUNTERS.mask());
        counters.queues_ex = Some(crate::hw::admin::QueueAttr2 {
            max_event_counters: 2,
            ..crate::hw::admin::QueueAttr2::ZERO
        });
        assert_eq!(
            user_device_caps(&counters, 0),
            always | EFA_QUERY_DEVICE_CAPS_COMP_CNTR
        );
    }

    #[test]
    fn userspace_must_handle_the_limits_the_device_sets() {
        let tx_batch = EFA_ALLOC_UCONTEXT_CMD_SUPP_CAPS_TX_BATCH;
        let min_sq = EFA_ALLOC_UCONTEXT_CMD_SUPP_CAPS_MIN_SQ_WR;
        let mut q = QueueAttr1::ZERO;
        assert_eq!(check_user_caps(&q, 0), Ok(()));
        q.max_tx_batch = 16;
        assert_eq!(check_user_caps(&q, 0), Err(EOPNOTSUPP));
        assert_eq!(check_user_caps(&q, tx_batch), Ok(()));
        q.min_sq_depth = 8;
        assert_eq!(check_user_caps(&q, tx_batch), Err(EOPNOTSUPP));
        assert_eq!(check_user_caps(&q, tx_batch | min_sq), Ok(()));
        // Capabilities the kernel does not know yet are no reason to refuse.
        assert_eq!(check_user_caps(&q, tx_batch | min_sq | 1 << 31), Ok(()));
    }

    fn cq_cmd(entry_size: u32, sub_cqs: u16, flags: u32) -> efa_ibv_create_cq {
        efa_ibv_create_cq {
            comp_mask: 0,
            cq_entry_size: entry_size,
            num_sub_cqs: sub_cqs,
            flags: flags as u8,
            reserved_58: [0; 5],
        }
    }

    #[test]
    fn cq_requests_are_checked_against_the_device() {
        let mut a = DeviceAttrs::with_device_caps(0);
        a.queues.sub_cqs_per_cq = 4;
        let sgid = EFA_CREATE_CQ_WITH_SGID;
        let req_id_64 = EFA_CREATE_CQ_WITH_SQ_COMP_64_BIT_REQ_ID;
        assert_eq!(
            check_cq_request(&cq_cmd(32, 4, sgid), &a, 2),
            Ok(CqRequest {
                entry_size: 32,
                source_gid: true,
                req_id_64: false,
                events: false
            })
        );
        assert!(check_cq_request(&cq_cmd(16, 4, 0), &a, 2).is_ok());
        // Source GIDs do not fit 16-byte entries; no other size exists.
        assert_eq!(check_cq_request(&cq_cmd(16, 4, sgid), &a, 2), Err(EINVAL));
        assert_eq!(check_cq_request(&cq_cmd(24, 4, 0), &a, 2), Err(EINVAL));
        assert_eq!(check_cq_request(&cq_cmd(32, 2, 0), &a, 2), Err(EINVAL));
        // Flags: unknown ones are malformed; known ones the device or the
        // driver cannot honour are unsupported.
        assert_eq!(check_cq_request(&cq_cmd(32, 4, 0x80), &a, 2), Err(EINVAL));
        assert_eq!(
            check_cq_request(&cq_cmd(32, 4, req_id_64), &a, 2),
            Err(EOPNOTSUPP)
        );
        let a64 = DeviceAttrs {
            queues: a.queues,
            ..DeviceAttrs::with_device_caps(HwDeviceAttr::SQ_64_BIT_REQ_ID.mask())
        };
        assert!(check_cq_request(&cq_cmd(32, 4, req_id_64), &a64, 2).is_ok());
        // Completion channels need an event queue.
        let channel = EFA_CREATE_CQ_WITH_COMPLETION_CHANNEL;
        assert_eq!(
            check_cq_request(&cq_cmd(32, 4, channel), &a, 2).map(|r| r.events),
            Ok(true)
        );
        assert_eq!(
            check_cq_request(&cq_cmd(32, 4, channel), &a, 0),
            Err(EOPNOTSUPP)
        );
        let mut reserved = cq_cmd(32, 4, 0);
        reserved.reserved_58[4] = 1;
        assert_eq!(check_cq_request(&reserved, &a, 2), Err(EINVAL));
    }

    #[test]
    fn cq_events_go_to_the_eq_of_their_vector() {
        let eqns = [5u16, 9, 2];
        assert_eq!(cq_eqn(&eqns, true, 0), Ok(5));
        assert_eq!(cq_eqn(&eqns, true, 1), Ok(9));
        assert_eq!(cq_eqn(&eqns, true, 2), Ok(2));
        assert_eq!(cq_eqn(&eqns, true, 3), Err(EINVAL));
        assert_eq!(cq_eqn(&eqns, true, u32::MAX), Err(EINVAL));
        // No events: no EQ, whatever the vector says.
        assert_eq!(cq_eqn(&eqns, false, 7), Ok(0));
        assert_eq!(cq_eqn(&[], false, 0), Ok(0));
        assert_eq!(cq_eqn(&[], true, 0), Err(EINVAL));
    }

    #[test]
    fn cq_depth_is_what_one_ring_block_holds() {
        let mut a = DeviceAttrs::with_device_caps(0);
        a.queues.sub_cqs_per_cq = 4;
        a.queues.max_cq_depth = 8192;
        let block = 4 << 20;
        // 8192 entries of 32 bytes in 4 sub-CQs: 1 MiB.
        assert_eq!(max_cqe(&a, block), 8192);
        // 65536 would need 8 MiB; 32768 fill 4 MiB exactly.
        a.queues.max_cq_depth = 65536;
        assert_eq!(max_cqe(&a, block), 32768);
        // One sub-CQ: the ring would fit, CREATE_CQ's depth field does not.
        a.queues.sub_cqs_per_cq = 1;
        assert_eq!(max_cqe(&a, block), 65535);
    }

    #[test]
    fn limits_saturate_into_u16_fields() {
        assert_eq!(saturate_u16(80), 80);
        assert_eq!(saturate_u16(0x1_0000), u16::MAX);
    }
}
