//! vfio-user message framing and the checks every client message passes
//! before the protocol server sees it.
//!
//! The `vfio_user` crate trusts the sizes in a message: a short VERSION
//! underflows, a VERSION without its NUL panics, a large REGION_READ count
//! allocates that much, an unsupported command leaves its body in the stream
//! and desynchronises it, and a message longer than the crate's structure
//! does the same; it refuses a REGION_WRITE to a region it does not have
//! before reading the data, which it then takes for the next header.
//! [`screen`] turns every message into one the crate handles
//! exactly, or answers it here with an errno.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

pub(super) const HEADER: usize = 16;
/// Largest region access the server advertises (the crate's default
/// `max_data_xfer_size`).
pub(super) const MAX_XFER: usize = 1 << 20;
/// Largest message either side may send: a REGION_WRITE of `MAX_XFER` bytes,
/// or its reply to a read.
pub(super) const MAX_MESSAGE: usize = HEADER + 16 + MAX_XFER;
/// Most descriptors one message may carry (we advertise one).
const MAX_FDS: usize = 8;
const MAX_VERSION_JSON: usize = 64 << 10;
/// Regions the protocol server has: one per VFIO PCI region index, present
/// or not (`Layout::regions`).
pub(super) const REGIONS: u32 = vfio_bindings::bindings::vfio::VFIO_PCI_NUM_REGIONS;

pub(super) const VERSION: u16 = 1;
pub(super) const DMA_MAP: u16 = 2;
pub(super) const DMA_UNMAP: u16 = 3;
pub(super) const DEVICE_GET_INFO: u16 = 4;
pub(super) const DEVICE_GET_REGION_INFO: u16 = 5;
pub(super) const DEVICE_GET_IRQ_INFO: u16 = 7;
pub(super) const DEVICE_SET_IRQS: u16 = 8;
pub(super) const REGION_READ: u16 = 9;
pub(super) const REGION_WRITE: u16 = 10;
pub(super) const DEVICE_RESET: u16 = 13;

const TYPE_MASK: u32 = 0xf;
const TYPE_COMMAND: u32 = 0;
pub(super) const TYPE_REPLY: u32 = 1;
pub(super) const NO_REPLY: u32 = 1 << 4;
pub(super) const ERROR: u32 = 1 << 5;

const DMA_UNMAP_GET_DIRTY_BITMAP: u32 = 1 << 0;
const DMA_UNMAP_ALL: u32 = 1 << 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    pub id: u16,
    pub command: u16,
    pub size: u32,
    pub flags: u32,
    pub error: u32,
}

impl Header {
    fn parse(b: &[u8; HEADER]) -> Self {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Self {
            id: u16::from_le_bytes([b[0], b[1]]),
            command: u16::from_le_bytes([b[2], b[3]]),
            size: u32_at(4),
            flags: u32_at(8),
            error: u32_at(12),
        }
    }

    pub(super) fn bytes(&self) -> [u8; HEADER] {
        let mut b = [0; HEADER];
        b[0..2].copy_from_slice(&self.id.to_le_bytes());
        b[2..4].copy_from_slice(&self.command.to_le_bytes());
        b[4..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..16].copy_from_slice(&self.error.to_le_bytes());
        b
    }

    /// An error reply to this message.
    pub(super) fn error_reply(&self, errno: i32) -> Self {
        Self {
            id: self.id,
            command: self.command,
            size: HEADER as u32,
            flags: TYPE_REPLY | ERROR,
            error: errno as u32,
        }
    }
}

pub(super) struct Message {
    pub header: Header,
    pub body: Vec<u8>,
    pub fds: Vec<File>,
}

/// Why reading a message failed; all of these end the connection.
#[derive(Debug)]
pub(super) enum ReadError {
    Io(io::Error),
    /// The declared size is below a header or above `MAX_MESSAGE`.
    Size(u32),
    /// More descriptors than any message may carry (they were closed).
    TooManyFds,
}

fn retry<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// Reads one whole message with the descriptors sent along with it.
/// `Ok(None)` is an orderly end of stream before a new message.
pub(super) fn read_message(stream: &UnixStream) -> Result<Option<Message>, ReadError> {
    let mut head = [0u8; HEADER];
    let mut raw_fds = [-1 as RawFd; MAX_FDS];
    let (n, nfds) = retry(|| {
        let mut iov = [libc::iovec {
            iov_base: head.as_mut_ptr().cast(),
            iov_len: head.len(),
        }];
        // SAFETY: the iovec describes `head`, a live buffer we may fill with
        // any bytes; the descriptor slots are plain integers.
        unsafe { stream.recv_with_fds(&mut iov, &mut raw_fds) }
            .map_err(|e| io::Error::from_raw_os_error(e.errno()))
    })
    .map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOBUFS) {
            ReadError::TooManyFds
        } else {
            ReadError::Io(e)
        }
    })?;
    let fds: Vec<File> = raw_fds[..nfds]
        .iter()
        // SAFETY: recvmsg installed these descriptors in this process for us
        // alone; each is wrapped exactly once, so each is closed exactly once.
        .map(|&fd| unsafe { File::from_raw_fd(fd) })
        .collect();
    if n == 0 {
        return Ok(None);
    }
    let mut reader = stream;
    retry(|| reader.read_exact(&mut head[n..])).map_err(ReadError::Io)?;
    let header = Header::parse(&head);
    let size = header.size as usize;
    if !(HEADER..=MAX_MESSAGE).contains(&size) {
        return Err(ReadError::Size(header.size));
    }
    let mut body = vec![0; size - HEADER];
    retry(|| reader.read_exact(&mut body)).map_err(ReadError::Io)?;
    Ok(Some(Message { header, body, fds }))
}

/// Sends header and body as one message, with `fds` attached to its first
/// byte (which is where a reader of the header collects them).
pub(super) fn send_message(
    stream: &UnixStream,
    header: &Header,
    body: &[u8],
    fds: &[RawFd],
) -> io::Result<()> {
    let mut buf = Vec::with_capacity(HEADER + body.len());
    buf.extend_from_slice(&header.bytes());
    buf.extend_from_slice(body);
    let mut sent = 0;
    let mut fds = fds;
    while sent < buf.len() {
        // sendmsg with MSG_NOSIGNAL: a vanished peer is an error, not SIGPIPE.
        let n = retry(|| {
            stream
                .send_with_fds(&[&buf[sent..]], fds)
                .map_err(|e| io::Error::from_raw_os_error(e.errno()))
        })?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        sent += n;
        fds = &[];
    }
    Ok(())
}

/// What to do with a client message.
pub(super) enum Verdict {
    /// Hand it to the protocol server as it now is.
    Forward(Message),
    /// Answer with this errno (unless the client asked for no reply).
    Reject(Header, i32),
    /// A reply from the client: we never ask it anything, so drop it.
    Drop,
}

fn u32_at(body: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(body.get(at..at + 4)?.try_into().ok()?))
}

/// Checks a client message against what the crate will read from it.
pub(super) fn screen(mut msg: Message) -> Verdict {
    let h = msg.header;
    let reject = |errno| Verdict::Reject(h, errno);
    if h.flags & TYPE_MASK != TYPE_COMMAND {
        return Verdict::Drop;
    }
    let no_reply = h.flags & NO_REPLY != 0;
    // The body length the crate reads, and whether it may go unanswered.
    let (want, may_skip_reply) = match h.command {
        VERSION => {
            let json = msg.body.get(4..).unwrap_or_default();
            let well_formed = msg.body.len() > 4
                && json.len() <= MAX_VERSION_JSON
                && json.iter().position(|&b| b == 0) == Some(json.len() - 1);
            if !well_formed {
                return reject(libc::EINVAL);
            }
            (msg.body.len(), false)
        }
        DMA_MAP => (32, true),
        DMA_UNMAP => {
            let Some(flags) = u32_at(&msg.body, 4) else {
                return reject(libc::EINVAL);
            };
            if flags & DMA_UNMAP_GET_DIRTY_BITMAP != 0 {
                return reject(libc::EOPNOTSUPP);
            }
            if flags & !DMA_UNMAP_ALL != 0 {
                return reject(libc::EINVAL);
            }
            (24, true)
        }
        DEVICE_GET_INFO => (16, false),
        DEVICE_GET_REGION_INFO => (32, false),
        DEVICE_GET_IRQ_INFO => (16, false),
        DEVICE_SET_IRQS => {
            let (Some(flags), Some(count)) = (u32_at(&msg.body, 4), u32_at(&msg.body, 16)) else {
                return reject(libc::EINVAL);
            };
            use vfio_bindings::bindings::vfio::*;
            match flags & VFIO_IRQ_SET_DATA_TYPE_MASK {
                VFIO_IRQ_SET_DATA_NONE if msg.fds.is_empty() => {}
                VFIO_IRQ_SET_DATA_EVENTFD if msg.fds.len() <= count as usize => {}
                VFIO_IRQ_SET_DATA_BOOL => return reject(libc::EOPNOTSUPP),
                _ => return reject(libc::EINVAL),
            }
            (20, true)
        }
        REGION_READ => {
            match (u32_at(&msg.body, 8), u32_at(&msg.body, 12)) {
                (Some(region), Some(count)) if region < REGIONS && count as usize <= MAX_XFER => {}
                _ => return reject(libc::EINVAL),
            }
            (16, false)
        }
        REGION_WRITE => match (u32_at(&msg.body, 8), u32_at(&msg.body, 12)) {
            (Some(region), Some(count)) if region < REGIONS && count as usize <= MAX_XFER => {
                (16 + count as usize, true)
            }
            _ => return reject(libc::EINVAL),
        },
        DEVICE_RESET => (0, true),
        _ => return reject(libc::EOPNOTSUPP),
    };
    if msg.body.len() < want || (no_reply && !may_skip_reply) {
        return reject(libc::EINVAL);
    }
    let fds_allowed = match h.command {
        DMA_MAP => 1,
        DEVICE_SET_IRQS => MAX_FDS,
        _ => 0,
    };
    if msg.fds.len() > fds_allowed {
        return reject(libc::EINVAL);
    }
    if msg.body.len() > want {
        // Trailing bytes the crate would leave in the stream: a newer
        // client's optional fields. Drop them rather than desynchronise.
        log::debug!(
            "command {}: ignoring {} trailing bytes",
            h.command,
            msg.body.len() - want
        );
        msg.body.truncate(want);
        msg.header.size = (HEADER + want) as u32;
    }
    Verdict::Forward(msg)
}

/// Raw descriptors of `fds`, for sending them on.
pub(super) fn raw_fds(fds: &[File]) -> Vec<RawFd> {
    fds.iter().map(AsRawFd::as_raw_fd).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(command: u16, flags: u32, body: Vec<u8>) -> Message {
        Message {
            header: Header {
                id: 7,
                command,
                size: (HEADER + body.len()) as u32,
                flags,
                error: 0,
            },
            body,
            fds: vec![],
        }
    }

    fn errno(v: Verdict) -> Option<i32> {
        match v {
            Verdict::Reject(_, e) => Some(e),
            _ => None,
        }
    }

    #[test]
    fn version_must_carry_one_terminating_nul() {
        let ok = [&[0u8, 0, 1, 0][..], b"{}\0"].concat();
        assert!(matches!(screen(msg(VERSION, 0, ok)), Verdict::Forward(_)));
        assert_eq!(
            errno(screen(msg(VERSION, 0, vec![0, 0, 1, 0]))),
            Some(libc::EINVAL)
        );
        assert_eq!(
            errno(screen(msg(VERSION, 0, vec![0, 0]))),
            Some(libc::EINVAL)
        );
        let no_nul = [&[0u8, 0, 1, 0][..], b"{}"].concat();
        assert_eq!(errno(screen(msg(VERSION, 0, no_nul))), Some(libc::EINVAL));
        let inner_nul = [&[0u8, 0, 1, 0][..], b"{\0}\0"].concat();
        assert_eq!(
            errno(screen(msg(VERSION, 0, inner_nul))),
            Some(libc::EINVAL)
        );
        let quiet = [&[0u8, 0, 1, 0][..], b"{}\0"].concat();
        assert_eq!(
            errno(screen(msg(VERSION, NO_REPLY, quiet))),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn sizes_are_checked_and_extra_bytes_dropped() {
        assert_eq!(
            errno(screen(msg(DMA_MAP, 0, vec![0; 31]))),
            Some(libc::EINVAL)
        );
        let Verdict::Forward(m) = screen(msg(DMA_MAP, 0, vec![0; 40])) else {
            panic!("a long DMA_MAP is forwarded");
        };
        assert_eq!((m.body.len(), m.header.size), (32, 48));
        let mut write = vec![0; 16];
        write[12..16].copy_from_slice(&4u32.to_le_bytes());
        assert_eq!(
            errno(screen(msg(REGION_WRITE, 0, write.clone()))),
            Some(libc::EINVAL)
        );
        write.extend_from_slice(&[1, 2, 3, 4]);
        assert!(matches!(
            screen(msg(REGION_WRITE, NO_REPLY, write.clone())),
            Verdict::Forward(_)
        ));
        // A region the protocol server does not have: it would refuse the
        // write without reading its data.
        for region in [REGIONS, u32::MAX] {
            write[8..12].copy_from_slice(&region.to_le_bytes());
            assert_eq!(
                errno(screen(msg(REGION_WRITE, NO_REPLY, write.clone()))),
                Some(libc::EINVAL)
            );
            let mut read = write[..16].to_vec();
            read[12..16].copy_from_slice(&4u32.to_le_bytes());
            assert_eq!(errno(screen(msg(REGION_READ, 0, read))), Some(libc::EINVAL));
        }
        let mut read = vec![0; 16];
        read[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(errno(screen(msg(REGION_READ, 0, read))), Some(libc::EINVAL));
        assert_eq!(
            errno(screen(msg(REGION_READ, NO_REPLY, vec![0; 16]))),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn unsupported_requests_are_answered_here() {
        for c in [0, 6, 11, 12, 14, 15, 0xffff] {
            assert_eq!(
                errno(screen(msg(c, 0, vec![]))),
                Some(libc::EOPNOTSUPP),
                "command {c}"
            );
        }
        let mut unmap = vec![0; 24];
        unmap[4] = 1;
        assert_eq!(
            errno(screen(msg(DMA_UNMAP, 0, unmap))),
            Some(libc::EOPNOTSUPP)
        );
        let mut irqs = vec![0; 20];
        irqs[4] = 2;
        assert_eq!(
            errno(screen(msg(DEVICE_SET_IRQS, 0, irqs))),
            Some(libc::EOPNOTSUPP)
        );
        assert!(matches!(
            screen(msg(DEVICE_RESET, TYPE_REPLY, vec![])),
            Verdict::Drop
        ));
    }

    #[test]
    fn framing_round_trips_with_fds_and_refuses_bad_sizes() {
        let (a, b) = UnixStream::pair().unwrap();
        let h = Header {
            id: 3,
            command: DMA_MAP,
            size: (HEADER + 4) as u32,
            flags: 0,
            error: 0,
        };
        let f = File::open("/dev/null").unwrap();
        send_message(&a, &h, &[1, 2, 3, 4], &[f.as_raw_fd()]).unwrap();
        let m = read_message(&b).unwrap().unwrap();
        assert_eq!((m.header, m.body, m.fds.len()), (h, vec![1, 2, 3, 4], 1));

        let bad = Header { size: 8, ..h };
        send_message(&a, &bad, &[], &[]).unwrap();
        assert!(matches!(read_message(&b), Err(ReadError::Size(8))));
        drop(a);
        assert!(read_message(&b).unwrap().is_none());
    }
}
