//! The vfio-user transport: serves one [`PciFunction`] to QEMU's
//! `vfio-user-pci` device over a Unix socket. This is the only module that
//! knows vfio-user, and the only one that uses the `vfio_user` crate.
//!
//! # What the guest sees
//!
//! - Config space (module `config`): the model's identity, its BARs (32/64-bit,
//!   prefetchable as declared), the command register (bus mastering gates
//!   DMA: with it off every [`GuestMemory`](crate::transport::GuestMemory) access fails, as on hardware), and
//!   an MSI-X capability at 0xb0 when the model has vectors.
//! - MSI-X table and PBA in the upper half of BAR0 ([`MsixLayout`]). QEMU
//!   emulates the table itself and tells us the vector's eventfd with
//!   SET_IRQS once the guest enables and unmasks it; PBA reads, which QEMU
//!   forwards, show nothing pending.
//! - Trapped BARs: every access is a message, answered by
//!   [`PciFunction::bar_read`]/[`PciFunction::bar_write`].
//! - Shared BARs: offered as one sparse-mmap area covering the whole BAR,
//!   backed by the [`SharedMem`] memfd, so guest
//!   loads and stores go straight to that memory.
//! - DMA: QEMU sends DMA_MAP with the memfd behind guest RAM (which needs
//!   `-object memory-backend-memfd,...,share=on -machine memory-backend=...`);
//!   the regions are mapped here and make up [`DmaMemory`]. Regions offered
//!   without an fd are not reachable: DMA there fails.
//!
//! # Who may connect
//!
//! The socket is 0600, and a client whose uid (`SO_PEERCRED`) is neither
//! this process's effective uid nor root is disconnected before it can send
//! a message: permissions are only the first line, since whoever created
//! the directory or the socket's path may have loosened them.
//!
//! # Threads
//!
//! [`VfioUserServer::serve_one`] runs on the caller's thread and starts two
//! more for the session: the protocol server, which makes every
//! [`PciFunction`] callback (one at a time, in arrival order), and a reply
//! pump. [`DmaMemory`] and [`MsixVectors`] may be used from any thread at any
//! time; between sessions DMA fails and signals are dropped.
//!
//! # Gaps of the `vfio_user` crate (0.1.7) and what this module does about them
//!
//! - It trusts client sizes and can panic, over-allocate or desynchronise on a
//!   malformed message (see module `wire`), and offers no way to stop it or to see
//!   its connection. So the client never talks to it directly: this module
//!   accepts the connection, reads each message whole, screens it
//!   (`wire::screen`), and passes it to the crate over a private socket
//!   pair; the crate's replies come back the same way.
//! - Its error replies carry errno 0 (which QEMU reads as success) unless the
//!   error is EINVAL of its own. The backend records each errno it returns,
//!   and the reply pump writes it into the reply.
//! - It accepts only from a listening socket, so the private link is a socket
//!   bound in a fresh 0700 directory, connected, then unlinked before the
//!   crate accepts.
//! - It has no server-initiated DMA messages and advertises one fd per
//!   message: neither matters here, since DMA goes through the mapped memfd
//!   and QEMU splits its SET_IRQS to match.

mod config;
mod dma;
mod irq;
mod wire;

pub use dma::DmaMemory;
pub use irq::MsixVectors;

use std::collections::VecDeque;
use std::fs::{self, DirBuilder, File};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;

use vfio_bindings::bindings::vfio::*;
use vfio_user::{
    DmaMapFlags, DmaUnmapFlags, IrqInfo, Server, ServerBackend, ServerRegion, SparseArea,
};

use crate::health::Health;
use crate::report;
use crate::shmem::SharedMem;
use crate::transport::{Bar, BarBacking, Interrupts, MsixLayout, PciFunction};
use config::ConfigSpace;
use wire::{ReadError, Verdict};

/// Why serving stopped other than by an orderly end.
#[derive(Debug)]
pub enum VfioError {
    /// The function's BARs or MSI-X cannot be served (a model bug); nothing
    /// was accepted.
    Layout(String),
    /// A socket or system call failed.
    Io(io::Error),
    /// The client broke the protocol's framing; the connection was dropped.
    Protocol(String),
    /// The vfio-user protocol server gave up.
    Server(String),
    /// A device callback panicked.
    DevicePanicked,
}

impl std::fmt::Display for VfioError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Layout(s) => write!(f, "the device cannot be served: {s}"),
            Self::Io(e) => write!(f, "vfio-user socket: {e}"),
            Self::Protocol(s) => write!(f, "vfio-user client broke the protocol: {s}"),
            Self::Server(s) => write!(f, "vfio-user server: {s}"),
            Self::DevicePanicked => write!(f, "a device callback panicked"),
        }
    }
}

impl std::error::Error for VfioError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for VfioError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// How a session ended without error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// The client closed the connection.
    Disconnected,
    /// [`Stopper::stop`] was called.
    Stopped,
}

/// Guest accesses that reached the transport as messages (trapped), by
/// region. Stores to a shared BAR that QEMU has mapped never count here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrapCounts {
    /// Config space reads.
    pub config_reads: u64,
    /// Config space writes.
    pub config_writes: u64,
    /// Reads of each BAR.
    pub bar_reads: [u64; 6],
    /// Writes to each BAR.
    pub bar_writes: [u64; 6],
}

#[derive(Default)]
struct Counters {
    reads: [AtomicU64; VFIO_PCI_NUM_REGIONS as usize],
    writes: [AtomicU64; VFIO_PCI_NUM_REGIONS as usize],
}

impl Counters {
    fn count(list: &[AtomicU64], region: u32) {
        if let Some(c) = list.get(region as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn snapshot(&self) -> TrapCounts {
        let get = |list: &[AtomicU64], i: usize| list[i].load(Ordering::Relaxed);
        let config = VFIO_PCI_CONFIG_REGION_INDEX as usize;
        TrapCounts {
            config_reads: get(&self.reads, config),
            config_writes: get(&self.writes, config),
            bar_reads: std::array::from_fn(|i| get(&self.reads, i)),
            bar_writes: std::array::from_fn(|i| get(&self.writes, i)),
        }
    }
}

struct Control {
    stopped: AtomicBool,
    /// Readable once stopped: wakes the accept loop.
    wake: OwnedFd,
    client: Mutex<Option<UnixStream>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ends serving from another thread: the current session (if any) ends with
/// [`SessionEnd::Stopped`], and so does every later `serve_one`.
#[derive(Clone)]
pub struct Stopper(Arc<Control>);

impl Stopper {
    /// Stops the server. Idempotent.
    pub fn stop(&self) {
        self.0.stopped.store(true, Ordering::SeqCst);
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write from a live buffer to our eventfd; it can
        // only fail if the counter would overflow, and then it is readable
        // already.
        unsafe { libc::write(self.0.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if let Some(c) = lock(&self.0.client).as_ref() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A vfio-user server socket and the device-side state that outlives
/// connections: guest memory and MSI-X vectors, handed to the model when it
/// is built.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use efa_emu::vfio::VfioUserServer;
/// # fn model(_: Arc<dyn efa_emu::transport::GuestMemory>, _: Arc<dyn efa_emu::transport::Interrupts>)
/// #     -> Arc<dyn efa_emu::transport::PciFunction> { unimplemented!() }
/// let server = VfioUserServer::bind("/tmp/efa0.sock")?;
/// let device = model(server.guest_memory(), server.interrupts());
/// server.serve(&*device, false)?; // one guest, then return
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct VfioUserServer {
    listener: UnixListener,
    path: PathBuf,
    /// Device and inode of the socket we bound, so drop removes only ours.
    socket_id: (u64, u64),
    memory: Arc<DmaMemory>,
    irqs: Arc<MsixVectors>,
    control: Arc<Control>,
    counters: Counters,
    health: Arc<Health>,
}

/// The uid of the process at the other end of `stream` (`SO_PEERCRED`: its
/// effective uid when it connected).
pub fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    // SAFETY: ucred is plain data; zeroed is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt on a live socket with a pointer to a ucred and its
    // size.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

impl VfioUserServer {
    /// Binds the socket at `path` (mode 0600). A leftover socket nobody
    /// listens on is replaced; a live one is an `AddrInUse` error.
    ///
    /// The socket is bound, listening and made 0600 in a fresh directory
    /// of its own (mode 0700, a name nobody can foresee, created
    /// exclusively) beside `path`, then renamed to `path`: so `path`
    /// appears only once a connect can succeed (whoever waits for it, QEMU
    /// or a test, may connect at once: between `bind()` and `listen()` a
    /// connect is refused), and only with mode 0600, and no other user can
    /// put a symbolic link or a socket of theirs in the way of the bind or
    /// the `chmod` meanwhile. The directory of `path` must belong to us or
    /// root and, if others may write to it, be sticky (as `/tmp`), where
    /// nobody else can remove or rename what we placed: elsewhere another
    /// user could replace `path` once it is there, and QEMU would connect
    /// to theirs (`PermissionDenied`).
    pub fn bind(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let (listener, socket_id) = bind_private(&path)?;
        // Accept waits in poll() alongside the stop eventfd.
        listener.set_nonblocking(true)?;
        // SAFETY: eventfd(2) with valid flags.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            listener,
            path,
            socket_id,
            memory: Arc::new(DmaMemory::new()),
            irqs: Arc::new(MsixVectors::new()),
            control: Arc::new(Control {
                stopped: AtomicBool::new(false),
                // SAFETY: eventfd returned a new descriptor nothing else owns.
                wake: unsafe { OwnedFd::from_raw_fd(wake) },
                client: Mutex::new(None),
            }),
            counters: Counters::default(),
            health: Health::new(),
        })
    }

    /// Counts and rate-limits this server's warnings in `health` (shared
    /// with the device) instead of counters of its own.
    pub fn with_health(mut self, health: Arc<Health>) -> Self {
        self.health = health;
        self
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Guest memory as the device's DMA reaches it.
    pub fn guest_memory(&self) -> Arc<DmaMemory> {
        self.memory.clone()
    }

    /// The device's MSI-X vectors.
    pub fn interrupts(&self) -> Arc<MsixVectors> {
        self.irqs.clone()
    }

    /// A handle that stops serving from another thread.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.control.clone())
    }

    /// Trapped accesses so far, over all sessions.
    pub fn trap_counts(&self) -> TrapCounts {
        self.counters.snapshot()
    }

    /// Serves sessions one after the other: returns after the first if
    /// `persist` is false, otherwise only when stopped or on error.
    pub fn serve(&self, function: &dyn PciFunction, persist: bool) -> Result<(), VfioError> {
        loop {
            match self.serve_one(function)? {
                SessionEnd::Disconnected if persist => continue,
                _ => return Ok(()),
            }
        }
    }

    /// Waits for one client and serves `function` to it until it
    /// disconnects or the server is stopped. The function gets
    /// [`PciFunction::reset`] when the client connects and
    /// [`PciFunction::shutdown`] when it is gone; the caller decides whether
    /// to wait for another client.
    pub fn serve_one(&self, function: &dyn PciFunction) -> Result<SessionEnd, VfioError> {
        let layout = Layout::of(function)?;
        let Some(client) = self.accept()? else {
            return Ok(SessionEnd::Stopped);
        };
        *lock(&self.control.client) = Some(client.try_clone()?);
        if self.control.stopped.load(Ordering::SeqCst) {
            *lock(&self.control.client) = None;
            return Ok(SessionEnd::Stopped);
        }
        log::info!("vfio-user client connected on {}", self.path.display());
        function.reset();
        self.memory.clear();
        self.irqs.configure(layout.msix.map_or(0, |m| m.vectors));

        let result = self.session(function, &layout, &client);

        *lock(&self.control.client) = None;
        function.shutdown();
        self.memory.clear();
        self.irqs.configure(0);
        match &result {
            Ok(end) => log::info!("vfio-user session ended: {end:?}"),
            Err(e) => log::error!("vfio-user session failed: {e}"),
        }
        result
    }

    fn accept(&self) -> Result<Option<UnixStream>, VfioError> {
        loop {
            if self.control.stopped.load(Ordering::SeqCst) {
                return Ok(None);
            }
            let mut fds = [
                libc::pollfd {
                    fd: self.listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.control.wake.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: `fds` is a live array of two pollfd structures and the
            // count says so.
            if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.into());
            }
            if self.control.stopped.load(Ordering::SeqCst) {
                return Ok(None);
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    // SAFETY: geteuid has no preconditions.
                    let me = unsafe { libc::geteuid() };
                    match peer_uid(&stream) {
                        Ok(uid) if uid == me || uid == 0 => {}
                        Ok(uid) => {
                            report!(
                                self.health,
                                Warn,
                                None,
                                "vfio-peer",
                                "{}: refused a client of uid {uid} (only {me} and root)",
                                self.path.display()
                            );
                            continue;
                        }
                        Err(e) => {
                            report!(
                                self.health,
                                Warn,
                                None,
                                "vfio-peer",
                                "{}: refused a client whose uid is unknown: {e}",
                                self.path.display()
                            );
                            continue;
                        }
                    }
                    stream.set_nonblocking(false)?;
                    return Ok(Some(stream));
                }
                // The client left between poll and accept.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn session(
        &self,
        function: &dyn PciFunction,
        layout: &Layout,
        client: &UnixStream,
    ) -> Result<SessionEnd, VfioError> {
        let (listener, crate_end) = private_link()?;
        // wire::screen refuses region accesses past these.
        debug_assert_eq!(layout.regions().len(), wire::REGIONS as usize);
        let server = Server::from_owned_fd(
            OwnedFd::from(listener),
            true,
            layout.irq_infos(),
            layout.regions(),
        );
        let errnos = Mutex::new(VecDeque::new());
        let write_lock = Mutex::new(());
        // Which side ended the session first: the client's (REQUESTS) or
        // the protocol server's (REPLIES).
        let first_end = AtomicU8::new(NOBODY);
        let bars: Vec<Bar> = layout.bars.iter().flatten().cloned().collect();
        let mut backend = Backend {
            function,
            layout,
            config: ConfigSpace::new(&function.identity(), &bars, layout.msix.as_ref()),
            memory: &self.memory,
            irqs: &self.irqs,
            errnos: &errnos,
            counters: &self.counters,
        };
        let crate_out = crate_end.try_clone()?;

        thread::scope(|s| {
            let server = &server;
            let backend = &mut backend;
            let protocol = thread::Builder::new()
                .name("vfio-user".into())
                .spawn_scoped(s, move || server.run(backend))?;
            let pump = thread::Builder::new()
                .name("vfio-user-replies".into())
                .spawn_scoped(s, || {
                    let r = pump_replies(&crate_out, client, &write_lock, &errnos);
                    let _ = first_end.compare_exchange(
                        NOBODY,
                        REPLIES,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    );
                    // Wake the request side if the protocol server went first.
                    let _ = client.shutdown(std::net::Shutdown::Both);
                    r
                });
            let requests = match pump {
                Ok(_) => pump_requests(client, &crate_end, &write_lock, &self.health),
                Err(ref e) => Err(VfioError::Io(io::Error::new(e.kind(), e.to_string()))),
            };
            let _ =
                first_end.compare_exchange(NOBODY, REQUESTS, Ordering::SeqCst, Ordering::SeqCst);
            // The session is over for the client; make the protocol server
            // and the reply pump see the end of their streams (shutting the
            // read side also fails a write the protocol server is blocked
            // in).
            let _ = client.shutdown(std::net::Shutdown::Both);
            let _ = crate_end.shutdown(std::net::Shutdown::Both);
            let protocol = protocol.join();
            if let Ok(Ok(Err(e))) = pump.map(|p| p.join()) {
                log::debug!("reply pump ended: {e}");
            }

            if self.control.stopped.load(Ordering::SeqCst) {
                return Ok(SessionEnd::Stopped);
            }
            let protocol = protocol.map_err(|_| VfioError::DevicePanicked)?;
            // A protocol server error counts only if it ended the session;
            // after the client left, it is just our teardown.
            if first_end.load(Ordering::SeqCst) == REPLIES {
                if let Err(e) = protocol {
                    return Err(VfioError::Server(e.to_string()));
                }
            }
            requests.map(|()| SessionEnd::Disconnected)
        })
    }
}

const NOBODY: u8 = 0;
const REQUESTS: u8 = 1;
const REPLIES: u8 = 2;

impl Drop for VfioUserServer {
    fn drop(&mut self) {
        remove_if_ours(&self.path, self.socket_id);
    }
}

/// Binds a listening Unix stream socket at `path` the way
/// [`VfioUserServer::bind`] describes (mode 0600 from its first moment, a
/// stale socket replaced, a live one `AddrInUse`, the directory checked by
/// `check_socket_dir`); returns it with the socket's device and inode, for
/// [`remove_if_ours`]. The control socket (`crate::control_socket`) is
/// placed the same way.
pub(crate) fn bind_private(path: &Path) -> io::Result<(UnixListener, (u64, u64))> {
    check_socket_dir(path)?;
    if fs::symlink_metadata(path).is_ok() {
        let stale = fs::symlink_metadata(path)?.file_type().is_socket()
            && UnixStream::connect(path).is_err();
        if !stale {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} exists and is not a stale socket", path.display()),
            ));
        }
        fs::remove_file(path)?;
    }
    let dir = private_dir(path.parent().unwrap_or(Path::new(".")), "binding")?;
    let temp = dir.join("socket");
    let placed = UnixListener::bind(&temp).and_then(|listener| {
        // Nobody else can enter the directory: the name is ours.
        fs::set_permissions(&temp, fs::Permissions::from_mode(0o600))?;
        fs::rename(&temp, path)?;
        Ok(listener)
    });
    let _ = fs::remove_file(&temp);
    let _ = fs::remove_dir(&dir);
    let listener = placed?;
    let meta = fs::symlink_metadata(path)?;
    Ok((listener, (meta.dev(), meta.ino())))
}

/// Removes the socket at `path` only if it is still the one
/// [`bind_private`] placed there (`id`, its device and inode).
pub(crate) fn remove_if_ours(path: &Path, id: (u64, u64)) {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if (meta.dev(), meta.ino()) == id {
            let _ = fs::remove_file(path);
        }
    }
}

/// A connected pair whose first end listens, which is what the crate's
/// server needs. The socket lives in a fresh 0700 directory and is unlinked
/// before the crate accepts, so nobody else can have connected.
fn private_link() -> io::Result<(UnixListener, UnixStream)> {
    let dir = private_dir(&std::env::temp_dir(), "link")?;
    let sock = dir.join("link");
    let pair = UnixListener::bind(&sock).and_then(|l| Ok((UnixStream::connect(&sock)?, l)));
    let _ = fs::remove_file(&sock);
    let _ = fs::remove_dir(&dir);
    pair.map(|(c, l)| (l, c))
}

/// Creates a new directory in `parent`, mode 0700, whose name nobody can
/// foresee (64 random bits): created exclusively, it is ours alone even in
/// a directory others can write to, and nobody can have put a name of
/// theirs in it.
fn private_dir(parent: &Path, what: &str) -> io::Result<PathBuf> {
    for _ in 0..16 {
        let mut random = [0u8; 8];
        // SAFETY: getrandom(2) writes at most the buffer's length into it.
        let n = unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) };
        if n != random.len() as isize {
            return Err(io::Error::last_os_error());
        }
        let dir = parent.join(format!(
            ".efa-emu.{what}.{:016x}",
            u64::from_ne_bytes(random)
        ));
        match DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("no fresh directory in {}", parent.display()),
    ))
}

/// Refuses to place a socket at `path` in a directory where another user
/// could replace it once placed: the directory must belong to us or root,
/// and be writable by nobody else unless it is sticky.
fn check_socket_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let m = fs::metadata(dir)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let others_write = m.mode() & 0o022 != 0;
    let sticky = m.mode() & 0o1000 != 0;
    if (m.uid() != me && m.uid() != 0) || (others_write && !sticky) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} (owner uid {}, mode {:o}) lets another user replace the socket: \
                 use a directory that belongs to you or root, writable by nobody else \
                 or sticky",
                dir.display(),
                m.uid(),
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::UnexpectedEof
    )
}

/// Client → protocol server: whole, screened messages. Ends at the client's
/// end of stream (Ok) or a framing error.
fn pump_requests(
    client: &UnixStream,
    crate_end: &UnixStream,
    write_lock: &Mutex<()>,
    health: &Health,
) -> Result<(), VfioError> {
    loop {
        let msg = match wire::read_message(client) {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(ReadError::Io(e)) if is_disconnect(&e) => return Ok(()),
            Err(ReadError::Io(e)) => return Err(e.into()),
            Err(ReadError::Size(n)) => {
                return Err(VfioError::Protocol(format!("message size {n}")))
            }
            Err(ReadError::TooManyFds) => {
                return Err(VfioError::Protocol(
                    "too many file descriptors in one message".into(),
                ))
            }
        };
        match wire::screen(msg) {
            Verdict::Forward(m) => {
                if wire::send_message(crate_end, &m.header, &m.body, &wire::raw_fds(&m.fds))
                    .is_err()
                {
                    // The protocol server is gone; the session result says why.
                    return Ok(());
                }
            }
            Verdict::Reject(h, errno) => {
                report!(
                    health,
                    Warn,
                    None,
                    "vfio-refused",
                    "refused vfio-user command {} (id {}): errno {errno}",
                    h.command,
                    h.id
                );
                let _guard = lock(write_lock);
                match wire::send_message(client, &h.error_reply(errno), &[], &[]) {
                    Ok(()) => {}
                    Err(e) if is_disconnect(&e) => return Ok(()),
                    Err(e) => return Err(e.into()),
                }
            }
            Verdict::Drop => report!(
                health,
                Warn,
                None,
                "vfio-refused",
                "ignored a reply from the vfio-user client"
            ),
        }
    }
}

/// Protocol server → client, putting the real errno into error replies.
fn pump_replies(
    crate_end: &UnixStream,
    client: &UnixStream,
    write_lock: &Mutex<()>,
    errnos: &Mutex<VecDeque<i32>>,
) -> io::Result<()> {
    loop {
        let m = match wire::read_message(crate_end) {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(ReadError::Io(e)) => return Err(e),
            Err(e) => return Err(io::Error::other(format!("{e:?}"))),
        };
        let mut h = m.header;
        if h.flags & wire::ERROR != 0 && h.error == 0 {
            // With every message screened, an errno-less error from a command
            // that reaches the backend is a backend error, and those come
            // back in order.
            let errno = match h.command {
                wire::DMA_MAP
                | wire::DMA_UNMAP
                | wire::DEVICE_SET_IRQS
                | wire::REGION_READ
                | wire::REGION_WRITE
                | wire::DEVICE_RESET => lock(errnos).pop_front().unwrap_or(libc::EIO),
                _ => libc::EINVAL,
            };
            h.error = errno as u32;
        }
        let _guard = lock(write_lock);
        wire::send_message(client, &h, &m.body, &wire::raw_fds(&m.fds))?;
    }
}

/// The model's BARs and MSI-X, checked.
struct Layout {
    bars: [Option<Bar>; 6],
    msix: Option<MsixLayout>,
}

impl Layout {
    fn of(function: &dyn PciFunction) -> Result<Self, VfioError> {
        let bad = |s: String| Err(VfioError::Layout(s));
        let mut bars: [Option<Bar>; 6] = Default::default();
        let mut used = [false; 6];
        for bar in function.bars() {
            let i = usize::from(bar.index);
            let slots = if bar.is_64bit { i..i + 2 } else { i..i + 1 };
            if slots.end > 6 {
                return bad(format!("BAR{i} does not exist"));
            }
            if !bar.size.is_power_of_two()
                || bar.size < 4096
                || (!bar.is_64bit && bar.size > 1 << 31)
            {
                return bad(format!("BAR{i} has an impossible size {:#x}", bar.size));
            }
            if bar.io_space
                && (bar.is_64bit || bar.prefetchable || !matches!(bar.backing, BarBacking::Trapped))
            {
                return bad(format!(
                    "I/O BAR{i} must be 32-bit, not prefetchable and trapped"
                ));
            }
            if slots.clone().any(|s| used[s]) {
                return bad(format!("BAR{i} overlaps another BAR"));
            }
            slots.for_each(|s| used[s] = true);
            if let BarBacking::Shared(m) = &bar.backing {
                if (m.len() as u64) < bar.size {
                    return bad(format!("BAR{i} is larger than its shared memory"));
                }
            }
            bars[i] = Some(bar);
        }
        let vectors = function.msix_vectors();
        let msix = if vectors == 0 {
            None
        } else {
            let Some(bar0) = &bars[0] else {
                return bad("MSI-X needs BAR0".into());
            };
            if !matches!(bar0.backing, BarBacking::Trapped) {
                return bad("MSI-X needs BAR0 to be trapped".into());
            }
            match MsixLayout::new(bar0.size, vectors) {
                Some(m) => Some(m),
                None => {
                    return bad(format!(
                        "{vectors} MSI-X vectors do not fit in the upper half of BAR0"
                    ))
                }
            }
        };
        Ok(Self { bars, msix })
    }

    fn regions(&self) -> Vec<ServerRegion> {
        let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
        (0..VFIO_PCI_NUM_REGIONS)
            .map(|index| {
                let (flags, size, sparse_areas, mmap_fd) = match self.bars.get(index as usize) {
                    Some(Some(Bar {
                        size,
                        backing: BarBacking::Shared(m),
                        ..
                    })) => (
                        rw | VFIO_REGION_INFO_FLAG_MMAP,
                        *size,
                        vec![SparseArea {
                            area: vfio_region_sparse_mmap_area {
                                offset: 0,
                                size: *size,
                            },
                        }],
                        Some(m.fd().as_raw_fd()),
                    ),
                    Some(Some(bar)) => (rw, bar.size, vec![], None),
                    _ if index == VFIO_PCI_CONFIG_REGION_INDEX => {
                        (rw, config::SIZE as u64, vec![], None)
                    }
                    _ => (0, 0, vec![], None),
                };
                ServerRegion {
                    region_info: vfio_region_info {
                        argsz: size_of::<vfio_region_info>() as u32,
                        flags,
                        index,
                        cap_offset: 0,
                        size,
                        offset: 0,
                    },
                    sparse_areas,
                    mmap_fd,
                }
            })
            .collect()
    }

    fn irq_infos(&self) -> Vec<IrqInfo> {
        (0..VFIO_PCI_NUM_IRQS)
            .map(|index| {
                let count = match self.msix {
                    Some(m) if index == VFIO_PCI_MSIX_IRQ_INDEX => u32::from(m.vectors),
                    // QEMU warns that it "could not enable error recovery"
                    // unless the error interrupt exists; it is never raised.
                    _ if index == VFIO_PCI_ERR_IRQ_INDEX => 1,
                    _ => 0,
                };
                // No NORESIZE: QEMU then adds vectors one at a time as the
                // guest unmasks them, instead of tearing all down each time.
                let flags = if count > 0 { VFIO_IRQ_INFO_EVENTFD } else { 0 };
                IrqInfo {
                    index,
                    flags,
                    count,
                }
            })
            .collect()
    }
}

/// Where a region access goes.
enum Target<'a> {
    Config,
    MsixArea,
    Trapped(u8),
    Shared(&'a SharedMem, usize),
}

/// What the crate's protocol server calls.
struct Backend<'a> {
    function: &'a dyn PciFunction,
    layout: &'a Layout,
    config: ConfigSpace,
    memory: &'a DmaMemory,
    irqs: &'a MsixVectors,
    errnos: &'a Mutex<VecDeque<i32>>,
    counters: &'a Counters,
}

impl Backend<'_> {
    /// An error for the crate, with its errno kept for the reply pump.
    fn fail(&self, errno: i32) -> io::Error {
        lock(self.errnos).push_back(errno);
        io::Error::from_raw_os_error(errno)
    }

    fn checked<T>(&self, r: io::Result<T>) -> io::Result<T> {
        r.map_err(|e| self.fail(e.raw_os_error().unwrap_or(libc::EIO)))
    }

    fn target(&self, region: u32, offset: u64, len: usize) -> Option<Target<'_>> {
        if region == VFIO_PCI_CONFIG_REGION_INDEX {
            return Some(Target::Config);
        }
        let bar = self.layout.bars.get(region as usize)?.as_ref()?;
        let end = offset.checked_add(len as u64)?;
        if len == 0 || end > bar.size {
            return None;
        }
        if let Some(m) = self
            .layout
            .msix
            .filter(|m| m.bar == bar.index && end > m.table_offset)
        {
            // An access straddling registers and the MSI-X half is refused.
            return m.owns(offset).then_some(Target::MsixArea);
        }
        match &bar.backing {
            BarBacking::Trapped => {
                matches!(len, 1 | 2 | 4 | 8).then_some(Target::Trapped(bar.index))
            }
            BarBacking::Shared(m) => Some(Target::Shared(m, offset as usize)),
        }
    }
}

impl ServerBackend for Backend<'_> {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> io::Result<()> {
        Counters::count(&self.counters.reads, region);
        let done = match self.target(region, offset, data.len()) {
            Some(Target::Config) => self.config.read(offset, data).is_some(),
            Some(Target::MsixArea) => {
                data.fill(0);
                true
            }
            Some(Target::Trapped(bar)) => {
                self.function.bar_read(bar, offset, data);
                true
            }
            Some(Target::Shared(m, at)) => m.read(at, data).is_ok(),
            None => false,
        };
        if done {
            Ok(())
        } else {
            Err(self.fail(libc::EINVAL))
        }
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> io::Result<()> {
        Counters::count(&self.counters.writes, region);
        let done = match self.target(region, offset, data.len()) {
            Some(Target::Config) => {
                let ok = self.config.write(offset, data).is_some();
                self.memory.set_bus_master(self.config.bus_master());
                ok
            }
            Some(Target::MsixArea) => true,
            Some(Target::Trapped(bar)) => {
                self.function.bar_write(bar, offset, data);
                true
            }
            Some(Target::Shared(m, at)) => m.write(at, data).is_ok(),
            None => false,
        };
        if done {
            Ok(())
        } else {
            Err(self.fail(libc::EINVAL))
        }
    }

    fn dma_map(
        &mut self,
        flags: DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<File>,
    ) -> io::Result<()> {
        let Some(file) = fd else {
            log::debug!("DMA region {address:#x}+{size:#x} has no fd: the device cannot reach it");
            return Ok(());
        };
        let writable = flags.contains(DmaMapFlags::WRITE);
        let r = self.memory.map(address, size, &file, offset, writable);
        self.checked(r)
    }

    fn dma_unmap(&mut self, flags: DmaUnmapFlags, address: u64, size: u64) -> io::Result<()> {
        let all = flags.bits() & VFIO_DMA_UNMAP_FLAG_ALL != 0;
        let r = self.memory.unmap(address, size, all);
        self.checked(r)
    }

    fn reset(&mut self) -> io::Result<()> {
        self.function.reset();
        Ok(())
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> io::Result<()> {
        let data = flags & VFIO_IRQ_SET_DATA_TYPE_MASK;
        let action = flags & VFIO_IRQ_SET_ACTION_TYPE_MASK;
        if index == VFIO_PCI_ERR_IRQ_INDEX {
            // The device reports no errors: the eventfd is not kept.
            return if action == VFIO_IRQ_SET_ACTION_TRIGGER && start.saturating_add(count) <= 1 {
                Ok(())
            } else {
                Err(self.fail(libc::EINVAL))
            };
        }
        if index != VFIO_PCI_MSIX_IRQ_INDEX || self.layout.msix.is_none() {
            // Nothing to set up; QEMU still disables every index on reset.
            return if data == VFIO_IRQ_SET_DATA_NONE && count == 0 {
                Ok(())
            } else {
                Err(self.fail(libc::EINVAL))
            };
        }
        if action != VFIO_IRQ_SET_ACTION_TRIGGER {
            return Err(self.fail(libc::EINVAL));
        }
        match data {
            VFIO_IRQ_SET_DATA_NONE if count == 0 => {
                self.irqs.unset_all();
                Ok(())
            }
            // As with the kernel's vfio-pci: fire the vectors.
            VFIO_IRQ_SET_DATA_NONE => {
                let end = start
                    .checked_add(count)
                    .filter(|&e| e as usize <= self.irqs.len());
                let Some(end) = end else {
                    return Err(self.fail(libc::EINVAL));
                };
                (start..end).for_each(|v| self.irqs.signal(v as u16));
                Ok(())
            }
            VFIO_IRQ_SET_DATA_EVENTFD => {
                let r = self.irqs.set(start, count, fds);
                self.checked(r)
            }
            _ => Err(self.fail(libc::EINVAL)),
        }
    }
}

#[cfg(test)]
mod tests;
