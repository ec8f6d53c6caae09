// A structure copied to or from userspace is plain bytes: a `bool` is not
// (userspace may send 2).
use crate::kernel_gaps::transmute::impl_bytes_for_c_struct;

#[repr(C)]
#[derive(Default)]
pub(crate) struct Request {
    pub(crate) comp_mask: u32,
    pub(crate) enable: bool,
    pub(crate) reserved: [u8; 3],
}

impl_bytes_for_c_struct! {
    struct Plain;
    Request { comp_mask, enable, reserved }
}
