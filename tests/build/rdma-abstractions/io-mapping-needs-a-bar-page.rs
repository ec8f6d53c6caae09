// Device memory is offered to userspace only as pages of a reserved BAR,
// which only the BAR's bounds check makes (`BarRegion::io_pages()`; in
// tree `kernel::io::IoPages`, whose fields are the kernel crate's): a
// physical address of the driver's choosing (kernel RAM) cannot be mapped.
use crate::kernel_gaps::pci::IoPages;
use crate::rdma::mmap::Backing;
use kernel::page::PAGE_SIZE;

pub(crate) fn map_kernel_memory() -> Backing {
    Backing::IoUncached(IoPages {
        phys: 0x100_0000,
        len: PAGE_SIZE,
    })
}
