//! The efa-emu binary as the harness sees it: however it ends, the last
//! line on stderr is the summary line and the status says how (0 clean,
//! 70 a panic in any thread, 1 an error); its sockets are private; the
//! control window is off unless asked for.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const EMU: &str = env!("CARGO_BIN_EXE_efa-emu");
const PATIENCE: Duration = Duration::from_secs(10);
const CLEAN: &str = "efa-emu: summary: exit=clean guest_bug=0 dma_failed=0 qp_error=0 \
                     admin_error=0 injected=0 fabric_rejected=0 suppressed=0";
/// BAR0 offset of the control window's COMMAND and MAGIC registers.
const COMMAND: u64 = 0x1018;
const MAGIC: u64 = 0x1000;

struct Emu {
    child: Child,
    dir: PathBuf,
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("efa-emu-proc-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
    d
}

impl Emu {
    /// Starts efa-emu on a socket in a fresh directory and waits until it
    /// listens.
    fn start(name: &str, args: &[&str]) -> Self {
        let dir = dir(name);
        let log = std::fs::File::create(dir.join("stderr")).unwrap();
        let child = Command::new(EMU)
            .arg("--socket")
            .arg(dir.join("efa.sock"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut emu = Self { child, dir };
        let t = Instant::now();
        while !emu.socket().exists() {
            if let Some(st) = emu.child.try_wait().unwrap() {
                panic!("efa-emu exited ({st}): {}", emu.stderr());
            }
            assert!(t.elapsed() < PATIENCE, "no socket");
            std::thread::sleep(Duration::from_millis(10));
        }
        emu
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("efa.sock")
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    /// Waits for the exit: (status, stderr).
    fn wait(mut self) -> (i32, String) {
        let t = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if t.elapsed() > PATIENCE {
                let _ = self.child.kill();
                panic!("efa-emu did not exit: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let text = self.stderr();
        let _ = std::fs::remove_dir_all(&self.dir);
        (status.code().expect("an exit, not a signal"), text)
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as libc::pid_t, sig) },
            0
        );
    }
}

fn last_line(text: &str) -> &str {
    text.lines().last().unwrap_or_default()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn sigterm_is_a_clean_exit_with_the_summary_last_and_the_sockets_private() {
    let emu = Emu::start("term", &[]);
    assert_eq!(mode(&emu.socket()), 0o600);
    // The device's fabric socket comes up after the vfio-user socket.
    let t = Instant::now();
    let fabric = loop {
        let f: Vec<PathBuf> = std::fs::read_dir(&emu.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("efa-"))
            .filter(|p| mode(p) == 0o600)
            .collect();
        if f.len() == 1 {
            break f;
        }
        assert!(t.elapsed() < PATIENCE, "no private fabric socket: {f:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(mode(&fabric[0]) & 0o077 == 0);
    emu.signal(libc::SIGTERM);
    let (code, text) = emu.wait();
    assert_eq!(code, 0, "{text}");
    assert_eq!(last_line(&text), CLEAN, "{text}");
}

#[test]
fn sigterm_with_a_health_file_is_clean_too() {
    // The health file's writer thread must not take the signal's default
    // action (it did once: status 143, no summary).
    let d = dir("term-health-file");
    let health = d.join("health");
    let emu = Emu::start("term-health", &["--health-file", health.to_str().unwrap()]);
    emu.signal(libc::SIGTERM);
    let (code, text) = emu.wait();
    assert_eq!((code, last_line(&text)), (0, CLEAN), "{text}");
    assert_eq!(std::fs::read_to_string(&health).unwrap().trim_end(), CLEAN);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_fabric_directory_it_creates_is_private() {
    let d = dir("fabric");
    let fabric = d.join("a/b");
    let emu = Emu::start("fabric-emu", &["--fabric", fabric.to_str().unwrap()]);
    // The device, and with it the fabric directory, comes up after the
    // vfio-user socket that start() waits for.
    let t = Instant::now();
    while !fabric.exists() {
        assert!(t.elapsed() < PATIENCE, "no fabric directory");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!((mode(&d.join("a")), mode(&fabric)), (0o700, 0o700));
    emu.signal(libc::SIGINT);
    assert_eq!(emu.wait().0, 0);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_panic_in_a_device_thread_ends_the_process_with_status_70() {
    let d = dir("panic-health");
    let health = d.join("health");
    let emu = Emu::start(
        "panic",
        &["--test-control", "--health-file", health.to_str().unwrap()],
    );
    let running = std::fs::read_to_string(&health).unwrap();
    assert!(
        running.starts_with("efa-emu: summary: exit=running "),
        "{running}"
    );
    let mut client = vfio_user::Client::new(&emu.socket()).unwrap();
    client
        .region_write(0, COMMAND, &6u32.to_le_bytes())
        .unwrap();
    let (code, text) = emu.wait();
    drop(client);
    assert_eq!(code, 70, "{text}");
    assert!(
        text.contains("efa-emu: thread 'efa0-data' panicked"),
        "says which thread: {text}"
    );
    let last = last_line(&text);
    assert!(
        last.starts_with("efa-emu: summary: exit=panic guest_bug=0 "),
        "{text}"
    );
    assert_eq!(std::fs::read_to_string(&health).unwrap().trim_end(), last);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_control_window_is_off_by_default() {
    let emu = Emu::start("off", &[]);
    let mut client = vfio_user::Client::new(&emu.socket()).unwrap();
    let mut magic = [0u8; 4];
    client.region_read(0, MAGIC, &mut magic).unwrap();
    assert_eq!(&magic, b"EEMD");
    for cmd in [6u32, 1] {
        client.region_write(0, COMMAND, &cmd.to_le_bytes()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    client.region_read(0, MAGIC, &mut magic).unwrap();
    assert_eq!(&magic, b"EEMD", "still there");
    client.shutdown().unwrap();
    let (code, text) = emu.wait();
    assert_eq!((code, last_line(&text)), (0, CLEAN), "{text}");
}

#[test]
fn an_exit_the_guest_asks_for_has_its_own_status() {
    let emu = Emu::start("exit", &["--test-control"]);
    let mut client = vfio_user::Client::new(&emu.socket()).unwrap();
    let mut magic = [0u8; 4];
    client.region_read(0, MAGIC, &mut magic).unwrap();
    assert_eq!(&magic, b"EEMU");
    client
        .region_write(0, COMMAND, &1u32.to_le_bytes())
        .unwrap();
    let (code, text) = emu.wait();
    let requested = CLEAN.replace("exit=clean", "exit=requested");
    assert_eq!((code, last_line(&text)), (75, requested.as_str()), "{text}");
}

#[test]
fn errors_exit_with_status_1_and_the_summary_last() {
    let (code, text) = Emu {
        child: Command::new(EMU)
            .arg("--bogus")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
        dir: dir("bogus"),
    }
    .wait_piped();
    assert_eq!(code, 1);
    assert!(
        last_line(&text).starts_with("efa-emu: summary: exit=error "),
        "{text}"
    );

    // A socket directory, then a fabric directory, other users can write
    // to: each refused, the summary last.
    let open = dir("open");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    for fabric_open in [false, true] {
        let own = dir("own");
        let (args, refusal) = if fabric_open {
            let fabric = vec![own.join("efa.sock"), "--fabric".into(), open.clone()];
            (fabric, "writable by other users")
        } else {
            let socket = vec![open.join("efa.sock"), "--no-fabric".into()];
            (socket, "lets another user replace the socket")
        };
        let (code, text) = Emu {
            child: Command::new(EMU)
                .arg("--socket")
                .args(&args)
                .stderr(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
            dir: own,
        }
        .wait_piped();
        assert_eq!(code, 1, "{text}");
        assert!(text.contains(refusal), "{text}");
        assert!(
            last_line(&text).starts_with("efa-emu: summary: exit=error "),
            "{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&open);
}

impl Emu {
    /// Like [`Emu::wait`] for a child whose stderr is a pipe.
    fn wait_piped(self) -> (i32, String) {
        let out = self.child.wait_with_output().unwrap();
        let _ = std::fs::remove_dir_all(&self.dir);
        (
            out.status.code().expect("an exit"),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

#[test]
fn a_cpu_list_it_cannot_use_is_an_error() {
    for list in ["x", "1-", "3-1", "0,", "1024"] {
        let (code, text) = run_to_end("cpus", &["--data-cpus", list]);
        assert_eq!(code, 1, "{list}: {text}");
        assert!(text.contains("--data-cpus: bad CPU list"), "{list}: {text}");
        assert!(
            last_line(&text).starts_with("efa-emu: summary: exit=error "),
            "{list}: {text}"
        );
    }
}

/// Runs efa-emu to its end (it must end by itself): (status, stderr).
fn run_to_end(name: &str, args: &[&str]) -> (i32, String) {
    let d = dir(name);
    let log = std::fs::File::create(d.join("stderr")).unwrap();
    let mut child = Command::new(EMU)
        .arg("--socket")
        .arg(d.join("efa.sock"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let t = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("efa-emu did not end");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let text = std::fs::read_to_string(d.join("stderr")).unwrap();
    let _ = std::fs::remove_dir_all(&d);
    (st.code().expect("an exit"), text)
}

#[test]
fn the_udp_fabric_binds_beyond_loopback_only_with_a_private_key() {
    let error = "efa-emu: summary: exit=error guest_bug=0 dma_failed=0 qp_error=0 \
                 admin_error=0 injected=0 fabric_rejected=0 suppressed=0";
    let (code, text) = run_to_end("udp-nokey", &["--udp", "0.0.0.0:0"]);
    assert_eq!((code, last_line(&text)), (1, error), "{text}");
    assert!(
        text.contains("binding 0.0.0.0:0, not a loopback address, needs a fabric key"),
        "{text}"
    );
    let d = dir("udp-key");
    let key = d.join("key");
    std::fs::write(&key, "ab".repeat(32)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let k = key.to_str().unwrap();
    let (code, text) = run_to_end("udp-key-open", &["--udp", "0.0.0.0:0", "--fabric-key", k]);
    assert_eq!((code, last_line(&text)), (1, error), "{text}");
    assert!(
        text.contains("mode 640") && text.contains("chmod 600"),
        "{text}"
    );
    // With the key private: it binds, and serves until stopped.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let emu = Emu::start("udp-key-ok", &["--udp", "127.0.0.1:0", "--fabric-key", k]);
    emu.signal(libc::SIGTERM);
    let (code, text) = emu.wait();
    assert_eq!((code, last_line(&text)), (0, CLEAN), "{text}");
    assert!(
        text.contains("fabric: UDP datagrams received: accepted=0"),
        "{text}"
    );
    // A capture: a private pcap file, never one that exists.
    let cap = d.join("efa.pcap");
    let c = cap.to_str().unwrap();
    let emu = Emu::start("udp-capture", &["--udp", "127.0.0.1:0", "--capture", c]);
    emu.signal(libc::SIGTERM);
    let (code, text) = emu.wait();
    assert_eq!((code, last_line(&text)), (0, CLEAN), "{text}");
    let bytes = std::fs::read(&cap).unwrap();
    assert_eq!(bytes.len(), 24, "a pcap header, no packets");
    assert_eq!(bytes[..4], 0xa1b2_c3d4u32.to_le_bytes());
    assert_eq!(bytes[20..24], 147u32.to_le_bytes(), "LINKTYPE_USER0");
    assert_eq!(mode(&cap), 0o600);
    let (code, text) = run_to_end(
        "udp-capture-again",
        &["--udp", "127.0.0.1:0", "--capture", c],
    );
    assert_eq!((code, last_line(&text)), (1, error), "{text}");
    assert!(text.contains("File exists"), "{text}");
    let (code, text) = run_to_end("udp-and-dir", &["--udp", "7000", "--fabric", "/tmp"]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("--fabric DIR is the Unix socket fabric"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
