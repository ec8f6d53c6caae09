// What the core needs together comes together: a driver offering QPs
// without destroying them does not get an operations table.
use crate::rdma::{
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
        PdOf,
        RegData,
        UContextOf, //
    },
    pd::{
        DriverPd,
        Pd, //
    },
    qp::{
        DriverQp,
        QpAttr,
        QpInitAttr,
        Qp, //
    },
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
use kernel::{
    device::{
        Bound,
        Device as BusDevice, //
    },
    prelude::*,
};

pub(crate) struct Leaky;

#[vtable]
impl Operations for Leaky {
    type RegistrationData<'a> = ();
    type UContext = LeakyCtx;
    type Pd = LeakyPd;
    type Cq = LeakyCq;
    type Ah = crate::driver::NotOffered<Self, kind::Ah>;
    type Mr = crate::driver::NotOffered<Self, kind::Mr>;
    type Qp = LeakyQp;
    type CompCntr = crate::driver::NotOffered<Self, kind::CompCntr>;
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

// The smallest driver's objects again, for this driver.
pub(crate) struct LeakyCtx;

impl DriverObject for LeakyCtx {
    type Driver = Leaky;
    type Kind = kind::UContext;
}

impl DriverUContext for LeakyCtx {
    fn alloc<'a>(
        _dev: &Device<Leaky>,
        _data: &RegData<'a, Leaky>,
        _udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self>> {
        Ok(LeakyCtx)
    }

    fn dealloc<'a>(_ctx: &UContext<Self>, _dev: &Device<Leaky>, _data: &()) {}
}

pub(crate) struct LeakyPd;

impl DriverObject for LeakyPd {
    type Driver = Leaky;
    type Kind = kind::Pd;
}

impl DriverPd for LeakyPd {
    fn alloc<'a>(
        _dev: &Device<Leaky>,
        _data: &RegData<'a, Leaky>,
        _udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self>> {
        Ok(LeakyPd)
    }

    fn dealloc<'a>(_pd: &Pd<Self>, _dev: &Device<Leaky>, _data: &()) {}
}

pub(crate) struct LeakyCq;

impl DriverObject for LeakyCq {
    type Driver = Leaky;
    type Kind = kind::Cq;
}

impl DriverCq for LeakyCq {
    fn create<'a>(
        _dev: &Device<Leaky>,
        _data: &RegData<'a, Leaky>,
        _ctx: &UContextOf<Leaky>,
        attr: &CqInitAttr,
        _udata: &mut UData<'_>,
        _mmaps: &mut MmapSetOf<'_, Leaky>,
    ) -> Result<CqCreated<impl PinInit<Self>>> {
        Ok(CqCreated {
            entries: attr.cqe,
            events: None,
            data: LeakyCq,
        })
    }

    fn destroy<'a>(_cq: &Cq<Self>, _dev: &Device<Leaky>, _data: &()) {}
}

pub(crate) struct LeakyQp;

impl DriverObject for LeakyQp {
    type Driver = Leaky;
    type Kind = kind::Qp;
}

#[vtable]
impl DriverQp for LeakyQp {
    fn create<'a>(
        _dev: &Device<Leaky>,
        _data: &RegData<'a, Leaky>,
        _ctx: &UContextOf<Leaky>,
        _pd: &PdOf<Leaky>,
        _attr: &QpInitAttr<'_, Leaky>,
        _udata: &mut UData<'_>,
        _mmaps: &mut MmapSetOf<'_, Leaky>,
    ) -> Result<(u32, impl PinInit<Self>)> {
        Ok((1, LeakyQp))
    }

    fn modify<'a>(
        _qp: &Qp<Self>,
        _dev: &Device<Leaky>,
        _data: &(),
        _attr: &QpAttr<'_>,
        _mask: u32,
        _udata: Option<&mut UData<'_>>,
    ) -> Result {
        Ok(())
    }
}

pub(crate) fn allocate(parent: &BusDevice<Bound>) -> Result {
    drop(UnregisteredDevice::<Leaky>::new(parent)?);
    Ok(())
}

// Nothing calls `allocate`; kept, it is compiled, and with it the table
// whose checks must fail.
#[used]
static ALLOCATE: fn(&BusDevice<Bound>) -> Result = allocate;
