// A destroy cannot fail: at close and device removal the core warns about
// failures, so the driver keeps what the device still uses instead. A
// user's destroy is refused, before anything changes, by `may_dealloc`.
use crate::{
    driver::Minimal,
    rdma::{
        device::{
            kind,
            Device,
            DriverObject,
            RegData, //
        },
        pd::{
            DriverPd,
            Pd, //
        },
        udata::UData,
    },
};
use kernel::prelude::*;

pub(crate) struct Refusing;

impl DriverObject for Refusing {
    type Driver = Minimal;
    type Kind = kind::Pd;
}

impl DriverPd for Refusing {
    fn alloc<'a>(
        _dev: &Device<Minimal>,
        _data: &RegData<'a, Minimal>,
        _udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self>> {
        Ok(Refusing)
    }

    fn dealloc<'a>(_pd: &Pd<Self>, _dev: &Device<Minimal>, _data: &()) -> Result {
        Err(EIO)
    }
}
