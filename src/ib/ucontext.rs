// SPDX-License-Identifier: GPL-2.0

//! User contexts: one doorbell page (UAR) each, and the capability
//! handshake with userspace.

use super::{
    data::{
        counted,
        VerbsData, //
    },
    uapi::*,
    RdmaDriver, //
};
use crate::{
    dev::lifetime::{
        ObjectId,
        RecordSlot, //
    },
    hw::admin::QueueAttr1,
    rdma::{
        device::{
            kind,
            Device,
            DriverObject,
            RegData, //
        },
        mmap::MmapRequest,
        ucontext::{
            DriverUContext,
            UContext, //
        },
        udata::UData, //
    }, //
};
use kernel::prelude::*;

/// The driver's part of a user context: its doorbell page (UAR), held in
/// the device's records (see [`crate::dev::lifetime`]).
pub(crate) struct UContextData {
    pub(super) uar: u16,
}

impl DriverObject for UContextData {
    type Driver = RdmaDriver;
    type Kind = kind::UContext;
}

impl DriverUContext for UContextData {
    fn alloc<'a>(
        _dev: &Device<RdmaDriver>,
        data: &RegData<'a, RdmaDriver>,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self>> {
        counted(&data.errors.alloc_ucontext, alloc(data, udata))
    }

    fn dealloc<'a>(ctx: &UContext<Self>, _dev: &Device<RdmaDriver>, data: &VerbsData<'a>) {
        data.core.release(ObjectId::Uar(ctx.data().uar));
    }

    fn mmap<'a>(
        _ctx: &UContext<Self>,
        _dev: &Device<RdmaDriver>,
        data: &VerbsData<'a>,
        request: MmapRequest<'_, ObjectId>,
    ) -> Result {
        counted(&data.errors.mmap, request.map())
    }
}

fn alloc(data: &VerbsData<'_>, udata: &mut UData<'_>) -> Result<UContextData> {
    // Every field of the request is optional: old userspace sends none.
    // Unlike every other verb, what this kernel does not know (reserved
    // bytes, a longer request) is ignored, not refused, as by efa.ko: the
    // efa uAPI lets newer userspace announce capabilities in fields an older
    // kernel has never heard of, and learns from the response what the
    // kernel understood. Refusing them would leave that userspace without
    // any context at all.
    let cmd: efa_ibv_alloc_ucontext_cmd = udata.read_lenient::<Uapi<_>>()?.0;
    check_user_caps(&data.attrs.queues, cmd.supported_caps).inspect_err(|_| {
        dev_dbg!(
            data.core.dev(),
            "userspace capabilities {:#x} lack what the device needs\n",
            cmd.supported_caps
        )
    })?;

    let slot = RecordSlot::new::<()>(None)?;
    let uar = data.core.alloc_uar()?;
    data.core.record(slot, ObjectId::Uar(uar), &[])?;
    let a = &data.attrs;
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
    if let Err(e) = udata.respond(&Uapi(resp)) {
        data.core.release(ObjectId::Uar(uar));
        return Err(e);
    }
    Ok(UContextData { uar })
}

fn saturate_u16(value: u32) -> u16 {
    value.try_into().unwrap_or(u16::MAX)
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

#[kunit_tests(refa_ib_ucontext)]
mod tests {
    use super::*;
    use crate::hw::wire::Wire;

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

    #[test]
    fn limits_saturate_into_u16_fields() {
        assert_eq!(saturate_u16(80), 80);
        assert_eq!(saturate_u16(0x1_0000), u16::MAX);
    }
}
