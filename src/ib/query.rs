// SPDX-License-Identifier: GPL-2.0

//! The query verbs: the device's and the port's attributes, GID and P_Key
//! tables, as the C driver reports them.

use super::{
    comp_cntr,
    data::VerbsData,
    uapi::*, //
};
use crate::{
    dev::features::DeviceAttrs,
    hw::{
        admin::DeviceAttr as HwDeviceAttr,
        io::CDESC_EX_SIZE, //
    },
    rdma::{
        mmap::DmaPages,
        udata::UData,
        verbs::{
            DeviceAttr,
            Gid,
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
    page::PAGE_SIZE,
    prelude::*, //
};

/// The one port.
const PORT: u32 = super::PORT;
/// GID and P_Key tables have one entry each.
const TABLE_LEN: u16 = 1;
/// The one P_Key: the default, full-membership one.
const DEFAULT_PKEY: u16 = 0xffff;

/// `query_device`, with the efa extended response when userspace asks.
pub(super) fn device(
    data: &VerbsData<'_>,
    attr: &mut DeviceAttr,
    udata: Option<&mut UData<'_>>,
) -> Result {
    let a = &data.attrs;
    let q = &a.queues;
    let max_mr_size = u64::from(q.max_mr_pages).saturating_mul(PAGE_SIZE as u64);
    attr.set_max_mr_size(max_mr_size)
        .set_page_size_cap(a.device.page_size_cap)
        .set_vendor_id(data.vendor_id.into())
        .set_vendor_part_id(data.device_id.into())
        .set_hw_ver(data.subsystem_device_id.into())
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

    let Some(udata) = udata else {
        return Ok(());
    };
    udata.require_no_request()?;
    udata.respond(&Uapi(efa_ibv_ex_query_device_resp {
        comp_mask: 0,
        max_sq_wr: q.max_sq_depth,
        max_rq_wr: q.max_rq_depth,
        max_sq_sge: q.max_wr_send_sges,
        max_rq_sge: q.max_wr_recv_sges,
        max_rdma_size: a.device.max_rdma_size,
        device_caps: user_device_caps(a, data.eqs()),
    }))
}

/// `query_port`.
pub(super) fn port(data: &VerbsData<'_>, port: u32, attr: &mut PortAttr) -> Result {
    if port != PORT {
        return Err(EINVAL);
    }
    let mtu = data.attrs.network.mtu;
    // Below 256 bytes the core's own conversion says 256 too.
    let ib_mtu = Mtu::at_most(mtu).unwrap_or(Mtu::Mtu256);
    let (speed, width) = link_speed_and_width(data.attrs.link_speed_gbps());
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

/// `query_port_speed`: the link rate `query_port` reports, in the core's
/// 100 Mb/s units.
pub(super) fn port_speed(data: &VerbsData<'_>, port: u32) -> Result<u64> {
    if port != PORT {
        return Err(EINVAL);
    }
    Ok(u64::from(data.attrs.link_speed_gbps()) * 10)
}

/// `get_port_immutable`: no standard link layer, no MADs.
pub(super) fn port_immutable(port: u32) -> Result<PortImmutable> {
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

/// `query_gid`: the device's address.
pub(super) fn gid(data: &VerbsData<'_>, port: u32, index: u32) -> Result<Gid> {
    if port != PORT || index != 0 {
        return Err(EINVAL);
    }
    Ok(Gid(data.attrs.network.addr))
}

/// `query_pkey`: the default P_Key.
pub(super) fn pkey(port: u32, index: u16) -> Result<u16> {
    if port != PORT || index != 0 {
        return Err(EINVAL);
    }
    Ok(DEFAULT_PKEY)
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

#[kunit_tests(refa_ib_query)]
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
}
