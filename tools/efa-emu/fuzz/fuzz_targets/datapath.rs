//! The data path: send WQEs from the LLQ and receive descriptors from the
//! RQ ring, on a UD or SRD queue pair in RTS with a registered buffer and
//! an address handle (messages go to the device itself).
//!
//! Input: byte 0 picks UD (even) or SRD (odd); then records of 65 bytes:
//! a kind byte (even: a 64-byte send WQE written to the LLQ and rung; odd:
//! four 16-byte receive descriptors written to the RQ ring and rung); at
//! most 32.

#![no_main]

#[allow(dead_code)]
mod bodies;
#[allow(dead_code)]
mod common;
#[path = "../../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::datapath(data));
