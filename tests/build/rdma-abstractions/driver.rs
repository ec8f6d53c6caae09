// SPDX-License-Identifier: GPL-2.0

//! The smallest driver of the RDMA abstractions: user contexts, PDs and
//! CQs, and no AHs, MRs, QPs or completion counters (what the core can do
//! without). Each case of `tests/build/rdma-abstractions` builds on it.

use crate::rdma::{
    ah::DriverAh,
    comp_cntr::DriverCompCntr,
    cq::{
        Cq,
        CqCreated,
        CqInitAttr,
        DriverCq, //
    },
    device::{
        kind,
        Device,
        DriverId,
        DriverObject,
        MmapSetOf,
        Operations,
        RegData,
        UContextOf, //
    },
    mr::DriverMr,
    pd::{
        DriverPd,
        Pd, //
    },
    qp::DriverQp,
    registration::UnregisteredDevice,
    ucontext::{
        DriverUContext,
        UContext, //
    },
    udata::UData,
    verbs::{
        DeviceAttr,
        LinkLayer,
        PortAttr,
        PortImmutable, //
    },
};
use core::marker::PhantomData;
use kernel::{
    device::{
        Bound,
        Device as BusDevice, //
    },
    prelude::*,
};

/// The object type of a kind a driver does not offer: its trait's
/// operations are not set in the table, and the core refuses the verbs.
/// refa offers every kind, so the layer has no such type; a driver that
/// needs one would bring it.
pub(crate) struct NotOffered<D, K>(core::convert::Infallible, PhantomData<fn() -> (D, K)>);

impl<D: Operations, K: kind::Kind> DriverObject for NotOffered<D, K> {
    type Driver = D;
    type Kind = K;
}

#[vtable]
impl<D: Operations> DriverAh for NotOffered<D, kind::Ah> {}
#[vtable]
impl<D: Operations> DriverMr for NotOffered<D, kind::Mr> {}
#[vtable]
impl<D: Operations> DriverQp for NotOffered<D, kind::Qp> {}
#[vtable]
impl<D: Operations> DriverCompCntr for NotOffered<D, kind::CompCntr> {}

pub(crate) struct Minimal;

#[vtable]
impl Operations for Minimal {
    type RegistrationData<'a> = ();
    type UContext = Ctx;
    type Pd = ProtectionDomain;
    type Cq = CompletionQueue;
    type Ah = NotOffered<Self, kind::Ah>;
    type Mr = NotOffered<Self, kind::Mr>;
    type Qp = NotOffered<Self, kind::Qp>;
    type CompCntr = NotOffered<Self, kind::CompCntr>;
    type MmapPrivate = ();

    const DRIVER_ID: DriverId = DriverId::Efa;
    const ABI_VERSION: u32 = 1;
    const LINK_LAYER: LinkLayer = LinkLayer::Unspecified;

    fn query_device<'a>(
        _dev: &Device<Self>,
        _data: &(),
        _attr: &mut DeviceAttr,
        _udata: Option<&mut UData<'_>>,
    ) -> Result {
        Ok(())
    }

    fn query_port<'a>(_dev: &Device<Self>, _data: &(), _port: u32, _attr: &mut PortAttr) -> Result {
        Ok(())
    }

    fn get_port_immutable<'a>(_dev: &Device<Self>, _data: &(), _port: u32) -> Result<PortImmutable> {
        Ok(PortImmutable::default())
    }
}

pub(crate) struct Ctx;

impl DriverObject for Ctx {
    type Driver = Minimal;
    type Kind = kind::UContext;
}

impl DriverUContext for Ctx {
    fn alloc<'a>(
        _dev: &Device<Minimal>,
        _data: &RegData<'a, Minimal>,
        _udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self>> {
        Ok(Ctx)
    }

    fn dealloc<'a>(_ctx: &UContext<Self>, _dev: &Device<Minimal>, _data: &()) {}
}

pub(crate) struct ProtectionDomain;

impl DriverObject for ProtectionDomain {
    type Driver = Minimal;
    type Kind = kind::Pd;
}

impl DriverPd for ProtectionDomain {
    fn alloc<'a>(
        _dev: &Device<Minimal>,
        _data: &RegData<'a, Minimal>,
        _udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self>> {
        Ok(ProtectionDomain)
    }

    fn dealloc<'a>(_pd: &Pd<Self>, _dev: &Device<Minimal>, _data: &()) {}
}

pub(crate) struct CompletionQueue;

impl DriverObject for CompletionQueue {
    type Driver = Minimal;
    type Kind = kind::Cq;
}

impl DriverCq for CompletionQueue {
    fn create<'a>(
        _dev: &Device<Minimal>,
        _data: &RegData<'a, Minimal>,
        _ctx: &UContextOf<Minimal>,
        attr: &CqInitAttr,
        _udata: &mut UData<'_>,
        _mmaps: &mut MmapSetOf<'_, Minimal>,
    ) -> Result<CqCreated<impl PinInit<Self>>> {
        Ok(CqCreated {
            entries: attr.cqe,
            events: None,
            data: CompletionQueue,
        })
    }

    fn destroy<'a>(_cq: &Cq<Self>, _dev: &Device<Minimal>, _data: &()) {}
}

/// Builds the operations table (its compile-time checks run).
pub(crate) fn allocate(parent: &BusDevice<Bound>) -> Result {
    drop(UnregisteredDevice::<Minimal>::new(parent)?);
    Ok(())
}

// Nothing calls `allocate`; kept, it is compiled, and with it the table and
// its checks.
#[used]
static ALLOCATE: fn(&BusDevice<Bound>) -> Result = allocate;
