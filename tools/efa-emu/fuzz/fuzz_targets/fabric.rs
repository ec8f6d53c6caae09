//! Fabric packets: decoding what arrives from another efa-emu process, and
//! its delivery to a device with a UD and an SRD queue pair in RTS.
//!
//! Input: a packet as it travels on the socket fabric.

#![no_main]

#[allow(dead_code)]
mod bodies;
#[allow(dead_code)]
mod common;
#[path = "../../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::fabric(data));
