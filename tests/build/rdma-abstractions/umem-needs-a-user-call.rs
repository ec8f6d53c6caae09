// Pinning user memory needs the call of a user process (`UData`), which
// only the layer makes: a kernel worker has none to pass.
use crate::rdma::{
    udata::UData,
    umem::{
        AccessFlags,
        Umem, //
    },
};
use kernel::prelude::*;

pub(crate) fn pin_from_a_worker() -> Result<Umem> {
    // SAFETY: Not even `unsafe` code outside the layer can make one.
    let call = unsafe { UData::from_raw(core::ptr::null_mut(), core::ptr::null_mut()) };
    Umem::get(&call.ok_or(EINVAL)?, 0x1000, 0x1000, AccessFlags::empty())
}
