//! PCI configuration space of the served function: a type 0 header built from
//! the model's identity and BARs, and an MSI-X capability.
//!
//! QEMU reads the whole space when it realizes the device and forwards every
//! guest config write here before applying its own emulation, so this space
//! behaves like a device's: BARs size the usual way, read-only fields stay
//! read-only, and the command register tells whether the function may master
//! the bus. A vfio-user DEVICE_RESET leaves it alone, as the kernel's vfio-pci
//! does (it saves and restores config space around a function reset).

use crate::transport::{Bar, MsixLayout, PciIdentity};

/// Size of the space (conventional PCI; without a PCI Express capability
/// QEMU neither needs nor reads the extended space).
pub(super) const SIZE: usize = 256;
/// Where the MSI-X capability sits, as on real EFA devices.
pub(super) const MSIX_CAP: usize = 0xb0;

const COMMAND: usize = 0x04;
const STATUS: usize = 0x06;
const BAR0: usize = 0x10;
const CAP_PTR: usize = 0x34;

const COMMAND_MEMORY: u16 = 1 << 1;
const COMMAND_MASTER: u16 = 1 << 2;
const COMMAND_PARITY: u16 = 1 << 6;
const COMMAND_SERR: u16 = 1 << 8;
const COMMAND_INTX_DISABLE: u16 = 1 << 10;
const STATUS_CAP_LIST: u16 = 1 << 4;

const CAP_ID_MSIX: u8 = 0x11;
const MSIX_ENABLE: u16 = 1 << 15;
const MSIX_FUNCTION_MASK: u16 = 1 << 14;

const BAR_MEM_64: u32 = 0b10 << 1;
const BAR_PREFETCH: u32 = 1 << 3;
const BAR_IO: u32 = 1;

pub(super) struct ConfigSpace {
    bytes: [u8; SIZE],
    /// Bits the guest may change, byte by byte.
    wmask: [u8; SIZE],
}

impl ConfigSpace {
    /// `bars` must already be validated (indices, sizes, no overlap).
    pub(super) fn new(id: &PciIdentity, bars: &[Bar], msix: Option<&MsixLayout>) -> Self {
        let mut c = Self {
            bytes: [0; SIZE],
            wmask: [0; SIZE],
        };
        c.put16(0x00, id.vendor);
        c.put16(0x02, id.device);
        c.put8(0x08, id.revision);
        let class = id.class.to_le_bytes();
        c.bytes[0x09..0x0c].copy_from_slice(&class[..3]);
        c.put16(0x2c, id.subsystem_vendor);
        c.put16(0x2e, id.subsystem);
        c.mask16(
            COMMAND,
            COMMAND_MEMORY | COMMAND_MASTER | COMMAND_PARITY | COMMAND_SERR | COMMAND_INTX_DISABLE,
        );
        // Cache line size, latency timer and interrupt line are plain storage.
        c.wmask[0x0c] = 0xff;
        c.wmask[0x0d] = 0xff;
        c.wmask[0x3c] = 0xff;

        for bar in bars {
            let at = BAR0 + 4 * usize::from(bar.index);
            let mut flags = 0;
            if bar.is_64bit {
                flags |= BAR_MEM_64;
            }
            if bar.prefetchable {
                flags |= BAR_PREFETCH;
            }
            // The address bits below the size read back as zero: that is how
            // software sizes a BAR.
            let addr_mask = !(bar.size - 1);
            if bar.io_space {
                // An I/O BAR: bit 0 set, address bits from bit 2.
                c.put32(at, BAR_IO);
                c.mask32(at, (addr_mask as u32) & !0x3);
                continue;
            }
            c.put32(at, flags);
            c.mask32(at, (addr_mask as u32) & !0xf);
            if bar.is_64bit {
                c.mask32(at + 4, (addr_mask >> 32) as u32);
            }
        }

        if let Some(m) = msix {
            c.put16(STATUS, STATUS_CAP_LIST);
            c.put8(CAP_PTR, MSIX_CAP as u8);
            c.put8(MSIX_CAP, CAP_ID_MSIX);
            c.put8(MSIX_CAP + 1, 0);
            c.put16(MSIX_CAP + 2, m.vectors - 1);
            c.mask16(MSIX_CAP + 2, MSIX_ENABLE | MSIX_FUNCTION_MASK);
            // Offsets are 8-byte aligned, leaving the low 3 bits for the BAR.
            c.put32(MSIX_CAP + 4, m.table_offset as u32 | u32::from(m.bar));
            c.put32(MSIX_CAP + 8, m.pba_offset as u32 | u32::from(m.bar));
        }
        c
    }

    fn put8(&mut self, at: usize, v: u8) {
        self.bytes[at] = v;
    }
    fn put16(&mut self, at: usize, v: u16) {
        self.bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn put32(&mut self, at: usize, v: u32) {
        self.bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn mask16(&mut self, at: usize, m: u16) {
        self.wmask[at..at + 2].copy_from_slice(&m.to_le_bytes());
    }
    fn mask32(&mut self, at: usize, m: u32) {
        self.wmask[at..at + 4].copy_from_slice(&m.to_le_bytes());
    }

    fn range(offset: u64, len: usize) -> Option<std::ops::Range<usize>> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(len)?;
        (len > 0 && end <= SIZE).then_some(start..end)
    }

    /// Reads `data.len()` bytes at `offset`; `None` if outside the space.
    pub(super) fn read(&self, offset: u64, data: &mut [u8]) -> Option<()> {
        let r = Self::range(offset, data.len())?;
        data.copy_from_slice(&self.bytes[r]);
        Some(())
    }

    /// Writes `data` at `offset` through the write mask; `None` if outside
    /// the space.
    pub(super) fn write(&mut self, offset: u64, data: &[u8]) -> Option<()> {
        let r = Self::range(offset, data.len())?;
        for (i, &v) in r.zip(data) {
            let m = self.wmask[i];
            self.bytes[i] = (self.bytes[i] & !m) | (v & m);
        }
        Some(())
    }

    /// Whether the function may master the bus (DMA).
    pub(super) fn bus_master(&self) -> bool {
        u16::from_le_bytes([self.bytes[COMMAND], self.bytes[COMMAND + 1]]) & COMMAND_MASTER != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::BarBacking;

    fn space() -> ConfigSpace {
        let id = PciIdentity {
            vendor: 0x1d0f,
            device: 0xefa1,
            subsystem_vendor: 0x1d0f,
            subsystem: 0x1234,
            revision: 3,
            class: 0x02_00_00,
        };
        let bars = [
            Bar {
                index: 0,
                size: 16384,
                is_64bit: false,
                prefetchable: false,
                io_space: false,
                backing: BarBacking::Trapped,
            },
            Bar {
                index: 2,
                size: 1 << 20,
                is_64bit: true,
                prefetchable: true,
                io_space: false,
                backing: BarBacking::Trapped,
            },
        ];
        let msix = MsixLayout::new(16384, 9).unwrap();
        ConfigSpace::new(&id, &bars, Some(&msix))
    }

    fn r32(c: &ConfigSpace, at: u64) -> u32 {
        let mut b = [0; 4];
        c.read(at, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    #[test]
    fn header_shows_identity_and_capability() {
        let c = space();
        assert_eq!(r32(&c, 0), 0xefa1_1d0f);
        assert_eq!(r32(&c, 8), 0x0200_0003);
        assert_eq!(r32(&c, 0x2c), 0x1234_1d0f);
        assert_eq!(r32(&c, 4) >> 16, u32::from(STATUS_CAP_LIST));
        assert_eq!(r32(&c, 0x34), 0xb0);
        assert_eq!(r32(&c, 0xb0), 0x0008_0011);
        assert_eq!(r32(&c, 0xb4), 0x2000);
        assert_eq!(r32(&c, 0xb8), 0x3000);
        assert!(c.read(255, &mut [0; 2]).is_none());
        assert!(c.read(u64::MAX, &mut [0; 1]).is_none());
    }

    #[test]
    fn bars_size_like_hardware() {
        let mut c = space();
        c.write(0x10, &[0xff; 4]).unwrap();
        assert_eq!(r32(&c, 0x10), 0xffff_c000);
        c.write(0x18, &[0xff; 4]).unwrap();
        c.write(0x1c, &[0xff; 4]).unwrap();
        assert_eq!(r32(&c, 0x18), 0xfff0_000c);
        assert_eq!(r32(&c, 0x1c), 0xffff_ffff);
        assert_eq!(r32(&c, 0x14), 0, "BAR1 is absent");
        c.write(0x10, &0xe000_0000u32.to_le_bytes()).unwrap();
        assert_eq!(r32(&c, 0x10), 0xe000_0000);
    }

    #[test]
    fn an_io_bar_says_so_and_sizes_in_ports() {
        let id = PciIdentity {
            vendor: 0x1d0f,
            device: 0xefa1,
            subsystem_vendor: 0x1d0f,
            subsystem: 0x1234,
            revision: 3,
            class: 0x02_00_00,
        };
        let bars = [Bar {
            index: 2,
            size: 4096,
            is_64bit: false,
            prefetchable: false,
            io_space: true,
            backing: BarBacking::Trapped,
        }];
        let mut c = ConfigSpace::new(&id, &bars, None);
        assert_eq!(r32(&c, 0x18), 1, "I/O space indicator");
        c.write(0x18, &[0xff; 4]).unwrap();
        assert_eq!(r32(&c, 0x18), 0xffff_f001);
    }

    #[test]
    fn read_only_fields_stay_and_command_gates_mastering() {
        let mut c = space();
        c.write(0, &[0; 4]).unwrap();
        assert_eq!(r32(&c, 0), 0xefa1_1d0f);
        assert!(!c.bus_master());
        c.write(4, &[0xff, 0xff]).unwrap();
        assert!(c.bus_master());
        assert_eq!(r32(&c, 4) & 0xffff, 0x0546);
        c.write(0xb2, &0xffffu16.to_le_bytes()).unwrap();
        assert_eq!(r32(&c, 0xb0) >> 16, 0xc008, "only enable and mask change");
    }
}
