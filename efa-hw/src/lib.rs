// SPDX-License-Identifier: GPL-2.0-only

//! The EFA (Elastic Fabric Adapter) device interface, defined once for the
//! refa kernel driver and the `efa-emu` device model.
//!
//! The facts (register offsets, bit fields, structure layouts, opcodes and
//! status codes) come from the Linux 7.3 C driver's headers
//! (`drivers/infiniband/hw/efa/efa_*_defs.h`) and, for the 128-byte send
//! WQE and the CQ doorbell, from rdma-core's `providers/efa`. The uAPI
//! (`efa-abi.h`) is not here: the driver takes it from the kernel headers.
//!
//! * [`wire`]: the safe little-endian encoding ([`wire::Wire`]), bit-field
//!   masks ([`wire::Field`]) and the macros declaring structures.
//! * [`regs`]: PCI identity and the BAR0 register file.
//! * [`admin`]: admin queue entries, completions and commands.
//! * [`aenq`]: the asynchronous event notification queue.
//! * [`io`]: send and receive descriptors, completions, event queue
//!   entries and doorbells.
//!
//! The crate is `no_std`, has no dependencies and no `unsafe`. The kernel
//! includes the module files directly as siblings under one parent module,
//! so they refer to each other only through `super::`.

#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod wire;

pub mod admin;
pub mod aenq;
pub mod io;
pub mod regs;
