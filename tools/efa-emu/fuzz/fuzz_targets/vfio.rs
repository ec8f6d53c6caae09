//! vfio-user messages: framing, screening and the protocol server, with
//! the EFA model behind it, as QEMU's side of the socket sends them.
//!
//! Input: the byte stream a client writes on the socket (any number of
//! messages); the session ends when it closes.

#![no_main]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, OnceLock};

use efa_emu::device::config::Config;
use efa_emu::device::EfaDevice;
use efa_emu::vfio::VfioUserServer;
use libfuzzer_sys::fuzz_target;

struct Served {
    server: VfioUserServer,
    device: EfaDevice,
}

fn served() -> &'static Mutex<Served> {
    static S: OnceLock<Mutex<Served>> = OnceLock::new();
    S.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("efa-emu-fuzz-vfio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("socket directory");
        let server = VfioUserServer::bind(dir.join("s")).expect("socket");
        let mut cfg = Config::new(0, [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 1]);
        cfg.keep_alive_ms = 0;
        cfg.msix_vectors = 4;
        cfg.llq_pool_size = 64 * 4096;
        cfg.limits.max_uar = 4;
        cfg.limits.max_llq_size = 32 * 4096;
        let device = EfaDevice::new(cfg, server.guest_memory(), server.interrupts())
            .expect("device");
        Mutex::new(Served { server, device })
    })
}

fuzz_target!(|data: &[u8]| {
    let s = served().lock().unwrap_or_else(|e| e.into_inner());
    std::thread::scope(|scope| {
        let serving = scope.spawn(|| s.server.serve_one(&s.device));
        let c = UnixStream::connect(s.server.path()).expect("connect");
        let mut drain = c.try_clone().expect("clone");
        scope.spawn(move || std::io::copy(&mut drain, &mut std::io::sink()));
        // The server may hang up early (a message it refuses to frame).
        let _ = (&c).write_all(data);
        let _ = c.shutdown(std::net::Shutdown::Write);
        // Any end of the session is fine; a panic is not.
        let _ = serving.join().expect("the server thread panicked");
        let _ = (&c).read(&mut [0u8; 0]);
    });
});
