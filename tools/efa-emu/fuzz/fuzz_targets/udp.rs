//! UDP fabric datagrams: the receiving port's checks (size, envelope,
//! MAC, sender, replay window) and the packet inside.
//!
//! Input: datagrams, each a 2-byte length and its bytes.

#![no_main]

#[allow(dead_code)]
mod bodies;
#[allow(dead_code)]
mod common;
#[path = "../../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::udp(data));
