//! Admin entries: decoding and execution of every command, as the model
//! fetches them from the admin queue.
//!
//! Input: entries of 64 bytes, each `opcode, flags, payload...` (the
//! header's command id and phase are the fake driver's, so that entries
//! are executed rather than refused for their phase); at most 16.

#![no_main]

#[allow(dead_code)]
mod bodies;
#[allow(dead_code)]
mod common;
#[path = "../../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::admin(data));
