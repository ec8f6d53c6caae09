// SPDX-License-Identifier: GPL-2.0

//! Completion queues: a ring of `entries × entry size × sub-CQs` bytes in
//! kernel pages (or in memory userspace passed), CREATE_CQ with the
//! context's UAR, and two mmap cookies: the ring (kernel pages) and the
//! doorbell page (BAR memory, uncached).
//!
//! A CQ with a completion channel is created in interrupt mode on the event
//! queue of its completion vector and goes into the device's table of CQs
//! taking events, by CQ number ([`CompletionTable`]), where the event
//! queues' interrupt handlers find it (see [`crate::dev::eq`]). A number the
//! device gives out while it is in use is refused: the CQ that has it keeps
//! its events.

use super::{
    data::{
        counted,
        VerbsData, //
    },
    uapi::*,
    ucontext::UContextData,
    RdmaDriver, //
};
use crate::{
    dev::{
        eq::CompletionSink,
        features::DeviceAttrs,
        lifetime::{
            ObjectId,
            PageOwner,
            RecordSlot, //
        },
    },
    hw::{
        admin::{
            CreateCqCmd,
            DeviceAttr as HwDeviceAttr,
            MemAddr, //
        },
        io::{
            CDESC_EX_SIZE,
            CDESC_SIZE, //
        }, //
    },
    rdma::{
        completion::{
            CompletionEvents,
            CompletionTable, //
        },
        cq::{
            Cq,
            CqCreated,
            CqInitAttr,
            DriverCq, //
        },
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
        ucontext::UContext,
        udata::UData,
        umem::Umem, //
    }, //
};
// out of tree: begin
use crate::kernel_gaps::ratelimit::dev_err_ratelimited;
// out of tree: end
use kernel::{
    page::{
        PAGE_MASK,
        PAGE_SIZE, //
    },
    prelude::*,
    sync::Arc, //
};

/// The driver's part of a completion queue, held in the device's records,
/// which keep its ring for as long as the device has the CQ.
pub(crate) struct CqData {
    pub(super) cq_idx: u16,
    /// Sub-CQs in the ring.
    pub(super) num_sub_cqs: u16,
}

impl DriverObject for CqData {
    type Driver = RdmaDriver;
    type Kind = kind::Cq;
}

impl DriverCq for CqData {
    fn create<'a>(
        _dev: &Device<RdmaDriver>,
        data: &RegData<'a, RdmaDriver>,
        ctx: &UContext<UContextData>,
        attr: &CqInitAttr,
        udata: &mut UData<'_>,
        mmaps: &mut MmapSetOf<'_, RdmaDriver>,
    ) -> Result<CqCreated<impl PinInit<Self>>> {
        counted(
            &data.errors.create_cq,
            create(data, ctx, attr, udata, mmaps),
        )
    }

    fn destroy<'a>(cq: &Cq<Self>, _dev: &Device<RdmaDriver>, data: &VerbsData<'a>) {
        // The device keeps the CQ (and its ring) while a QP that outlives
        // its verbs object still uses it; see `crate::dev::lifetime`.
        data.core.release(ObjectId::Cq(cq.data().cq_idx));
    }

    fn may_destroy<'a>(cq: &Cq<Self>, dev: &Device<RdmaDriver>, data: &VerbsData<'a>) -> Result {
        data.charge_if_kept(dev, ObjectId::Cq(cq.data().cq_idx))
    }
}

/// The event queues' interrupt handlers deliver completion events through
/// the table.
impl CompletionSink for CompletionTable {
    fn completion(&self, cqn: u16) -> bool {
        self.notify(cqn.into())
    }
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

/// The doorbell of a CQ the device created: where CREATE_CQ put it, if the
/// device gives CQs doorbells (`DB_VALID`; devices before CQ notifications
/// do not, and their CQs are polled only, as with the C driver). A CQ that
/// is to take completion events needs one, or it can never be armed:
/// `EOPNOTSUPP` then, where the C driver creates a CQ that never gets an
/// event.
fn cq_doorbell(doorbell: Option<u32>, events: bool) -> Result<Option<u32>> {
    match (doorbell, events) {
        (None, true) => Err(EOPNOTSUPP),
        (doorbell, _) => Ok(doorbell),
    }
}

fn create(
    dev: &VerbsData<'_>,
    ctx: &UContext<UContextData>,
    attr: &CqInitAttr,
    udata: &mut UData<'_>,
    mmaps: &mut MmapSetOf<'_, RdmaDriver>,
) -> Result<CqCreated<CqData>> {
    if attr.flags != 0 {
        return Err(EOPNOTSUPP);
    }
    if attr.cqe == 0 || attr.cqe > dev.attrs.queues.max_cq_depth {
        return Err(EINVAL);
    }
    let cmd: efa_ibv_create_cq = udata.read::<Uapi<_>>(CREATE_CQ_MIN_LEN)?.0;
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
    let (ring, ring_dma) = match Umem::from_cq_buffer(udata, whole_pages)? {
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
    let created = dev.core.create_cq(
        &CreateCqCmd {
            cq_caps_1: caps_1,
            cq_caps_2: caps_2,
            sub_cq_depth: depth,
            eqn,
            reserved: 0,
            cq_ba: MemAddr::new(ring_dma),
            l_key: 0,
            num_sub_cqs: cmd.num_sub_cqs,
            uar: ctx.data().uar,
        },
        ring.clone(),
    )?;
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
    if created.depth != depth {
        dev_err_ratelimited!(
            dev.core.dev(),
            "CQ {}: {} entries instead of {}\n",
            created.cq_idx,
            created.depth,
            depth
        );
        return Err(destroy(EIO));
    }
    let db_offset = cq_doorbell(created.doorbell, req.events).map_err(destroy)?;
    // Userspace has the ring already when it passed the memory.
    let ring_key = match &ring {
        CqRing::Kernel(pages) => Some(
            mmaps
                .insert(Backing::Pages(pages.clone()), pages.size())
                .map_err(destroy)?,
        ),
        CqRing::User { .. } => None,
    };
    let doorbell_key = match db_offset {
        Some(db_offset) => {
            let db_page = dev
                .device_pages(&dev.doorbell_bar, "CQ doorbell", db_offset, 4)
                .map_err(destroy)?;
            dev.core
                .claim_pages(db_page.phys(), 1, PageOwner::Doorbells(ctx.data().uar))
                .map_err(destroy)?;
            Some(
                mmaps
                    .insert(Backing::IoUncached(db_page), PAGE_SIZE)
                    .map_err(destroy)?,
            )
        }
        None => None,
    };
    let resp = efa_ibv_create_cq_resp {
        // Without the flag the efa provider polls the CQ without a
        // doorbell, as on devices of generations before CQ notifications.
        comp_mask: if doorbell_key.is_some() {
            EFA_CREATE_CQ_RESP_DB_OFF
        } else {
            0
        },
        reserved_20: [0; 4],
        q_mmap_key: ring_key.unwrap_or(0),
        q_mmap_size: match &ring {
            CqRing::Kernel(pages) => pages.size() as u64,
            CqRing::User { .. } => 0,
        },
        cq_idx: created.cq_idx,
        reserved_d0: [0; 2],
        db_off: db_offset.map_or(0, |offset| offset & !(PAGE_MASK as u32)),
        db_mmap_key: doorbell_key.unwrap_or(0),
    };
    // The layer withdraws the cookies if this fails.
    udata.respond(&Uapi(resp)).map_err(destroy)?;
    Ok(CqCreated {
        entries: created.depth.into(),
        events: req
            .events
            .then(|| CompletionEvents::new(dev.cq_events.clone(), created.cq_idx.into())),
        data: CqData {
            cq_idx: created.cq_idx,
            num_sub_cqs: cmd.num_sub_cqs,
        },
    })
}

#[kunit_tests(refa_ib_cq)]
mod tests {
    use super::*;

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
    fn a_cq_without_a_doorbell_is_polled_only() {
        assert_eq!(cq_doorbell(Some(0x1040), false), Ok(Some(0x1040)));
        assert_eq!(cq_doorbell(Some(0x1040), true), Ok(Some(0x1040)));
        assert_eq!(cq_doorbell(None, false), Ok(None));
        assert_eq!(cq_doorbell(None, true), Err(EOPNOTSUPP));
    }
}
