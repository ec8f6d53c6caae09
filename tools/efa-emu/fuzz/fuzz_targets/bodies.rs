//! The fuzz targets' bodies, one function per target, shared by the
//! libFuzzer binaries (`fuzz_targets/*.rs`) and by the regression test
//! that replays every input kept in `regressions/TARGET/`
//! (`tools/efa-emu/tests/fuzz_regressions.rs`).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use efa_emu::device::config::Config;
use efa_emu::device::fabric::Packet;
use efa_emu::device::EfaDevice;
use efa_emu::vfio::VfioUserServer;

#[allow(unused_imports)]
use crate::common;
use crate::support::dp::EpOpts;
use efa_hw::admin::RegMrCmd;

/// Admin entries: decoding and execution of every command, as the model
/// fetches them from the admin queue.
///
/// Input: entries of 64 bytes, each `opcode, flags, payload...` (the
/// header's command id and phase are the fake driver's, so that entries
/// are executed rather than refused for their phase); at most 16.
pub fn admin(data: &[u8]) {
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
}

/// The data path: send WQEs from the LLQ and receive descriptors from the
/// RQ ring, on a UD or SRD queue pair in RTS with a registered buffer and
/// an address handle (messages go to the device itself).
///
/// Input: byte 0 picks UD (even) or SRD (odd); then records of 65 bytes:
/// a kind byte (even: a 64-byte send WQE written to the LLQ and rung; odd:
/// four 16-byte receive descriptors written to the RQ ring and rung); at
/// most 32.
pub fn datapath(data: &[u8]) {
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
                    (
                        addr,
                        u(8),
                        u(12) & 0xff_ffff,
                        d[15] & 1 != 0,
                        d[15] & 2 != 0,
                    )
                })
                .collect();
            dp.ep.post_recv_raw(&descs);
        }
    }
    std::thread::sleep(Duration::from_millis(2));
    let _ = dp.ep.poll();
}

/// Fabric packets: decoding what arrives from another efa-emu process, and
/// its delivery to a device with a UD and an SRD queue pair in RTS.
///
/// Input: a packet as it travels on the socket fabric.
pub fn fabric(data: &[u8]) {
    // Descriptors (packet version 3's second form) are checked against a
    // region offered as a receiver maps one (`share::accept`, the
    // bounds check every descriptor goes through), and stand for as many
    // bytes when they pass.
    let offered = offered();
    let Some(p) = Packet::decode_with(data, &mut |descs| {
        let len = descs.iter().map(|d| d.len as usize).sum();
        descs
            .iter()
            .all(|d| d.region == 0 && offered.range(d.offset, d.len as usize).is_some())
            .then(|| vec![0xcd; len].into())
    }) else {
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
}

/// A sealed memfd of [`OFFERED`] bytes, offered and accepted as a peer's
/// guest memory is (once per process: mapping it per input would be most
/// of the work).
fn offered() -> &'static efa_emu::device::fabric::share::Mapped {
    use efa_emu::device::fabric::share;
    static M: std::sync::OnceLock<share::Mapped> = std::sync::OnceLock::new();
    M.get_or_init(|| {
        let mem = efa_emu::shmem::SharedMem::new("fuzz-offered", OFFERED).expect("a memfd");
        let fd = mem.fd().try_clone_to_owned().expect("a descriptor");
        // SAFETY: getpid/getuid have no preconditions.
        let me = unsafe { (libc::getpid(), libc::getuid()) };
        share::accept(&fd, 0, OFFERED as u64, me).expect("our own sealed memfd is accepted")
    })
}

/// Bytes of the region [`fabric`] treats as offered.
pub const OFFERED: usize = 1 << 20;

/// The fuzz targets' fabric key, and the GIDs of their peer map.
pub const UDP_KEY: [u8; 32] = [0x42; 32];
pub const UDP_SRC: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 9, 9, 9, 9, 9, 0, 1];
pub const UDP_DST: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 9, 9, 9, 9, 9, 0, 2];

/// UDP datagrams through a receiving port's checks (size, envelope, MAC,
/// sender, replay window, packet, GID), in one window state.
///
/// Input: datagrams, each a 2-byte little-endian length and its bytes.
/// The seeds are sealed with [`UDP_KEY`], so that mutations get past the
/// MAC only where they keep it right: the checks after it are reached
/// from the seeds.
pub fn udp(data: &[u8]) {
    use efa_emu::device::fabric::auth::{self, FabricKey, Reject};
    use efa_emu::device::fabric::udp;
    let key = FabricKey::new(UDP_KEY);
    let any = "127.0.0.1:1".parse().expect("an address");
    let peers = std::sync::Arc::new([(UDP_SRC, any), (UDP_DST, any)].into());
    let mut windows = std::collections::HashMap::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let d = &rest[2..2 + n];
        rest = &rest[2 + n..];
        let first = udp::screen(&key, &peers, &mut windows, d, UDP_DST);
        match &first {
            Ok(p) => {
                assert_eq!(p.dst_gid, UDP_DST);
                assert!(d.len() <= auth::MAX_DATAGRAM);
                // The same datagram again is a replay, whatever it holds.
                assert_eq!(
                    udp::screen(&key, &peers, &mut windows, d, UDP_DST).err(),
                    Some(Reject::Replay)
                );
            }
            Err(Reject::Oversized) => assert!(d.len() > auth::MAX_DATAGRAM),
            Err(_) => {}
        }
    }
}

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
        let device =
            EfaDevice::new(cfg, server.guest_memory(), server.interrupts()).expect("device");
        Mutex::new(Served { server, device })
    })
}

/// vfio-user messages: framing, screening and the protocol server, with
/// the EFA model behind it, as QEMU's side of the socket sends them.
///
/// Input: the byte stream a client writes on the socket (any number of
/// messages); the session ends when it closes.
pub fn vfio(data: &[u8]) {
    // The server may hang up before the client wrote everything: an
    // error for the client, not a signal (libFuzzer's main, unlike
    // Rust's, leaves SIGPIPE's default action in place).
    static NO_SIGPIPE: std::sync::Once = std::sync::Once::new();
    // SAFETY: ignoring a signal touches no memory of this process.
    NO_SIGPIPE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
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
}
