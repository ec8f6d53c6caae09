// SPDX-License-Identifier: GPL-2.0

//! The helpers of the kernel gaps (`helpers.c`), bound as rust/Makefile
//! binds `rust/helpers/`: by their C names, with the kernel crate's types
//! where it has them; and what the kernel crate's bindings leave out:
//! `LINUX_VERSION_CODE` and `struct new_utsname`.

#[allow(
    clippy::all,
    improper_ctypes,
    missing_docs,
    non_camel_case_types,
    unreachable_pub,
    clippy::undocumented_unsafe_blocks
)]
mod raw {
    use kernel::{
        bindings::{
            cpumask,
            device, //
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
    dev_to_node,
    dma_set_seg_boundary,
    init_utsname,
    irq_set_affinity_and_hint,
    irq_update_affinity_hint,
    LINUX_VERSION_CODE, //
};
