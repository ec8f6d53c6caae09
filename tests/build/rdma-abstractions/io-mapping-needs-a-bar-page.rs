// Device memory is offered to userspace only as pages of a reserved BAR,
// which only the BAR's bounds check makes (or an `unsafe` promise): a
// physical address of the driver's choosing (kernel RAM) cannot be mapped.
use crate::rdma::mmap::{
    Backing,
    IoPages, //
};
use kernel::page::PAGE_SIZE;

pub(crate) fn map_kernel_memory() -> Backing {
    Backing::IoUncached(IoPages {
        phys: 0x100_0000,
        len: PAGE_SIZE,
    })
}
