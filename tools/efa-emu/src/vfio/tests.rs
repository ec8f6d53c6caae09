//! The adapter against an in-process client: the crate's own client for the
//! happy path, raw bytes for hostile ones. QEMU itself is in
//! `tests/qemu_vfio_user.rs`.

use super::*;
use crate::transport::{GuestMemory, PciIdentity};
use std::io::{Read, Write};
use std::sync::atomic::AtomicU32;
use std::time::Duration;

const ID: PciIdentity = PciIdentity {
    vendor: 0x1d0f,
    device: 0xefa1,
    subsystem_vendor: 0x1d0f,
    subsystem: 0xefa1,
    revision: 2,
    class: 0x02_00_00,
};

/// BAR0: 0x0 scratch, 0x8 DMA address, 0x10 go (DMA 4 bytes of the scratch
/// value, then signal vector 0). BAR2: 64 KiB shared.
struct Device {
    memory: Arc<DmaMemory>,
    irqs: Arc<MsixVectors>,
    bar2: Arc<SharedMem>,
    scratch: AtomicU32,
    dma_addr: AtomicU64,
    dma_failures: AtomicU32,
    resets: AtomicU32,
    shutdowns: AtomicU32,
}

impl Device {
    fn new(server: &VfioUserServer) -> Self {
        Self {
            memory: server.guest_memory(),
            irqs: server.interrupts(),
            bar2: Arc::new(SharedMem::new("bar2", 65536).unwrap()),
            scratch: AtomicU32::new(0),
            dma_addr: AtomicU64::new(0),
            dma_failures: AtomicU32::new(0),
            resets: AtomicU32::new(0),
            shutdowns: AtomicU32::new(0),
        }
    }
}

impl PciFunction for Device {
    fn identity(&self) -> PciIdentity {
        ID
    }
    fn bars(&self) -> Vec<Bar> {
        vec![
            Bar {
                index: 0,
                size: 16384,
                is_64bit: false,
                prefetchable: false,
                io_space: false,
                backing: BarBacking::Trapped,
            },
            Bar {
                index: 2,
                size: 65536,
                is_64bit: true,
                prefetchable: true,
                io_space: false,
                backing: BarBacking::Shared(self.bar2.clone()),
            },
        ]
    }
    fn msix_vectors(&self) -> u16 {
        4
    }
    fn bar_read(&self, _bar: u8, offset: u64, data: &mut [u8]) {
        let v = match offset {
            0 => u64::from(self.scratch.load(Ordering::SeqCst)),
            _ => 0,
        };
        data.copy_from_slice(&v.to_le_bytes()[..data.len()]);
    }
    fn bar_write(&self, _bar: u8, offset: u64, data: &[u8]) {
        let mut v = [0u8; 8];
        v[..data.len()].copy_from_slice(data);
        let v = u64::from_le_bytes(v);
        match offset {
            0 => self.scratch.store(v as u32, Ordering::SeqCst),
            8 => self.dma_addr.store(v, Ordering::SeqCst),
            0x10 => {
                let word = self.scratch.load(Ordering::SeqCst).to_le_bytes();
                if self
                    .memory
                    .write(self.dma_addr.load(Ordering::SeqCst), &word)
                    .is_err()
                {
                    self.dma_failures.fetch_add(1, Ordering::SeqCst);
                }
                self.irqs.signal(0);
            }
            _ => {}
        }
    }
    fn reset(&self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
    }
    fn shutdown(&self) {
        self.shutdowns.fetch_add(1, Ordering::SeqCst);
    }
}

fn socket_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("efa-emu-unit-{}-{name}.sock", std::process::id()))
}

fn eventfd() -> File {
    // SAFETY: eventfd(2) with valid flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor nothing else owns.
    unsafe { File::from_raw_fd(fd) }
}

#[test]
fn a_client_sees_the_device_and_the_device_reaches_the_client() {
    let server = VfioUserServer::bind(socket_path("happy")).unwrap();
    let device = Device::new(&server);
    thread::scope(|s| {
        let serving = s.spawn(|| server.serve_one(&device));
        let mut client = vfio_user::Client::new(server.path()).unwrap();

        let mut cfg = [0u8; 256];
        client
            .region_read(VFIO_PCI_CONFIG_REGION_INDEX, 0, &mut cfg)
            .unwrap();
        assert_eq!(&cfg[0..4], &[0x0f, 0x1d, 0xa1, 0xef]);
        assert_eq!(cfg[0x34], 0xb0);
        assert_eq!(cfg[0xb0], 0x11);
        assert_eq!(
            u32::from_le_bytes(cfg[0x18..0x1c].try_into().unwrap()),
            0b1100,
            "64-bit prefetchable"
        );

        let bar2 = client.region(2).unwrap();
        assert_eq!(bar2.size, 65536);
        assert_eq!(bar2.sparse_areas.len(), 1);
        assert!(bar2.file_offset.is_some(), "the memfd came along");
        assert_eq!(client.region(1).unwrap().size, 0);

        client
            .region_write(0, 0, &0x1234_5678u32.to_le_bytes())
            .unwrap();
        let mut word = [0u8; 4];
        client.region_read(0, 0, &mut word).unwrap();
        assert_eq!(u32::from_le_bytes(word), 0x1234_5678);
        client.region_read(0, 0x3000, &mut word).unwrap();
        assert_eq!(word, [0; 4], "the PBA shows nothing pending");

        // Guest RAM: 1 MiB at guest 0x100000.
        let ram = SharedMem::new("ram", 1 << 20).unwrap();
        client
            .dma_map(0, 0x10_0000, 1 << 20, ram.fd().as_raw_fd())
            .unwrap();
        let ev = eventfd();
        let flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
        client
            .set_irqs(VFIO_PCI_MSIX_IRQ_INDEX, flags, 0, 1, &[ev.as_raw_fd()])
            .unwrap();
        assert!(device.irqs.is_set(0));

        client
            .region_write(0, 8, &0x10_0040u64.to_le_bytes())
            .unwrap();
        client.region_write(0, 0x10, &[1, 0, 0, 0]).unwrap();
        assert_eq!(
            device.dma_failures.load(Ordering::SeqCst),
            1,
            "no bus mastering yet"
        );
        client
            .region_write(VFIO_PCI_CONFIG_REGION_INDEX, 4, &[0x06, 0])
            .unwrap();
        client.region_write(0, 0x10, &[1, 0, 0, 0]).unwrap();
        assert_eq!(ram.load_u32(0x40), Ok(0x1234_5678));
        let mut count = [0u8; 8];
        (&ev).read_exact(&mut count).unwrap();
        assert_eq!(u64::from_ne_bytes(count), 2);

        device.bar2.store_u32(0x80, 0xfeed).unwrap();
        client.region_read(2, 0x80, &mut word).unwrap();
        assert_eq!(
            u32::from_le_bytes(word),
            0xfeed,
            "a trapped read of a shared BAR"
        );

        client.dma_unmap(0x10_0000, 1 << 20).unwrap();
        client.region_write(0, 0x10, &[1, 0, 0, 0]).unwrap();
        assert_eq!(device.dma_failures.load(Ordering::SeqCst), 2, "unmapped");

        client.reset().unwrap();
        client.shutdown().unwrap();
        assert_eq!(serving.join().unwrap().unwrap(), SessionEnd::Disconnected);
    });
    assert_eq!(
        device.resets.load(Ordering::SeqCst),
        2,
        "on connect and on DEVICE_RESET"
    );
    assert_eq!(device.shutdowns.load(Ordering::SeqCst), 1);
    assert!(!device.irqs.is_set(0) && device.memory.regions().is_empty());
    let counts = server.trap_counts();
    assert_eq!(counts.bar_reads[2], 1);
    assert!(counts.bar_writes[0] >= 5);
}

/// Sends one raw message, returns the reply header `(flags, errno)`.
fn raw(stream: &mut UnixStream, command: u16, flags: u32, body: &[u8]) -> (u32, u32) {
    let mut m = Vec::new();
    m.extend_from_slice(&9u16.to_le_bytes());
    m.extend_from_slice(&command.to_le_bytes());
    m.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(body);
    stream.write_all(&m).unwrap();
    let mut h = [0u8; 16];
    stream.read_exact(&mut h).unwrap();
    let size = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
    let mut rest = vec![0; size - 16];
    stream.read_exact(&mut rest).unwrap();
    let word = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
    (word(8), word(12))
}

fn region_access(region: u32, offset: u64, count: u32) -> Vec<u8> {
    [
        &offset.to_le_bytes()[..],
        &region.to_le_bytes(),
        &count.to_le_bytes(),
    ]
    .concat()
}

#[test]
fn hostile_messages_get_errors_and_bad_framing_ends_the_session() {
    let server = VfioUserServer::bind(socket_path("hostile")).unwrap();
    let device = Device::new(&server);
    thread::scope(|s| {
        let serving = s.spawn(|| server.serve_one(&device));
        let mut c = UnixStream::connect(server.path()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let einval = libc::EINVAL as u32;
        let failed = wire::TYPE_REPLY | wire::ERROR;

        assert_eq!(
            raw(&mut c, wire::VERSION, 0, b"\0\0\x01\0{}"),
            (failed, einval),
            "no NUL"
        );
        assert_eq!(
            raw(&mut c, wire::VERSION, 0, b"\0"),
            (failed, einval),
            "short"
        );
        assert_eq!(
            raw(&mut c, 0x77, 0, &[0; 100]),
            (failed, libc::EOPNOTSUPP as u32)
        );
        assert_eq!(
            raw(&mut c, wire::REGION_READ, 0, &region_access(0, 0, u32::MAX)),
            (failed, einval)
        );
        // Reaches the backend: the errno comes from there.
        assert_eq!(
            raw(&mut c, wire::REGION_READ, 0, &region_access(0, 16380, 8)),
            (failed, einval)
        );
        assert_eq!(
            raw(&mut c, wire::REGION_READ, 0, &region_access(0, 0, 3)),
            (failed, einval)
        );
        assert_eq!(
            raw(&mut c, wire::REGION_READ, 0, &region_access(0, 0x1ffc, 8)),
            (failed, einval)
        );
        assert_eq!(
            raw(&mut c, wire::REGION_READ, 0, &region_access(5, 0, 4)),
            (failed, einval)
        );
        assert_eq!(
            raw(&mut c, wire::REGION_READ, 0, &region_access(99, 0, 4)),
            (failed, einval)
        );
        let irqs = [5u32, 0x24, 2, 3, 9]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect::<Vec<u8>>();
        assert_eq!(
            raw(&mut c, wire::DEVICE_SET_IRQS, 0, &irqs),
            (failed, einval),
            "past the table"
        );
        let unmap = [
            &24u32.to_le_bytes()[..],
            &0u32.to_le_bytes(),
            &1u64.to_le_bytes(),
            &u64::MAX.to_le_bytes(),
        ]
        .concat();
        assert_eq!(
            raw(&mut c, wire::DMA_UNMAP, 0, &unmap),
            (failed, einval),
            "wrapping range"
        );
        let map = [&32u32.to_le_bytes()[..], &3u32.to_le_bytes(), &[0; 24]].concat();
        assert_eq!(
            raw(&mut c, wire::DMA_MAP, 0, &map),
            (wire::TYPE_REPLY, 0),
            "no fd: accepted, unreachable"
        );
        // The crate refuses a write to a region it does not have before
        // reading the data, which it then took for the next header: here
        // a VERSION of size 0, whose length underflowed (found by the
        // vfio fuzz target, regressions/vfio/crash-f02e7352...).
        let write = [region_access(99, 0, 4), vec![1, 0, 1, 0]].concat();
        assert_eq!(
            raw(&mut c, wire::REGION_WRITE, 0, &write),
            (failed, einval),
            "write to no region"
        );
        let write = [region_access(u32::MAX, 0, 4), vec![1, 0, 1, 0]].concat();
        assert_eq!(
            raw(&mut c, wire::REGION_WRITE, wire::NO_REPLY, &write),
            (failed, einval),
            "write to no region, no reply asked"
        );
        // Still healthy.
        let (flags, _) = raw(&mut c, wire::REGION_READ, 0, &region_access(7, 0, 4));
        assert_eq!(flags, wire::TYPE_REPLY);

        // A size below the header cannot be framed: the session ends.
        c.write_all(&[0, 0, 9, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
            .unwrap();
        assert!(matches!(
            serving.join().unwrap(),
            Err(VfioError::Protocol(_))
        ));
    });
    assert_eq!(device.shutdowns.load(Ordering::SeqCst), 1);
}

#[test]
fn a_stopper_ends_waiting_and_running_sessions() {
    let server = VfioUserServer::bind(socket_path("stop")).unwrap();
    let device = Device::new(&server);
    let stopper = server.stopper();
    thread::scope(|s| {
        let serving = s.spawn(|| server.serve_one(&device));
        let client = vfio_user::Client::new(server.path()).unwrap();
        stopper.stop();
        assert_eq!(serving.join().unwrap().unwrap(), SessionEnd::Stopped);
        drop(client);
    });
    assert_eq!(server.serve_one(&device).unwrap(), SessionEnd::Stopped);
    assert_eq!(device.shutdowns.load(Ordering::SeqCst), 1);
}

#[test]
fn a_stale_socket_is_replaced_and_a_live_one_is_not() {
    let path = socket_path("stale");
    let stale = UnixListener::bind(&path).unwrap();
    drop(stale);
    let server = VfioUserServer::bind(&path).unwrap();
    assert_eq!(
        VfioUserServer::bind(&path).err().map(|e| e.kind()),
        Some(io::ErrorKind::AddrInUse)
    );
    drop(server);
    assert!(!path.exists(), "the socket is removed with the server");
}

#[test]
fn impossible_layouts_are_refused_before_accepting() {
    struct Bad(Vec<Bar>, u16);
    impl PciFunction for Bad {
        fn identity(&self) -> PciIdentity {
            ID
        }
        fn bars(&self) -> Vec<Bar> {
            self.0.clone()
        }
        fn msix_vectors(&self) -> u16 {
            self.1
        }
        fn bar_read(&self, _: u8, _: u64, _: &mut [u8]) {}
        fn bar_write(&self, _: u8, _: u64, _: &[u8]) {}
        fn reset(&self) {}
        fn shutdown(&self) {}
    }
    let bar = |index, size, is_64bit| Bar {
        index,
        size,
        is_64bit,
        prefetchable: false,
        io_space: false,
        backing: BarBacking::Trapped,
    };
    let shm = Arc::new(SharedMem::new("small", 4096).unwrap());
    let cases = [
        Bad(vec![bar(5, 4096, true)], 0),
        Bad(vec![bar(0, 4096, true), bar(1, 4096, false)], 0),
        Bad(vec![bar(0, 6000, false)], 0),
        Bad(vec![bar(2, 16384, false)], 1),
        Bad(vec![bar(0, 4096, false)], 1),
        Bad(
            vec![Bar {
                backing: BarBacking::Shared(shm.clone()),
                ..bar(0, 8192, false)
            }],
            0,
        ),
    ];
    let server = VfioUserServer::bind(socket_path("layout")).unwrap();
    for case in &cases {
        assert!(matches!(server.serve_one(case), Err(VfioError::Layout(_))));
    }
}

#[test]
fn random_well_framed_messages_never_bring_the_server_down() {
    let server = VfioUserServer::bind(socket_path("random")).unwrap();
    let device = Device::new(&server);
    thread::scope(|s| {
        let serving = s.spawn(|| server.serve_one(&device));
        let c = UnixStream::connect(server.path()).unwrap();
        let mut drain = c.try_clone().unwrap();
        s.spawn(move || std::io::copy(&mut drain, &mut std::io::sink()));
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut out = &c;
        for _ in 0..5000 {
            let command = (next() % 16) as u16;
            let len = match next() % 4 {
                0 => 0,
                1 => 16,
                2 => 20 + (next() % 16) as usize,
                _ => (next() % 200) as usize,
            };
            let mut body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Keep region accesses small often enough to reach the backend.
            if body.len() >= 16 && next() % 2 == 0 {
                body[8..12].copy_from_slice(&((next() % 9) as u32).to_le_bytes());
                body[12..16].copy_from_slice(&(1u32 << (next() % 4)).to_le_bytes());
                body[0..8].copy_from_slice(&(next() % 0x5000).to_le_bytes());
            }
            let flags = [0, 1, wire::NO_REPLY, next() as u32][(next() % 4) as usize];
            let mut m = Vec::new();
            m.extend_from_slice(&(next() as u16).to_le_bytes());
            m.extend_from_slice(&command.to_le_bytes());
            m.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
            m.extend_from_slice(&flags.to_le_bytes());
            m.extend_from_slice(&0u32.to_le_bytes());
            m.extend_from_slice(&body);
            out.write_all(&m).unwrap();
        }
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let end = serving.join().expect("no panic");
        assert!(matches!(end, Ok(SessionEnd::Disconnected)), "{end:?}");
    });
    assert_eq!(device.shutdowns.load(Ordering::SeqCst), 1);
    let t = server.trap_counts();
    let reached = t.config_reads
        + t.config_writes
        + t.bar_reads.iter().sum::<u64>()
        + t.bar_writes.iter().sum::<u64>();
    assert!(reached > 20, "only {reached} accesses reached the backend");
}

#[test]
fn the_socket_is_private_and_other_users_are_hung_up_on() {
    use crate::as_user::{self, Outcome};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let server = VfioUserServer::bind(socket_path("peer")).unwrap();
    let mode = std::fs::metadata(server.path()).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Open the way, so that only the peer check is left.
    std::fs::set_permissions(server.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let device = Device::new(&server);
    thread::scope(|s| {
        let serving = s.spawn(|| server.serve_one(&device));
        match as_user::connect_and_wait_for_hangup(server.path()) {
            Outcome::CannotSwitch => eprintln!("skipped the other user: not root"),
            Outcome::Exited(code) => assert_eq!(code, 0, "the server hung up on the other user"),
        }
        let client = vfio_user::Client::new(server.path()).unwrap();
        client.shutdown().unwrap();
        assert_eq!(serving.join().unwrap().unwrap(), SessionEnd::Disconnected);
    });
    assert_eq!(device.resets.load(Ordering::SeqCst), 1, "one session: ours");
}

#[test]
fn the_socket_appears_only_when_a_connect_succeeds() {
    // Whoever waits for the path (QEMU, tools/vm/qemu, the process tests)
    // connects at once; between bind() and listen() that is refused.
    for i in 0..2000 {
        let path = socket_path(&format!("appears{i}"));
        let watcher = {
            let path = path.clone();
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                while !path.exists() {
                    assert!(t.elapsed() < Duration::from_secs(10), "no socket");
                    std::hint::spin_loop();
                }
                UnixStream::connect(&path).map(drop)
            })
        };
        let server = VfioUserServer::bind(&path).unwrap();
        assert!(
            watcher.join().unwrap().is_ok(),
            "round {i}: connect refused"
        );
        drop(server);
    }
}

#[test]
fn a_socket_directory_another_user_could_replace_the_socket_in_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("efa-emu-unit-{}-open", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("efa0.sock");
    // Writable by others and not sticky: another user could rename our
    // socket away and put theirs (or a link to theirs) at the path.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = VfioUserServer::bind(&path).err().expect("0777 refused");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(!path.exists(), "nothing placed");
    // Sticky, as /tmp: nobody else can remove or rename what we place.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    drop(VfioUserServer::bind(&path).unwrap());
    // Another user's directory: its owner can do anything in it.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let other = crate::as_user::OTHER_UID;
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: chown(2) of a path we created, with a NUL-terminated copy.
    if unsafe { libc::chown(c.as_ptr(), other, other) } == 0 {
        let e = VfioUserServer::bind(&path)
            .err()
            .expect("another user's directory refused");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    } else {
        eprintln!("skipped another user's directory: not root");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nothing_planted_beside_the_socket_redirects_or_stops_the_bind() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // Names an attacker in the socket's directory could have guessed from
    // the path and our pid (the temporary name before 2nd round fix 5):
    // a directory there made the bind fail; a link there was followed by
    // the chmod.
    let path = socket_path("planted");
    let mut guess = path.clone().into_os_string();
    guess.push(format!(".{}.binding", std::process::id()));
    let guess = PathBuf::from(guess);
    std::fs::create_dir(&guess).unwrap();
    let server = VfioUserServer::bind(&path);
    std::fs::remove_dir(&guess).unwrap();
    let server = server.expect("a directory at a guessable name does not stop the bind");
    drop(server);
    let target = socket_path("planted-target");
    std::fs::write(&target, b"x").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&target, &guess).unwrap();
    let server = VfioUserServer::bind(&path).unwrap();
    let meta = std::fs::symlink_metadata(server.path()).unwrap();
    assert!(meta.file_type().is_socket(), "the path is our socket");
    assert_eq!(meta.mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(&target).unwrap().mode() & 0o777,
        0o644,
        "the chmod did not follow a link"
    );
    assert!(
        std::fs::symlink_metadata(&guess).is_ok(),
        "the plant is untouched"
    );
    drop(server);
    let _ = std::fs::remove_file(&guess);
    let _ = std::fs::remove_file(&target);
}
