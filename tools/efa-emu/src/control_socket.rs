//! The control window from the host: `efa-emu --control-socket PATH`.
//!
//! A Unix stream socket on which a process on the host (a developer, a
//! host-side test, `efa-emu-inject --control-socket PATH`) reads and
//! writes the registers of the emulator's control window
//! ([`crate::device::control`]) while the model runs, as the guest does
//! through BAR0. Each request is made through the device's
//! [`PciFunction::bar_read`] or [`PciFunction::bar_write`] at the window's
//! BAR0 offset: the very calls a guest's MMIO access arrives by, under the
//! device's lock, so that what each register does has one definition.
//! Like the window itself it is a test feature: `efa-emu` offers it only
//! with `--test-control`.
//!
//! # Protocol
//!
//! One request a line (`\n` ends it, at most [`MAX_LINE`] bytes before
//! it), one answer line to each, in order:
//!
//! | request | answer |
//! |-|-|
//! | `read OFFSET` | `ok VALUE` (hex, `ok 0x554d4545`) |
//! | `write OFFSET VALUE` | `ok` |
//! | anything else | `error WHY`, and nothing was read or written |
//!
//! OFFSET is a register's offset in the window (`0x0`..=`0xffc`, a
//! multiple of 4: `0x18` is `COMMAND`), VALUE 32 bits; numbers are decimal
//! or `0x` hex. A line longer than [`MAX_LINE`] is answered with an error
//! when its end arrives; a line its client did not finish (it hung up
//! first) is dropped, not executed. Clients may come one after another or at
//! once (up to [`MAX_CLIENTS`] served together, more wait for a place); a
//! client that does not read its answers is hung up on once they no
//! longer fit its socket.
//!
//! # Who may connect
//!
//! As to the vfio-user socket ([`crate::vfio`]): the socket is 0600 from
//! its first moment and a client whose uid is neither ours nor root is
//! hung up on. Its directory must be writable by nobody else, the rule of
//! the fabric's directory, since a socket in place of ours would take the
//! requests meant for it.
//!
//! # Lifetime
//!
//! It serves from [`ControlSocket::bind`] until dropped, whatever the
//! vfio-user side does: between sessions (`--persist`) and across device
//! resets. A session's end resets the device (its guest memory is gone),
//! and what the window set survives resets: a fault armed between
//! sessions strikes in the next one, while a fatal error asked for then
//! reaches no memory (the device has no queues until a driver sets them
//! up) and ends at the reset the next session begins with.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use efa_hw::regs::REG_BAR;

use crate::device::config::parse_number;
use crate::device::control;
use crate::device::fabric::check_private_dir;
use crate::transport::PciFunction;
use crate::vfio::{bind_private, peer_uid, remove_if_ours};

/// The longest request line, without its `\n`.
pub const MAX_LINE: usize = 128;
/// Clients served at once.
pub const MAX_CLIENTS: usize = 8;

/// A control socket being served (see the module documentation); dropping
/// it stops the thread and removes the socket.
pub struct ControlSocket {
    path: PathBuf,
    /// Device and inode of the socket we placed, so drop removes only ours.
    socket_id: (u64, u64),
    /// Shut down to stop the thread, which polls the other end.
    stop: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl ControlSocket {
    /// Places the socket at `path` and serves `function`'s control window
    /// on it from a thread of its own.
    pub fn bind(path: impl AsRef<Path>, function: Arc<dyn PciFunction>) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        check_private_dir(
            dir,
            "put a socket of theirs in place of the control socket: use a directory only \
             you can write to",
        )?;
        let (listener, socket_id) = bind_private(&path)?;
        let served = listener.set_nonblocking(true).and_then(|()| {
            let (stop, stopped) = UnixStream::pair()?;
            let name = path.display().to_string();
            let thread = std::thread::Builder::new()
                .name("control-socket".into())
                .spawn(move || serve(&listener, &stopped, &*function, &name))?;
            Ok((stop, thread))
        });
        match served {
            Ok((stop, thread)) => Ok(Self {
                path,
                socket_id,
                stop,
                thread: Some(thread),
            }),
            Err(e) => {
                remove_if_ours(&path, socket_id);
                Err(e)
            }
        }
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = self.stop.shutdown(Shutdown::Both);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!(
                    "{}: the control socket's thread panicked",
                    self.path.display()
                );
            }
        }
        remove_if_ours(&self.path, self.socket_id);
    }
}

/// One connection and the part of a line it sent so far.
struct Client {
    stream: UnixStream,
    line: Vec<u8>,
    /// The line in progress passed [`MAX_LINE`]: its end gets an error.
    too_long: bool,
}

fn pollfd(fd: &impl AsRawFd) -> libc::pollfd {
    libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }
}

fn serve(listener: &UnixListener, stopped: &UnixStream, function: &dyn PciFunction, name: &str) {
    let mut clients: Vec<Client> = Vec::new();
    loop {
        let mut fds = vec![pollfd(stopped), pollfd(listener)];
        if clients.len() >= MAX_CLIENTS {
            // poll(2) skips a negative descriptor: newcomers wait in the
            // backlog until a client leaves.
            fds[1].fd = -1;
        }
        fds.extend(clients.iter().map(|c| pollfd(&c.stream)));
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structures.
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) } < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            log::error!("{name}: poll failed ({e}); the control socket stops serving");
            return;
        }
        if fds[0].revents != 0 {
            return;
        }
        // Backwards, so that swap_remove moves only clients already seen.
        for i in (0..clients.len()).rev() {
            if fds[2 + i].revents != 0 && !clients[i].service(function, name) {
                clients.swap_remove(i);
            }
        }
        if fds[1].revents != 0 {
            accept(listener, &mut clients, name);
        }
    }
}

fn accept(listener: &UnixListener, clients: &mut Vec<Client>, name: &str) {
    while clients.len() < MAX_CLIENTS {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // The client left between poll and accept, or no
                // descriptor was left: the next poll says.
                log::debug!("{name}: accept: {e}");
                return;
            }
        };
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        match peer_uid(&stream) {
            Ok(uid) if uid == me || uid == 0 => {}
            Ok(uid) => {
                log::warn!("{name}: refused a client of uid {uid} (only {me} and root)");
                continue;
            }
            Err(e) => {
                log::warn!("{name}: refused a client whose uid is unknown: {e}");
                continue;
            }
        }
        if let Err(e) = stream.set_nonblocking(true) {
            log::warn!("{name}: dropped a client: {e}");
            continue;
        }
        log::debug!("{name}: client connected");
        clients.push(Client {
            stream,
            line: Vec::new(),
            too_long: false,
        });
    }
}

impl Client {
    /// Reads what arrived and answers each line it completes; returns
    /// whether the client stays.
    fn service(&mut self, function: &dyn PciFunction, name: &str) -> bool {
        let mut buf = [0u8; 512];
        let n = match self.stream.read(&mut buf) {
            // Gone: a line it did not finish is dropped unread.
            Ok(0) => return false,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                return true
            }
            Err(_) => return false,
        };
        for piece in buf[..n].split_inclusive(|&b| b == b'\n') {
            let (body, complete) = match piece.strip_suffix(b"\n") {
                Some(body) => (body, true),
                None => (piece, false),
            };
            if !self.too_long {
                if self.line.len() + body.len() > MAX_LINE {
                    self.too_long = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(body);
                }
            }
            if !complete {
                continue;
            }
            let answer = if self.too_long {
                format!("error line longer than {MAX_LINE} bytes\n")
            } else {
                match execute(function, &self.line, name) {
                    Ok(Some(v)) => format!("ok {v:#x}\n"),
                    Ok(None) => "ok\n".into(),
                    Err(why) => format!("error {why}\n"),
                }
            };
            self.line.clear();
            self.too_long = false;
            // Answers are short; one that does not fit is a client that
            // stopped reading them.
            if self.stream.write_all(answer.as_bytes()).is_err() {
                log::debug!("{name}: a client that does not read its answers: dropped");
                return false;
            }
        }
        true
    }
}

/// A 32-bit number, decimal or `0x` hex.
fn number(s: &str) -> Result<u32, String> {
    parse_number(s)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| format!("{s:?} is not a 32-bit number (decimal or 0x hex)"))
}

/// The offset of a register of the window.
fn offset(s: &str) -> Result<u64, String> {
    let off = u64::from(number(s)?);
    if off >= control::SIZE || off % 4 != 0 {
        return Err(format!(
            "{off:#x} is not a register of the window (0x0..={:#x}, a multiple of 4)",
            control::SIZE - 4
        ));
    }
    Ok(off)
}

/// Executes one request line: `Ok(Some(value))` for a read, `Ok(None)`
/// for a write; `Err` (nothing done) for anything else.
fn execute(function: &dyn PciFunction, line: &[u8], name: &str) -> Result<Option<u32>, String> {
    const USAGE: &str = "(read OFFSET | write OFFSET VALUE)";
    let text = std::str::from_utf8(line).map_err(|_| format!("not text {USAGE}"))?;
    let words: Vec<&str> = text.split_ascii_whitespace().collect();
    match words[..] {
        ["read", off] => {
            let off = offset(off)?;
            let mut b = [0u8; 4];
            function.bar_read(REG_BAR, control::BASE + off, &mut b);
            Ok(Some(u32::from_le_bytes(b)))
        }
        ["write", off, value] => {
            let (off, v) = (offset(off)?, number(value)?);
            log::info!("{name}: control register {off:#x} := {v:#x}, from the host");
            function.bar_write(REG_BAR, control::BASE + off, &v.to_le_bytes());
            Ok(None)
        }
        ["read" | "write", ..] => Err(format!("wrong number of arguments {USAGE}")),
        [] => Err(format!("empty request {USAGE}")),
        [verb, ..] => Err(format!("unknown request {verb:?} {USAGE}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::as_user::{self, Outcome};
    use crate::transport::{Bar, PciIdentity};
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    use std::sync::Mutex;

    /// One BAR access: read or write, BAR, offset, bytes.
    type Access = (&'static str, u8, u64, Vec<u8>);

    /// Records the BAR accesses it gets; a read returns 0x1234_5678.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<Access>>);

    impl PciFunction for Recorder {
        fn identity(&self) -> PciIdentity {
            PciIdentity {
                vendor: 0x1d0f,
                device: 0xefa2,
                subsystem_vendor: 0x1d0f,
                subsystem: 0xefa2,
                revision: 0,
                class: 0x02_00_00,
            }
        }
        fn bars(&self) -> Vec<Bar> {
            Vec::new()
        }
        fn msix_vectors(&self) -> u16 {
            0
        }
        fn bar_read(&self, bar: u8, offset: u64, data: &mut [u8]) {
            self.0
                .lock()
                .unwrap()
                .push(("read", bar, offset, data.to_vec()));
            data.copy_from_slice(&0x1234_5678u32.to_le_bytes());
        }
        fn bar_write(&self, bar: u8, offset: u64, data: &[u8]) {
            self.0
                .lock()
                .unwrap()
                .push(("write", bar, offset, data.to_vec()));
        }
        fn reset(&self) {}
        fn shutdown(&self) {}
    }

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("efa-emu-ctl-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        d
    }

    #[test]
    fn requests_are_the_guests_32_bit_accesses_to_the_window() {
        let rec = Arc::new(Recorder::default());
        let d = dir("accesses");
        let sock = ControlSocket::bind(d.join("c"), rec.clone()).unwrap();
        let s = UnixStream::connect(sock.path()).unwrap();
        (&s).write_all(b"read 0x18\nwrite 0xffc 0xdeadbeef\n")
            .unwrap();
        let mut answers = BufReader::new(&s);
        let mut a = String::new();
        answers.read_line(&mut a).unwrap();
        answers.read_line(&mut a).unwrap();
        assert_eq!(a, "ok 0x12345678\nok\n");
        assert_eq!(
            *rec.0.lock().unwrap(),
            [
                ("read", REG_BAR, control::BASE + 0x18, vec![0; 4]),
                (
                    "write",
                    REG_BAR,
                    control::BASE + 0xffc,
                    0xdead_beefu32.to_le_bytes().to_vec()
                ),
            ]
        );
        drop(sock);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn another_user_is_hung_up_on() {
        let rec = Arc::new(Recorder::default());
        let d = dir("peer");
        let sock = ControlSocket::bind(d.join("c"), rec.clone()).unwrap();
        // Open the way, so that only the peer check is left.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711)).unwrap();
        std::fs::set_permissions(sock.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        match as_user::connect_and_wait_for_hangup(sock.path()) {
            Outcome::CannotSwitch => eprintln!("skipped the other user: not root"),
            Outcome::Exited(code) => assert_eq!(code, 0, "the socket hung up on the other user"),
        }
        // Ours is served.
        let s = UnixStream::connect(sock.path()).unwrap();
        (&s).write_all(b"read 0\n").unwrap();
        let mut a = String::new();
        BufReader::new(&s).read_line(&mut a).unwrap();
        assert_eq!(a, "ok 0x12345678\n");
        assert_eq!(
            rec.0.lock().unwrap().len(),
            1,
            "the other user's client did nothing"
        );
        drop(sock);
        let _ = std::fs::remove_dir_all(&d);
    }
}
