// SPDX-License-Identifier: GPL-2.0

//! The RDMA device: what the verbs see of an EFA device.
//!
//! Registered as `refa_%d` with driver id `RDMA_DRIVER_EFA` and the uAPI of
//! `efa-abi.h`, so that rdma-core's `efa` provider drives it. One port, no
//! standard link layer, and none of the kernel-only verbs (`post_send`,
//! `poll_cq`, ...): the RDMA core then does not offer the device to kernel
//! ULPs (`kverbs_provider` stays off), as for the C driver.
//!
//! This file holds the device's operations table; each kind of object has
//! its file: [`ucontext`], [`pd`], [`cq`], [`qp`], [`objects`] (AHs and
//! MRs), [`comp_cntr`]; beside them the queries ([`query`]), the
//! statistics ([`stats`]), what the verbs know of the device ([`data`]),
//! and the uAPI ([`uapi`]).

mod comp_cntr;
mod cq;
mod data;
mod objects;
mod pd;
mod qp;
mod query;
mod stats;
mod uapi;
mod ucontext;

pub(crate) use self::data::{
    BarWindow,
    VerbsData, //
};
use crate::{
    dev::lifetime::ObjectId,
    rdma::{
        device::{
            Device,
            DriverId,
            Operations, //
        },
        stats::{
            HwCounters,
            HwStatsValues,
            StatsScope, //
        },
        udata::UData,
        uverbs::UapiDefinitions,
        verbs::{
            DeviceAttr,
            Gid,
            LinkLayer,
            PortAttr,
            PortImmutable, //
        }, //
    },
};
use kernel::prelude::*;

/// The one port.
const PORT: u32 = 1;

/// The RDMA driver of refa: the operations of its devices and the types of
/// their objects.
pub(crate) struct RdmaDriver;

#[vtable]
impl Operations for RdmaDriver {
    type RegistrationData<'a> = VerbsData<'a>;
    type UContext = ucontext::UContextData;
    type Pd = pd::PdData;
    type Cq = cq::CqData;
    type Ah = objects::AhData;
    type Mr = objects::MrData;
    type Qp = qp::QpData;
    type CompCntr = comp_cntr::CompCntrData;
    type MmapPrivate = ObjectId;

    const DRIVER_ID: DriverId = DriverId::Efa;
    const ABI_VERSION: u32 = uapi::EFA_UVERBS_ABI_VERSION;
    // The port speaks neither InfiniBand nor Ethernet: rdma-core's efa
    // provider expects "unspecified", as efa.ko answers.
    const LINK_LAYER: LinkLayer = LinkLayer::Unspecified;

    fn query_device<'a>(
        _dev: &Device<Self>,
        data: &VerbsData<'a>,
        attr: &mut DeviceAttr,
        udata: Option<&mut UData<'_>>,
    ) -> Result {
        query::device(data, attr, udata)
    }

    fn query_port<'a>(
        _dev: &Device<Self>,
        data: &VerbsData<'a>,
        port: u32,
        attr: &mut PortAttr,
    ) -> Result {
        query::port(data, port, attr)
    }

    fn get_port_immutable<'a>(
        _dev: &Device<Self>,
        _data: &VerbsData<'a>,
        port: u32,
    ) -> Result<PortImmutable> {
        query::port_immutable(port)
    }

    fn query_port_speed<'a>(_dev: &Device<Self>, data: &VerbsData<'a>, port: u32) -> Result<u64> {
        query::port_speed(data, port)
    }

    fn query_gid<'a>(
        _dev: &Device<Self>,
        data: &VerbsData<'a>,
        port: u32,
        index: u32,
    ) -> Result<Gid> {
        query::gid(data, port, index)
    }

    fn query_pkey<'a>(
        _dev: &Device<Self>,
        _data: &VerbsData<'a>,
        port: u32,
        index: u16,
    ) -> Result<u16> {
        query::pkey(port, index)
    }

    fn mmap_free<'a>(_dev: &Device<Self>, data: &VerbsData<'a>, holder_of: ObjectId) {
        // The last mapping of a QP's send queue is gone.
        data.core.release(holder_of);
    }

    fn hw_counters(scope: StatsScope) -> Option<&'static HwCounters> {
        stats::counters(scope)
    }

    fn get_hw_stats<'a>(
        _dev: &Device<Self>,
        data: &VerbsData<'a>,
        scope: StatsScope,
        values: &mut HwStatsValues<'_>,
    ) -> Result<usize> {
        stats::fill(data, scope, values)
    }

    fn uapi_definitions() -> &'static UapiDefinitions {
        uapi::efa_uapi()
    }
}
