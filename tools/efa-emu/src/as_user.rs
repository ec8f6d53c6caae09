//! Tests only: act as another user from a forked child, to show that
//! efa-emu's sockets refuse other users even where file permissions would
//! let them in.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The user the child becomes (nobody).
pub const OTHER_UID: u32 = 65534;

/// What the child did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// This process may not change users (not root): the test cannot run.
    CannotSwitch,
    /// The child's exit status: 0 for what the test expects, else a step
    /// that failed.
    Exited(i32),
}

fn sockaddr(path: &Path) -> libc::sockaddr_un {
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len(), "socket path too long");
    for (d, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    addr
}

/// Forks a child that becomes [`OTHER_UID`] and runs `body` (which may
/// only make system calls: the parent has other threads) and exits with
/// its value.
fn as_other_user(body: impl FnOnce() -> i32) -> Outcome {
    // SAFETY: the child only makes raw system calls and _exits; it never
    // returns into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // Raw system calls: glibc's set*id would try to reach the
        // parent's other threads, which the child does not have.
        // SAFETY: plain system calls in the child.
        let code = unsafe {
            if libc::syscall(libc::SYS_setgid, OTHER_UID) != 0
                || libc::syscall(libc::SYS_setuid, OTHER_UID) != 0
            {
                2
            } else {
                body()
            }
        };
        // SAFETY: ends the child without running the parent's handlers.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child with a live int.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid");
    match libc::WEXITSTATUS(status) {
        2 => Outcome::CannotSwitch,
        n => Outcome::Exited(n),
    }
}

/// Sends `bytes` as one datagram to the socket at `path` as another user:
/// exits 0 once sent.
pub fn send_datagram(path: &Path, bytes: &[u8]) -> Outcome {
    let addr = sockaddr(path);
    as_other_user(|| {
        // SAFETY: system calls with a live buffer and address.
        unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0);
            if fd < 0 {
                return 3;
            }
            let n = libc::sendto(
                fd,
                bytes.as_ptr().cast(),
                bytes.len(),
                0,
                (&addr as *const libc::sockaddr_un).cast(),
                size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            if n == bytes.len() as isize {
                0
            } else {
                4
            }
        }
    })
}

/// Connects to the stream socket at `path` as another user and waits up
/// to 3 s for the server to hang up: exits 0 if it did, 5 if the
/// connection stayed open, 3 or 4 if it could not connect.
pub fn connect_and_wait_for_hangup(path: &Path) -> Outcome {
    let addr = sockaddr(path);
    as_other_user(|| {
        // SAFETY: system calls with live buffers and addresses.
        unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 {
                return 3;
            }
            if libc::connect(
                fd,
                (&addr as *const libc::sockaddr_un).cast(),
                size_of::<libc::sockaddr_un>() as libc::socklen_t,
            ) != 0
            {
                return 4;
            }
            let tv = libc::timeval {
                tv_sec: 3,
                tv_usec: 0,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            );
            let mut b = 0u8;
            match libc::read(fd, (&mut b as *mut u8).cast(), 1) {
                0 => 0,
                _ => 5,
            }
        }
    })
}
