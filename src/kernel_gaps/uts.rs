// SPDX-License-Identifier: GPL-2.0

//! The running kernel's release and version (`uname -r`, `uname -v`) and
//! its `LINUX_VERSION_CODE`, which the 7.3 kernel crate does not offer.
//!
//! C headers: [`include/linux/utsname.h`](srctree/include/linux/utsname.h),
//! [`include/generated/uapi/linux/version.h`](srctree/include/generated/uapi/linux/version.h)

use kernel::prelude::*;

/// The release and version strings of the running kernel, and its
/// `LINUX_VERSION_CODE`.
pub(crate) fn kernel_version() -> (&'static CStr, &'static CStr, u32) {
    // SAFETY: Returns the names of the initial UTS namespace, which is
    // static.
    let name = unsafe { super::bindings::init_utsname() };
    // SAFETY: The `release` and `version` arrays of the initial UTS
    // namespace are NUL-terminated, in static storage, set at boot and
    // never written afterwards (only the host and domain names change).
    unsafe {
        (
            CStr::from_char_ptr((*name).release.as_ptr()),
            CStr::from_char_ptr((*name).version.as_ptr()),
            super::bindings::LINUX_VERSION_CODE,
        )
    }
}
