//! The data path: send queues in the LLQ, receive queues in guest memory,
//! completions, completion events, SRD and UD between queue pairs.
//!
//! # Queues
//!
//! Userspace writes send WQEs into the QP's LLQ in BAR2 and its producer
//! counter into the SQ doorbell, both shared memory: nothing traps, so the
//! data-path thread ([`run`]) polls the doorbells. It copies each announced
//! WQE out of the LLQ at once (the slot may be reused as soon as the WQE
//! completes), checks its phase and executes it. Receive descriptors are
//! read from guest memory when a message needs them. Completions go to the
//! QP's sub-CQ with the phase of the pass, the phase byte written last.
//!
//! # Completion events
//!
//! The CQ doorbell is shared memory too, so the model sees only its latest
//! value, not every write: an arm (`ARM` set) that userspace follows at
//! once with a poll (which writes the consumer index with `ARM` clear) can
//! be overwritten before the poller samples it. Missing an arm hangs a
//! program waiting for its event; an extra event only wakes it once more
//! (libibverbs counts only the events a program read). So a CQ is armed
//! when the model sees `ARM` in a new doorbell value, when the doorbell's
//! `CMD_SN` shows that userspace has received the last event (every
//! program that waits for events re-arms after receiving one), and from
//! its creation. The next completion then writes an EQE to the CQ's EQ and
//! disarms; the EQ raises its MSI-X vector if armed (`EQ_DB`), otherwise at
//! its next arm.
//!
//! A CQ armed while it holds completions that no event announced (they
//! were written while it was not armed) and that the doorbell's consumer
//! count has not passed raises its event at once: userspace arms, polls
//! once, then waits, and that poll can miss a completion the model wrote
//! before it saw the arm; nothing else would raise an event for it. The
//! model writes a completion before it reads the doorbell to decide on its
//! event, so an arm it misses there came after the entry was visible.
//! Completions an event announced raise nothing at the next arm: programs
//! re-arm before they poll the completion their event was for, and one
//! that then expects that completion (perftest's latency tests with
//! events post their next send on it) fails on an extra event.
//!
//! # SRD and UD
//!
//! Sends and RDMA become [`Packet`]s on the [`fabric`](super::fabric). UD
//! sends complete when they leave; UD receives drop on a Q_Key mismatch or
//! when no receive is posted. SRD requests carry a per-QP sequence number
//! and are answered by the responder with a completion status (and the data
//! of a read); the requester retries receiver-not-ready answers
//! `rnr_retry` times (7: for ever), each time as the request's next
//! attempt (a new sequence number), and completes the WQE when every
//! segment was answered. The responder remembers the answers it gave per
//! sender, receiver-not-ready included, so a request that arrives twice
//! is answered again, never delivered twice, and a late copy of a
//! refused send is refused again, never delivered after its sender was
//! told it was not. RDMA transfers are cut into segments of at most
//! [`MAX_SEGMENT`] bytes, at most [`WINDOW`] in flight per WQE; a write
//! with immediate sends its last segment (the one with the immediate)
//! only once all others were acknowledged, so the receive completion
//! never precedes the data.
//!
//! # Late answers: probes, not retransmissions
//!
//! SRD is reliable and unordered, and resends nothing on a link that
//! loses nothing. A timer cannot tell a lost request from one still
//! queued: 16 RDMA writes of 1 MiB with 16 segments each in flight put
//! 16 MiB in the responder's queue, longer to drain than any timeout, and
//! a responder whose thread the host does not schedule for a while
//! answers nothing meanwhile. Timing every request from its send, as TCP
//! does, retransmitted half of such a queue; a timeout scaled by the
//! bytes queued ahead of a request would still fire whenever a thread is
//! preempted for longer than the estimate. So a timeout here sends no
//! payload. It sends a probe ([`Body::Probe`]): "what became of request
//! N?", and the responder says ([`Body::Heard`]) whether it answered it
//! (and how), holds it (arrived, not yet handled: the fabric keeps the
//! order of the packets between two ports, so a probe does not pass the
//! request it asks about; UDP across a network that reorders could, at
//! the cost of one needless retransmission, answered without a second
//! delivery), or never got it. Only a request the responder
//! never got is sent again (counted in `retrans_*`; so is a read whose
//! data-carrying answer was lost), and once however many probes found it
//! missing: replies come back in the order of their probes, and one to a
//! probe sent before the retransmission says nothing of it
//! (`Seg::stale`). One it answered is completed with the status the
//! reply gives, unless the answer waits in the requester's own port; one
//! it holds waits (a reply that it is held restarts no count, so a peer
//! cannot hold a request for ever). A peer that answers a
//! probe is slow, not lossy; a peer that answers nothing is asked again
//! about its oldest request with the timeout doubled per unanswered probe
//! (at most [`RTO_MAX`]), and after [`MAX_RETRIES`] of them (about 1.3 s
//! of silence) it is dead: every request sent to it before the silence
//! began fails with `UNRESP_REMOTE`, on every QP at once, rather than
//! each waiting for the one before it to fail.
//!
//! The timeout state is kept per peer (destination GID), not per QP
//! ([`Peers`]): all QPs to one peer share its round-trip estimate (RFC
//! 6298 over the time the peer takes per request, between [`RTO_MIN`]
//! and [`RTO_MAX`]), the account of which request it answered last, and
//! when it was last heard from. A request is late (and probed) only if a
//! request sent after it to the same peer was answered (it was
//! overtaken: a loss), or if it is the oldest in flight to its peer and
//! the peer was silent for a timeout; the others wait behind it. So a
//! deep queue costs nothing, a stalled peer a few probes, and a lost
//! request one timeout, one probe and its retransmission.
//!
//! # Payloads
//!
//! An SRD send, an RDMA write segment and a read's answer refer to the
//! sender's buffers (their MRs' regions, checked when the WQE is taken)
//! rather than carry bytes: the receiver copies once, straight from the
//! sender's guest memory into its own, when it delivers, after checking
//! that the regions are still registered and their memory there, before
//! it takes a receive or writes anything ([`State::pinned`]). Why, and
//! what happens to a region deregistered under a packet: the
//! [`payload`](super::fabric::payload) module. UD sends, which complete as
//! they leave, are gathered into bytes then.
//!
//! # What arrives from the fabric
//!
//! Packets come from other devices, possibly of other processes: their
//! lengths are bounded before anything is allocated (a read segment by
//! [`MAX_SEGMENT`], a message by the MTU, an RDMA write by
//! `max_rdma_size`), a read request is checked against its MR before its
//! buffer exists, and an answer counts only if it comes from the GID and
//! QP the request went to. Anything else is dropped and counted as
//! `fabric_rejected` ([`crate::health`]).

use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use efa_hw::admin::{CreateQpCmd, DeviceAttr, QpState, QpType, QueueAttr2, RegMrCmd};
use efa_hw::io::*;
use efa_hw::wire::Wire;

use super::fabric::{self, Body, Data, Fault, Heard, Packet, Piece, Source, MAX_SEGMENT};
use super::objects::Stats;
use super::{Inner, Map, State};
use crate::copycount::copied;
use crate::health::Class;
use crate::report;
use crate::transport::CopyError;

/// Segments of one RDMA WQE in flight.
pub const WINDOW: u32 = 16;
/// Smallest timeout (after which a late answer is asked for).
const RTO_MIN: Duration = Duration::from_millis(5);
/// Timeout before a peer's round trip was measured.
const RTO_INITIAL: Duration = Duration::from_millis(20);
/// Largest timeout, and longest wait between probes.
const RTO_MAX: Duration = Duration::from_millis(100);
/// Unanswered probes (or retransmissions) before a request fails with
/// `UNRESP_REMOTE` (about 1.3 s of silence).
pub const MAX_RETRIES: u32 = 16;
/// Wait before retrying a request the receiver was not ready for.
const RNR_DELAY: Duration = Duration::from_millis(1);
/// `rnr_retry` value that retries for ever (as in InfiniBand).
const RNR_INFINITE: u8 = 7;
/// The low bits of an SRD sequence number count the request's attempts
/// after receiver-not-ready answers; the rest number the request.
const ATTEMPT_BITS: u32 = 8;
const ATTEMPT_MASK: u64 = (1 << ATTEMPT_BITS) - 1;
/// Peers whose round-trip estimates are kept while nothing is in flight
/// to them.
const MAX_PEERS: usize = 1024;
/// Answers remembered per sender for duplicate detection.
const SEEN_KEEP: usize = 8192;
/// Answers remembered per QP over all senders (the oldest go first), so
/// that senders a responder never heard of before cannot grow its memory
/// without bound.
const SEEN_TOTAL: usize = 2 * SEEN_KEEP;
/// WQEs taken from one send queue per pass, so that one busy QP does not
/// starve the others. A pass holds the device lock, which register
/// accesses wait for: the budgets keep a pass to a few MiB of copying.
const SQ_BUDGET: u16 = 16;
/// Largest completion entry (CREATE_CQ allows 16 and 32 bytes).
const MAX_CQE: usize = 32;
/// Largest send WQE.
const MAX_WQE: usize = TX_DESC_SIZE_128;
/// Packets handled per pass (the rest wait for the next).
const RX_BUDGET: usize = 64;
/// Payload bytes handled per pass, at least one packet's: the answers of
/// a pass leave at its end, so a pass that took all 16 segments of
/// 64 KiB in flight (a megabyte to copy) held back the answer to the
/// first until the last was copied, and the requester, waiting for
/// answers to post more, left the responder idle in turn.
const RX_BUDGET_BYTES: usize = 2 * MAX_SEGMENT;

/// An answer given to an SRD request: its status and the attempt it
/// answered.
#[derive(Debug, Clone, Copy)]
struct Answer {
    status: u8,
    attempt: u8,
}

/// The answers given to one sender (GID, QP), by request number, in
/// order. A sender numbers its requests in order and the fabric keeps their
/// order, so nearly every answer goes at the end and nearly every request
/// asked about is newer than all of them: one comparison each, and
/// nothing allocated once the window has grown. One out of order (a
/// retransmission, a delay injected) goes in its place, moving the answers
/// after it (a binary search, then the shorter side: a few for a
/// retransmission, at most half the window for a sender that orders its
/// requests to hurt). A request older than all of them is one comparison
/// too: each request remembered forgets one that [`SEEN_TOTAL`] let go,
/// mostly gone from its sender's window already ([`SEEN_KEEP`]).
#[derive(Debug, Clone, Default)]
struct Answers(VecDeque<(u64, Answer)>);

impl Answers {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Where `request` is, or would go.
    fn find(&self, request: u64) -> Result<usize, usize> {
        let (Some(&(first, _)), Some(&(last, _))) = (self.0.front(), self.0.back()) else {
            return Err(0);
        };
        if request > last {
            Err(self.0.len())
        } else if request < first {
            Err(0)
        } else {
            self.0.binary_search_by_key(&request, |&(r, _)| r)
        }
    }

    fn get(&self, request: u64) -> Option<Answer> {
        self.find(request).ok().map(|i| self.0[i].1)
    }

    /// Records `a` as the answer to `request`; whether the request is new
    /// (not a later attempt of one recorded).
    fn insert(&mut self, request: u64, a: Answer) -> bool {
        match self.find(request) {
            Ok(i) => {
                self.0[i].1 = a;
                false
            }
            Err(i) => {
                self.0.insert(i, (request, a));
                true
            }
        }
    }

    /// Forgets the oldest request.
    fn pop_first(&mut self) {
        self.0.pop_front();
    }

    fn remove(&mut self, request: u64) {
        if let Ok(i) = self.find(request) {
            self.0.remove(i);
        }
    }
}

/// The data-path state of a queue pair.
#[derive(Debug, Clone, Default)]
pub struct QpData {
    /// Send WQEs fetched (free-running, as the doorbell).
    pub sq_cc: u16,
    /// Receive descriptors consumed (free-running, as the doorbell).
    pub rq_cc: u16,
    ops: Map<u64, TxOp>,
    segs: Map<u64, Seg>,
    next_seq: u64,
    next_op: u64,
    /// Answers given to SRD requests, per sender (GID, QP), by request
    /// number.
    seen: Map<([u8; 16], u16), Answers>,
    /// The answers in `seen` (and some already dropped from it), oldest
    /// first: at most [`SEEN_TOTAL`].
    seen_order: VecDeque<(([u8; 16], u16), u64)>,
    /// The buffers of the last receive WQE, kept for the next one
    /// ([`State::recycle`]): taking a receive allocates nothing.
    rq_room: Vec<Sge>,
}

impl QpData {
    /// Fresh queues; `seq_base` starts the sequence numbers, so that a
    /// responder never mistakes a new QP's requests for an old one's.
    pub fn new(seq_base: u64) -> Self {
        Self {
            next_seq: seq_base & !ATTEMPT_MASK,
            ..Self::default()
        }
    }

    /// SRD WQEs in flight.
    pub fn in_flight(&self) -> usize {
        self.ops.len()
    }

    /// A new request's sequence number (its first attempt).
    fn new_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1 << ATTEMPT_BITS);
        seq
    }

    /// The sequence number that retries request `seq` after a
    /// receiver-not-ready answer: its next attempt, or a new request once
    /// the attempts are used up (the old one stays refused).
    fn retry_seq(&mut self, seq: u64) -> u64 {
        if seq & ATTEMPT_MASK < ATTEMPT_MASK {
            seq + 1
        } else {
            self.new_seq()
        }
    }

    /// The answer already given to request `seq` of sender `key`, if it
    /// decides this copy: a final answer decides every copy; a
    /// receiver-not-ready answer only copies of that attempt or earlier
    /// ones (late copies), not a later attempt.
    fn answered(&self, key: ([u8; 16], u16), seq: u64) -> Option<u8> {
        let a = self.seen.get(&key)?.get(seq >> ATTEMPT_BITS)?;
        let later = (seq & ATTEMPT_MASK) as u8 > a.attempt;
        (a.status != CompStatus::RemoteErrorRnr.raw() || !later).then_some(a.status)
    }

    /// Whether this attempt of request `seq` of sender `key` (or a later
    /// one) was answered already: a copy of it is a duplicate.
    fn served(&self, key: ([u8; 16], u16), seq: u64) -> bool {
        self.seen
            .get(&key)
            .and_then(|m| m.get(seq >> ATTEMPT_BITS))
            .is_some_and(|a| (seq & ATTEMPT_MASK) as u8 <= a.attempt)
    }

    /// Records the answer to request `seq` of sender `key`: the last
    /// [`SEEN_KEEP`] requests per sender, [`SEEN_TOTAL`] in all.
    fn remember(&mut self, key: ([u8; 16], u16), seq: u64, status: u8) {
        let request = seq >> ATTEMPT_BITS;
        let m = self.seen.entry(key).or_default();
        let attempt = (seq & ATTEMPT_MASK) as u8;
        if !m.insert(request, Answer { status, attempt }) {
            // A later attempt of a request already counted.
            return;
        }
        while m.len() > SEEN_KEEP {
            m.pop_first();
        }
        self.seen_order.push_back((key, request));
        while self.seen_order.len() > SEEN_TOTAL {
            let Some((old, old_seq)) = self.seen_order.pop_front() else {
                break;
            };
            if let Some(m) = self.seen.get_mut(&old) {
                m.remove(old_seq);
                if m.is_empty() {
                    self.seen.remove(&old);
                }
            }
        }
    }
}

/// What a device knows of a peer it sends SRD requests to (a destination
/// GID), over all its QPs: the requests of every QP to one peer cross the
/// same network and wait in the same queue there, so they share one
/// round-trip estimate and one account of what was answered.
#[derive(Debug, Clone, Default)]
struct Peer {
    /// Smoothed round-trip time and its variation (RFC 6298), from
    /// requests answered at the first try.
    srtt: Option<Duration>,
    rttvar: Duration,
    /// The latest transmission answered at the first try, by number
    /// ([`Peers::stamp`]; an answer to a request sent again does not tell
    /// which copy it answers and does not count): a request sent before
    /// it and not answered was overtaken.
    answered: u64,
    /// When the last answer came (not a reply to a probe, which tells
    /// nothing of the time a request takes): see [`Peer::on_answer`].
    answered_at: Option<Instant>,
    /// When the peer was last heard from: an answer or a reply to a probe.
    heard_at: Option<Instant>,
    /// Probes about its oldest request since it was last heard from
    /// (a reply that it holds the request does not count: a peer that
    /// holds a request for ever is as good as dead).
    probes: u32,
    /// The last transmission ([`Peers::stamp`]) before the first of those
    /// probes: what was sent before the silence began.
    silent_from: u64,
}

impl Peer {
    /// The timeout: the estimate of RFC 6298 within [`RTO_MIN`,
    /// `RTO_MAX`]. Round trips vary a lot here (the guest's vCPUs, QEMU
    /// and the model share the host's CPUs); what a timeout costs is a
    /// probe, not a retransmission, so it may be short.
    fn rto(&self) -> Duration {
        match self.srtt {
            Some(srtt) => (srtt + 4 * self.rttvar).clamp(RTO_MIN, RTO_MAX),
            None => RTO_INITIAL,
        }
    }

    /// An answer to `seg` came at `now`. Returns the round trip to sample
    /// if the answer tells one (Karn: only answers to requests sent once):
    /// measured from the previous answer rather than from the send when
    /// that answer came later and was for a request sent earlier, so that
    /// the time spent queued behind other requests (16 MiB in flight take
    /// tens of milliseconds to drain) does not count, only the time the
    /// responder took for this one.
    fn on_answer(&mut self, seg: &Seg, now: Instant) -> Option<Duration> {
        let from = match self.answered_at {
            Some(t) if t > seg.sent && self.answered < seg.ord => t,
            _ => seg.sent,
        };
        self.answered_at = Some(now);
        self.heard(now);
        if seg.tries == 0 {
            self.answered = self.answered.max(seg.ord);
        }
        (seg.tries == 0 && seg.rnr == 0).then(|| now.saturating_duration_since(from))
    }

    /// The peer said something at `now`: it is alive.
    fn heard(&mut self, now: Instant) {
        self.heard_at = Some(now);
        self.probes = 0;
    }

    fn sample_rtt(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                let delta = srtt.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + delta) / 4;
                self.srtt = Some((srtt * 7 + r) / 8);
            }
        }
    }
}

/// The wait after `probes` probes of a request went unanswered: the
/// timeout, doubled per probe, at most [`RTO_MAX`] (or the timeout, if
/// longer).
fn backoff(rto: Duration, probes: u32) -> Duration {
    (rto * (1 << probes.min(8))).min(RTO_MAX.max(rto))
}

/// The peers of a device ([`Peer`]), and the room the timer pass works in.
#[derive(Debug, Default)]
pub struct Peers {
    map: Map<[u8; 16], Peer>,
    /// Request transmissions so far, to all peers (first sends,
    /// retransmissions, next attempts): each [`Seg`] has the number of
    /// its latest one.
    sent: u64,
    /// Per peer, the oldest transmission in flight to it (the timer
    /// pass's, kept for its room).
    heads: Map<[u8; 16], u64>,
    /// The segments whose timers are due, by QP and sequence number.
    due: Vec<(u32, u64)>,
    /// No request in flight has a deadline before this ([`Peers::arm`]);
    /// `None`: none has one. The timer pass looks at the requests only
    /// once it is due: a pass comes every few microseconds while a
    /// device is busy, and a scan of every request in flight at each
    /// cost more than the rest of an idle pass.
    next_due: Option<Instant>,
}

impl Peers {
    /// A request's deadline is now `at` (every deadline set outside the
    /// timer pass comes here).
    fn arm(&mut self, at: Instant) {
        self.next_due = Some(self.next_due.map_or(at, |n| n.min(at)));
    }

    fn get(&mut self, gid: [u8; 16]) -> &mut Peer {
        self.map.entry(gid).or_default()
    }

    /// Numbers a transmission.
    fn stamp(&mut self) -> u64 {
        self.sent += 1;
        self.sent
    }
}

/// The completion and event state of a CQ.
#[derive(Debug, Clone, Default)]
pub struct CqData {
    /// Entries written per sub-CQ.
    produced: Vec<u32>,
    /// The next completion raises an event.
    armed: bool,
    /// `fired` when the CQ was last armed.
    armed_gen: u32,
    /// Events raised.
    fired: u32,
    /// Doorbell value last seen.
    last_db: u32,
    /// [`CqData::written`] when the last event was raised: the entries up
    /// to there were announced, those after it were written unarmed.
    announced: u32,
}

impl CqData {
    /// A new CQ's state; with interrupts it starts armed (see the module
    /// documentation).
    pub fn new(sub_cqs: u16, interrupts: bool) -> Self {
        Self {
            produced: vec![0; sub_cqs.into()],
            armed: interrupts,
            ..Self::default()
        }
    }

    /// Completion events raised.
    pub fn events(&self) -> u32 {
        self.fired
    }

    /// Entries written over all sub-CQs, modulo the width of the
    /// doorbell's consumer count, which counts them the same way.
    fn written(&self) -> u32 {
        let n = self.produced.iter().fold(0u32, |a, &p| a.wrapping_add(p));
        CQ_DB_CONSUMER_INDEX.get(n)
    }

    /// Raises an event, which announces every entry written so far: the
    /// CQ is disarmed until the next arm.
    fn fire(&mut self) {
        self.armed = false;
        self.fired = self.fired.wrapping_add(1);
        self.announced = self.written();
    }
}

/// What a DMA through an MR moves: guest memory into a buffer (which
/// need not be initialized: it is about to be overwritten whole), or `len`
/// bytes of a payload from byte `off` into guest memory (from the packet,
/// or straight from the sender's guest memory: `fabric::payload`).
enum Io<'a> {
    Read(&'a mut [MaybeUninit<u8>]),
    Copy {
        src: &'a Source<'a>,
        off: usize,
        len: usize,
    },
}

impl Io<'_> {
    fn len(&self) -> usize {
        match self {
            Io::Read(b) => b.len(),
            Io::Copy { len, .. } => *len,
        }
    }
}

/// A payload of `len` bytes filled by `fill` (which must initialize all of
/// it or fail): one allocation, never cleared first.
fn fill_data<E>(
    len: usize,
    fill: impl FnOnce(&mut [MaybeUninit<u8>]) -> Result<(), E>,
) -> Result<Data, E> {
    let mut d = Arc::<[u8]>::new_uninit_slice(len);
    fill(Arc::get_mut(&mut d).expect("a new Arc is unique"))?;
    // SAFETY: `fill` succeeded, so it initialized every byte (the contract
    // of `Io::Read`: `GuestMemory::read_uninit` initializes all of its
    // buffer on success, and the callers cover the whole buffer).
    Ok(Data::from(unsafe { d.assume_init() }))
}

/// A local buffer: address, length, key.
#[derive(Debug, Clone, Copy)]
struct Sge {
    addr: u64,
    len: u32,
    lkey: u32,
}

/// An SRD WQE in flight.
#[derive(Debug, Clone)]
struct TxOp {
    req_id: u64,
    op: SendOpType,
    dest_gid: [u8; 16],
    dest_qpn: u16,
    qkey: u32,
    imm: Option<u32>,
    /// RDMA local buffer (read destination or write source).
    local: Option<Sge>,
    /// The message of a send, or inline write data.
    data: Option<Data>,
    rkey: u32,
    raddr: u64,
    len: u64,
    next_off: u64,
    outstanding: u32,
    last_sent: bool,
    status: CompStatus,
}

/// A request packet waiting for its answer.
#[derive(Debug, Clone)]
struct Seg {
    op: u64,
    off: u64,
    len: u32,
    pkt: Packet,
    /// When its timer is next looked at.
    deadline: Instant,
    /// When first sent (for the round-trip estimate).
    sent: Instant,
    /// When it or a probe about it was last sent.
    last_tx: Instant,
    /// The number of its latest transmission ([`Peers::stamp`]).
    ord: u64,
    /// Retransmissions (each after a probe found it missing).
    tries: u32,
    /// Probes about it since the peer last answered one (that it holds
    /// it does not count).
    probes: u32,
    /// Times its probe was put off because an answer to it waited in
    /// this port: at most [`MAX_RETRIES`].
    deferred: u32,
    /// Probes about it whose replies have not arrived (a lost one stays
    /// counted).
    asked: u32,
    /// Of those, the ones sent before its latest retransmission: the
    /// replies come back in the order of their probes, so these are the
    /// next ones, and that one of them found it missing says nothing of
    /// the retransmission, which follows them.
    stale: u32,
    rnr: u32,
    /// Held after a receiver-not-ready answer, not yet sent again.
    rnr_wait: bool,
}

/// A receive WQE taken from the RQ.
struct RecvWqe {
    req_id: u16,
    sges: Vec<Sge>,
}

impl RecvWqe {
    fn capacity(&self) -> u64 {
        self.sges.iter().map(|s| u64::from(s.len)).sum()
    }
}

/// What a receive completion reports.
struct RxComp {
    req_id: u16,
    status: CompStatus,
    op: SendOpType,
    len: u32,
    imm: Option<u32>,
    src_qpn: u16,
    src_gid: [u8; 16],
    unsolicited: bool,
}

fn can_receive(s: QpState) -> bool {
    matches!(s, QpState::Rtr | QpState::Rts | QpState::Sqd)
}

fn add(stats: &mut Stats, other: &mut Stats, f: impl Fn(&mut Stats)) {
    f(stats);
    f(other);
}

/// Whether the data-path thread keeps looking at the doorbells after its
/// last work instead of napping: an answer, the next doorbell of a program
/// that posts as it reaps, or the next packet of a burst mostly comes
/// within microseconds, and a nap, however short, costs a timer and a
/// wakeup (tens of microseconds) on the critical path.
///
/// It spins only when the device is configured to (`Config::spin`, off by
/// default), and only while that is worth it: when work came while it was
/// spinning, or after a gap shorter than the spin. A guest under TCG on
/// two cores rings doorbells hundreds of microseconds apart and needs
/// every cycle: `ibv_ud_pingpong` between two processes on one device took
/// 4.1-5.9 ms per iteration with a 50 us spin after each piece of work,
/// 2.2-3.2 ms with this rule, 0.2-0.8 ms without any spin. The benchmark's
/// driver, like a guest under KVM, rings within microseconds (`make
/// bench-emu` turns the spin on).
///
/// A spin is bounded by the time it runs, not by the time since the work.
/// Each spinning pass yields, and while other threads have the CPU (the
/// peer device's data path, the program ringing the doorbells) the spin
/// costs nothing. Bounded by the wall clock, the spin of a device whose
/// peer had the CPU for a scheduler slice ended while the peer was
/// producing its answer, and the answer then cost a futex wakeup and two
/// context switches: with three threads on two cores, 64 KiB RDMA writes
/// in one process ran at 12-23% of memcpy, against 51-59% this way.
#[derive(Debug)]
struct Spin {
    limit: Duration,
    worth: bool,
    /// Time run by this spin.
    ran: Duration,
    /// Whether the last idle pass spun.
    spinning: bool,
}

/// Keeps the calling thread on `cpus` (each below `CPU_SETSIZE`, as
/// [`super::Config::validate`] checks): what the data-path thread does
/// with [`super::Config::data_cpus`], and what a driver of the model that
/// polls (the benchmark's) does to stay off the cores it leaves to it.
pub fn run_on(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is a plain bit array, for which all zeroes is the
    // empty set (what CPU_ZERO makes).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: `set` is a valid cpu_set_t, and `c` is below
        // CPU_SETSIZE, so its bit is inside the set.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size given, read only
    // during the call; pid 0 is the calling thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// How long a yield takes when no other thread wants the CPU, or a little
/// more (0.6 us measured on the benchmark's host): a yield that takes
/// longer gave the CPU away, and the time away is not the spin's.
const YIELD_ALONE: Duration = Duration::from_micros(2);

impl Spin {
    fn new(limit: Duration) -> Self {
        Self {
            limit,
            worth: false,
            ran: Duration::ZERO,
            spinning: false,
        }
    }

    /// Work came after `gap` (wall clock) without any.
    fn work_after(&mut self, gap: Duration) {
        self.worth = self.spinning || gap < self.limit;
        self.ran = Duration::ZERO;
        self.spinning = false;
    }

    /// Whether to spin another idle pass.
    fn spins(&mut self) -> bool {
        self.spinning = self.worth && self.ran < self.limit;
        // Once it napped, a spin resumes only after the next work.
        self.worth = self.spinning;
        self.spinning
    }

    /// A spinning pass took `pass`, then its yield `yielded`.
    fn spun(&mut self, pass: Duration, yielded: Duration) {
        self.ran += pass + yielded.min(YIELD_ALONE);
    }
}

/// Timer slack of the data-path thread: the kernel may defer a wakeup by
/// this much. The default (50 µs) made a 10 µs nap last ~60 µs, and a
/// doorbell written meanwhile wait for it.
const TIMER_SLACK_NS: libc::c_ulong = 1000;

/// The data-path thread: runs [`State::datapath`] while there is work,
/// may spin when there is none ([`Spin`]), then backs off, sleeping until a
/// packet arrives, a timer is due, or the back-off ends (to look at the
/// doorbells again). Without queue pairs it sleeps until woken.
pub(super) fn run(inner: &Inner) {
    // SAFETY: PR_SET_TIMERSLACK takes an integer by value and changes
    // only the calling thread's timer slack; failure keeps the default.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0) };
    if !inner.cfg.data_cpus.is_empty() {
        if let Err(e) = run_on(&inner.cfg.data_cpus) {
            log::warn!(
                "{}: the data path runs where the scheduler puts it, not on CPUs {:?}: {e}",
                inner.name(),
                inner.cfg.data_cpus
            );
        }
    }
    let mut idle_since: Option<Instant> = None;
    let mut spin = Spin::new(inner.cfg.spin);
    // Reused from pass to pass, so that a busy pass allocates nothing.
    let mut packets = Vec::with_capacity(RX_BUDGET);
    let mut handles = Vec::new();
    let mut outbox = Vec::new();
    loop {
        stand_still(inner);
        let now = Instant::now();
        let next_packet = inner
            .port
            .take_due_into(now, RX_BUDGET, RX_BUDGET_BYTES, &mut packets);
        let (work, next_timer, polling) = {
            let mut st = inner.lock();
            if st.stop {
                return;
            }
            if std::mem::take(&mut st.panic_requested) {
                drop(st);
                panic!(
                    "{}: panic requested through the control window",
                    inner.name()
                );
            }
            let r = st.datapath(inner, &mut packets, &mut handles, now);
            // What the pass sent leaves together, without the lock: one
            // lock of each destination port and one wakeup of its owner
            // per pass, not per packet.
            std::mem::swap(&mut st.outbox, &mut outbox);
            r
        };
        inner.fabric.send_all(&mut outbox);
        if work {
            if let Some(since) = idle_since.take() {
                spin.work_after(now.duration_since(since));
            }
            continue;
        }
        // From the clock read for the pass: one read of it per idle pass.
        let idle = now.saturating_duration_since(*idle_since.get_or_insert(now));
        if polling && spin.spins() {
            // Let the other threads of a busy host run (the guest's vCPUs,
            // the peer's data path): a spin must not take their CPU.
            let yield_at = Instant::now();
            std::thread::yield_now();
            spin.spun(yield_at.duration_since(now), yield_at.elapsed());
            continue;
        }
        // Short naps just after work (an answer is likely soon), longer
        // ones the longer nothing happens: an idle device costs next to no
        // CPU, and never spins on a CPU the guest's vCPUs need.
        // After ten idle seconds a doorbell waits up to 50 ms to be seen:
        // 20 wakeups a second (timers and arriving packets wake the thread
        // at once regardless).
        let nap = match idle.as_millis() {
            0..=1 => Duration::from_micros(10),
            2..=20 => Duration::from_micros(50),
            21..=200 => Duration::from_micros(250),
            201..=2000 => Duration::from_millis(1),
            2001..=10000 => Duration::from_millis(10),
            _ => Duration::from_millis(50),
        };
        let mut wait = polling.then_some(nap);
        for at in [next_packet, next_timer].into_iter().flatten() {
            let d = at.saturating_duration_since(now);
            wait = Some(wait.map_or(d, |w| w.min(d)));
        }
        inner.port.wait(wait);
    }
}

/// Waits out a stall asked for by [`super::EfaDevice::stall`] (until the
/// device stops).
fn stand_still(inner: &Inner) {
    let Some(d) = inner.stall.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    let until = Instant::now() + d;
    inner.stalls_begun.fetch_add(1, Ordering::SeqCst);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || inner.lock().stop {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(10)));
    }
}

/// Updates the arm state of `cq` from its doorbell. Returns whether it
/// owes its EQ an event now: armed while it holds completions past the
/// doorbell's consumer count (see the module documentation).
fn sample_cq(inner: &Inner, cq: &mut super::objects::Cq) -> bool {
    let (Some(_), Some((_, db_offset))) = (cq.eqn, cq.doorbell) else {
        return false;
    };
    let db = State::doorbell(inner, db_offset);
    let d = &mut cq.dp;
    if db != d.last_db {
        d.last_db = db;
        if CQ_DB_ARM.is_set(db) {
            d.armed = true;
            d.armed_gen = d.fired;
        }
    }
    if d.fired != 0 && CQ_DB_CMD_SN.get(db) == d.fired & 3 && d.armed_gen != d.fired {
        d.armed = true;
        d.armed_gen = d.fired;
    }
    // A completion written while the CQ is armed raises the event at once,
    // so an armed CQ with entries that no event announced got them while
    // it was not armed: the program's poll after its arm may have missed
    // them, and it waits for this event (had the poll found them all, the
    // consumer count would say so). Entries an event announced are left
    // alone: programs arm before they poll the entry their event was for
    // (perftest's latency tests with events then post their next send
    // expecting that entry, and fail on an extra event).
    let written = d.written();
    d.armed && written != d.announced && CQ_DB_CONSUMER_INDEX.get(db) != written
}

impl State {
    /// One pass: handles `packets` (emptying it), fetches new send WQEs,
    /// runs the timers, samples the CQ doorbells. Returns whether anything
    /// happened, when the next timer is due, and whether there are queues
    /// whose doorbells must be polled. `handles` is room for the QP
    /// handles.
    pub(super) fn datapath(
        &mut self,
        inner: &Inner,
        packets: &mut Vec<Packet>,
        handles: &mut Vec<u32>,
        now: Instant,
    ) -> (bool, Option<Instant>, bool) {
        if self.fatal || self.reset_in_progress {
            packets.clear();
            return (false, None, false);
        }
        let mut work = !packets.is_empty();
        if work {
            for p in packets.drain(..) {
                self.receive(inner, p, now);
            }
        }
        handles.clear();
        handles.extend(self.objs.qps.iter().map(|(h, _)| h));
        for &h in handles.iter() {
            work |= self.service_sq(inner, h, now);
            if self.objs.qps.get(h).map(|q| q.state) == Some(QpState::Err) {
                work |= self.flush_rq(inner, h);
            }
        }
        let next = self.timers(inner, now);
        self.sample_cqs(inner);
        (work, next, !handles.is_empty())
    }

    fn doorbell(inner: &Inner, offset: u32) -> u32 {
        inner.bar2.load_u32(offset as usize).unwrap_or(0)
    }

    // ---- queue pairs ----

    /// Puts a QP in the error state (a guest bug the device cannot work
    /// around); its queues are flushed from now on.
    fn qp_error(&mut self, inner: &Inner, h: u32, why: &str) {
        report!(
            inner.health(),
            Warn,
            Some(Class::QpError),
            "qp-error",
            "{}: QP {h:#x}: {why}; QP in error",
            inner.name()
        );
        if let Some(qp) = self.objs.qps.get_mut(h) {
            qp.state = QpState::Err;
        }
        self.flush_ops(inner, h);
    }

    /// Completes every SRD WQE in flight with FLUSHED.
    fn flush_ops(&mut self, inner: &Inner, h: u32) {
        let Some(qp) = self.objs.qps.get_mut(h) else {
            return;
        };
        qp.dp.segs.clear();
        let ops: Vec<TxOp> = qp.dp.ops.drain().map(|(_, o)| o).collect();
        for o in ops {
            self.complete_tx(inner, h, o.req_id, o.op, CompStatus::Flushed);
        }
    }

    /// Fetches and executes the send WQEs the doorbell announced.
    // Out of line (as are `receive`, `timers` and `sample_cqs`): a
    // profile of the data path (make bench-emu's --msgs under callgrind)
    // then tells the work per WQE and per packet from the pass around it.
    #[inline(never)]
    fn service_sq(&mut self, inner: &Inner, h: u32, now: Instant) -> bool {
        let Some(qp) = self.objs.qps.get(h) else {
            return false;
        };
        if qp.sq_depth == 0 {
            return false;
        }
        let pc = Self::doorbell(inner, qp.db_offsets[0]) as u16;
        let pending = pc.wrapping_sub(qp.dp.sq_cc);
        if pending == 0 {
            return false;
        }
        let state = qp.state;
        if !matches!(state, QpState::Rts | QpState::Err) {
            // Not sending: the WQEs wait (in SQD until the QP is back in
            // RTS; the provider refuses to post in the other states).
            return false;
        }
        if u32::from(pending) > qp.sq_depth {
            if state == QpState::Err {
                // Reported when it put the QP in error: nothing there can
                // be flushed, so forget it.
                if let Some(qp) = self.objs.qps.get_mut(h) {
                    qp.dp.sq_cc = pc;
                }
                return true;
            }
            self.qp_error(
                inner,
                h,
                &format!(
                    "SQ doorbell {pc} is {pending} WQEs ahead of a {}-deep ring",
                    qp.sq_depth
                ),
            );
            return true;
        }
        for _ in 0..pending.min(SQ_BUDGET) {
            let Some(qp) = self.objs.qps.get_mut(h) else {
                return true;
            };
            let depth = qp.sq_depth;
            let size = qp.sq_wqe_size() as usize;
            let cc = u32::from(qp.dp.sq_cc);
            let at = qp.llq_offset as usize + (cc % depth) as usize * size;
            let mut buf = [0u8; MAX_WQE];
            let bytes = &mut buf[..size];
            if inner.bar2.read(at, bytes).is_err() {
                self.qp_error(inner, h, "LLQ outside BAR2");
                return true;
            }
            qp.dp.sq_cc = qp.dp.sq_cc.wrapping_add(1);
            let meta = TxMetaDesc::decode_padded(bytes);
            let phase = ((cc / depth) & 1) as u8;
            let is_64 = CreateQpCmd::SQ_64_BIT_REQ_ID.is_set(qp.flags);
            let req_id = if is_64 {
                meta.req_id_64()
            } else {
                meta.req_id.into()
            };
            let op = SendOpType::try_from(TxMetaDesc::OP_TYPE.get(meta.ctrl1))
                .unwrap_or(SendOpType::Send);
            if qp.state == QpState::Err {
                self.complete_tx(inner, h, req_id, op, CompStatus::Flushed);
                continue;
            }
            if TxMetaDesc::PHASE.get(meta.ctrl2) != phase {
                self.qp_error(
                    inner,
                    h,
                    &format!("send WQE {cc} has phase {} where {phase} is due", phase ^ 1),
                );
                return true;
            }
            self.post_send(inner, h, bytes, &meta, req_id, now);
        }
        true
    }

    /// Executes one send WQE, `bytes`, whose metadata is `meta` (decoded
    /// once: a decode costs hundreds of instructions). Out of line, as
    /// `service_sq` is: a profile tells a WQE's work from the doorbell's
    /// polling.
    #[inline(never)]
    fn post_send(
        &mut self,
        inner: &Inner,
        h: u32,
        bytes: &[u8],
        meta: &TxMetaDesc,
        req_id: u64,
        now: Instant,
    ) {
        let op = SendOpType::try_from(TxMetaDesc::OP_TYPE.get(meta.ctrl1));
        let result = self.prepare_send(inner, h, bytes, meta, req_id);
        let op_or_send = op.unwrap_or(SendOpType::Send);
        let mut o = match result {
            Ok(o) => o,
            Err(status) => {
                let qp = self.objs.qps.get_mut(h).expect("live QP");
                add(&mut self.stats, &mut qp.stats, |s| match op_or_send {
                    SendOpType::RdmaRead => s.rdma_read.read_wr_err += 1,
                    SendOpType::RdmaWrite => s.rdma_write.write_wr_err += 1,
                    _ => {}
                });
                log::debug!(
                    "{}: QP {h:#x}: send WQE {req_id:#x} fails: {status:?}",
                    inner.name()
                );
                self.complete_tx(inner, h, req_id, op_or_send, status);
                return;
            }
        };
        let qp = self.objs.qps.get_mut(h).expect("live QP");
        let len = o.len;
        add(&mut self.stats, &mut qp.stats, |s| match o.op {
            SendOpType::RdmaRead => {
                s.rdma_read.read_wrs += 1;
                s.rdma_read.read_bytes += len;
            }
            SendOpType::RdmaWrite => {
                s.rdma_write.write_wrs += 1;
                s.rdma_write.write_bytes += len;
            }
            _ => {
                s.messages.send_wrs += 1;
                s.messages.send_bytes += len;
            }
        });
        if qp.qp_type == QpType::Ud {
            let pkt = Packet {
                src_gid: inner.cfg.gid,
                dst_gid: o.dest_gid,
                src_qpn: h as u16,
                dst_qpn: o.dest_qpn,
                body: Body::Ud {
                    qkey: o.qkey,
                    imm: o.imm,
                    data: o.data.take().unwrap_or_default(),
                },
            };
            self.transmit(h, pkt);
            if TxMetaDesc::COMP_REQ.is_set(meta.ctrl2) {
                self.complete_tx(inner, h, req_id, SendOpType::Send, CompStatus::Ok);
            }
            return;
        }
        let id = qp.dp.next_op;
        qp.dp.next_op += 1;
        qp.dp.ops.insert(id, o);
        self.pump(inner, h, id, now);
    }

    /// Checks a send WQE and gathers what it needs; the error is the
    /// completion status.
    fn prepare_send(
        &mut self,
        inner: &Inner,
        h: u32,
        bytes: &[u8],
        meta: &TxMetaDesc,
        req_id: u64,
    ) -> Result<TxOp, CompStatus> {
        let qp = self.objs.qps.get(h).expect("live QP");
        let (pd, qp_type, wqe_size) = (qp.pd, qp.qp_type, qp.sq_wqe_size() as usize);
        let c1 = meta.ctrl1;
        let c2 = meta.ctrl2;
        if !TxMetaDesc::META_DESC.is_set(c1)
            || !TxMetaDesc::FIRST.is_set(c2)
            || !TxMetaDesc::LAST.is_set(c2)
            || TxMetaDesc::META_EXTENSION.is_set(c1)
        {
            return Err(CompStatus::LocalErrorQpInternalError);
        }
        let op = SendOpType::try_from(TxMetaDesc::OP_TYPE.get(c1))
            .map_err(|_| CompStatus::LocalErrorUnsupportedOp)?;
        let caps = inner.cfg.device_caps;
        let rdma_ok = |cap: efa_hw::wire::Field<u32>| qp_type == QpType::Srd && cap.is_set(caps);
        match op {
            SendOpType::Send => {}
            SendOpType::RdmaRead if rdma_ok(DeviceAttr::RDMA_READ) => {}
            SendOpType::RdmaWrite if rdma_ok(DeviceAttr::RDMA_WRITE) => {}
            _ => return Err(CompStatus::LocalErrorUnsupportedOp),
        }
        let ah = self
            .objs
            .ahs
            .get(meta.ah.into())
            .filter(|a| a.pd == pd)
            .ok_or(CompStatus::LocalErrorInvalidAh)?;
        let imm = TxMetaDesc::HAS_IMM
            .is_set(c1)
            .then_some(meta.immediate_data);
        if imm.is_some() && op == SendOpType::RdmaRead {
            return Err(CompStatus::LocalErrorUnsupportedOp);
        }
        let inline = TxMetaDesc::INLINE_MSG.is_set(c1);
        // What the device advertises, within what the WQE can hold.
        let l = &inner.cfg.limits;
        let inline_max = if wqe_size == TX_DESC_SIZE_128 {
            TX_DESC_INLINE_MAX_SIZE_128.min(l.inline_buf_size_ex.into())
        } else {
            TX_DESC_INLINE_MAX_SIZE.min(l.inline_buf_size as usize)
        };
        let mut o = TxOp {
            req_id,
            op,
            dest_gid: ah.gid,
            dest_qpn: meta.dest_qp_num,
            qkey: meta.qkey,
            imm,
            local: None,
            data: None,
            rkey: 0,
            raddr: 0,
            len: 0,
            next_off: 0,
            outstanding: 0,
            last_sent: false,
            status: CompStatus::Ok,
        };
        let body = &bytes[TxMetaDesc::SIZE..];
        if op == SendOpType::Send {
            let data = if inline {
                let n = usize::from(meta.length);
                if n > inline_max {
                    return Err(CompStatus::LocalErrorBadLength);
                }
                copied(n);
                Data::from(&body[..n])
            } else {
                let n = usize::from(meta.length);
                let max = usize::from(inner.cfg.limits.max_sq_sges).min(TX_DESC_NUM_BUFS);
                if n > max {
                    return Err(CompStatus::LocalErrorBadLength);
                }
                // The descriptors the WQE has, straight from its body (both
                // WQE sizes put them first).
                let mut sgl = [TxBufDesc::ZERO; TX_DESC_NUM_BUFS];
                for (i, d) in sgl[..n].iter_mut().enumerate() {
                    *d = TxBufDesc::decode_padded(&body[i * TxBufDesc::SIZE..]);
                }
                let mut total = 0u64;
                for d in &sgl[..n] {
                    total += u64::from(d.length);
                }
                if total > u64::from(inner.cfg.mtu) {
                    return Err(CompStatus::LocalErrorBadLength);
                }
                let sges = sgl[..n].iter().map(|d| Sge {
                    addr: d.buf_addr(),
                    len: d.length,
                    lkey: TxBufDesc::LKEY.get(d.lkey),
                });
                if qp_type == QpType::Ud {
                    // A UD send completes as it leaves, before any
                    // receiver copies: gathered now, straight into the
                    // packet's payload.
                    fill_data(total as usize, |buf| {
                        let mut at = 0;
                        for sge in sges {
                            let len = sge.len as usize;
                            let b = Io::Read(&mut buf[at..at + len]);
                            self.local_access(inner, pd, sge, 0, b)?;
                            at += len;
                        }
                        Ok(())
                    })?
                } else {
                    // An SRD send completes after its answer: the receiver
                    // copies from the buffers themselves.
                    let mut pieces: [Option<Piece>; TX_DESC_NUM_BUFS] = Default::default();
                    for (slot, sge) in pieces.iter_mut().zip(sges) {
                        *slot = Some(self.local_piece(pd, sge, 0, sge.len as usize)?);
                    }
                    let pieces = pieces.into_iter().flatten();
                    self.reference(inner, pieces, CompStatus::LocalErrorQpInternalError)?
                }
            };
            if data.len() as u64 > u64::from(inner.cfg.mtu) {
                return Err(CompStatus::LocalErrorBadLength);
            }
            o.len = data.len() as u64;
            o.data = Some(data);
            return Ok(o);
        }
        // RDMA: the first 16 bytes of the body are the remote buffer in
        // both WQE sizes; the local buffer (or inline data) follows.
        let remote = RemoteMemAddr::decode_padded(body);
        o.rkey = remote.rkey;
        o.raddr = remote.buf_addr();
        o.len = remote.length.into();
        if o.len > u64::from(inner.cfg.limits.max_rdma_size) {
            return Err(CompStatus::LocalErrorBadLength);
        }
        let rest = &body[RemoteMemAddr::SIZE..];
        if inline {
            let n = usize::from(meta.length);
            if op != SendOpType::RdmaWrite || wqe_size != TX_DESC_SIZE_128 || n > inline_max {
                return Err(CompStatus::LocalErrorBadLength);
            }
            if n as u64 != o.len {
                return Err(CompStatus::LocalErrorBadLength);
            }
            copied(n);
            o.data = Some(Data::from(&rest[..n]));
            return Ok(o);
        }
        match meta.length {
            0 if o.len == 0 => {}
            1 => {
                let d = TxBufDesc::decode_padded(rest);
                if u64::from(d.length) < o.len {
                    return Err(CompStatus::LocalErrorBadLength);
                }
                let sge = Sge {
                    addr: d.buf_addr(),
                    len: o.len as u32,
                    lkey: TxBufDesc::LKEY.get(d.lkey),
                };
                // Check the whole local buffer now: a bad key fails the WQE
                // before anything goes on the wire.
                let write = op == SendOpType::RdmaRead;
                self.check_local(pd, sge, write)?;
                o.local = Some(sge);
            }
            _ => return Err(CompStatus::LocalErrorBadLength),
        }
        Ok(o)
    }

    /// Sends the next segments of SRD WQE `id` and completes it when done.
    fn pump(&mut self, inner: &Inner, h: u32, id: u64, now: Instant) {
        loop {
            let Some(qp) = self.objs.qps.get_mut(h) else {
                return;
            };
            let pd = qp.pd;
            let Some(o) = qp.dp.ops.get_mut(&id) else {
                return;
            };
            if o.status != CompStatus::Ok || o.last_sent || o.outstanding >= WINDOW {
                break;
            }
            let off = o.next_off;
            let seg_len = if o.op == SendOpType::Send {
                o.len
            } else {
                (o.len - off).min(inner.fabric.max_segment() as u64)
            };
            let last = off + seg_len == o.len;
            if last && o.imm.is_some() && o.op == SendOpType::RdmaWrite && o.outstanding > 0 {
                // The immediate goes last, once the data is in place.
                break;
            }
            // Taken (`new_seq`) once the packet is built.
            let seq = qp.dp.next_seq;
            // The remote address is the WQE's: past the end of the address
            // space it wraps, and the responder's MR check refuses it.
            let (op, rkey, raddr, qkey, imm, total) = (
                o.op,
                o.rkey,
                o.raddr.wrapping_add(off),
                o.qkey,
                o.imm,
                o.len as u32,
            );
            let body = match op {
                // A send is one packet: its message moves into it (the
                // request kept for a retransmission is a copy of it).
                SendOpType::Send => Body::Send {
                    seq,
                    qkey,
                    imm,
                    data: o.data.take().unwrap_or_default(),
                },
                SendOpType::RdmaRead => Body::Read {
                    seq,
                    qkey,
                    rkey,
                    addr: raddr,
                    len: seg_len as u32,
                    last,
                },
                _ => {
                    let data = match (&o.data, o.local) {
                        (Some(d), _) => {
                            copied(seg_len as usize);
                            d.as_bytes()
                                .and_then(|b| b.get(off as usize..(off + seg_len) as usize))
                                .map_or_else(Data::default, Data::from)
                        }
                        (None, Some(l)) => {
                            // The responder copies from the buffer itself.
                            let read =
                                self.local_piece(pd, l, off, seg_len as usize)
                                    .and_then(|p| {
                                        let qp_internal = CompStatus::LocalErrorQpInternalError;
                                        self.reference(inner, [p], qp_internal)
                                    });
                            match read {
                                Ok(d) => d,
                                Err(st) => {
                                    let o = self.op_mut(h, id).expect("live op");
                                    o.status = st;
                                    break;
                                }
                            }
                        }
                        (None, None) => Data::default(),
                    };
                    Body::Write {
                        seq,
                        qkey,
                        rkey,
                        addr: raddr,
                        imm: if last { imm } else { None },
                        total,
                        last,
                        data,
                    }
                }
            };
            let qp = self.objs.qps.get_mut(h).expect("live QP");
            let o = qp.dp.ops.get_mut(&id).expect("live op");
            o.next_off += seg_len;
            o.outstanding += 1;
            o.last_sent = last;
            let pkt = Packet {
                src_gid: inner.cfg.gid,
                dst_gid: o.dest_gid,
                src_qpn: h as u16,
                dst_qpn: o.dest_qpn,
                body,
            };
            let taken = qp.dp.new_seq();
            debug_assert_eq!(taken, seq);
            let rto = self.peers.get(pkt.dst_gid).rto();
            let ord = self.peers.stamp();
            self.peers.arm(now + rto);
            qp.dp.segs.insert(
                seq,
                Seg {
                    op: id,
                    off,
                    len: seg_len as u32,
                    pkt: pkt.clone(),
                    deadline: now + rto,
                    sent: now,
                    last_tx: now,
                    ord,
                    tries: 0,
                    probes: 0,
                    deferred: 0,
                    asked: 0,
                    stale: 0,
                    rnr: 0,
                    rnr_wait: false,
                },
            );
            self.transmit(h, pkt);
        }
        self.maybe_finish(inner, h, id);
    }

    fn op_mut(&mut self, h: u32, id: u64) -> Option<&mut TxOp> {
        self.objs.qps.get_mut(h)?.dp.ops.get_mut(&id)
    }

    /// Completes WQE `id` once nothing of it is in flight and it either
    /// sent everything or failed.
    fn maybe_finish(&mut self, inner: &Inner, h: u32, id: u64) {
        let Some(qp) = self.objs.qps.get_mut(h) else {
            return;
        };
        let Some(o) = qp.dp.ops.get(&id) else {
            return;
        };
        if o.outstanding > 0 || (o.status == CompStatus::Ok && !o.last_sent) {
            return;
        }
        let o = qp.dp.ops.remove(&id).expect("checked");
        if o.status != CompStatus::Ok {
            add(&mut self.stats, &mut qp.stats, |s| match o.op {
                SendOpType::RdmaRead => s.rdma_read.read_wr_err += 1,
                SendOpType::RdmaWrite => s.rdma_write.write_wr_err += 1,
                _ => {}
            });
        }
        self.complete_tx(inner, h, o.req_id, o.op, o.status);
    }

    /// Runs the timers of every SRD request in flight: probes the peers
    /// of requests whose answers are late, resends what the receiver was
    /// not ready for, fails what never got an answer. Returns the next
    /// deadline.
    #[inline(never)]
    fn timers(&mut self, inner: &Inner, now: Instant) -> Option<Instant> {
        if self.peers.map.len() <= MAX_PEERS {
            let lowest = || {
                let deadlines = self.objs.qps.iter().flat_map(|(_, q)| q.dp.segs.values());
                deadlines.map(|s| s.deadline).min()
            };
            match self.peers.next_due {
                None => {
                    debug_assert_eq!(lowest(), None, "a deadline not armed");
                    return None;
                }
                Some(at) if at > now => {
                    debug_assert!(lowest().is_none_or(|d| d >= at), "a deadline not armed");
                    return Some(at);
                }
                Some(_) => {}
            }
        }
        let mut heads = std::mem::take(&mut self.peers.heads);
        let mut due = std::mem::take(&mut self.peers.due);
        heads.clear();
        due.clear();
        let mut next: Option<Instant> = None;
        for (h, qp) in self.objs.qps.iter() {
            for (&seq, s) in &qp.dp.segs {
                if s.deadline <= now {
                    due.push((h, seq));
                } else {
                    next = Some(next.map_or(s.deadline, |n| n.min(s.deadline)));
                }
            }
        }
        if !due.is_empty() || self.peers.map.len() > MAX_PEERS {
            for (_, qp) in self.objs.qps.iter() {
                for s in qp.dp.segs.values().filter(|s| !s.rnr_wait) {
                    let head = heads.entry(s.pkt.dst_gid).or_insert(u64::MAX);
                    *head = (*head).min(s.ord);
                }
            }
        }
        // Peers come and go with AHs: those with nothing in flight are
        // forgotten once there are many.
        if self.peers.map.len() > MAX_PEERS {
            self.peers.map.retain(|g, _| heads.contains_key(g));
        }
        // What the scan found, and what expiring arms.
        self.peers.next_due = next;
        for &(h, seq) in &due {
            if let Some(at) = self.expire(inner, h, seq, &heads, now) {
                next = Some(next.map_or(at, |n| n.min(at)));
                self.peers.arm(at);
            }
        }
        self.peers.heads = heads;
        self.peers.due = due;
        next
    }

    /// The timer of request `seq` of QP `h` expired: returns its next
    /// deadline, if it is still in flight.
    ///
    /// A timeout is for a lost packet, not for a queue: a responder
    /// answers in the order requests arrive (the fabric keeps the order
    /// of the packets between two ports), and many MiB in flight take
    /// longer to drain than any timeout. So a request is late only if a
    /// request sent after it to the same peer was answered (it was
    /// overtaken), or if it is the oldest in flight to its peer and the
    /// peer was silent for a timeout (nothing answered, on any QP); while
    /// older requests wait, it waits behind them. And a late request is
    /// not sent again: a probe asks the peer what became of it, and only
    /// a peer that says it never got it gets it again ([`State::on_heard`]).
    /// A peer whose thread is not scheduled for a while answers nothing,
    /// probes included: it costs probes (each after a timeout doubled per
    /// unanswered probe), not retransmissions, and the peer is dead only
    /// after [`MAX_RETRIES`] unanswered probes ([`State::peer_dead`]).
    fn expire(
        &mut self,
        inner: &Inner,
        h: u32,
        seq: u64,
        heads: &Map<[u8; 16], u64>,
        now: Instant,
    ) -> Option<Instant> {
        let sent = self.peers.sent;
        let qp = self.objs.qps.get_mut(h)?;
        let seg = qp.dp.segs.get_mut(&seq)?;
        let gid = seg.pkt.dst_gid;
        let peer = self.peers.get(gid);
        let rto = peer.rto();
        if seg.rnr_wait {
            // The next attempt, not a retransmission: the responder
            // refuses every late copy of the refused attempt (it
            // remembers that answer), so the message is delivered at
            // most once however the copies and answers cross.
            let mut seg = qp.dp.segs.remove(&seq).expect("present");
            let new = qp.dp.retry_seq(seq);
            seg.rnr_wait = false;
            seg.tries = 0;
            seg.probes = 0;
            // Replies to probes about the old number find nothing.
            (seg.asked, seg.stale) = (0, 0);
            seg.ord = self.peers.stamp();
            seg.last_tx = now;
            seg.deadline = now + rto;
            seg.pkt.renumber(new);
            let pkt = seg.pkt.clone();
            let at = seg.deadline;
            qp.dp.segs.insert(new, seg);
            self.transmit(h, pkt);
            return Some(at);
        }
        let overtaken = peer.answered > seg.ord;
        if !overtaken {
            // The peer's silence is timed by the probes about its oldest
            // request, whichever QP it is on: a peer that answers none
            // is declared dead once, and everything sent to it before
            // the silence began fails together.
            let wait = backoff(rto, peer.probes);
            if heads.get(&gid) != Some(&seg.ord) {
                seg.deadline = now + wait;
                return Some(seg.deadline);
            }
            let quiet = peer.heard_at.map_or(seg.last_tx, |t| t.max(seg.last_tx)) + wait;
            if quiet > now {
                seg.deadline = quiet;
                return Some(quiet);
            }
            // Its answer (or the reply to its probe), arrived but not read
            // yet (more arrived than a pass takes), needs no probe; only
            // an answer to this request counts, as a peer streaming other
            // packets to this port could put a probe off for ever, and so
            // does an answer held here by an injected delay only so often.
            let (src_qpn, dst_qpn) = (seg.pkt.dst_qpn, h as u16);
            if seg.deferred < MAX_RETRIES
                && inner.port.holds(|p| {
                    (p.src_gid, p.src_qpn, p.dst_qpn) == (gid, src_qpn, dst_qpn)
                        && (p.answers(seq)
                            || matches!(p.body, Body::Heard { seq: s, .. } if s == seq))
                })
            {
                seg.deferred += 1;
                seg.deadline = now + rto;
                return Some(seg.deadline);
            }
            if peer.probes >= MAX_RETRIES {
                let upto = peer.silent_from.max(seg.ord);
                self.peer_dead(inner, gid, upto);
                return None;
            }
            if peer.probes == 0 {
                peer.silent_from = sent;
            }
            peer.probes += 1;
        } else {
            let wait = backoff(rto, seg.probes);
            if seg.last_tx + wait > now {
                seg.deadline = seg.last_tx + wait;
                return Some(seg.deadline);
            }
            // Overtaken: the peer answers others, so not this one's
            // probes, or its request, is lost every time.
            if seg.probes >= MAX_RETRIES {
                self.give_up(inner, h, seq);
                return None;
            }
        }
        seg.probes += 1;
        seg.asked += 1;
        seg.last_tx = now;
        seg.deadline = now + backoff(rto, seg.probes.max(self.peers.get(gid).probes));
        let at = seg.deadline;
        log::debug!(
            "{}: QP {h:#x}: probing for {seq:#x} (probe {})",
            inner.name(),
            seg.probes
        );
        let pkt = Packet {
            src_gid: inner.cfg.gid,
            dst_gid: gid,
            src_qpn: h as u16,
            dst_qpn: seg.pkt.dst_qpn,
            body: Body::Probe { seq },
        };
        self.counters.probes += 1;
        self.transmit(h, pkt);
        Some(at)
    }

    /// Sends request `seq` of QP `h` again: its peer said it never got
    /// it, or the answer of a read (which carries data) was lost; then
    /// (`next`) as the request's next attempt.
    fn retransmit(&mut self, inner: &Inner, h: u32, seq: u64, next: bool, now: Instant) {
        let Some(qp) = self.objs.qps.get_mut(h) else {
            return;
        };
        let Some(seg) = qp.dp.segs.get(&seq) else {
            return;
        };
        if seg.tries >= MAX_RETRIES {
            return self.give_up(inner, h, seq);
        }
        let seq = if next {
            let mut seg = qp.dp.segs.remove(&seq).expect("present");
            let new = qp.dp.retry_seq(seq);
            seg.pkt.renumber(new);
            qp.dp.segs.insert(new, seg);
            new
        } else {
            seq
        };
        let seg = qp.dp.segs.get_mut(&seq).expect("present");
        if next {
            // Replies to probes about the old number find nothing.
            seg.asked = 0;
        }
        // Every probe not replied to yet went before this copy.
        seg.stale = seg.asked;
        log::debug!(
            "{}: QP {h:#x}: retransmitting {seq:#x} (try {})",
            inner.name(),
            seg.tries + 1
        );
        seg.tries += 1;
        seg.ord = self.peers.stamp();
        seg.last_tx = now;
        seg.deadline = now + self.peers.get(seg.pkt.dst_gid).rto();
        self.peers.arm(seg.deadline);
        let pkt = seg.pkt.clone();
        let n = pkt.payload_len() as u64;
        // Each retransmission follows a timeout (whose probe found the
        // request missing): one timeout event per packet sent again.
        add(&mut self.stats, &mut qp.stats, |s| {
            s.network.retrans_pkts += 1;
            s.network.retrans_bytes += n;
            s.network.retrans_timeout_events += 1;
        });
        self.transmit(h, pkt);
    }

    /// Peer `gid` answered none of [`MAX_RETRIES`] probes: fails every
    /// request to it, on any QP, whose latest transmission is numbered
    /// `upto` or lower (sent before the silence began). Later ones get a
    /// silence of their own to time.
    fn peer_dead(&mut self, inner: &Inner, gid: [u8; 16], upto: u64) {
        log::debug!(
            "{}: {} answered none of {MAX_RETRIES} probes",
            inner.name(),
            std::net::Ipv6Addr::from(gid)
        );
        let mut dead = Vec::new();
        for (h, qp) in self.objs.qps.iter() {
            for (&seq, s) in &qp.dp.segs {
                if s.pkt.dst_gid == gid && s.ord <= upto {
                    dead.push((h, seq));
                }
            }
        }
        let peer = self.peers.get(gid);
        peer.probes = 0;
        for (h, seq) in dead {
            self.give_up(inner, h, seq);
        }
    }

    /// Fails request `seq` of QP `h`: its peer stopped answering.
    fn give_up(&mut self, inner: &Inner, h: u32, seq: u64) {
        let Some(qp) = self.objs.qps.get_mut(h) else {
            return;
        };
        let Some(seg) = qp.dp.segs.remove(&seq) else {
            return;
        };
        add(&mut self.stats, &mut qp.stats, |s| {
            s.network.unresponsive_remote_events += 1
        });
        log::debug!(
            "{}: QP {h:#x}: no answer from {} QP {} after {MAX_RETRIES} tries",
            inner.name(),
            std::net::Ipv6Addr::from(seg.pkt.dst_gid),
            seg.pkt.dst_qpn
        );
        if let Some(o) = qp.dp.ops.get_mut(&seg.op) {
            o.outstanding = o.outstanding.saturating_sub(1);
            if o.status == CompStatus::Ok {
                o.status = CompStatus::LocalErrorUnrespRemote;
            }
        }
        self.maybe_finish(inner, h, seg.op);
    }

    /// Puts `pkt` on the fabric, counting it: in the pass's outbox, which
    /// leaves when the pass ends ([`run`]), in order. An answer without
    /// data to the request after the one the packet before it answered
    /// joins that one ([`Packet::absorb`]): the answers to a burst of
    /// sends or writes leave as one packet, which costs both sides a
    /// packet's handling once instead of once per request. It is still
    /// counted as a packet, as its receiver counts it.
    fn transmit(&mut self, h: u32, pkt: Packet) {
        let n = pkt.payload_len() as u64;
        if let Some(qp) = self.objs.qps.get_mut(h) {
            add(&mut self.stats, &mut qp.stats, |s| {
                s.basic.tx_pkts += 1;
                s.basic.tx_bytes += n;
            });
        }
        if self.outbox.last_mut().is_some_and(|last| last.absorb(&pkt)) {
            return;
        }
        self.outbox.push(pkt);
    }

    /// Sends an answer to an SRD request (from QP `h`, which may be gone).
    fn answer(&mut self, inner: &Inner, req: &Packet, seq: u64, status: CompStatus, data: Data) {
        let pkt = Packet {
            src_gid: inner.cfg.gid,
            dst_gid: req.src_gid,
            src_qpn: req.dst_qpn,
            dst_qpn: req.src_qpn,
            body: Body::Resp {
                seq,
                status: status.raw(),
                data,
            },
        };
        self.transmit(req.dst_qpn.into(), pkt);
    }

    // ---- receiving ----

    /// Drops a packet from the fabric that breaks the protocol.
    fn reject(&mut self, inner: &Inner, p: &Packet, why: &str) {
        report!(
            inner.health(),
            Warn,
            Some(Class::FabricRejected),
            "fabric-rejected",
            "{}: dropped a packet from {} QP {} to QP {}: {why}",
            inner.name(),
            std::net::Ipv6Addr::from(p.src_gid),
            p.src_qpn,
            p.dst_qpn
        );
    }

    /// Why `p` cannot be a packet of this model's protocol, if it cannot:
    /// every length is bounded by what the device advertises.
    fn malformed(inner: &Inner, p: &Packet) -> Option<String> {
        let mtu = inner.cfg.mtu as usize;
        let max_rdma = u64::from(inner.cfg.limits.max_rdma_size);
        match &p.body {
            Body::Ud { data, .. } | Body::Send { data, .. } if data.len() > mtu => {
                Some(format!("a message of {} bytes, MTU {mtu}", data.len()))
            }
            // Its answer must fit a packet of this fabric.
            Body::Read { len, .. } if *len as usize > inner.fabric.max_segment() => Some(format!(
                "a read segment of {len} bytes, at most {}",
                inner.fabric.max_segment()
            )),
            Body::Write { data, total, .. }
                if data.len() > MAX_SEGMENT
                    || u64::from(*total) > max_rdma
                    || data.len() as u64 > u64::from(*total) =>
            {
                Some(format!(
                    "a write segment of {} bytes of {total}",
                    data.len()
                ))
            }
            Body::Resp { data, .. } if data.len() > MAX_SEGMENT => {
                Some(format!("an answer of {} bytes", data.len()))
            }
            // As the wire form refuses it (a peer in this process builds
            // the packet itself).
            Body::RespRun {
                first, step, count, ..
            } if !fabric::run_is_sound(*first, *step, *count) => Some(format!(
                "a run of {count} answers from request {first}, {step} apart"
            )),
            _ => None,
        }
    }

    #[inline(never)]
    fn receive(&mut self, inner: &Inner, mut p: Packet, now: Instant) {
        if p.dst_gid != inner.cfg.gid {
            return self.reject(inner, &p, "not addressed to this device");
        }
        if let Some(why) = Self::malformed(inner, &p) {
            return self.reject(inner, &p, &why);
        }
        let h = u32::from(p.dst_qpn);
        let n = p.payload_len() as u64;
        // A run of answers counts as the packets it stands for, as its
        // sender counted them.
        let pkts = match p.body {
            Body::RespRun { count, .. } => u64::from(count),
            _ => 1,
        };
        self.stats.basic.rx_pkts += pkts;
        self.stats.basic.rx_bytes += n;
        if let Some(qp) = self.objs.qps.get_mut(h) {
            qp.stats.basic.rx_pkts += pkts;
            qp.stats.basic.rx_bytes += n;
        }
        match p.body {
            Body::Resp {
                seq,
                status,
                ref mut data,
            } => {
                // Moved, not copied (the answer's header is all
                // `on_response` reads of the packet): a peer's payload of
                // many descriptors is a list of them.
                let data = std::mem::take(data);
                self.on_response(inner, &p, seq, status, data, now, false)
            }
            Body::RespRun {
                first,
                step,
                count,
                status,
            } => {
                // Sound (`malformed`): every number is there.
                for seq in (0..count).filter_map(|i| fabric::run_seq(first, step, i)) {
                    self.on_response(inner, &p, seq, status, Data::default(), now, false);
                }
            }
            Body::Ud { .. } => self.rx_ud(inner, &p),
            Body::Probe { seq } => self.rx_probe(inner, &p, seq),
            Body::Heard { seq, what, status } => self.on_heard(inner, &p, seq, what, status, now),
            Body::Send { .. } | Body::Write { .. } | Body::Read { .. } => self.rx_srd(inner, &p),
        }
    }

    fn drop_rx(&mut self, h: u32) {
        self.stats.basic.rx_drops += 1;
        if let Some(qp) = self.objs.qps.get_mut(h) {
            qp.stats.basic.rx_drops += 1;
        }
    }

    fn rx_ud(&mut self, inner: &Inner, p: &Packet) {
        let Body::Ud { qkey, imm, data } = &p.body else {
            return;
        };
        let h = u32::from(p.dst_qpn);
        let Some(qp) = self.objs.qps.get_mut(h) else {
            return self.drop_rx(h);
        };
        if qp.qp_type != QpType::Ud || !can_receive(qp.state) {
            return self.drop_rx(h);
        }
        if *qkey != qp.qkey {
            add(&mut self.stats, &mut qp.stats, |s| s.basic.qkey_viol += 1);
            return self.drop_rx(h);
        }
        let Ok(src) = self.pinned(inner, data) else {
            return self.drop_rx(h);
        };
        let wqe = match self.take_rq(inner, h) {
            None => return self.drop_rx(h),
            Some(Err(why)) => return self.qp_error(inner, h, &why),
            Some(Ok(w)) => w,
        };
        // The first 40 bytes of the buffer are the GRH area; the message
        // follows and the length reported includes the area, as on IB.
        let total = RX_UD_GRH_SIZE as u64 + data.len() as u64;
        let status = if total > wqe.capacity() {
            CompStatus::LocalErrorBadLength
        } else {
            self.scatter(inner, h, &wqe, RX_UD_GRH_SIZE as u64, &src)
                .err()
                .unwrap_or(CompStatus::Ok)
        };
        self.count_recv(h, data.len() as u64);
        self.complete_rx(
            inner,
            h,
            &RxComp {
                req_id: wqe.req_id,
                status,
                op: SendOpType::Send,
                len: total as u32,
                imm: *imm,
                src_qpn: p.src_qpn,
                src_gid: p.src_gid,
                unsolicited: false,
            },
        );
        self.recycle(h, wqe);
    }

    fn count_recv(&mut self, h: u32, n: u64) {
        if let Some(qp) = self.objs.qps.get_mut(h) {
            add(&mut self.stats, &mut qp.stats, |s| {
                s.messages.recv_wrs += 1;
                s.messages.recv_bytes += n;
            });
        }
    }

    fn rx_srd(&mut self, inner: &Inner, p: &Packet) {
        let h = u32::from(p.dst_qpn);
        let (seq, qkey) = match p.body {
            Body::Send { seq, qkey, .. }
            | Body::Write { seq, qkey, .. }
            | Body::Read { seq, qkey, .. } => (seq, qkey),
            _ => return,
        };
        let Some(qp) = self.objs.qps.get_mut(h) else {
            return self.answer(
                inner,
                p,
                seq,
                CompStatus::RemoteErrorBadDestQpn,
                Data::default(),
            );
        };
        // A Q_Key mismatch looks to the sender like a QP that is not there.
        if qp.qp_type != QpType::Srd || !can_receive(qp.state) || qp.qkey != qkey {
            return self.answer(
                inner,
                p,
                seq,
                CompStatus::RemoteErrorBadDestQpn,
                Data::default(),
            );
        }
        let pd = qp.pd;
        let key = (p.src_gid, p.src_qpn);
        let seen = qp.dp.answered(key, seq);
        if let Body::Read {
            rkey,
            addr,
            len,
            last,
            ..
        } = p.body
        {
            // A copy of a read already served (the network duplicated
            // it, or a retransmission crossed the answer) is dropped
            // before its data is read: its answer went with the first
            // copy, and if that answer is lost the requester, told by a
            // probe that the read was answered, asks again with the
            // request's next attempt, which is served (not counted
            // again). The MR is checked before the buffer exists (the
            // length is bounded by `malformed`).
            if qp.dp.served(key, seq) {
                log::debug!(
                    "{}: QP {h:#x}: dropped a copy of read {seq:#x}, served already",
                    inner.name()
                );
                return;
            }
            // The answer refers to the MR: the requester copies from it
            // (or the port reads it as the answer leaves the process).
            let bad = CompStatus::RemoteErrorBadAddress;
            let read = self
                .mr_range(pd, rkey, addr, len.into(), false, true)
                .map(|mr| Piece {
                    region: mr.region.clone(),
                    addr,
                    len: len as usize,
                })
                .map_err(|()| bad)
                .and_then(|p| self.reference(inner, [p], bad));
            let (status, data) = match read {
                Ok(data) => (CompStatus::Ok, data),
                Err(s) => (s, Data::default()),
            };
            if seen.is_none() && status == CompStatus::Ok {
                let qp = self.objs.qps.get_mut(h).expect("live QP");
                add(&mut self.stats, &mut qp.stats, |s| {
                    s.rdma_read.read_resp_bytes += u64::from(len)
                });
                if last {
                    self.count_event(inner, h, QueueAttr2::REMOTE_READ_COMP.mask());
                }
            }
            // Remembers the attempt served, too.
            self.remember(h, key, seq, status);
            return self.answer(inner, p, seq, status, data);
        }
        if let Some(st) = seen {
            // A retransmission of something already handled: answer again.
            let status = CompStatus::try_from(st).unwrap_or(CompStatus::Ok);
            return self.answer(inner, p, seq, status, Data::default());
        }
        let status = match &p.body {
            Body::Send { imm, data, .. } => self.rx_srd_send(inner, h, p, *imm, data),
            Body::Write {
                rkey,
                addr,
                imm,
                total,
                last,
                data,
                ..
            } => self.rx_srd_write(inner, h, p, (*rkey, *addr, *imm, *total, *last), data),
            _ => return,
        };
        // Receiver-not-ready answers are remembered too: a late copy of a
        // refused attempt must not be delivered once a receive is posted,
        // since its sender may already have failed it (or sent its next
        // attempt).
        self.remember(h, key, seq, status);
        self.answer(inner, p, seq, status, Data::default());
    }

    /// Records the answer to request `seq` of sender `key`.
    fn remember(&mut self, h: u32, key: ([u8; 16], u16), seq: u64, status: CompStatus) {
        if let Some(qp) = self.objs.qps.get_mut(h) {
            qp.dp.remember(key, seq, status.raw());
        }
    }

    /// Adds one to every event counter attached to QP `h` for `event` (a
    /// `QueueAttr2` event bit), in the device and in guest memory.
    fn count_event(&mut self, inner: &Inner, h: u32, event: u32) {
        let Some(qp) = self.objs.qps.get(h) else {
            return;
        };
        let handles: Vec<u32> = qp
            .counters
            .iter()
            .filter(|&&(_, events)| events & event != 0)
            .map(|&(c, _)| c)
            .collect();
        for c in handles {
            let Some(ctr) = self.objs.counters.get_mut(c) else {
                continue;
            };
            // event_counter_max_val is u64::MAX: the counter wraps.
            ctr.value = ctr.value.wrapping_add(1);
            if inner.mem.write(ctr.addr, &ctr.value.to_le_bytes()).is_err() {
                self.counters.dma_errors += 1;
                report!(
                    inner.health(),
                    Warn,
                    Some(Class::DmaFailed),
                    "dma-counter",
                    "{}: event counter {c:#x} is not writable",
                    inner.name()
                );
            }
        }
    }

    /// Delivers an SRD send; returns the requester's status.
    fn rx_srd_send(
        &mut self,
        inner: &Inner,
        h: u32,
        p: &Packet,
        imm: Option<u32>,
        data: &Data,
    ) -> CompStatus {
        // Before anything is taken or written: a sender's buffer that is
        // gone fails its request, and nothing arrives.
        let src = match self.pinned(inner, data) {
            Ok(s) => s,
            Err(f) => return f.requester_status(),
        };
        let wqe = match self.take_rq(inner, h) {
            None => {
                self.drop_rx(h);
                return CompStatus::RemoteErrorRnr;
            }
            Some(Err(why)) => {
                self.qp_error(inner, h, &why);
                return CompStatus::RemoteErrorAbort;
            }
            Some(Ok(w)) => w,
        };
        let (local, remote) = if data.len() as u64 > wqe.capacity() {
            (
                CompStatus::LocalErrorBadLength,
                CompStatus::RemoteErrorBadLength,
            )
        } else {
            match self.scatter(inner, h, &wqe, 0, &src) {
                Ok(()) => (CompStatus::Ok, CompStatus::Ok),
                Err(s) => (s, CompStatus::RemoteErrorAbort),
            }
        };
        self.count_recv(h, data.len() as u64);
        self.complete_rx(
            inner,
            h,
            &RxComp {
                req_id: wqe.req_id,
                status: local,
                op: SendOpType::Send,
                len: data.len() as u32,
                imm,
                src_qpn: p.src_qpn,
                src_gid: p.src_gid,
                unsolicited: false,
            },
        );
        self.recycle(h, wqe);
        remote
    }

    /// Executes a segment of an SRD RDMA write; returns the requester's
    /// status.
    fn rx_srd_write(
        &mut self,
        inner: &Inner,
        h: u32,
        p: &Packet,
        (rkey, addr, imm, total, last): (u32, u64, Option<u32>, u32, bool),
        data: &Data,
    ) -> CompStatus {
        let qp = self.objs.qps.get(h).expect("live QP");
        let pd = qp.pd;
        let unsolicited = CreateQpCmd::UNSOLICITED_WRITE_RECV.is_set(qp.flags);
        if let Err(s) = self.check_remote(pd, rkey, addr, data.len() as u64, true) {
            return s;
        }
        let src = match self.pinned(inner, data) {
            Ok(s) => s,
            Err(f) => return f.requester_status(),
        };
        // The receive WQE an immediate needs is taken before any data is
        // written: a receiver-not-ready answer leaves memory as it was.
        let wqe = if imm.is_some() && !unsolicited {
            match self.take_rq(inner, h) {
                None => {
                    self.drop_rx(h);
                    return CompStatus::RemoteErrorRnr;
                }
                Some(Err(why)) => {
                    self.qp_error(inner, h, &why);
                    return CompStatus::RemoteErrorAbort;
                }
                Some(Ok(w)) => Some(w),
            }
        } else {
            None
        };
        let io = Io::Copy {
            src: &src,
            off: 0,
            len: src.len(),
        };
        let status = match self.remote_access(inner, pd, rkey, addr, io) {
            Ok(()) => CompStatus::Ok,
            Err(s) => s,
        };
        if status == CompStatus::Ok {
            let qp = self.objs.qps.get_mut(h).expect("live QP");
            let n = data.len() as u64;
            add(&mut self.stats, &mut qp.stats, |s| {
                s.rdma_write.write_recv_bytes += n
            });
            if last {
                self.count_event(inner, h, QueueAttr2::REMOTE_WRITE_COMP.mask());
            }
        }
        if imm.is_some() {
            self.complete_rx(
                inner,
                h,
                &RxComp {
                    req_id: wqe.as_ref().map_or(0, |w| w.req_id),
                    status: if status == CompStatus::Ok {
                        CompStatus::Ok
                    } else {
                        CompStatus::RemoteErrorAbort
                    },
                    op: SendOpType::RdmaWrite,
                    len: total,
                    imm,
                    src_qpn: p.src_qpn,
                    src_gid: p.src_gid,
                    unsolicited: wqe.is_none(),
                },
            );
        }
        if let Some(w) = wqe {
            self.recycle(h, w);
        }
        status
    }

    /// The responder side of a probe: tells the requester what became of
    /// its request `seq` (from the answers remembered, and from the
    /// packets that arrived and wait in the port). The fabric keeps the
    /// order of the packets between two ports, so a request sent before
    /// the probe is either handled, waiting here, or lost.
    fn rx_probe(&mut self, inner: &Inner, p: &Packet, seq: u64) {
        let h = u32::from(p.dst_qpn);
        let key = (p.src_gid, p.src_qpn);
        let refused = (Heard::Answered, CompStatus::RemoteErrorBadDestQpn.raw());
        let (what, status) = match self.objs.qps.get(h) {
            None => refused,
            Some(qp) if qp.qp_type != QpType::Srd || !can_receive(qp.state) => refused,
            Some(qp) => match qp.dp.answered(key, seq) {
                Some(status) => (Heard::Answered, status),
                None if inner.port.holds(|q| {
                    (q.src_gid, q.src_qpn, q.dst_qpn) == (p.src_gid, p.src_qpn, p.dst_qpn)
                        && q.request_seq() == Some(seq)
                }) =>
                {
                    (Heard::Queued, 0)
                }
                None => (Heard::Missing, 0),
            },
        };
        let pkt = Packet {
            src_gid: inner.cfg.gid,
            dst_gid: p.src_gid,
            src_qpn: p.dst_qpn,
            dst_qpn: p.src_qpn,
            body: Body::Heard { seq, what, status },
        };
        self.transmit(h, pkt);
    }

    /// The requester side of a reply to a probe: the peer is alive; a
    /// request it never got is sent again, one it answered is taken as
    /// answered (unless the answer is here, waiting to be read), one it
    /// holds waits.
    fn on_heard(
        &mut self,
        inner: &Inner,
        p: &Packet,
        seq: u64,
        what: Heard,
        status: u8,
        now: Instant,
    ) {
        let h = u32::from(p.dst_qpn);
        let Some(qp) = self.objs.qps.get_mut(h) else {
            return;
        };
        // A reply to a probe about a request answered since finds nothing.
        let Some(seg) = qp.dp.segs.get_mut(&seq) else {
            return;
        };
        if let Some(why) = not_from_its_peer(&seg.pkt, p, "a reply to a probe for", seq) {
            return self.reject(inner, p, &why);
        }
        if what != Heard::Answered && status != 0 {
            let why =
                format!("a reply to a probe for request {seq:#x}: {what:?} with status {status}");
            return self.reject(inner, p, &why);
        }
        if seg.rnr_wait {
            // Its next attempt goes soon anyway.
            return;
        }
        // The fabric keeps the order of the packets between two ports
        // both ways: this replies to the oldest probe not replied to yet
        // (or a later one, if that one or its reply was lost: then a
        // reply about the retransmission is taken as about an earlier
        // copy, and a loss of it waits for one more probe).
        seg.asked = seg.asked.saturating_sub(1);
        let stale = seg.stale > 0;
        seg.stale = seg.stale.saturating_sub(1);
        let peer = self.peers.get(p.src_gid);
        let rto = peer.rto();
        seg.last_tx = now;
        seg.deadline = now + rto;
        if what == Heard::Queued {
            // Alive, but a peer that holds a request for ever must not
            // keep it in flight for ever: neither its probe count nor the
            // peer's starts over.
            peer.heard_at = Some(now);
            seg.deadline = now + backoff(rto, seg.probes.max(peer.probes));
        } else {
            peer.heard(now);
            seg.probes = 0;
        }
        self.peers.arm(seg.deadline);
        match what {
            Heard::Queued => {}
            // Missing when the probe arrived, which was before the
            // retransmission: that one is still to come.
            Heard::Missing if stale => {}
            Heard::Missing => self.retransmit(inner, h, seq, false, now),
            Heard::Answered => {
                let read = matches!(seg.pkt.body, Body::Read { .. });
                let answer_here = inner.port.holds(|q| {
                    (q.src_gid, q.src_qpn, q.dst_qpn) == (p.src_gid, p.src_qpn, p.dst_qpn)
                        && q.answers(seq)
                });
                if answer_here {
                    // It is read soon.
                    return;
                }
                if read && status == CompStatus::Ok.raw() {
                    // The answer carried the data: the read is asked
                    // again, as its next attempt (the responder drops
                    // copies of the attempt it served).
                    self.retransmit(inner, h, seq, true, now);
                } else {
                    self.on_response(inner, p, seq, status, Data::default(), now, true);
                }
            }
        }
    }

    /// The requester side of an answer `p` (`by_probe`: the reply to a
    /// probe, which tells no round trip).
    #[allow(clippy::too_many_arguments)]
    fn on_response(
        &mut self,
        inner: &Inner,
        p: &Packet,
        seq: u64,
        status: u8,
        data: Data,
        now: Instant,
        by_probe: bool,
    ) {
        let h = u32::from(p.dst_qpn);
        let Some(qp) = self.objs.qps.get_mut(h) else {
            return;
        };
        let status = CompStatus::try_from(status).unwrap_or(CompStatus::RemoteErrorBadStatus);
        // A duplicate answer (to a retransmission) finds nothing.
        let Some(seg) = qp.dp.segs.get(&seq) else {
            return;
        };
        // Only the peer the request went to answers it.
        if let Some(why) = not_from_its_peer(&seg.pkt, p, "an answer to", seq) {
            return self.reject(inner, p, &why);
        }
        let Some(mut seg) = qp.dp.segs.remove(&seq) else {
            return;
        };
        let pd = qp.pd;
        let rnr_retry = qp.rnr_retry;
        let peer = self.peers.get(p.src_gid);
        if by_probe {
            peer.heard(now);
        } else if let Some(rtt) = peer.on_answer(&seg, now) {
            peer.sample_rtt(rtt);
        }
        let mut status = status;
        if status == CompStatus::RemoteErrorRnr {
            log::debug!(
                "{}: QP {h:#x}: receiver not ready (try {})",
                inner.name(),
                seg.rnr
            );
            if rnr_retry == RNR_INFINITE || seg.rnr < u32::from(rnr_retry) {
                seg.rnr += 1;
                self.counters.rnr_waits += 1;
                seg.rnr_wait = true;
                seg.deadline = now + RNR_DELAY;
                self.peers.arm(seg.deadline);
                qp.dp.segs.insert(seq, seg);
                return;
            }
        } else if status == CompStatus::Ok {
            let local = qp
                .dp
                .ops
                .get(&seg.op)
                .and_then(|o| (o.op == SendOpType::RdmaRead).then_some(o.local).flatten());
            if let Some(l) = local {
                if data.len() != seg.len as usize {
                    status = CompStatus::RemoteErrorBadLength;
                } else {
                    // The responder's MR, deregistered since it answered,
                    // is an address it no longer serves.
                    status = match self.pinned(inner, &data) {
                        Err(_) => CompStatus::RemoteErrorBadAddress,
                        Ok(src) => {
                            let io = Io::Copy {
                                src: &src,
                                off: 0,
                                len: src.len(),
                            };
                            match self.local_access(inner, pd, l, seg.off, io) {
                                Ok(()) => CompStatus::Ok,
                                Err(s) => s,
                            }
                        }
                    };
                }
            }
        }
        let Some(o) = self.op_mut(h, seg.op) else {
            return;
        };
        o.outstanding = o.outstanding.saturating_sub(1);
        if o.status == CompStatus::Ok {
            o.status = status;
        }
        self.pump(inner, h, seg.op, now);
    }

    // ---- receive queue ----

    /// The next receive WQE, if one is posted; `Err` for a malformed queue.
    fn take_rq(&mut self, inner: &Inner, h: u32) -> Option<Result<RecvWqe, String>> {
        let qp = self.objs.qps.get_mut(h)?;
        if qp.rq_depth == 0 {
            return None;
        }
        let ring = qp.rq_ring_size / RX_DESC_SIZE as u32;
        let pc = Self::doorbell(inner, qp.db_offsets[1]) as u16;
        let avail = pc.wrapping_sub(qp.dp.rq_cc);
        if avail == 0 {
            return None;
        }
        if u32::from(avail) > ring {
            return Some(Err(format!(
                "RQ doorbell {pc} is {avail} descriptors ahead of a {ring}-entry ring"
            )));
        }
        let max = usize::from(inner.cfg.limits.max_rq_sges).max(1);
        let mut sges = std::mem::take(&mut qp.dp.rq_room);
        sges.clear();
        let mut req_id = 0;
        let mut cc = qp.dp.rq_cc;
        loop {
            if sges.len() == max || cc.wrapping_sub(qp.dp.rq_cc) == avail {
                return Some(Err(format!(
                    "receive WQE at {} has no LAST descriptor within {max}",
                    qp.dp.rq_cc
                )));
            }
            let at = qp.rq_base + u64::from(u32::from(cc) % ring) * RX_DESC_SIZE as u64;
            let mut b = [0u8; RX_DESC_SIZE];
            if inner.mem.read(at, &mut b).is_err() {
                return Some(Err(format!("receive ring at {at:#x} unreadable")));
            }
            let d = RxDesc::decode_padded(&b);
            let first = RxDesc::FIRST.is_set(d.lkey_ctrl);
            if sges.is_empty() != first {
                return Some(Err(format!("receive descriptor {cc}: FIRST out of place")));
            }
            if first {
                req_id = d.req_id;
            }
            sges.push(Sge {
                addr: d.buf_addr(),
                len: d.length.into(),
                lkey: RxDesc::LKEY.get(d.lkey_ctrl),
            });
            cc = cc.wrapping_add(1);
            if RxDesc::LAST.is_set(d.lkey_ctrl) {
                break;
            }
        }
        qp.dp.rq_cc = cc;
        Some(Ok(RecvWqe { req_id, sges }))
    }

    /// Gives the buffer list of `w`, done with, back to QP `h` for its
    /// next receive.
    fn recycle(&mut self, h: u32, w: RecvWqe) {
        if let Some(qp) = self.objs.qps.get_mut(h) {
            qp.dp.rq_room = w.sges;
        }
    }

    /// In the error state: completes every posted receive with FLUSHED.
    fn flush_rq(&mut self, inner: &Inner, h: u32) -> bool {
        let mut any = false;
        loop {
            match self.take_rq(inner, h) {
                Some(Ok(w)) => {
                    any = true;
                    self.complete_rx(
                        inner,
                        h,
                        &RxComp {
                            req_id: w.req_id,
                            status: CompStatus::Flushed,
                            op: SendOpType::Send,
                            len: 0,
                            imm: None,
                            src_qpn: 0,
                            src_gid: [0; 16],
                            unsolicited: false,
                        },
                    );
                    self.recycle(h, w);
                }
                Some(Err(_)) => {
                    // Nothing sensible to flush: forget the rest.
                    if let Some(qp) = self.objs.qps.get_mut(h) {
                        let pc = Self::doorbell(inner, qp.db_offsets[1]) as u16;
                        qp.dp.rq_cc = pc;
                    }
                    return true;
                }
                None => return any,
            }
        }
    }

    /// Writes `data` into the receive buffers of `wqe`, from byte `skip`.
    fn scatter(
        &mut self,
        inner: &Inner,
        h: u32,
        wqe: &RecvWqe,
        skip: u64,
        data: &Source<'_>,
    ) -> Result<(), CompStatus> {
        let pd = self.objs.qps.get(h).map(|q| q.pd).unwrap_or(u32::MAX);
        let mut pos = 0u64; // offset in the buffer chain
        let mut done = 0usize; // bytes of data written
        for s in &wqe.sges {
            let start = skip.max(pos);
            let end = pos + u64::from(s.len);
            if done < data.len() && start < end {
                let n = ((end - start) as usize).min(data.len() - done);
                let chunk = Io::Copy {
                    src: data,
                    off: done,
                    len: n,
                };
                self.local_access(inner, pd, *s, start - pos, chunk)?;
                done += n;
            }
            pos = end;
        }
        Ok(())
    }

    // ---- memory regions ----

    /// Checks that `len` bytes at `sge.addr` are inside the MR of
    /// `sge.lkey` in `pd`, with local write if `write`.
    fn check_local(&self, pd: u32, sge: Sge, write: bool) -> Result<(), CompStatus> {
        self.mr_range(pd, sge.lkey, sge.addr, sge.len.into(), write, false)
            .map(|_| ())
            .map_err(|_| CompStatus::LocalErrorInvalidLkey)
    }

    fn check_remote(
        &self,
        pd: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Result<(), CompStatus> {
        self.mr_range(pd, rkey, addr, len, write, true)
            .map(|_| ())
            .map_err(|_| CompStatus::RemoteErrorBadAddress)
    }

    /// Whether the MR `key` of `pd` covers `[addr, addr + len)` with the
    /// permission asked for.
    fn mr_range(
        &self,
        pd: u32,
        key: u32,
        addr: u64,
        len: u64,
        write: bool,
        remote: bool,
    ) -> Result<&super::objects::Mr, ()> {
        let mr = self.objs.mrs.get(key).ok_or(())?;
        if mr.pd != pd {
            return Err(());
        }
        let perm = match (remote, write) {
            (false, false) => 0,
            (false, true) => RegMrCmd::LOCAL_WRITE_ENABLE.mask(),
            (true, false) => RegMrCmd::REMOTE_READ_ENABLE.mask(),
            (true, true) => RegMrCmd::REMOTE_WRITE_ENABLE.mask(),
        };
        if mr.permissions & perm != perm {
            return Err(());
        }
        // Inclusive bounds: REG_MR checked that the region ends inside the
        // address space, possibly at its very last byte, and so may an
        // access; neither end is computed past it.
        let inside = addr >= mr.iova
            && match len.checked_sub(1) {
                None => addr - mr.iova <= mr.length,
                Some(n) => addr
                    .checked_add(n)
                    .is_some_and(|last| last - mr.iova < mr.length),
            };
        if !inside {
            return Err(());
        }
        Ok(mr)
    }

    /// Moves `io` at byte `off` of the local buffer `sge`, through its
    /// MR.
    fn local_access(
        &mut self,
        inner: &Inner,
        pd: u32,
        sge: Sge,
        off: u64,
        io: Io<'_>,
    ) -> Result<(), CompStatus> {
        if off + io.len() as u64 > u64::from(sge.len) {
            return Err(CompStatus::LocalErrorBadLength);
        }
        let addr = sge
            .addr
            .checked_add(off)
            .ok_or(CompStatus::LocalErrorInvalidLkey)?;
        self.mr_io(inner, pd, sge.lkey, addr, io, false)
            .map_err(|dma| {
                if dma {
                    CompStatus::LocalErrorQpInternalError
                } else {
                    CompStatus::LocalErrorInvalidLkey
                }
            })
    }

    fn remote_access(
        &mut self,
        inner: &Inner,
        pd: u32,
        rkey: u32,
        addr: u64,
        io: Io<'_>,
    ) -> Result<(), CompStatus> {
        self.mr_io(inner, pd, rkey, addr, io, true)
            .map_err(|_| CompStatus::RemoteErrorBadAddress)
    }

    /// Moves `io` to or from `[addr, addr + len)` of MR `key`, page by
    /// page through its page list. `Err(false)`: the key, PD, permission
    /// or bounds are wrong (nothing touched); `Err(true)`: guest memory
    /// refused the DMA.
    fn mr_io(
        &mut self,
        inner: &Inner,
        pd: u32,
        key: u32,
        addr: u64,
        mut io: Io<'_>,
        remote: bool,
    ) -> Result<(), bool> {
        let len = io.len();
        let write = matches!(io, Io::Copy { .. });
        let mr = self
            .mr_range(pd, key, addr, len as u64, write, remote)
            .map_err(|_| false)?;
        let mem = &*inner.mem;
        // `None`: a page the MR does not have (the key is wrong); `Some`:
        // what refused the DMA.
        let r = match &mut io {
            Io::Read(buf) => mr.region.walk(addr, len, None::<String>, |gpa, at, n| {
                mem.read_uninit(gpa, &mut buf[at..at + n])
                    .map_err(|e| Some(e.to_string()))?;
                copied(n);
                Ok(())
            }),
            Io::Copy { src, off, .. } => src
                .copy_to_pages(*off, mem, &mr.region, addr, len)
                .map_err(|e| {
                    e.map(|e| match e {
                        CopyError::Dest(e) => e.to_string(),
                        CopyError::Source(e) => format!("from the sender's memory: {e}"),
                    })
                }),
        };
        match r {
            Ok(()) => Ok(()),
            Err(None) => Err(false),
            Err(Some(why)) => {
                self.counters.dma_errors += 1;
                report!(
                    inner.health(),
                    Warn,
                    Some(Class::DmaFailed),
                    "dma-data",
                    "{}: data DMA failed: {why}",
                    inner.name()
                );
                Err(true)
            }
        }
    }

    /// The piece of `len` bytes at byte `off` of the local buffer `sge`
    /// that a packet refers to, checked against its MR as a DMA from it
    /// would be ([`State::local_access`]).
    fn local_piece(&self, pd: u32, sge: Sge, off: u64, len: usize) -> Result<Piece, CompStatus> {
        if off + len as u64 > u64::from(sge.len) {
            return Err(CompStatus::LocalErrorBadLength);
        }
        let addr = sge
            .addr
            .checked_add(off)
            .ok_or(CompStatus::LocalErrorInvalidLkey)?;
        let mr = self
            .mr_range(pd, sge.lkey, addr, len as u64, false, false)
            .map_err(|()| CompStatus::LocalErrorInvalidLkey)?;
        Ok(Piece {
            region: mr.region.clone(),
            addr,
            len,
        })
    }

    /// A payload referring to `pieces` of this device's guest memory, which
    /// must be there now (else `dma`, as a DMA read of them would fail):
    /// the receiver copies from them when it delivers
    /// (`fabric::payload`).
    fn reference(
        &mut self,
        inner: &Inner,
        pieces: impl IntoIterator<Item = Piece>,
        dma: CompStatus,
    ) -> Result<Data, CompStatus> {
        let d = Data::guest(inner.mem.clone(), pieces);
        let there = self.pinned(inner, &d).map(drop);
        there.map_err(|_| dma)?;
        Ok(d)
    }

    /// `data` to copy from: a reference pinned (its regions stay
    /// registered until the source is dropped) and its memory checked, so
    /// that a receiver refuses it before it takes or writes anything. A
    /// DMA failure counts here.
    fn pinned<'d>(&mut self, inner: &Inner, data: &'d Data) -> Result<Source<'d>, Fault> {
        let src = data.source()?;
        if let Err(f) = src.check() {
            if let Fault::Dma(e) = f {
                self.counters.dma_errors += 1;
                report!(
                    inner.health(),
                    Warn,
                    Some(Class::DmaFailed),
                    "dma-data",
                    "{}: data DMA failed: {e}",
                    inner.name()
                );
            }
            return Err(f);
        }
        Ok(src)
    }

    // ---- completions and events ----

    fn complete_tx(
        &mut self,
        inner: &Inner,
        h: u32,
        req_id: u64,
        op: SendOpType,
        status: CompStatus,
    ) {
        let ok = status == CompStatus::Ok;
        let event = match op {
            SendOpType::RdmaRead if ok => QueueAttr2::READ_COMP,
            SendOpType::RdmaRead => QueueAttr2::READ_COMP_ERR,
            SendOpType::RdmaWrite if ok => QueueAttr2::WRITE_COMP,
            SendOpType::RdmaWrite => QueueAttr2::WRITE_COMP_ERR,
            _ if ok => QueueAttr2::SEND_COMP,
            _ => QueueAttr2::SEND_COMP_ERR,
        };
        self.count_event(inner, h, event.mask());
        let Some(qp) = self.objs.qps.get(h) else {
            return;
        };
        let (cqn, sub) = (qp.send_cq, qp.send_sub_cq);
        let Some(cq) = self.objs.cqs.get(cqn) else {
            return;
        };
        let mut e = TxCdesc::ZERO;
        e.common.req_id = req_id as u16;
        e.common.status = status.raw();
        e.common.flags =
            CdescCommon::Q_TYPE.prep(QueueType::Send.raw()) | CdescCommon::OP_TYPE.prep(op.raw());
        e.common.qp_num = h as u16;
        if cq.sq_comp_64 {
            e.req_id_ex = ReqIdEx::from_id(req_id);
        }
        let mut bytes = [0u8; MAX_CQE];
        bytes[..TxCdesc::SIZE].copy_from_slice(&e.to_bytes());
        let n = usize::from(cq.entry_size);
        self.write_cqe(inner, cqn, sub, &mut bytes[..n]);
    }

    fn complete_rx(&mut self, inner: &Inner, h: u32, c: &RxComp) {
        let event = if c.status == CompStatus::Ok {
            QueueAttr2::RECV_COMP
        } else {
            QueueAttr2::RECV_COMP_ERR
        };
        self.count_event(inner, h, event.mask());
        let Some(qp) = self.objs.qps.get(h) else {
            return;
        };
        let (cqn, sub, pd) = (qp.recv_cq, qp.recv_sub_cq, qp.pd);
        let Some(cq) = self.objs.cqs.get(cqn) else {
            return;
        };
        // The sender's address handle, as the receiving PD knows it.
        let ah = self
            .objs
            .ahs
            .iter()
            .find(|(_, a)| a.pd == pd && a.gid == c.src_gid)
            .map_or(RxCdesc::AH_INVALID, |(h, _)| h as u16);
        let mut e = RxCdescEx::ZERO;
        let b = &mut e.base;
        b.common.req_id = c.req_id;
        b.common.status = c.status.raw();
        b.common.flags = CdescCommon::Q_TYPE.prep(QueueType::Recv.raw())
            | CdescCommon::OP_TYPE.prep(c.op.raw())
            | CdescCommon::HAS_IMM.prep(c.imm.is_some().into())
            | CdescCommon::UNSOLICITED.prep(c.unsolicited.into());
        b.common.qp_num = h as u16;
        b.length = c.len as u16;
        b.ah = ah;
        b.src_qp_num = c.src_qpn;
        b.imm = c.imm.unwrap_or(0);
        if c.op == SendOpType::RdmaWrite {
            e.set_rdma_write(&RxCdescRdmaWrite {
                length_hi: (c.len >> 16) as u16,
            });
        } else if ah == RxCdesc::AH_INVALID && cq.set_src_addr {
            e.set_src_addr(c.src_gid);
        }
        // The union after the basic entry is bytes already: copied whole,
        // where encoding the entry writes them one call per byte (170 of
        // the 3.4 thousand instructions a small send cost the responder).
        const _: () = assert!(RxCdescEx::SIZE == RxCdesc::SIZE + 16);
        let mut bytes = [0u8; RxCdescEx::SIZE];
        bytes[..RxCdesc::SIZE].copy_from_slice(&e.base.to_bytes());
        bytes[RxCdesc::SIZE..].copy_from_slice(&e.u);
        let n = usize::from(cq.entry_size);
        self.write_cqe(inner, cqn, sub, &mut bytes[..n]);
    }

    /// Writes a completion entry (phase byte last), then raises the CQ's
    /// event if it is armed.
    fn write_cqe(&mut self, inner: &Inner, cqn: u32, sub: u16, bytes: &mut [u8]) {
        let Some(cq) = self.objs.cqs.get_mut(cqn) else {
            return;
        };
        let Some(&n) = cq.dp.produced.get(usize::from(sub)) else {
            return;
        };
        let depth = u32::from(cq.depth);
        let phase = u8::from((n / depth) % 2 == 0);
        // The phase is bit 0 of `flags`, byte 3 of every entry.
        bytes[3] |= CdescCommon::PHASE.prep(phase);
        let slot = u64::from(sub) * u64::from(depth) + u64::from(n % depth);
        let at = cq.ring + slot * u64::from(cq.entry_size);
        cq.dp.produced[usize::from(sub)] = n.wrapping_add(1);
        if inner.publish(self, at, bytes, 3).is_err() {
            log::debug!("{}: CQ {cqn} ring at {at:#x} is not writable", inner.name());
        }
        // The doorbell is read after the entry is visible (the fence keeps
        // the load behind the stores), so an arm that lands while the entry
        // is written is seen here. One that the read misses is seen by the
        // next pass, with this entry past its consumer count unless the
        // program's poll took it ([`sample_cq`]).
        fence(Ordering::SeqCst);
        let Some(cq) = self.objs.cqs.get_mut(cqn) else {
            return;
        };
        // Userspace armed before it did what led to this completion (rang
        // a doorbell, or sent the message that arrived): the doorbell shows
        // the arm now, even if the last pass looked before it.
        sample_cq(inner, cq);
        let (Some(eqn), true) = (cq.eqn, cq.dp.armed) else {
            return;
        };
        cq.dp.fire();
        self.post_eqe(inner, eqn, cqn);
    }

    fn post_eqe(&mut self, inner: &Inner, eqn: u32, cqn: u32) {
        let Some(eq) = self.objs.eqs.get_mut(eqn) else {
            return;
        };
        let depth = u32::from(eq.depth);
        let n = eq.produced;
        let mut e = Eqe {
            common: Eqe::PHASE.prep(u32::from((n / depth) % 2 == 0))
                | Eqe::EVENT_TYPE.prep(EqeEventType::Completion.raw().into()),
            ..Eqe::ZERO
        };
        e.set_comp_event(&CompEvent {
            cqn: cqn as u16,
            ..CompEvent::ZERO
        });
        let at = eq.ring + u64::from(n % depth) * EQE_SIZE as u64;
        eq.produced = n.wrapping_add(1);
        let vector = eq.armed.then_some(eq.msix_vec);
        eq.armed = false;
        eq.pending = vector.is_none();
        // The phase is bit 0 of `common`, byte 0.
        if inner.publish(self, at, &e.to_bytes(), 0).is_err() {
            log::debug!("{}: EQ {eqn} ring at {at:#x} is not writable", inner.name());
        }
        if let Some(v) = vector {
            inner.irq.signal(v);
        }
    }

    /// Arms the CQs whose doorbells say so, and raises the events of those
    /// armed behind a completion (see the module documentation). Sampling
    /// often catches more of the short-lived `ARM` values.
    #[inline(never)]
    fn sample_cqs(&mut self, inner: &Inner) {
        let mut due = Vec::new();
        for (cqn, cq) in self.objs.cqs.iter_mut() {
            if !sample_cq(inner, cq) {
                continue;
            }
            if let Some(eqn) = cq.eqn {
                cq.dp.fire();
                due.push((eqn, cqn));
            }
        }
        for (eqn, cqn) in due {
            self.post_eqe(inner, eqn, cqn);
        }
    }

    /// `EQ_DB` with the arm bit: raise the vector at once if an event came
    /// while the EQ was not armed.
    pub(super) fn arm_eq(&mut self, inner: &Inner, eqn: u32, arm: bool) {
        let Some(eq) = self.objs.eqs.get_mut(eqn) else {
            report!(
                inner.health(),
                Warn,
                Some(Class::GuestBug),
                "eq-doorbell",
                "{}: guest bug: EQ doorbell for unknown EQ {eqn}",
                inner.name()
            );
            return;
        };
        if !arm {
            return;
        }
        if eq.pending {
            eq.pending = false;
            inner.irq.signal(eq.msix_vec);
        } else {
            eq.armed = true;
        }
    }
}

/// Why `p`, `what` request `seq` (sent as `request`), does not count: it
/// came from another GID or QP than the request went to. `None` if it is
/// from the request's peer.
fn not_from_its_peer(request: &Packet, p: &Packet, what: &str, seq: u64) -> Option<String> {
    let to = (request.dst_gid, request.dst_qpn);
    (to != (p.src_gid, p.src_qpn)).then(|| {
        format!(
            "{what} request {seq:#x}, which went to {} QP {}",
            std::net::Ipv6Addr::from(to.0),
            to.1
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_spins_only_while_work_comes_within_a_spin() {
        const SPIN: Duration = Duration::from_micros(50);
        const PASS: Duration = Duration::from_micros(1);
        let mut s = Spin::new(SPIN);
        assert!(!s.spins(), "not before any work");
        s.work_after(Duration::from_micros(5));
        for _ in 0..SPIN.as_micros() {
            assert!(s.spins());
            s.spun(PASS, Duration::ZERO);
        }
        assert!(!s.spins(), "bounded");
        s.work_after(Duration::from_millis(3));
        assert!(!s.spins(), "work after a nap, milliseconds later");
        s.work_after(SPIN);
        assert!(!s.spins(), "a spin would have missed it");
        s.work_after(SPIN - Duration::from_nanos(1));
        assert!(s.spins());
        s.work_after(Duration::from_millis(3));
        assert!(s.spins(), "the spin found it, however long it took");
        s.spun(SPIN, Duration::ZERO);
        assert!(!s.spins());
        assert!(!s.spins(), "once it napped, not before work");
    }

    #[test]
    fn a_spin_is_bounded_by_the_time_it_runs_not_by_the_wall_clock() {
        const SPIN: Duration = Duration::from_micros(50);
        let mut s = Spin::new(SPIN);
        s.work_after(Duration::ZERO);
        // Yields that gave the CPU to other threads for a scheduler slice
        // each: twenty of them, 60 ms on the wall clock, count 2.2 us each.
        for _ in 0..20 {
            assert!(s.spins());
            s.spun(Duration::from_nanos(200), Duration::from_millis(3));
        }
        // Yields that return at once count in full.
        s.work_after(Duration::ZERO);
        let mut passes = 0;
        while s.spins() {
            s.spun(Duration::from_nanos(200), Duration::from_nanos(600));
            passes += 1;
        }
        assert_eq!(passes, 63);
    }

    #[test]
    fn the_thread_never_spins_unless_configured_to() {
        let mut s = Spin::new(Duration::ZERO);
        s.work_after(Duration::ZERO);
        assert!(!s.spins());
    }

    #[test]
    fn an_answer_is_found_where_a_search_of_them_all_finds_it() {
        let mut a = Answers::default();
        let answer = Answer {
            status: 0,
            attempt: 0,
        };
        assert_eq!(a.find(5), Err(0));
        for r in [10, 12, 13, 20] {
            a.insert(r, answer);
        }
        for r in 0..25 {
            assert_eq!(
                a.find(r),
                a.0.binary_search_by_key(&r, |&(q, _)| q),
                "request {r}"
            );
        }
    }

    #[test]
    fn answers_remembered_are_bounded_per_sender_and_per_qp() {
        let mut d = QpData::new(0);
        let count = |d: &QpData| d.seen.values().map(Answers::len).sum::<usize>();
        for request in 0..SEEN_KEEP as u64 + 100 {
            d.remember(([1; 16], 1), request << ATTEMPT_BITS, 0);
        }
        assert_eq!(count(&d), SEEN_KEEP, "the last of one sender");
        assert!(d.seen[&([1; 16], 1)].get(SEEN_KEEP as u64 + 99).is_some());
        // Attempts of one request take one place.
        let order = d.seen_order.len();
        for attempt in 0..=ATTEMPT_MASK {
            d.remember(
                ([1; 16], 1),
                (SEEN_KEEP as u64 + 99) << ATTEMPT_BITS | attempt,
                0,
            );
        }
        assert_eq!((count(&d), d.seen_order.len()), (SEEN_KEEP, order));
        // Senders without end: the oldest answers go.
        for i in 0..3 * SEEN_TOTAL as u64 {
            let gid = [
                (i >> 8) as u8,
                i as u8,
                2,
                2,
                2,
                2,
                2,
                2,
                2,
                2,
                2,
                2,
                2,
                2,
                2,
                2,
            ];
            d.remember((gid, (i >> 16) as u16), i << ATTEMPT_BITS, 0);
        }
        assert!(count(&d) <= SEEN_TOTAL, "{}", count(&d));
        assert!(d.seen.len() <= SEEN_TOTAL);
        assert!(d.seen_order.len() <= SEEN_TOTAL);
        assert!(
            !d.seen.contains_key(&([1; 16], 1)),
            "the first sender's are gone"
        );
    }

    #[test]
    fn answers_are_a_map_by_request_whatever_order_they_come_in() {
        use std::collections::BTreeMap;
        let mut a = Answers::default();
        let mut model = BTreeMap::new();
        let pair = |x: Answer| (x.status, x.attempt);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..5000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly in order; some a little late, some anywhere before,
            // some again (a later attempt).
            let request = match x % 8 {
                0 => i.saturating_sub(x >> 60),
                1 => (x >> 32) % (i + 1),
                _ => i,
            };
            let answer = Answer {
                status: (x >> 8) as u8,
                attempt: (x >> 16) as u8,
            };
            let new = model.insert(request, answer).is_none();
            assert_eq!(a.insert(request, answer), new, "request {request}");
            if x % 5 == 0 {
                a.pop_first();
                model.pop_first();
            }
            if x % 7 == 0 {
                let r = (x >> 24) % (i + 1);
                a.remove(r);
                model.remove(&r);
            }
            assert_eq!(a.len(), model.len());
        }
        for r in 0..5001 {
            assert_eq!(a.get(r).map(pair), model.get(&r).copied().map(pair), "{r}");
        }
    }

    #[test]
    fn a_copy_of_a_served_attempt_is_a_duplicate_and_a_later_attempt_is_not() {
        let mut d = QpData::new(0);
        let peer = ([7; 16], 3);
        let read = d.new_seq();
        assert!(!d.served(peer, read));
        d.remember(peer, read, CompStatus::Ok.raw());
        assert!(d.served(peer, read), "a copy");
        let again = d.retry_seq(read);
        assert!(!d.served(peer, again), "asked for again");
        d.remember(peer, again, CompStatus::Ok.raw());
        assert!(d.served(peer, again) && d.served(peer, read));
        assert!(!d.served(([8; 16], 3), read), "another sender's");
    }

    #[test]
    fn probes_back_off_to_the_largest_timeout() {
        let rto = Duration::from_millis(5);
        let waits: Vec<u64> = (0..6).map(|n| backoff(rto, n).as_millis() as u64).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 100]);
        assert_eq!(backoff(rto, 40), RTO_MAX);
        // A timeout above the cap is not cut.
        assert_eq!(backoff(RTO_MAX * 2, 3), RTO_MAX * 2);
    }

    #[test]
    fn a_refused_attempt_stays_refused_and_a_later_one_is_decided_afresh() {
        let rnr = CompStatus::RemoteErrorRnr.raw();
        let ok = CompStatus::Ok.raw();
        let mut d = QpData::new(0x1234_5678_9abc_def0);
        let peer = ([7; 16], 3);
        let first = d.new_seq();
        assert_eq!(
            first & ATTEMPT_MASK,
            0,
            "a request starts at its first attempt"
        );
        assert_eq!(d.answered(peer, first), None);
        d.remember(peer, first, rnr);
        // A late copy of the refused attempt is refused again.
        assert_eq!(d.answered(peer, first), Some(rnr));
        // The next attempt is decided afresh, then its answer holds for
        // every copy of every attempt.
        let second = d.retry_seq(first);
        assert_eq!(second, first + 1);
        assert_eq!(d.answered(peer, second), None);
        d.remember(peer, second, ok);
        assert_eq!(d.answered(peer, first), Some(ok));
        assert_eq!(d.answered(peer, second), Some(ok));
        // Another request of the same sender is its own.
        let other = d.new_seq();
        assert_eq!(other >> ATTEMPT_BITS, (first >> ATTEMPT_BITS) + 1);
        assert_eq!(d.answered(peer, other), None);
        // Past the last attempt, a new request.
        let last = (other & !ATTEMPT_MASK) | ATTEMPT_MASK;
        assert_eq!(
            d.retry_seq(last) >> ATTEMPT_BITS,
            (other >> ATTEMPT_BITS) + 1
        );
    }
}
