//! The Unix-socket transport: the fabric between efa-emu processes of one
//! user on one host, the default.
//!
//! Each port binds a Unix datagram socket `efa-<gid in hex>.sock` in the
//! fabric's directory; packets for a GID go to that name. Only the
//! directory's owner takes part: it must belong to that user (or root)
//! and be writable by nobody else, so that nobody else can bind a
//! device's socket name in it; created here, it is 0700. Each socket is
//! 0600 and receives with `SO_PASSCRED` (set before it is bound): a
//! datagram whose sender's uid is not this process's is dropped, as is
//! one that does not parse or is not addressed to the port's GID, and
//! counted as `fabric_rejected` ([`crate::health`]).
//!
//! Offers of memory (or of the ring alone) and acceptances ([`share`]) are
//! sent from the port's own bound socket, and a receiver takes one only if
//! its source address is the socket path of the GID it names as its
//! sender: a process of our uid cannot speak for another port's memory
//! without taking that port's socket name. Offers go from a thread of their own (`Offerer`), never
//! from a device's data path.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::capture::{Capture, Direction, Via};
use super::ring::{Popped, Pushed, KICK};
use super::share::{self, Control, Desc, Ledger, PeerRx, PeerTx, PinTable};
use super::{check_private_dir, Data, Fault, Packet, Port, Transport, MAX_SEGMENT};
use crate::copycount::copied;
use crate::device::Map;
use crate::health::{Class, Health};
use crate::report;

/// Packets queued for the socket transmit thread, to all peers, before
/// `send` drops them (peers that do not drain their sockets).
const TX_QUEUE: usize = 4096;
/// Packets queued for the transmit thread to one peer at most: a peer
/// that takes nothing fills an eighth of [`TX_QUEUE`], not all of it.
const ROUTE_QUEUE: usize = TX_QUEUE / 8;
/// Longest a packet waits for room in a peer's socket queue.
const TX_TIMEOUT: Duration = Duration::from_millis(100);

/// The socket part of a fabric: one bound socket per local port, and a
/// thread that sends.
///
/// A Unix datagram socket queues only `net.unix.max_dgram_qlen` (10 by
/// default) datagrams, so a burst sent without waiting mostly fails. Each
/// destination GID has a [`Route`]: a socket connected to the GID's, and
/// the packets to it that wait for room. A device's thread sends without
/// waiting while its route has nothing waiting; when the peer's queue is
/// full it hands the packet to the transmit thread, and so do the packets
/// after it to that peer until the transmit thread has sent them all, so
/// that packets to a peer keep their order. The transmit thread sends
/// without waiting too, and waits in poll(2) for room at the peers it
/// could not send to, each one's socket on its own: a peer that takes
/// nothing holds up only the packets to itself, one lost each
/// [`TX_TIMEOUT`] it takes nothing. Losing them at once instead (SRD retransmits) would
/// turn any burst longer than the peer's queue into retransmissions on
/// a link that loses nothing, which the retransmission counters are
/// there to show. This paces senders to each receiver without ever
/// blocking a device's data path, and costs no thread handoff while the
/// receiver keeps up.
pub(super) struct UnixSockets {
    dir: PathBuf,
    health: Arc<Health>,
    /// What the transmit thread sends, shared with it.
    out: Arc<Outbox>,
    tx_thread: Option<JoinHandle<()>>,
    /// Packets lost on the way out: the transmit thread's queue full, or
    /// no room in the peer's socket queue in time, or nobody there.
    lost: Arc<AtomicU64>,
    /// The routes to the GIDs packets went to (at most [`ROUTES`]).
    routes: Map<[u8; 16], Arc<Route>>,
    receivers: Vec<(PathBuf, Arc<AtomicBool>, Option<JoinHandle<()>>)>,
    capture: Option<Arc<Capture>>,
    /// What this process offered each (local GID, peer GID), shared with
    /// the receive threads, which hear the acceptances, and the offer
    /// thread, which sends the offers.
    peers: Peers,
    /// The ports' bound sockets, which the offer thread sends from.
    locals: Locals,
    /// Wakes the offer thread for a new offer; closing it ends the thread.
    wake: Option<SyncSender<()>>,
    offer_thread: Option<JoinHandle<()>>,
    /// What the receive threads map of peers' memory ([`share::Ledger`]).
    ledger: Arc<Ledger>,
    /// Closes the descriptors the receive threads refuse.
    closer: Closer,
    /// A packet's descriptors, kept for the next.
    descs: Vec<Desc>,
    /// A packet's wire form, kept for the next (unless it was handed to
    /// the transmit thread): no allocation per packet sent directly.
    buf: Vec<u8>,
}

/// A local port's GID and a peer's.
type GidPair = ([u8; 16], [u8; 16]);

/// The peers offered memory, by (local GID, peer GID).
type Peers = Arc<Mutex<Map<GidPair, Arc<Peer>>>>;

/// A peer offered memory, and the socket that packets carrying
/// descriptors of it go by.
///
/// Descriptors mean something only to the process that accepted the
/// offers they name: a process that took the GID's socket name after it
/// exited has mapped nothing of ours and would drop them as hostile
/// (`fabric_rejected`). That they never reach another process is the
/// kernel's to keep, at no cost per packet: `link` is connected after the
/// first acceptance arrived, and a connected datagram socket sends only
/// to the socket it was connected to, never to one bound at the path
/// later; once that socket is closed (its process exited, or the port
/// detached) a send fails with `ECONNREFUSED`. The acceptor's pidfd is
/// opened after the connect and must show it alive ([`PeerTx::accepted`]):
/// so, had it exited and another process bound the path before the
/// connect, the acceptance counts for nothing. The socket the link reaches
/// is the acceptor's unless the path was taken over while the acceptor
/// lived, which needs a second live process at the GID (ruled out by the
/// GID default; and no per-packet pidfd poll would see it either).
struct Peer {
    tx: Arc<PeerTx>,
    /// Set by a receive thread before the first offer is marked accepted,
    /// so that a packet that is described finds it.
    link: OnceLock<UnixDatagram>,
    /// The peer is known to be gone: a send by `link` was refused, or the
    /// offer thread found its process exited. The data path's one check
    /// per packet, a load.
    gone: AtomicBool,
    /// Our pin table for it, whose ring it reads ([`super::ring`]): set with the
    /// first acceptance, once the acceptor has mapped the table.
    ring: OnceLock<Arc<PinTable>>,
    /// Entries published on the ring: only the fabric's sender, under the
    /// transport's lock, changes it.
    ring_head: AtomicU64,
    /// When the data path last asked whether its process runs.
    checked: Mutex<Instant>,
}

/// How often at most the data path asks whether a peer whose ring is not
/// drained still runs (a `poll` of its pidfd).
const PEER_ALIVE_CHECK: Duration = Duration::from_millis(1);

impl Peer {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            tx: Arc::new(PeerTx::new()),
            link: OnceLock::new(),
            gone: AtomicBool::new(false),
            ring: OnceLock::new(),
            ring_head: AtomicU64::new(0),
            checked: Mutex::new(Instant::now()),
        })
    }

    /// Whether it is time to ask again whether its process runs
    /// ([`PEER_ALIVE_CHECK`]).
    fn check_due(&self) -> bool {
        let mut last = self.checked.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if now.duration_since(*last) < PEER_ALIVE_CHECK {
            return false;
        }
        *last = now;
        true
    }

    fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Marks it gone and lets go of what it held.
    fn let_go(&self) {
        self.gone.store(true, Ordering::Release);
        self.tx.forget();
    }
}

/// Whether a send by a connected socket failed because its peer socket
/// is closed (`ECONNREFUSED` the first time, `ENOTCONN` after).
fn refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::ENOTCONN))
}

/// The bound socket of each local port, by GID.
type Locals = Arc<Mutex<Map<[u8; 16], Arc<UnixDatagram>>>>;

/// How often the offer thread looks for peers that exited, to let go of
/// what this process held for them.
const PEER_CHECK: Duration = Duration::from_secs(1);

/// Peers a fabric offers memory to at most (beyond, bytes go).
const MAX_PEERS: usize = 1024;

impl UnixSockets {
    /// Sockets in `dir` (created 0700 if missing; refused if another user
    /// can write to it).
    pub(super) fn new(
        dir: &Path,
        health: Arc<Health>,
        capture: Option<Arc<Capture>>,
    ) -> io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        check_private_dir(
            dir,
            "take the place of a device: use a directory only you can write to \
             (--fabric DIR) or --no-fabric",
        )?;
        // A receiver checks that an offer comes from the socket of the GID
        // it names, by the path the sender bound: both processes must
        // spell the directory alike, whatever path each was given.
        let dir = &std::fs::canonicalize(dir)?;
        let (wake, woken) = UnixDatagram::pair()?;
        wake.set_nonblocking(true)?;
        woken.set_nonblocking(true)?;
        let out = Arc::new(Outbox {
            pending: Mutex::default(),
            total: AtomicUsize::new(0),
            wake,
            stop: AtomicBool::new(false),
        });
        let lost = Arc::new(AtomicU64::new(0));
        let (o, l) = (out.clone(), lost.clone());
        let tx_thread = std::thread::Builder::new()
            .name("efa-fabric-tx".into())
            .spawn(move || transmit(&o, &woken, &l))?;
        let peers: Peers = Arc::default();
        let locals: Locals = Arc::default();
        let (offer_wake, offer_woken) = sync_channel(1);
        let offerer = Offerer {
            dir: dir.to_path_buf(),
            peers: peers.clone(),
            locals: locals.clone(),
        };
        let offer_thread = std::thread::Builder::new()
            .name("efa-fabric-offer".into())
            .spawn(move || offerer.run(&offer_woken))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            health,
            out,
            tx_thread: Some(tx_thread),
            lost,
            routes: Map::default(),
            receivers: Vec::new(),
            capture,
            peers,
            locals,
            wake: Some(offer_wake),
            offer_thread: Some(offer_thread),
            ledger: Ledger::new(),
            closer: Closer::new()?,
            descs: Vec::with_capacity(share::MAX_DESCS),
            buf: Vec::new(),
        })
    }
}

impl Transport for UnixSockets {
    fn attach(&mut self, port: &Arc<Port>) -> io::Result<()> {
        let path = socket_path(&self.dir, &port.gid);
        // A socket left by a process that died; a live one would have the
        // same GID, which the GID default rules out.
        let _ = std::fs::remove_file(&path);
        let rx = Arc::new(bind_with_credentials(&path)?);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        super::set_socket_buffer(rx.as_fd(), 4 << 20, &[libc::SO_RCVBUF]);
        rx.set_read_timeout(Some(Duration::from_millis(200)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (weak, st, health) = (Arc::downgrade(port), stop.clone(), self.health.clone());
        let capture = self.capture.clone();
        let rings = Arc::new(RxRings {
            state: Mutex::default(),
            health: health.clone(),
            capture: capture.clone(),
        });
        port.set_inbound(Some(rings.clone()));
        let rx_ctx = RxContext {
            dir: self.dir.clone(),
            peers: self.peers.clone(),
            ledger: self.ledger.clone(),
            closer: self.closer.clone(),
            rings,
        };
        self.locals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port.gid, rx.clone());
        let h = std::thread::Builder::new()
            .name("efa-fabric-rx".into())
            .spawn(move || {
                receive(rx, weak.clone(), st, &health, capture.as_deref(), rx_ctx);
                // What it mapped of its peers went with it.
                if let Some(port) = weak.upgrade() {
                    port.set_inbound(None);
                }
            })?;
        self.receivers.push((path, stop, Some(h)));
        Ok(())
    }

    fn detach(&mut self, gid: &[u8; 16]) {
        self.locals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(gid);
        let path = socket_path(&self.dir, gid);
        self.receivers.retain_mut(|(p, stop, h)| {
            if *p != path {
                return true;
            }
            stop.store(true, Ordering::Relaxed);
            if let Some(h) = h.take() {
                let _ = h.join();
            }
            let _ = std::fs::remove_file(&*p);
            false
        });
    }

    fn send(&mut self, p: &Packet) -> bool {
        let mut bytes = std::mem::take(&mut self.buf);
        bytes.clear();
        // Once, if the last buffer went to the transmit thread.
        bytes.reserve(96 + p.payload_len());
        p.encode_into(&mut bytes);
        let sent = match self.ringed_peer(p) {
            // The copy into the ring.
            Some(peer) if self.send_by_ring(p, &peer, &bytes, p.payload_len()) => true,
            // The kernel's copy into the datagram.
            _ => self.send_bytes(p, &mut bytes, p.payload_len()),
        };
        self.buf = bytes;
        sent
    }

    fn send_described(&mut self, p: &Packet) -> Option<Result<bool, Fault>> {
        let data = p.data()?;
        let peer = {
            let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            match peers.get(&(p.src_gid, p.dst_gid)) {
                // The process behind the GID exited (a new one may be
                // there): start over, offering everything again.
                Some(peer) if peer.is_gone() => {
                    peer.let_go();
                    let peer = Peer::new();
                    peers.insert((p.src_gid, p.dst_gid), peer.clone());
                    peer
                }
                Some(peer) => peer.clone(),
                // No memfd yet: the pin table is made when an offer goes
                // out (by the offer thread).
                None if peers.len() < MAX_PEERS => {
                    let peer = Peer::new();
                    peers.insert((p.src_gid, p.dst_gid), peer.clone());
                    peer
                }
                None => return None,
            }
        };
        let mut descs = std::mem::take(&mut self.descs);
        let mut new_offer = false;
        let described = data.describe(&peer.tx, &mut descs, &mut |_, _| new_offer = true);
        if new_offer {
            // The offer thread sends it: a full or absent peer costs this
            // data path nothing. Full: it is awake already.
            if let Some(w) = &self.wake {
                let _ = w.try_send(());
            }
        }
        let r = match described {
            Err(fault) => Some(Err(fault)),
            Ok(false) => None,
            Ok(true) => {
                let mut bytes = std::mem::take(&mut self.buf);
                bytes.clear();
                bytes.reserve(96 + descs.len() * share::DESC_BYTES);
                p.encode_described(&mut bytes, &descs);
                // Descriptors, not bytes: the receiver copies the payload.
                // By the ring or the link only (see `Peer`); the link
                // refused, the process that accepted is gone, and the
                // bytes go to whoever is there.
                let r = if self.send_by_ring(p, &peer, &bytes, 0) {
                    Some(Ok(true))
                } else {
                    self.send_linked(p, &peer, &mut bytes).map(Ok)
                };
                self.buf = bytes;
                r
            }
        };
        self.descs = descs;
        r
    }

    fn max_segment(&self) -> usize {
        MAX_SEGMENT
    }

    fn describe(&self) -> String {
        format!("unix sockets in {}", self.dir.display())
    }

    fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

impl UnixSockets {
    /// The peer of `p`'s ports whose ring packets take, if it has one.
    /// A peer without a ring is offered it alone ([`PeerTx::ring_alone`])
    /// unless memory was offered to it: a port that is sent descriptors
    /// answers with acknowledgements and read requests, which describe
    /// nothing, and they would cost a `sendto` each, and a receive, a
    /// hand-off and a wakeup each at the peer.
    fn ringed_peer(&self, p: &Packet) -> Option<Arc<Peer>> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let key = (p.src_gid, p.dst_gid);
        let peer = match peers.get(&key) {
            Some(peer) if peer.ring.get().is_some() && !peer.is_gone() => {
                return Some(peer.clone())
            }
            Some(peer) if !peer.is_gone() => peer.clone(),
            // Its process exited: a new one at the GID is offered the
            // ring afresh.
            Some(peer) => {
                peer.let_go();
                let peer = Peer::new();
                peers.insert(key, peer.clone());
                peer
            }
            None if peers.len() < MAX_PEERS => {
                let peer = Peer::new();
                peers.insert(key, peer.clone());
                peer
            }
            None => return None,
        };
        if peer.tx.ring_alone() {
            // As a new offer of memory (`send_described`).
            if let Some(w) = &self.wake {
                let _ = w.try_send(());
            }
        }
        None
    }

    /// Publishes `bytes`, the wire form of `p` with `copies` payload bytes
    /// in it, on `peer`'s ring, and wakes the peer if it sleeps: whether
    /// it did (not if there is no ring, or no room: then the socket
    /// takes it, and it may pass packets waiting on the ring, as SRD and
    /// UD allow).
    ///
    /// Packets between two ports keep their order, which SRD's probes
    /// count on (a probe must not pass its request, nor a reply to it the
    /// answer): a packet goes by the ring only while nothing to the peer
    /// waits for room in its socket queue, and the receiver takes what
    /// is on the ring before a datagram that came after it.
    fn send_by_ring(&mut self, p: &Packet, peer: &Peer, bytes: &[u8], copies: usize) -> bool {
        let (Some(table), Some(link)) = (peer.ring.get(), peer.link.get()) else {
            return false;
        };
        if peer.is_gone()
            || self
                .routes
                .get(&p.dst_gid)
                .is_some_and(|r| r.queued.load(Ordering::Acquire) > 0)
        {
            return false;
        }
        let ring = table.ring();
        let mut head = peer.ring_head.load(Ordering::Relaxed);
        // A consumer that exited takes nothing and refuses nothing, as its
        // socket did: one behind is asked whether its process still runs,
        // once a millisecond at most, so that a successor at its GID is
        // sent bytes after a packet or so, not a ring's worth.
        if ring.backlog(head) > 0 && peer.check_due() && peer.tx.gone() {
            peer.gone.store(true, Ordering::Release);
            return false;
        }
        let Pushed::Sent { kick } = ring.push(&mut head, bytes, || copied(copies)) else {
            return false;
        };
        peer.ring_head.store(head, Ordering::Relaxed);
        if let Some(c) = &self.capture {
            c.record(Direction::Out, Via::Unix, None, bytes);
        }
        if kick {
            match send_now(link, &KICK) {
                Ok(()) => {}
                Err(e) if refused(&e) => peer.gone.store(true, Ordering::Release),
                // Its queue is full, so it has datagrams to wake it; the
                // next packet kicks again all the same.
                Err(_) => ring.rearm(),
            }
        }
        true
    }

    /// The route to `gid`, made if there is none (`None`: no socket for
    /// it, out of descriptors say).
    fn route(&mut self, gid: &[u8; 16]) -> Option<Arc<Route>> {
        if let Some(r) = self.routes.get(gid) {
            return Some(r.clone());
        }
        if self.routes.len() >= ROUTES {
            // Those with packets waiting stay, so that a packet cannot pass
            // them by a new route.
            self.routes
                .retain(|_, r| r.queued.load(Ordering::Acquire) > 0);
        }
        let r = match Route::new(socket_path(&self.dir, gid)) {
            Ok(r) => Arc::new(r),
            Err(e) => {
                log::warn!("fabric: no socket to send by: {e}");
                return None;
            }
        };
        self.routes.insert(*gid, r.clone());
        Some(r)
    }

    /// Sends `bytes`, a packet with descriptors, by `peer`'s link: `None`
    /// if it has none or its socket is closed (and `peer` is gone).
    fn send_linked(&mut self, p: &Packet, peer: &Arc<Peer>, bytes: &mut Vec<u8>) -> Option<bool> {
        let link = peer.link.get()?;
        let route = self.route(&p.dst_gid)?;
        // As in `send_bytes`: nothing waits on the route, so this cannot
        // pass a packet sent before it.
        let r = if route.queued.load(Ordering::Acquire) == 0 {
            send_now(link, bytes)
        } else {
            Err(io::ErrorKind::WouldBlock.into())
        };
        if let Err(e) = &r {
            if refused(e) {
                peer.gone.store(true, Ordering::Release);
                return None;
            }
        }
        if let Some(c) = &self.capture {
            c.record(Direction::Out, Via::Unix, None, bytes);
        }
        Some(match r {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.hand_over(&route, Some(peer.clone()), bytes, 0)
            }
            Err(_) => {
                self.lost.fetch_add(1, Ordering::Relaxed);
                true
            }
        })
    }

    /// Sends a packet's wire form `bytes` (taken if it has to wait);
    /// `copies` payload bytes are copied by the kernel into the datagram.
    fn send_bytes(&mut self, p: &Packet, bytes: &mut Vec<u8>, mut copies: usize) -> bool {
        let Some(route) = self.route(&p.dst_gid) else {
            self.lost.fetch_add(1, Ordering::Relaxed);
            return true;
        };
        if let Some(c) = &self.capture {
            c.record(Direction::Out, Via::Unix, None, bytes);
        }
        // The fabric holds its transport's lock: nothing is handed to the
        // transmit thread meanwhile, and what it had for this route is
        // sent, so this packet cannot pass one sent before it.
        if route.queued.load(Ordering::Acquire) == 0 {
            // Counted before the send, which copies the payload whatever
            // becomes of the datagram: counted after it, the copy could be
            // counted only after the receiver had completed the message,
            // and a count taken then would miss it.
            copied(copies);
            match route.send(bytes) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Sent, or nobody there (the packet is lost).
                r => {
                    if r.is_err() {
                        self.lost.fetch_add(1, Ordering::Relaxed);
                    }
                    return true;
                }
            }
            // Counted once already: the transmit thread's send of it is
            // not counted again.
            copies = 0;
        }
        self.hand_over(&route, None, bytes, copies)
    }

    /// Hands `bytes` to the transmit thread (taking it), for `route` (by
    /// `link`'s link if it is a peer's).
    fn hand_over(
        &mut self,
        route: &Arc<Route>,
        link: Option<Arc<Peer>>,
        bytes: &mut Vec<u8>,
        copies: usize,
    ) -> bool {
        // Full queues lose the packet, as a congested network would; SRD
        // retransmits.
        // Only this thread adds (under the fabric's lock on its transport).
        let out = &self.out;
        if route.queued.load(Ordering::Acquire) >= ROUTE_QUEUE
            || out.total.load(Ordering::Acquire) >= TX_QUEUE
        {
            self.lost.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // Before the transmit thread can have it (see `send_bytes`).
        copied(copies);
        out.total.fetch_add(1, Ordering::AcqRel);
        let first = {
            let mut q = route.lock();
            q.push_back(Waiting {
                link,
                bytes: std::mem::take(bytes),
                until: None,
            });
            // Counted under the lock, as the transmit thread uncounts: it
            // finds the route empty only once it counts nothing.
            route.queued.fetch_add(1, Ordering::AcqRel) == 0
        };
        if first {
            out.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(route.clone());
            // Full: it is awake already.
            let _ = out.wake.send(&[0]);
        }
        true
    }
}

impl Drop for UnixSockets {
    fn drop(&mut self) {
        // Closing the channel ends the offer thread.
        self.wake = None;
        if let Some(h) = self.offer_thread.take() {
            let _ = h.join();
        }
        for (path, stop, h) in &mut self.receivers {
            stop.store(true, Ordering::Relaxed);
            if let Some(h) = h.take() {
                let _ = h.join();
            }
            let _ = std::fs::remove_file(&*path);
        }
        self.out.stop.store(true, Ordering::Release);
        let _ = self.out.wake.send(&[0]);
        if let Some(h) = self.tx_thread.take() {
            let _ = h.join();
        }
    }
}

/// What a fabric's transmit thread is handed.
struct Outbox {
    /// Routes that had nothing waiting and now have.
    pending: Mutex<Vec<Arc<Route>>>,
    /// Packets waiting on all routes.
    total: AtomicUsize,
    /// Wakes the transmit thread (a datagram to its end of the pair).
    wake: UnixDatagram,
    /// Ends it.
    stop: AtomicBool,
}

/// The way to one destination GID: a socket connected to the one bound
/// at its path (again after that one closed: a new process may be
/// there), and the packets to it waiting for room in its queue.
struct Route {
    path: PathBuf,
    sock: UnixDatagram,
    waiting: Mutex<VecDeque<Waiting>>,
    /// How many wait, changed under `waiting`'s lock; read without it by
    /// the data path, which sends directly only while none do.
    queued: AtomicUsize,
}

/// A packet waiting on a route.
struct Waiting {
    /// The peer whose link it goes by (it carries descriptors), or none:
    /// the route's socket.
    link: Option<Arc<Peer>>,
    bytes: Vec<u8>,
    /// Lost if not sent by then: [`TX_TIMEOUT`] from the first time the
    /// transmit thread found no room for it, at the head of its route. So
    /// a peer that reads at all, however slowly, loses nothing, and one
    /// that reads nothing loses one packet each [`TX_TIMEOUT`] (what a
    /// send with that write timeout did) until its route is full.
    until: Option<Instant>,
}

impl Route {
    fn new(path: PathBuf) -> io::Result<Self> {
        let sock = UnixDatagram::unbound()?;
        super::set_socket_buffer(sock.as_fd(), 4 << 20, &[libc::SO_SNDBUF]);
        // Nobody there yet: connected on a later send.
        let _ = sock.connect(&path);
        Ok(Self {
            path,
            sock,
            waiting: Mutex::default(),
            queued: AtomicUsize::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `bytes` by the route's socket without waiting; connects it
    /// again if the socket it was connected to closed (or it never was).
    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        match send_now(&self.sock, bytes) {
            Err(e) if refused(&e) => {
                self.sock.connect(&self.path)?;
                send_now(&self.sock, bytes)
            }
            r => r,
        }
    }
}

/// Sends `bytes` by a connected socket without waiting for room.
fn send_now(sock: &UnixDatagram, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: send(2) on a socket we hold, reading `bytes.len()` bytes of
    // a live slice.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A socket connected to the one bound at `path`, for a peer's link.
fn connect_link(path: &Path) -> io::Result<UnixDatagram> {
    let s = UnixDatagram::unbound()?;
    super::set_socket_buffer(s.as_fd(), 4 << 20, &[libc::SO_SNDBUF]);
    s.connect(path)?;
    Ok(s)
}

/// Routes a fabric keeps (any GID an AH names may be one; beyond this many
/// those with nothing waiting go). Each holds a socket.
const ROUTES: usize = 256;

/// The transmit thread: sends what waits on each route it was handed, in
/// order, without waiting for room; a route whose peer has none waits in
/// poll(2) on its own socket while the others go on.
fn transmit(out: &Outbox, woken: &UnixDatagram, lost: &AtomicU64) {
    let mut routes: Vec<Arc<Route>> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    // Swapped with `pending`, so that neither allocates again.
    let mut handed: Vec<Arc<Route>> = Vec::new();
    loop {
        let stop = out.stop.load(Ordering::Acquire);
        std::mem::swap(
            &mut *out.pending.lock().unwrap_or_else(|e| e.into_inner()),
            &mut handed,
        );
        for r in handed.drain(..) {
            if !routes.iter().any(|x| Arc::ptr_eq(x, &r)) {
                routes.push(r);
            }
        }
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        fds.clear();
        routes.retain(|r| {
            let mut q = r.lock();
            while let Some(w) = q.front_mut() {
                // A peer's packet was handed over only with its link set.
                let link = w.link.as_ref().map(|p| p.link.get());
                let sent = match link {
                    _ if w.until.is_some_and(|t| t <= now) => Err(io::ErrorKind::TimedOut.into()),
                    Some(Some(l)) => send_now(l, &w.bytes),
                    Some(None) => Err(io::Error::from_raw_os_error(libc::ENOTCONN)),
                    None => r.send(&w.bytes),
                };
                let sock = link.flatten();
                match sent {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && !stop => {
                        fds.push(libc::pollfd {
                            fd: sock.unwrap_or(&r.sock).as_raw_fd(),
                            events: libc::POLLOUT,
                            revents: 0,
                        });
                        let until = *w.until.get_or_insert(now + TX_TIMEOUT);
                        next = Some(next.map_or(until, |t| t.min(until)));
                        return true;
                    }
                    Ok(()) => {}
                    // Nobody there, or no room in time: the packet is lost.
                    Err(e) => {
                        if let (Some(peer), true) = (&w.link, refused(&e)) {
                            peer.gone.store(true, Ordering::Release);
                        }
                        lost.fetch_add(1, Ordering::Relaxed);
                    }
                }
                q.pop_front();
                r.queued.fetch_sub(1, Ordering::AcqRel);
                out.total.fetch_sub(1, Ordering::AcqRel);
            }
            false
        });
        if stop {
            return;
        }
        fds.push(libc::pollfd {
            fd: woken.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let wait = next.map_or(-1, |t| {
            // Rounded up: woken before the deadline, it would spin.
            let d = t.saturating_duration_since(Instant::now());
            d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
        });
        // SAFETY: poll(2) on `fds.len()` live pollfds of sockets we hold
        // (routes and links stay held by `routes` across the call).
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) };
        let mut sink = [0u8; 64];
        while woken.recv(&mut sink).is_ok() {}
    }
}

/// The thread that sends this process's offers of memory: off the data
/// path, which only records an offer ([`PeerTx::region`]) and wakes it.
/// Each offer goes from the offering port's own bound socket (a receiver
/// takes an offer only from the socket of the GID it names), without
/// waiting for room, and is sent again with a growing wait until it is
/// accepted ([`PeerTx::due_offers`]). It also lets go of what this
/// process holds for peers that exited.
struct Offerer {
    dir: PathBuf,
    peers: Peers,
    locals: Locals,
}

impl Offerer {
    fn run(&self, woken: &Receiver<()>) {
        let mut due = Vec::new();
        loop {
            let now = Instant::now();
            let mut next = now + PEER_CHECK;
            let peers: Vec<(GidPair, Arc<PeerTx>)> = {
                let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
                // Gone: its pin table, pidfd and offers go now, though
                // regions described to it still hold the `PeerTx`.
                peers.retain(|_, p| {
                    let gone = p.is_gone() || p.tx.gone();
                    if gone {
                        p.let_go();
                    }
                    !gone
                });
                peers.iter().map(|(k, p)| (*k, p.tx.clone())).collect()
            };
            for ((local, remote), peer) in peers {
                due.clear();
                if let Some(t) = peer.due_offers(now, &mut due) {
                    next = next.min(t);
                }
                if !due.is_empty() {
                    if let Some(t) = self.offer(local, remote, &peer, &mut due) {
                        next = next.min(t);
                    }
                }
            }
            match woken.recv_timeout(next.saturating_duration_since(Instant::now())) {
                Ok(()) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Sends the offers `due` of `local` to `remote`; returns when one that
    /// met a full queue is to be sent again, if sooner than the usual wait.
    fn offer(
        &self,
        local: [u8; 16],
        remote: [u8; 16],
        peer: &PeerTx,
        due: &mut Vec<(Option<Arc<std::fs::File>>, u32)>,
    ) -> Option<Instant> {
        let sock = self
            .locals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&local)
            .cloned();
        // Detached: nothing to offer from (tried again later).
        let sock = sock?;
        let pins = match peer.pins_for_offer() {
            Ok(p) => p,
            Err(e) => {
                log::warn!("fabric: no pin table for an offer of memory: {e}");
                return None;
            }
        };
        let mut soon: Option<Instant> = None;
        let path = socket_path(&self.dir, &remote);
        for (file, id) in due.drain(..) {
            let (msg, fds) = match &file {
                Some(file) => {
                    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                    let msg = Control::Offer {
                        from: local,
                        to: remote,
                        id,
                        len,
                    };
                    (msg, &[file.as_raw_fd(), pins.fd().as_raw_fd()][..])
                }
                None => {
                    let msg = Control::Ring {
                        from: local,
                        to: remote,
                        id,
                    };
                    (msg, &[pins.fd().as_raw_fd()][..])
                }
            };
            match send_msg(&sock, &path, &msg.encode(), fds) {
                Ok(()) => peer.offer_sent(id),
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ECONNREFUSED)) => {
                    peer.nobody_there();
                    return soon;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Some(t) = peer.offer_busy(id, Instant::now()) {
                        soon = Some(soon.map_or(t, |s| s.min(t)));
                    }
                }
                // Tried again after the wait.
                Err(e) => log::debug!("fabric: an offer to {} was not sent: {e}", path.display()),
            }
        }
        soon
    }
}

/// The socket of `gid` in `dir`.
pub fn socket_path(dir: &Path, gid: &[u8; 16]) -> PathBuf {
    use std::fmt::Write as _;
    let mut name = String::with_capacity(4 + 32 + 5);
    name.push_str("efa-");
    for b in gid {
        let _ = write!(name, "{b:02x}");
    }
    name.push_str(".sock");
    dir.join(name)
}

/// A datagram socket bound at `path` that receives its senders'
/// credentials. `SO_PASSCRED` is set before the bind, so no datagram can
/// arrive without them.
fn bind_with_credentials(path: &Path) -> io::Result<UnixDatagram> {
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path {} is too long", path.display()),
        ));
    }
    for (d, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: setsockopt on our socket with a pointer to a live int and
    // its size; bind with a filled sockaddr_un and its size.
    let ok = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
            && libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                size_of::<libc::sockaddr_un>() as libc::socklen_t,
            ) == 0
    };
    if !ok {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixDatagram::from(fd))
}

/// The `sockaddr_un` of `path`.
fn unix_addr(path: &Path) -> io::Result<libc::sockaddr_un> {
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (d, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    Ok(addr)
}

/// Sends `msg` from `sock` to `path` with the descriptors `fds`
/// (`SCM_RIGHTS`, none if empty), without waiting for room
/// (`MSG_DONTWAIT`: `sock` may be a port's socket, whose blocking mode
/// its receive thread has).
fn send_msg(
    sock: &UnixDatagram,
    path: &Path,
    msg: &[u8],
    fds: &[std::os::fd::RawFd],
) -> io::Result<()> {
    let mut addr = unix_addr(path)?;
    // Room for two descriptors.
    let mut control = [0u64; 8];
    assert!(fds.len() <= 2, "at most two descriptors");
    let fds_bytes = size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE/CMSG_LEN are arithmetic.
    let (space, clen) = unsafe {
        (
            libc::CMSG_SPACE(fds_bytes) as usize,
            libc::CMSG_LEN(fds_bytes) as usize,
        )
    };
    debug_assert!(space <= size_of_val(&control));
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr().cast_mut().cast(),
        iov_len: msg.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid value.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_name = (&mut addr as *mut libc::sockaddr_un).cast();
    m.msg_namelen = size_of::<libc::sockaddr_un>() as libc::socklen_t;
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    if !fds.is_empty() {
        m.msg_control = control.as_mut_ptr().cast();
        m.msg_controllen = space as _;
        // SAFETY: the control buffer holds `space` bytes, room for one
        // header and the descriptors (CMSG_SPACE); CMSG_FIRSTHDR points
        // into it and the descriptors are copied unaligned into its data,
        // `fds_bytes` bytes, which CMSG_LEN counted.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&m);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = clen as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(c),
                fds_bytes as usize,
            );
        }
    }
    // SAFETY: `m` points at a live address, iovec (over `msg`, only read)
    // and, with descriptors, control buffer, with their lengths; the
    // descriptors are open.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &m, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One datagram and who sent it.
struct Datagram {
    len: usize,
    /// The sender's pid and uid, if the kernel passed them.
    sender: Option<(libc::pid_t, libc::uid_t)>,
    /// The descriptors it carried (`SCM_RIGHTS`; an offer has two).
    fds: Vec<OwnedFd>,
    /// The datagram or its ancillary data did not fit (descriptors that
    /// did not fit are closed by the kernel then).
    truncated: bool,
    /// The address of the socket it was sent from: the path it is bound
    /// to, empty for an unbound one.
    source: libc::sockaddr_un,
    source_len: usize,
}

impl Datagram {
    /// The path the sending socket was bound to (empty: none).
    fn source(&self) -> &[u8] {
        let at = std::mem::offset_of!(libc::sockaddr_un, sun_path);
        let n = self
            .source_len
            .saturating_sub(at)
            .min(self.source.sun_path.len());
        // SAFETY: `sun_path` is an array of `c_char`, of the size and
        // alignment of `u8`; `n` is at most its length.
        let path = unsafe { std::slice::from_raw_parts(self.source.sun_path.as_ptr().cast(), n) };
        // The kernel counts the path's NUL in the length.
        path.split(|&b| b == 0).next().unwrap_or(&[])
    }

    /// Whether it was sent from the socket bound at `path`.
    fn sent_from(&self, path: &Path) -> bool {
        !self.source().is_empty() && self.source() == path.as_os_str().as_bytes()
    }
}

/// Datagrams a receive thread takes with one recvmmsg(2) at most: as
/// many as are queued, up to this, for one system call.
const RX_BATCH: usize = 8;

/// Bytes of control buffer a datagram has: room for one ucred and two
/// descriptors (more truncate).
const CONTROL: usize = 96;

/// A receive thread's buffers for [`RxBatch::recv`]: one datagram's
/// bytes, control buffer and source address for each of [`RX_BATCH`].
struct RxBatch {
    bufs: Vec<Vec<u8>>,
    controls: Vec<[u64; CONTROL / 8]>,
    sources: Vec<libc::sockaddr_un>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

impl RxBatch {
    fn new() -> Self {
        // SAFETY: sockaddr_un, iovec and mmsghdr are plain data; zeroed
        // is a valid value of each (null pointers, zero lengths).
        let (source, iov, hdr) = unsafe {
            (
                std::mem::zeroed::<libc::sockaddr_un>(),
                std::mem::zeroed::<libc::iovec>(),
                std::mem::zeroed::<libc::mmsghdr>(),
            )
        };
        Self {
            bufs: (0..RX_BATCH)
                .map(|_| vec![0u8; MAX_SEGMENT + 256])
                .collect(),
            controls: vec![[0u64; CONTROL / 8]; RX_BATCH],
            sources: vec![source; RX_BATCH],
            iovs: vec![iov; RX_BATCH],
            hdrs: vec![hdr; RX_BATCH],
        }
    }

    /// Receives up to [`RX_BATCH`] datagrams, waiting (as long as the
    /// socket's read timeout) for the first only, each with its
    /// `SCM_CREDENTIALS` and up to two descriptors, or none unless `fds`
    /// (more are closed by the kernel, and the datagram is truncated).
    /// Returns how many; [`RxBatch::datagram`] has each.
    fn recv(&mut self, rx: &UnixDatagram, fds: bool) -> io::Result<usize> {
        // SAFETY: CMSG_SPACE is arithmetic.
        let need = unsafe {
            libc::CMSG_SPACE(size_of::<libc::ucred>() as u32)
                + if fds {
                    libc::CMSG_SPACE(2 * size_of::<libc::c_int>() as u32)
                } else {
                    0
                }
        } as usize;
        debug_assert!(need <= CONTROL);
        for i in 0..RX_BATCH {
            self.iovs[i] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: self.bufs[i].len(),
            };
            let h = &mut self.hdrs[i];
            h.msg_len = 0;
            h.msg_hdr.msg_name = (&mut self.sources[i] as *mut libc::sockaddr_un).cast();
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_un>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = self.controls[i].as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = need as _;
            h.msg_hdr.msg_flags = 0;
        }
        // SAFETY: each of the RX_BATCH headers points at a live address
        // buffer, an iovec over its own buffer and its control buffer, all
        // as large as the lengths say, and none moves while the call runs
        // (`&mut self`). Close-on-exec: the descriptors kept (a peer's
        // memfd and pin table) must not leak into a child. MSG_WAITFORONE:
        // only the first waits.
        let n = unsafe {
            libc::recvmmsg(
                rx.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                RX_BATCH as libc::c_uint,
                libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Datagram `i` of those the last [`RxBatch::recv`] took, and its
    /// bytes; its descriptors are owned from here on, and a second call
    /// finds none.
    fn datagram(&mut self, i: usize) -> (Datagram, &[u8]) {
        let h = &self.hdrs[i];
        let msg = &h.msg_hdr;
        let len = h.msg_len as usize;
        let mut sender = None;
        let mut fds = Vec::new();
        // SAFETY: the CMSG macros walk the control buffer the kernel filled,
        // within `msg_controllen`; the ucred and the descriptors are read
        // unaligned from inside it, and each descriptor the kernel installed
        // is owned from here on (closed when dropped): the control length
        // is cleared below, so no later call walks them again.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET
                    && (*c).cmsg_type == libc::SCM_CREDENTIALS
                    && (*c).cmsg_len as usize
                        >= libc::CMSG_LEN(size_of::<libc::ucred>() as u32) as usize
                {
                    let u: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    sender = Some((u.pid, u.uid));
                }
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c);
                    let n = ((*c).cmsg_len as usize - (data as usize - c as usize))
                        / size_of::<libc::c_int>();
                    for i in 0..n {
                        let fd: libc::c_int =
                            std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                c = libc::CMSG_NXTHDR(msg, c);
            }
        }
        let d = Datagram {
            len,
            sender,
            fds,
            truncated: msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0,
            source_len: msg.msg_namelen as usize,
            source: self.sources[i],
        };
        self.hdrs[i].msg_hdr.msg_controllen = 0;
        (d, &self.bufs[i][..len.min(self.bufs[i].len())])
    }
}

/// What a receive thread shares with its fabric.
struct RxContext {
    dir: PathBuf,
    peers: Peers,
    ledger: Arc<Ledger>,
    closer: Closer,
    /// The rings of the peers that offered the port memory.
    rings: Arc<RxRings>,
}

/// Descriptors a fabric's closing thread may have waiting: beyond, the
/// receive threads take no more (the kernel drops what a datagram
/// carries, unopened, and the datagram is refused as truncated).
const CLOSE_QUEUE: usize = 64;

/// A thread that closes the descriptors a peer sent that are not of
/// memory ([`share::is_memory`]): any process of our uid may send any
/// descriptor, and closing a FUSE file waits for its daemon (FLUSH), a
/// socket with `SO_LINGER` for its data to leave: on a receive thread
/// that would stop the port. Only this thread waits then, and it is not
/// joined: it ends once the fabric is gone and its closes return.
#[derive(Clone)]
struct Closer {
    tx: std::sync::mpsc::Sender<OwnedFd>,
    waiting: Arc<AtomicUsize>,
}

impl Closer {
    fn new() -> io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<OwnedFd>();
        let waiting = Arc::new(AtomicUsize::new(0));
        let w = waiting.clone();
        std::thread::Builder::new()
            .name("efa-fabric-close".into())
            .spawn(move || {
                for fd in rx {
                    drop(fd);
                    w.fetch_sub(1, Ordering::Relaxed);
                }
            })?;
        Ok(Self { tx, waiting })
    }

    /// Whether a receive may take descriptors (two per datagram at most,
    /// [`RX_BATCH`] datagrams; a few receive threads may pass this at
    /// once).
    fn room(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) + 2 * RX_BATCH <= CLOSE_QUEUE
    }

    fn close(&self, fd: OwnedFd) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.tx.send(fd) {
            // The thread is gone (it does not end while we hold `tx`).
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            drop(e.0);
        }
    }
}

/// What peers offered a port, by (pid, GID).
type Shared = Map<(libc::pid_t, [u8; 16]), Arc<PeerRx>>;

/// Why a packet a peer sent was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dropped {
    OutOfRange,
    OtherGid,
    Malformed,
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dropped::OutOfRange => "descriptors outside the memory its sender offered",
            Dropped::OtherGid => "for another GID",
            Dropped::Malformed => "malformed",
        })
    }
}

/// Decodes a packet for the port `gid` from a peer, which offered `peer`
/// if anything: descriptors must lie in what it offered.
fn decode(bytes: &[u8], peer: Option<&PeerRx>, gid: &[u8; 16]) -> Result<Packet, Dropped> {
    let mut out_of_range = false;
    let decoded = Packet::decode_with(bytes, &mut |descs| {
        let r = peer.and_then(|p| p.resolve(descs, super::payload::MAX_PIECES));
        out_of_range = r.is_none();
        r.map(Data::remote)
    });
    if out_of_range {
        return Err(Dropped::OutOfRange);
    }
    let p = decoded.ok_or(Dropped::Malformed)?;
    if p.dst_gid != *gid {
        return Err(Dropped::OtherGid);
    }
    // The copy out of the datagram or the ring (none for descriptors: the
    // receiver copies the payload).
    if !p.data().is_some_and(Data::is_remote) {
        copied(p.payload_len());
    }
    Ok(p)
}

/// The rings of the peers that offered a port memory, which the port's
/// owner reads ([`super::Inbound`]): registered by the port's receive
/// thread when it maps a peer's pin table, let go once the receive thread
/// lets go of the peer.
struct RxRings {
    state: Mutex<RxRingState>,
    health: Arc<Health>,
    capture: Option<Arc<Capture>>,
}

#[derive(Default)]
struct RxRingState {
    rings: Vec<RxRing>,
    /// An entry, copied out of its ring before it is decoded.
    buf: Vec<u8>,
    /// What one poll delivers.
    packets: Vec<Packet>,
}

/// A peer's ring, as its consumer sees it.
struct RxRing {
    peer: Weak<PeerRx>,
    /// The GID the peer offered under: its packets must come from it.
    gid: [u8; 16],
    /// Entries taken.
    tail: u64,
}

impl RxRings {
    fn add(&self, peer: &Arc<PeerRx>, gid: [u8; 16]) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.rings.retain(|r| r.peer.strong_count() > 0);
        st.rings.push(RxRing {
            peer: Arc::downgrade(peer),
            gid,
            tail: 0,
        });
    }
}

impl super::Inbound for RxRings {
    fn poll(&self, port: &Port, max: usize) {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        let mut gone = false;
        for r in &mut st.rings {
            let Some(peer) = r.peer.upgrade() else {
                gone = true;
                continue;
            };
            let ring = peer.pins.ring();
            while st.packets.len() < max {
                match ring.pop(&mut r.tail, &mut st.buf) {
                    Popped::Empty => break,
                    Popped::Corrupt => {
                        report!(
                            self.health,
                            Warn,
                            Some(Class::FabricRejected),
                            "fabric-ring",
                            "fabric: dropped what a peer's ring held: impossible counts or lengths"
                        );
                    }
                    Popped::Entry => {
                        if let Some(c) = &self.capture {
                            c.record(Direction::In, Via::Unix, None, &st.buf);
                        }
                        let p = decode(&st.buf, Some(&peer), &port.gid).and_then(|p| {
                            if p.src_gid == r.gid {
                                Ok(p)
                            } else {
                                Err(Dropped::OtherGid)
                            }
                        });
                        match p {
                            Ok(p) => st.packets.push(p),
                            Err(why) => report!(
                                self.health,
                                Warn,
                                Some(Class::FabricRejected),
                                "fabric-ring",
                                "fabric: dropped an entry of a peer's ring: {why}, {} bytes",
                                st.buf.len()
                            ),
                        }
                    }
                }
            }
        }
        if gone {
            st.rings.retain(|r| r.peer.strong_count() > 0);
        }
        if !st.packets.is_empty() {
            port.deliver_all(st.packets.drain(..));
        }
    }

    fn arm(&self) -> bool {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut pending = false;
        for r in &st.rings {
            if let Some(peer) = r.peer.upgrade() {
                pending |= peer.pins.ring().arm(r.tail);
            }
        }
        pending
    }

    fn disarm(&self) {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for r in &st.rings {
            if let Some(peer) = r.peer.upgrade() {
                peer.pins.ring().disarm();
            }
        }
    }
}

/// Peers (pid, GID) a port maps the memory of at most.
const MAX_PEERS_RX: usize = 256;

fn receive(
    rx: Arc<UnixDatagram>,
    port: Weak<Port>,
    stop: Arc<AtomicBool>,
    health: &Health,
    capture: Option<&Capture>,
    ctx: RxContext,
) {
    let mut batch = RxBatch::new();
    // What peers offered this port, by (pid, GID).
    let mut shared: Shared = Map::default();
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    let reject = |why: std::fmt::Arguments<'_>| {
        report!(
            health,
            Warn,
            Some(Class::FabricRejected),
            "fabric-socket",
            "fabric: dropped a datagram: {why}"
        )
    };
    // One datagram: false once the port is gone.
    let handle = |mut d: Datagram, bytes: &[u8], shared: &mut Shared| -> bool {
        // Before anything else: every way the datagram is refused
        // below closes its descriptors here.
        if d.fds.iter().any(|f| !share::is_memory(f.as_fd())) {
            for fd in d.fds.drain(..) {
                ctx.closer.close(fd);
            }
            reject(format_args!("carrying descriptors not of memory"));
            return true;
        }
        let Some(port) = port.upgrade() else {
            return false;
        };
        match d.sender {
            // The kernel attaches the sender's real uid to every
            // datagram (SO_PASSCRED was on before the bind); the
            // pid is 0 for a sender in another pid namespace.
            Some((_, uid)) if uid == me => {}
            Some((pid, uid)) => {
                reject(format_args!("from pid {pid} uid {uid}, not uid {me}"));
                return true;
            }
            None => {
                reject(format_args!("without its sender's credentials"));
                return true;
            }
        }
        if d.truncated {
            reject(format_args!(
                "longer than any packet, or carrying too many descriptors \
                 (or any while the closing thread is behind)"
            ));
            return true;
        }
        let Some(sender) = d.sender else {
            return true;
        };
        if bytes == KICK {
            // A peer published on its ring while the port's owner slept.
            port.kick();
            return true;
        }
        if Control::is_control(bytes) {
            match control(d, bytes, sender, &port, shared, &ctx) {
                Ok(Some((to, msg))) => {
                    // From the port's own socket (the offerer takes
                    // an acceptance from the GID's socket only), and
                    // without waiting: into a peer's full queue it
                    // is lost, and offered again later, since that
                    // peer's receive thread may itself be waiting
                    // on our full queue.
                    let _ = send_msg(&rx, &socket_path(&ctx.dir, &to), &msg, &[]);
                }
                Ok(None) => {}
                Err(why) => reject(format_args!("{why}")),
            }
            return true;
        }
        // Packets only: offers and acceptances are not recorded.
        if let Some(c) = capture {
            c.record(Direction::In, Via::Unix, None, bytes);
        }
        if !d.fds.is_empty() {
            reject(format_args!("a packet carrying descriptors"));
            return true;
        }
        let src: Option<[u8; 16]> = bytes.get(6..22).and_then(|g| g.try_into().ok());
        let peer = src.and_then(|g| shared.get(&(sender.0, g)));
        match decode(bytes, peer.map(|p| &**p), &port.gid) {
            Ok(p) => {
                // After what its sender published on its ring before it
                // sent this: packets between two ports keep their order
                // (a reply to a probe must not pass the answer before it).
                super::Inbound::poll(&*ctx.rings, &port, usize::MAX);
                port.deliver(p)
            }
            Err(Dropped::Malformed) => reject(format_args!("malformed, {} bytes", d.len)),
            Err(why) => reject(format_args!("{why}")),
        }
        true
    };
    while !stop.load(Ordering::Relaxed) {
        match batch.recv(&rx, ctx.closer.room()) {
            Ok(n) => {
                // Every one, though the port went: each holds the
                // descriptors the kernel installed for it.
                let mut gone = false;
                for i in 0..n {
                    let (d, bytes) = batch.datagram(i);
                    gone |= !handle(d, bytes, &mut shared);
                }
                if gone {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                shared.retain(|_, p| p.sender_alive());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::error!("fabric: receive failed: {e}");
                return;
            }
        }
    }
}

/// A control message to send back, and the GID it goes to.
type Answer = ([u8; 16], Vec<u8>);

/// Handles an offer or an acceptance `bytes` from `sender` (pid, uid), of
/// the datagram `d`: an answer to send (to a GID), or why it was refused.
///
/// A packet's descriptors count only against what its sending process
/// offered under the packet's source GID (the pid is the kernel's); a
/// control message is held to more: it must come from the socket bound
/// at the GID it names as `from`, which only the process at that GID
/// has. Otherwise any process of our uid could send an offer in another
/// port's name, and so drop what that port offered (its descriptors then
/// refused until it restarts), or an acceptance, and so have a port send
/// descriptors of memory its peer never mapped.
fn control(
    d: Datagram,
    bytes: &[u8],
    sender: (libc::pid_t, libc::uid_t),
    port: &Port,
    shared: &mut Shared,
    ctx: &RxContext,
) -> Result<Option<Answer>, String> {
    let Some(c) = Control::decode(bytes) else {
        return Err("a malformed offer or acceptance".into());
    };
    let (Control::Accept { from, .. } | Control::Offer { from, .. } | Control::Ring { from, .. }) =
        c;
    let claimed = socket_path(&ctx.dir, &from);
    if !d.sent_from(&claimed) {
        return Err(format!(
            "an offer or acceptance in the name of {} from pid {}, sent from {:?}, not its socket",
            std::net::Ipv6Addr::from(from),
            sender.0,
            String::from_utf8_lossy(d.source()),
        ));
    }
    let fds = d.fds;
    match c {
        Control::Accept { from, to, id } => {
            if to != port.gid || !fds.is_empty() {
                return Err("an acceptance for another GID, or with descriptors".into());
            }
            let peers = ctx.peers.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(p) = peers.get(&(to, from)) {
                // Connected now, before `accepted` opens the acceptor's
                // pidfd and finds it alive (see `Peer`). Nobody there
                // any more: the acceptance is stale.
                if p.link.get().is_none() {
                    match connect_link(&claimed) {
                        Ok(s) => {
                            let _ = p.link.set(s);
                        }
                        Err(e) => return Err(format!("an acceptance from a socket gone: {e}")),
                    }
                }
                if !p.tx.accepted(id, sender.0) {
                    return Err(format!(
                        "an acceptance from pid {} for a peer another process accepted for",
                        sender.0
                    ));
                }
                // The acceptor mapped our pin table with its first offer,
                // and reads the ring in it from then on.
                if p.ring.get().is_none() && !p.tx.gone() && p.tx.has_pins() {
                    if let Ok(t) = p.tx.pins_for_offer() {
                        let _ = p.ring.set(t);
                    }
                }
            }
            Ok(None)
        }
        Control::Offer { from, to, id, len } => {
            let refuse = |why: String| Err(format!("an offer of memory refused: {why}"));
            if to != port.gid {
                return refuse("for another GID".into());
            }
            let [memfd, table]: [OwnedFd; 2] = match fds.try_into() {
                Ok(f) => f,
                Err(_) => return refuse("not two descriptors".into()),
            };
            let key = (sender.0, from);
            forget_replaced(shared, key);
            let answer = Control::Accept {
                from: port.gid,
                to: from,
                id,
            };
            // Offered again: our acceptance was lost (the sender's queue
            // was full). The region's id names one memfd of that sender.
            if shared.get(&key).is_some_and(|p| {
                p.regions
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains_key(&id)
            }) {
                return Ok(Some((from, answer.encode())));
            }
            if !shared.contains_key(&key) && shared.len() >= MAX_PEERS_RX {
                return refuse("too many peers".into());
            }
            // Within the sender's share: its regions and bytes; nothing is
            // kept of a refused offer.
            let mapped = match share::accept_charged(&memfd, 0, len, sender, &ctx.ledger) {
                Ok(m) => m,
                Err(e) => return refuse(e.to_string()),
            };
            let peer = match peer_rx(shared, key, table, ctx) {
                Ok(p) => p,
                Err(e) => return refuse(e),
            };
            peer.regions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id, Arc::new(mapped));
            Ok(Some((from, answer.encode())))
        }
        Control::Ring { from, to, id } => {
            let refuse = |why: String| Err(format!("an offer of a ring refused: {why}"));
            if to != port.gid {
                return refuse("for another GID".into());
            }
            let [table]: [OwnedFd; 1] = match fds.try_into() {
                Ok(f) => f,
                Err(_) => return refuse("not one descriptor".into()),
            };
            let key = (sender.0, from);
            forget_replaced(shared, key);
            if !shared.contains_key(&key) && shared.len() >= MAX_PEERS_RX {
                return refuse("too many peers".into());
            }
            // A peer known already (offered again, our acceptance lost)
            // keeps the pin table it sent first: it sends one per port.
            if let Err(e) = peer_rx(shared, key, table, ctx) {
                return refuse(e);
            }
            let answer = Control::Accept {
                from: port.gid,
                to: from,
                id,
            };
            Ok(Some((from, answer.encode())))
        }
    }
}

/// Forgets what the process that offered before `key` (its pid, its GID)
/// did under that GID: a process that took over the GID; and what any
/// process that exited offered.
fn forget_replaced(shared: &mut Shared, (pid, gid): (libc::pid_t, [u8; 16])) {
    shared.retain(|k, p| (k.1 != gid || k.0 == pid) && p.sender_alive());
}

/// The peer `key` (its pid, its GID), made with the pin table `table` it
/// sent if it is new, charged to its process, and its ring read from then
/// on; why not, if it cannot be.
fn peer_rx<'a>(
    shared: &'a mut Shared,
    key: (libc::pid_t, [u8; 16]),
    table: OwnedFd,
    ctx: &RxContext,
) -> Result<&'a Arc<PeerRx>, String> {
    use std::collections::hash_map::Entry;
    match shared.entry(key) {
        Entry::Occupied(o) => Ok(o.into_mut()),
        Entry::Vacant(v) => {
            let charge = ctx.ledger.charge_peer(key.0).map_err(|e| e.to_string())?;
            let pins = share::PinTable::open(table).map_err(|e| format!("its pin table: {e}"))?;
            let pidfd =
                share::pidfd(key.0).map_err(|e| format!("no pidfd for pid {}: {e}", key.0))?;
            let peer = v.insert(Arc::new(PeerRx {
                pins: Arc::new(pins),
                regions: Mutex::default(),
                sender: pidfd,
                charge,
            }));
            ctx.rings.add(peer, key.1);
            Ok(peer)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_receive_takes_the_datagrams_queued_each_with_its_sender_and_descriptors() {
        // SAFETY: getpid/getuid have no preconditions.
        let me = unsafe { (libc::getpid(), libc::getuid()) };
        let dir = std::env::temp_dir().join(format!("efa-emu-rxbatch-{}", me.0));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rx.sock");
        let rx = bind_with_credentials(&path).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tx = UnixDatagram::unbound().unwrap();
        for i in 0..5u8 {
            tx.send_to(&[i; 10], &path).unwrap();
        }
        let mem = crate::shmem::SharedMem::new("rxbatch", 4096).unwrap();
        send_msg(&tx, &path, b"fd", &[mem.fd().as_raw_fd()]).unwrap();
        let mut b = RxBatch::new();
        assert_eq!(b.recv(&rx, true).unwrap(), 6, "all queued, one call");
        for i in 0..5 {
            let (d, bytes) = b.datagram(i);
            assert_eq!(bytes, &[i as u8; 10]);
            assert_eq!(d.sender, Some(me));
            assert!(d.fds.is_empty() && !d.truncated);
        }
        let (d, bytes) = b.datagram(5);
        assert_eq!((bytes, d.fds.len()), (&b"fd"[..], 1));
        assert!(share::is_memory(d.fds[0].as_fd()));
        drop(d);
        assert!(b.datagram(5).0.fds.is_empty(), "owned once");
        // No room for descriptors: the kernel keeps them, the datagram is
        // truncated.
        send_msg(&tx, &path, b"fd", &[mem.fd().as_raw_fd()]).unwrap();
        assert_eq!(b.recv(&rx, false).unwrap(), 1);
        let (d, _) = b.datagram(0);
        assert!(d.fds.is_empty() && d.truncated);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
