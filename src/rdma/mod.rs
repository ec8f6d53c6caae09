// SPDX-License-Identifier: GPL-2.0

//! Abstractions over the C RDMA core.
//!
//! This is the only part of the driver that touches the RDMA core's C API,
//! and the only part with `unsafe` code. It is written so that it could move
//! to `rust/kernel/rdma/`.

pub(crate) mod bindings;
