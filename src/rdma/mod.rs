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
//! - [`device`]: a device ([`device::Device`]), the operations of its driver
//!   ([`device::Operations`]) and the one generic type of the objects in it
//!   ([`device::Object`]).
//! - One file per kind of object, with the driver's trait for it:
//!   [`ucontext`], [`pd`], [`cq`], [`ah`], [`mr`], [`qp`], [`comp_cntr`].
//! - [`registration`]: allocating and registering a device, and the
//!   `ib_device_ops` table, built from all of the above.
//! - What objects use: [`udata`] (the driver data of a user call),
//!   [`umem`] (pinned user memory), [`mmap`] (user mappings),
//!   [`completion`] (completion events), [`verbs`] (attributes), [`stats`]
//!   (hardware counters), [`uverbs`] (a driver's own uverbs methods),
//!   [`cgroup`] (charges for objects a driver keeps on the device).

pub(crate) mod ah;
pub(crate) mod bindings;
pub(crate) mod cgroup;
pub(crate) mod comp_cntr;
pub(crate) mod completion;
pub(crate) mod cq;
pub(crate) mod device;
pub(crate) mod mmap;
pub(crate) mod mr;
pub(crate) mod pd;
pub(crate) mod qp;
pub(crate) mod registration;
pub(crate) mod stats;
pub(crate) mod ucontext;
pub(crate) mod udata;
pub(crate) mod umem;
pub(crate) mod uverbs;
pub(crate) mod verbs;
