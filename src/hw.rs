// SPDX-License-Identifier: GPL-2.0

//! The EFA device interface: registers, admin commands, asynchronous events
//! and I/O descriptors, defined once in the `efa-hw` crate for the driver
//! and the device model, and included here file by file.

#[path = "../efa-hw/src/admin.rs"]
pub mod admin;
#[path = "../efa-hw/src/aenq.rs"]
pub mod aenq;
#[path = "../efa-hw/src/io.rs"]
pub mod io;
#[path = "../efa-hw/src/regs.rs"]
pub mod regs;
#[path = "../efa-hw/src/wire.rs"]
pub mod wire;
