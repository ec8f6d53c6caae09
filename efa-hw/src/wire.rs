// SPDX-License-Identifier: GPL-2.0-only

//! Safe little-endian encoding of device structures.
//!
//! Every structure the device reads or writes implements [`Wire`]: it knows
//! its size on the wire and how to read itself from, and write itself to, a
//! byte buffer, field by field, in little-endian order. Nothing here uses
//! `unsafe` or reinterprets memory, so the in-memory Rust layout never has to
//! match the device's; the `#[repr(C)]` layout and the size assertions that
//! `wire_struct!` emits only prove that the field list has no hidden gaps.
//!
//! Decoding never panics. [`Wire::decode`] and [`Wire::encode`] refuse a
//! buffer shorter than [`Wire::SIZE`]; [`Wire::decode_padded`] reads missing
//! bytes as zero and [`Wire::encode_truncated`] drops what does not fit. The
//! device model decodes guest-controlled memory with these.
//!
//! Bit fields are described by [`Field`] masks, the counterpart of the
//! kernel's `FIELD_GET`/`FIELD_PREP`.
//!
//! The crate-private macros `wire_struct!`, `wire_enum!`, `wire_union!` and
//! `wire_offsets!` declare the device structures. They name this module as
//! `wire`: a module that invokes them must have it in scope under that name
//! (`use super::wire;`).

/// A buffer was too short for the structure being decoded or encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortBuffer {
    /// Bytes the structure needs.
    pub needed: usize,
    /// Bytes the buffer has.
    pub available: usize,
}

impl core::fmt::Display for ShortBuffer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "buffer of {} bytes is shorter than the {} bytes needed",
            self.available, self.needed
        )
    }
}

/// A cursor that reads bytes in order; bytes past the end read as zero.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts reading at the beginning of `bytes`.
    #[inline]
    pub const fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    /// Returns the next `N` bytes (zero where the buffer has ended) and moves
    /// past them.
    #[inline]
    pub fn take<const N: usize>(&mut self) -> [u8; N] {
        // All there, as it is but at a short buffer's end: one load.
        let whole = self
            .bytes
            .get(self.pos..)
            .and_then(|r| r.first_chunk::<N>());
        let mut out = whole.copied().unwrap_or([0u8; N]);
        if whole.is_some() {
            self.pos = self.pos.saturating_add(N);
        } else {
            self.take_into(&mut out);
        }
        out
    }

    /// Fills `out` with the next bytes (zero where the buffer has ended) and
    /// moves past them.
    #[inline]
    pub fn take_into(&mut self, out: &mut [u8]) {
        let rest = self.bytes.get(self.pos..).unwrap_or_default();
        let n = rest.len().min(out.len());
        let (present, missing) = out.split_at_mut(n);
        present.copy_from_slice(&rest[..n]);
        missing.fill(0);
        self.pos = self.pos.saturating_add(out.len());
    }

    /// Number of bytes consumed so far (may exceed the buffer length).
    pub const fn position(&self) -> usize {
        self.pos
    }
}

/// A cursor that writes bytes in order; bytes past the end are dropped.
#[derive(Debug)]
pub struct Writer<'a> {
    bytes: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    /// Starts writing at the beginning of `bytes`.
    #[inline]
    pub fn new(bytes: &'a mut [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    /// Writes `src` (as much of it as fits) and moves past it.
    #[inline]
    pub fn put(&mut self, src: &[u8]) {
        if let Some(rest) = self.bytes.get_mut(self.pos..) {
            let n = rest.len().min(src.len());
            rest[..n].copy_from_slice(&src[..n]);
        }
        self.pos = self.pos.saturating_add(src.len());
    }

    /// Number of bytes produced so far (may exceed the buffer length).
    pub const fn position(&self) -> usize {
        self.pos
    }
}

/// A value with a fixed little-endian representation of [`Wire::SIZE`] bytes.
///
/// Implementors provide [`Wire::read`] and [`Wire::write`], which must
/// consume and produce exactly `SIZE` bytes; the provided methods build the
/// checked and the lenient entry points on top of them. None of them panics,
/// whatever the buffer holds or however long it is.
pub trait Wire: Sized + Copy {
    /// Size of the encoding in bytes (the C `sizeof`).
    const SIZE: usize;

    /// The all-zero value.
    const ZERO: Self;

    /// Reads the value from `r`, consuming `SIZE` bytes.
    fn read(r: &mut Reader<'_>) -> Self;

    /// Writes the value to `w`, producing `SIZE` bytes.
    fn write(&self, w: &mut Writer<'_>);

    /// Reads `out.len()` values in order, as an array is encoded. Byte
    /// arrays read theirs with one copy rather than a call per byte.
    #[inline]
    fn read_into(r: &mut Reader<'_>, out: &mut [Self]) {
        for item in out {
            *item = Self::read(r);
        }
    }

    /// Writes `items` in order, as an array is encoded.
    #[inline]
    fn write_all(items: &[Self], w: &mut Writer<'_>) {
        for item in items {
            item.write(w);
        }
    }

    /// Decodes the value from the first `SIZE` bytes of `bytes`.
    ///
    /// Fails if `bytes` is shorter than `SIZE`; longer input is fine, the
    /// rest is ignored.
    #[inline]
    fn decode(bytes: &[u8]) -> Result<Self, ShortBuffer> {
        if bytes.len() < Self::SIZE {
            return Err(ShortBuffer {
                needed: Self::SIZE,
                available: bytes.len(),
            });
        }
        Ok(Self::read(&mut Reader::new(bytes)))
    }

    /// Encodes the value into the first `SIZE` bytes of `bytes`.
    ///
    /// Fails, writing nothing, if `bytes` is shorter than `SIZE`; bytes
    /// after the first `SIZE` are left untouched.
    #[inline]
    fn encode(&self, bytes: &mut [u8]) -> Result<(), ShortBuffer> {
        if bytes.len() < Self::SIZE {
            return Err(ShortBuffer {
                needed: Self::SIZE,
                available: bytes.len(),
            });
        }
        self.write(&mut Writer::new(bytes));
        Ok(())
    }

    /// Decodes the value, reading bytes missing from a short `bytes` as zero.
    #[inline]
    fn decode_padded(bytes: &[u8]) -> Self {
        Self::read(&mut Reader::new(bytes))
    }

    /// Encodes the value, dropping the bytes that do not fit in `bytes`.
    #[inline]
    fn encode_truncated(&self, bytes: &mut [u8]) {
        self.write(&mut Writer::new(bytes));
    }
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            const SIZE: usize = core::mem::size_of::<$t>();
            const ZERO: Self = 0;

            #[inline]
            fn read(r: &mut Reader<'_>) -> Self {
                <$t>::from_le_bytes(r.take())
            }

            #[inline]
            fn write(&self, w: &mut Writer<'_>) {
                w.put(&self.to_le_bytes());
            }
        }
    )*};
}

wire_int!(u16, u32, u64);

impl Wire for u8 {
    const SIZE: usize = 1;
    const ZERO: Self = 0;

    #[inline]
    fn read(r: &mut Reader<'_>) -> Self {
        let [byte] = r.take();
        byte
    }

    #[inline]
    fn write(&self, w: &mut Writer<'_>) {
        w.put(&[*self]);
    }

    #[inline]
    fn read_into(r: &mut Reader<'_>, out: &mut [Self]) {
        r.take_into(out);
    }

    #[inline]
    fn write_all(items: &[Self], w: &mut Writer<'_>) {
        w.put(items);
    }
}

impl<T: Wire, const N: usize> Wire for [T; N] {
    const SIZE: usize = T::SIZE * N;
    const ZERO: Self = [T::ZERO; N];

    #[inline]
    fn read(r: &mut Reader<'_>) -> Self {
        let mut out = Self::ZERO;
        T::read_into(r, &mut out);
        out
    }

    #[inline]
    fn write(&self, w: &mut Writer<'_>) {
        T::write_all(self, w);
    }
}

/// Extracts the field selected by `mask` from `value`, shifted down to bit 0
/// (the kernel's `FIELD_GET`). An empty mask yields 0.
pub const fn field_get(value: u64, mask: u64) -> u64 {
    if mask == 0 {
        return 0;
    }
    (value & mask) >> mask.trailing_zeros()
}

/// Shifts `field` into the position selected by `mask` (the kernel's
/// `FIELD_PREP`). Bits of `field` that do not fit in the mask are dropped.
pub const fn field_prep(mask: u64, field: u64) -> u64 {
    if mask == 0 {
        return 0;
    }
    (field << mask.trailing_zeros()) & mask
}

/// A contiguous bit field inside an integer of type `T`, given by its mask.
///
/// Masks of structure fields are associated constants of the structure,
/// named like the C mask without its prefix and `_MASK` suffix
/// (`EFA_ADMIN_AQ_COMMON_DESC_PHASE_MASK` is `AqCommonDesc::PHASE`), and
/// typed like the field they apply to. Register fields are constants of
/// the `regs` module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Field<T>(T);

impl<T: Copy> Field<T> {
    /// The field covering the set bits of `mask` (which should be one
    /// contiguous run of bits).
    pub const fn new(mask: T) -> Self {
        Self(mask)
    }
}

macro_rules! field_impl {
    ($($t:ty),*) => {$(
        impl Field<$t> {
            /// The field covering bits `low..=high` (the kernel's `GENMASK`).
            /// Out-of-range bits are ignored.
            pub const fn bits(high: u32, low: u32) -> Self {
                let width = <$t>::BITS;
                if low > high || low >= width {
                    return Self(0);
                }
                let top = if high >= width { width - 1 } else { high };
                let ones = <$t>::MAX >> (width - 1 - (top - low));
                Self(ones << low)
            }

            /// The field made of the single bit `bit` (the kernel's `BIT`).
            pub const fn bit(bit: u32) -> Self {
                Self::bits(bit, bit)
            }

            /// The mask in place.
            pub const fn mask(self) -> $t {
                self.0
            }

            /// Position of the lowest bit of the field.
            pub const fn shift(self) -> u32 {
                self.0.trailing_zeros()
            }

            /// Largest value the field can hold.
            pub const fn max(self) -> $t {
                self.get(<$t>::MAX)
            }

            /// Extracts the field from `value`.
            pub const fn get(self, value: $t) -> $t {
                field_get(value as u64, self.0 as u64) as $t
            }

            /// Whether any bit of the field is set in `value`.
            pub const fn is_set(self, value: $t) -> bool {
                value & self.0 != 0
            }

            /// `field` shifted into place; bits that do not fit are dropped.
            pub const fn prep(self, field: $t) -> $t {
                field_prep(self.0 as u64, field as u64) as $t
            }

            /// Whether `field` fits in the field without losing bits.
            pub const fn fits(self, field: $t) -> bool {
                field <= self.max()
            }

            /// `value` with the field replaced by `field`.
            pub const fn with(self, value: $t, field: $t) -> $t {
                (value & !self.0) | self.prep(field)
            }

            /// Replaces the field in `*value` by `field` (the driver's
            /// `EFA_SET`).
            pub const fn set(self, value: &mut $t, field: $t) {
                *value = self.with(*value, field);
            }
        }
    )*};
}

field_impl!(u8, u16, u32, u64);

/// Declares a device structure and implements [`Wire`] for it.
///
/// ```ignore
/// wire_struct! {
///     /// Documentation.
///     pub struct Name(12) {        // C sizeof; `(12, packed)` for __packed
///         /// Field documentation.
///         pub a: u32,
///         pub b: [u8; 8],
///     }
/// }
/// ```
///
/// The struct is `#[repr(C)]` (`#[repr(C, packed)]` when the C layout needs
/// unaligned fields) and derives `Clone, Copy, Debug, PartialEq, Eq`;
/// `Default` is the all-zero value. Fields are encoded in declaration order.
/// Compile-time assertions check that the field sizes add up to the stated
/// size and that the Rust layout has no padding, so every field sits at the
/// same offset as in C. The struct also gets `to_bytes`, `from_bytes` and
/// `FIELD_OFFSETS`.
macro_rules! wire_struct {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident ($size:literal, packed) {
            $($body:tt)*
        }
    ) => {
        wire::wire_struct! {
            @emit [repr(C, packed)] $(#[$meta])* $vis struct $name ($size) { $($body)* }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident ($size:literal) {
            $($body:tt)*
        }
    ) => {
        wire::wire_struct! {
            @emit [repr(C)] $(#[$meta])* $vis struct $name ($size) { $($body)* }
        }
    };
    (
        @emit [$($repr:tt)*]
        $(#[$meta:meta])*
        $vis:vis struct $name:ident ($size:literal) {
            $(
                $(#[$fmeta:meta])*
                $fvis:vis $field:ident : $ty:ty
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[$($repr)*]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis struct $name {
            $(
                $(#[$fmeta])*
                $fvis $field: $ty,
            )*
        }

        impl Default for $name {
            fn default() -> Self {
                <Self as wire::Wire>::ZERO
            }
        }

        impl wire::Wire for $name {
            const SIZE: usize = 0 $(+ <$ty as wire::Wire>::SIZE)*;
            const ZERO: Self = Self {
                $($field: <$ty as wire::Wire>::ZERO,)*
            };

            #[inline]
            fn read(r: &mut wire::Reader<'_>) -> Self {
                Self {
                    $($field: <$ty as wire::Wire>::read(r),)*
                }
            }

            #[inline]
            fn write(&self, w: &mut wire::Writer<'_>) {
                $(
                    let value: $ty = self.$field;
                    wire::Wire::write(&value, w);
                )*
            }
        }

        impl $name {
            /// Name and byte offset of every field, in wire order.
            pub const FIELD_OFFSETS: &'static [(&'static str, usize)] = &[
                $((stringify!($field), core::mem::offset_of!($name, $field)),)*
            ];

            /// The encoding of the value.
            #[inline]
            pub fn to_bytes(self) -> [u8; $size] {
                let mut bytes = [0u8; $size];
                wire::Wire::encode_truncated(&self, &mut bytes);
                bytes
            }

            /// The value encoded in `bytes`.
            #[inline]
            pub fn from_bytes(bytes: &[u8; $size]) -> Self {
                <Self as wire::Wire>::decode_padded(bytes)
            }
        }

        const _: () = {
            assert!(
                <$name as wire::Wire>::SIZE == $size,
                concat!(stringify!($name), ": fields do not add up to the stated size")
            );
            assert!(
                core::mem::size_of::<$name>() == $size,
                concat!(stringify!($name), ": the layout has padding")
            );
        };
    };
}
pub(crate) use wire_struct;

/// Declares an enumeration of raw device values of integer type `$repr`.
///
/// ```ignore
/// wire_enum! {
///     /// Documentation.
///     pub enum Name: u8 {
///         /// Variant documentation.
///         First = 1,
///     }
/// }
/// ```
///
/// The enum gets `raw()`, `from_raw()`, `ALL`, `TryFrom<$repr>` (the error
/// is the unknown raw value) and `From<Name> for $repr`. Structures keep the
/// raw integer: the device must accept any value and reject unknown ones.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $repr:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident = $value:literal
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[repr($repr)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $(
                $(#[$vmeta])*
                $variant = $value,
            )*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),*];

            /// The raw device value.
            pub const fn raw(self) -> $repr {
                self as $repr
            }

            /// The variant with raw value `raw`, if there is one.
            pub const fn from_raw(raw: $repr) -> Option<Self> {
                match raw {
                    $($value => Some(Self::$variant),)*
                    _ => None,
                }
            }
        }

        impl TryFrom<$repr> for $name {
            type Error = $repr;

            fn try_from(raw: $repr) -> Result<Self, $repr> {
                Self::from_raw(raw).ok_or(raw)
            }
        }

        impl From<$name> for $repr {
            fn from(value: $name) -> $repr {
                value as $repr
            }
        }
    };
}
pub(crate) use wire_enum;

/// Adds typed accessors for the variants of a C union that a structure
/// stores as a byte array.
///
/// ```ignore
/// wire_union! {
///     Owner.u[56] {
///         /// Documentation of the getter.
///         variant / set_variant: VariantType,
///     }
/// }
/// ```
///
/// The getter decodes the variant from the start of the array (missing
/// bytes read as zero); the setter zeroes the whole array and encodes the
/// variant at its start. A compile-time assertion checks that every variant
/// fits in the array.
macro_rules! wire_union {
    (
        $owner:ident . $field:ident [$len:literal] {
            $(
                $(#[$meta:meta])*
                $get:ident / $set:ident : $ty:ty
            ),* $(,)?
        }
    ) => {
        impl $owner {
            $(
                $(#[$meta])*
                #[inline]
                pub fn $get(&self) -> $ty {
                    let bytes: [u8; $len] = self.$field;
                    <$ty as wire::Wire>::decode_padded(&bytes)
                }

                #[doc = concat!(
                    "Stores `value` as the `", stringify!($field),
                    "` union, zeroing the bytes it does not cover."
                )]
                #[inline]
                pub fn $set(&mut self, value: &$ty) {
                    let mut bytes = [0u8; $len];
                    wire::Wire::encode_truncated(value, &mut bytes);
                    self.$field = bytes;
                }
            )*
        }

        const _: () = {
            $(
                assert!(
                    <$ty as wire::Wire>::SIZE <= $len,
                    concat!(stringify!($owner), ".", stringify!($field),
                            ": variant ", stringify!($ty), " does not fit")
                );
            )*
        };
    };
}
pub(crate) use wire_union;

/// Asserts at compile time that fields sit at the given byte offsets (the
/// C `offsetof` values).
///
/// ```ignore
/// wire_offsets!(Name { field_a: 0, field_b: 8 });
/// ```
macro_rules! wire_offsets {
    ($($name:ident { $($field:ident : $offset:literal),* $(,)? })*) => {
        const _: () = {
            $($(
                assert!(
                    core::mem::offset_of!($name, $field) == $offset,
                    concat!(stringify!($name), ".", stringify!($field),
                            " is not at offset ", stringify!($offset))
                );
            )*)*
        };
    };
}
pub(crate) use wire_offsets;

#[cfg(test)]
#[allow(dead_code)]
mod tests {
    use super::super::wire::{
        self, field_get, field_prep, Field, Reader, ShortBuffer, Wire, Writer,
    };

    wire::wire_struct! {
        /// A test structure.
        pub struct Sample(16) {
            /// A.
            pub a: u16,
            /// B.
            pub b: u8,
            /// C.
            pub c: u8,
            /// D.
            pub d: u32,
            /// E.
            pub e: u64,
        }
    }

    wire::wire_struct! {
        /// A packed test structure.
        pub struct PackedSample(12, packed) {
            /// A.
            pub a: u32,
            /// B.
            pub b: u64,
        }
    }

    wire::wire_offsets!(Sample { a: 0, b: 2, c: 3, d: 4, e: 8 } PackedSample { a: 0, b: 4 });

    wire::wire_enum! {
        /// A test enum.
        pub enum Colour: u8 {
            /// Red.
            Red = 1,
            /// Blue.
            Blue = 7,
        }
    }

    wire::wire_struct! {
        /// A structure holding a union.
        pub struct Holder(8) {
            /// Tag.
            pub tag: u32,
            /// Union bytes.
            pub u: [u8; 4],
        }
    }

    wire::wire_union! {
        Holder.u[4] {
            /// The union as a u16.
            as_u16 / set_as_u16: u16,
            /// The union as a u32.
            as_u32 / set_as_u32: u32,
        }
    }

    #[test]
    fn integers_are_little_endian() {
        let mut buf = [0u8; 8];
        0x1122_3344_5566_7788u64.encode(&mut buf).unwrap();
        assert_eq!(buf, [0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        assert_eq!(u32::decode(&buf), Ok(0x5566_7788));
        assert_eq!(u16::decode(&buf[6..]), Ok(0x1122));
        assert_eq!(
            u32::decode(&buf[5..]),
            Err(ShortBuffer {
                needed: 4,
                available: 3
            })
        );
    }

    #[test]
    fn struct_round_trip_and_golden_bytes() {
        let s = Sample {
            a: 0x0102,
            b: 3,
            c: 4,
            d: 0x0506_0708,
            e: 0x090a_0b0c_0d0e_0f10,
        };
        let bytes = s.to_bytes();
        assert_eq!(
            bytes,
            [2, 1, 3, 4, 8, 7, 6, 5, 0x10, 0x0f, 0x0e, 0x0d, 0x0c, 0x0b, 0x0a, 9]
        );
        assert_eq!(Sample::from_bytes(&bytes), s);
        assert_eq!(Sample::decode(&bytes), Ok(s));
        assert_eq!(Sample::default(), Sample::ZERO);
        assert_eq!(Sample::FIELD_OFFSETS[4], ("e", 8));

        let p = PackedSample { a: 1, b: 2 };
        let pb = p.to_bytes();
        assert_eq!(pb, [1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(PackedSample::from_bytes(&pb), p);
    }

    #[test]
    fn short_buffers_are_refused_or_padded() {
        let bytes = [0xffu8; 15];
        assert_eq!(
            Sample::decode(&bytes),
            Err(ShortBuffer {
                needed: 16,
                available: 15
            })
        );
        let padded = Sample::decode_padded(&bytes);
        assert_eq!(padded.e, 0x00ff_ffff_ffff_ffff);
        assert_eq!(Sample::decode_padded(&[]), Sample::ZERO);

        let mut out = [0xaau8; 15];
        assert!(Sample::ZERO.encode(&mut out).is_err());
        assert_eq!(out, [0xaa; 15], "a failed encode writes nothing");
        Sample::ZERO.encode_truncated(&mut out);
        assert_eq!(out, [0; 15]);

        let mut long = [0xaau8; 20];
        Sample::ZERO.encode(&mut long).unwrap();
        assert_eq!(&long[16..], &[0xaa; 4], "bytes after SIZE are untouched");
    }

    #[test]
    fn reader_and_writer_never_overrun() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.take::<2>(), [1, 2]);
        assert_eq!(r.take::<4>(), [3, 0, 0, 0]);
        assert_eq!(r.take::<2>(), [0, 0]);
        assert_eq!(r.position(), 8);

        let mut buf = [0u8; 3];
        let mut w = Writer::new(&mut buf);
        w.put(&[1, 2]);
        w.put(&[3, 4, 5]);
        w.put(&[6]);
        assert_eq!(w.position(), 6);
        assert_eq!(buf, [1, 2, 3]);
    }

    #[test]
    fn arrays() {
        let a: [u16; 3] = [1, 0x0203, 0xffff];
        let mut buf = [0u8; 6];
        a.encode(&mut buf).unwrap();
        assert_eq!(buf, [1, 0, 3, 2, 0xff, 0xff]);
        assert_eq!(<[u16; 3]>::decode(&buf), Ok(a));
        assert_eq!(<[u16; 3]>::SIZE, 6);
        assert_eq!(<[[u8; 2]; 3]>::SIZE, 6);
    }

    #[test]
    fn byte_arrays_read_and_write_in_one_copy_without_overrun() {
        // Byte arrays take the one-copy path of `read_into`/`write_all`,
        // which must pad and truncate exactly as the per-byte path does.
        let mut r = Reader::new(&[1, 2, 3, 4, 5]);
        assert_eq!(<[u8; 2]>::read(&mut r), [1, 2]);
        assert_eq!(<[u8; 4]>::read(&mut r), [3, 4, 5, 0]);
        assert_eq!(<[u8; 3]>::read(&mut r), [0, 0, 0]);
        assert_eq!(r.position(), 9);
        assert_eq!(<[[u8; 2]; 2]>::decode_padded(&[9, 8, 7]), [[9, 8], [7, 0]]);

        let mut buf = [0xaau8; 5];
        let mut w = Writer::new(&mut buf);
        [1u8, 2, 3].write(&mut w);
        [4u8, 5, 6].write(&mut w);
        [7u8].write(&mut w);
        assert_eq!(w.position(), 7);
        assert_eq!(buf, [1, 2, 3, 4, 5]);
        let mut buf = [0xaau8; 3];
        [[1u8, 2], [3, 4]].encode_truncated(&mut buf);
        assert_eq!(buf, [1, 2, 3]);
    }

    #[test]
    fn enums() {
        assert_eq!(Colour::try_from(7), Ok(Colour::Blue));
        assert_eq!(Colour::try_from(2), Err(2));
        assert_eq!(Colour::from_raw(1), Some(Colour::Red));
        assert_eq!(u8::from(Colour::Red), 1);
        assert_eq!(Colour::Blue.raw(), 7);
        assert_eq!(Colour::ALL, &[Colour::Red, Colour::Blue]);
        for raw in 0..=u8::MAX {
            let _ = Colour::from_raw(raw);
        }
    }

    #[test]
    fn unions() {
        let mut h = Holder {
            tag: 1,
            u: [0xff; 4],
        };
        h.set_as_u16(&0x1234);
        assert_eq!(h.u, [0x34, 0x12, 0, 0]);
        assert_eq!(h.as_u32(), 0x1234);
        h.set_as_u32(&0xdead_beef);
        assert_eq!(h.as_u16(), 0xbeef);
    }

    #[test]
    fn masks() {
        assert_eq!(field_get(0xabcd, 0x0ff0), 0xbc);
        assert_eq!(field_prep(0x0ff0, 0xbc), 0x0bc0);
        assert_eq!(field_prep(0x0ff0, 0x1bc), 0x0bc0, "excess bits dropped");
        assert_eq!(field_get(u64::MAX, 0), 0);
        assert_eq!(field_prep(0, u64::MAX), 0);
        assert_eq!(field_get(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(field_prep(1 << 63, 1), 1 << 63);

        let f = Field::<u32>::new(0xf000_0000);
        assert_eq!(f.shift(), 28);
        assert_eq!(f.max(), 0xf);
        assert_eq!(f.get(0xa123_4567), 0xa);
        assert_eq!(f.prep(0x5), 0x5000_0000);
        assert_eq!(f.with(0xa123_4567, 3), 0x3123_4567);
        assert!(f.fits(0xf));
        assert!(!f.fits(0x10));
        let mut v = 0x0000_0001u32;
        f.set(&mut v, 0xc);
        assert_eq!(v, 0xc000_0001);
        assert!(f.is_set(v));

        assert_eq!(Field::<u8>::bits(4, 0).mask(), 0x1f);
        assert_eq!(Field::<u8>::bits(7, 0).mask(), 0xff);
        assert_eq!(Field::<u8>::bit(7).mask(), 0x80);
        assert_eq!(Field::<u16>::bits(11, 0).mask(), 0x0fff);
        assert_eq!(Field::<u32>::bits(31, 24).mask(), 0xff00_0000);
        assert_eq!(Field::<u64>::bits(63, 0).mask(), u64::MAX);
        assert_eq!(Field::<u8>::bits(1, 2).mask(), 0, "reversed range is empty");
        assert_eq!(Field::<u8>::bits(9, 8).mask(), 0, "out of range is empty");
        assert_eq!(Field::<u8>::bits(9, 6).mask(), 0xc0, "clipped to the type");
        assert_eq!(Field::<u16>::new(0).get(0xffff), 0);
    }
}
