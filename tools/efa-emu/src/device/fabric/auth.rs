//! The UDP fabric's envelope: a sequence number and a MAC around each
//! packet, under a key every process of the fabric shares.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "EFAU"
//!      4     1  version (ENVELOPE_VERSION, 1)
//!      5     3  reserved, 0
//!      8     8  sequence number of the sending port (little endian)
//!     16     N  the fabric packet ("EFAF", see Packet::encode)
//!   16+N    32  MAC: BLAKE3 keyed hash, under the fabric key, of bytes 0..16+N
//! ```
//!
//! [`open`] checks, in this order and before anything is allocated: the
//! size, the magic and version, the MAC; the caller then checks the
//! sender's sequence number in its [`ReplayWindow`] before the packet is
//! decoded (and its payload allocated).

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{Packet, MAX_SEGMENT};

/// The envelope's first bytes.
pub const ENVELOPE_MAGIC: [u8; 4] = *b"EFAU";
/// The envelope's version; a datagram of another version is dropped.
pub const ENVELOPE_VERSION: u8 = 1;
/// Bytes before the packet.
pub const HEADER: usize = 16;
/// Bytes of the MAC after it.
pub const MAC_LEN: usize = 32;
/// The shortest packet ([`Packet::encode`] of a read request is longer).
const MIN_PACKET: usize = 42;
/// The largest payload a packet carries over UDP: an IPv4 UDP datagram
/// holds at most 65507 bytes, so RDMA segments of [`MAX_SEGMENT`] do not
/// fit; half of one does, with room for the headers.
pub const UDP_SEGMENT: usize = MAX_SEGMENT / 2;
/// The longest datagram a port accepts: the envelope around the longest
/// packet (fixed fields of a write segment, 84 bytes, and its data).
pub const MAX_DATAGRAM: usize = HEADER + 128 + UDP_SEGMENT + MAC_LEN;
const _: () = assert!(MAX_DATAGRAM <= 65507, "fits an IPv4 UDP datagram");

/// The shared fabric key (32 bytes). Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct FabricKey([u8; 32]);

impl std::fmt::Debug for FabricKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FabricKey(..)")
    }
}

/// Why a key file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// It could not be read.
    #[error("cannot read the fabric key {path}: {err}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        err: std::io::Error,
    },
    /// Others may read or write it, or it is not ours.
    #[error(
        "the fabric key {path} (owner uid {uid}, mode {mode:o}) must be a regular file \
         of yours (or root's) that nobody else can read or write: chmod 600 {path}"
    )]
    Exposed {
        /// The file.
        path: String,
        /// Its owner.
        uid: u32,
        /// Its mode.
        mode: u32,
    },
    /// Its contents are not a key.
    #[error(
        "the fabric key {path} must hold 64 hexadecimal digits (32 bytes), as \
         'od -An -tx1 -N32 /dev/urandom | tr -d \" \\n\"' writes them"
    )]
    Format {
        /// The file.
        path: String,
    },
}

impl FabricKey {
    /// The key of a fabric given none (loopback only, see `udp`): known to
    /// everybody, so its MACs only catch corruption.
    pub const UNKEYED: Self = Self([0; 32]);

    /// A key from its 32 bytes.
    pub fn new(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Reads the key from `path`: 64 hex digits (whitespace around them
    /// allowed), in a regular file of this user or root that nobody else
    /// may read or write (checked on the opened file, so that the file
    /// checked is the file read).
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        let name = path.display().to_string();
        let io = |err| KeyError::Io {
            path: name.clone(),
            err,
        };
        let f = std::fs::File::open(path).map_err(io)?;
        let m = f.metadata().map_err(io)?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if !m.is_file() || (m.uid() != me && m.uid() != 0) || m.mode() & 0o077 != 0 {
            return Err(KeyError::Exposed {
                path: name,
                uid: m.uid(),
                mode: m.mode() & 0o7777,
            });
        }
        let mut text = Vec::with_capacity(128);
        f.take(128).read_to_end(&mut text).map_err(io)?;
        Self::parse_hex(&text).ok_or(KeyError::Format { path: name })
    }

    /// 64 hex digits, whitespace around them allowed.
    pub fn parse_hex(text: &[u8]) -> Option<Self> {
        let t = text.trim_ascii();
        if t.len() != 64 {
            return None;
        }
        let mut k = [0u8; 32];
        for (i, pair) in t.chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).ok()?;
            k[i] = u8::from_str_radix(s, 16).ok()?;
        }
        Some(Self(k))
    }

    fn mac(&self, covered: &[u8]) -> blake3::Hash {
        blake3::keyed_hash(&self.0, covered)
    }
}

/// Why a datagram was dropped before its packet was decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// Longer than [`MAX_DATAGRAM`].
    #[error("oversized")]
    Oversized,
    /// Too short for an envelope around a packet.
    #[error("truncated")]
    Truncated,
    /// Not our magic, or another version.
    #[error("not an efa-emu datagram of version {ENVELOPE_VERSION}")]
    Foreign,
    /// The MAC does not match: another key, or altered on the way.
    #[error("bad MAC")]
    BadMac,
    /// Its sender is not in the peer map.
    #[error("from a GID not in the peer map")]
    UnknownPeer,
    /// A sequence number its sender used already, or too old to tell.
    #[error("replayed")]
    Replay,
    /// Authentic, but the packet inside does not parse.
    #[error("malformed packet")]
    Malformed,
    /// Authentic, for a GID that is not the receiving port's.
    #[error("for another GID")]
    OtherGid,
}

impl Reject {
    /// Every reason, in the order of the counters.
    pub const ALL: [Reject; 8] = [
        Reject::Oversized,
        Reject::Truncated,
        Reject::Foreign,
        Reject::BadMac,
        Reject::UnknownPeer,
        Reject::Replay,
        Reject::Malformed,
        Reject::OtherGid,
    ];

    /// Its name in logs and counters.
    pub fn name(self) -> &'static str {
        match self {
            Reject::Oversized => "oversized",
            Reject::Truncated => "truncated",
            Reject::Foreign => "foreign",
            Reject::BadMac => "bad_mac",
            Reject::UnknownPeer => "unknown_peer",
            Reject::Replay => "replay",
            Reject::Malformed => "malformed",
            Reject::OtherGid => "other_gid",
        }
    }
}

/// Appends the envelope around `p` to `out`: header, packet, MAC.
pub fn seal(key: &FabricKey, seq: u64, p: &Packet, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&ENVELOPE_MAGIC);
    out.push(ENVELOPE_VERSION);
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(&seq.to_le_bytes());
    p.encode_into(out);
    let mac = key.mac(&out[start..]);
    out.extend_from_slice(mac.as_bytes());
}

/// An authentic envelope: its sequence number, and the packet's bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened<'a> {
    /// The sender's sequence number.
    pub seq: u64,
    /// The sender's GID (from the packet, which the MAC covers).
    pub src_gid: [u8; 16],
    /// The packet, not yet decoded.
    pub packet: &'a [u8],
}

/// Checks a datagram's size, envelope and MAC (in constant time), without
/// allocating.
pub fn open<'a>(key: &FabricKey, d: &'a [u8]) -> Result<Opened<'a>, Reject> {
    if d.len() > MAX_DATAGRAM {
        return Err(Reject::Oversized);
    }
    if d.len() < HEADER + MIN_PACKET + MAC_LEN {
        return Err(Reject::Truncated);
    }
    if d[..4] != ENVELOPE_MAGIC || d[4] != ENVELOPE_VERSION || d[5..8] != [0; 3] {
        return Err(Reject::Foreign);
    }
    let (covered, mac) = d.split_at(d.len() - MAC_LEN);
    let mac: [u8; MAC_LEN] = mac.try_into().map_err(|_| Reject::Truncated)?;
    // blake3::Hash's equality is constant-time.
    if key.mac(covered) != blake3::Hash::from_bytes(mac) {
        return Err(Reject::BadMac);
    }
    let seq = u64::from_le_bytes(covered[8..16].try_into().map_err(|_| Reject::Truncated)?);
    let packet = &covered[HEADER..];
    // The packet's source GID: after its magic, version and kind.
    let src_gid = packet[6..22].try_into().map_err(|_| Reject::Truncated)?;
    Ok(Opened {
        seq,
        src_gid,
        packet,
    })
}

/// The sequence numbers seen from one sender: the highest, and which of
/// the [`ReplayWindow::WIDTH`] below it (RFC 6479's sliding window, in
/// one word). Senders start at their start time in nanoseconds, so a
/// restarted sender is ahead of what it sent before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayWindow {
    top: u64,
    seen: u128,
}

impl ReplayWindow {
    /// How far behind the highest number a datagram may arrive.
    pub const WIDTH: u64 = 128;

    /// Takes `seq` if it is new (and remembers it); `false` for one seen
    /// before or too old to tell.
    pub fn accept(&mut self, seq: u64) -> bool {
        if seq > self.top || self.seen == 0 {
            let shift = seq - self.top.min(seq);
            self.seen = if shift >= Self::WIDTH {
                0
            } else {
                self.seen << shift
            };
            self.seen |= 1;
            self.top = seq;
            return true;
        }
        let back = self.top - seq;
        if back >= Self::WIDTH || self.seen & (1 << back) != 0 {
            return false;
        }
        self.seen |= 1 << back;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::Body;
    use super::*;

    fn pkt(n: usize) -> Packet {
        Packet {
            src_gid: [1; 16],
            dst_gid: [2; 16],
            src_qpn: 3,
            dst_qpn: 4,
            body: Body::Send {
                seq: 9,
                qkey: 5,
                imm: None,
                data: vec![7; n].into(),
            },
        }
    }

    #[test]
    fn sealed_datagrams_open_and_every_alteration_is_refused() {
        let key = FabricKey::new([0x5a; 32]);
        let p = pkt(100);
        let mut d = Vec::new();
        seal(&key, 77, &p, &mut d);
        let o = open(&key, &d).unwrap();
        assert_eq!((o.seq, o.src_gid), (77, [1; 16]));
        assert_eq!(Packet::decode(o.packet), Some(p.clone()));
        assert_eq!(
            open(&FabricKey::new([0x5b; 32]), &d),
            Err(Reject::BadMac),
            "another key"
        );
        for i in 0..d.len() {
            let mut bad = d.clone();
            bad[i] ^= 1;
            let want = if i < 8 {
                Reject::Foreign
            } else {
                Reject::BadMac
            };
            assert_eq!(open(&key, &bad), Err(want), "byte {i} flipped");
        }
        for n in 0..d.len() {
            assert!(open(&key, &d[..n]).is_err(), "cut at {n}");
        }
        assert_eq!(open(&key, &d[..HEADER + 10]), Err(Reject::Truncated));
        let mut huge = Vec::new();
        seal(&key, 1, &pkt(UDP_SEGMENT), &mut huge);
        assert!(open(&key, &huge).is_ok(), "the largest segment fits");
        huge.resize(MAX_DATAGRAM + 1, 0);
        assert_eq!(open(&key, &huge), Err(Reject::Oversized));
    }

    #[test]
    fn the_replay_window_takes_each_number_once() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(1000));
        assert!(!w.accept(1000));
        assert!(w.accept(1002));
        assert!(w.accept(1001), "late, within the window");
        assert!(!w.accept(1001));
        assert!(w.accept(1002 - 127));
        assert!(!w.accept(1002 - 128), "too old to tell");
        assert!(w.accept(5000));
        assert!(!w.accept(1002), "far behind now");
        assert!(w.accept(4999));
        assert!(!w.accept(5000) && !w.accept(4999));
    }

    #[test]
    fn key_files_are_hex_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("efa-key-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        let hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
        std::fs::write(&path, hex).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = FabricKey::from_file(&path).unwrap_err();
        assert!(matches!(e, KeyError::Exposed { mode: 0o644, .. }), "{e}");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let k = FabricKey::from_file(&path).unwrap();
        assert_eq!(k.0[..3], [0x00, 0x11, 0x22]);
        assert_eq!(format!("{k:?}"), "FabricKey(..)", "never printed");
        std::fs::write(&path, "0011").unwrap();
        assert!(matches!(
            FabricKey::from_file(&path),
            Err(KeyError::Format { .. })
        ));
        std::fs::write(&path, hex.replace('f', "g")).unwrap();
        assert!(FabricKey::from_file(&path).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
