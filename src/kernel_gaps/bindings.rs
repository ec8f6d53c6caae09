// SPDX-License-Identifier: GPL-2.0

//! What the kernel gaps need of C that the 7.3 kernel crate's bindings
//! leave out: `init_uts_ns` complete and `LINUX_VERSION_CODE`, which the
//! series binds (patches/rust/, `rust: bindings: add utsname.h and
//! version.h`).
// out of tree: begin
//!
//! Out of tree, bindgen's of `helpers.c`, bound as rust/Makefile binds
//! `rust/helpers/`: by their C names, with the kernel crate's types where it
//! has them; with the helpers of the static inline functions that the
//! series' rust/kernel patches call, which the gaps stand in for.
// out of tree: end

// in tree: use kernel::bindings as raw;
// out of tree: begin
#[allow(
    clippy::all,
    improper_ctypes,
    missing_docs,
    non_camel_case_types,
    non_upper_case_globals,
    unreachable_pub,
    clippy::undocumented_unsafe_blocks
)]
mod raw {
    use kernel::{
        bindings::{
            cpumask,
            device,
            irq_data,
            ns_common,
            ucounts,
            user_namespace, //
        },
        ffi, //
    };
    use pin_init::MaybeZeroable;

    include!(concat!(
        env!("REFA_OBJTREE"),
        "/src/kernel_gaps/bindings_generated.rs"
    ));
}

pub(crate) use raw::{
    cpumask_of,
    dma_set_seg_boundary,
    irq_data_get_node,
    irq_set_affinity_and_hint,
    irq_update_affinity_hint, //
};
// out of tree: end

pub(crate) use raw::{
    init_uts_ns,
    LINUX_VERSION_CODE, //
};
