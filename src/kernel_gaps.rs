// SPDX-License-Identifier: GPL-2.0

//! What the 7.3 kernel crate lacks and this driver needs, one module per
//! gap, each written the way it would be proposed for `rust/kernel/`.
//!
//! - [`ratelimit`]: rate-limited printing (`dev_err_ratelimited()` and
//!   friends in C).

pub(crate) mod ratelimit;
