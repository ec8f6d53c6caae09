//! vfio-user messages: framing, screening and the protocol server, with
//! the EFA model behind it, as QEMU's side of the socket sends them.
//!
//! Input: the byte stream a client writes on the socket (any number of
//! messages); the session ends when it closes.

#![no_main]

#[allow(dead_code)]
mod bodies;
#[allow(dead_code)]
mod common;
#[path = "../../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::vfio(data));
