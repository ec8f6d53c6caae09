// What the core calls without a NULL check is required: a driver without
// `query_port` does not build.
use crate::rdma::{
    device::{
        kind,
        Device,
        DriverId,
        Operations, //
    },
    udata::UData,
    verbs::{
        DeviceAttr,
        LinkLayer,
        PortImmutable, //
    },
};
use crate::driver::NotOffered;
use kernel::prelude::*;

pub(crate) struct NoPort;

#[vtable]
impl Operations for NoPort {
    type RegistrationData<'a> = ();
    type UContext = NotOffered<Self, kind::UContext>;
    type Pd = NotOffered<Self, kind::Pd>;
    type Cq = NotOffered<Self, kind::Cq>;
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

    fn get_port_immutable<'a>(_dev: &Device<Self>, _data: &(), _port: u32) -> Result<PortImmutable> {
        Ok(PortImmutable::default())
    }
}
