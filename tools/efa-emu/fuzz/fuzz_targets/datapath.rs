//! The data path: send WQEs from the LLQ and receive descriptors from the
//! RQ ring, on a UD or SRD queue pair in RTS with a registered buffer and
//! an address handle (messages go to the device itself).
//!
//! Input: byte 0 picks UD (even) or SRD (odd); then records of 65 bytes:
//! a kind byte (even: a 64-byte send WQE written to the LLQ and rung; odd:
//! four 16-byte receive descriptors written to the RQ ring and rung); at
//! most 32.

#![no_main]

#[path = "../../tests/support/mod.rs"]
#[allow(dead_code, unused_imports)]
mod support;
#[allow(dead_code)]
mod common;

use std::time::Duration;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let mut f = common::fake();
    let mut dp = common::data_path(&mut f, kind & 1 == 1);
    for rec in rest.chunks(65).take(32) {
        let (&what, body) = rec.split_first().expect("non-empty chunk");
        if what & 1 == 0 {
            let mut wqe = [0u8; 64];
            wqe[..body.len()].copy_from_slice(body);
            dp.ep.post_send(&wqe);
        } else {
            let descs: Vec<_> = body
                .chunks_exact(16)
                .map(|d| {
                    let u = |i: usize| u32::from_le_bytes(d[i..i + 4].try_into().unwrap());
                    let addr = u64::from(u(0)) | u64::from(u(4)) << 32;
                    (addr, u(8), u(12) & 0xff_ffff, d[15] & 1 != 0, d[15] & 2 != 0)
                })
                .collect();
            dp.ep.post_recv_raw(&descs);
        }
    }
    std::thread::sleep(Duration::from_millis(2));
    let _ = dp.ep.poll();
});
