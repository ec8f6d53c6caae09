// SPDX-License-Identifier: GPL-2.0

//! Driver-specific request and response data of verbs (`struct ib_udata`).
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
//! - a response is truncated to what userspace has room for, and the rest of
//!   its buffer is zeroed.

use super::bindings;
use core::{
    marker::PhantomData,
    ptr::NonNull, //
};
use kernel::{
    error::to_result,
    prelude::*, //
};

/// A uAPI structure that can be copied to and from userspace as bytes.
///
/// # Safety
///
/// Every bit pattern is a valid value, and the type has no padding, so its
/// bytes can be filled from userspace and copied back out without leaking
/// kernel memory. Implement it only through [`uapi_struct!`], which proves
/// the absence of padding.
pub(crate) unsafe trait UapiStruct: Default + Sized {}

/// Declares `$t` (a bindgen-generated uAPI structure whose fields are all
/// integers or arrays of integers) a [`UapiStruct`], after checking at
/// compile time that its fields, listed in order, leave no padding.
macro_rules! uapi_struct {
    ($t:ident { $($field:ident),+ $(,)? }) => {
        const _: () = {
            let mut end = 0;
            $(
                assert!(
                    core::mem::offset_of!($crate::rdma::bindings::$t, $field) == end,
                    concat!("padding before ", stringify!($t), ".", stringify!($field)),
                );
                end += $crate::rdma::udata::field_size(
                    |s: &$crate::rdma::bindings::$t| &s.$field,
                );
            )+
            assert!(
                end == core::mem::size_of::<$crate::rdma::bindings::$t>(),
                concat!("padding at the end of ", stringify!($t)),
            );
        };
        // SAFETY: All fields are integers or integer arrays (any bit pattern
        // is valid), and the assertions above prove there is no padding.
        unsafe impl $crate::rdma::udata::UapiStruct for $crate::rdma::bindings::$t {}
    };
}
pub(crate) use uapi_struct;

/// Size of the field a projection closure selects; lets [`uapi_struct!`]
/// sum field sizes without naming their types.
pub(crate) const fn field_size<S, F>(_: fn(&S) -> &F) -> usize {
    core::mem::size_of::<F>()
}

/// The driver data of one verb call.
///
/// Kernel callers pass none; every method then behaves as for userspace
/// that sent and expects nothing.
pub(crate) struct UData<'a> {
    raw: Option<NonNull<bindings::ib_udata>>,
    _call: PhantomData<&'a mut bindings::ib_udata>,
}

impl UData<'_> {
    /// Wraps the core's `ib_udata` of a verb call.
    ///
    /// # Safety
    ///
    /// `ptr` is null or valid for the lifetime of the returned object, which
    /// must not outlive the verb call.
    pub(crate) unsafe fn from_raw(ptr: *mut bindings::ib_udata) -> Self {
        Self {
            raw: NonNull::new(ptr),
            _call: PhantomData,
        }
    }

    /// Whether the call came from userspace.
    pub(crate) fn is_user(&self) -> bool {
        self.raw.is_some()
    }

    /// Length of the request userspace sent.
    pub(crate) fn in_len(&self) -> usize {
        // SAFETY: Valid for the call (type invariant).
        self.raw.map_or(0, |p| unsafe { p.as_ref() }.inlen)
    }

    /// Room userspace left for the response.
    pub(crate) fn out_len(&self) -> usize {
        // SAFETY: Valid for the call (type invariant).
        self.raw.map_or(0, |p| unsafe { p.as_ref() }.outlen)
    }

    /// Reads the request. `min_len` is the size of the structure's first
    /// version (the end of its last field then).
    pub(crate) fn read<T: UapiStruct>(&mut self, min_len: usize) -> Result<T> {
        let mut req = T::default();
        let Some(raw) = self.raw else {
            return if min_len == 0 { Ok(req) } else { Err(EINVAL) };
        };
        // SAFETY: `raw` is valid for the call; `req` is a writable `T` of the
        // given size whose every byte pattern is valid (`UapiStruct`).
        to_result(unsafe {
            bindings::_ib_copy_validate_udata_in(
                raw.as_ptr(),
                (&raw mut req).cast(),
                core::mem::size_of::<T>(),
                min_len,
            )
        })?;
        Ok(req)
    }

    /// Refuses a `comp_mask` with bits outside `known`.
    pub(crate) fn check_comp_mask(&mut self, comp_mask: u64, known: u64) -> Result {
        match self.raw {
            Some(raw) if comp_mask & !known != 0 => {
                // SAFETY: `raw` is valid for the call. The helper logs the
                // offending bits and returns `-EOPNOTSUPP`.
                to_result(unsafe {
                    bindings::_ib_copy_validate_udata_cm_fail(raw.as_ptr(), comp_mask, known)
                })
            }
            _ => Ok(()),
        }
    }

    /// For verbs without a driver request: refuses non-zero input.
    pub(crate) fn require_no_request(&mut self) -> Result {
        match self.raw {
            // SAFETY: `raw` is valid for the call; with no destination the
            // helper only checks that the input is all zero.
            Some(raw) if self.in_len() != 0 => to_result(unsafe {
                bindings::_ib_copy_validate_udata_in(raw.as_ptr(), core::ptr::null_mut(), 0, 0)
            }),
            _ => Ok(()),
        }
    }

    /// Sends the response: as much of it as userspace has room for, and
    /// zeroes past its end.
    pub(crate) fn respond<T: UapiStruct>(&mut self, resp: &T) -> Result {
        let Some(raw) = self.raw else {
            return Ok(());
        };
        // SAFETY: `raw` is valid for the call; `resp` is readable for its
        // size and has no padding (`UapiStruct`), so no kernel memory leaks.
        to_result(unsafe {
            bindings::_ib_respond_udata(
                raw.as_ptr(),
                core::ptr::from_ref(resp).cast(),
                core::mem::size_of::<T>(),
            )
        })
    }

    /// For verbs without a driver response: zeroes what userspace passed.
    pub(crate) fn respond_empty(&mut self) -> Result {
        let Some(raw) = self.raw else {
            return Ok(());
        };
        // SAFETY: `raw` is valid for the call; a zero-length source copies
        // nothing and the helper clears the user buffer.
        to_result(unsafe { bindings::_ib_respond_udata(raw.as_ptr(), core::ptr::null(), 0) })
    }
}
