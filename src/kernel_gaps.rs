// SPDX-License-Identifier: GPL-2.0

//! What the 7.3 kernel crate lacks and this driver needs, one module per
//! gap, each written the way it would be proposed for `rust/kernel/`.
//!
//! - [`pci`]: MSI-X vectors shared by interrupt handlers, a DMA segment
//!   boundary, the device lock taken outside the bus callbacks; out of
//!   tree also what the series' patches/rust/ add to `rust/kernel/pci` (a
//!   driver's `shutdown` callback, a BAR's resource, reserving a BAR
//!   unmapped, disabling a function, clearing its bus mastering).
// out of tree: begin
//! - `ratelimit`: rate-limited printing (`dev_err_ratelimited()` and
//!   friends in C), out of tree only: the series adds it to `rust/kernel`.
// out of tree: end
//! - [`transmute`]: [`FromBytes`]/[`AsBytes`] for bindgen's C structures,
//!   with the proof (`rust/kernel/transmute.rs` has no derive).
//! - [`uts`]: the running kernel's version (`init_uts_ns`,
//!   `LINUX_VERSION_CODE`).
//! - [`workqueue`]: waiting for a delayed work item
//!   (`flush_delayed_work()`).
//!
//! [`FromBytes`]: kernel::transmute::FromBytes
//! [`AsBytes`]: kernel::transmute::AsBytes

mod bindings;
pub(crate) mod pci;
// out of tree: begin
pub(crate) mod ratelimit;
// out of tree: end
pub(crate) mod transmute;
pub(crate) mod uts;
pub(crate) mod workqueue;
