//! The vfio-user adapter against a real QEMU, driven with the qtest
//! accelerator: no guest runs; the test itself plays the CPU, reaching config
//! space through the 0xcf8/0xcfc ports and the BARs and RAM through qtest's
//! memory commands.
//!
//! Fails when `qemu-system-x86_64` is not on PATH (a test that passes without
//! running would hide a broken adapter); run it inside the project's Debian
//! tree, which has QEMU: `tools/env/in-tree cargo test -p efa-emu --test
//! qemu_vfio_user`, or skip it by name (`-- --skip qemu_realizes`).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use efa_emu::shmem::SharedMem;
use efa_emu::transport::{Bar, BarBacking, GuestMemory, Interrupts, PciFunction, PciIdentity};
use efa_emu::vfio::{DmaMemory, MsixVectors, SessionEnd, VfioUserServer};

const QEMU: &str = "qemu-system-x86_64";
/// Every QEMU run is bounded, whatever happens to this test.
const QEMU_TIMEOUT_S: &str = "60";

const IDENTITY: PciIdentity = PciIdentity {
    vendor: 0x1d0f,
    device: 0xefa0,
    subsystem_vendor: 0x1234,
    subsystem: 0x5678,
    revision: 5,
    class: 0x02_00_00,
};

// BAR0 registers of the scratch device.
const SCRATCH: u64 = 0x0;
const DMA_LO: u64 = 0x8;
const DMA_HI: u64 = 0xc;
/// Writing here DMA-writes `pattern()` to the DMA address, then signals
/// MSI-X vector 0.
const DMA_GO: u64 = 0x10;

fn pattern() -> Vec<u8> {
    (0..64u8).map(|i| i ^ 0x5a).collect()
}

/// A scratch register, a DMA engine and a shared 64 KiB BAR2: just enough to
/// prove the transport, nothing of EFA.
struct ScratchDevice {
    memory: Arc<DmaMemory>,
    irqs: Arc<MsixVectors>,
    bar2: Arc<SharedMem>,
    scratch: AtomicU32,
    dma_addr: AtomicU64,
    dma_done: AtomicU32,
    dma_failed: AtomicU32,
    resets: AtomicU32,
    shutdowns: AtomicU32,
}

impl PciFunction for ScratchDevice {
    fn identity(&self) -> PciIdentity {
        IDENTITY
    }

    fn bars(&self) -> Vec<Bar> {
        vec![
            Bar {
                index: 0,
                size: 16 << 10,
                is_64bit: false,
                prefetchable: false,
                io_space: false,
                backing: BarBacking::Trapped,
            },
            Bar {
                index: 2,
                size: 64 << 10,
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

    fn bar_read(&self, bar: u8, offset: u64, data: &mut [u8]) {
        let v = match (bar, offset) {
            (0, SCRATCH) => self.scratch.load(Ordering::SeqCst),
            _ => 0,
        };
        let bytes = u64::from(v).to_le_bytes();
        data.copy_from_slice(&bytes[..data.len()]);
    }

    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]) {
        let mut bytes = [0u8; 4];
        let n = data.len().min(4);
        bytes[..n].copy_from_slice(&data[..n]);
        let v = u32::from_le_bytes(bytes);
        match (bar, offset) {
            (0, SCRATCH) => self.scratch.store(v, Ordering::SeqCst),
            (0, DMA_LO) => {
                let hi = self.dma_addr.load(Ordering::SeqCst) & !0xffff_ffff;
                self.dma_addr.store(hi | u64::from(v), Ordering::SeqCst);
            }
            (0, DMA_HI) => {
                let lo = self.dma_addr.load(Ordering::SeqCst) & 0xffff_ffff;
                self.dma_addr
                    .store(u64::from(v) << 32 | lo, Ordering::SeqCst);
            }
            (0, DMA_GO) => {
                match self
                    .memory
                    .write(self.dma_addr.load(Ordering::SeqCst), &pattern())
                {
                    Ok(()) => self.dma_done.fetch_add(1, Ordering::SeqCst),
                    Err(_) => self.dma_failed.fetch_add(1, Ordering::SeqCst),
                };
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

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// QEMU under `timeout`, killed (TERM, forwarded by `timeout`) on drop and
/// if this test's thread dies first.
struct Qemu {
    child: Child,
    log: PathBuf,
}

impl Qemu {
    fn spawn(vfio_socket: &Path, qtest_socket: &Path, log: PathBuf) -> Self {
        let device = format!(
            r#"{{"driver":"vfio-user-pci","socket":{{"path":"{}","type":"unix"}},"rombar":0,"addr":"4.0"}}"#,
            vfio_socket.display()
        );
        let log_file = File::create(&log).unwrap();
        let mut cmd = Command::new("timeout");
        cmd.args(["-k", "5", QEMU_TIMEOUT_S, QEMU])
            .args(["-machine", "q35,memory-backend=mem"])
            .args(["-object", "memory-backend-memfd,id=mem,size=128M,share=on"])
            .args(["-accel", "qtest", "-qtest"])
            .arg(format!("unix:{}", qtest_socket.display()))
            .args(["-qtest-log", "/dev/null"])
            .args([
                "-display",
                "none",
                "-nodefaults",
                "-serial",
                "none",
                "-monitor",
                "none",
            ])
            .args(["-device", &device])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file);
        // SAFETY: the closure runs in the child between fork and exec and
        // only makes one async-signal-safe system call.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        Self {
            child: cmd.spawn().expect("spawn timeout/qemu"),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Ends QEMU (which the device sees as a disconnect) and waits for it.
    fn stop(&mut self) {
        // SAFETY: kill(2) on our own child's pid; it has not been reaped
        // (we reap it only below), so the pid cannot have been reused.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The qtest line protocol: one command, one "OK ..." or "FAIL ..." line.
struct Qtest {
    out: UnixStream,
    input: BufReader<UnixStream>,
}

impl Qtest {
    fn accept(listener: &UnixListener, qemu: &mut Qemu) -> Self {
        listener.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    return Self {
                        out: s.try_clone().unwrap(),
                        input: BufReader::new(s),
                    };
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("qtest accept: {e}"),
            }
            if let Ok(Some(status)) = qemu.child.try_wait() {
                panic!(
                    "QEMU exited ({status}) before connecting qtest:\n{}",
                    qemu.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "QEMU never connected qtest:\n{}",
                qemu.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn cmd(&mut self, line: &str) -> String {
        writeln!(self.out, "{line}").unwrap();
        loop {
            let mut reply = String::new();
            self.input.read_line(&mut reply).unwrap();
            let reply = reply.trim_end();
            // Interrupt notifications are interleaved only with irq_intercept,
            // which this test does not use; skip anything unexpected anyway.
            if let Some(rest) = reply.strip_prefix("OK") {
                return rest.trim().to_string();
            }
            assert!(
                !reply.starts_with("FAIL") && !reply.is_empty(),
                "qtest {line:?}: {reply:?}"
            );
        }
    }

    fn value(&mut self, line: &str) -> u64 {
        let v = self.cmd(line);
        u64::from_str_radix(v.trim_start_matches("0x"), 16)
            .unwrap_or_else(|_| panic!("{line:?} gave {v:?}"))
    }

    fn readl(&mut self, addr: u64) -> u32 {
        self.value(&format!("readl {addr:#x}")) as u32
    }

    fn writel(&mut self, addr: u64, v: u32) {
        self.cmd(&format!("writel {addr:#x} {v:#x}"));
    }

    fn read(&mut self, addr: u64, len: usize) -> Vec<u8> {
        let hex = self.cmd(&format!("read {addr:#x} {len:#x}"));
        let hex = hex.trim_start_matches("0x");
        (0..len)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    }

    /// Config space of 00:04.0 through the legacy ports.
    fn cfg_addr(&mut self, reg: u8) {
        let addr = 0x8000_0000u32 | (4 << 11) | u32::from(reg & 0xfc);
        self.cmd(&format!("outl 0xcf8 {addr:#x}"));
    }

    fn cfg_read32(&mut self, reg: u8) -> u32 {
        self.cfg_addr(reg);
        self.value("inl 0xcfc") as u32
    }

    fn cfg_write32(&mut self, reg: u8, v: u32) {
        self.cfg_addr(reg);
        self.cmd(&format!("outl 0xcfc {v:#x}"));
    }

    fn cfg_write16(&mut self, reg: u8, v: u16) {
        self.cfg_addr(reg);
        self.cmd(&format!("outw {:#x} {v:#x}", 0xcfc + u16::from(reg & 2)));
    }
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

const BAR0: u64 = 0xe000_0000;
const BAR2: u64 = 0xe010_0000;
const DMA_TARGET: u64 = 0x20_0000;
const MSI_TARGET: u64 = 0x30_0000;
const MSI_DATA: u32 = 0x4321;

#[test]
fn qemu_realizes_and_drives_the_device() {
    // Without QEMU this test cannot check anything, and a test that passes
    // without checking is worse than none: it fails. Skipping it is the
    // caller's explicit choice (`cargo test -- --skip qemu_realizes`).
    assert!(
        on_path(QEMU).is_some(),
        "{QEMU} is not on PATH: run inside the project's Debian tree \
         (tools/env/in-tree cargo test), or skip this test explicitly with \
         `cargo test -- --skip qemu_realizes_and_drives_the_device`"
    );
    let _ = env_logger::builder().is_test(true).try_init();
    let tmp = std::env::temp_dir();
    let tag = format!("efa-emu-qemu-{}", std::process::id());
    let vfio_socket = tmp.join(format!("{tag}.vfio.sock"));
    let qtest_socket = tmp.join(format!("{tag}.qtest.sock"));
    let _ = std::fs::remove_file(&qtest_socket);

    let server = VfioUserServer::bind(&vfio_socket).unwrap();
    let device = ScratchDevice {
        memory: server.guest_memory(),
        irqs: server.interrupts(),
        bar2: Arc::new(SharedMem::new("scratch-bar2", 64 << 10).unwrap()),
        scratch: AtomicU32::new(0),
        dma_addr: AtomicU64::new(0),
        dma_done: AtomicU32::new(0),
        dma_failed: AtomicU32::new(0),
        resets: AtomicU32::new(0),
        shutdowns: AtomicU32::new(0),
    };
    let qtest_listener = UnixListener::bind(&qtest_socket).unwrap();
    let stopper = server.stopper();

    thread::scope(|s| {
        let serving = s.spawn(|| server.serve_one(&device));
        let mut qemu = Qemu::spawn(&vfio_socket, &qtest_socket, tmp.join(format!("{tag}.log")));
        // Whatever fails below, the server thread must end for the scope to.
        struct StopOnUnwind(efa_emu::vfio::Stopper);
        impl Drop for StopOnUnwind {
            fn drop(&mut self) {
                if thread::panicking() {
                    self.0.stop();
                }
            }
        }
        let _guard = StopOnUnwind(stopper);
        let mut qt = Qtest::accept(&qtest_listener, &mut qemu);

        // QEMU realized the device: negotiated, read config space, mapped
        // RAM, and reset it at machine reset.
        assert_eq!(qt.cfg_read32(0x00), 0xefa0_1d0f, "vendor/device");
        assert_eq!(qt.cfg_read32(0x08), 0x0200_0005, "class/revision");
        assert_eq!(qt.cfg_read32(0x2c), 0x5678_1234, "subsystem");
        assert_ne!(qt.cfg_read32(0x04) & (1 << 20), 0, "capability list");
        let cap = qt.cfg_read32(0x34) as u8;
        let msix = qt.cfg_read32(cap);
        assert_eq!(msix & 0xff, 0x11, "MSI-X capability at {cap:#x}");
        assert_eq!((msix >> 16) & 0x7ff, 3, "4 vectors");
        assert_eq!(qt.cfg_read32(cap + 4), 0x2000, "table in BAR0 at 0x2000");
        assert_eq!(qt.cfg_read32(cap + 8), 0x3000, "PBA in BAR0 at 0x3000");
        assert!(
            device.resets.load(Ordering::SeqCst) >= 2,
            "reset on connect and by QEMU"
        );
        assert!(
            device
                .memory
                .regions()
                .iter()
                .any(|&(a, l, w)| a <= DMA_TARGET && DMA_TARGET + 64 <= a + l && w),
            "guest RAM is DMA-mapped: {:?}",
            device.memory.regions()
        );

        // BARs size and map the usual way.
        qt.cfg_write32(0x10, 0xffff_ffff);
        assert_eq!(qt.cfg_read32(0x10), 0xffff_c000, "16 KiB, 32-bit");
        qt.cfg_write32(0x18, 0xffff_ffff);
        assert_eq!(
            qt.cfg_read32(0x18),
            0xffff_000c,
            "64 KiB, 64-bit prefetchable"
        );
        qt.cfg_write32(0x10, BAR0 as u32);
        qt.cfg_write32(0x18, BAR2 as u32);
        qt.cfg_write32(0x1c, 0);
        qt.cfg_write16(0x04, 0x0002); // memory space, no bus master yet

        // A trapped register round trip.
        qt.writel(BAR0 + SCRATCH, 0xdead_beef);
        assert_eq!(qt.readl(BAR0 + SCRATCH), 0xdead_beef);
        assert!(server.trap_counts().bar_writes[0] >= 1);

        // DMA is refused until the guest allows bus mastering.
        qt.writel(BAR0 + DMA_LO, DMA_TARGET as u32);
        qt.writel(BAR0 + DMA_HI, 0);
        qt.writel(BAR0 + DMA_GO, 1);
        qt.readl(BAR0 + SCRATCH); // writes are posted: a read flushes them
        assert_eq!(device.dma_failed.load(Ordering::SeqCst), 1);
        qt.cfg_write16(0x04, 0x0006);
        qt.writel(BAR0 + DMA_GO, 1);
        qt.readl(BAR0 + SCRATCH);
        assert_eq!(device.dma_done.load(Ordering::SeqCst), 1);
        assert_eq!(
            qt.read(DMA_TARGET, 64),
            pattern(),
            "DMA write visible in guest RAM"
        );

        // The shared BAR: guest stores land in the memfd without a message,
        // and the device's stores show to the guest.
        let traps = server.trap_counts();
        qt.writel(BAR2 + 0x100, 0x1234_5678);
        assert_eq!(device.bar2.load_u32(0x100), Ok(0x1234_5678));
        device.bar2.store_u32(0x200, 0xcafe_f00d).unwrap();
        assert_eq!(qt.readl(BAR2 + 0x200), 0xcafe_f00d);
        let after = server.trap_counts();
        assert_eq!(
            (after.bar_writes[2], after.bar_reads[2]),
            (traps.bar_writes[2], traps.bar_reads[2])
        );

        // MSI-X: enable, program and unmask vector 0 (QEMU emulates the
        // table and hands over the vector's eventfd), then let the device
        // signal it: QEMU writes the message into RAM, where the test finds it.
        assert!(!device.irqs.is_set(0));
        qt.cfg_write16(cap + 2, 0x8000);
        qt.writel(BAR0 + 0x2000, MSI_TARGET as u32);
        qt.writel(BAR0 + 0x2004, 0);
        qt.writel(BAR0 + 0x2008, MSI_DATA);
        qt.writel(BAR0 + 0x200c, 0);
        wait_for("SET_IRQS for vector 0", || device.irqs.is_set(0));
        assert_eq!(qt.readl(MSI_TARGET), 0);
        qt.writel(BAR0 + DMA_GO, 1);
        qt.readl(BAR0 + SCRATCH);
        assert!(device.irqs.delivered() >= 1);
        wait_for("the MSI message in RAM", || {
            qt.readl(MSI_TARGET) == MSI_DATA
        });

        // Disabling MSI-X takes the eventfds away again.
        qt.cfg_write16(cap + 2, 0);
        wait_for("MSI-X teardown", || !device.irqs.is_set(0));

        let log = qemu.log();
        if !log.trim().is_empty() {
            eprintln!("QEMU said:\n{log}");
        }

        // QEMU going away ends the session cleanly.
        qemu.stop();
        let end = serving.join().expect("server thread");
        assert_eq!(
            end.unwrap(),
            SessionEnd::Disconnected,
            "QEMU log:\n{}",
            qemu.log()
        );
    });
    assert_eq!(device.shutdowns.load(Ordering::SeqCst), 1);
    assert!(device.memory.regions().is_empty());
    let _ = std::fs::remove_file(&qtest_socket);
}
