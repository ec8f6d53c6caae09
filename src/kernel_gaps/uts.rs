// SPDX-License-Identifier: GPL-2.0

//! The running kernel's release and version (`uname -r`, `uname -v`) and
//! its `LINUX_VERSION_CODE`, which the 7.3 kernel crate does not offer.
//!
//! C headers: [`include/linux/utsname.h`](srctree/include/linux/utsname.h),
//! [`include/generated/uapi/linux/version.h`](srctree/include/generated/uapi/linux/version.h)

use kernel::prelude::*;

extern "C" {
    /// `init_utsname()->release` (`src/helpers.c`).
    fn refa_init_utsname_release() -> *const kernel::ffi::c_char;
    /// `init_utsname()->version` (`src/helpers.c`).
    fn refa_init_utsname_version() -> *const kernel::ffi::c_char;
    /// `LINUX_VERSION_CODE`, a macro (`src/helpers.c`).
    fn refa_linux_version_code() -> u32;
}

/// The release and version strings of the running kernel, and its
/// `LINUX_VERSION_CODE`.
pub(crate) fn kernel_version() -> (&'static CStr, &'static CStr, u32) {
    // SAFETY: The helpers return the `release` and `version` arrays of the
    // initial UTS namespace: NUL-terminated, in static storage, set at boot
    // and never written afterwards (only the host and domain names change).
    let strings = unsafe {
        (
            CStr::from_char_ptr(refa_init_utsname_release()),
            CStr::from_char_ptr(refa_init_utsname_version()),
        )
    };
    // SAFETY: The helper returns a constant.
    let code = unsafe { refa_linux_version_code() };
    (strings.0, strings.1, code)
}
