// SPDX-License-Identifier: GPL-2.0

//! REG_MR page lists, in the three forms the device reads (see
//! [`crate::hw::admin::pbl`]):
//!
//! - up to [`pbl::INLINE_PAGES`] addresses inline in the command;
//! - one contiguous DMA buffer of addresses, up to [`CONTIGUOUS_MAX_BYTES`]
//!   (so that the allocation is never a costly one);
//! - beyond that, the list split into 4 KiB pages, listed by a chain of
//!   4 KiB chunks, each ending in a link to the next: every allocation is a
//!   single page, whatever the size of the region.
//!
//! The C driver picks between the last two by whether `kvzalloc()` happened
//! to return contiguous memory; here the size decides, so that a given
//! region is always described the same way.
//!
//! A list is as long as the region a user registers: it is charged to the
//! user's memory cgroup (`GFP_KERNEL_ACCOUNT`).

use crate::hw::{
    admin::{
        pbl,
        AqCommonDesc,
        CtrlBuffInfo,
        MemAddr,
        RegMrCmd, //
    },
    wire::Wire, //
};
use kernel::{
    device::{
        Bound,
        Device, //
    },
    dma::{
        Coherent,
        CoherentBox, //
    },
    prelude::*, //
};

/// Page lists are memory a user asks for.
const GFP: kernel::alloc::Flags = kernel::alloc::flags::GFP_KERNEL_ACCOUNT;

/// Largest page list sent as one contiguous buffer: 4096 addresses,
/// 32 KiB, the largest allocation the page allocator does not call costly.
pub(crate) const CONTIGUOUS_MAX_BYTES: usize = pbl::PAYLOAD_PAGE_SIZE << 3;

/// Addresses in one page of a chained list.
const PTRS_PER_PAYLOAD_PAGE: usize = pbl::PAYLOAD_PAGE_SIZE / pbl::PTR_SIZE;

/// How a list of some number of pages is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// In the command.
    Inline,
    /// One buffer of `bytes` bytes.
    Contiguous { bytes: usize },
    /// `payload_pages` pages of addresses, listed by `chunks` chunks; all
    /// chunks but the last are full, the last is `last_chunk_len` bytes
    /// long (its addresses and the link).
    Chained {
        payload_pages: usize,
        chunks: usize,
        last_chunk_len: u32,
    },
}

impl Layout {
    /// The layout of a list of `pages` addresses; `EINVAL` for none.
    pub(crate) fn of(pages: usize) -> Result<Self> {
        if pages == 0 {
            return Err(EINVAL);
        }
        if pages <= pbl::INLINE_PAGES {
            return Ok(Self::Inline);
        }
        let bytes = pages.checked_mul(pbl::PTR_SIZE).ok_or(EINVAL)?;
        if bytes <= CONTIGUOUS_MAX_BYTES {
            return Ok(Self::Contiguous { bytes });
        }
        let payload_pages = bytes.div_ceil(pbl::PAYLOAD_PAGE_SIZE);
        let chunks = payload_pages.div_ceil(pbl::PTRS_PER_CHUNK);
        let in_last = payload_pages - (chunks - 1) * pbl::PTRS_PER_CHUNK;
        Ok(Self::Chained {
            payload_pages,
            chunks,
            last_chunk_len: (in_last * pbl::PTR_SIZE + pbl::LINK_SIZE) as u32,
        })
    }
}

/// A page list, in DMA memory where it does not fit the command. Must live
/// until the device has answered the REG_MR that uses it.
pub(crate) enum PageList {
    /// In the command.
    Inline([u64; pbl::INLINE_PAGES]),
    /// One buffer.
    Contiguous(Coherent<[u64]>),
    /// Pages of addresses and the chain of chunks listing them, first chunk
    /// first.
    Chained {
        _payload: KVec<Coherent<[u64]>>,
        chunks: KVec<Coherent<[u8]>>,
        first_len: u32,
    },
}

/// Fills `dst` from `src`, little-endian; `EIO` if `src` runs out.
fn fill(dst: &mut [u64], src: &mut impl Iterator<Item = u64>) -> Result {
    for slot in dst {
        *slot = src.next().ok_or(EIO)?.to_le();
    }
    Ok(())
}

impl PageList {
    /// Builds the list of `pages` (exactly `pages.len()` DMA addresses) for
    /// the device `dev`.
    pub(crate) fn new(
        dev: &Device<Bound>,
        mut pages: impl ExactSizeIterator<Item = u64>,
    ) -> Result<Self> {
        let count = pages.len();
        let list = match Layout::of(count)? {
            Layout::Inline => {
                let mut inline = [0u64; pbl::INLINE_PAGES];
                for (slot, addr) in inline.iter_mut().zip(&mut pages) {
                    *slot = addr;
                }
                Self::Inline(inline)
            }
            Layout::Contiguous { bytes } => {
                let mut buf = CoherentBox::<[u64]>::zeroed_slice(dev, bytes / pbl::PTR_SIZE, GFP)?;
                fill(&mut buf, &mut pages)?;
                Self::Contiguous(buf.into())
            }
            Layout::Chained {
                payload_pages,
                chunks,
                last_chunk_len,
            } => Self::chained(
                dev,
                &mut pages,
                count,
                payload_pages,
                chunks,
                last_chunk_len,
            )?,
        };
        // The iterator promised exactly `count` addresses.
        if pages.next().is_some() {
            return Err(EIO);
        }
        Ok(list)
    }

    fn chained(
        dev: &Device<Bound>,
        pages: &mut impl Iterator<Item = u64>,
        count: usize,
        payload_pages: usize,
        chunks: usize,
        last_chunk_len: u32,
    ) -> Result<Self> {
        let mut payload = KVec::with_capacity(payload_pages, GFP)?;
        let mut left = count;
        for _ in 0..payload_pages {
            let mut page = CoherentBox::<[u64]>::zeroed_slice(dev, PTRS_PER_PAYLOAD_PAGE, GFP)?;
            let here = left.min(PTRS_PER_PAYLOAD_PAGE);
            fill(&mut page[..here], pages)?;
            left -= here;
            payload.push(Coherent::from(page), GFP)?;
        }
        // From the last chunk to the first, so that each can link to the
        // next one's address.
        let mut chain = KVec::with_capacity(chunks, GFP)?;
        let mut next: Option<CtrlBuffInfo> = None;
        for index in (0..chunks).rev() {
            let first = index * pbl::PTRS_PER_CHUNK;
            let listed = &payload[first..payload_pages.min(first + pbl::PTRS_PER_CHUNK)];
            let mut chunk = CoherentBox::<[u8]>::zeroed_slice(dev, pbl::CHUNK_SIZE, GFP)?;
            for (i, page) in listed.iter().enumerate() {
                let at = i * pbl::PTR_SIZE;
                chunk[at..at + pbl::PTR_SIZE].copy_from_slice(&page.dma_address().to_le_bytes());
            }
            if let Some(link) = next {
                let at = pbl::link_offset(pbl::CHUNK_USED_SIZE as u32);
                link.encode(&mut chunk[at..at + pbl::LINK_SIZE])
                    .map_err(|_| EINVAL)?;
            }
            let length = if index + 1 == chunks {
                last_chunk_len
            } else {
                pbl::CHUNK_USED_SIZE as u32
            };
            let chunk = Coherent::from(chunk);
            next = Some(CtrlBuffInfo {
                length,
                address: MemAddr::new(chunk.dma_address()),
            });
            chain.push(chunk, GFP)?;
        }
        chain.reverse();
        Ok(Self::Chained {
            _payload: payload,
            chunks: chain,
            first_len: next.map_or(0, |n| n.length),
        })
    }

    /// Puts the list (or its address) into `cmd`; returns the header flags
    /// the command needs.
    pub(crate) fn apply(&self, cmd: &mut RegMrCmd) -> u8 {
        match self {
            Self::Inline(pages) => {
                cmd.set_inline_pbl_array(pages);
                0
            }
            Self::Contiguous(buf) => {
                cmd.set_ctrl_buff(&CtrlBuffInfo {
                    length: buf.size() as u32,
                    address: MemAddr::new(buf.dma_address()),
                });
                AqCommonDesc::CTRL_DATA.prep(1)
            }
            Self::Chained {
                chunks, first_len, ..
            } => {
                cmd.set_ctrl_buff(&CtrlBuffInfo {
                    length: *first_len,
                    address: MemAddr::new(chunks.first().map_or(0, |c| c.dma_address())),
                });
                AqCommonDesc::CTRL_DATA.prep(1) | AqCommonDesc::CTRL_DATA_INDIRECT.prep(1)
            }
        }
    }
}

#[kunit_tests(refa_pbl)]
mod tests {
    use super::*;

    #[test]
    fn small_lists_go_inline() {
        assert_eq!(Layout::of(0), Err(EINVAL));
        assert_eq!(Layout::of(1), Ok(Layout::Inline));
        assert_eq!(Layout::of(4), Ok(Layout::Inline));
    }

    #[test]
    fn up_to_32_kib_of_addresses_are_one_buffer() {
        assert_eq!(Layout::of(5), Ok(Layout::Contiguous { bytes: 40 }));
        assert_eq!(Layout::of(512), Ok(Layout::Contiguous { bytes: 4096 }));
        assert_eq!(Layout::of(4096), Ok(Layout::Contiguous { bytes: 32768 }));
    }

    #[test]
    fn larger_lists_are_chained_by_4_kib_chunks() {
        // 4097 addresses: 9 pages of them, one chunk of 9 links.
        assert_eq!(
            Layout::of(4097),
            Ok(Layout::Chained {
                payload_pages: 9,
                chunks: 1,
                last_chunk_len: 9 * 8 + 12
            })
        );
        // A full chunk lists 510 pages of 512 addresses.
        assert_eq!(
            Layout::of(510 * 512),
            Ok(Layout::Chained {
                payload_pages: 510,
                chunks: 1,
                last_chunk_len: 4092
            })
        );
        assert_eq!(
            Layout::of(510 * 512 + 1),
            Ok(Layout::Chained {
                payload_pages: 511,
                chunks: 2,
                last_chunk_len: 8 + 12
            })
        );
        // 1 TiB of 4 KiB pages.
        assert_eq!(
            Layout::of(1 << 28),
            Ok(Layout::Chained {
                payload_pages: 1 << 19,
                chunks: 1029,
                last_chunk_len: ((1 << 19) - 1028 * 510) * 8 + 12
            })
        );
        assert_eq!(Layout::of(usize::MAX), Err(EINVAL));
    }

    #[test]
    fn chunk_lengths_are_what_the_device_accepts() {
        for pages in [4097, 8192, 510 * 512, 510 * 512 + 1, 3 << 20] {
            let Ok(Layout::Chained { last_chunk_len, .. }) = Layout::of(pages) else {
                panic!("{pages} pages not chained");
            };
            assert!(pbl::chunk_ptrs(last_chunk_len).is_some_and(|n| n > 0));
        }
        assert_eq!(
            pbl::chunk_ptrs(pbl::CHUNK_USED_SIZE as u32),
            Some(pbl::PTRS_PER_CHUNK)
        );
        assert_eq!(pbl::link_offset(pbl::CHUNK_USED_SIZE as u32), 4080);
    }
}
