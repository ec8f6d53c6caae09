//! The UDP transport: the fabric across network namespaces and hosts.
//!
//! Each port binds a UDP socket at its own GID's address in the peer map
//! ([`PeerMap`]: GID to IPv4 or IPv6 address and port, from a file or the
//! command line), and sends to the address the map gives for the
//! destination GID; a GID the map does not have is unreachable. Every
//! datagram is an envelope ([`auth`](super::auth)) around one fabric
//! packet: the sending port's sequence number and a MAC under the fabric
//! key. A receiving port drops, counts as `fabric_rejected` and logs
//! (rate-limited) a datagram that is oversized, truncated, not ours, has a
//! wrong MAC, comes from a GID the map does not have, repeats a sequence
//! number (a replay), or is authentic but malformed or for another GID;
//! none of these allocates anything (the receive buffer is the port's,
//! allocated once) before the packet is decoded, last.
//!
//! UDP has no peer credentials, so the key is the only proof of who sent
//! a datagram: binding an address other than loopback without one is
//! refused. On loopback without a key the MACs are made with a key known
//! to everybody ([`FabricKey::UNKEYED`]), so that every local user can
//! reach the port, as with rxe on loopback; a warning says so.

use std::collections::HashMap;
use std::io::{self, BufRead};
use std::net::{Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::auth::{self, FabricKey, Reject, ReplayWindow, MAX_DATAGRAM, UDP_SEGMENT};
use super::capture::{Capture, Direction, Via};
use super::{Packet, Port, Transport};
use crate::copycount::copied;
use crate::health::{Class, Health};
use crate::report;

/// The UDP port efa-emu uses when an address names none (4791 is RoCE
/// v2's; this one is unassigned).
pub const DEFAULT_PORT: u16 = 4792;

/// Where each GID's port is.
pub type PeerMap = HashMap<[u8; 16], SocketAddr>;

/// Why a peer map entry was refused.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// Not `GID ADDRESS`.
    #[error("{at}: '{entry}' is not 'GID ADDRESS' (GID in IPv6 notation, ADDRESS as 192.0.2.1:4792, [2001:db8::1]:4792 or an address alone for port {DEFAULT_PORT})")]
    Syntax {
        /// Where.
        at: String,
        /// The entry.
        entry: String,
    },
    /// A GID given twice with different addresses.
    #[error("{at}: GID {gid} is at {old} already")]
    Twice {
        /// Where.
        at: String,
        /// The GID.
        gid: Ipv6Addr,
        /// Its first address.
        old: SocketAddr,
    },
    /// The file could not be read.
    #[error("peer map {path}: {err}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        err: io::Error,
    },
}

/// An address `192.0.2.1:4792`, `[2001:db8::1]:4792`, or one without a
/// port (then [`DEFAULT_PORT`]).
pub fn parse_addr(s: &str) -> Option<SocketAddr> {
    s.parse::<SocketAddr>().ok().or_else(|| {
        s.trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, DEFAULT_PORT))
    })
}

/// Adds `GID ADDRESS` (or `GID=ADDRESS`) to `map`; `at` says where it came
/// from, for the error.
pub fn add_peer(map: &mut PeerMap, entry: &str, at: &str) -> Result<(), PeerError> {
    let syntax = || PeerError::Syntax {
        at: at.into(),
        entry: entry.into(),
    };
    let (g, a) = entry
        .split_once('=')
        .or_else(|| entry.split_once(char::is_whitespace))
        .ok_or_else(syntax)?;
    let gid: Ipv6Addr = g.trim().parse().map_err(|_| syntax())?;
    let addr = parse_addr(a.trim()).ok_or_else(syntax)?;
    match map.insert(gid.octets(), addr) {
        Some(old) if old != addr => Err(PeerError::Twice {
            at: at.into(),
            gid,
            old,
        }),
        _ => Ok(()),
    }
}

/// Reads a peer map file: a `GID ADDRESS` per line; `#` starts a comment.
pub fn read_peers(map: &mut PeerMap, path: &Path) -> Result<(), PeerError> {
    let io = |err| PeerError::Io {
        path: path.display().to_string(),
        err,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    for (n, line) in io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(io)?;
        let entry = line.split('#').next().unwrap_or("").trim();
        if !entry.is_empty() {
            add_peer(map, entry, &format!("{}:{}", path.display(), n + 1))?;
        }
    }
    Ok(())
}

/// How a fabric uses UDP.
#[derive(Debug, Clone)]
pub struct UdpConfig {
    /// Every GID's address, this process's ports' included (they bind
    /// theirs).
    pub peers: Arc<PeerMap>,
    /// The shared key; `None` is allowed on loopback only.
    pub key: Option<FabricKey>,
}

/// Datagrams a port dropped, by reason ([`Reject::ALL`]'s order).
#[derive(Debug, Default)]
pub struct UdpStats {
    rejected: [AtomicU64; 8],
    accepted: AtomicU64,
}

impl UdpStats {
    /// Datagrams dropped for `why`.
    pub fn rejected(&self, why: Reject) -> u64 {
        self.rejected[why as usize].load(Ordering::Relaxed)
    }

    /// Datagrams delivered to a port.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// `bad_mac=N replay=N ...`, every reason.
    pub fn line(&self) -> String {
        let mut s = format!("accepted={}", self.accepted());
        for r in Reject::ALL {
            s.push_str(&format!(" {}={}", r.name(), self.rejected(r)));
        }
        s
    }
}

struct Bound {
    gid: [u8; 16],
    sock: Arc<UdpSocket>,
    /// The next sequence number this port sends.
    seq: u64,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The UDP part of a fabric: a socket per local port, each with a thread
/// that receives.
pub(super) struct UdpSockets {
    cfg: UdpConfig,
    key: FabricKey,
    health: Arc<Health>,
    capture: Option<Arc<Capture>>,
    stats: Arc<UdpStats>,
    bound: Vec<Bound>,
    /// Reused for every datagram sent.
    buf: Vec<u8>,
}

impl UdpSockets {
    pub(super) fn new(
        cfg: UdpConfig,
        health: Arc<Health>,
        capture: Option<Arc<Capture>>,
    ) -> io::Result<Self> {
        let key = cfg.key.clone().unwrap_or(FabricKey::UNKEYED);
        Ok(Self {
            cfg,
            key,
            health,
            capture,
            stats: Arc::default(),
            bound: Vec::new(),
            buf: Vec::with_capacity(MAX_DATAGRAM),
        })
    }

    /// The counters of every port of this transport.
    pub(super) fn stats(&self) -> Arc<UdpStats> {
        self.stats.clone()
    }
}

/// Sequence numbers start at the wall clock in nanoseconds, so that a
/// port started again is ahead of every number it used before (unless
/// the clock went back) and its peers' replay windows take it.
fn first_seq() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

impl Transport for UdpSockets {
    fn attach(&mut self, port: &Arc<Port>) -> io::Result<()> {
        let gid = port.gid;
        let addr = *self.cfg.peers.get(&gid).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "GID {} has no address in the peer map (--udp ADDRESS, --peer or --peers)",
                    Ipv6Addr::from(gid)
                ),
            )
        })?;
        if self.cfg.key.is_none() {
            if !addr.ip().is_loopback() {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "binding {addr}, not a loopback address, needs a fabric key \
                         (--fabric-key FILE): without one anybody who can reach {addr} \
                         could send this device packets"
                    ),
                ));
            }
            log::warn!(
                "fabric: UDP on {addr} without a fabric key: every local user can send \
                 this device packets"
            );
        }
        let sock = Arc::new(UdpSocket::bind(addr)?);
        // Bursts (16 RDMA segments of 32 KiB per WQE) outrun the default
        // receive buffer of 208 KiB; past the limit an unprivileged
        // process may set, root may set more.
        super::set_socket_buffer(
            sock.as_fd(),
            8 << 20,
            &[libc::SO_RCVBUFFORCE, libc::SO_RCVBUF],
        );
        super::set_socket_buffer(
            sock.as_fd(),
            8 << 20,
            &[libc::SO_SNDBUFFORCE, libc::SO_SNDBUF],
        );
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        sock.set_write_timeout(Some(Duration::from_millis(100)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let rx = Receiver {
            sock: sock.clone(),
            port: Arc::downgrade(port),
            key: self.key.clone(),
            peers: self.cfg.peers.clone(),
            windows: HashMap::new(),
            stats: self.stats.clone(),
            health: self.health.clone(),
            capture: self.capture.clone(),
            stop: stop.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("efa-fabric-udp".into())
            .spawn(move || rx.run())?;
        self.bound.push(Bound {
            gid,
            sock,
            seq: first_seq(),
            stop,
            thread: Some(thread),
        });
        Ok(())
    }

    fn detach(&mut self, gid: &[u8; 16]) {
        self.bound.retain_mut(|b| {
            if b.gid != *gid {
                return true;
            }
            b.stop.store(true, Ordering::Relaxed);
            if let Some(h) = b.thread.take() {
                let _ = h.join();
            }
            false
        });
    }

    fn send(&mut self, p: &Packet) -> bool {
        let Some(&to) = self.cfg.peers.get(&p.dst_gid) else {
            return false;
        };
        // From the sending device's own socket: its address is the one
        // its peers know.
        let Some(b) = self.bound.iter_mut().find(|b| b.gid == p.src_gid) else {
            return false;
        };
        self.buf.clear();
        auth::seal(&self.key, b.seq, p, &mut self.buf);
        b.seq = b.seq.wrapping_add(1);
        if let Some(c) = &self.capture {
            c.record(Direction::Out, Via::Udp, Some(to), &self.buf);
        }
        // The kernel's copy into the datagram, made whatever becomes of
        // it, and counted before the receiver can complete the message
        // (a count taken then must include it).
        copied(p.payload_len());
        // A send that fails (no room in time, nobody there) is a loss, as
        // on a network.
        let _ = b.sock.send_to(&self.buf, to);
        true
    }

    fn max_segment(&self) -> usize {
        UDP_SEGMENT
    }

    fn describe(&self) -> String {
        format!(
            "udp, {} peers, {}",
            self.cfg.peers.len(),
            if self.cfg.key.is_some() {
                "keyed"
            } else {
                "no key (loopback)"
            }
        )
    }
}

impl Drop for UdpSockets {
    fn drop(&mut self) {
        log::info!("fabric: UDP datagrams received: {}", self.stats.line());
        for b in &mut self.bound {
            b.stop.store(true, Ordering::Relaxed);
            if let Some(h) = b.thread.take() {
                let _ = h.join();
            }
        }
    }
}

/// A port's receiving side: its socket and the replay windows of its
/// senders (at most one per GID of the peer map).
struct Receiver {
    sock: Arc<UdpSocket>,
    port: Weak<Port>,
    key: FabricKey,
    peers: Arc<PeerMap>,
    windows: HashMap<[u8; 16], ReplayWindow>,
    stats: Arc<UdpStats>,
    health: Arc<Health>,
    capture: Option<Arc<Capture>>,
    stop: Arc<AtomicBool>,
}

impl Receiver {
    fn run(mut self) {
        // One byte more than any datagram accepted: a longer one fills it.
        let mut buf = vec![0u8; MAX_DATAGRAM + 1];
        while !self.stop.load(Ordering::Relaxed) {
            match self.sock.recv_from(&mut buf) {
                Ok((n, from)) => {
                    let Some(port) = self.port.upgrade() else {
                        return;
                    };
                    if let Some(c) = &self.capture {
                        c.record(Direction::In, Via::Udp, Some(from), &buf[..n]);
                    }
                    match screen(
                        &self.key,
                        &self.peers,
                        &mut self.windows,
                        &buf[..n],
                        port.gid,
                    ) {
                        Ok(p) => {
                            self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                            // The kernel's copy out of the datagram.
                            copied(p.payload_len());
                            port.deliver(p);
                        }
                        Err(why) => {
                            self.stats.rejected[why as usize].fetch_add(1, Ordering::Relaxed);
                            report!(
                                self.health,
                                Warn,
                                Some(Class::FabricRejected),
                                "fabric-udp",
                                "fabric: dropped a datagram of {n} bytes from {from}: {why}"
                            );
                        }
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                // An ICMP error from an earlier send (nobody at a peer's
                // address): nothing to receive.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(e) => {
                    log::error!("fabric: UDP receive failed: {e}");
                    return;
                }
            }
        }
    }
}

/// A datagram through a receiving port's checks, in order (the port's GID
/// `gid`, its senders' replay windows `windows`): the packet is decoded,
/// its payload allocated, only once it is known to be authentic and new.
pub fn screen(
    key: &FabricKey,
    peers: &Arc<PeerMap>,
    windows: &mut HashMap<[u8; 16], ReplayWindow>,
    d: &[u8],
    gid: [u8; 16],
) -> Result<Packet, Reject> {
    let o = auth::open(key, d)?;
    if !peers.contains_key(&o.src_gid) {
        return Err(Reject::UnknownPeer);
    }
    if !windows.entry(o.src_gid).or_default().accept(o.seq) {
        return Err(Reject::Replay);
    }
    let p = Packet::decode(o.packet).ok_or(Reject::Malformed)?;
    if p.dst_gid != gid {
        return Err(Reject::OtherGid);
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::super::{Body, Fabric, NetFaults, Remote};
    use super::*;
    use std::time::Instant;

    const A: [u8; 16] = [0xa; 16];
    const B: [u8; 16] = [0xb; 16];

    /// A loopback address for a port to bind: below the kernel's
    /// ephemeral range (32768 and up), by process and call, so that tests
    /// running at once do not meet.
    pub(crate) fn free_addr(v6: bool) -> SocketAddr {
        use std::sync::atomic::AtomicU16;
        static NEXT: AtomicU16 = AtomicU16::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 10_000 + (std::process::id() % 1000) as u16 * 20 + n % 20;
        let ip: std::net::IpAddr = if v6 {
            Ipv6Addr::LOCALHOST.into()
        } else {
            std::net::Ipv4Addr::LOCALHOST.into()
        };
        SocketAddr::new(ip, port)
    }

    fn fabric(peers: &Arc<PeerMap>, key: Option<FabricKey>) -> (Arc<Fabric>, Arc<Health>) {
        let h = Health::new();
        let cfg = UdpConfig {
            peers: peers.clone(),
            key,
        };
        (Fabric::new(Remote::Udp(cfg), h.clone(), None).unwrap(), h)
    }

    fn send(seq: u64, n: usize) -> Packet {
        Packet {
            src_gid: A,
            dst_gid: B,
            src_qpn: 3,
            dst_qpn: 4,
            body: Body::Send {
                seq,
                qkey: 1,
                imm: None,
                data: (0..n)
                    .map(|i| (i as u64 ^ seq) as u8)
                    .collect::<Vec<_>>()
                    .into(),
            },
        }
    }

    fn take(port: &Port, n: usize) -> Vec<Packet> {
        let mut got = Vec::new();
        let t = Instant::now();
        while got.len() < n {
            got.extend(port.take_due(Instant::now(), usize::MAX).0);
            assert!(t.elapsed() < Duration::from_secs(5), "{} of {n}", got.len());
            port.wait(Some(Duration::from_millis(5)));
        }
        got
    }

    fn wait_for(what: &str, f: impl Fn() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(5), "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn packets_cross_udp_on_ipv4_and_ipv6() {
        for v6 in [false, true] {
            let peers: Arc<PeerMap> = Arc::new([(A, free_addr(v6)), (B, free_addr(v6))].into());
            let key = Some(FabricKey::new([7; 32]));
            let (fa, _) = fabric(&peers, key.clone());
            let (fb, hb) = fabric(&peers, key);
            let pa = Port::new(A, NetFaults::default(), Health::new());
            let pb = Port::new(B, NetFaults::default(), Health::new());
            fa.attach(&pa).unwrap();
            fb.attach(&pb).unwrap();
            assert_eq!(fa.max_segment(), UDP_SEGMENT);
            let sent: Vec<Packet> = (0..50).map(|i| send(i, i as usize * 600)).collect();
            for p in &sent {
                assert!(fa.send(p.clone()));
            }
            assert!(fa.send(send(99, UDP_SEGMENT)), "the largest segment");
            let mut got = take(&pb, 51);
            got.sort_by_key(|p| match p.body {
                Body::Send { seq, .. } => seq,
                _ => u64::MAX,
            });
            assert_eq!(got[..50], sent[..], "every byte, IPv6 {v6}");
            assert_eq!(got[50], send(99, UDP_SEGMENT));
            let mut lost = send(1, 8);
            lost.dst_gid = [0xc; 16];
            assert!(!fa.send(lost), "a GID the map does not have");
            let stats = fb.udp_stats().unwrap();
            assert_eq!(stats.accepted(), 51);
            assert_eq!(hb.get(Class::FabricRejected), 0);
        }
    }

    #[test]
    fn without_a_key_only_loopback_binds() {
        let any: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let peers = Arc::new([(A, any)].into());
        let (f, _) = fabric(&peers, None);
        let e = f
            .attach(&Port::new(A, NetFaults::default(), Health::new()))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("needs a fabric key"), "{e}");
        let (f, _) = fabric(&peers, Some(FabricKey::new([1; 32])));
        f.attach(&Port::new(A, NetFaults::default(), Health::new()))
            .expect("with a key");
        let peers = Arc::new([(B, free_addr(true))].into());
        let (f, _) = fabric(&peers, None);
        f.attach(&Port::new(B, NetFaults::default(), Health::new()))
            .expect("loopback without a key");
    }

    #[test]
    fn forged_replayed_cut_and_oversized_datagrams_are_dropped_and_counted() {
        let peers: Arc<PeerMap> = Arc::new([(A, free_addr(false)), (B, free_addr(false))].into());
        let key = FabricKey::new([9; 32]);
        let (fb, hb) = fabric(&peers, Some(key.clone()));
        let pb = Port::new(B, NetFaults::default(), Health::new());
        fb.attach(&pb).unwrap();
        let stats = fb.udp_stats().unwrap();
        let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = peers[&B];
        let sealed = |k: &FabricKey, seq: u64, p: &Packet| {
            let mut d = Vec::new();
            auth::seal(k, seq, p, &mut d);
            d
        };
        let good = sealed(&key, 1000, &send(1, 100));
        let cases: Vec<(Vec<u8>, Reject)> = vec![
            (sealed(&FabricKey::new([8; 32]), 1, &send(2, 100)), Reject::BadMac),
            (good[..good.len() - auth::MAC_LEN].to_vec(), Reject::BadMac),
            (good[..20].to_vec(), Reject::Truncated),
            (vec![0x45; MAX_DATAGRAM + 1], Reject::Oversized),
            (b"GET / HTTP/1.0\r\n\r\n........................................................................".to_vec(), Reject::Foreign),
            (
                {
                    let mut p = send(3, 10);
                    p.src_gid = [0xc; 16];
                    sealed(&key, 1, &p)
                },
                Reject::UnknownPeer,
            ),
            (
                {
                    let mut p = send(4, 10);
                    p.dst_gid = A;
                    sealed(&key, 2000, &p)
                },
                Reject::OtherGid,
            ),
        ];
        raw.send_to(&good, to).unwrap();
        wait_for(&stats.line(), || stats.accepted() == 1);
        assert_eq!(take(&pb, 1), vec![send(1, 100)]);
        raw.send_to(&good, to).unwrap();
        wait_for("the replay", || stats.rejected(Reject::Replay) == 1);
        for (i, (d, why)) in cases.iter().enumerate() {
            let before = stats.rejected(*why);
            raw.send_to(d, to).unwrap();
            wait_for(why.name(), || hb.get(Class::FabricRejected) == i as u64 + 2);
            assert_eq!(stats.rejected(*why), before + 1, "{why}: {}", stats.line());
        }
        // Authentic, new, and in the window: still delivered after all that.
        raw.send_to(&sealed(&key, 1999, &send(5, 7)), to).unwrap();
        assert_eq!(take(&pb, 1), vec![send(5, 7)]);
        assert_eq!(stats.accepted(), 2);
        assert!(
            pb.take_due(Instant::now(), usize::MAX).0.is_empty(),
            "nothing else"
        );
    }
}
