//! Admin entries: decoding and execution of every command, as the model
//! fetches them from the admin queue.
//!
//! Input: entries of 64 bytes, each `opcode, flags, payload...` (the
//! header's command id and phase are the fake driver's, so that entries
//! are executed rather than refused for their phase); at most 16.

#![no_main]

#[path = "../../tests/support/mod.rs"]
#[allow(dead_code, unused_imports)]
mod support;
#[allow(dead_code)]
mod common;

use std::time::Duration;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut f = common::fake();
    for entry in data.chunks(64).take(16) {
        let opcode = entry[0];
        let flags = entry.get(1).copied().unwrap_or(0) & !1;
        let payload = entry.get(2..).unwrap_or_default();
        let id = f.put_entry(opcode, flags, payload);
        f.ring();
        // Every command the model takes completes (none is injected here).
        if f.wait_for(id, Duration::from_secs(5)).is_none() {
            panic!("no completion for opcode {opcode}");
        }
    }
});
