// The initialiser a create operation returns cannot fail: whatever can
// fail happens before the operation returns, while the driver can still
// undo what it did on the device.
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
use kernel::{
    new_mutex,
    prelude::*,
    sync::Mutex, //
};

#[pin_data]
pub(crate) struct Fallible {
    #[pin]
    state: Mutex<u32>,
}

impl DriverObject for Fallible {
    type Driver = Minimal;
    type Kind = kind::Pd;
}

impl DriverPd for Fallible {
    fn alloc<'a>(
        _dev: &Device<Minimal>,
        _data: &RegData<'a, Minimal>,
        _udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self>> {
        Ok(try_pin_init!(Fallible {
            state <- new_mutex!(0),
        }? Error))
    }

    fn dealloc<'a>(_pd: &Pd<Self>, _dev: &Device<Minimal>, _data: &()) {}
}
