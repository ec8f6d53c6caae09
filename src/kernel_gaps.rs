// SPDX-License-Identifier: GPL-2.0

//! What the 7.3 kernel crate lacks and this driver needs, one module per
//! gap, each written the way it would be proposed for `rust/kernel/`.
//!
//! - [`pci`]: the device lock taken outside the bus callbacks, with the
//!   driver's data borrowed under it.
// out of tree: begin
//!   Out of tree also what the series' patches/rust/ add to
//!   `rust/kernel/pci` (a driver's `shutdown` callback, a BAR's resource,
//!   reserving a BAR unmapped and its pages for userspace, disabling a
//!   function, clearing its bus mastering, interrupt handlers on shared
//!   MSI-X vectors with their affinity hints).
//! - `dma`: the DMA segment boundary, out of tree only.
//! - `ratelimit`: rate-limited printing (`dev_err_ratelimited()` and
//!   friends in C), out of tree only.
//! - `workqueue`: waiting for a delayed work item (`flush_delayed_work()`),
//!   out of tree only.
// out of tree: end
//! - [`transmute`]: [`FromBytes`]/[`AsBytes`] for bindgen's C structures,
//!   with the proof (`rust/kernel/transmute.rs` has no derive).
//! - [`uts`]: the running kernel's version (`init_uts_ns`,
//!   `LINUX_VERSION_CODE`).
//!
//! [`FromBytes`]: kernel::transmute::FromBytes
//! [`AsBytes`]: kernel::transmute::AsBytes

mod bindings;
// out of tree: begin
pub(crate) mod dma;
// out of tree: end
pub(crate) mod pci;
// out of tree: begin
pub(crate) mod ratelimit;
// out of tree: end
pub(crate) mod transmute;
pub(crate) mod uts;
// out of tree: begin
pub(crate) mod workqueue;
// out of tree: end
