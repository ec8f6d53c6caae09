//! Packet captures: the fabric's packets in a pcap file
//! (`--capture FILE`), for Wireshark with the dissector in
//! `tools/efa-emu/wireshark/efa-emu.lua`.
//!
//! The file is classic pcap (microsecond timestamps) with link type
//! `LINKTYPE_USER0` (147): nothing is registered for our packets, and a
//! user link type is where a private protocol goes. Each record is a
//! [`PSEUDO_HEADER`]-byte header of ours (direction, transport, the UDP
//! peer's address) and then the bytes as they crossed: a fabric packet
//! (`EFAF`) between ports of one process or over a Unix socket, a UDP
//! datagram (`EFAU`, the packet inside it) over UDP. Every datagram
//! received is recorded before it is checked, so rejected ones are there
//! too, whole up to the largest datagram a port accepts.

use std::fs::File;
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;

use super::Packet;

/// `LINKTYPE_USER0`.
pub const LINKTYPE: u32 = 147;
/// Bytes of our header before each record's datagram.
pub const PSEUDO_HEADER: usize = 20;
/// The snapshot length the file declares: no record is longer.
const SNAPLEN: u32 = 256 << 10;

/// Which way a record went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Direction {
    /// Sent by a port of this process.
    Out = 0,
    /// Arrived from another process.
    In = 1,
}

/// What carried it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Via {
    /// Handed from port to port inside this process.
    Local = 0,
    /// A Unix datagram socket.
    Unix = 1,
    /// UDP.
    Udp = 2,
}

/// A pcap file being written; shared by the fabric and its transport.
#[derive(Debug)]
pub struct Capture {
    file: Mutex<File>,
}

impl Capture {
    /// Creates `path` (0600, replacing nothing: it must not exist) with the
    /// pcap file header.
    pub fn create(path: &Path) -> io::Result<Self> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&SNAPLEN.to_le_bytes());
        h.extend_from_slice(&LINKTYPE.to_le_bytes());
        file.write_all(&h)?;
        Ok(Self {
            file: Mutex::new(file),
        })
    }

    /// A packet handed between two ports of this process.
    pub fn packet(&self, p: &Packet) {
        self.record(Direction::Out, Via::Local, None, &p.encode());
    }

    /// Writes one record. A failed write is logged and otherwise ignored:
    /// a capture never stops the fabric.
    pub fn record(&self, dir: Direction, via: Via, peer: Option<SocketAddr>, bytes: &[u8]) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let len = PSEUDO_HEADER + bytes.len();
        let kept = len.min(SNAPLEN as usize);
        let mut r = Vec::with_capacity(16 + kept);
        r.extend_from_slice(&(now.as_secs() as u32).to_le_bytes());
        r.extend_from_slice(&now.subsec_micros().to_le_bytes());
        r.extend_from_slice(&(kept as u32).to_le_bytes());
        r.extend_from_slice(&(len as u32).to_le_bytes());
        r.push(dir as u8);
        r.push(via as u8);
        let (ip, port) = match peer {
            Some(a) => (
                match a.ip() {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                    IpAddr::V6(v6) => v6,
                },
                a.port(),
            ),
            None => (std::net::Ipv6Addr::UNSPECIFIED, 0),
        };
        r.extend_from_slice(&port.to_be_bytes());
        r.extend_from_slice(&ip.octets());
        r.extend_from_slice(&bytes[..kept - PSEUDO_HEADER]);
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        // One write per record: a reader of a live capture sees whole ones.
        if let Err(e) = f.write_all(&r) {
            log::warn!("fabric: capture write failed: {e}");
        }
    }
}
