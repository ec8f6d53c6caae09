// SPDX-License-Identifier: GPL-2.0

//! The running kernel's release and version (`uname -r`, `uname -v`) and
//! its `LINUX_VERSION_CODE`, which the 7.3 kernel crate does not offer: the
//! series binds `linux/utsname.h` and `linux/version.h` (patches/rust/),
//! and the strings are those of the initial UTS namespace, as
//! `init_utsname()` gives them in C.
//!
//! C headers: [`include/linux/utsname.h`](srctree/include/linux/utsname.h),
//! [`include/generated/uapi/linux/version.h`](srctree/include/generated/uapi/linux/version.h)

use kernel::prelude::*;

/// The release and version strings of the running kernel, and its
/// `LINUX_VERSION_CODE`.
pub(crate) fn kernel_version() -> (&'static CStr, &'static CStr, u32) {
    // SAFETY: The `release` and `version` arrays of the initial UTS
    // namespace (static, exported) are NUL-terminated, set at build time
    // and never written afterwards: a UTS namespace changes only its host
    // and domain names. Those may be written meanwhile (`sethostname()`,
    // under `uts_sem`), so no reference to the whole is made.
    unsafe {
        let name = &raw const super::bindings::init_uts_ns.name;
        (
            CStr::from_char_ptr((*name).release.as_ptr()),
            CStr::from_char_ptr((*name).version.as_ptr()),
            super::bindings::LINUX_VERSION_CODE,
        )
    }
}
