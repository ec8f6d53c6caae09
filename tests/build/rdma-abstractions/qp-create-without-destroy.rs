// What the core needs together comes together: a driver offering QPs
// without destroying them does not get an operations table.
use crate::rdma::{
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
    qp::{
        DriverQp,
        QpAttr,
        QpInitAttr,
        Qp, //
    },
    registration::UnregisteredDevice,
    udata::UData,
    verbs::{
        DeviceAttr,
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
    type UContext = crate::driver::Ctx;
    type Pd = crate::driver::ProtectionDomain;
    type Cq = crate::driver::CompletionQueue;
    type Ah = crate::rdma::device::NotOffered<Self, kind::Ah>;
    type Mr = crate::rdma::device::NotOffered<Self, kind::Mr>;
    type Qp = LeakyQp;
    type CompCntr = crate::rdma::device::NotOffered<Self, kind::CompCntr>;
    type MmapPrivate = ();

    const DRIVER_ID: DriverId = DriverId::Efa;
    const ABI_VERSION: u32 = 1;

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
