// SPDX-License-Identifier: GPL-2.0

//! RDMA devices: `struct ib_device`, its registration and its operations.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h)
//!
//! A driver implements [`Operations`]; [`Device::new`] allocates the
//! `ib_device` (with the C object at offset 0, as `ib_alloc_device()` wants)
//! and [`Registration::new`] makes it visible to the RDMA core and to
//! userspace. Dropping the [`Registration`] unregisters the device: the core
//! then destroys every user object still open (the uverbs disassociate
//! model) and calls no operation any more, so the data handed to
//! [`Registration::new`] lives exactly as long as the operations can see it.

use super::bindings;
use super::{
    ah::{
        Ah,
        AhAttr, //
    },
    comp_cntr::{
        CompCntr,
        CompCntrAttrs,
        CompCntrCaps,
        CompCntrEntry,
        CompCntrModifyOp,
        QpCounterOps, //
    },
    cq::{
        Cq,
        CqBuffer,
        CqEvents,
        CqInitAttr, //
    },
    mmap,
    mr::{
        DmabufMrRequest,
        Mr,
        MrInterconnects,
        MrKeys,
        MrRequest, //
    },
    pd::Pd,
    qp::{
        Qp,
        QpAttr,
        QpInitAttr,
        QpQuery, //
    },
    stats::{
        HwCounters,
        HwStatsValues,
        StatsScope, //
    },
    ucontext::UContext,
    udata::UData,
    verbs::{
        DeviceAttr,
        Gid,
        LinkLayer,
        PortAttr,
        PortImmutable, //
    }, //
};
use core::{
    cell::UnsafeCell,
    marker::PhantomData,
    ptr::NonNull, //
};
use kernel::{
    device,
    prelude::*,
    sync::Arc,
    types::Opaque, //
};

/// Identifies the driver to rdma-core (`enum rdma_driver_id`), which picks
/// its userspace provider by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum DriverId {
    /// The Elastic Fabric Adapter (rdma-core's `efa` provider).
    Efa = bindings::rdma_driver_id_RDMA_DRIVER_EFA,
}

/// The operations of an RDMA device driver.
///
/// Only the operations a driver implements are set in the `ib_device_ops`
/// table the core sees; the core treats the others as unsupported.
///
/// Every operation runs in process context and may sleep, between
/// [`Registration::new`] and the drop of the [`Registration`]; operations
/// run concurrently with each other.
#[vtable]
pub(crate) trait Operations: Sized + Send + Sync + 'static {
    /// Data owned by the [`Registration`] and handed to every operation.
    ///
    /// The lifetime is that of the registration, which lives within the
    /// binding of the parent bus device, so it can hold references to
    /// resources of that binding (BAR mappings, the bound PCI device).
    type RegistrationData<'a>: Send + Sync + 'a
    where
        Self: 'a;

    /// The driver's part of a user context (`struct ib_ucontext`).
    type UContext: Send + Sync;

    /// The driver's part of a protection domain (`struct ib_pd`).
    type Pd: Send + Sync;

    /// The driver's part of a completion queue (`struct ib_cq`).
    type Cq: Send + Sync;

    /// The driver's part of an address handle (`struct ib_ah`).
    type Ah: Send + Sync;

    /// The driver's part of a memory region (`struct ib_mr`).
    type Mr: Send + Sync;

    /// The driver's part of a queue pair (`struct ib_qp`).
    type Qp: Send + Sync;

    /// The driver's part of a completion counter (`struct ib_comp_cntr`).
    type CompCntr: Send + Sync;

    /// A token the driver gives an mmap entry
    /// ([`MmapEntry::insert_with_private`](super::mmap::MmapEntry::insert_with_private)),
    /// handed back to [`Operations::mmap_free`] when the entry is freed.
    type MmapPrivate: Send + Sync + 'static;

    /// The driver id rdma-core matches its provider by.
    const DRIVER_ID: DriverId;

    /// The uverbs ABI version of the driver's uAPI.
    const ABI_VERSION: u32;

    /// Reports the device's attributes, and driver-specific ones through
    /// `udata` when userspace asks for them.
    fn query_device<'a>(
        _reg: &RegData<'a, Self>,
        _attr: &mut DeviceAttr,
        _udata: &mut UData<'_>,
    ) -> Result {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Reports the attributes of port `port` (1-based).
    fn query_port<'a>(_reg: &RegData<'a, Self>, _port: u32, _attr: &mut PortAttr) -> Result {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// The data rate of port `port`, in units of 100 Mb/s (the core's
    /// `QUERY_PORT_SPEED` method).
    fn query_port_speed<'a>(_reg: &RegData<'a, Self>, _port: u32) -> Result<u64> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Reports what never changes about port `port`.
    fn get_port_immutable<'a>(_reg: &RegData<'a, Self>, _port: u32) -> Result<PortImmutable> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// The link layer of port `port`.
    fn get_link_layer<'a>(_reg: &RegData<'a, Self>, _port: u32) -> LinkLayer {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Entry `index` of port `port`'s GID table.
    fn query_gid<'a>(_reg: &RegData<'a, Self>, _port: u32, _index: u32) -> Result<Gid> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Entry `index` of port `port`'s P_Key table.
    fn query_pkey<'a>(_reg: &RegData<'a, Self>, _port: u32, _index: u16) -> Result<u16> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Creates the driver's part of a new user context.
    ///
    /// `udata` carries the driver's request and response. The context is
    /// dropped after [`Operations::dealloc_ucontext`].
    fn alloc_ucontext<'a>(
        reg: &RegData<'a, Self>,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self::UContext, Error>>;

    /// Releases what the driver's part of a user context holds on the
    /// device. Called once, before the context is dropped; objects created
    /// in the context are all gone by then.
    fn dealloc_ucontext<'a>(reg: &RegData<'a, Self>, ctx: &UContext<Self>);

    /// Creates the driver's part of a new protection domain; `udata`
    /// carries the driver's request and response (none for kernel
    /// callers). The PD is dropped after [`Operations::dealloc_pd`].
    fn alloc_pd<'a>(
        reg: &RegData<'a, Self>,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self::Pd, Error>>;

    /// Releases what the driver's part of a protection domain holds on the
    /// device. Called once, before the PD is dropped; objects using the PD
    /// are all gone by then. The core cannot keep a PD the driver failed to
    /// release: report failures, there is no error to return.
    fn dealloc_pd<'a>(reg: &RegData<'a, Self>, pd: &Pd<Self>, udata: &mut UData<'_>);

    /// Creates the driver's part of a new completion queue in user context
    /// `ctx`, as `attr` asks, with its ring in `buffer` if userspace passed
    /// one; `udata` carries the driver's request and response. Returns the
    /// number of entries the CQ really has with the initialiser. The CQ is
    /// dropped after [`Operations::destroy_cq`].
    fn create_cq<'a>(
        reg: &RegData<'a, Self>,
        ctx: &UContext<Self>,
        attr: &CqInitAttr,
        buffer: &CqBuffer<'_>,
        udata: &mut UData<'_>,
    ) -> Result<(u32, impl PinInit<Self::Cq, Error>)>;

    /// Where the completion events of a new CQ go: the device's table and
    /// the key the driver's interrupt handler will look the CQ up by, or
    /// `None` if it takes no events. Asked once, right after a successful
    /// [`Operations::create_cq`].
    fn cq_events<'a>(_reg: &RegData<'a, Self>, _cq: &Self::Cq) -> Option<(Arc<CqEvents>, u32)> {
        None
    }

    /// The interconnects through which the device reaches memory region
    /// `mr` (the efa uAPI's MR query method, offered when this is
    /// implemented; the driver also invokes
    /// [`mr_query_method!`](super::mr::mr_query_method)).
    fn query_mr<'a>(_reg: &RegData<'a, Self>, _mr: &Self::Mr) -> Result<MrInterconnects> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Releases what the driver's part of a completion queue holds on the
    /// device. Called once, before the CQ is dropped; no QP uses it any
    /// more. There is no error to return: the core forgets the CQ anyway.
    fn destroy_cq<'a>(reg: &RegData<'a, Self>, cq: &Cq<Self>, udata: &mut UData<'_>);

    /// An mmap entry inserted with `private` was freed: it was withdrawn
    /// and the last mapping made with it is gone. May sleep; the core may
    /// hold the lock of the unmapping process's mm and the uverbs file's
    /// mapping lock, so the driver must not touch user memory here.
    fn mmap_free<'a>(_reg: &RegData<'a, Self>, _private: Self::MmapPrivate) {}

    /// Told when userspace's `mmap()` of a context of the device failed
    /// (an unknown cookie, a wrong length, no memory), for the driver's
    /// statistics.
    fn mmap_failed<'a>(_reg: &RegData<'a, Self>, _err: Error) {}

    /// The counters of `scope`, if it has any. Called when the device is
    /// registered, before any operation may run, so it gets no data.
    fn hw_counters(_scope: StatsScope) -> Option<&'static HwCounters> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Fills the values of the counters of `scope`, in the order
    /// [`Operations::hw_counters`] named them; returns how many it filled.
    fn get_hw_stats<'a>(
        _reg: &RegData<'a, Self>,
        _scope: StatsScope,
        _values: &mut HwStatsValues<'_>,
    ) -> Result<usize> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Creates the driver's part of a new address handle for `attr` in
    /// protection domain `pd`; `udata` carries the driver's request and
    /// response. Called only where the caller may sleep. The AH is dropped
    /// after [`Operations::destroy_ah`].
    fn create_ah<'a>(
        reg: &RegData<'a, Self>,
        pd: &Pd<Self>,
        attr: &AhAttr,
        udata: &mut UData<'_>,
    ) -> Result<impl PinInit<Self::Ah, Error>>;

    /// Releases what the driver's part of an address handle holds on the
    /// device. Called once, where the caller may sleep, before the AH is
    /// dropped. There is no error to return: the core forgets the AH.
    fn destroy_ah<'a>(reg: &RegData<'a, Self>, ah: &Ah<Self>);

    /// Registers user memory as `req` asks, in protection domain `pd`;
    /// `udata` carries the driver's request and response. Returns the keys
    /// the device gave the region and the driver's data, which comes back
    /// to [`Operations::dereg_mr`].
    fn reg_user_mr<'a>(
        reg: &RegData<'a, Self>,
        pd: &Pd<Self>,
        req: &MrRequest,
        udata: &mut UData<'_>,
    ) -> Result<(MrKeys, Self::Mr)>;

    /// Registers part of a dma-buf as `req` asks, in protection domain
    /// `pd`, as [`Operations::reg_user_mr`] does user memory.
    fn reg_user_mr_dmabuf<'a>(
        _reg: &RegData<'a, Self>,
        _pd: &Pd<Self>,
        _req: &DmabufMrRequest,
        _udata: &mut UData<'_>,
    ) -> Result<(MrKeys, Self::Mr)> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Deregisters a memory region; `mr` is the driver's data, given back.
    /// Called once. There is no error to return: the core forgets the
    /// region, so the driver keeps (rather than drops) whatever the device
    /// may still use.
    fn dereg_mr<'a>(reg: &RegData<'a, Self>, mr: Self::Mr, udata: &mut UData<'_>);

    /// Creates the driver's part of a new queue pair in user context `ctx`
    /// and protection domain `pd`, as `attr` asks; `udata` carries the
    /// driver's request and response. Returns the QP number with the
    /// initialiser. The QP is dropped after [`Operations::destroy_qp`].
    fn create_qp<'a>(
        reg: &RegData<'a, Self>,
        ctx: &UContext<Self>,
        pd: &Pd<Self>,
        attr: &QpInitAttr<'_, Self>,
        udata: &mut UData<'_>,
    ) -> Result<(u32, impl PinInit<Self::Qp, Error>)>;

    /// Changes the attributes of `qp` named in `mask` (`enum
    /// ib_qp_attr_mask`) to those of `attr`. The driver checks the state
    /// machine and refuses attributes it does not support.
    fn modify_qp<'a>(
        reg: &RegData<'a, Self>,
        qp: &Qp<Self>,
        attr: &QpAttr<'_>,
        mask: u32,
        udata: &mut UData<'_>,
    ) -> Result;

    /// Reports the attributes of `qp`; `mask` says which the caller wants.
    fn query_qp<'a>(reg: &RegData<'a, Self>, qp: &Qp<Self>, mask: u32) -> Result<QpQuery>;

    /// Releases what the driver's part of a queue pair holds on the
    /// device. Called once, before the QP is dropped. There is no error to
    /// return: the core forgets the QP anyway.
    fn destroy_qp<'a>(reg: &RegData<'a, Self>, qp: &Qp<Self>, udata: &mut UData<'_>);

    /// What the device offers of completion counters.
    fn query_comp_cntr_caps<'a>(_reg: &RegData<'a, Self>) -> Result<CompCntrCaps> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Creates the driver's part of a new completion counter in user
    /// context `ctx`, from the attributes of the call. Completion counters
    /// are offered when this is implemented, with
    /// [`Operations::destroy_comp_cntr`],
    /// [`Operations::qp_attach_comp_cntr`] and
    /// [`Operations::query_comp_cntr_caps`].
    fn create_comp_cntr<'a>(
        _reg: &RegData<'a, Self>,
        _ctx: &UContext<Self>,
        _attrs: &CompCntrAttrs<'_>,
    ) -> Result<Self::CompCntr> {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Releases a completion counter; `cc` is the driver's data, given
    /// back. Called once, when no QP uses the counter. There is no error to
    /// return: the driver keeps (rather than drops) whatever the device may
    /// still write to.
    fn destroy_comp_cntr<'a>(_reg: &RegData<'a, Self>, _cc: Self::CompCntr) {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Sets or adds to one value of a completion counter.
    fn modify_comp_cntr<'a>(
        _reg: &RegData<'a, Self>,
        _cc: &Self::CompCntr,
        _entry: CompCntrEntry,
        _op: CompCntrModifyOp,
        _value: u64,
    ) -> Result {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }

    /// Makes a completion counter count operations `ops` of `qp`, which
    /// counts none of them yet (the core checks): all of them or, on
    /// failure, none. The attachment ends with the QP.
    fn qp_attach_comp_cntr<'a>(
        _reg: &RegData<'a, Self>,
        _qp: &Qp<Self>,
        _cc: &Self::CompCntr,
        _ops: QpCounterOps,
    ) -> Result {
        build_error!(kernel::error::VTABLE_DEFAULT_ERROR)
    }
}

/// The C `struct device` of a driver-model device.
///
/// `kernel::device::Device::as_raw()` is private to the kernel crate, so an
/// out-of-tree module takes the address instead; in tree this would be
/// `as_raw()`.
pub(crate) fn raw_device<Ctx: device::DeviceContext>(
    dev: &device::Device<Ctx>,
) -> *mut bindings::device {
    // `Device` is `#[repr(transparent)]` over `Opaque<struct device>`, itself
    // transparent over the C structure, so the addresses coincide. The cast
    // goes to the bindings' own copy of `struct device`, the same C type.
    core::ptr::from_ref(dev).cast_mut().cast()
}

/// Shorthand for the registration data of an [`Operations`] implementation.
pub(crate) type RegData<'a, O> = <O as Operations>::RegistrationData<'a>;

/// An RDMA device (`struct ib_device`) driven by `O`.
///
/// # Invariants
///
/// - `ib` is at offset 0 and was allocated by `_ib_alloc_device()` with the
///   size of `Self`; the `ib_device` reference count owns the allocation.
/// - `registration_data` is dangling while the device is not registered,
///   and points to the data owned by the live [`Registration`] otherwise.
#[repr(C)]
pub(crate) struct Device<O: Operations> {
    ib: Opaque<bindings::ib_device>,
    registration_data: UnsafeCell<NonNull<O::RegistrationData<'static>>>,
    _ops: PhantomData<O>,
}

impl<O: Operations> Device<O> {
    /// Allocates an unregistered device; the caller owns the allocation's
    /// reference and must release it with `ib_dealloc_device()`.
    fn alloc() -> Result<NonNull<Self>> {
        const_assert!(
            core::mem::offset_of!(Self, ib) == 0,
            "struct ib_device must be at offset 0"
        );
        // SAFETY: `_ib_alloc_device` accepts any size of at least
        // `sizeof(struct ib_device)`; a null namespace means the initial one.
        let raw = unsafe {
            bindings::_ib_alloc_device(core::mem::size_of::<Self>(), core::ptr::null_mut())
        };
        let this = NonNull::new(raw.cast::<Self>()).ok_or(ENOMEM)?;
        // SAFETY: The allocation is `size_of::<Self>()` bytes, zeroed and
        // aligned for `ib_device`, whose alignment `Self` shares (the other
        // fields are pointers). Writing the field initialises it.
        unsafe {
            (&raw mut (*this.as_ptr()).registration_data)
                .write(UnsafeCell::new(NonNull::dangling()))
        };
        Ok(this)
    }

    /// The C `struct ib_device`.
    pub(crate) fn as_raw(&self) -> *mut bindings::ib_device {
        self.ib.get()
    }

    /// Borrows the device from its C pointer.
    ///
    /// # Safety
    ///
    /// `ptr` must point to the `ib_device` of a live `Device<O>`.
    pub(crate) unsafe fn from_raw<'a>(ptr: *mut bindings::ib_device) -> &'a Self {
        // SAFETY: The caller promises a `Device<O>`, whose `ib` is at offset 0.
        unsafe { &*ptr.cast::<Self>() }
    }

    /// The device's name, e.g. `refa_0`, once registered.
    pub(crate) fn name(&self) -> &CStr {
        // SAFETY: `name` is a NUL-terminated array inside the live device;
        // the core sets it once at registration and never after.
        unsafe { CStr::from_char_ptr((*self.as_raw()).name.as_ptr()) }
    }

    /// Calls `f` with the registration data.
    ///
    /// # Safety
    ///
    /// The device must be registered, which holds from the start of
    /// `ib_register_device()` to the end of `ib_unregister_device()`, the
    /// only span in which the core calls operations.
    pub(super) unsafe fn with_registration_data<R>(
        &self,
        f: impl for<'a> FnOnce(&'a O::RegistrationData<'a>) -> R,
    ) -> R {
        // SAFETY: Registered, so the pointer is valid (type invariant). The
        // higher-ranked closure keeps the erased lifetime from escaping.
        let data = unsafe {
            (*self.registration_data.get())
                .cast::<O::RegistrationData<'_>>()
                .as_ref()
        };
        f(data)
    }
}

// SAFETY: The core synchronises access to the `ib_device`; the registration
// data pointer only changes while no operation can run.
unsafe impl<O: Operations> Send for Device<O> {}
// SAFETY: As for `Send`; operations only get shared references.
unsafe impl<O: Operations> Sync for Device<O> {}

/// A registered RDMA device.
///
/// Owns the device allocation and the registration data the operations
/// see. Dropping it unregisters the device, which destroys every remaining
/// user object and waits until no operation runs; then the data and the
/// device are freed.
///
/// # Invariants
///
/// `dev` is registered, and this owns the reference `_ib_alloc_device()`
/// returned for it.
pub(crate) struct Registration<'a, O: Operations> {
    dev: NonNull<Device<O>>,
    _data: Pin<KBox<O::RegistrationData<'a>>>,
}

impl<'a, O: Operations> Registration<'a, O> {
    /// Allocates a device and registers it as `name` (a pattern such as
    /// `c"refa_%d"`) with DMA done by `parent`, handing `data` to every
    /// operation. `setup` sets what the driver decides about the device
    /// before the core sees it.
    ///
    /// `parent` must stay bound as long as the registration lives, which
    /// its lifetime ensures.
    pub(crate) fn new(
        parent: &'a device::Device<device::Bound>,
        name: &'static CStr,
        data: impl PinInit<O::RegistrationData<'a>, Error>,
        setup: impl FnOnce(&mut DeviceSetup<'_>),
    ) -> Result<Self> {
        let data = KBox::pin_init(data, GFP_KERNEL)?;
        let ptr: NonNull<O::RegistrationData<'static>> =
            NonNull::from(Pin::get_ref(data.as_ref())).cast();
        let dev = Device::<O>::alloc()?;
        // SAFETY: Just allocated, so the pointer is valid.
        let raw = unsafe { dev.as_ref() }.as_raw();
        // SAFETY: Not registered, so nothing else reads or writes the device
        // fields set here.
        unsafe {
            *(*dev.as_ptr()).registration_data.get() = ptr;
            (*raw).__bindgen_anon_1.dev.parent = raw_device(parent);
            (*raw).node_type = bindings::RDMA_NODE_UNSPECIFIED as u8;
            (*raw).phys_port_cnt = 1;
            (*raw).num_comp_vectors = 1;
            // The driver's own uverbs methods and attributes: the efa
            // uAPI's MR query and completion counter memory.
            if O::HAS_QUERY_MR || O::HAS_CREATE_COMP_CNTR {
                (*raw).driver_def = (&raw const bindings::refa_efa_uapi_defs).cast();
            }
            setup(&mut DeviceSetup { raw: &mut *raw });
            bindings::ib_set_device_ops(raw, &OperationsVTable::<O>::VTABLE);
        }
        // SAFETY: The device is fully set up; `name` is a valid pattern and
        // `parent` a bound device that can do DMA.
        let ret =
            unsafe { bindings::ib_register_device(raw, name.as_char_ptr(), raw_device(parent)) };
        if ret != 0 {
            // SAFETY: Registration failed, so no operation runs any more and
            // this is the only reference to the allocation.
            unsafe { bindings::ib_dealloc_device(raw) };
            return Err(Error::from_errno(ret));
        }
        // INVARIANT: Registered, and the allocation's reference is ours.
        Ok(Self { dev, _data: data })
    }

    /// The registered device.
    pub(crate) fn device(&self) -> &Device<O> {
        // SAFETY: The allocation lives as long as `self` (type invariant).
        unsafe { self.dev.as_ref() }
    }
}

impl<O: Operations> Drop for Registration<'_, O> {
    fn drop(&mut self) {
        let raw = self.device().as_raw();
        // SAFETY: Registered (type invariant). After this returns no
        // operation runs and none will; user objects are all destroyed.
        unsafe { bindings::ib_unregister_device(raw) };
        // SAFETY: Nothing reads the pointer any more.
        unsafe { *self.device().registration_data.get() = NonNull::dangling() };
        // SAFETY: Unregistered; this drops the allocation's reference, the
        // last one the driver holds. `self.dev` is not used after this.
        unsafe { bindings::ib_dealloc_device(raw) };
        // The registration data is dropped after this, when no operation
        // can see it.
    }
}

// SAFETY: The registration only holds the device and the data, both of
// which may be used and released from any thread.
unsafe impl<O: Operations> Send for Registration<'_, O> where for<'b> O::RegistrationData<'b>: Send {}
// SAFETY: Shared access only reads the device pointer.
unsafe impl<O: Operations> Sync for Registration<'_, O> where for<'b> O::RegistrationData<'b>: Sync {}

/// Device fields a driver sets before registration.
pub(crate) struct DeviceSetup<'a> {
    raw: &'a mut bindings::ib_device,
}

impl DeviceSetup<'_> {
    /// Number of completion vectors userspace may pick from.
    pub(crate) fn set_num_comp_vectors(&mut self, n: u32) {
        self.raw.num_comp_vectors = n.try_into().unwrap_or(i32::MAX);
    }

    /// The node GUID. The core reports the field's bytes as they are
    /// (`__be64`); `guid` is stored unconverted, as the EFA device's
    /// attribute, which already is in that byte order.
    pub(crate) fn set_node_guid(&mut self, guid: u64) {
        self.raw.node_guid = guid;
    }
}

/// The `ib_device_ops` table of an [`Operations`] implementation.
struct OperationsVTable<O: Operations>(PhantomData<O>);

impl<O: Operations> OperationsVTable<O> {
    const VTABLE: bindings::ib_device_ops = bindings::ib_device_ops {
        owner: kernel::module::this_module::<crate::LocalModule>()
            .as_ptr()
            .cast(),
        driver_id: O::DRIVER_ID as u32,
        uverbs_abi_ver: O::ABI_VERSION,
        query_device: if O::HAS_QUERY_DEVICE {
            Some(Self::query_device)
        } else {
            None
        },
        query_port: if O::HAS_QUERY_PORT {
            Some(Self::query_port)
        } else {
            None
        },
        query_port_speed: if O::HAS_QUERY_PORT_SPEED {
            Some(Self::query_port_speed)
        } else {
            None
        },
        get_port_immutable: if O::HAS_GET_PORT_IMMUTABLE {
            Some(Self::get_port_immutable)
        } else {
            None
        },
        get_link_layer: if O::HAS_GET_LINK_LAYER {
            Some(Self::get_link_layer)
        } else {
            None
        },
        query_gid: if O::HAS_QUERY_GID {
            Some(Self::query_gid)
        } else {
            None
        },
        query_pkey: if O::HAS_QUERY_PKEY {
            Some(Self::query_pkey)
        } else {
            None
        },
        alloc_ucontext: Some(UContext::<O>::alloc_callback),
        dealloc_ucontext: Some(UContext::<O>::dealloc_callback),
        disassociate_ucontext: Some(UContext::<O>::disassociate_callback),
        mmap: Some(mmap::mmap::<O>),
        mmap_free: Some(mmap::mmap_free::<O>),
        size_ib_ucontext: core::mem::size_of::<UContext<O>>(),
        alloc_pd: Some(Pd::<O>::alloc_callback),
        dealloc_pd: Some(Pd::<O>::dealloc_callback),
        size_ib_pd: core::mem::size_of::<Pd<O>>(),
        alloc_hw_device_stats: if O::HAS_HW_COUNTERS {
            Some(Self::alloc_hw_device_stats)
        } else {
            None
        },
        alloc_hw_port_stats: if O::HAS_HW_COUNTERS {
            Some(Self::alloc_hw_port_stats)
        } else {
            None
        },
        get_hw_stats: if O::HAS_GET_HW_STATS {
            Some(Self::get_hw_stats)
        } else {
            None
        },
        create_user_cq: Some(Cq::<O>::create_callback),
        destroy_cq: Some(Cq::<O>::destroy_callback),
        size_ib_cq: core::mem::size_of::<Cq<O>>(),
        create_user_ah: Some(Ah::<O>::create_callback),
        destroy_ah: Some(Ah::<O>::destroy_callback),
        size_ib_ah: core::mem::size_of::<Ah<O>>(),
        reg_user_mr: Some(Mr::<O>::reg_callback),
        reg_user_mr_dmabuf: if O::HAS_REG_USER_MR_DMABUF {
            Some(Mr::<O>::reg_dmabuf_callback)
        } else {
            None
        },
        dereg_mr: Some(Mr::<O>::dereg_callback),
        create_qp: Some(Qp::<O>::create_callback),
        modify_qp: Some(Qp::<O>::modify_callback),
        query_qp: Some(Qp::<O>::query_callback),
        destroy_qp: Some(Qp::<O>::destroy_callback),
        size_ib_qp: core::mem::size_of::<Qp<O>>(),
        create_comp_cntr: if O::HAS_CREATE_COMP_CNTR {
            Some(CompCntr::<O>::create_callback)
        } else {
            None
        },
        destroy_comp_cntr: if O::HAS_CREATE_COMP_CNTR {
            Some(CompCntr::<O>::destroy_callback)
        } else {
            None
        },
        modify_comp_cntr: if O::HAS_MODIFY_COMP_CNTR {
            Some(CompCntr::<O>::modify_callback)
        } else {
            None
        },
        qp_attach_comp_cntr: if O::HAS_CREATE_COMP_CNTR {
            Some(CompCntr::<O>::qp_attach_callback)
        } else {
            None
        },
        query_comp_cntr_caps: if O::HAS_CREATE_COMP_CNTR {
            Some(CompCntr::<O>::query_caps_callback)
        } else {
            None
        },
        size_ib_comp_cntr: core::mem::size_of::<CompCntr<O>>(),
        ..pin_init::zeroed()
    };

    /// # Safety
    ///
    /// Called by the core for a registered `Device<O>`; `attr` is valid for
    /// writes and `udata` is null or valid.
    unsafe extern "C" fn query_device(
        dev: *mut bindings::ib_device,
        attr: *mut bindings::ib_device_attr,
        udata: *mut bindings::ib_udata,
    ) -> kernel::ffi::c_int {
        // SAFETY: Per the function's safety requirements.
        let dev = unsafe { Device::<O>::from_raw(dev) };
        // SAFETY: `attr` is valid for writes for the duration of the call.
        let attr = unsafe { DeviceAttr::from_raw(attr) };
        // SAFETY: `udata` is null or valid for the duration of the call.
        let mut udata = unsafe { UData::from_raw(udata) };
        // SAFETY: The core calls operations only while registered.
        let ret =
            unsafe { dev.with_registration_data(|reg| O::query_device(reg, attr, &mut udata)) };
        kernel::error::from_result(|| ret.map(|()| 0))
    }

    /// # Safety
    ///
    /// Called by the core for a registered `Device<O>`; `attr` is valid.
    unsafe extern "C" fn query_port(
        dev: *mut bindings::ib_device,
        port: u32,
        attr: *mut bindings::ib_port_attr,
    ) -> kernel::ffi::c_int {
        // SAFETY: Per the function's safety requirements.
        let dev = unsafe { Device::<O>::from_raw(dev) };
        // SAFETY: `attr` is valid and zeroed by the core for this call.
        let attr = unsafe { PortAttr::from_raw(attr) };
        // SAFETY: The core calls operations only while registered.
        let ret = unsafe { dev.with_registration_data(|reg| O::query_port(reg, port, attr)) };
        kernel::error::from_result(|| ret.map(|()| 0))
    }

    /// # Safety
    ///
    /// Called by the core for a registered `Device<O>`; `speed` is valid
    /// for writes.
    unsafe extern "C" fn query_port_speed(
        dev: *mut bindings::ib_device,
        port: u32,
        speed: *mut u64,
    ) -> kernel::ffi::c_int {
        // SAFETY: Per the function's safety requirements.
        let dev = unsafe { Device::<O>::from_raw(dev) };
        // SAFETY: The core calls operations only while registered.
        let ret = unsafe { dev.with_registration_data(|reg| O::query_port_speed(reg, port)) };
        kernel::error::from_result(|| {
            // SAFETY: `speed` is valid for writes, per the function's safety
            // requirements.
            unsafe { speed.write(ret?) };
            Ok(0)
        })
    }

    /// # Safety
    ///
    /// Called by the core for a registered `Device<O>`; `out` is valid.
    unsafe extern "C" fn get_port_immutable(
        dev: *mut bindings::ib_device,
        port: u32,
        out: *mut bindings::ib_port_immutable,
    ) -> kernel::ffi::c_int {
        // SAFETY: Per the function's safety requirements.
        let dev = unsafe { Device::<O>::from_raw(dev) };
        // SAFETY: The core calls operations only while registered.
        let ret = unsafe { dev.with_registration_data(|reg| O::get_port_immutable(reg, port)) };
        kernel::error::from_result(|| {
            // SAFETY: `out` is valid for writes for the duration of the call.
            unsafe { *out = ret?.into_raw() };
            Ok(0)
        })
    }

    /// # Safety
    ///
    /// Called by the core for a registered `Device<O>`.
    unsafe extern "C" fn get_link_layer(
        dev: *mut bindings::ib_device,
        port: u32,
    ) -> bindings::rdma_link_layer {
        // SAFETY: Per the function's safety requirements.
        let dev = unsafe { Device::<O>::from_raw(dev) };
        // SAFETY: The core calls operations only while registered.
        unsafe { dev.with_registration_data(|reg| O::get_link_layer(reg, port)) as u32 }
    }

    /// # Safety
    ///
    /// Called by the core for a registered `Device<O>`; `gid` is valid.
    unsafe extern "C" fn query_gid(
        dev: *mut bindings::ib_device,
        port: u32,
        index: kernel::ffi::c_int,
        gid: *mut bindings::ib_gid,
    ) -> kernel::ffi::c_int {
        // SAFETY: Per the function's safety requirements.
        let dev = unsafe { Device::<O>::from_raw(dev) };
        kernel::error::from_result(|| {
            let index = u32::try_from(index).map_err(|_| EINVAL)?;
            // SAFETY: The core calls operations only while registered.
            let value =
                unsafe { dev.with_registration_data(|reg| O::query_gid(reg, port, index)) }?;
            // SAFETY: `gid` is valid for writes for the duration of the call.
            unsafe { (*gid).raw = value.0 };
            Ok(0)
        })
    }

    /// # Safety
    ///
    /// Called by the core for a registered `Device<O>`; `pkey` is valid.
    unsafe extern "C" fn query_pkey(
        dev: *mut bindings::ib_device,
        port: u32,
        index: u16,
        pkey: *mut u16,
    ) -> kernel::ffi::c_int {
        // SAFETY: Per the function's safety requirements.
        let dev = unsafe { Device::<O>::from_raw(dev) };
        kernel::error::from_result(|| {
            // SAFETY: The core calls operations only while registered.
            let value =
                unsafe { dev.with_registration_data(|reg| O::query_pkey(reg, port, index)) }?;
            // SAFETY: `pkey` is valid for writes for the duration of the call.
            unsafe { *pkey = value };
            Ok(0)
        })
    }

    /// # Safety
    ///
    /// Called by the core for a `Device<O>` being registered.
    unsafe extern "C" fn alloc_hw_device_stats(
        _dev: *mut bindings::ib_device,
    ) -> *mut bindings::rdma_hw_stats {
        O::hw_counters(StatsScope::Device).map_or(core::ptr::null_mut(), HwCounters::alloc)
    }

    /// # Safety
    ///
    /// Called by the core for a `Device<O>` being registered.
    unsafe extern "C" fn alloc_hw_port_stats(
        _dev: *mut bindings::ib_device,
        port: u32,
    ) -> *mut bindings::rdma_hw_stats {
        O::hw_counters(StatsScope::Port(port)).map_or(core::ptr::null_mut(), HwCounters::alloc)
    }

    /// # Safety
    ///
    /// Called by the core for a registered `Device<O>`, with `stats` from
    /// the matching allocation callback, under its lock.
    unsafe extern "C" fn get_hw_stats(
        dev: *mut bindings::ib_device,
        stats: *mut bindings::rdma_hw_stats,
        port: u32,
        _index: kernel::ffi::c_int,
    ) -> kernel::ffi::c_int {
        // SAFETY: Per the function's safety requirements.
        let dev = unsafe { Device::<O>::from_raw(dev) };
        // SAFETY: Allocated by `HwCounters::alloc`; the core holds the
        // statistics lock for the call.
        let mut values = unsafe { HwStatsValues::from_raw(stats) };
        let scope = StatsScope::from_port(port);
        // SAFETY: The core calls operations only while registered.
        let ret =
            unsafe { dev.with_registration_data(|reg| O::get_hw_stats(reg, scope, &mut values)) };
        kernel::error::from_result(|| Ok(ret?.try_into().unwrap_or(kernel::ffi::c_int::MAX)))
    }
}
