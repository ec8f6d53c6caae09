// SPDX-License-Identifier: GPL-2.0

//! Abstractions over the C RDMA core.
//!
//! This is the only part of the driver that touches the RDMA core's C API,
//! and the only part with `unsafe` code. It is written so that it could move
//! to `rust/kernel/rdma/`; [`pci`] holds the few safe wrappers the driver
//! needs for gaps in the 7.3 kernel crate, which belong in that crate.

pub(crate) mod ah;
pub(crate) mod bindings;
pub(crate) mod cq;
pub(crate) mod device;
pub(crate) mod efa_abi;
pub(crate) mod mmap;
pub(crate) mod mr;
pub(crate) mod pci;
pub(crate) mod pd;
pub(crate) mod qp;
pub(crate) mod stats;
pub(crate) mod ucontext;
pub(crate) mod udata;
pub(crate) mod umem;
pub(crate) mod verbs;
