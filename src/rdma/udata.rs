// SPDX-License-Identifier: GPL-2.0

//! The driver data of a user call (`struct ib_udata` in a
//! `struct uverbs_attr_bundle`).
//!
//! C header: [`include/rdma/uverbs_ioctl.h`](srctree/include/rdma/uverbs_ioctl.h)
//!
//! The rules are the RDMA core's (see `ib_copy_validate_udata_in()` and
//! `ib_respond_udata()`), and so is the code that enforces them:
//!
//! - a request shorter than its first version is refused with `EINVAL`;
//! - a longer one must be zero past what this kernel knows (`EOPNOTSUPP`
//!   otherwise); a shorter one reads as zero-filled;
//! - a `comp_mask` may only carry bits the driver knows (`EOPNOTSUPP`);
//! - a verb without a driver request refuses non-zero input;
//! - except where a driver's uAPI promises otherwise
//!   ([`UData::read_lenient`]: the efa driver's `alloc_ucontext` ignores
//!   what it does not know, so that newer userspace keeps working);
//! - a response is truncated to what userspace has room for, and the rest of
//!   its buffer is zeroed.
//!
//! Requests and responses are plain data: [`FromBytes`] to read them,
//! [`AsBytes`] to send them, the kernel's own proofs that no byte pattern is
//! invalid and no byte is uninitialised.

use super::bindings;
use core::{
    marker::PhantomData,
    ptr::NonNull, //
};
use kernel::{
    error::to_result,
    prelude::*,
    transmute::{
        AsBytes,
        FromBytes, //
    },
    uaccess::{
        UserPtr,
        UserSlice, //
    }, //
};

/// The call a verb runs for: the driver data of one user call and the
/// attribute bundle it belongs to.
///
/// A `UData` exists only while the RDMA core runs a verb on behalf of a
/// user process, in that process's system call (the layer hands one to the
/// operations the core calls from `ib_uverbs_write()` and
/// `ib_uverbs_ioctl()`, never to those it also calls at close or device
/// removal). Having one is what lets a driver pin the calling process's
/// memory ([`Umem`](super::umem::Umem)): the current task is the caller,
/// with its address space.
///
/// # Invariants
///
/// `udata` is the `driver_udata` of the bundle `bundle`, of a user call on
/// the device `dev`, valid for `'a`, which ends before the call returns.
pub(crate) struct UData<'a> {
    udata: NonNull<bindings::ib_udata>,
    bundle: NonNull<bindings::uverbs_attr_bundle>,
    dev: NonNull<bindings::ib_device>,
    _call: PhantomData<&'a mut bindings::ib_udata>,
}

// series: begin ucontext
/// Whether a destroy with driver data `udata` is the core destroying what
/// is left of a file's context (its close, or the device's removal) rather
/// than a user's system call: a user's destroy may be refused, those may
/// not (the core warns and leaks what it cannot destroy there).
///
/// # Safety
///
/// `udata` is null or the `driver_udata` of the attribute bundle the core
/// passes a destroy operation, valid for the call.
pub(super) unsafe fn destroys_what_is_left(udata: *mut bindings::ib_udata) -> bool {
    if udata.is_null() {
        // No user objects without one; nothing to refuse.
        return true;
    }
    // SAFETY: Per the safety requirements, `udata` is the `driver_udata` of
    // a bundle valid for the call, whose header the core filled.
    let hdr = unsafe {
        &(*bindings::rdma_udata_to_uverbs_attr_bundle(udata))
            .__bindgen_anon_1
            .hdr
    };
    // `__uverbs_cleanup_ufile()` destroys with a bundle that names only the
    // file (and the object's context): no method, no core request. Every
    // bundle of a system call has one of the two: an ioctl() its method, a
    // write() its command's request, which is never empty.
    hdr.method_elm.is_null() && hdr.ucore.inlen == 0 && hdr.ucore.outlen == 0
}
// series: end ucontext

impl UData<'_> {
    // series: begin device
    /// Wraps the driver data of a user call.
    ///
    /// # Safety
    ///
    /// `udata` is null, or the `driver_udata` of the attribute bundle of a
    /// call the core makes on behalf of a user process on `dev`, from that
    /// process's system call; both stay valid for the lifetime of the
    /// returned object, which must not outlive the call.
    pub(super) unsafe fn from_raw(
        dev: *mut bindings::ib_device,
        udata: *mut bindings::ib_udata,
    ) -> Option<Self> {
        let udata = NonNull::new(udata)?;
        // SAFETY: Per the safety requirements, `udata` is the driver udata of
        // a bundle; the helper only computes the address of the bundle.
        let bundle = unsafe { bindings::rdma_udata_to_uverbs_attr_bundle(udata.as_ptr()) };
        // INVARIANT: Per the safety requirements.
        Some(Self {
            udata,
            bundle: NonNull::new(bundle)?,
            dev: NonNull::new(dev)?,
            _call: PhantomData,
        })
    }
    // series: end device

    // series: begin cq
    /// Wraps the driver data of the user call with attribute bundle `bundle`.
    ///
    /// # Safety
    ///
    /// As for [`UData::from_raw`], for the bundle of a call on `dev`.
    pub(super) unsafe fn from_bundle(
        dev: *mut bindings::ib_device,
        bundle: *mut bindings::uverbs_attr_bundle,
    ) -> Option<Self> {
        // SAFETY: `bundle` is valid; only the address of its `driver_udata`
        // (in the header every bundle has) is computed.
        let udata = unsafe { &raw mut (*bundle).__bindgen_anon_1.hdr.driver_udata };
        // SAFETY: Per the safety requirements.
        unsafe { Self::from_raw(dev, udata) }
    }
    // series: end cq

    /// The device of the call.
    pub(super) fn device_raw(&self) -> *mut bindings::ib_device {
        self.dev.as_ptr()
    }

    /// The attribute bundle of the call.
    pub(super) fn bundle_raw(&self) -> *mut bindings::uverbs_attr_bundle {
        self.bundle.as_ptr()
    }

    // series: begin cq
    /// The user context the call came through, if the core has one for it
    /// (every call that creates or looks up an object).
    pub(super) fn ucontext_raw(&self) -> *mut bindings::ib_ucontext {
        // SAFETY: The bundle is valid for the call (type invariant), and the
        // core filled its header before calling the driver.
        unsafe { (*self.bundle.as_ptr()).__bindgen_anon_1.hdr.context }
    }
    // series: end cq

    /// Length of the request userspace sent.
    pub(crate) fn in_len(&self) -> usize {
        // SAFETY: Valid for the call (type invariant).
        unsafe { self.udata.as_ref() }.inlen
    }

    /// Reads the request. `min_len` is the size of the structure's first
    /// version (the end of its last field then).
    pub(crate) fn read<T: FromBytes + Default>(&mut self, min_len: usize) -> Result<T> {
        let mut req = T::default();
        // SAFETY: `udata` is valid for the call; `req` is a writable `T` of
        // the given size, whose every byte pattern is valid (`FromBytes`).
        to_result(unsafe {
            bindings::_ib_copy_validate_udata_in(
                self.udata.as_ptr(),
                (&raw mut req).cast(),
                core::mem::size_of::<T>(),
                min_len,
            )
        })?;
        Ok(req)
    }

    /// Reads the request the lenient way: the first
    /// `min(size_of::<T>(), in_len)` bytes, the rest of `T` zero, and
    /// whatever userspace sent beyond `T` ignored, however long and whatever
    /// it holds (`ib_copy_from_udata()` of that length, in C).
    ///
    /// Not for ordinary verbs, which follow [`UData::read`]: this is for a
    /// driver whose uAPI promises newer userspace that unknown request
    /// fields are ignored and that the response says what the kernel
    /// understood (the efa driver's `alloc_ucontext`). Such a driver must
    /// check what it does read, since a reserved field may hold anything.
    pub(crate) fn read_lenient<T: FromBytes + AsBytes + Default>(&mut self) -> Result<T> {
        let mut req = T::default();
        let len = self.in_len().min(core::mem::size_of::<T>());
        // SAFETY: Valid for the call (type invariant).
        let inbuf = unsafe { self.udata.as_ref() }.inbuf;
        // `inbuf` is a user address, checked by the copy below; `in_len()`
        // bytes of input lie there.
        let mut reader = UserSlice::new(UserPtr::from_ptr(inbuf.cast_mut()), len).reader();
        reader.read_slice(&mut req.as_bytes_mut()[..len])?;
        Ok(req)
    }

    /// Refuses a `comp_mask` with bits outside `known`.
    pub(crate) fn check_comp_mask(&mut self, comp_mask: u64, known: u64) -> Result {
        if comp_mask & !known == 0 {
            return Ok(());
        }
        // SAFETY: `udata` is valid for the call. The helper logs the
        // offending bits and returns `-EOPNOTSUPP`.
        to_result(unsafe {
            bindings::_ib_copy_validate_udata_cm_fail(self.udata.as_ptr(), comp_mask, known)
        })
    }

    /// For verbs without a driver request: refuses non-zero input.
    pub(crate) fn require_no_request(&mut self) -> Result {
        if self.in_len() == 0 {
            return Ok(());
        }
        // SAFETY: `udata` is valid for the call; with no destination the
        // helper only checks that the input is all zero.
        to_result(unsafe {
            bindings::_ib_copy_validate_udata_in(self.udata.as_ptr(), core::ptr::null_mut(), 0, 0)
        })
    }

    /// Sends the response: as much of it as userspace has room for, and
    /// zeroes past its end.
    pub(crate) fn respond<T: AsBytes>(&mut self, resp: &T) -> Result {
        let bytes = resp.as_bytes();
        // SAFETY: `udata` is valid for the call; `bytes` is readable for its
        // length and fully initialised (`AsBytes`), so no kernel memory leaks.
        to_result(unsafe {
            bindings::_ib_respond_udata(self.udata.as_ptr(), bytes.as_ptr().cast(), bytes.len())
        })
    }

    /// Copies `value` to the output attribute `id` of the call (a
    /// driver-defined method's response): as much of it as the attribute
    /// has room for.
    pub(crate) fn copy_to_attr<T: AsBytes>(&mut self, id: AttrId, value: &T) -> Result {
        let bytes = value.as_bytes();
        // SAFETY: The bundle is valid for the call and `id` names an
        // attribute slot of it (invariant of `AttrId`: the core's lookup
        // indexes its bitmap with it unchecked). `uverbs_copy_to()` fails for
        // an attribute the call does not have, and copies at most
        // `bytes.len()` initialised bytes (`AsBytes`) to the user address it
        // holds through `copy_to_user()`, which checks the address.
        to_result(unsafe {
            bindings::uverbs_copy_to(
                self.bundle.as_ptr(),
                id.raw().into(),
                bytes.as_ptr().cast(),
                bytes.len(),
            )
        })
    }
}

/// The id of an attribute of a uverbs method call, one the core's
/// attribute lookup can take.
///
/// # Invariants
///
/// `uapi_key_attr()` does not return `UVERBS_API_KEY_ERR` for the id:
/// fewer than `1 << (UVERBS_API_ATTR_KEY_BITS - 1)` ids in each namespace
/// (the core's, and the driver's, with `UVERBS_API_NS_FLAG`). The core's
/// lookups (`uverbs_attr_is_valid()`) index a bitmap of that size with it
/// unchecked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttrId(u16);

impl AttrId {
    /// The attribute `id` (a value of a uAPI's attribute enum); `EINVAL` if
    /// the core could not look it up.
    pub(crate) const fn new(id: u32) -> Result<Self> {
        if id > u16::MAX as u32 || !attr_id_is_valid(id as u16) {
            return Err(EINVAL);
        }
        // INVARIANT: Checked above.
        Ok(Self(id as u16))
    }

    /// The id as the core takes it.
    pub(super) const fn raw(self) -> u16 {
        self.0
    }
}

/// Whether `id` is an attribute id the core's attribute lookup can take
/// (`uapi_key_attr()` does not return `UVERBS_API_KEY_ERR` for it): fewer
/// than `1 << (UVERBS_API_ATTR_KEY_BITS - 1)` ids in each namespace.
const fn attr_id_is_valid(id: u16) -> bool {
    let id = id as u32;
    let per_namespace = 1u32 << (bindings::uapi_radix_data_UVERBS_API_ATTR_KEY_BITS - 1);
    if id & bindings::uapi_radix_data_UVERBS_API_NS_FLAG != 0 {
        (id & !bindings::uapi_radix_data_UVERBS_API_NS_FLAG) + 1 < per_namespace
    } else {
        id < per_namespace
    }
}

#[kunit_tests(refa_rdma_udata)]
mod tests {
    use super::*;

    /// Attribute ids the core's lookup would index its bitmap out of
    /// bounds with are refused before any lookup.
    #[test]
    fn attribute_ids_stay_in_the_cores_bitmap() {
        let driver = bindings::uapi_radix_data_UVERBS_API_NS_FLAG as u16;
        assert!(attr_id_is_valid(0));
        assert!(attr_id_is_valid(31));
        assert!(!attr_id_is_valid(32));
        assert!(attr_id_is_valid(driver));
        assert!(attr_id_is_valid(driver | 30));
        assert!(!attr_id_is_valid(driver | 31));
        assert!(!attr_id_is_valid(u16::MAX));
        assert!(AttrId::new(31).is_ok());
        assert!(AttrId::new(32).is_err());
        assert!(AttrId::new(u32::from(driver) | 31).is_err());
        assert!(AttrId::new(0x1_0000).is_err());
    }
}
