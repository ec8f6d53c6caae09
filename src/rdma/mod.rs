// SPDX-License-Identifier: GPL-2.0

//! Abstractions over the C RDMA core.
//!
//! This is the only part of the driver that touches the RDMA core's C API,
//! and the only part with `unsafe` code. It is written so that it could move
//! to `rust/kernel/rdma/`; [`pci`] holds the few safe wrappers the driver
//! needs for gaps in the 7.3 kernel crate, which belong in that crate.

/// Defines `$name`, a set of flags of the C enum whose raw bits are a
/// `u32`, with the constants given and the set operations the verbs need.
macro_rules! flags_type {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$cmeta:meta])*
                const $flag:ident = $value:expr;
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis struct $name(u32);

        impl $name {
            $(
                $(#[$cmeta])*
                $vis const $flag: Self = Self($value);
            )*

            /// No flag.
            $vis const fn empty() -> Self {
                Self(0)
            }

            /// The flags as the core passes them.
            $vis const fn from_raw(raw: u32) -> Self {
                Self(raw)
            }

            /// The raw bits.
            $vis const fn bits(self) -> u32 {
                self.0
            }

            /// Whether every flag of `other` is set.
            $vis const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// The flags of `self` that are not in `other`.
            $vis const fn without(self, other: Self) -> Self {
                Self(self.0 & !other.0)
            }

            /// Whether no flag is set.
            $vis const fn is_empty(self) -> bool {
                self.0 == 0
            }
        }

        impl core::ops::BitOr for $name {
            type Output = Self;

            fn bitor(self, rhs: Self) -> Self {
                Self(self.0 | rhs.0)
            }
        }
    };
}
pub(crate) use flags_type;

/// Proves at build time, inside an `impl` of a driver object type, that
/// the object fits the allocation the core makes for it from the table's
/// `size_ib_*`: the C object `ib` at offset 0 (`$msg` says which), and no
/// alignment beyond what kmalloc() guarantees.
macro_rules! assert_core_allocated {
    ($msg:literal) => {
        kernel::build_assert::const_assert!(core::mem::offset_of!(Self, ib) == 0, $msg);
        kernel::build_assert::const_assert!(core::mem::align_of::<Self>() <= 8);
    };
}
pub(crate) use assert_core_allocated;

pub(crate) mod ah;
pub(crate) mod bindings;
pub(crate) mod comp_cntr;
pub(crate) mod cq;
pub(crate) mod device;
pub(crate) mod efa_abi;
pub(crate) mod mmap;
pub(crate) mod mr;
pub(crate) mod pci;
pub(crate) mod pd;
pub(crate) mod qp;
pub(crate) mod stats;
pub(crate) mod ucontext;
pub(crate) mod udata;
pub(crate) mod umem;
pub(crate) mod verbs;
