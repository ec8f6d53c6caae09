// SPDX-License-Identifier: GPL-2.0

//! The helpers of the kernel gaps (`helpers.c`), bound as rust/Makefile
//! binds `rust/helpers/`: by their C names, with the kernel crate's types
//! where it has them; and what the kernel crate's bindings leave out:
//! `LINUX_VERSION_CODE` and `struct new_utsname`.

#[allow(
    clippy::all,
    clippy::as_underscore,
    clippy::cast_lossless,
    clippy::ptr_as_ptr,
    clippy::ref_as_ptr,
    dead_code,
    missing_docs,
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    improper_ctypes,
    unreachable_pub,
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks
)]
#[cfg_attr(not(CONFIG_RUSTC_HAS_UNNECESSARY_TRANSMUTES), allow(unknown_lints))]
#[allow(unnecessary_transmutes)]
mod raw {
    use kernel::{
        bindings::{
            cpumask,
            device, //
        },
        ffi, //
    };
    use pin_init::{
        MaybeZeroable,
        Zeroable, //
    };

    // As in `rdma::bindings`: rust/bindgen_parameters blocklists these.
    type __kernel_size_t = usize;
    type __kernel_ssize_t = isize;
    type __kernel_ptrdiff_t = isize;

    // SAFETY: `__BindgenBitfieldUnit<Storage>` is a newtype around `Storage`,
    // so it is zeroable exactly when `Storage` is.
    unsafe impl<Storage> Zeroable for __BindgenBitfieldUnit<Storage> where Storage: Zeroable {}

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
