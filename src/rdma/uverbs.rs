// SPDX-License-Identifier: GPL-2.0

//! A driver's own uverbs methods and attributes (`struct uapi_definition`).
//!
//! C headers: [`include/rdma/uverbs_ioctl.h`](srctree/include/rdma/uverbs_ioctl.h),
//! [`include/rdma/uverbs_named_ioctl.h`](srctree/include/rdma/uverbs_named_ioctl.h)
//!
//! A driver extends the core's ioctl objects with methods and attributes of
//! its uAPI (`ib_device.driver_def`). The core builds them from static
//! trees of C structures that its `DECLARE_UVERBS_*` and `ADD_UVERBS_*`
//! macros write, so a driver declares its tree in C and names it here with
//! [`uapi_definitions!`]; [`Operations::uapi_definitions`] hands it to the
//! layer, which installs it on the driver's devices only.
//!
//! Methods on objects are answered in Rust: the C handler looks the object
//! up, typed by the C declaration of its attribute, and calls a function
//! that the layer's macro for that object kind defines (for MRs,
//! [`mr_method!`](super::mr::mr_method)). That function checks that the
//! object belongs to a device of the driver it was declared for, so a
//! second driver type sharing the tree is refused rather than confused,
//! and the symbol is the driver's own, named by it.
//!
//! [`Operations::uapi_definitions`]: super::device::Operations::uapi_definitions

use super::bindings;
use kernel::types::Opaque;

/// The root of a driver's tree of uverbs definitions: a static,
/// zero-terminated array of `struct uapi_definition` in C.
#[repr(transparent)]
pub(crate) struct UapiDefinitions(Opaque<bindings::uapi_definition>);

impl UapiDefinitions {
    /// The first definition, as `ib_device.driver_def` takes it.
    pub(super) fn as_raw(&self) -> *const bindings::uapi_definition {
        self.0.get()
    }
}

// SAFETY: The definitions are immutable static data of the C side.
unsafe impl Sync for UapiDefinitions {}

/// Defines `fn $fn() -> &'static UapiDefinitions`, the driver's tree of
/// uverbs definitions that the C array `$c_name` (a
/// `const struct uapi_definition []`, ended by an empty entry) holds.
#[macro_export]
macro_rules! uapi_definitions {
    ($(#[$meta:meta])* $vis:vis fn $fn:ident = $c_name:ident) => {
        $(#[$meta])*
        $vis fn $fn() -> &'static $crate::rdma::uverbs::UapiDefinitions {
            extern "C" {
                static $c_name: $crate::rdma::uverbs::UapiDefinitions;
            }
            // SAFETY: `$c_name` is the driver's C array of `struct
            // uapi_definition`, which the C declaration types; it is static
            // and never written, and `UapiDefinitions` is a transparent
            // wrapper of its first element.
            unsafe { &$c_name }
        }
    };
}
pub(crate) use crate::uapi_definitions;
