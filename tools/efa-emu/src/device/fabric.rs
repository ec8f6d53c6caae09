//! The network between devices: packets, the port each device receives on,
//! and the fabric that carries packets from one port to another.
//!
//! Nothing here is part of the EFA interface: it is how emulated devices
//! talk to each other. A packet is addressed by GID and QP number, as on an
//! EFA network. Devices in one process share a [`Fabric`] object and hand
//! packets to each other's [`Port`] directly; packets for a GID that is not
//! attached locally go, encoded, over the fabric's [`Transport`] to the
//! process owning that GID: Unix datagram sockets in a directory
//! ([`unix`], one user on one host, the default) or authenticated UDP
//! ([`udp`], across network namespaces and hosts). A packet for a GID
//! nobody owns is lost, as on a real network. [`capture`] writes the
//! packets to a pcap file.
//!
//! Faults are injected where packets arrive ([`NetFaults`], set per
//! device and per link, that is per sending GID): each arriving packet is
//! dropped with the loss probability, duplicated with the duplication
//! probability, and held for a random delay up to the configured maximum
//! and, with the reordering probability, [`REORDER_HOLD`] more, which
//! reorders packets. SRD recovers from all of them; UD does not. They
//! apply whatever carried the packet.
//!
//! A port holds at most [`PORT_QUEUE`] packets ([`PORT_BYTES`] of
//! payload); more are dropped as a congested network would.

use std::collections::VecDeque;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::Map;
use crate::copycount::copied;
use crate::health::{Class, Health};

/// Asks for a socket buffer of `bytes` with the first option of `opts`
/// the kernel takes (`SO_*BUFFORCE` needs CAP_NET_ADMIN, the plain one is
/// capped by `net.core.*mem_max`); none of them only leaves a smaller
/// buffer, so the answer is not an error.
fn set_socket_buffer(fd: std::os::fd::BorrowedFd<'_>, bytes: libc::c_int, opts: &[libc::c_int]) {
    use std::os::fd::AsRawFd;
    for &opt in opts {
        // SAFETY: setsockopt on an open socket (`fd` is borrowed for the
        // call), with a pointer to a live int and its size.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&bytes as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            return;
        }
    }
}

pub mod auth;
pub mod capture;
pub mod payload;
pub mod ring;
pub mod share;
pub mod udp;
mod unix;

pub use capture::Capture;
pub use payload::{Data, Fault, Piece, Region, Source};
pub use udp::UdpConfig;
pub use unix::socket_path;

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
    /// The responder's answers, without data, to `count` requests
    /// numbered `first`, `first + step`, ..., all with one `status`: what
    /// the [`Body::Resp`]s to one QP's consecutive requests become when
    /// they leave together ([`Packet::absorb`]), one packet instead of one
    /// each, as a device acknowledges a burst of packets at once.
    RespRun {
        /// Sequence number of the first request answered.
        first: u64,
        /// What one request's number is past the one before (a sender's
        /// requests need not be numbered one apart).
        step: u32,
        /// Requests answered.
        count: u16,
        /// Completion status for each of them.
        status: u8,
    },
    /// An SRD requester's question about its request `seq`, sent when the
    /// request's answer is late instead of the request itself: "are you
    /// there, and what became of it?" Answered by [`Body::Heard`].
    Probe {
        /// Sequence number of the request asked about.
        seq: u64,
    },
    /// The responder's answer to a [`Body::Probe`].
    Heard {
        /// Sequence number of the request asked about.
        seq: u64,
        /// What became of it.
        what: Heard,
        /// The status the request was answered with ([`Heard::Answered`];
        /// 0 otherwise).
        status: u8,
    },
}

/// What a responder knows of a request a [`Body::Probe`] asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// Never received (lost, or forgotten): the requester sends it again.
    Missing = 0,
    /// Received and waiting to be handled: the responder is slow, not the
    /// network lossy.
    Queued = 1,
    /// Handled and answered (the answer is lost or still on its way).
    Answered = 2,
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
/// 2: probes (kinds 6 and 7). 3: a payload is bytes or descriptors
/// ([`share`]), after a form byte. 4: runs of answers (kind 8). Each
/// version drops every packet of another (the version is checked before
/// the kind), so models of two versions exchange nothing and their
/// requests to each other fail as unresponsive: the versions do not mix.
const VERSION: u8 = 4;

/// The form byte of a payload: its bytes follow.
const FORM_BYTES: u8 = 0;
/// The form byte of a payload: descriptors into memory the sender offered
/// follow.
const FORM_DESCS: u8 = 1;

impl Packet {
    /// Gives an SRD request (send, write or read segment) a new sequence
    /// number; answers keep theirs.
    pub fn renumber(&mut self, new: u64) {
        match &mut self.body {
            Body::Send { seq, .. } | Body::Write { seq, .. } | Body::Read { seq, .. } => *seq = new,
            Body::Ud { .. }
            | Body::Resp { .. }
            | Body::RespRun { .. }
            | Body::Probe { .. }
            | Body::Heard { .. } => {}
        }
    }

    /// The sequence number of an SRD request (send, write or read
    /// segment).
    pub fn request_seq(&self) -> Option<u64> {
        match self.body {
            Body::Send { seq, .. } | Body::Write { seq, .. } | Body::Read { seq, .. } => Some(seq),
            _ => None,
        }
    }

    /// The payload, if the packet has one.
    pub fn data(&self) -> Option<&Data> {
        match &self.body {
            Body::Ud { data, .. }
            | Body::Send { data, .. }
            | Body::Write { data, .. }
            | Body::Resp { data, .. } => Some(data),
            Body::Read { .. } | Body::RespRun { .. } | Body::Probe { .. } | Body::Heard { .. } => {
                None
            }
        }
    }

    /// The packet with its payload as bytes, if it refers to guest memory
    /// ([`payload`]): read now, one copy. `Ok(None)`: it has no reference.
    pub fn resolved(&self) -> Result<Option<Packet>, Fault> {
        let Some(d) = self.data().filter(|d| d.is_reference()) else {
            return Ok(None);
        };
        let bytes = d.to_bytes()?;
        let mut p = self.clone();
        match &mut p.body {
            Body::Ud { data, .. }
            | Body::Send { data, .. }
            | Body::Write { data, .. }
            | Body::Resp { data, .. } => *data = bytes,
            Body::Read { .. } | Body::RespRun { .. } | Body::Probe { .. } | Body::Heard { .. } => {}
        }
        Ok(Some(p))
    }

    /// What answers this packet when its payload cannot be read as it
    /// leaves the process (`fault`): a request is answered to its sender
    /// with the status its receiver would have given
    /// ([`Fault::requester_status`]); a read's answer goes on without its
    /// data, as the responder's refusal of the address.
    fn refusal(&self, fault: Fault) -> Option<Packet> {
        let (seq, status) = match self.body {
            Body::Send { seq, .. } | Body::Write { seq, .. } => {
                let status = fault.requester_status().raw();
                return Some(Packet {
                    src_gid: self.dst_gid,
                    dst_gid: self.src_gid,
                    src_qpn: self.dst_qpn,
                    dst_qpn: self.src_qpn,
                    body: Body::Resp {
                        seq,
                        status,
                        data: Data::default(),
                    },
                });
            }
            Body::Resp { seq, .. } => (seq, efa_hw::io::CompStatus::RemoteErrorBadAddress.raw()),
            Body::Ud { .. }
            | Body::Read { .. }
            | Body::RespRun { .. }
            | Body::Probe { .. }
            | Body::Heard { .. } => return None,
        };
        Some(Packet {
            body: Body::Resp {
                seq,
                status,
                data: Data::default(),
            },
            ..self.clone()
        })
    }

    /// Payload bytes (data of sends, writes and read responses).
    pub fn payload_len(&self) -> usize {
        match &self.body {
            Body::Ud { data, .. }
            | Body::Send { data, .. }
            | Body::Write { data, .. }
            | Body::Resp { data, .. } => data.len(),
            Body::Read { .. } | Body::RespRun { .. } | Body::Probe { .. } | Body::Heard { .. } => 0,
        }
    }

    /// Whether this is an answer ([`Body::Resp`], or a [`Body::RespRun`]
    /// that covers it) to request `seq`.
    pub fn answers(&self, seq: u64) -> bool {
        match self.body {
            Body::Resp { seq: s, .. } => s == seq,
            Body::RespRun {
                first, step, count, ..
            } => {
                let step = u64::from(step);
                step > 0
                    && seq
                        .checked_sub(first)
                        .is_some_and(|d| d % step == 0 && d / step < u64::from(count))
            }
            _ => false,
        }
    }

    /// Takes `next` into this packet if both are answers without data
    /// between the same two QPs, with one status, and `next` answers the
    /// request after the last one this answers (one step on, the first
    /// two deciding the step): this becomes (or grows) their
    /// [`Body::RespRun`]. Whether it did; `next` is not needed then.
    pub fn absorb(&mut self, next: &Packet) -> bool {
        let Body::Resp {
            seq,
            status,
            ref data,
        } = next.body
        else {
            return false;
        };
        // Bytes, none: a reference, even to nothing, is checked by its
        // receiver (its region may be gone).
        let no_data = |d: &Data| d.as_bytes().is_some_and(<[u8]>::is_empty);
        if !no_data(data)
            || (self.src_gid, self.dst_gid, self.src_qpn, self.dst_qpn)
                != (next.src_gid, next.dst_gid, next.src_qpn, next.dst_qpn)
        {
            return false;
        }
        self.body = match self.body {
            Body::Resp {
                seq: s,
                status: st,
                data: ref d,
            } if st == status && no_data(d) => {
                let Some(step) = seq.checked_sub(s).and_then(|d| u32::try_from(d).ok()) else {
                    return false;
                };
                if step == 0 {
                    return false;
                }
                Body::RespRun {
                    first: s,
                    step,
                    count: 2,
                    status,
                }
            }
            Body::RespRun {
                first,
                step,
                count,
                status: st,
            } if st == status && count < u16::MAX && run_seq(first, step, count) == Some(seq) => {
                Body::RespRun {
                    first,
                    step,
                    count: count + 1,
                    status,
                }
            }
            _ => return false,
        };
        true
    }

    /// The wire form (little endian) for the socket fabric.
    pub fn encode(&self) -> Vec<u8> {
        // One buffer, written in order: the payload is copied once.
        let mut b = Vec::with_capacity(96 + self.payload_len());
        self.encode_into(&mut b);
        b
    }

    /// [`Packet::encode`] appended to `b`.
    pub fn encode_into(&self, b: &mut Vec<u8>) {
        self.encode_with(b, None)
    }

    /// The wire form with its payload as `descs` (descriptors of memory
    /// offered to the receiver, [`share`]) instead of bytes.
    pub fn encode_described(&self, b: &mut Vec<u8>, descs: &[share::Desc]) {
        self.encode_with(b, Some(descs))
    }

    fn encode_with(&self, b: &mut Vec<u8>, descs: Option<&[share::Desc]>) {
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.push(VERSION);
        b.push(match &self.body {
            Body::Ud { .. } => 1,
            Body::Send { .. } => 2,
            Body::Write { .. } => 3,
            Body::Read { .. } => 4,
            Body::Resp { .. } => 5,
            Body::Probe { .. } => 6,
            Body::Heard { .. } => 7,
            Body::RespRun { .. } => 8,
        });
        b.extend_from_slice(&self.src_gid);
        b.extend_from_slice(&self.dst_gid);
        b.extend_from_slice(&self.src_qpn.to_le_bytes());
        b.extend_from_slice(&self.dst_qpn.to_le_bytes());
        match &self.body {
            Body::Ud { qkey, imm, data } => {
                b.extend_from_slice(&qkey.to_le_bytes());
                put_imm(b, *imm);
                put_data(b, data, descs);
            }
            Body::Send {
                seq,
                qkey,
                imm,
                data,
            } => {
                b.extend_from_slice(&seq.to_le_bytes());
                b.extend_from_slice(&qkey.to_le_bytes());
                put_imm(b, *imm);
                put_data(b, data, descs);
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
                put_imm(b, *imm);
                b.extend_from_slice(&total.to_le_bytes());
                b.push((*last).into());
                put_data(b, data, descs);
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
                put_data(b, data, descs);
            }
            Body::RespRun {
                first,
                step,
                count,
                status,
            } => {
                b.extend_from_slice(&first.to_le_bytes());
                b.extend_from_slice(&step.to_le_bytes());
                b.extend_from_slice(&count.to_le_bytes());
                b.push(*status);
            }
            Body::Probe { seq } => b.extend_from_slice(&seq.to_le_bytes()),
            Body::Heard { seq, what, status } => {
                b.extend_from_slice(&seq.to_le_bytes());
                b.push(*what as u8);
                b.push(*status);
            }
        }
    }

    /// Parses a wire form; `None` for anything malformed (never panics),
    /// and for a payload of descriptors (which only [`Packet::decode_with`]
    /// can resolve).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        Self::decode_with(bytes, &mut |_| None)
    }

    /// [`Packet::decode`], with `resolve(descriptors)` turning a
    /// payload of descriptors into data (`None`: the packet is dropped).
    pub fn decode_with(bytes: &[u8], resolve: &mut Resolver<'_>) -> Option<Self> {
        let mut r = Reader(bytes, resolve);
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
            6 => Body::Probe { seq: r.u64()? },
            7 => Body::Heard {
                seq: r.u64()?,
                what: match r.u8()? {
                    0 => Heard::Missing,
                    1 => Heard::Queued,
                    2 => Heard::Answered,
                    _ => return None,
                },
                status: r.u8()?,
            },
            8 => {
                let (first, step, count) = (r.u64()?, r.u32()?, r.u16()?);
                if !run_is_sound(first, step, count) {
                    return None;
                }
                Body::RespRun {
                    first,
                    step,
                    count,
                    status: r.u8()?,
                }
            }
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

/// The number of request `i` (from 0) of a [`Body::RespRun`], if it has
/// one.
pub fn run_seq(first: u64, step: u32, i: u16) -> Option<u64> {
    first.checked_add(u64::from(step).checked_mul(u64::from(i))?)
}

/// Whether a [`Body::RespRun`] answers anything, each request once, and
/// its last request has a number.
pub fn run_is_sound(first: u64, step: u32, count: u16) -> bool {
    count > 0 && step > 0 && run_seq(first, step, count - 1).is_some()
}

fn put_imm(b: &mut Vec<u8>, imm: Option<u32>) {
    b.push(imm.is_some().into());
    b.extend_from_slice(&imm.unwrap_or(0).to_le_bytes());
}

/// The payload with its length. A reference to guest memory is read
/// straight into `b`; one that cannot be read any more (its region was
/// deregistered, [`payload`]) goes as an empty payload: the fabric turns
/// references into bytes before a packet leaves the process
/// ([`Fabric::send`]), so only a capture's record of a packet between two
/// ports of this process can see one.
fn put_data(b: &mut Vec<u8>, data: &Data, descs: Option<&[share::Desc]>) {
    if let Some(descs) = descs {
        b.push(FORM_DESCS);
        let total: u32 = descs.iter().map(|d| d.len).sum();
        debug_assert!(data.is_empty() || data.len() == total as usize);
        b.extend_from_slice(&total.to_le_bytes());
        b.push(descs.len() as u8);
        b.reserve(descs.len() * share::DESC_BYTES);
        for d in descs {
            b.extend_from_slice(&d.to_wire());
        }
        return;
    }
    b.push(FORM_BYTES);
    if let Some(bytes) = data.as_bytes() {
        b.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        copied(bytes.len());
        b.extend_from_slice(bytes);
        return;
    }
    let n = data.len();
    let start = b.len();
    b.extend_from_slice(&(n as u32).to_le_bytes());
    b.reserve(n);
    let read = data
        .source()
        .and_then(|s| s.read(&mut b.spare_capacity_mut()[..n]));
    match read {
        // SAFETY: `read` initialized the `n` bytes after the length.
        Ok(()) => unsafe { b.set_len(start + 4 + n) },
        Err(f) => {
            log::debug!("fabric: a payload of {n} bytes cannot be read ({f:?})");
            b.truncate(start);
            b.extend_from_slice(&0u32.to_le_bytes());
        }
    }
}

/// Turns a payload's descriptors (their lengths checked to add up to the
/// payload's) into data, for [`Packet::decode_with`].
pub type Resolver<'a> = dyn FnMut(&[share::Desc]) -> Option<Data> + 'a;

struct Reader<'a, 'r>(&'a [u8], &'a mut Resolver<'r>);

impl Reader<'_, '_> {
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
        let form = self.u8()?;
        let n = self.u32()? as usize;
        if n > MAX_SEGMENT {
            return None;
        }
        if form == FORM_DESCS {
            let count = self.u8()? as usize;
            if count == 0 || count > share::MAX_DESCS {
                return None;
            }
            // Not initialized before it is filled: this runs for every
            // packet received.
            let mut descs = SmallVec::<[share::Desc; share::MAX_DESCS]>::new();
            let mut total = 0usize;
            let wire = self.take(count * share::DESC_BYTES)?;
            for w in wire.chunks_exact(share::DESC_BYTES) {
                let d = share::Desc::from_wire(w.try_into().expect("DESC_BYTES"));
                if d.len == 0 {
                    return None;
                }
                total += d.len as usize;
                descs.push(d);
            }
            if total != n {
                return None;
            }
            return (self.1)(&descs);
        }
        if form != FORM_BYTES {
            return None;
        }
        let d = self.take(n).map(Data::from);
        copied(n);
        d
    }
}

/// Faults applied to packets arriving at a port: all of them, or those
/// of one link (from one sending GID, [`Port::set_link_faults`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetFaults {
    /// Drop probability in parts per million.
    pub loss_ppm: u32,
    /// Largest random delay in microseconds (delays reorder packets).
    pub delay_us: u32,
    /// Probability (ppm) that a packet is held back [`REORDER_HOLD`]
    /// beyond its time, so that the packets after it pass it.
    pub reorder_ppm: u32,
    /// Probability (ppm) that a packet arrives twice (the copy with a
    /// delay of its own).
    pub dup_ppm: u32,
}

impl NetFaults {
    /// Whether a packet may be due later than one that arrived after it.
    fn reorders(&self) -> bool {
        self.delay_us > 0 || self.reorder_ppm > 0
    }

    /// Every probability is at most one.
    pub fn validate(&self) -> Result<(), String> {
        if [self.loss_ppm, self.reorder_ppm, self.dup_ppm]
            .iter()
            .any(|&p| p > 1_000_000)
        {
            return Err("a probability is at most 1000000 parts per million".into());
        }
        Ok(())
    }
}

/// How long a reordered packet is held back (beyond its delay).
pub const REORDER_HOLD: Duration = Duration::from_millis(1);
/// Links a port keeps faults of its own for.
pub const MAX_LINKS: usize = 1024;

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
    /// Faults of the packets from one GID, instead of `faults`.
    links: Map<[u8; 16], NetFaults>,
    /// Some faults (`faults` or a link's) reorder packets.
    reorders: bool,
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
    /// Packets that wait for the owner to take them itself
    /// ([`Port::set_inbound`]).
    inbound: RwLock<Option<Arc<dyn Inbound>>>,
    /// Packets in the queue, as of the last change under its lock: read
    /// without the lock by the owner, whose spinning data path looks for
    /// packets on every pass, so that it takes the lock only when there
    /// are some. When the owner took it on every pass, a sender on the
    /// other core often found it held and slept on it until woken: with
    /// two devices of one process sending to each other, 64 B sends at
    /// batch 64 went at 0.57-0.65 M/s, against 0.73-0.92 without.
    queued: AtomicUsize,
}

/// Packets for a port that its owner takes on its own thread, when it
/// looks for packets, instead of a receive thread handing each over:
/// rings in memory another process writes ([`ring`]), which cost a
/// system call on neither side while the owner is awake.
pub(crate) trait Inbound: Send + Sync {
    /// Delivers up to `max` of the packets that arrived to `port`.
    fn poll(&self, port: &Port, max: usize);
    /// The owner is about to sleep: from now on a sender wakes it
    /// ([`Port::kick`]). Returns whether something arrived meanwhile (then
    /// it does not sleep).
    fn arm(&self) -> bool;
    /// The owner is awake again.
    fn disarm(&self);
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
                links: Map::default(),
                reorders: faults.reorders(),
                rng: seed,
                dropped: 0,
            }),
            cv: Condvar::new(),
            health,
            inbound: RwLock::new(None),
            queued: AtomicUsize::new(0),
        })
    }

    /// Where packets for this port wait besides its queue (taken by its
    /// owner's [`Port::take_due_into`]); `None` removes it.
    pub(crate) fn set_inbound(&self, inbound: Option<Arc<dyn Inbound>>) {
        *self.inbound.write().unwrap_or_else(|e| e.into_inner()) = inbound;
    }

    fn inbound(&self) -> Option<Arc<dyn Inbound>> {
        self.inbound
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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
        let mut q = self.lock();
        q.faults = f;
        q.reorders = f.reorders() || q.links.values().any(NetFaults::reorders);
    }

    /// Faults for the packets from `src` only (instead of the port's);
    /// `None` returns them to the port's. At most [`MAX_LINKS`] links.
    pub fn set_link_faults(&self, src: [u8; 16], f: Option<NetFaults>) -> Result<(), String> {
        let mut q = self.lock();
        match f {
            Some(f) if q.links.len() < MAX_LINKS || q.links.contains_key(&src) => {
                q.links.insert(src, f);
            }
            Some(_) => {
                return Err(format!(
                    "at most {MAX_LINKS} links have faults of their own"
                ))
            }
            None => {
                q.links.remove(&src);
            }
        }
        q.reorders = q.faults.reorders() || q.links.values().any(NetFaults::reorders);
        Ok(())
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
        self.deliver_all(std::iter::once(p));
    }

    /// Packets arrive, in order: each subject to the faults and queued,
    /// under one lock, and the owner woken once (a sender's pass hands
    /// over everything it sent this port together).
    pub fn deliver_all(&self, packets: impl IntoIterator<Item = Packet>) {
        let mut q = self.lock();
        let now = Instant::now();
        let mut queued = false;
        let mut lost = 0;
        for p in packets {
            let f = match q.links.get(&p.src_gid) {
                Some(f) => *f,
                None => q.faults,
            };
            if f == NetFaults::default() {
                queued |= Self::push(&mut q, now, p);
                continue;
            }
            let mut chance =
                |ppm: u32| ppm > 0 && xorshift(&mut q.rng) % 1_000_000 < u64::from(ppm);
            let (gone, twice) = (chance(f.loss_ppm), chance(f.dup_ppm));
            if gone {
                q.dropped += 1;
                lost += 1;
                continue;
            }
            let due = |q: &mut PortQ| {
                let mut at = now;
                if f.delay_us > 0 {
                    let d = (xorshift(&mut q.rng) >> 20) % (u64::from(f.delay_us) + 1);
                    at += Duration::from_micros(d);
                }
                if f.reorder_ppm > 0 && xorshift(&mut q.rng) % 1_000_000 < u64::from(f.reorder_ppm)
                {
                    at += REORDER_HOLD;
                }
                at
            };
            if twice {
                let at = due(&mut q);
                queued |= Self::push(&mut q, at, p.clone());
            }
            let at = due(&mut q);
            queued |= Self::push(&mut q, at, p);
        }
        self.queued.store(q.packets.len(), Ordering::Release);
        if queued {
            self.wake(q);
        } else {
            drop(q);
        }
        if lost > 0 {
            self.health.count(Class::Injected, lost);
        }
    }

    /// Queues `p`, due at `at`, unless the queue is full; whether it
    /// queued it.
    fn push(q: &mut PortQ, at: Instant, p: Packet) -> bool {
        let n = p.payload_len();
        if q.packets.len() >= PORT_QUEUE || q.bytes + n > PORT_BYTES {
            q.overflow += 1;
            log::debug!("port queue full: a packet of {n} bytes dropped");
            return false;
        }
        q.bytes += n;
        q.packets.push_back((at, p));
        true
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
        let next = self.take_due_into(now, max, usize::MAX, &mut due);
        (due, next)
    }

    /// [`Port::take_due`] into `out` (appended to; nothing is allocated
    /// once `out` and the queue have grown to their working size), and no
    /// more packets once those taken carry `max_bytes` of payload or more
    /// (one, however large, is always taken).
    pub fn take_due_into(
        &self,
        now: Instant,
        max: usize,
        max_bytes: usize,
        out: &mut Vec<Packet>,
    ) -> Option<Instant> {
        if let Some(i) = self.inbound() {
            i.poll(self, max);
        }
        if self.queued.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut q = self.lock();
        let next = Self::take_locked(&mut q, now, max, max_bytes, out);
        self.queued.store(q.packets.len(), Ordering::Release);
        next
    }

    fn take_locked(
        q: &mut PortQ,
        now: Instant,
        max: usize,
        max_bytes: usize,
        out: &mut Vec<Packet>,
    ) -> Option<Instant> {
        let mut taken = 0;
        let mut bytes = 0;
        let room = |taken: usize, bytes: usize| taken < max && bytes < max_bytes;
        if !q.reorders {
            // Without injected delays a packet is due as it arrives: the
            // oldest first, without looking at the others. (Delays injected
            // before may still hold some back: the loop below then sees
            // them.)
            while room(taken, bytes) && q.packets.front().is_some_and(|&(at, _)| at <= now) {
                let (_, p) = q.packets.pop_front().expect("a front packet");
                let n = p.payload_len();
                q.bytes -= n;
                bytes += n;
                out.push(p);
                taken += 1;
            }
            match q.packets.front() {
                None => return None,
                Some(&(at, _)) if at <= now && !room(taken, bytes) => return Some(at),
                _ => {}
            }
        }
        let mut next: Option<Instant> = None;
        let mut i = 0;
        while i < q.packets.len() {
            let at = q.packets[i].0;
            if at <= now && room(taken, bytes) {
                let (_, p) = q.packets.remove(i).expect("in range");
                let n = p.payload_len();
                q.bytes -= n;
                bytes += n;
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
        // Armed for every wait, however short: a packet that arrives while
        // the owner sleeps wakes it, as one handed over by a receive thread
        // does. Under load a nap of microseconds lasts a time slice, and a
        // packet that waited for its end would too. While the owner is busy
        // (or spins) it never sleeps, and packets cost no wakeup.
        let inbound = self.inbound();
        if let Some(i) = &inbound {
            if i.arm() {
                i.disarm();
                return;
            }
        }
        self.wait_queue(timeout);
        if let Some(i) = &inbound {
            i.disarm();
        }
    }

    fn wait_queue(&self, timeout: Option<Duration>) {
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

    /// Whether a packet that `f` picks is queued here, due or not (held
    /// by an injected delay): one that has arrived but was not handled
    /// yet. A scan of the queue, for the rare question of a probe.
    pub fn holds(&self, f: impl Fn(&Packet) -> bool) -> bool {
        // What waits on a ring arrived before the probe asking: a request
        // there must be found, not answered as never come.
        if let Some(i) = self.inbound() {
            i.poll(self, usize::MAX);
        }
        self.lock().packets.iter().any(|(_, p)| f(p))
    }

    /// Drops every queued packet (device reset).
    pub fn clear(&self) {
        let mut q = self.lock();
        q.packets.clear();
        q.bytes = 0;
        self.queued.store(0, Ordering::Release);
    }
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// How a fabric reaches the ports of other processes: the one boundary
/// between the fabric and a network. A fabric has at most one; ports of
/// its own process it reaches without it.
pub(crate) trait Transport: Send {
    /// Starts receiving for `port`: packets to its GID from other
    /// processes reach [`Port::deliver`].
    fn attach(&mut self, port: &Arc<Port>) -> io::Result<()>;
    /// Stops receiving for `gid` and releases what `attach` took.
    fn detach(&mut self, gid: &[u8; 16]);
    /// Sends `p` to a GID of another process. Returns whether it left (it
    /// may still be lost on the way).
    fn send(&mut self, p: &Packet) -> bool;
    /// Sends `p`, whose payload refers to this process's guest memory, as
    /// descriptors of that memory the receiver reads itself ([`share`]):
    /// `None` if it cannot (nothing offered and accepted yet, or a
    /// transport that carries bytes only), and then its bytes go by
    /// [`Transport::send`]; `Some(Err)`: a region it refers to was
    /// retired.
    fn send_described(&mut self, p: &Packet) -> Option<Result<bool, Fault>> {
        let _ = p;
        None
    }
    /// The largest payload one packet may carry on this transport.
    fn max_segment(&self) -> usize;
    /// What it is, for logs.
    fn describe(&self) -> String;
    /// Packets it lost on the way out, as far as it can tell (a UDP
    /// datagram dropped by the receiving kernel is not among them).
    fn lost(&self) -> u64 {
        0
    }
}

/// Where a fabric's packets to other processes go.
#[derive(Debug, Clone)]
pub enum Remote {
    /// Nowhere: the ports of this process only.
    None,
    /// Unix datagram sockets in this directory ([`unix`]).
    Unix(PathBuf),
    /// UDP, authenticated, to the addresses of a peer map ([`udp`]).
    Udp(UdpConfig),
}

/// Packets between ports: directly between ports attached to it, over a
/// [`Transport`] to other processes when it has one.
pub struct Fabric {
    /// Looked up for every packet sent.
    ports: Mutex<Map<[u8; 16], Weak<Port>>>,
    remote: Mutex<Option<Box<dyn Transport>>>,
    /// The largest payload a packet may carry (the transport's, or
    /// [`MAX_SEGMENT`]).
    max_segment: usize,
    capture: Option<Arc<Capture>>,
    udp_stats: Option<Arc<udp::UdpStats>>,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let remote = self
            .remote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|t| t.describe());
        f.debug_struct("Fabric").field("remote", &remote).finish()
    }
}

impl Fabric {
    /// A fabric joining the ports of this process only.
    pub fn local() -> Arc<Self> {
        Arc::new(Self {
            ports: Mutex::new(Map::default()),
            remote: Mutex::new(None),
            max_segment: MAX_SEGMENT,
            capture: None,
            udp_stats: None,
        })
    }

    /// A fabric that also reaches other processes through Unix sockets in
    /// `dir` (created 0700 if missing; refused if another user can write
    /// to it). Rejected packets count in `health`.
    pub fn with_dir(dir: &Path, health: Arc<Health>) -> io::Result<Arc<Self>> {
        Self::new(Remote::Unix(dir.to_path_buf()), health, None)
    }

    /// A fabric reaching other processes through `remote`; rejected packets
    /// count in `health`; with `capture`, every packet sent and every
    /// datagram received is written there.
    pub fn new(
        remote: Remote,
        health: Arc<Health>,
        capture: Option<Arc<Capture>>,
    ) -> io::Result<Arc<Self>> {
        let mut udp_stats = None;
        let t: Option<Box<dyn Transport>> = match remote {
            Remote::None => None,
            Remote::Unix(dir) => Some(Box::new(unix::UnixSockets::new(
                &dir,
                health,
                capture.clone(),
            )?)),
            Remote::Udp(cfg) => {
                let u = udp::UdpSockets::new(cfg, health, capture.clone())?;
                udp_stats = Some(u.stats());
                Some(Box::new(u))
            }
        };
        Ok(Arc::new(Self {
            ports: Mutex::new(Map::default()),
            udp_stats,
            max_segment: t.as_ref().map_or(MAX_SEGMENT, |t| t.max_segment()),
            remote: Mutex::new(t),
            capture,
        }))
    }

    /// The largest payload one packet may carry: RDMA is cut into
    /// segments of this size.
    pub fn max_segment(&self) -> usize {
        self.max_segment
    }

    /// What the UDP transport's ports received and dropped, if it has one.
    pub fn udp_stats(&self) -> Option<Arc<udp::UdpStats>> {
        self.udp_stats.clone()
    }

    /// Packets its transport to other processes lost on the way out (0
    /// without one): what a test of a loss-free link may see retransmitted.
    pub fn transport_lost(&self) -> u64 {
        self.remote().as_ref().map_or(0, |t| t.lost())
    }

    fn remote(&self) -> MutexGuard<'_, Option<Box<dyn Transport>>> {
        self.remote.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attaches `port`: packets to its GID reach it, from this process and,
    /// with a transport, from others.
    pub fn attach(&self, port: &Arc<Port>) -> io::Result<()> {
        if let Some(t) = self.remote().as_mut() {
            t.attach(port)?;
        }
        self.ports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port.gid, Arc::downgrade(port));
        Ok(())
    }

    /// Detaches the port of `gid` and closes its socket.
    pub fn detach(&self, gid: &[u8; 16]) {
        self.ports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(gid);
        if let Some(t) = self.remote().as_mut() {
            t.detach(gid);
        }
    }

    /// The port of `gid` if it is of this process.
    fn local_port(&self, gid: &[u8; 16]) -> Option<Arc<Port>> {
        self.ports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(gid)
            .and_then(Weak::upgrade)
    }

    /// Sends every packet of `packets` (emptying it), in order: a run of
    /// packets to one port of this process arrives there together
    /// ([`Port::deliver_all`]: one lock and one wakeup for the run).
    pub fn send_all(&self, packets: &mut Vec<Packet>) {
        if packets.is_empty() {
            // Most passes of an idle device.
            return;
        }
        if self.capture.is_some() {
            // Each one recorded as it goes, as `send` does.
            for p in packets.drain(..) {
                self.send(p);
            }
            return;
        }
        let mut it = packets.drain(..).peekable();
        while let Some(first) = it.next() {
            let gid = first.dst_gid;
            match self.local_port(&gid) {
                Some(port) => {
                    let run = std::iter::from_fn(|| it.next_if(|p| p.dst_gid == gid));
                    port.deliver_all(std::iter::once(first).chain(run));
                }
                None => {
                    self.send_remote(first);
                }
            }
        }
    }

    /// Sends `p` towards its destination GID. Returns whether it left
    /// (it may still be lost on the way).
    pub fn send(&self, p: Packet) -> bool {
        if let Some(port) = self.local_port(&p.dst_gid) {
            if let Some(c) = &self.capture {
                c.packet(&p);
            }
            port.deliver(p);
            return true;
        }
        self.send_remote(p)
    }

    /// [`Fabric::send`] to a GID that is not of this process.
    fn send_remote(&self, p: Packet) -> bool {
        // A reference to guest memory means nothing in another process as
        // it is: it goes as descriptors of memory offered to the receiver
        // if it can, else its bytes go (the gather, one copy). One whose
        // region was deregistered meanwhile is answered here, as its
        // receiver would.
        let described = if p.data().is_some_and(|d| d.is_reference()) {
            self.remote().as_mut().and_then(|t| t.send_described(&p))
        } else {
            None
        };
        let resolved = match described {
            Some(Ok(sent)) => return sent,
            Some(Err(fault)) => Err(fault),
            None => p.resolved(),
        };
        let p = match resolved {
            Ok(None) => p,
            Ok(Some(bytes)) => bytes,
            Err(fault) => {
                return match p.refusal(fault) {
                    Some(answer) => self.send(answer),
                    None => false,
                };
            }
        };
        // Under the transport's lock: a packet cannot pass one sent before
        // it on the way out.
        self.remote().as_mut().is_some_and(|t| t.send(&p))
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
        // The transport's own drop ends its threads.
        drop(self.remote().take());
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixDatagram;

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
            pkt(Body::Probe { seq: 12 }),
            pkt(Body::Heard {
                seq: 13,
                what: Heard::Queued,
                status: 0,
            }),
            pkt(Body::Heard {
                seq: 14,
                what: Heard::Answered,
                status: 13,
            }),
            pkt(Body::RespRun {
                first: 15 << 8,
                step: 1 << 8,
                count: 64,
                status: 0,
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
            let mut old = b.clone();
            old[4] = 1;
            assert_eq!(Packet::decode(&old), None, "version 1");
        }
        let mut unknown = pkt(Body::Heard {
            seq: 1,
            what: Heard::Missing,
            status: 0,
        })
        .encode();
        *unknown.iter_mut().rev().nth(1).unwrap() = 3;
        assert_eq!(Packet::decode(&unknown), None, "no such answer to a probe");
        // Runs that answer nothing, one request twice, or requests past
        // the last number.
        for (first, step, count) in [
            (1, 1, 0),
            (1, 0, 2),
            (u64::MAX, 1, 2),
            (u64::MAX - 10, 4, 4),
        ] {
            let run = pkt(Body::RespRun {
                first,
                step,
                count,
                status: 0,
            });
            assert_eq!(Packet::decode(&run.encode()), None, "{run:?}");
        }
        let mut s = 0x1234_5678u64;
        for _ in 0..2000 {
            let n = (xorshift(&mut s) % 200) as usize;
            let g: Vec<u8> = (0..n).map(|_| xorshift(&mut s) as u8).collect();
            let _ = Packet::decode(&g);
        }
    }

    #[test]
    fn answers_in_sequence_leave_as_one_run_and_nothing_else_joins_them() {
        let resp = |seq, status, data: Data| Packet {
            src_gid: [2; 16],
            dst_gid: [1; 16],
            src_qpn: 4,
            dst_qpn: 3,
            body: Body::Resp { seq, status, data },
        };
        let mut run = resp(0x100, 0, Data::default());
        for seq in [0x200, 0x300, 0x400] {
            assert!(run.absorb(&resp(seq, 0, Data::default())), "{seq:#x}");
        }
        assert_eq!(
            run.body,
            Body::RespRun {
                first: 0x100,
                step: 0x100,
                count: 4,
                status: 0
            }
        );
        for seq in [0x100, 0x200, 0x300, 0x400] {
            assert!(run.answers(seq), "{seq:#x}");
        }
        for seq in [0, 0xff, 0x180, 0x500] {
            assert!(!run.answers(seq), "{seq:#x}");
        }
        let other_qp = Packet {
            dst_qpn: 5,
            ..resp(0x500, 0, Data::default())
        };
        let refused = [
            resp(0x600, 0, Data::default()),
            resp(0x500, 13, Data::default()),
            resp(0x500, 0, vec![1].into()),
            other_qp,
        ];
        for p in &refused {
            let before = run.clone();
            assert!(!run.absorb(p), "{p:?}");
            assert_eq!(run, before);
        }
        assert!(run.absorb(&resp(0x500, 0, Data::default())));
        // A run is never a request's answer with data, nor a packet that
        // is not an answer, nor answers to the same request.
        let mut read = resp(1, 0, vec![1].into());
        assert!(!read.absorb(&resp(2, 0, Data::default())));
        let mut same = resp(1, 0, Data::default());
        assert!(!same.absorb(&resp(1, 0, Data::default())));
        let mut probe = pkt(Body::Probe { seq: 1 });
        assert!(!probe.absorb(&resp(2, 0, Data::default())));
        // It stops where the count would overflow, and the next answer
        // starts a packet of its own.
        let mut full = Packet {
            body: Body::RespRun {
                first: 0,
                step: 1,
                count: u16::MAX,
                status: 0,
            },
            ..resp(0, 0, Data::default())
        };
        assert!(!full.absorb(&resp(u64::from(u16::MAX), 0, Data::default())));
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
            ..Default::default()
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
            ..Default::default()
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
    fn links_have_faults_of_their_own_and_packets_are_duplicated_and_reordered() {
        let a = Port::new([2; 16], NetFaults::default(), Health::new());
        let resp = |seq| Packet {
            body: Body::Resp {
                seq,
                status: 0,
                data: vec![].into(),
            },
            ..pkt(Body::Ud {
                qkey: 0,
                imm: None,
                data: vec![].into(),
            })
        };
        let from = |src: u8, seq| Packet {
            src_gid: [src; 16],
            ..resp(seq)
        };
        a.set_link_faults(
            [5; 16],
            Some(NetFaults {
                dup_ppm: 1_000_000,
                ..Default::default()
            }),
        )
        .unwrap();
        a.set_link_faults(
            [6; 16],
            Some(NetFaults {
                loss_ppm: 1_000_000,
                ..Default::default()
            }),
        )
        .unwrap();
        for seq in 0..10 {
            a.deliver(from(1, seq));
            a.deliver(from(5, seq));
            a.deliver(from(6, seq));
        }
        let (got, _) = a.take_due(Instant::now(), usize::MAX);
        let count = |src: u8| got.iter().filter(|p| p.src_gid == [src; 16]).count();
        assert_eq!((count(1), count(5), count(6)), (10, 20, 0));
        assert_eq!(
            a.dropped(),
            10,
            "link 6 loses everything, the others nothing"
        );
        a.set_link_faults([5; 16], None).unwrap();
        a.deliver(from(5, 0));
        assert_eq!(
            a.take_due(Instant::now(), usize::MAX).0.len(),
            1,
            "back to the port's"
        );
        // Every other packet held back: the ones after it pass it.
        a.set_faults(NetFaults {
            reorder_ppm: 500_000,
            ..Default::default()
        });
        for seq in 0..200 {
            a.deliver(resp(seq));
        }
        let (now, next) = a.take_due(Instant::now(), usize::MAX);
        assert!(now.len() > 50 && now.len() < 150, "{} passed", now.len());
        assert!(next.is_some());
        let (late, _) = a.take_due(Instant::now() + REORDER_HOLD, usize::MAX);
        assert_eq!(now.len() + late.len(), 200);
        // Link 6 is one; so many more fit.
        let gid = |n: usize| {
            let mut g = [0xee; 16];
            g[..8].copy_from_slice(&(n as u64).to_le_bytes());
            g
        };
        for n in 1..MAX_LINKS {
            a.set_link_faults(gid(n), Some(NetFaults::default()))
                .unwrap();
        }
        assert!(
            a.set_link_faults(gid(0), Some(NetFaults::default()))
                .is_err(),
            "links are bounded"
        );
        a.set_link_faults(gid(1), None).unwrap();
        a.set_link_faults(gid(0), Some(NetFaults::default()))
            .unwrap();
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
