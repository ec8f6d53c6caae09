//! The network between devices: packets, the port each device receives on,
//! and the fabric that carries packets from one port to another.
//!
//! Nothing here is part of the EFA interface: it is how emulated devices
//! talk to each other. A packet is addressed by GID and QP number, as on an
//! EFA network. Devices in one process share a [`Fabric`] object and hand
//! packets to each other's [`Port`] directly; packets for a GID that is not
//! attached locally go, encoded, over a Unix datagram socket in the
//! fabric's directory (`efa-<gid in hex>.sock`), where the efa-emu process
//! owning that GID receives them. A packet for a GID nobody owns is lost,
//! as on a real network.
//!
//! Faults are injected where packets arrive ([`NetFaults`], set per
//! device): each arriving packet is dropped with the loss probability and
//! otherwise held for a random delay up to the configured maximum, which
//! reorders packets. SRD recovers from both; UD does not.
//!
//! # Who may send
//!
//! The socket fabric trusts only its own user. The directory must belong
//! to that user (or root) and be writable by nobody else, so that nobody
//! else can bind a device's socket name in it; created here, it is 0700.
//! Each socket is 0600 and receives with `SO_PASSCRED` (set before it is
//! bound): a datagram whose sender's uid is not this process's is
//! dropped, as is one that does not parse or is not addressed to the
//! port's GID, and counted as `fabric_rejected` ([`crate::health`]). A
//! port holds at most [`PORT_QUEUE`] packets ([`PORT_BYTES`] of payload);
//! more are dropped as a congested network would.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::copycount::copied;
use crate::health::{Class, Health};
use crate::report;

/// A packet's payload: shared, not copied, by the copy a requester keeps
/// for retransmission and by the packets of one process.
pub type Data = Arc<[u8]>;

/// Largest payload of one packet on the wire. RDMA transfers are cut into
/// segments of this size; sends are bounded by the MTU, which must fit.
pub const MAX_SEGMENT: usize = 64 << 10;

/// What a packet carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// An unreliable datagram (UD send).
    Ud {
        /// Queue key the sender gave.
        qkey: u32,
        /// Immediate data.
        imm: Option<u32>,
        /// The message.
        data: Data,
    },
    /// An SRD send; answered by [`Body::Resp`].
    Send {
        /// Sequence number of the sending QP (for responses and duplicates).
        seq: u64,
        /// Queue key the sender gave.
        qkey: u32,
        /// Immediate data.
        imm: Option<u32>,
        /// The message.
        data: Data,
    },
    /// A segment of an SRD RDMA write; answered by [`Body::Resp`].
    Write {
        /// Sequence number.
        seq: u64,
        /// Queue key.
        qkey: u32,
        /// Remote key.
        rkey: u32,
        /// Remote address of this segment.
        addr: u64,
        /// Immediate data: only on the last segment, sent once all others
        /// were acknowledged.
        imm: Option<u32>,
        /// Length of the whole write (for the receive completion of a write
        /// with immediate).
        total: u32,
        /// The last segment of the write (responder event counters).
        last: bool,
        /// The segment's data.
        data: Data,
    },
    /// A segment of an SRD RDMA read; answered by [`Body::Resp`] with data.
    Read {
        /// Sequence number.
        seq: u64,
        /// Queue key.
        qkey: u32,
        /// Remote key.
        rkey: u32,
        /// Remote address of this segment.
        addr: u64,
        /// Length of this segment.
        len: u32,
        /// The last segment of the read (responder event counters).
        last: bool,
    },
    /// The responder's answer to an SRD request: an EFA completion status
    /// (`CompStatus`), and the data of a read.
    Resp {
        /// Sequence number of the request.
        seq: u64,
        /// Completion status for the requester.
        status: u8,
        /// Read data.
        data: Data,
    },
}

/// A packet between two queue pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Sender's GID.
    pub src_gid: [u8; 16],
    /// Receiver's GID.
    pub dst_gid: [u8; 16],
    /// Sending QP.
    pub src_qpn: u16,
    /// Receiving QP.
    pub dst_qpn: u16,
    /// Contents.
    pub body: Body,
}

const MAGIC: u32 = 0x4641_4645; // "EFAF"
const VERSION: u8 = 1;

impl Packet {
    /// Gives an SRD request (send, write or read segment) a new sequence
    /// number; answers keep theirs.
    pub fn renumber(&mut self, new: u64) {
        match &mut self.body {
            Body::Send { seq, .. } | Body::Write { seq, .. } | Body::Read { seq, .. } => *seq = new,
            Body::Ud { .. } | Body::Resp { .. } => {}
        }
    }

    /// Payload bytes (data of sends, writes and read responses).
    pub fn payload_len(&self) -> usize {
        match &self.body {
            Body::Ud { data, .. }
            | Body::Send { data, .. }
            | Body::Write { data, .. }
            | Body::Resp { data, .. } => data.len(),
            Body::Read { .. } => 0,
        }
    }

    /// The wire form (little endian) for the socket fabric.
    pub fn encode(&self) -> Vec<u8> {
        // One buffer, written in order: the payload is copied once.
        let mut b = Vec::with_capacity(64 + self.payload_len());
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.push(VERSION);
        b.push(match &self.body {
            Body::Ud { .. } => 1,
            Body::Send { .. } => 2,
            Body::Write { .. } => 3,
            Body::Read { .. } => 4,
            Body::Resp { .. } => 5,
        });
        b.extend_from_slice(&self.src_gid);
        b.extend_from_slice(&self.dst_gid);
        b.extend_from_slice(&self.src_qpn.to_le_bytes());
        b.extend_from_slice(&self.dst_qpn.to_le_bytes());
        match &self.body {
            Body::Ud { qkey, imm, data } => {
                b.extend_from_slice(&qkey.to_le_bytes());
                put_imm(&mut b, *imm);
                put_data(&mut b, data);
            }
            Body::Send {
                seq,
                qkey,
                imm,
                data,
            } => {
                b.extend_from_slice(&seq.to_le_bytes());
                b.extend_from_slice(&qkey.to_le_bytes());
                put_imm(&mut b, *imm);
                put_data(&mut b, data);
            }
            Body::Write {
                seq,
                qkey,
                rkey,
                addr,
                imm,
                total,
                last,
                data,
            } => {
                b.extend_from_slice(&seq.to_le_bytes());
                b.extend_from_slice(&qkey.to_le_bytes());
                b.extend_from_slice(&rkey.to_le_bytes());
                b.extend_from_slice(&addr.to_le_bytes());
                put_imm(&mut b, *imm);
                b.extend_from_slice(&total.to_le_bytes());
                b.push((*last).into());
                put_data(&mut b, data);
            }
            Body::Read {
                seq,
                qkey,
                rkey,
                addr,
                len,
                last,
            } => {
                b.extend_from_slice(&seq.to_le_bytes());
                b.extend_from_slice(&qkey.to_le_bytes());
                b.extend_from_slice(&rkey.to_le_bytes());
                b.extend_from_slice(&addr.to_le_bytes());
                b.extend_from_slice(&len.to_le_bytes());
                b.push((*last).into());
            }
            Body::Resp { seq, status, data } => {
                b.extend_from_slice(&seq.to_le_bytes());
                b.push(*status);
                put_data(&mut b, data);
            }
        }
        b
    }

    /// Parses a wire form; `None` for anything malformed (never panics).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        if r.u32()? != MAGIC || r.u8()? != VERSION {
            return None;
        }
        let kind = r.u8()?;
        let src_gid = r.gid()?;
        let dst_gid = r.gid()?;
        let src_qpn = r.u16()?;
        let dst_qpn = r.u16()?;
        let body = match kind {
            1 => Body::Ud {
                qkey: r.u32()?,
                imm: r.imm()?,
                data: r.data()?,
            },
            2 => Body::Send {
                seq: r.u64()?,
                qkey: r.u32()?,
                imm: r.imm()?,
                data: r.data()?,
            },
            3 => Body::Write {
                seq: r.u64()?,
                qkey: r.u32()?,
                rkey: r.u32()?,
                addr: r.u64()?,
                imm: r.imm()?,
                total: r.u32()?,
                last: r.flag()?,
                data: r.data()?,
            },
            4 => Body::Read {
                seq: r.u64()?,
                qkey: r.u32()?,
                rkey: r.u32()?,
                addr: r.u64()?,
                len: r.u32()?,
                last: r.flag()?,
            },
            5 => Body::Resp {
                seq: r.u64()?,
                status: r.u8()?,
                data: r.data()?,
            },
            _ => return None,
        };
        r.0.is_empty().then_some(Self {
            src_gid,
            dst_gid,
            src_qpn,
            dst_qpn,
            body,
        })
    }
}

fn put_imm(b: &mut Vec<u8>, imm: Option<u32>) {
    b.push(imm.is_some().into());
    b.extend_from_slice(&imm.unwrap_or(0).to_le_bytes());
}

fn put_data(b: &mut Vec<u8>, data: &[u8]) {
    b.extend_from_slice(&(data.len() as u32).to_le_bytes());
    copied(data.len());
    b.extend_from_slice(data);
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4")))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8")))
    }
    fn gid(&mut self) -> Option<[u8; 16]> {
        self.take(16).map(|b| b.try_into().expect("16"))
    }
    fn flag(&mut self) -> Option<bool> {
        match self.u8()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }
    fn imm(&mut self) -> Option<Option<u32>> {
        let has = self.u8()?;
        let v = self.u32()?;
        match has {
            0 => Some(None),
            1 => Some(Some(v)),
            _ => None,
        }
    }
    fn data(&mut self) -> Option<Data> {
        let n = self.u32()? as usize;
        if n > MAX_SEGMENT {
            return None;
        }
        let d = self.take(n).map(Data::from);
        copied(n);
        d
    }
}

/// Faults applied to packets arriving at a port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetFaults {
    /// Drop probability in parts per million.
    pub loss_ppm: u32,
    /// Largest random delay in microseconds (delays reorder packets).
    pub delay_us: u32,
}

/// Most packets queued at a port; more are dropped.
pub const PORT_QUEUE: usize = 4096;
/// Most payload bytes queued at a port; more are dropped.
pub const PORT_BYTES: usize = 64 << 20;

struct PortQ {
    /// Packets with the time they may be handled, in arrival order.
    packets: VecDeque<(Instant, Packet)>,
    /// Payload bytes in `packets`.
    bytes: usize,
    /// Packets dropped because the queue was full.
    overflow: u64,
    /// Something happened since the owner last waited.
    kicked: bool,
    /// The owner sleeps in [`Port::wait`]: the next arrival wakes it.
    /// While it is busy, arrivals are only queued, without a system call
    /// per packet.
    sleeping: bool,
    faults: NetFaults,
    rng: u64,
    /// Packets dropped by injected loss.
    dropped: u64,
}

/// Where a device receives packets. Its data-path thread sleeps on it.
pub struct Port {
    gid: [u8; 16],
    q: Mutex<PortQ>,
    cv: Condvar,
    health: Arc<Health>,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("gid", &std::net::Ipv6Addr::from(self.gid))
            .finish_non_exhaustive()
    }
}

impl Port {
    /// An empty port for `gid`; packets dropped by injected loss count in
    /// `health`.
    pub fn new(gid: [u8; 16], faults: NetFaults, health: Arc<Health>) -> Arc<Self> {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        Arc::new(Self {
            gid,
            q: Mutex::new(PortQ {
                packets: VecDeque::new(),
                bytes: 0,
                overflow: 0,
                kicked: false,
                sleeping: false,
                faults,
                rng: seed,
                dropped: 0,
            }),
            cv: Condvar::new(),
            health,
        })
    }

    fn lock(&self) -> MutexGuard<'_, PortQ> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The port's GID.
    pub fn gid(&self) -> [u8; 16] {
        self.gid
    }

    /// Changes the injected faults.
    pub fn set_faults(&self, f: NetFaults) {
        self.lock().faults = f;
    }

    /// The injected faults.
    pub fn faults(&self) -> NetFaults {
        self.lock().faults
    }

    /// Packets dropped by injected loss so far.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Packets dropped so far because the queue was full.
    pub fn overflowed(&self) -> u64 {
        self.lock().overflow
    }

    /// A packet arrives: subject to the faults, queued and the owner woken.
    pub fn deliver(&self, p: Packet) {
        let mut q = self.lock();
        let f = q.faults;
        let mut due = Instant::now();
        if f.loss_ppm > 0 || f.delay_us > 0 {
            let r = xorshift(&mut q.rng);
            if f.loss_ppm > 0 && (r % 1_000_000) < u64::from(f.loss_ppm) {
                q.dropped += 1;
                drop(q);
                self.health.count(Class::Injected, 1);
                return;
            }
            if f.delay_us > 0 {
                let d = (r >> 20) % (u64::from(f.delay_us) + 1);
                due += Duration::from_micros(d);
            }
        }
        let n = p.payload_len();
        if q.packets.len() >= PORT_QUEUE || q.bytes + n > PORT_BYTES {
            q.overflow += 1;
            log::debug!("port queue full: a packet of {n} bytes dropped");
            return;
        }
        q.bytes += n;
        q.packets.push_back((due, p));
        self.wake(q);
    }

    /// Marks the port kicked and wakes the owner if it sleeps.
    fn wake(&self, mut q: MutexGuard<'_, PortQ>) {
        q.kicked = true;
        if std::mem::take(&mut q.sleeping) {
            drop(q);
            self.cv.notify_one();
        }
    }

    /// Wakes the owner (work of another kind arrived, or it must stop).
    pub fn kick(&self) {
        self.wake(self.lock());
    }

    /// Takes up to `max` of the packets due by `now`, in arrival order;
    /// also returns when the next packet left behind is due (now, if more
    /// were due than taken).
    pub fn take_due(&self, now: Instant, max: usize) -> (Vec<Packet>, Option<Instant>) {
        let mut due = Vec::new();
        let next = self.take_due_into(now, max, &mut due);
        (due, next)
    }

    /// [`Port::take_due`] into `out` (appended to; nothing is allocated
    /// once `out` and the queue have grown to their working size).
    pub fn take_due_into(
        &self,
        now: Instant,
        max: usize,
        out: &mut Vec<Packet>,
    ) -> Option<Instant> {
        let mut q = self.lock();
        let q = &mut *q;
        let mut taken = 0;
        if q.faults.delay_us == 0 {
            // Without injected delays a packet is due as it arrives: the
            // oldest first, without looking at the others. (Delays injected
            // before may still hold some back: the loop below then sees
            // them.)
            while taken < max && q.packets.front().is_some_and(|&(at, _)| at <= now) {
                let (_, p) = q.packets.pop_front().expect("a front packet");
                q.bytes -= p.payload_len();
                out.push(p);
                taken += 1;
            }
            match q.packets.front() {
                None => return None,
                Some(&(at, _)) if at <= now && taken == max => return Some(at),
                _ => {}
            }
        }
        let mut next: Option<Instant> = None;
        let mut i = 0;
        while i < q.packets.len() {
            let at = q.packets[i].0;
            if at <= now && taken < max {
                let (_, p) = q.packets.remove(i).expect("in range");
                q.bytes -= p.payload_len();
                out.push(p);
                taken += 1;
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
                i += 1;
            }
        }
        next
    }

    /// Sleeps until kicked, a packet arrives or `timeout` passes (`None`:
    /// no limit). Returns at once if kicked since the last wait.
    pub fn wait(&self, timeout: Option<Duration>) {
        let mut q = self.lock();
        if !q.kicked {
            q.sleeping = true;
            q = match timeout {
                Some(t) => {
                    self.cv
                        .wait_timeout(q, t)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.cv.wait(q).unwrap_or_else(|e| e.into_inner()),
            };
            q.sleeping = false;
        }
        q.kicked = false;
    }

    /// Drops every queued packet (device reset).
    pub fn clear(&self) {
        let mut q = self.lock();
        q.packets.clear();
        q.bytes = 0;
    }
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Packets queued for the socket transmit thread before `send` drops
/// them (a peer that does not drain its socket).
const TX_QUEUE: usize = 4096;
/// Longest a transmit waits for room in a peer's socket queue.
const TX_TIMEOUT: Duration = Duration::from_millis(100);

/// The socket part of a fabric: one bound socket per local port, and a
/// thread that sends.
///
/// A Unix datagram socket queues only `net.unix.max_dgram_qlen` (10 by
/// default) datagrams, so a burst sent without waiting mostly fails. A
/// device's thread sends without waiting while the transmit thread has
/// nothing queued; when the peer's queue is full it hands the packet to
/// the transmit thread, which waits for room (up to [`TX_TIMEOUT`], then
/// the packet is lost), and so do the packets after it until the transmit
/// thread has sent them all, so that packets to a peer keep their order.
/// This paces senders to the receiver without ever blocking a device's
/// data path, and costs no thread handoff while the receiver keeps up.
struct Sockets {
    dir: PathBuf,
    health: Arc<Health>,
    tx: Option<SyncSender<(Arc<Path>, Vec<u8>)>>,
    tx_thread: Option<JoinHandle<()>>,
    /// Sends without waiting (non-blocking), from a device's thread.
    direct: UnixDatagram,
    /// Packets handed to the transmit thread and not yet sent.
    queued: Arc<AtomicUsize>,
    /// The sockets of the GIDs packets went to, so that a packet does not
    /// build its destination's path (at most [`PATHS`]).
    paths: HashMap<[u8; 16], Arc<Path>>,
    receivers: Vec<(PathBuf, Arc<AtomicBool>, Option<JoinHandle<()>>)>,
}

/// Packets between ports: directly between ports attached to it, over
/// Unix datagram sockets to other processes when it has a directory.
pub struct Fabric {
    ports: Mutex<HashMap<[u8; 16], Weak<Port>>>,
    sockets: Mutex<Option<Sockets>>,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dir = self
            .sockets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| s.dir.clone());
        f.debug_struct("Fabric").field("dir", &dir).finish()
    }
}

/// Destination paths a fabric remembers (any GID an AH names may be one;
/// beyond this many the cache starts over).
const PATHS: usize = 1024;

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

impl Fabric {
    /// A fabric joining the ports of this process only.
    pub fn local() -> Arc<Self> {
        Arc::new(Self {
            ports: Mutex::new(HashMap::new()),
            sockets: Mutex::new(None),
        })
    }

    /// A fabric that also reaches other processes through sockets in `dir`
    /// (created 0700 if missing; refused if another user can write to it).
    /// Rejected packets count in `health`.
    pub fn with_dir(dir: &Path, health: Arc<Health>) -> io::Result<Arc<Self>> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        check_private_dir(
            dir,
            "take the place of a device: use a directory only you can write to \
             (--fabric DIR) or --no-fabric",
        )?;
        let sock = UnixDatagram::unbound()?;
        sock.set_write_timeout(Some(TX_TIMEOUT))?;
        set_buf(&sock, libc::SO_SNDBUF);
        let direct = UnixDatagram::unbound()?;
        direct.set_nonblocking(true)?;
        set_buf(&direct, libc::SO_SNDBUF);
        let queued = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = sync_channel::<(Arc<Path>, Vec<u8>)>(TX_QUEUE);
        let q = queued.clone();
        let tx_thread = std::thread::Builder::new()
            .name("efa-fabric-tx".into())
            .spawn(move || {
                for (path, bytes) in rx {
                    // Nobody there, or no room in time: the packet is lost.
                    let _ = sock.send_to(&bytes, &path);
                    q.fetch_sub(1, Ordering::Release);
                }
            })?;
        Ok(Arc::new(Self {
            ports: Mutex::new(HashMap::new()),
            sockets: Mutex::new(Some(Sockets {
                dir: dir.to_path_buf(),
                health,
                tx: Some(tx),
                tx_thread: Some(tx_thread),
                direct,
                queued,
                paths: HashMap::new(),
                receivers: Vec::new(),
            })),
        }))
    }

    /// Attaches `port`: packets to its GID reach it, from this process and,
    /// with sockets, from others.
    pub fn attach(&self, port: &Arc<Port>) -> io::Result<()> {
        self.ports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port.gid, Arc::downgrade(port));
        let mut s = self.sockets.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = s.as_mut() else {
            return Ok(());
        };
        let path = socket_path(&s.dir, &port.gid);
        // A socket left by a process that died; a live one would have the
        // same GID, which the GID default rules out.
        let _ = std::fs::remove_file(&path);
        let rx = bind_with_credentials(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        set_buf(&rx, libc::SO_RCVBUF);
        rx.set_read_timeout(Some(Duration::from_millis(200)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (weak, st, health) = (Arc::downgrade(port), stop.clone(), s.health.clone());
        let h = std::thread::Builder::new()
            .name("efa-fabric-rx".into())
            .spawn(move || receive(rx, weak, st, &health))?;
        s.receivers.push((path, stop, Some(h)));
        Ok(())
    }

    /// Detaches the port of `gid` and closes its socket.
    pub fn detach(&self, gid: &[u8; 16]) {
        self.ports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(gid);
        let mut s = self.sockets.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = s.as_mut() else { return };
        let path = socket_path(&s.dir, gid);
        s.receivers.retain_mut(|(p, stop, h)| {
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

    /// Sends `p` towards its destination GID. Returns whether it left
    /// (it may still be lost on the way).
    pub fn send(&self, p: Packet) -> bool {
        let local = self
            .ports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&p.dst_gid)
            .and_then(Weak::upgrade);
        if let Some(port) = local {
            port.deliver(p);
            return true;
        }
        let mut s = self.sockets.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = s.as_mut() else {
            return false;
        };
        if s.paths.len() >= PATHS && !s.paths.contains_key(&p.dst_gid) {
            s.paths.clear();
        }
        let path = s
            .paths
            .entry(p.dst_gid)
            .or_insert_with(|| socket_path(&s.dir, &p.dst_gid).into())
            .clone();
        let bytes = p.encode();
        // Under the sockets lock: nothing is handed to the transmit thread
        // meanwhile, and what it had is sent, so this packet cannot pass
        // one sent before it.
        if s.queued.load(Ordering::Acquire) == 0 {
            match s.direct.send_to(&bytes, &path) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Sent, or nobody there (the packet is lost).
                r => {
                    if r.is_ok() {
                        // The kernel's copy into the datagram.
                        copied(p.payload_len());
                    }
                    return true;
                }
            }
        }
        // A full queue loses the packet, as a congested network would; SRD
        // retransmits.
        s.queued.fetch_add(1, Ordering::AcqRel);
        let sent =
            s.tx.as_ref()
                .is_some_and(|tx| tx.try_send((path, bytes)).is_ok());
        if !sent {
            s.queued.fetch_sub(1, Ordering::AcqRel);
        }
        if sent {
            // The kernel's copy into the datagram.
            copied(p.payload_len());
        }
        sent
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        let gids: Vec<[u8; 16]> = self
            .ports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect();
        for g in gids {
            self.detach(&g);
        }
        let mut s = self.sockets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = s.as_mut() {
            // Closing the queue ends the transmit thread.
            s.tx = None;
            if let Some(h) = s.tx_thread.take() {
                let _ = h.join();
            }
        }
    }
}

fn set_buf(s: &UnixDatagram, opt: libc::c_int) {
    let v: libc::c_int = 4 << 20;
    // SAFETY: setsockopt on a socket we own with a pointer to a live int
    // and its size; failure only leaves the default size.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&v as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Refuses a fabric directory in which another user could bind a
/// device's socket name: it must belong to us or root and be writable by
/// nobody else. `advice` ends the refusal: what another user could do
/// there, and what to do instead (the control socket's directory is held
/// to the same rule, `crate::control_socket`).
pub(crate) fn check_private_dir(dir: &Path, advice: &str) -> io::Result<()> {
    let m = std::fs::metadata(dir)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a directory", dir.display()),
        ));
    }
    if (m.uid() != me && m.uid() != 0) || m.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} (owner uid {}, mode {:o}) is writable by other users, who could {advice}",
                dir.display(),
                m.uid(),
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
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

/// One datagram and who sent it.
struct Datagram {
    len: usize,
    /// The sender's pid and uid, if the kernel passed them.
    sender: Option<(libc::pid_t, libc::uid_t)>,
    /// The datagram or its ancillary data did not fit (descriptors
    /// someone sent along are closed by the kernel then).
    truncated: bool,
}

/// Receives a datagram into `buf` with its `SCM_CREDENTIALS`.
fn recv_with_credentials(rx: &UnixDatagram, buf: &mut [u8]) -> io::Result<Datagram> {
    // Room for exactly one ucred: anything more (descriptors) truncates.
    const SPACE: usize = 64;
    // SAFETY: CMSG_SPACE is arithmetic.
    let need = unsafe { libc::CMSG_SPACE(size_of::<libc::ucred>() as u32) } as usize;
    debug_assert!(need <= SPACE);
    let mut control = [0u64; SPACE / 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = need as _;
    // SAFETY: `msg` points at a live iovec over `buf` and at `control`,
    // both as large as the lengths say.
    let n = unsafe { libc::recvmsg(rx.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut sender = None;
    // SAFETY: the CMSG macros walk the control buffer the kernel filled,
    // within `msg_controllen`; the ucred is read unaligned from inside it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET
                && (*c).cmsg_type == libc::SCM_CREDENTIALS
                && (*c).cmsg_len as usize
                    >= libc::CMSG_LEN(size_of::<libc::ucred>() as u32) as usize
            {
                let u: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                sender = Some((u.pid, u.uid));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Datagram {
        len: n as usize,
        sender,
        truncated: msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0,
    })
}

fn receive(rx: UnixDatagram, port: Weak<Port>, stop: Arc<AtomicBool>, health: &Health) {
    let mut buf = vec![0u8; MAX_SEGMENT + 256];
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
    while !stop.load(Ordering::Relaxed) {
        match recv_with_credentials(&rx, &mut buf) {
            Ok(d) => {
                let Some(port) = port.upgrade() else { return };
                match d.sender {
                    // The kernel attaches the sender's real uid to every
                    // datagram (SO_PASSCRED was on before the bind); the
                    // pid is 0 for a sender in another pid namespace.
                    Some((_, uid)) if uid == me => {}
                    Some((pid, uid)) => {
                        reject(format_args!("from pid {pid} uid {uid}, not uid {me}"));
                        continue;
                    }
                    None => {
                        reject(format_args!("without its sender's credentials"));
                        continue;
                    }
                }
                if d.truncated {
                    reject(format_args!(
                        "longer than any packet, or carrying descriptors"
                    ));
                    continue;
                }
                match Packet::decode(&buf[..d.len]) {
                    Some(p) if p.dst_gid == port.gid => {
                        // The kernel's copy out of the datagram.
                        copied(p.payload_len());
                        port.deliver(p)
                    }
                    Some(_) => reject(format_args!("for another GID")),
                    None => reject(format_args!("malformed, {} bytes", d.len)),
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::error!("fabric: receive failed: {e}");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(body: Body) -> Packet {
        Packet {
            src_gid: [1; 16],
            dst_gid: [2; 16],
            src_qpn: 3,
            dst_qpn: 4,
            body,
        }
    }

    #[test]
    fn packets_round_trip_and_garbage_is_refused() {
        let all = [
            pkt(Body::Ud {
                qkey: 5,
                imm: Some(6),
                data: vec![7; 100].into(),
            }),
            pkt(Body::Send {
                seq: 1 << 40,
                qkey: 5,
                imm: None,
                data: vec![].into(),
            }),
            pkt(Body::Write {
                seq: 9,
                qkey: 1,
                rkey: 2,
                addr: 0x1234_5678_9abc,
                imm: Some(0xffff_ffff),
                total: 1 << 20,
                last: true,
                data: vec![1, 2, 3].into(),
            }),
            pkt(Body::Read {
                seq: 10,
                qkey: 1,
                rkey: 2,
                addr: 3,
                len: 4,
                last: false,
            }),
            pkt(Body::Resp {
                seq: 11,
                status: 10,
                data: vec![9; 5].into(),
            }),
        ];
        for p in &all {
            let b = p.encode();
            assert_eq!(Packet::decode(&b).as_ref(), Some(p));
            for n in 0..b.len() {
                assert_eq!(Packet::decode(&b[..n]), None, "truncated at {n}");
            }
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(Packet::decode(&longer), None);
        }
        let mut s = 0x1234_5678u64;
        for _ in 0..2000 {
            let n = (xorshift(&mut s) % 200) as usize;
            let g: Vec<u8> = (0..n).map(|_| xorshift(&mut s) as u8).collect();
            let _ = Packet::decode(&g);
        }
    }

    #[test]
    fn ports_queue_drop_and_delay() {
        let f = Fabric::local();
        let a = Port::new([2; 16], NetFaults::default(), Health::new());
        f.attach(&a).unwrap();
        assert!(f.send(pkt(Body::Resp {
            seq: 1,
            status: 0,
            data: vec![].into()
        })));
        let mut other = pkt(Body::Resp {
            seq: 1,
            status: 0,
            data: vec![].into(),
        });
        other.dst_gid = [9; 16];
        assert!(!f.send(other), "nobody owns that GID");
        let (got, next) = a.take_due(Instant::now(), usize::MAX);
        assert_eq!((got.len(), next), (1, None));
        a.wait(Some(Duration::from_millis(1)));

        a.set_faults(NetFaults {
            loss_ppm: 1_000_000,
            delay_us: 0,
        });
        f.send(pkt(Body::Resp {
            seq: 2,
            status: 0,
            data: vec![].into(),
        }));
        assert_eq!(a.dropped(), 1);
        a.set_faults(NetFaults {
            loss_ppm: 0,
            delay_us: 1_000_000,
        });
        for seq in 0..20 {
            f.send(pkt(Body::Resp {
                seq,
                status: 0,
                data: vec![].into(),
            }));
        }
        let (got, next) = a.take_due(Instant::now(), usize::MAX);
        assert!(got.len() < 20 && next.is_some(), "held back");
        let (rest, _) = a.take_due(Instant::now() + Duration::from_secs(2), usize::MAX);
        assert_eq!(got.len() + rest.len(), 20);
    }

    #[test]
    fn sockets_carry_packets_between_fabrics() {
        let dir = std::env::temp_dir().join(format!("efa-fabric-test-{}", std::process::id()));
        let f1 = Fabric::with_dir(&dir, Health::new()).unwrap();
        let f2 = Fabric::with_dir(&dir, Health::new()).unwrap();
        let b = Port::new([2; 16], NetFaults::default(), Health::new());
        f2.attach(&b).unwrap();
        let p = pkt(Body::Send {
            seq: 7,
            qkey: 1,
            imm: None,
            data: vec![0xab; MAX_SEGMENT].into(),
        });
        assert!(f1.send(p.clone()));
        let t = Instant::now();
        loop {
            let (got, _) = b.take_due(Instant::now(), usize::MAX);
            if let Some(g) = got.first() {
                assert_eq!(g, &p);
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "no packet");
            b.wait(Some(Duration::from_millis(10)));
        }
        // A burst far beyond a Unix socket's queue of 10 arrives whole.
        for seq in 0..200 {
            assert!(f1.send(pkt(Body::Resp {
                seq,
                status: 0,
                data: vec![1; 9000].into(),
            })));
        }
        let mut n = 0;
        let t = Instant::now();
        while n < 200 {
            n += b.take_due(Instant::now(), usize::MAX).0.len();
            assert!(t.elapsed() < Duration::from_secs(5), "{n} of 200");
            b.wait(Some(Duration::from_millis(10)));
        }
        drop(f2);
        assert!(!socket_path(&dir, &[2; 16]).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_port_holds_a_bounded_queue() {
        let a = Port::new([2; 16], NetFaults::default(), Health::new());
        for seq in 0..PORT_QUEUE as u64 + 10 {
            a.deliver(pkt(Body::Resp {
                seq,
                status: 0,
                data: vec![].into(),
            }));
        }
        assert_eq!(a.overflowed(), 10);
        let (got, _) = a.take_due(Instant::now(), usize::MAX);
        assert_eq!(got.len(), PORT_QUEUE);
        // And a bounded number of bytes.
        let n = PORT_BYTES / MAX_SEGMENT;
        for seq in 0..n as u64 + 1 {
            a.deliver(pkt(Body::Resp {
                seq,
                status: 0,
                data: vec![0; MAX_SEGMENT].into(),
            }));
        }
        assert_eq!(a.overflowed(), 11);
        assert_eq!(a.take_due(Instant::now(), usize::MAX).0.len(), n);
        a.deliver(pkt(Body::Resp {
            seq: 0,
            status: 0,
            data: vec![0; MAX_SEGMENT].into(),
        }));
        assert_eq!(a.overflowed(), 11, "taking packets makes room");
    }

    #[test]
    fn fabric_sockets_are_private_and_only_our_user_is_heard() {
        use crate::as_user::{self, Outcome};
        let dir = std::env::temp_dir().join(format!("efa-fabric-uid-{}", std::process::id()));
        let health = Health::new();
        let f = Fabric::with_dir(&dir, health.clone()).unwrap();
        let b = Port::new([2; 16], NetFaults::default(), Health::new());
        f.attach(&b).unwrap();
        let path = socket_path(&dir, &[2; 16]);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!((mode(&dir), mode(&path)), (0o700, 0o600));
        let p = pkt(Body::Ud {
            qkey: 1,
            imm: None,
            data: vec![1, 2, 3].into(),
        });
        let wait_rejected = |n: u64| {
            let t = Instant::now();
            while health.get(Class::FabricRejected) < n {
                assert!(t.elapsed() < Duration::from_secs(5), "not rejected");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // Open the way, so that only the credentials check is left.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        match as_user::send_datagram(&path, &p.encode()) {
            Outcome::CannotSwitch => eprintln!("skipped the other user: not root"),
            Outcome::Exited(code) => {
                assert_eq!(code, 0, "the other user's datagram went out");
                wait_rejected(1);
            }
        }
        let n = health.get(Class::FabricRejected);
        let us = UnixDatagram::unbound().unwrap();
        us.send_to(b"garbage", &path).unwrap();
        wait_rejected(n + 1);
        let mut other = p.clone();
        other.dst_gid = [3; 16];
        us.send_to(&other.encode(), &path).unwrap();
        wait_rejected(n + 2);
        us.send_to(&p.encode(), &path).unwrap();
        let t = Instant::now();
        loop {
            let (got, _) = b.take_due(Instant::now(), usize::MAX);
            if !got.is_empty() {
                assert_eq!(got, vec![p], "only our own good packet arrived");
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "no packet");
            b.wait(Some(Duration::from_millis(5)));
        }
        assert_eq!(health.get(Class::FabricRejected), n + 2);
        drop(f);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_fabric_directory_others_can_write_is_refused() {
        let dir = std::env::temp_dir().join(format!("efa-fabric-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Fabric::with_dir(&dir, Health::new()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(
            Fabric::with_dir(&dir, Health::new()).is_err(),
            "sticky is not enough"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(Fabric::with_dir(&dir, Health::new()).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
