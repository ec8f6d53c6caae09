//! Reading REG_MR page lists by DMA (formats in `efa_hw::admin::pbl`).

use efa_hw::admin::{pbl, AqCommonDesc, CtrlBuffInfo, RegMrCmd};
use efa_hw::wire::Wire;

use super::{Inner, State};

/// Why a page list could not be read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PblError {
    /// The list is not well formed.
    Malformed(String),
    /// A DMA read failed.
    Dma(String),
}

fn malformed<T>(s: impl Into<String>) -> Result<T, PblError> {
    Err(PblError::Malformed(s.into()))
}

fn read(inner: &Inner, st: &mut State, addr: u64, len: usize) -> Result<Vec<u8>, PblError> {
    inner
        .dma_read(st, addr, len)
        .map_err(|e| PblError::Dma(e.to_string()))
}

fn u64s(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
}

/// The `page_num` page addresses of `cmd`, in whichever form the header
/// `flags` say.
pub(super) fn page_list(
    inner: &Inner,
    st: &mut State,
    flags: u8,
    cmd: &RegMrCmd,
    page_num: usize,
) -> Result<Vec<u64>, PblError> {
    let ctrl = AqCommonDesc::CTRL_DATA.is_set(flags);
    let indirect = AqCommonDesc::CTRL_DATA_INDIRECT.is_set(flags);
    match (ctrl, indirect) {
        (false, true) => malformed("indirect page list without control data"),
        (false, false) => {
            if page_num > pbl::INLINE_PAGES {
                return malformed(format!("{page_num} pages do not fit inline"));
            }
            Ok(cmd.inline_pbl_array()[..page_num].to_vec())
        }
        (true, false) => {
            let buf = cmd.ctrl_buff();
            if buf.length as usize != page_num * pbl::PTR_SIZE {
                return malformed(format!(
                    "page list of {} bytes for {page_num} pages",
                    buf.length
                ));
            }
            let bytes = read(inner, st, buf.address.get(), buf.length as usize)?;
            Ok(u64s(&bytes).collect())
        }
        (true, true) => indirect_list(inner, st, cmd.ctrl_buff(), page_num),
    }
}

/// A chain of chunks listing the 4 KiB pages that hold the page list.
fn indirect_list(
    inner: &Inner,
    st: &mut State,
    first: CtrlBuffInfo,
    page_num: usize,
) -> Result<Vec<u64>, PblError> {
    let list_bytes = page_num * pbl::PTR_SIZE;
    let list_pages = list_bytes.div_ceil(pbl::PAYLOAD_PAGE_SIZE);
    let mut list_page_addrs = Vec::with_capacity(list_pages);
    let mut chunk = first;
    // Every chunk adds at least one address (checked below), so the chain
    // ends within `list_pages` chunks even if it links back on itself.
    while list_page_addrs.len() < list_pages {
        let Some(ptrs) = pbl::chunk_ptrs(chunk.length).filter(|&n| n > 0) else {
            return malformed(format!("chunk length {}", chunk.length));
        };
        let bytes = read(inner, st, chunk.address.get(), chunk.length as usize)?;
        let want = list_pages - list_page_addrs.len();
        list_page_addrs.extend(u64s(&bytes[..ptrs * pbl::PTR_SIZE]).take(want));
        if list_page_addrs.len() == list_pages {
            break;
        }
        if ptrs != pbl::PTRS_PER_CHUNK {
            return malformed(format!(
                "chunk of {ptrs} addresses is not full but the list needs more"
            ));
        }
        chunk = CtrlBuffInfo::decode_padded(&bytes[pbl::link_offset(chunk.length)..]);
        if chunk.length == 0 {
            return malformed("the chunk chain ends early");
        }
    }
    let mut pages = Vec::with_capacity(page_num);
    for (i, &at) in list_page_addrs.iter().enumerate() {
        if at % pbl::PAYLOAD_PAGE_SIZE as u64 != 0 {
            return malformed(format!(
                "page-list page {i} at {at:#x} is not 4 KiB aligned"
            ));
        }
        let len = (list_bytes - i * pbl::PAYLOAD_PAGE_SIZE).min(pbl::PAYLOAD_PAGE_SIZE);
        let bytes = read(inner, st, at, len)?;
        pages.extend(u64s(&bytes));
    }
    Ok(pages)
}
