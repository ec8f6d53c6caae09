// SPDX-License-Identifier: GPL-2.0

//! Abstractions over the C RDMA core.
//!
//! C headers: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h),
//! [`include/rdma/uverbs_ioctl.h`](srctree/include/rdma/uverbs_ioctl.h),
//! [`include/rdma/ib_umem.h`](srctree/include/rdma/ib_umem.h)
//!
//! This is the only part of the driver that touches the RDMA core's C API.
//! It knows nothing of any device: it could move to `rust/kernel/rdma/`,
//! its C helpers (`helpers.c`) to `rust/helpers/rdma.c`.
//!
//! - [`udata`]: the driver data of a user call, and [`umem`]: the memory of
//!   the calling process that a driver pins with it.
// series: begin device
//! - [`device`]: a device ([`device::Device`]) and the operations of its
//!   driver ([`device::Operations`]), with the attributes they report
//!   ([`verbs`]).
//! - [`registration`]: allocating and registering a device, and the
//!   `ib_device_ops` table, built from the operations and from the traits
//!   of the driver's objects.
// series: end device
// series: begin ucontext
//! - One file per kind of object userspace creates, each object a
//!   [`device::Object`] whose driver's data implements the trait of its
//!   kind:
//!   - [`ucontext`]: user contexts.
//!   - [`pd`]: protection domains.
// series: end ucontext
// series: begin cq
//!   - [`cq`]: completion queues, and [`completion`]: their events.
// series: end cq
// series: begin ah
//!   - [`ah`]: address handles.
// series: end ah
// series: begin qp
//!   - [`qp`]: queue pairs.
// series: end qp
// series: begin mr
//!   - [`mr`]: memory regions, and [`uverbs`]: a driver's own uverbs methods
//!     (on MRs).
// series: end mr
// series: begin comp_cntr
//!   - [`comp_cntr`]: completion counters.
// series: end comp_cntr
// series: begin mmap
//! - [`mmap`]: the memory objects offer userspace to map.
// series: end mmap
// series: begin ucontext
//! - [`cgroup`]: charges for objects a driver keeps on the device.
// series: end ucontext
// series: begin stats
//! - [`stats`]: hardware counters.
// series: end stats

// out of tree: begin
// In tree, each module arrives with the patch of the series that its
// `// series:` block names, and so does each block of the other files; a
// module outside any block, with the first (`tools/upstream/series`).
// out of tree: end
// series: begin ah
pub(crate) mod ah;
// series: end ah
pub(crate) mod bindings;
// series: begin ucontext
pub(crate) mod cgroup;
// series: end ucontext
// series: begin comp_cntr
pub(crate) mod comp_cntr;
// series: end comp_cntr
// series: begin cq
pub(crate) mod completion;
pub(crate) mod cq;
// series: end cq
// series: begin device
pub(crate) mod device;
// series: end device
// series: begin mmap
pub(crate) mod mmap;
// series: end mmap
// series: begin mr
pub(crate) mod mr;
// series: end mr
// series: begin ucontext
pub(crate) mod pd;
// series: end ucontext
// series: begin qp
pub(crate) mod qp;
// series: end qp
// series: begin device
pub(crate) mod registration;
// series: end device
// series: begin stats
pub(crate) mod stats;
// series: end stats
// series: begin ucontext
pub(crate) mod ucontext;
// series: end ucontext
pub(crate) mod udata;
pub(crate) mod umem;
// series: begin mr
pub(crate) mod uverbs;
// series: end mr
// series: begin device
pub(crate) mod verbs;
// series: end device
