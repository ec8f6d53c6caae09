// SPDX-License-Identifier: GPL-2.0

//! RDMA devices (`struct ib_device`) and the objects userspace creates in
//! them.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! A driver implements [`Operations`] for a type that stands for the
//! driver: the operations on the device as a whole, and the types of its
//! data for each kind of object. A [`Device<T>`] is the C `struct
//! ib_device` of such a driver, reference counted ([`ARef`]); it is
//! allocated and registered through [`super::registration`].
// series: begin ucontext
//!
//! Every object userspace creates (user context, PD, CQ, AH, MR, QP,
//! completion counter) is one [`Object<T>`]: the C object at offset 0, the
//! layer's part, and the driver's data `T`, a [`DriverObject`] whose trait
//! beside its object kind (`DriverPd` in [`super::pd`], ...) says what the
//! driver does to create and destroy it. The core allocates the object with
//! the size the driver registered, and frees it after the destroy operation
//! returned success; the driver's data is initialised in place when the
//! object is created and dropped in place when it is destroyed, so it may
//! be pinned (locks), and it is handed out pinned ([`Object::data`]).
// series: end ucontext

use super::{
    bindings,
    // series: begin cq
    completion::Registered,
    // series: end cq
    // series: begin mmap
    mmap::Mappings,
    // series: end mmap
    // series: begin stats
    stats::{
        HwCounters,
        HwStatsValues,
        StatsScope, //
    },
    // series: end stats
    udata::UData,
    // series: begin mr
    uverbs::UapiDefinitions,
    // series: end mr
    verbs::{
        DeviceAttr,
        Gid,
        LinkLayer,
        PortAttr,
        PortImmutable, //
    }, //
};
use core::{
    // series: begin mr
    any::TypeId,
    // series: end mr
    cell::UnsafeCell,
    marker::PhantomData,
    ptr::NonNull, //
};
use kernel::{
    prelude::*,
    sync::aref::AlwaysRefCounted,
    types::Opaque, //
};

/// Identifies a driver to rdma-core (`enum rdma_driver_id`), which picks its
/// userspace provider by it. A driver using this layer adds its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum DriverId {
    /// The Elastic Fabric Adapter.
    Efa = bindings::rdma_driver_id_RDMA_DRIVER_EFA,
}

/// The operations of an RDMA device driver on the device as a whole, and
/// the types of its objects.
///
/// What the core calls unconditionally is required (`query_device`,
/// `query_port`, `get_port_immutable`); the other operations are optional,
/// and only those a driver implements are set in the `ib_device_ops` table.
/// Each object type implements the trait of its kind, which holds the
/// object's operations.
///
/// Every operation runs in process context and may sleep, between the
/// registration of the device and its unregistration; operations run
/// concurrently with each other. Each gets the device and the data of its
/// registration.
#[vtable]
pub(crate) trait Operations: Sized + Send + Sync + 'static {
    /// Data owned by the registration and handed to every operation.
    ///
    /// The lifetime is that of the registration, which lives within the
    /// binding of the parent bus device, so it can hold references to
    /// resources of that binding (BAR mappings, the bound PCI device).
    type RegistrationData<'a>: Send + Sync + 'a
    where
        Self: 'a;

    // series: begin ucontext
    /// The driver's part of a user context (`struct ib_ucontext`), a
    /// [`DriverUContext`](super::ucontext::DriverUContext).
    type UContext: DriverObject<Driver = Self, Kind = kind::UContext>;

    /// The driver's part of a protection domain (`struct ib_pd`), a
    /// [`DriverPd`](super::pd::DriverPd).
    type Pd: DriverObject<Driver = Self, Kind = kind::Pd>;
    // series: end ucontext

    // series: begin cq
    /// The driver's part of a completion queue (`struct ib_cq`), a
    /// [`DriverCq`](super::cq::DriverCq).
    type Cq: DriverObject<Driver = Self, Kind = kind::Cq>;
    // series: end cq

    // series: begin ah
    /// The driver's part of an address handle (`struct ib_ah`), a
    /// [`DriverAh`](super::ah::DriverAh).
    type Ah: DriverObject<Driver = Self, Kind = kind::Ah>;
    // series: end ah

    // series: begin mr
    /// The driver's part of a memory region (`struct ib_mr`), a
    /// [`DriverMr`](super::mr::DriverMr).
    type Mr: DriverObject<Driver = Self, Kind = kind::Mr>;
    // series: end mr

    // series: begin qp
    /// The driver's part of a queue pair (`struct ib_qp`), a
    /// [`DriverQp`](super::qp::DriverQp).
    type Qp: DriverObject<Driver = Self, Kind = kind::Qp>;
    // series: end qp

    // series: begin comp_cntr
    /// The driver's part of a completion counter (`struct ib_comp_cntr`), a
    /// [`DriverCompCntr`](super::comp_cntr::DriverCompCntr).
    type CompCntr: DriverObject<Driver = Self, Kind = kind::CompCntr>;
    // series: end comp_cntr

    // series: begin mmap
    /// A token the driver gives an mmap entry
    /// ([`MmapSet::insert_with_private`](super::mmap::MmapSet::insert_with_private)),
    /// handed back to [`Operations::mmap_free`] when the entry is freed.
    type MmapPrivate: Send + Sync + 'static;
    // series: end mmap

    /// The driver id rdma-core matches its provider by.
    const DRIVER_ID: DriverId;

    /// The uverbs ABI version of the driver's uAPI.
    const ABI_VERSION: u32;

    /// The link layer of every port of the device.
    const LINK_LAYER: LinkLayer;

    /// Reports the device's attributes, and driver-specific ones through
    /// `udata` when userspace asks for them. The core also asks when it
    /// registers the device, without `udata`.
    fn query_device<'a>(
        dev: &Device<Self>,
        data: &Self::RegistrationData<'a>,
        attr: &mut DeviceAttr,
        udata: Option<&mut UData<'_>>,
    ) -> Result;

    /// Reports the attributes of port `port` (1-based).
    fn query_port<'a>(
        dev: &Device<Self>,
        data: &Self::RegistrationData<'a>,
        port: u32,
        attr: &mut PortAttr,
    ) -> Result;

    /// Reports what never changes about port `port`.
    fn get_port_immutable<'a>(
        dev: &Device<Self>,
        data: &Self::RegistrationData<'a>,
        port: u32,
    ) -> Result<PortImmutable>;

    /// The data rate of port `port`, in units of 100 Mb/s (the core's
    /// `QUERY_PORT_SPEED` method).
    fn query_port_speed<'a>(
        _dev: &Device<Self>,
        _data: &Self::RegistrationData<'a>,
        _port: u32,
    ) -> Result<u64> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Entry `index` of port `port`'s GID table.
    fn query_gid<'a>(
        _dev: &Device<Self>,
        _data: &Self::RegistrationData<'a>,
        _port: u32,
        _index: u32,
    ) -> Result<Gid> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Entry `index` of port `port`'s P_Key table.
    fn query_pkey<'a>(
        _dev: &Device<Self>,
        _data: &Self::RegistrationData<'a>,
        _port: u32,
        _index: u16,
    ) -> Result<u16> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    // series: begin mmap
    /// An mmap entry inserted with `private` was freed: it was withdrawn and
    /// the last mapping made with it is gone. May sleep; the core may hold
    /// the lock of the unmapping process's mm and the uverbs file's mapping
    /// lock, so the driver must not touch user memory here.
    fn mmap_free<'a>(
        _dev: &Device<Self>,
        _data: &Self::RegistrationData<'a>,
        _private: Self::MmapPrivate,
    ) {
    }
    // series: end mmap

    // series: begin stats
    /// The counters of `scope`, if it has any. Called while the device is
    /// being registered, before any other operation may run, so it gets no
    /// data.
    fn hw_counters(_scope: StatsScope) -> Option<&'static HwCounters> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Fills the values of the counters of `scope`, in the order
    /// [`Operations::hw_counters`] named them; returns how many it filled.
    fn get_hw_stats<'a>(
        _dev: &Device<Self>,
        _data: &Self::RegistrationData<'a>,
        _scope: StatsScope,
        _values: &mut HwStatsValues<'_>,
    ) -> Result<usize> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }
    // series: end stats

    // series: begin mr
    /// The driver's own uverbs methods and attributes
    /// ([`uapi_definitions!`](super::uverbs::uapi_definitions)).
    fn uapi_definitions() -> &'static UapiDefinitions {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }
    // series: end mr
}

/// Shorthand for the registration data of driver `T`.
pub(crate) type RegData<'a, T> = <T as Operations>::RegistrationData<'a>;

// series: begin ucontext
/// The user contexts of driver `D`.
pub(crate) type UContextOf<D> = Object<<D as Operations>::UContext>;
/// The protection domains of driver `D`.
pub(crate) type PdOf<D> = Object<<D as Operations>::Pd>;
// series: end ucontext
// series: begin cq
/// The completion queues of driver `D`.
pub(crate) type CqOf<D> = Object<<D as Operations>::Cq>;
// series: end cq
// series: begin qp
/// The queue pairs of driver `D`.
pub(crate) type QpOf<D> = Object<<D as Operations>::Qp>;
// series: end qp
// series: begin mmap
/// The mmap entries of objects of driver `D` being created.
pub(crate) type MmapSetOf<'a, D> = super::mmap::MmapSet<'a, <D as Operations>::MmapPrivate>;
// series: end mmap

/// The part of every device the C code sees, the same for every driver.
// out of tree: begin
/// It is `struct rust_rdma_device_head` of `include/rust/compat/rdma.h`.
// out of tree: end
#[repr(C)]
struct Head {
    ib: Opaque<bindings::ib_device>,
    // out of tree: begin
    /// The driver's functions behind the operations whose C prototypes have
    /// an enum, which the C functions in the operations table call (kCFI:
    /// see `include/rust/compat/rdma.h`). Written once, before the device is registered.
    enum_ops: *const bindings::rust_rdma_enum_ops,
    // out of tree: end
    // series: begin mr
    /// The driver type, so that a pointer the core hands a callback that is
    /// not tied to one driver can be checked ([`Device::from_raw_checked`]).
    driver: TypeId,
    // series: end mr
}

// out of tree: begin
// The C functions find `enum_ops` through `struct rust_rdma_device_head`.
kernel::static_assert!(
    core::mem::offset_of!(Head, ib) == core::mem::offset_of!(bindings::rust_rdma_device_head, ib)
);
kernel::static_assert!(
    core::mem::offset_of!(Head, enum_ops)
        == core::mem::offset_of!(bindings::rust_rdma_device_head, enum_ops)
);
// out of tree: end

// series: begin mr
impl Head {
    /// Whether the device at `ptr` is one of driver `T`.
    ///
    /// # Safety
    ///
    /// `ptr` points to the `ib_device` of a live `Device<U>`, for some `U`.
    unsafe fn is_of<T: 'static>(ptr: *mut bindings::ib_device) -> bool {
        // SAFETY: Every `Device<U>` starts with a `Head` (`#[repr(C)]`), whose
        // layout does not depend on `U`, and its `driver` is `U`'s type id
        // (the type invariant of `Device`).
        unsafe { (*ptr.cast::<Head>()).driver == TypeId::of::<T>() }
    }
}
// series: end mr

/// A device name, copied ([`Device::name`]).
#[derive(Clone, Copy)]
pub(crate) struct DeviceName {
    bytes: [u8; bindings::IB_DEVICE_NAME_MAX as usize],
    len: usize,
}

impl DeviceName {
    /// Copies the name `src` holds, up to its first NUL or the end of the
    /// array.
    ///
    /// # Safety
    ///
    /// `src` is valid for reads; its bytes may change meanwhile (a torn copy
    /// is the result, never a longer one).
    unsafe fn copy(
        src: *const [kernel::ffi::c_char; bindings::IB_DEVICE_NAME_MAX as usize],
    ) -> Self {
        let mut name = DeviceName {
            bytes: [0; bindings::IB_DEVICE_NAME_MAX as usize],
            len: 0,
        };
        for (i, out) in name.bytes.iter_mut().enumerate() {
            // SAFETY: `i` is within the array (the arrays have one length),
            // which is valid for reads; the byte is read once.
            let b = unsafe { core::ptr::read_volatile(src.cast::<u8>().add(i)) };
            if b == 0 {
                break;
            }
            *out = b;
            name.len = i + 1;
        }
        name
    }

    /// The name's bytes, without the terminating NUL.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl kernel::fmt::Display for DeviceName {
    fn fmt(&self, f: &mut kernel::fmt::Formatter<'_>) -> kernel::fmt::Result {
        self.as_bytes().iter().try_for_each(|&b| {
            let c = if b.is_ascii_graphic() { b as char } else { '?' };
            kernel::fmt::Write::write_char(f, c)
        })
    }
}

/// An RDMA device (`struct ib_device`) driven by `T`.
///
/// # Invariants
///
/// - `head.ib` is at offset 0 of an allocation of `size_of::<Self>()` bytes
///   made by `_ib_alloc_device()`; the reference count of the `ib_device`'s
///   `struct device` owns the allocation.
// series: begin mr
/// - `head.driver` is `TypeId::of::<T>()`.
// series: end mr
/// - `registration_data` is dangling while the device is not registered,
///   and points to the data owned by the live registration otherwise.
#[repr(C)]
pub(crate) struct Device<T: Operations> {
    head: Head,
    registration_data: UnsafeCell<NonNull<T::RegistrationData<'static>>>,
    _driver: PhantomData<T>,
}

impl<T: Operations> Device<T> {
    /// Initialises the Rust part of a device `_ib_alloc_device()` just
    /// allocated.
    ///
    /// # Safety
    ///
    /// `this` is a new, zeroed allocation of `size_of::<Self>()` bytes from
    /// `_ib_alloc_device()`, not yet visible to anyone else.
    // out of tree: begin
    /// `enum_ops` holds functions for devices of `T`.
    // out of tree: end
    pub(super) unsafe fn init(
        this: NonNull<Self>,
        // out of tree: begin
        enum_ops: &'static bindings::rust_rdma_enum_ops,
        // out of tree: end
    ) {
        const_assert!(
            core::mem::offset_of!(Self, head) == 0,
            "struct ib_device must be at offset 0"
        );
        let this = this.as_ptr();
        // SAFETY: Per the safety requirements, the fields are ours to write.
        unsafe {
            // out of tree: begin
            (&raw mut (*this).head.enum_ops).write(enum_ops);
            // out of tree: end
            // series: begin mr
            (&raw mut (*this).head.driver).write(TypeId::of::<T>());
            // series: end mr
            (&raw mut (*this).registration_data).write(UnsafeCell::new(NonNull::dangling()));
        }
    }

    /// The C `struct ib_device`.
    pub(crate) fn as_raw(&self) -> *mut bindings::ib_device {
        self.head.ib.get()
    }

    /// Borrows the device from its C pointer.
    ///
    /// # Safety
    ///
    /// `ptr` points to the `ib_device` of a live `Device<T>`.
    pub(super) unsafe fn from_raw<'a>(ptr: *mut bindings::ib_device) -> &'a Self {
        // SAFETY: The caller promises a `Device<T>`, whose `ib_device` is at
        // offset 0.
        unsafe { &*ptr.cast::<Self>() }
    }

    // series: begin mr
    /// Borrows the device from its C pointer if it is a device of `T`,
    /// `None` if it is one of another driver of the layer.
    ///
    /// # Safety
    ///
    /// `ptr` points to the `ib_device` of a live `Device<U>`, for some `U`.
    pub(super) unsafe fn from_raw_checked<'a>(ptr: *mut bindings::ib_device) -> Option<&'a Self> {
        // SAFETY: Per the safety requirements.
        let ours = unsafe { Head::is_of::<T>(ptr) };
        // SAFETY: `U`'s type id is `T`'s, so `U` is `T`.
        ours.then(|| unsafe { Self::from_raw(ptr) })
    }
    // series: end mr

    /// The device's name, e.g. `refa_0`: a copy, which a concurrent rename
    /// (`ib_device_rename()`, which udev asks for when the device appears)
    /// may have torn, but never longer than the core's limit.
    pub(crate) fn name(&self) -> DeviceName {
        // SAFETY: `name` is an array inside the live device, of the core's
        // length. A rename writes it under a lock of the core's that this
        // cannot take: `DeviceName::copy` reads each byte once, volatile,
        // and stops at the end of the array whatever the bytes are.
        unsafe { DeviceName::copy(&raw const (*self.as_raw()).name) }
    }

    /// Calls `f` with the device and the registration data.
    ///
    /// # Safety
    ///
    /// The device must be registered, which holds from the start of
    /// `ib_register_device()` to the end of `ib_unregister_device()`, the
    /// only span in which the core calls operations.
    pub(super) unsafe fn with_registration_data<R>(
        &self,
        f: impl for<'a> FnOnce(&Self, &'a T::RegistrationData<'a>) -> R,
    ) -> R {
        // SAFETY: Registered, so the pointer is valid (type invariant). The
        // higher-ranked closure keeps the erased lifetime from escaping.
        let data = unsafe {
            (*self.registration_data.get())
                .cast::<T::RegistrationData<'_>>()
                .as_ref()
        };
        f(self, data)
    }

    /// Sets the registration data before the device is registered, or (with
    /// `None`) clears it after it is unregistered.
    ///
    /// # Safety
    ///
    /// No operation runs: the device is not registered. A pointer set must
    /// be valid until it is cleared.
    pub(super) unsafe fn set_registration_data(
        &self,
        data: Option<NonNull<T::RegistrationData<'static>>>,
    ) {
        // SAFETY: Nothing reads the field concurrently (no operation runs).
        unsafe { *self.registration_data.get() = data.unwrap_or(NonNull::dangling()) };
    }
}

// SAFETY: The `ib_device` is reference counted through its `struct device`:
// `get_device()` takes a reference, `put_device()` drops one and frees the
// device (through the core's release function) with the last one.
unsafe impl<T: Operations> AlwaysRefCounted for Device<T> {
    fn inc_ref(&self) {
        // SAFETY: `self` is live, so its reference count is not zero.
        unsafe { bindings::ib_device_get(self.as_raw()) };
    }

    unsafe fn dec_ref(obj: NonNull<Self>) {
        // SAFETY: The caller owns a reference, which this gives up.
        unsafe { bindings::ib_device_put(obj.cast().as_ptr()) };
    }
}

// SAFETY: The core synchronises access to the `ib_device`; the registration
// data pointer changes only while no operation can run.
unsafe impl<T: Operations> Send for Device<T> {}
// SAFETY: As for `Send`; operations only get shared references.
unsafe impl<T: Operations> Sync for Device<T> {}

// series: begin ucontext
/// The kinds of objects userspace creates in a device.
pub(crate) mod kind {
    use super::bindings;

    mod private {
        pub(crate) trait Sealed {}
    }

    /// A kind of core object: its C type.
    pub(crate) trait Kind: private::Sealed + Send + Sync + 'static {
        /// The C object (`struct ib_pd`, ...).
        type Raw;

        /// The device of a C object.
        ///
        /// # Safety
        ///
        /// `raw` points to a live object of the kind whose `device` the core
        /// set.
        unsafe fn device(raw: *const Self::Raw) -> *mut bindings::ib_device;
    }

    macro_rules! kinds {
        ($($(#[$doc:meta])* $name:ident => $raw:ident;)+) => {
            $(
                $(#[$doc])*
                pub(crate) enum $name {}

                impl private::Sealed for $name {}

                impl Kind for $name {
                    type Raw = bindings::$raw;

                    unsafe fn device(raw: *const Self::Raw) -> *mut bindings::ib_device {
                        // SAFETY: Per the safety requirements.
                        unsafe { (*raw).device }
                    }
                }
            )+
        };
    }

    kinds! {
        /// User contexts (`struct ib_ucontext`).
        UContext => ib_ucontext;
        /// Protection domains (`struct ib_pd`).
        Pd => ib_pd;
        // series: begin cq
        /// Completion queues (`struct ib_cq`).
        Cq => ib_cq;
        // series: end cq
        // series: begin ah
        /// Address handles (`struct ib_ah`).
        Ah => ib_ah;
        // series: end ah
        // series: begin mr
        /// Memory regions (`struct ib_mr`).
        Mr => ib_mr;
        // series: end mr
        // series: begin qp
        /// Queue pairs (`struct ib_qp`).
        Qp => ib_qp;
        // series: end qp
        // series: begin comp_cntr
        /// Completion counters (`struct ib_comp_cntr`).
        CompCntr => ib_comp_cntr;
        // series: end comp_cntr
    }
}

use kind::Kind;

/// The driver's data of a core object: of which driver, of which kind.
///
/// Each kind has a trait of its own beside its object, with what the driver
/// does for it (`DriverPd` in [`super::pd`], ...).
pub(crate) trait DriverObject: Send + Sync + Sized + 'static {
    /// The driver.
    type Driver: Operations;
    /// The kind of object.
    type Kind: Kind;
}

/// What the layer keeps for an object.
pub(super) struct Layer {
    // series: begin mmap
    /// Its mmap entries, withdrawn when it is destroyed.
    pub(super) mappings: Mappings,
    // series: end mmap
    // series: begin cq
    /// Its place in a table of CQs taking completion events.
    pub(super) events: Option<Registered>,
    // series: end cq
}

impl Layer {
    /// The layer's part of a new object: what a creation then gives it is
    /// set in place ([`NewObject::init`] returns it).
    pub(super) fn new() -> Self {
        Self {
            // series: begin mmap
            mappings: Mappings::new(),
            // series: end mmap
            // series: begin cq
            events: None,
            // series: end cq
        }
    }
}

/// The memory of an object being created: the core set up the C object,
/// the layer's part and the driver's data are still to be initialised.
///
/// # Invariants
///
/// `ptr` is the start of an allocation of `size_of::<Object<T>>()` bytes for
/// a device of `T::Driver`, whose layer's part and driver's data are
/// uninitialised, stay in place until a destroy drops them, and nobody else
/// uses before the creation returns (`'a`).
pub(super) struct NewObject<'a, T: DriverObject> {
    ptr: NonNull<<T::Kind as Kind>::Raw>,
    _object: PhantomData<&'a mut Object<T>>,
}

impl<'a, T: DriverObject> NewObject<'a, T> {
    /// The object at `ptr`, being created.
    ///
    /// # Safety
    ///
    /// `ptr` is as the type invariants say, for `'a`.
    pub(super) unsafe fn new(ptr: NonNull<<T::Kind as Kind>::Raw>) -> Self {
        const_assert!(
            core::mem::offset_of!(Object<T>, ib) == 0,
            "the C object must be at offset 0"
        );
        // The core allocates with kmalloc(), which aligns to 8 bytes.
        const_assert!(core::mem::align_of::<Object<T>>() <= 8);
        // INVARIANT: Per the safety requirements.
        Self {
            ptr,
            _object: PhantomData,
        }
    }

    /// Initialises the layer's part and the driver's data; returns the
    /// layer's part, for the rest of the creation.
    pub(super) fn init(self, layer: Layer, data: impl PinInit<T>) -> &'a mut Layer {
        let this = self.ptr.as_ptr().cast::<Object<T>>();
        // SAFETY: The fields are uninitialised, ours to write, and stay in
        // place (type invariants); the data's initialiser cannot fail.
        unsafe {
            (&raw mut (*this).layer).write(layer);
            let Ok(()) = pin_init::raw_try_init(&raw mut (*this).data, data);
        }
        // SAFETY: Initialised just above, and nobody else uses it during `'a`
        // (type invariants).
        unsafe { &mut (*this).layer }
    }
}

/// A core object with the driver's data `T`.
///
/// # Invariants
///
/// `ib` is at offset 0 of an allocation the core (or, for MRs, the layer)
/// made with `size_of::<Self>()` bytes for a device of `T::Driver`; `layer`
/// and `data` are initialised from the end of a successful creation until
/// the destroy drops them, and `data` does not move meanwhile.
#[repr(C)]
pub(crate) struct Object<T: DriverObject> {
    ib: Opaque<<T::Kind as Kind>::Raw>,
    layer: Layer,
    data: T,
}

impl<T: DriverObject> Object<T> {
    /// The driver's data.
    pub(crate) fn data(&self) -> Pin<&T> {
        // SAFETY: The data is initialised in place and dropped in place: it
        // never moves while the object lives (type invariant).
        unsafe { Pin::new_unchecked(&self.data) }
    }

    /// The C object.
    pub(crate) fn as_raw(&self) -> *mut <T::Kind as Kind>::Raw {
        self.ib.get()
    }

    // series: begin mmap
    /// Takes the object's mmap cookies away from userspace now rather than
    /// when it is destroyed (a driver that must know, before it destroys the
    /// object on the device, whether mappings are left: entries without
    /// mappings are freed, and their tokens handed to
    /// [`Operations::mmap_free`], before this returns).
    pub(crate) fn withdraw_mappings(&self) {
        self.layer.mappings.withdraw();
    }
    // series: end mmap

    /// Borrows the object from its C pointer.
    ///
    /// # Safety
    ///
    /// `ptr` points to the C object of a live, initialised `Object<T>`.
    pub(super) unsafe fn from_raw<'a>(ptr: *mut <T::Kind as Kind>::Raw) -> &'a Self {
        // SAFETY: The C object is at offset 0; liveness is the caller's
        // promise.
        unsafe { &*ptr.cast::<Self>() }
    }

    // series: begin cq
    /// Takes a CQ out of its table of CQs taking completion events, so that
    /// no event reaches it any more: the first step of its destroy.
    ///
    /// # Safety
    ///
    /// [`NewObject::init`] initialised `ptr`; called from its destroy, which the
    /// core runs once, exclusively.
    pub(super) unsafe fn leave_events(ptr: *mut <T::Kind as Kind>::Raw) {
        // SAFETY: Per the safety requirements, the layer is initialised and
        // nobody else uses it.
        drop(unsafe { (*ptr.cast::<Self>()).layer.events.take() });
    }
    // series: end cq

    /// Drops the layer's part (taking the object out of its table of CQs,
    /// withdrawing its mmap entries) and, if `data` says so, the driver's
    /// data: the end of a destroy. (Destroys take CQs out of their tables
    /// before the driver destroys them, with [`Object::leave_events`].)
    ///
    /// # Safety
    ///
    /// [`NewObject::init`] initialised `ptr`, and nothing uses the object any
    /// more; the core frees it after this. If `data` is `false`, the driver's
    /// data was moved out.
    pub(super) unsafe fn drop_in_place(ptr: *mut <T::Kind as Kind>::Raw, data: bool) {
        let this = ptr.cast::<Self>();
        // SAFETY: Per the safety requirements, both are initialised and used
        // by nobody; the layer goes first (events stop, cookies go).
        unsafe {
            core::ptr::drop_in_place(&raw mut (*this).layer);
            if data {
                core::ptr::drop_in_place(&raw mut (*this).data);
            }
        }
    }

    // series: begin mr
    /// Moves the driver's data out of the object (for kinds whose destroy
    /// hands it to the driver by value).
    ///
    /// # Safety
    ///
    /// [`NewObject::init`] initialised `ptr`, and `T` is [`Unpin`] (the data may
    /// move); the object is dropped with `data == false` afterwards.
    pub(super) unsafe fn take_data(ptr: *mut <T::Kind as Kind>::Raw) -> T {
        // SAFETY: Per the safety requirements.
        unsafe { (&raw const (*ptr.cast::<Self>()).data).read() }
    }
    // series: end mr

    /// Calls `f` with the device of the object and its registration data.
    ///
    /// # Safety
    ///
    /// `ptr` is a live object whose device the core set, called from an
    /// operation (so the device is registered).
    pub(super) unsafe fn with_driver<R>(
        ptr: *mut <T::Kind as Kind>::Raw,
        f: impl for<'a> FnOnce(
            &Device<T::Driver>,
            &'a <T::Driver as Operations>::RegistrationData<'a>,
        ) -> R,
    ) -> R {
        // SAFETY: Per the safety requirements, the device is a live,
        // registered device of `T::Driver` (only its table creates objects of
        // `T`).
        unsafe { Device::<T::Driver>::from_raw(T::Kind::device(ptr)).with_registration_data(f) }
    }
}
// series: end ucontext

#[kunit_tests(refa_rdma_device)]
mod tests {
    use super::*;

    // series: begin mr
    /// A method the core calls for any device of the layer (a driver's
    /// uverbs method) tells a device of another driver type from one of its
    /// own, whatever the two types share.
    #[test]
    fn a_device_of_another_driver_is_not_taken_for_ours() -> Result {
        struct Ours;
        struct Theirs;
        let head = KBox::new(
            Head {
                ib: Opaque::zeroed(),
                // out of tree: begin
                enum_ops: core::ptr::null(),
                // out of tree: end
                driver: TypeId::of::<Theirs>(),
            },
            GFP_KERNEL,
        )?;
        let ptr = head.ib.get();
        // SAFETY: `ptr` is the `ib_device` of a live `Head`, as every device
        // of the layer starts.
        let (theirs, ours) = unsafe { (Head::is_of::<Theirs>(ptr), Head::is_of::<Ours>(ptr)) };
        assert!(theirs);
        assert!(!ours);
        Ok(())
    }
    // series: end mr

    /// A name with no NUL in the core's array is cut at its end: a copy is
    /// never longer than the core's limit, whatever a concurrent rename
    /// leaves in the array.
    #[test]
    fn device_names_are_bounded_copies() {
        const LEN: usize = bindings::IB_DEVICE_NAME_MAX as usize;
        let mut raw = [b'x' as kernel::ffi::c_char; LEN];
        // SAFETY: `raw` is a readable array of the core's length.
        let name = unsafe { DeviceName::copy(&raw) };
        assert_eq!(name.as_bytes().len(), LEN);
        for (out, b) in raw.iter_mut().zip(b"refa_0\0") {
            *out = *b as kernel::ffi::c_char;
        }
        // SAFETY: As above.
        let name = unsafe { DeviceName::copy(&raw) };
        assert_eq!(name.as_bytes(), b"refa_0");
    }
}
