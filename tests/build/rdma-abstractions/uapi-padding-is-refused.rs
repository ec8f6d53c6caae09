// A structure copied to userspace has no padding, which would copy kernel
// memory out.
use crate::kernel_gaps::transmute::impl_bytes_for_c_struct;

#[repr(C)]
#[derive(Default)]
pub(crate) struct Response {
    pub(crate) flag: u8,
    pub(crate) value: u32,
}

impl_bytes_for_c_struct! {
    struct Plain;
    Response { flag, value }
}
