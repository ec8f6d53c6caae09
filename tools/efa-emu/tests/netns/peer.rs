//! One "host" of `tests/netns.rs`: an efa-emu device on the UDP fabric,
//! driven by the in-process fake driver of `tests/support`, in the network
//! namespace the test started it in. It is the test's own binary again
//! (with [`ROLE`] set to its arguments); the test speaks to it a line at a
//! time (stdin: a command; stdout: its answer, after libtest's own lines
//! and `ready`).
//!
//! ```text
//! ROLE="GID_HEX PEERS_FILE KEY_FILE CAPTURE_FILE LOSS_PPM DUP_PPM REORDER_PPM"
//! ip ARGS...                    -> ok | error WHY     (ip(8) in this namespace)
//! info                          -> info SRD_QPN UD_QPN RKEY IOVA
//! post N M                      -> ok                  (N SRD and M UD receives)
//! send GID SRD UD RKEY IOVA N M -> ok RETRANS | error WHY
//! check N                       -> ok UD_GOT | error WHY
//! attack ADDRESS                -> ok SENT             (from a raw UDP socket)
//! stats                         -> ok fabric_rejected=N accepted=N bad_mac=N ...
//! ```
//!
//! Every payload byte is a function of the message's number ([`byte`]),
//! which the immediate data carries, so the receiver compares what
//! arrived with what must have been sent.

use std::collections::HashSet;
use std::io::BufRead;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::dp::*;
use crate::support::*;
use efa_emu::device::fabric::auth::{self, FabricKey, Reject, MAX_DATAGRAM};
use efa_emu::device::fabric::capture::{Direction, Via, PSEUDO_HEADER};
use efa_emu::device::fabric::{udp, NetFaults, Packet, UdpConfig};
use efa_emu::health::{Class, Health};
use efa_hw::admin::*;
use efa_hw::io::*;

/// Bytes of an SRD message; of a UD datagram; of the RDMA write and read.
const SRD_LEN: u32 = 4000;
const UD_LEN: u32 = 1000;
const RDMA_LEN: u32 = 1 << 20;

/// Byte `i` of message `n` (RDMA: n = 1 << 20).
fn byte(n: u32, i: u32) -> u8 {
    (i.wrapping_mul(7) ^ n.wrapping_mul(131) ^ (i >> 12)) as u8
}

fn pattern(n: u32, len: u32) -> Vec<u8> {
    (0..len).map(|i| byte(n, i)).collect()
}

struct Host {
    f: Fake,
    srd: Ep,
    ud: Ep,
    /// SRD receive buffers, then UD ones, then the RDMA region.
    rx: Buf,
    ud_rx: Buf,
    rdma: Buf,
    tx: Buf,
    health: Arc<Health>,
    capture: String,
    key: FabricKey,
    /// The address handle of the peer (one per PD and GID).
    ah: Option<u16>,
}

/// The environment variable that makes the test binary a peer.
pub const ROLE: &str = "EFA_EMU_NETNS_PEER";

/// Serves the test's commands until stdin closes, then ends the process.
pub fn main(role: &str) -> ! {
    let a: Vec<String> = role.split_whitespace().map(String::from).collect();
    let [gid, peers, key, capture, loss, dup, reorder] = &a[..] else {
        panic!("{ROLE}: see tests/netns/peer.rs for its words");
    };
    let mut h = None;
    let out = |s: String| {
        println!("{s}");
    };
    // After libtest's "test NAME ... ", which ends with no newline.
    out("\nready".into());
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let w: Vec<&str> = line.split_whitespace().collect();
        let answer = match w.first().copied() {
            Some("ip") => ip(&w[1..]),
            Some("info") => {
                let host = h.get_or_insert_with(|| {
                    Host::new(gid, peers, key, capture, [loss, dup, reorder])
                });
                Ok(format!(
                    "info {} {} {} {}",
                    host.srd.qpn, host.ud.qpn, host.rdma.key, host.rdma.iova
                ))
            }
            Some(cmd) => match h.as_mut() {
                Some(host) => host.run(cmd, &w[1..]),
                None => Err("info first".into()),
            },
            None => Err("an empty line".into()),
        };
        out(match answer {
            Ok(s) if s.starts_with("info") => s,
            Ok(s) => format!("ok {s}"),
            Err(e) => format!("error {e}"),
        });
    }
    drop(h);
    std::process::exit(0)
}

fn ip(args: &[&str]) -> Result<String, String> {
    let o = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if o.status.success() {
        Ok(String::new())
    } else {
        Err(String::from_utf8_lossy(&o.stderr)
            .trim()
            .replace('\n', "; "))
    }
}

fn hex_gid(s: &str) -> [u8; 16] {
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("a GID in hex");
    }
    g
}

fn num<T: std::str::FromStr>(w: &[&str], i: usize) -> Result<T, String> {
    w.get(i)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("argument {i} missing or bad"))
}

impl Host {
    fn new(gid: &str, peers: &str, key: &str, capture: &str, faults: [&String; 3]) -> Self {
        let mut map = udp::PeerMap::new();
        udp::read_peers(&mut map, Path::new(peers)).expect("the peer map");
        let key = FabricKey::from_file(Path::new(key)).expect("the key");
        let mut c = test_config();
        c.gid = hex_gid(gid);
        c.udp = Some(UdpConfig {
            peers: Arc::new(map),
            key: Some(key.clone()),
        });
        c.capture = Some(capture.into());
        let [loss, dup, reorder] = faults.map(|s| s.parse::<u32>().expect("a probability"));
        c.net_faults = NetFaults {
            loss_ppm: loss,
            dup_ppm: dup,
            reorder_ppm: reorder,
            ..Default::default()
        };
        let health = Health::new();
        c.health = health.clone();
        c.limits.max_mr = 8;
        let mut f = Fake::up(c);
        let srd = f.ep(EpOpts {
            sq_depth: 256,
            rq_depth: 256,
            ..EpOpts::srd()
        });
        let ud = f.ep_in(
            srd.pd,
            EpOpts {
                sq_depth: 256,
                rq_depth: 256,
                ..EpOpts::ud()
            },
        );
        let rx = f.mr(srd.pd, 256 * 4096, ALL_PERMS, 0);
        let ud_rx = f.mr(srd.pd, 256 * 4096, ALL_PERMS, 0);
        let rdma = f.mr(srd.pd, 2 * u64::from(RDMA_LEN), ALL_PERMS, 0);
        // Its second half is what the peer reads.
        f.ram.put(
            rdma.gpa + u64::from(RDMA_LEN),
            &pattern(RDMA_LEN + 1, RDMA_LEN),
        );
        let tx = f.mr(srd.pd, 2 * u64::from(RDMA_LEN), ALL_PERMS, 0);
        Self {
            f,
            srd,
            ud,
            rx,
            ud_rx,
            rdma,
            tx,
            health,
            capture: capture.into(),
            key,
            ah: None,
        }
    }

    fn run(&mut self, cmd: &str, w: &[&str]) -> Result<String, String> {
        match cmd {
            "post" => {
                let (n, m): (u16, u16) = (num(w, 0)?, num(w, 1)?);
                for i in 0..n {
                    self.srd
                        .post_recv(i, &[self.rx.sge(u64::from(i) * 4096, 4096)]);
                }
                for i in 0..m {
                    self.ud
                        .post_recv(i, &[self.ud_rx.sge(u64::from(i) * 4096, 4096)]);
                }
                Ok(String::new())
            }
            "send" => self.send(
                hex_gid(w.first().ok_or("a GID")?),
                num(w, 1)?,
                num(w, 2)?,
                num(w, 3)?,
                num(w, 4)?,
                num(w, 5)?,
                num(w, 6)?,
            ),
            "check" => self.check(num(w, 0)?, num(w, 1)?),
            "attack" => self.attack(w.first().and_then(|s| s.parse().ok()).ok_or("an address")?),
            "stats" => {
                let s = self.f.dev.fabric().udp_stats().ok_or("no UDP")?;
                Ok(format!(
                    "fabric_rejected={} {}",
                    self.health.get(Class::FabricRejected),
                    s.line()
                ))
            }
            _ => Err(format!("unknown command {cmd}")),
        }
    }

    /// N SRD sends (message i carries immediate i), the RDMA write of the
    /// peer's first half and read of its second, M UD datagrams.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        gid: [u8; 16],
        srd_qpn: u16,
        ud_qpn: u16,
        rkey: u32,
        iova: u64,
        n: u32,
        m: u32,
    ) -> Result<String, String> {
        let ah = match self.ah {
            Some(ah) => ah,
            None => *self.ah.insert(self.f.ah(self.srd.pd, gid)),
        };
        let tx = self.tx.gpa;
        let patience = Duration::from_secs(60);
        // In rounds of 64, each message in a buffer of its own.
        for round in (0..n).collect::<Vec<_>>().chunks(64) {
            for &i in round {
                let off = u64::from(i % 64) * u64::from(SRD_LEN);
                self.f.ram.put(tx + off, &pattern(i, SRD_LEN));
                let w = send_wqe(
                    i as u16,
                    ah,
                    srd_qpn,
                    0x1111,
                    &[self.tx.sge(off, SRD_LEN)],
                    Some(i),
                );
                self.srd.post_send(&w);
            }
            for c in self.srd.wait_for(round.len(), patience) {
                if c.status() != CompStatus::Ok {
                    return Err(format!("an SRD send completed with {:?}", c.status()));
                }
            }
        }
        let local = |off| self.tx.sge(off, RDMA_LEN);
        self.f.ram.put(tx, &pattern(RDMA_LEN, RDMA_LEN));
        let w = rdma_wqe(
            SendOpType::RdmaWrite,
            500,
            ah,
            srd_qpn,
            0x1111,
            rkey,
            iova,
            local(0),
            None,
        );
        self.srd.post_send(&w);
        let r = rdma_wqe(
            SendOpType::RdmaRead,
            501,
            ah,
            srd_qpn,
            0x1111,
            rkey,
            iova + u64::from(RDMA_LEN),
            local(u64::from(RDMA_LEN)),
            None,
        );
        self.srd.post_send(&r);
        for c in self.srd.wait_for(2, patience) {
            if c.status() != CompStatus::Ok {
                return Err(format!("RDMA completed with {:?}", c.status()));
            }
        }
        let back = self.f.ram.get(tx + u64::from(RDMA_LEN), RDMA_LEN as usize);
        if back != pattern(RDMA_LEN + 1, RDMA_LEN) {
            return Err("the RDMA read brought other bytes".into());
        }
        for i in 0..m {
            let off = u64::from(i % 64) * u64::from(UD_LEN);
            self.f.ram.put(tx + off, &pattern(i, UD_LEN));
            let w = send_wqe(
                i as u16,
                ah,
                ud_qpn,
                0x1111,
                &[self.tx.sge(off, UD_LEN)],
                Some(i),
            );
            self.ud.post_send(&w);
            if self.ud.wait_for(1, patience)[0].status() != CompStatus::Ok {
                return Err("a UD send failed".into());
            }
        }
        let net = self.f.stats(GetStatsType::Network, None).network_stats();
        Ok(format!("{}", net.retrans_pkts))
    }

    /// Every one of N SRD messages arrived once with its bytes, the RDMA
    /// write's bytes are in place, and each UD datagram that arrived (of
    /// M) is whole and arrived once.
    fn check(&mut self, n: u32, m: u32) -> Result<String, String> {
        let mut seen = HashSet::new();
        for c in self.srd.wait_for(n as usize, Duration::from_secs(60)) {
            let (slot, i) = (u64::from(c.req_id()), c.e.base.imm);
            if c.status() != CompStatus::Ok || !seen.insert(i) || i >= n {
                return Err(format!("SRD receive {slot}: {:?}, message {i}", c.status()));
            }
            let got = self.f.ram.get(self.rx.gpa + slot * 4096, SRD_LEN as usize);
            if got != pattern(i, SRD_LEN) || u32::from(c.e.base.length) != SRD_LEN {
                return Err(format!("SRD message {i}: other bytes"));
            }
        }
        if self.f.ram.get(self.rdma.gpa, RDMA_LEN as usize) != pattern(RDMA_LEN, RDMA_LEN) {
            return Err("the RDMA write left other bytes".into());
        }
        let t = Instant::now();
        let mut ud = Vec::new();
        while t.elapsed() < Duration::from_millis(500) {
            ud.extend(self.ud.poll());
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut seen = HashSet::new();
        for c in &ud {
            let (slot, i) = (u64::from(c.req_id()), c.e.base.imm);
            if c.status() != CompStatus::Ok || !seen.insert(i) || i >= m {
                return Err(format!("UD receive {slot}: {:?}, datagram {i}", c.status()));
            }
            // After the 40-byte GRH area.
            let got = self
                .f
                .ram
                .get(self.ud_rx.gpa + slot * 4096 + 40, UD_LEN as usize);
            if got != pattern(i, UD_LEN) {
                return Err(format!("UD datagram {i}: other bytes"));
            }
        }
        Ok(format!("{}", ud.len()))
    }

    /// The attacker: what this host sent to `to` (from its capture) sent
    /// again from a raw socket, replayed (the last 5 datagrams), cut short,
    /// without its MAC, made too long, and sealed with another key.
    fn attack(&mut self, to: SocketAddr) -> Result<String, String> {
        let cap = std::fs::read(&self.capture).map_err(|e| e.to_string())?;
        let mut sent = Vec::new();
        let mut at = 24;
        while at + 16 <= cap.len() {
            let len = u32::from_le_bytes(cap[at + 8..at + 12].try_into().unwrap()) as usize;
            let r = &cap[at + 16..at + 16 + len];
            if r[0] == Direction::Out as u8 && r[1] == Via::Udp as u8 {
                sent.push(r[PSEUDO_HEADER..].to_vec());
            }
            at += 16 + len;
        }
        let last = sent.last().ok_or("nothing was sent")?.clone();
        let raw = UdpSocket::bind(SocketAddr::new(
            if to.is_ipv4() {
                std::net::Ipv4Addr::UNSPECIFIED.into()
            } else {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            },
            0,
        ))
        .map_err(|e| e.to_string())?;
        let mut n = 0;
        let mut go = |d: &[u8]| {
            raw.send_to(d, to).expect("a raw send");
            n += 1;
            std::thread::sleep(Duration::from_millis(20));
        };
        for d in &sent[sent.len().saturating_sub(5)..] {
            go(d);
        }
        go(&last[..30]);
        go(&last[..last.len() - auth::MAC_LEN]);
        let mut long = last.clone();
        long.resize(MAX_DATAGRAM + 100, 0);
        go(&long);
        let opened = auth::open(&self.key, &last).map_err(|e: Reject| e.to_string())?;
        let p = Packet::decode(opened.packet).ok_or("our own packet does not decode")?;
        let mut forged = Vec::new();
        auth::seal(&FabricKey::new([0x66; 32]), u64::MAX - 1, &p, &mut forged);
        go(&forged);
        Ok(format!("{n}"))
    }
}
