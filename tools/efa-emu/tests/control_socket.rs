//! The control window from the host (`--control-socket`,
//! `efa_emu::control_socket`): requests through the socket do what the
//! guest's MMIO accesses to the window do, bad lines change nothing, the
//! socket is private and outlives the guest's sessions.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use efa_emu::control_socket::{ControlSocket, MAX_CLIENTS, MAX_LINE};
use efa_emu::device::{control, InjectMode};
use efa_emu::transport::PciFunction;
use efa_hw::admin::{AdminOpcode, AdminStatus};
use efa_hw::aenq::AenqGroup;
use efa_hw::regs::*;
use support::*;

const EMU: &str = env!("CARGO_BIN_EXE_efa-emu");

/// A fresh directory only we can write to.
fn private_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("efa-emu-ctl-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
    d
}

/// `f`'s control window on a socket in a fresh directory.
fn serve(f: &Fake, name: &str) -> ControlSocket {
    ControlSocket::bind(private_dir(name).join("efa.ctl"), f.dev.clone()).unwrap()
}

/// One client connection.
struct Conn {
    answers: BufReader<UnixStream>,
    requests: UnixStream,
}

impl Conn {
    /// The socket still answers: `MAGIC` reads as it should.
    fn assert_serves(&mut self) {
        assert_eq!(
            self.ask(read(control::MAGIC)),
            format!("ok {:#x}", control::MAGIC_VALUE)
        );
    }

    fn new(path: &Path) -> Self {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        Self {
            answers: BufReader::new(s.try_clone().unwrap()),
            requests: s,
        }
    }

    /// Sends `line` and its `\n`; returns the answer without its `\n`.
    fn ask(&mut self, line: impl AsRef<[u8]>) -> String {
        let mut l = line.as_ref().to_vec();
        l.push(b'\n');
        self.requests.write_all(&l).unwrap();
        self.answer()
    }

    fn answer(&mut self) -> String {
        let mut a = String::new();
        self.answers.read_line(&mut a).unwrap();
        assert!(a.ends_with('\n'), "no whole answer: {a:?}");
        a.pop();
        a
    }
}

fn read(reg: u64) -> String {
    format!("read {reg:#x}")
}

fn write(reg: u64, v: u32) -> String {
    format!("write {reg:#x} {v:#x}")
}

#[test]
fn a_fatal_error_through_the_socket_shows_in_dev_sts() {
    let mut f = Fake::up(test_config());
    f.enable_aenq();
    let sock = serve(&f, "fatal");
    let mut c = Conn::new(sock.path());
    c.assert_serves();
    assert_eq!(
        c.ask(read(control::INDEX)),
        format!("ok {:#x}", f.dev.config().index)
    );
    assert!(!DEV_STS_FATAL_ERROR.is_set(dev_sts(&f)));
    f.aenq_events();
    assert_eq!(c.ask(write(control::COMMAND, control::CMD_FATAL)), "ok");
    // The write was made when its answer came.
    assert!(DEV_STS_FATAL_ERROR.is_set(dev_sts(&f)));
    assert!(f.dev.is_fatal());
    let events = f.aenq_events();
    assert_eq!(
        events.last().map(|e| e.aenq_common_desc.group),
        Some(AenqGroup::FatalError.raw()),
        "the fatal error's event, as through the window"
    );
}

#[test]
fn an_injected_fault_through_the_socket_fails_the_next_admin_command() {
    let mut f = Fake::up(test_config());
    let sock = serve(&f, "inject");
    let mut c = Conn::new(sock.path());
    let v = control::inject_value(
        AdminOpcode::AllocPd.raw(),
        0,
        1,
        InjectMode::Fail(AdminStatus::ResourceBusy),
    );
    assert_eq!(c.ask(write(control::INJECT, v)), "ok");
    assert_eq!(c.ask(read(control::INJECT)), format!("ok {v:#x}"));
    assert_eq!(f.alloc_pd(), Err(AdminStatus::ResourceBusy));
    assert!(f.alloc_pd().is_ok(), "one command only");
    assert_eq!(c.ask(read(control::INJECTED)), "ok 0x1");
    // What the socket reads is what the guest reads.
    assert_eq!(f.mmio(control::BASE + control::INJECTED), 1);
}

/// Everything a request could have changed.
fn snapshot(f: &Fake) -> impl PartialEq + std::fmt::Debug {
    let mut window: Vec<u32> = (0..control::SIZE)
        .step_by(4)
        .map(|r| f.mmio(control::BASE + r))
        .collect();
    // The snapshot's own read of DEV_STS counts as a register read: left
    // out, so that two snapshots with nothing between them are equal.
    window[(control::REG_READS / 4) as usize] = 0;
    let mut counters = f.dev.counters();
    counters.reg_reads = 0;
    (
        window,
        dev_sts(f),
        counters,
        f.dev.object_counts(),
        f.exits.load(Ordering::SeqCst),
    )
}

#[test]
fn bad_lines_get_errors_and_change_nothing() {
    let mut f = Fake::up(test_config());
    f.enable_aenq();
    let sock = serve(&f, "bad");
    let before = snapshot(&f);
    let usage = "(read OFFSET | write OFFSET VALUE)";
    let not_register = "is not a register of the window (0x0..=0xffc, a multiple of 4)";
    let fatal = control::CMD_FATAL;
    // Most lines, were they taken a little more leniently than they must
    // be, would make the device fatal (COMMAND is 0x18); the exact answer
    // shows which check refused each.
    let padded = format!("write 0x18{}{fatal}", " ".repeat(MAX_LINE));
    let huge = format!("write 0x18 {}{fatal}", "0".repeat(10_000));
    let cases: Vec<(Vec<u8>, String)> = vec![
        (
            b"WRITE 0x18 2".to_vec(),
            format!("error unknown request \"WRITE\" {usage}"),
        ),
        (
            format!("write 0x1018 {fatal}").into_bytes(),
            format!("error 0x1018 {not_register}"),
        ),
        (
            format!("write 0x19 {fatal}").into_bytes(),
            format!("error 0x19 {not_register}"),
        ),
        (
            format!("write 0x100000018 {fatal}").into_bytes(),
            "error \"0x100000018\" is not a 32-bit number (decimal or 0x hex)".into(),
        ),
        (
            b"write 0x18 two".to_vec(),
            "error \"two\" is not a 32-bit number (decimal or 0x hex)".into(),
        ),
        (
            b"write 0x18 0x100000002".to_vec(),
            "error \"0x100000002\" is not a 32-bit number (decimal or 0x hex)".into(),
        ),
        (
            format!("write 0x18 {fatal} {fatal}").into_bytes(),
            format!("error wrong number of arguments {usage}"),
        ),
        (
            b"write 0x18".to_vec(),
            format!("error wrong number of arguments {usage}"),
        ),
        (
            b"read".to_vec(),
            format!("error wrong number of arguments {usage}"),
        ),
        (b"".to_vec(), format!("error empty request {usage}")),
        (b" \t\r".to_vec(), format!("error empty request {usage}")),
        (
            b"\xffwrite 0x18 2".to_vec(),
            format!("error not text {usage}"),
        ),
        (
            padded.into_bytes(),
            format!("error line longer than {MAX_LINE} bytes"),
        ),
        (
            huge.into_bytes(),
            format!("error line longer than {MAX_LINE} bytes"),
        ),
    ];
    let mut c = Conn::new(sock.path());
    for (line, answer) in &cases {
        assert_eq!(c.ask(line), *answer, "{:?}", String::from_utf8_lossy(line));
        assert_eq!(snapshot(&f), before, "{:?}", String::from_utf8_lossy(line));
    }
    // The connection is still in step: the next line is a request of its
    // own, answered as such (and the longest line allowed is one).
    let longest = format!("read 0x0{}", " ".repeat(MAX_LINE - 8));
    assert_eq!(longest.len(), MAX_LINE);
    assert_eq!(c.ask(&longest), format!("ok {:#x}", control::MAGIC_VALUE));
    // Several requests in one write are answered in order.
    c.requests
        .write_all(b"read 0x0\nbogus\nread 0x28\n")
        .unwrap();
    assert_eq!(c.answer(), format!("ok {:#x}", control::MAGIC_VALUE));
    assert!(c.answer().starts_with("error unknown request"));
    assert_eq!(c.answer(), format!("ok {:#x}", f.dev.config().index));
    drop(c);

    // A client that hangs up in the middle of a line: the line is not
    // executed, the next client is served.
    let mut c = Conn::new(sock.path());
    c.requests
        .write_all(format!("write 0x18 {fatal}").as_bytes())
        .unwrap();
    c.requests.shutdown(std::net::Shutdown::Write).unwrap();
    // The server hangs up once it has read the end: then it has done all
    // it will do with the line.
    let mut rest = Vec::new();
    c.answers.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"", "no answer to an unfinished line");
    assert_eq!(snapshot(&f), before);
    assert!(!f.dev.is_fatal());
    let mut c = Conn::new(sock.path());
    c.assert_serves();
}

#[test]
fn clients_one_after_another_and_together() {
    let f = Fake::new(test_config());
    let sock = serve(&f, "clients");
    for i in 0..5u32 {
        let mut c = Conn::new(sock.path());
        assert_eq!(c.ask(write(control::NET_DELAY_US, i)), "ok");
        assert_eq!(c.ask(read(control::NET_DELAY_US)), format!("ok {i:#x}"));
    }
    let mut all: Vec<Conn> = (0..MAX_CLIENTS).map(|_| Conn::new(sock.path())).collect();
    for c in &mut all {
        assert_eq!(c.ask(read(control::NET_DELAY_US)), "ok 0x4");
    }
    // One more waits for a place, then is served.
    let mut late = Conn::new(sock.path());
    late.requests.write_all(b"read 0x0\n").unwrap();
    late.requests
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut b = [0u8; 1];
    assert!(
        late.answers.get_ref().read(&mut b).is_err(),
        "served beyond MAX_CLIENTS"
    );
    late.requests.set_read_timeout(Some(PATIENCE)).unwrap();
    drop(all.pop());
    assert_eq!(late.answer(), format!("ok {:#x}", control::MAGIC_VALUE));
}

#[test]
fn the_socket_serves_across_resets_and_sessions() {
    let mut f = Fake::up(test_config());
    let sock = serve(&f, "sessions");
    let mut c = Conn::new(sock.path());
    // The vfio-user client leaves (QEMU exits, the guest reboots): the
    // socket goes on, and a fault armed meanwhile strikes in the next
    // session, which begins with a reset.
    f.dev.shutdown();
    let v = control::inject_value(
        AdminOpcode::AllocPd.raw(),
        0,
        1,
        InjectMode::Fail(AdminStatus::ResourceBusy),
    );
    assert_eq!(c.ask(write(control::INJECT, v)), "ok");
    f.dev.reset();
    f.restart();
    assert_eq!(f.alloc_pd(), Err(AdminStatus::ResourceBusy));
    // A fatal error does not outlive the device reset the driver's
    // recovery makes; the socket serves on.
    assert_eq!(c.ask(write(control::COMMAND, control::CMD_FATAL)), "ok");
    assert!(DEV_STS_FATAL_ERROR.is_set(dev_sts(&f)));
    f.restart();
    assert!(!DEV_STS_FATAL_ERROR.is_set(dev_sts(&f)));
    assert!(f.alloc_pd().is_ok());
    assert_eq!(c.ask(read(control::INJECTED)), "ok 0x1");
}

#[test]
fn between_sessions_the_socket_reaches_no_guest_memory() {
    let mut f = Fake::up(test_config());
    f.enable_aenq();
    let pd = control::inject_value(
        AdminOpcode::AllocPd.raw(),
        0,
        1,
        InjectMode::Late(AdminStatus::UnknownError),
    );
    f.win(control::INJECT, pd);
    let id = f.put_entry(AdminOpcode::AllocPd.raw(), 0, &[]);
    f.ring();
    let t = Instant::now();
    while f.mmio(control::BASE + control::LATE_HELD) == 0 {
        assert!(t.elapsed() < PATIENCE, "command {id} not held");
        std::thread::sleep(Duration::from_millis(1));
    }
    let sock = serve(&f, "between");
    let mut c = Conn::new(sock.path());
    // The session ends: the guest's memory goes with it (the transport
    // unmaps it), and its queues' addresses mean nothing any more.
    f.dev.shutdown();
    f.ram.truncate(0);
    let irqs = f.irq.count(0);
    for cmd in [
        control::CMD_FATAL,
        control::CMD_AENQ_WARNING,
        control::CMD_AENQ_NOTIFICATION,
        control::CMD_COMPLETE_LATE,
    ] {
        assert_eq!(c.ask(write(control::COMMAND, cmd)), "ok", "{cmd}");
    }
    // Nothing was written to memory that is not there, nor counted as a
    // failed DMA: the device has no queues until the next session sets
    // them up.
    assert_eq!(f.dev.counters().dma_errors, 0);
    assert_eq!(f.dev.counters().late_writes, 0);
    assert_eq!(f.irq.count(0), irqs);
    c.assert_serves();
}

#[test]
fn the_socket_is_private_and_removed_when_dropped() {
    let f = Fake::new(test_config());
    let dir = private_dir("private");
    let path = dir.join("efa.ctl");
    let sock = ControlSocket::bind(&path, f.dev.clone()).unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.mode() & 0o7777, 0o600);
    // A live socket is not taken over.
    let e = ControlSocket::bind(&path, f.dev.clone()).err().unwrap();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    drop(sock);
    assert!(!path.exists(), "removed");
    // A directory others may write to, sticky (/tmp's rule) or not, is
    // refused: they could put their socket in its place.
    for mode in [0o777, 0o1777, 0o720] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = ControlSocket::bind(&path, f.dev.clone()).err().unwrap();
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::PermissionDenied,
            "{mode:o}: {e}"
        );
        assert!(e.to_string().contains("writable by other users"), "{e}");
        assert!(!path.exists(), "{mode:o}: nothing placed");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits for `child` to exit: (status, stderr).
fn finish(mut child: std::process::Child) -> (i32, String) {
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("efa-emu did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().expect("an exit"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn efa_emu(dir: &Path, args: &[&str]) -> std::process::Child {
    Command::new(EMU)
        .arg("--socket")
        .arg(dir.join("efa.sock"))
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// efa-emu `--index index` with its control window on a socket in `dir`,
/// once the socket is there: (the process, the socket's path).
fn efa_emu_serving(dir: &Path, index: &str) -> (std::process::Child, PathBuf) {
    let ctl = dir.join("efa.ctl");
    let ctl_arg = ctl.to_str().unwrap();
    let args = [
        "--test-control",
        "--index",
        index,
        "--control-socket",
        ctl_arg,
    ];
    let child = efa_emu(dir, &args);
    let t = Instant::now();
    while !ctl.exists() {
        assert!(t.elapsed() < PATIENCE, "no control socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    (child, ctl)
}

/// SIGTERM to `child`, then what [`finish`] says.
fn terminate(child: std::process::Child) -> (i32, String) {
    // SAFETY: kill(2) on our own child.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    finish(child)
}

#[test]
fn the_binary_refuses_a_control_socket_without_test_control() {
    let dir = private_dir("refused");
    let ctl = dir.join("efa.ctl");
    let (code, text) = finish(efa_emu(&dir, &["--control-socket", ctl.to_str().unwrap()]));
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("efa-emu: --control-socket needs --test-control"),
        "{text}"
    );
    assert!(
        text.lines()
            .last()
            .unwrap()
            .starts_with("efa-emu: summary: exit=error "),
        "{text}"
    );
    assert!(!ctl.exists() && !dir.join("efa.sock").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_binary_serves_the_socket_and_removes_it_on_sigterm() {
    let dir = private_dir("binary");
    let (child, ctl) = efa_emu_serving(&dir, "3");
    assert_eq!(std::fs::metadata(&ctl).unwrap().mode() & 0o7777, 0o600);
    let mut c = Conn::new(&ctl);
    assert_eq!(c.ask("read 0"), format!("ok {:#x}", control::MAGIC_VALUE));
    assert_eq!(c.ask("read 0x28"), "ok 0x3");
    assert_eq!(c.ask("write 0x2c 1000"), "ok");
    assert_eq!(c.ask("read 0x2c"), "ok 0x3e8");
    let (code, text) = terminate(child);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("control register 0x2c := 0x3e8, from the host"),
        "{text}"
    );
    assert!(!ctl.exists(), "the control socket is removed");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tools/efa-emu/guest/efa-emu-inject --control-socket CTL ARGS...`, run
/// on the host: (status, stdout and stderr).
fn inject_tool(ctl: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/guest/efa-emu-inject"))
        .arg("--control-socket")
        .arg(ctl)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("python3 runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().expect("an exit"), text)
}

#[test]
fn efa_emu_inject_steers_a_running_model_from_the_host() {
    let dir = private_dir("tool");
    let (child, ctl) = efa_emu_serving(&dir, "5");
    let mut c = Conn::new(&ctl);
    let ok = |args: &[&str]| {
        let (code, text) = inject_tool(&ctl, args);
        assert_eq!(code, 0, "{args:?}: {text}");
        text
    };
    let status = ok(&["status"]);
    assert!(
        status.contains(&format!("{} index 5\n", ctl.display())),
        "{status}"
    );
    // The tool's names and encodings are the model's.
    ok(&[
        "inject",
        "alloc_pd",
        "2",
        "fail",
        "resource_busy",
        "after",
        "1",
    ]);
    let v = control::inject_value(
        AdminOpcode::AllocPd.raw(),
        1,
        2,
        InjectMode::Fail(AdminStatus::ResourceBusy),
    );
    assert_eq!(c.ask(read(control::INJECT)), format!("ok {v:#x}"));
    // (Before any malformation: aenq-fatal would make the device fatal
    // first.)
    ok(&["fatal"]);
    for m in efa_emu::device::hostile::ALL {
        ok(&["hostile", m.name(), "seed", "0x123456789", "after", "3"]);
        let armed = m as u32 | 3 << 8;
        assert_eq!(c.ask(read(control::HOSTILE)), format!("ok {armed:#x}"));
    }
    assert_eq!(c.ask(read(control::HOSTILE_SEED_LO)), "ok 0x23456789");
    assert_eq!(c.ask(read(control::HOSTILE_SEED_HI)), "ok 0x1");
    ok(&["clear"]);
    assert_eq!(c.ask(read(control::HOSTILE)), "ok 0x0");
    ok(&["net-loss", "250"]);
    assert_eq!(c.ask(read(control::NET_LOSS_PPM)), "ok 0xfa");
    // Nothing listens at a path that is not the socket.
    let (code, text) = inject_tool(&dir.join("efa.sock.nothing"), &["status"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("no efa-emu control socket there"), "{text}");
    let (code, text) = terminate(child);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("efa5: device error: requested through the control window"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
