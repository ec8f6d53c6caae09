//! Fabric packets: decoding what arrives from another efa-emu process, and
//! its delivery to a device with a UD and an SRD queue pair in RTS.
//!
//! Input: a packet as it travels on the socket fabric.

#![no_main]

#[path = "../../tests/support/mod.rs"]
#[allow(dead_code, unused_imports)]
mod support;
#[allow(dead_code)]
mod common;

use std::time::Duration;

use efa_emu::device::fabric::Packet;
use efa_hw::admin::RegMrCmd;
use libfuzzer_sys::fuzz_target;
use support::dp::EpOpts;

fuzz_target!(|data: &[u8]| {
    let Some(p) = Packet::decode(data) else {
        return;
    };
    // What decodes encodes back to something that decodes the same.
    let again = Packet::decode(&p.encode()).expect("a decoded packet re-encodes");
    assert_eq!(again.encode(), p.encode(), "encode/decode round trip");
    let mut f = common::fake();
    let mut ud = f.ep(EpOpts::ud());
    let mut srd = f.ep(EpOpts::srd());
    let perms = RegMrCmd::LOCAL_WRITE_ENABLE.mask()
        | RegMrCmd::REMOTE_READ_ENABLE.mask()
        | RegMrCmd::REMOTE_WRITE_ENABLE.mask();
    let a = f.mr(ud.pd, 8192, perms, 0x11);
    let b = f.mr(srd.pd, 8192, perms, 0x22);
    ud.post_recv(1, &[a.sge(0, 8192)]);
    srd.post_recv(1, &[b.sge(0, 8192)]);
    f.dev.port().deliver(p);
    f.dev.port().kick();
    std::thread::sleep(Duration::from_millis(1));
    let _ = (ud.poll(), srd.poll());
});
