// SPDX-License-Identifier: GPL-2.0

//! The Rust half of the kCFI fixture (see `cfi_caller.c`): two callees the
//! C half calls through function pointers.

/// Called through a pointer of its own type: the call goes through.
#[no_mangle]
pub extern "C" fn refa_cfi_fixture_matched(x: u32) -> u32 {
    x + 1
}

/// Called through a pointer to a function returning a C enum: an integer
/// is what bindgen's default mapping of that enum gives, and its kCFI type
/// id is not the enum's.
#[no_mangle]
pub extern "C" fn refa_cfi_fixture_mistyped(x: u32) -> u32 {
    x + 2
}
