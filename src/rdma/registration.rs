// SPDX-License-Identifier: GPL-2.0

//! Allocating and registering an RDMA device, and the `ib_device_ops`
//! table the core calls the driver through.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! [`UnregisteredDevice::new`] allocates the `ib_device` of a [`Driver`],
//! with its operations table; the driver sets what it decides about the
//! device, then [`Registration::new`] makes it visible to the RDMA core and
//! to userspace with the data the operations see. Dropping the
//! [`Registration`] unregisters the device: the core then destroys every
//! user object still open (the uverbs disassociate model) and calls no
//! operation any more, so the registration data lives exactly as long as
//! the operations can see it. The device itself is reference counted
//! ([`ARef`]) and outlives the registration for as long as anyone holds a
//! reference.
// series: begin ucontext
//!
//! # Destroys
//!
//! The core keeps an object whose destroy fails when userspace asked for
//! it, and returns the error; but at close and at device removal it
//! destroys everything left, and warns when destroys keep failing
//! (`uverbs_destroy_ufile_hw()`). The 7.3 core does not say which case a
//! destroy is, but its bundle does: the one it makes for close and removal
//! (`__uverbs_cleanup_ufile()`) names no method and carries no request,
//! which every system call's does (`udata::destroys_what_is_left`). So
//! the destroy operations return nothing and a driver keeps whatever the
//! device may still use until the device is reset; but a user's destroy of
//! a PD, CQ or QP is first offered to the driver to refuse (`may_dealloc`,
//! `may_destroy`), which it does only when it could not keep the object
//! within the user's limits (refa: an object the device keeps for a
//! mapping userspace kept, past the user's rdma cgroup limit).
// series: end ucontext

use super::{
    // series: begin ah
    ah::{
        self,
        DriverAh, //
    },
    // series: end ah
    bindings,
    // series: begin comp_cntr
    comp_cntr::{
        self,
        DriverCompCntr, //
    },
    // series: end comp_cntr
    // series: begin cq
    cq::{
        self,
        DriverCq, //
    },
    // series: end cq
    device::{
        Device,
        Operations, //
    },
    // series: begin mr
    mr::{
        self,
        DriverMr, //
    },
    // series: end mr
    // series: begin ucontext
    pd::{
        self,
        DriverPd, //
    },
    // series: end ucontext
    // series: begin qp
    qp::{
        self,
        DriverQp, //
    },
    // series: end qp
    // series: begin stats
    stats::{
        HwCounters,
        HwStatsValues,
        StatsScope, //
    },
    // series: end stats
    // series: begin ucontext
    ucontext::{
        self,
        DriverUContext, //
    },
    // series: end ucontext
    udata::UData,
    verbs::{
        DeviceAttr,
        PortAttr, //
    }, //
};
use core::{
    marker::PhantomData,
    ops::Deref,
    ptr::NonNull, //
};
use kernel::{
    device as kdevice,
    prelude::*,
    sync::aref::ARef,
    types::NotThreadSafe, //
};

/// A driver whose object types implement the traits of their kinds: what
/// the layer can build an operations table for.
pub(crate) trait Driver:
    Operations<
    // series: begin ucontext
    UContext: DriverUContext,
    Pd: DriverPd,
    // series: end ucontext
    // series: begin cq
    Cq: DriverCq,
    // series: end cq
    // series: begin ah
    Ah: DriverAh,
    // series: end ah
    // series: begin mr
    Mr: DriverMr,
    // series: end mr
    // series: begin qp
    Qp: DriverQp,
    // series: end qp
    // series: begin comp_cntr
    CompCntr: DriverCompCntr,
    // series: end comp_cntr
>
{
}

impl<T> Driver for T where
    T: Operations<
        // series: begin ucontext
        UContext: DriverUContext,
        Pd: DriverPd,
        // series: end ucontext
        // series: begin cq
        Cq: DriverCq,
        // series: end cq
        // series: begin ah
        Ah: DriverAh,
        // series: end ah
        // series: begin mr
        Mr: DriverMr,
        // series: end mr
        // series: begin qp
        Qp: DriverQp,
        // series: end qp
        // series: begin comp_cntr
        CompCntr: DriverCompCntr,
        // series: end comp_cntr
    >
{
}

/// An RDMA device that is not registered yet.
///
/// Owns the reference `_ib_alloc_device()` returned; dropping it without
/// registering frees the device (`ib_dealloc_device()`). It is not `Send`:
/// the device is set up on one thread before the core sees it.
///
/// # Invariants
///
/// `dev` was allocated by [`UnregisteredDevice::new`] with `T`'s operations
/// table, is not registered, and this owns the allocation's reference.
pub(crate) struct UnregisteredDevice<T: Driver> {
    dev: NonNull<Device<T>>,
    _not_send: NotThreadSafe,
}

impl<T: Driver> UnregisteredDevice<T> {
    /// Allocates a device of `parent`, with one port and one completion
    /// vector until the driver says otherwise.
    pub(crate) fn new(parent: &kdevice::Device<kdevice::Bound>) -> Result<Self> {
        // SAFETY: `_ib_alloc_device` accepts any size of at least
        // `sizeof(struct ib_device)`; a null namespace means the initial one.
        let raw = unsafe {
            bindings::_ib_alloc_device(core::mem::size_of::<Device<T>>(), core::ptr::null_mut())
        };
        let dev = NonNull::new(raw.cast::<Device<T>>()).ok_or(ENOMEM)?;
        // SAFETY: A new, zeroed allocation of `size_of::<Device<T>>()` bytes
        // (kzalloc aligns it for the `ib_device`, whose alignment `Device<T>`
        // shares), which nobody else knows of.
        // in tree: unsafe { Device::init(dev) };
        // out of tree: begin
        unsafe { Device::init(dev, &VTable::<T>::ENUM_OPS) };
        // out of tree: end
        // SAFETY: Not registered, so nothing else reads or writes the fields
        // set here. The table and the uverbs definitions are static.
        unsafe {
            let raw = dev.as_ref().as_raw();
            (*raw).__bindgen_anon_1.dev.parent = bindings::device_raw(parent);
            (*raw).node_type = bindings::RDMA_NODE_UNSPECIFIED as u8;
            (*raw).phys_port_cnt = 1;
            (*raw).num_comp_vectors = 1;
            // series: begin mr
            if T::HAS_UAPI_DEFINITIONS {
                (*raw).driver_def = T::uapi_definitions().as_raw();
            }
            // series: end mr
            bindings::ib_set_device_ops(raw, &VTable::<T>::OPS);
        }
        // INVARIANT: Just allocated with `T`'s table, not registered.
        Ok(Self {
            dev,
            _not_send: NotThreadSafe,
        })
    }

    /// Number of completion vectors userspace may pick from.
    pub(crate) fn set_num_comp_vectors(&mut self, n: u32) {
        let raw = self.as_raw();
        // SAFETY: The device is allocated (type invariant). It is not
        // registered, so the core does not read the field yet, and nothing
        // else reads or writes it: shared references (`Device`, `ARef`) only
        // reach the name and the registration data. Written through the raw
        // pointer, without a reference to the whole `ib_device`, which
        // others may reference.
        unsafe { (*raw).num_comp_vectors = n.try_into().unwrap_or(i32::MAX) };
    }

    /// The node GUID. The core reports the field's bytes as they are
    /// (`__be64`): `guid` is stored unconverted.
    pub(crate) fn set_node_guid(&mut self, guid: u64) {
        let raw = self.as_raw();
        // SAFETY: As in `set_num_comp_vectors()`: allocated, not
        // registered, a field only the core reads, written in place.
        unsafe { (*raw).node_guid = guid };
    }
}

impl<T: Driver> Deref for UnregisteredDevice<T> {
    type Target = Device<T>;

    fn deref(&self) -> &Device<T> {
        // SAFETY: The allocation's reference is ours (type invariant).
        unsafe { self.dev.as_ref() }
    }
}

impl<T: Driver> Drop for UnregisteredDevice<T> {
    fn drop(&mut self) {
        // SAFETY: Never registered (type invariant), or its registration
        // failed, after which the core leaves `ib_dealloc_device()` to the
        // caller; this drops the allocation's reference, after
        // `dealloc_driver`.
        unsafe { bindings::ib_dealloc_device(self.dev.as_ref().as_raw()) };
    }
}

/// A registered RDMA device.
///
/// Owns the registration data the operations see and a reference on the
/// device. Dropping it unregisters the device, which destroys every
/// remaining user object and waits until no operation runs; then the data
/// is dropped.
///
/// # Invariants
///
/// `dev` is registered, and its registration data pointer is `data`.
pub(crate) struct Registration<'a, T: Driver> {
    dev: ARef<Device<T>>,
    _data: Pin<KBox<T::RegistrationData<'a>>>,
}

impl<'a, T: Driver> Registration<'a, T> {
    /// Registers `dev`, a device of `parent`, as `name` (a pattern such as
    /// `c"refa_%d"`, or a name), with DMA done by `parent`, handing `data`
    /// to every operation. The core formats the name with the device's
    /// number (and copies it): `EINVAL` for a name with a `%` other than
    /// one `%d`, `ENFILE` for a name another device has.
    ///
    /// # Safety
    ///
    /// The returned [`Registration`] must be dropped before `parent` is
    /// unbound: never `mem::forget()` it or otherwise keep its [`Drop`] from
    /// running (keep it in the driver data of the bound device), since the
    /// registration data may borrow resources of the binding (`'a`) and the
    /// core calls the operations until it is dropped.
    pub(crate) unsafe fn new(
        parent: &'a kdevice::Device<kdevice::Bound>,
        dev: UnregisteredDevice<T>,
        name: &CStr,
        data: impl PinInit<T::RegistrationData<'a>, Error>,
    ) -> Result<Self> {
        if !name_pattern_is_valid(name.to_bytes()) {
            return Err(EINVAL);
        }
        let raw = dev.as_raw();
        // SAFETY: Not registered; reads a field `UnregisteredDevice::new` set.
        if unsafe { (*raw).__bindgen_anon_1.dev.parent } != bindings::device_raw(parent) {
            return Err(EINVAL);
        }
        let data = KBox::pin_init(data, GFP_KERNEL)?;
        // The `'static` type is only an erased storage handle: operations see
        // the data through a higher-ranked closure.
        let ptr: NonNull<T::RegistrationData<'static>> =
            NonNull::from(Pin::get_ref(data.as_ref())).cast();
        // SAFETY: Not registered, so no operation runs; the data lives in its
        // box until after `ib_unregister_device()`, in `drop()`.
        unsafe { dev.set_registration_data(Some(ptr)) };
        // SAFETY: The device is fully set up; `name` is a valid pattern
        // (the core passes it to `dev_set_name()` as a format, with the
        // device's number as the only argument when it has a `%`: checked
        // above to have no directive but one `%d`), and `parent` a bound
        // device that can do DMA (PCI devices have DMA parameters).
        let ret = unsafe {
            bindings::ib_register_device(raw, name.as_char_ptr(), bindings::device_raw(parent))
        };
        if ret != 0 {
            // SAFETY: Registration failed, so no operation runs any more.
            unsafe { dev.set_registration_data(None) };
            // Dropping `dev` frees the device: after a failed registration
            // the core leaves `ib_dealloc_device()` to the caller.
            return Err(Error::from_errno(ret));
        }
        let reference = ARef::from(&*dev);
        // The allocation's reference now belongs to the core: with
        // `dealloc_driver` set, unregistering the device drops it.
        core::mem::forget(dev);
        // INVARIANT: Registered, with `data`.
        Ok(Self {
            dev: reference,
            _data: data,
        })
    }

    /// The registered device.
    pub(crate) fn device(&self) -> &Device<T> {
        &self.dev
    }
}

/// Whether `name` is a device name pattern the core can format: the core
/// hands it to `dev_set_name()` as a `printf` format, with the device's
/// number as its only argument if it has a `%` (`assign_name()`), so at most
/// one `%d` and no other `%`.
fn name_pattern_is_valid(name: &[u8]) -> bool {
    let mut directives = 0;
    let mut i = 0;
    while i < name.len() {
        if name[i] == b'%' {
            if name.get(i + 1) != Some(&b'd') {
                return false;
            }
            directives += 1;
            i += 1;
        }
        i += 1;
    }
    directives <= 1
}

impl<T: Driver> Drop for Registration<'_, T> {
    fn drop(&mut self) {
        // SAFETY: Registered (type invariant), with the parent still bound
        // (the contract of `new`). After this returns no operation runs and
        // none will; user objects are all destroyed, and the core dropped the
        // allocation's reference (`dealloc_driver` is set): `self.dev` keeps
        // the memory.
        unsafe { bindings::ib_unregister_device(self.dev.as_raw()) };
        // SAFETY: Unregistered: nothing reads the pointer any more.
        unsafe { self.dev.set_registration_data(None) };
        // The registration data is dropped after this, when no operation can
        // see it.
    }
}

// SAFETY: The registration only holds the device and the data, both of
// which may be used and released from any thread.
unsafe impl<T: Driver> Send for Registration<'_, T> where for<'b> T::RegistrationData<'b>: Send {}
// SAFETY: Shared access only reads the device pointer.
unsafe impl<T: Driver> Sync for Registration<'_, T> where for<'b> T::RegistrationData<'b>: Sync {}

/// The `ib_device_ops` table of a [`Driver`].
struct VTable<T: Driver>(PhantomData<T>);

impl<T: Driver> VTable<T> {
    const OPS: bindings::ib_device_ops = {
        // series: begin ah
        // What the core needs together.
        const_assert!(<T::Ah as DriverAh>::HAS_CREATE == <T::Ah as DriverAh>::HAS_DESTROY);
        // series: end ah
        // series: begin mr
        const_assert!(<T::Mr as DriverMr>::HAS_REG_USER == <T::Mr as DriverMr>::HAS_DEREG);
        const_assert!(!<T::Mr as DriverMr>::HAS_REG_DMABUF || <T::Mr as DriverMr>::HAS_REG_USER);
        // series: end mr
        // series: begin qp
        const_assert!(<T::Qp as DriverQp>::HAS_CREATE == <T::Qp as DriverQp>::HAS_DESTROY);
        const_assert!(<T::Qp as DriverQp>::HAS_CREATE == <T::Qp as DriverQp>::HAS_MODIFY);
        // series: end qp
        // series: begin comp_cntr
        const_assert!(
            <T::CompCntr as DriverCompCntr>::HAS_CREATE
                == <T::CompCntr as DriverCompCntr>::HAS_DESTROY
        );
        const_assert!(
            <T::CompCntr as DriverCompCntr>::HAS_CREATE
                == <T::CompCntr as DriverCompCntr>::HAS_ATTACH
        );
        const_assert!(
            <T::CompCntr as DriverCompCntr>::HAS_CREATE
                == <T::CompCntr as DriverCompCntr>::HAS_CAPS
        );
        // series: end comp_cntr
        // series: begin stats
        const_assert!(T::HAS_HW_COUNTERS == T::HAS_GET_HW_STATS);
        // series: end stats
        Self::TABLE
    };

    // out of tree: begin
    /// The functions behind the operations whose C prototypes have an enum:
    /// the table's entries for them are C (`rust_rdma_*` in
    /// `include/rust/compat/rdma.h`), which call these through the device's
    /// head, with the enums as integers. The C functions' kCFI type ids are
    /// the prototypes', and these are called through pointers of their own
    /// types.
    const ENUM_OPS: bindings::rust_rdma_enum_ops = bindings::rust_rdma_enum_ops {
        get_link_layer: Some(Self::get_link_layer_compat),
        modify_comp_cntr: if <T::CompCntr as DriverCompCntr>::HAS_MODIFY {
            Some(comp_cntr::modify_callback_compat::<T::CompCntr>)
        } else {
            None
        },
    };

    /// [`Self::get_link_layer`] for `rust_rdma_get_link_layer()`.
    ///
    /// # Safety
    ///
    /// As for [`Self::get_link_layer`].
    unsafe extern "C" fn get_link_layer_compat(dev: *mut bindings::ib_device, port: u32) -> u32 {
        // SAFETY: Per the function's safety requirements.
        unsafe { Self::get_link_layer(dev, port) }.0
    }
    // out of tree: end

    // series: begin ah
    const AH: bool = <T::Ah as DriverAh>::HAS_CREATE;
    // series: end ah
    // series: begin mr
    const MR: bool = <T::Mr as DriverMr>::HAS_REG_USER;
    // series: end mr
    // series: begin qp
    const QP: bool = <T::Qp as DriverQp>::HAS_CREATE;
    // series: end qp
    // series: begin comp_cntr
    const COMP_CNTR: bool = <T::CompCntr as DriverCompCntr>::HAS_CREATE;
    // series: end comp_cntr

    const TABLE: bindings::ib_device_ops = bindings::ib_device_ops {
        owner: kernel::module::this_module::<T::OwnerModule>()
            .as_ptr()
            .cast(),
        driver_id: T::DRIVER_ID as u32,
        uverbs_abi_ver: T::ABI_VERSION,
        dealloc_driver: Some(Self::dealloc_driver),
        query_device: Some(Self::query_device),
        query_port: Some(Self::query_port),
        get_port_immutable: Some(Self::get_port_immutable),
        query_port_speed: if T::HAS_QUERY_PORT_SPEED {
            Some(Self::query_port_speed)
        } else {
            None
        },
        // in tree: get_link_layer: Some(Self::get_link_layer),
        // out of tree: begin
        get_link_layer: Some(bindings::rust_rdma_get_link_layer),
        // out of tree: end
        query_gid: if T::HAS_QUERY_GID {
            Some(Self::query_gid)
        } else {
            None
        },
        query_pkey: if T::HAS_QUERY_PKEY {
            Some(Self::query_pkey)
        } else {
            None
        },
        // series: begin stats
        alloc_hw_device_stats: if T::HAS_HW_COUNTERS {
            Some(Self::alloc_hw_device_stats)
        } else {
            None
        },
        alloc_hw_port_stats: if T::HAS_HW_COUNTERS {
            Some(Self::alloc_hw_port_stats)
        } else {
            None
        },
        get_hw_stats: if T::HAS_GET_HW_STATS {
            Some(Self::get_hw_stats)
        } else {
            None
        },
        // series: end stats
        // series: begin ucontext
        alloc_ucontext: Some(ucontext::alloc_callback::<T::UContext>),
        dealloc_ucontext: Some(ucontext::dealloc_callback::<T::UContext>),
        disassociate_ucontext: Some(ucontext::disassociate_callback),
        // series: end ucontext
        // series: begin mmap
        mmap: Some(ucontext::mmap_callback::<T::UContext>),
        mmap_free: Some(ucontext::mmap_free_callback::<T::UContext>),
        // series: end mmap
        // series: begin ucontext
        size_ib_ucontext: core::mem::size_of::<ucontext::UContext<T::UContext>>(),
        alloc_pd: Some(pd::alloc_callback::<T::Pd>),
        dealloc_pd: Some(pd::dealloc_callback::<T::Pd>),
        size_ib_pd: core::mem::size_of::<pd::Pd<T::Pd>>(),
        // series: end ucontext
        // series: begin cq
        create_user_cq: Some(cq::create_callback::<T::Cq>),
        destroy_cq: Some(cq::destroy_callback::<T::Cq>),
        size_ib_cq: core::mem::size_of::<cq::Cq<T::Cq>>(),
        // series: end cq
        // series: begin ah
        create_user_ah: if Self::AH {
            Some(ah::create_callback::<T::Ah>)
        } else {
            None
        },
        destroy_ah: if Self::AH {
            Some(ah::destroy_callback::<T::Ah>)
        } else {
            None
        },
        size_ib_ah: core::mem::size_of::<ah::Ah<T::Ah>>(),
        // series: end ah
        // series: begin mr
        reg_user_mr: if Self::MR {
            Some(mr::reg_callback::<T::Mr>)
        } else {
            None
        },
        reg_user_mr_dmabuf: if <T::Mr as DriverMr>::HAS_REG_DMABUF {
            Some(mr::reg_dmabuf_callback::<T::Mr>)
        } else {
            None
        },
        dereg_mr: if Self::MR {
            Some(mr::dereg_callback::<T::Mr>)
        } else {
            None
        },
        // series: end mr
        // series: begin qp
        create_qp: if Self::QP {
            Some(qp::create_callback::<T::Qp>)
        } else {
            None
        },
        modify_qp: if Self::QP {
            Some(qp::modify_callback::<T::Qp>)
        } else {
            None
        },
        query_qp: if <T::Qp as DriverQp>::HAS_QUERY {
            Some(qp::query_callback::<T::Qp>)
        } else {
            None
        },
        destroy_qp: if Self::QP {
            Some(qp::destroy_callback::<T::Qp>)
        } else {
            None
        },
        size_ib_qp: core::mem::size_of::<qp::Qp<T::Qp>>(),
        // series: end qp
        // series: begin comp_cntr
        create_comp_cntr: if Self::COMP_CNTR {
            Some(comp_cntr::create_callback::<T::CompCntr>)
        } else {
            None
        },
        destroy_comp_cntr: if Self::COMP_CNTR {
            Some(comp_cntr::destroy_callback::<T::CompCntr>)
        } else {
            None
        },
        modify_comp_cntr: if <T::CompCntr as DriverCompCntr>::HAS_MODIFY {
            // in tree: Some(comp_cntr::modify_callback::<T::CompCntr>)
            // out of tree: begin
            Some(bindings::rust_rdma_modify_comp_cntr)
            // out of tree: end
        } else {
            None
        },
        qp_attach_comp_cntr: if Self::COMP_CNTR {
            Some(comp_cntr::qp_attach_callback::<T::CompCntr>)
        } else {
            None
        },
        query_comp_cntr_caps: if Self::COMP_CNTR {
            Some(comp_cntr::query_caps_callback::<T::CompCntr>)
        } else {
            None
        },
        size_ib_comp_cntr: core::mem::size_of::<comp_cntr::CompCntr<T::CompCntr>>(),
        // series: end comp_cntr
        ..pin_init::zeroed()
    };

    /// Calls `f` with the device `dev` and its registration data.
    ///
    /// # Safety
    ///
    /// `dev` is the `ib_device` of a live device of `T` that is registered.
    unsafe fn with_device<R>(
        dev: *mut bindings::ib_device,
        f: impl for<'a> FnOnce(&Device<T>, &'a T::RegistrationData<'a>) -> R,
    ) -> R {
        // SAFETY: Per the function's safety requirements.
        unsafe { Device::<T>::from_raw(dev).with_registration_data(f) }
    }

    /// `dealloc_driver`. The Rust part of a device has nothing to drop;
    /// having the callback makes unregistration drop the allocation's
    /// reference (the core's "new flow"), also when the core unregisters the
    /// device itself (its network namespace goes away).
    ///
    /// # Safety
    ///
    /// Called by `ib_dealloc_device()`.
    unsafe extern "C" fn dealloc_driver(_dev: *mut bindings::ib_device) {}

    /// # Safety
    ///
    /// Called by the core for a registered device of `T`; `attr` is valid
    /// for writes and `udata` null or the driver udata of a user call.
    unsafe extern "C" fn query_device(
        dev: *mut bindings::ib_device,
        attr: *mut bindings::ib_device_attr,
        udata: *mut bindings::ib_udata,
    ) -> kernel::ffi::c_int {
        // SAFETY: `attr` is valid for writes for the duration of the call.
        let attr = unsafe { DeviceAttr::from_raw(attr) };
        // SAFETY: A non-null `udata` is the driver udata of the user call, in
        // the calling process; the core also asks without, at registration.
        let mut udata = unsafe { UData::from_raw(dev, udata) };
        // SAFETY: Per the function's safety requirements; the core calls
        // operations only while the device is registered.
        let ret = unsafe {
            Self::with_device(dev, |dev, data| {
                T::query_device(dev, data, attr, udata.as_mut())
            })
        };
        kernel::error::from_result(|| ret.map(|()| 0))
    }

    /// # Safety
    ///
    /// Called by the core for a registered device of `T`; `attr` is valid.
    unsafe extern "C" fn query_port(
        dev: *mut bindings::ib_device,
        port: u32,
        attr: *mut bindings::ib_port_attr,
    ) -> kernel::ffi::c_int {
        // SAFETY: `attr` is valid and zeroed by the core for this call.
        let attr = unsafe { PortAttr::from_raw(attr) };
        // SAFETY: Per the function's safety requirements; the core calls
        // operations only while the device is registered.
        let ret =
            unsafe { Self::with_device(dev, |dev, data| T::query_port(dev, data, port, attr)) };
        kernel::error::from_result(|| ret.map(|()| 0))
    }

    /// # Safety
    ///
    /// Called by the core for a registered device of `T`; `speed` is valid
    /// for writes.
    unsafe extern "C" fn query_port_speed(
        dev: *mut bindings::ib_device,
        port: u32,
        speed: *mut u64,
    ) -> kernel::ffi::c_int {
        // SAFETY: Per the function's safety requirements; the core calls
        // operations only while the device is registered.
        let ret =
            unsafe { Self::with_device(dev, |dev, data| T::query_port_speed(dev, data, port)) };
        kernel::error::from_result(|| {
            // SAFETY: `speed` is valid for writes, per the function's safety
            // requirements.
            unsafe { speed.write(ret?) };
            Ok(0)
        })
    }

    /// # Safety
    ///
    /// Called by the core for a device of `T` being registered; `out` is
    /// valid.
    unsafe extern "C" fn get_port_immutable(
        dev: *mut bindings::ib_device,
        port: u32,
        out: *mut bindings::ib_port_immutable,
    ) -> kernel::ffi::c_int {
        // SAFETY: Per the function's safety requirements; the core calls
        // operations only while the device is registered (from the start of
        // `ib_register_device()`).
        let ret =
            unsafe { Self::with_device(dev, |dev, data| T::get_port_immutable(dev, data, port)) };
        kernel::error::from_result(|| {
            // SAFETY: `out` is valid for writes for the duration of the call.
            unsafe { *out = ret?.into_raw() };
            Ok(0)
        })
    }

    /// # Safety
    ///
    /// Called by the core for a registered device of `T`.
    unsafe extern "C" fn get_link_layer(
        _dev: *mut bindings::ib_device,
        _port: u32,
    ) -> bindings::rdma_link_layer {
        T::LINK_LAYER.into_raw()
    }

    /// # Safety
    ///
    /// Called by the core for a registered device of `T`; `gid` is valid.
    unsafe extern "C" fn query_gid(
        dev: *mut bindings::ib_device,
        port: u32,
        index: kernel::ffi::c_int,
        gid: *mut bindings::ib_gid,
    ) -> kernel::ffi::c_int {
        kernel::error::from_result(|| {
            let index = u32::try_from(index).map_err(|_| EINVAL)?;
            // SAFETY: Per the function's safety requirements; the core calls
            // operations only while the device is registered.
            let value = unsafe {
                Self::with_device(dev, |dev, data| T::query_gid(dev, data, port, index))
            }?;
            // SAFETY: `gid` is valid for writes for the duration of the call.
            unsafe { (*gid).raw = value.0 };
            Ok(0)
        })
    }

    /// # Safety
    ///
    /// Called by the core for a registered device of `T`; `pkey` is valid.
    unsafe extern "C" fn query_pkey(
        dev: *mut bindings::ib_device,
        port: u32,
        index: u16,
        pkey: *mut u16,
    ) -> kernel::ffi::c_int {
        kernel::error::from_result(|| {
            // SAFETY: Per the function's safety requirements; the core calls
            // operations only while the device is registered.
            let value = unsafe {
                Self::with_device(dev, |dev, data| T::query_pkey(dev, data, port, index))
            }?;
            // SAFETY: `pkey` is valid for writes for the duration of the call.
            unsafe { *pkey = value };
            Ok(0)
        })
    }

    // series: begin stats
    /// # Safety
    ///
    /// Called by the core for a device of `T` being registered.
    unsafe extern "C" fn alloc_hw_device_stats(
        _dev: *mut bindings::ib_device,
    ) -> *mut bindings::rdma_hw_stats {
        T::hw_counters(StatsScope::Device).map_or(core::ptr::null_mut(), HwCounters::alloc)
    }

    /// # Safety
    ///
    /// Called by the core for a device of `T` being registered.
    unsafe extern "C" fn alloc_hw_port_stats(
        _dev: *mut bindings::ib_device,
        port: u32,
    ) -> *mut bindings::rdma_hw_stats {
        T::hw_counters(StatsScope::Port(port)).map_or(core::ptr::null_mut(), HwCounters::alloc)
    }

    /// # Safety
    ///
    /// Called by the core for a registered device of `T`, with `stats` from
    /// the matching allocation callback, under its lock.
    unsafe extern "C" fn get_hw_stats(
        dev: *mut bindings::ib_device,
        stats: *mut bindings::rdma_hw_stats,
        port: u32,
        _index: kernel::ffi::c_int,
    ) -> kernel::ffi::c_int {
        // SAFETY: Allocated by `HwCounters::alloc`; the core holds the
        // statistics lock for the call.
        let mut values = unsafe { HwStatsValues::from_raw(stats) };
        // The core reads a counter's name and value for each one reported
        // (`descs[i]`, `value[i]`): never more than there are.
        let counters = values.values().len();
        let scope = StatsScope::from_port(port);
        // SAFETY: Per the function's safety requirements; the core calls
        // operations only while the device is registered.
        let ret = unsafe {
            Self::with_device(dev, |dev, data| {
                T::get_hw_stats(dev, data, scope, &mut values)
            })
        };
        kernel::error::from_result(|| {
            Ok(ret?
                .min(counters)
                .try_into()
                .unwrap_or(kernel::ffi::c_int::MAX))
        })
    }
    // series: end stats
}

#[kunit_tests(refa_rdma_registration)]
mod tests {
    use super::*;

    /// Names the core would format with directives it has no argument
    /// for are refused before registration.
    #[test]
    fn device_names_are_formats_with_one_number() {
        assert!(name_pattern_is_valid(b"refa_%d"));
        assert!(name_pattern_is_valid(b"refa0"));
        assert!(name_pattern_is_valid(b"%d_refa"));
        assert!(!name_pattern_is_valid(b"refa_%s"));
        assert!(!name_pattern_is_valid(b"refa_%d_%d"));
        assert!(!name_pattern_is_valid(b"refa_%%"));
        assert!(!name_pattern_is_valid(b"refa_%"));
        assert!(!name_pattern_is_valid(b"refa_%ld"));
    }
}
