//! Device generations: what `--profile efa0..efa4` makes the model report.
//!
//! Each EFA generation has its own PCI device id (0xefa0..0xefa4) and a set
//! of capabilities. Nothing public lists which generation has which; the
//! mapping here is derived from the order in which the kernel's `efa`
//! driver, rdma-core's `efa` provider and libfabric's `efa` provider
//! learned each capability and each device id, and is an assumption where
//! `Documentation/efa-emu.md` (section "Device generations") says so. The
//! interface itself (the bits, the features, the doorbell flag) is
//! `efa_hw`'s, which is the kernel's.

use efa_hw::admin::DeviceAttr;
use efa_hw::regs;

use super::config::{Config, Limits, DEFAULT_DEVICE_CAPS};

/// What one generation reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Its name on the command line: `efa0` .. `efa4`.
    pub name: &'static str,
    /// Its PCI device id.
    pub device_id: u16,
    /// `DEVICE_ATTR.device_caps`.
    pub device_caps: u32,
    /// Event queues and CQ doorbells: completion notifications.
    pub cq_notifications: bool,
    /// `QUEUE_ATTR_2` (the 128-byte WQE inline size, event counters).
    pub queue_attr_2: bool,
    /// `QUEUE_ATTR_1.max_tx_batch` (0: no limit).
    pub max_tx_batch: u16,
}

/// RDMA read and RNR retry: the capabilities of the second generation.
const GEN2_CAPS: u32 = DeviceAttr::RDMA_READ.mask() | DeviceAttr::RNR_RETRY.mask();
/// The third adds 128-byte data polling and RDMA write.
const GEN3_CAPS: u32 =
    GEN2_CAPS | DeviceAttr::DATA_POLLING_128.mask() | DeviceAttr::RDMA_WRITE.mask();
/// The fourth adds receiving unsolicited RDMA writes.
const GEN4_CAPS: u32 = GEN3_CAPS | DeviceAttr::UNSOLICITED_WRITE_RECV.mask();

/// The generations, oldest first.
pub const PROFILES: [Profile; 5] = [
    Profile {
        name: "efa0",
        device_id: regs::PCI_DEV_ID_EFA0_VF,
        device_caps: 0,
        cq_notifications: false,
        queue_attr_2: false,
        max_tx_batch: 0,
    },
    Profile {
        name: "efa1",
        device_id: regs::PCI_DEV_ID_EFA1_VF,
        device_caps: GEN2_CAPS,
        cq_notifications: false,
        queue_attr_2: false,
        max_tx_batch: 0,
    },
    Profile {
        name: "efa2",
        device_id: regs::PCI_DEV_ID_EFA2_VF,
        device_caps: GEN3_CAPS,
        cq_notifications: true,
        queue_attr_2: false,
        max_tx_batch: 16,
    },
    Profile {
        name: "efa3",
        device_id: regs::PCI_DEV_ID_EFA3_VF,
        device_caps: GEN4_CAPS,
        cq_notifications: true,
        queue_attr_2: false,
        max_tx_batch: 16,
    },
    Profile {
        name: "efa4",
        device_id: regs::PCI_DEV_ID_EFA4_VF,
        device_caps: DEFAULT_DEVICE_CAPS,
        cq_notifications: true,
        queue_attr_2: true,
        max_tx_batch: 16,
    },
];

impl Profile {
    /// The generation named `name`.
    pub fn by_name(name: &str) -> Result<&'static Profile, String> {
        PROFILES.iter().find(|p| p.name == name).ok_or_else(|| {
            let names: Vec<_> = PROFILES.iter().map(|p| p.name).collect();
            format!("unknown profile '{name}' (one of {})", names.join(", "))
        })
    }

    /// Makes `cfg` and `limits` this generation's. Limits a generation does
    /// not define keep their values; later options may override any of it.
    pub fn apply(&self, cfg: &mut Config, limits: &mut Limits) {
        let defaults = Limits::default();
        cfg.device_id = self.device_id;
        cfg.device_caps = self.device_caps;
        cfg.event_queue_attr = self.cq_notifications;
        cfg.cq_doorbells = self.cq_notifications;
        cfg.queue_attr_2 = self.queue_attr_2;
        limits.max_eq = if self.cq_notifications {
            defaults.max_eq
        } else {
            0
        };
        limits.max_tx_batch = self.max_tx_batch;
        // Without QUEUE_ATTR_2 the driver takes the 64-byte WQE's inline
        // size for both (what efa.ko does); the model reports the same.
        limits.inline_buf_size_ex = if self.queue_attr_2 {
            defaults.inline_buf_size_ex
        } else {
            u16::try_from(limits.inline_buf_size).unwrap_or(u16::MAX)
        };
        let rdma = DeviceAttr::RDMA_READ.mask() | DeviceAttr::RDMA_WRITE.mask();
        limits.max_rdma_size = if self.device_caps & rdma != 0 {
            defaults.max_rdma_size
        } else {
            0
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configured(name: &str) -> Config {
        let mut cfg = Config::new(0, [0; 16]);
        let mut limits = Limits::default();
        Profile::by_name(name).unwrap().apply(&mut cfg, &mut limits);
        cfg.limits = limits;
        cfg
    }

    #[test]
    fn every_generation_is_a_valid_device_with_its_own_id() {
        for (p, id) in PROFILES.iter().zip(regs::PCI_DEVICE_IDS) {
            let cfg = configured(p.name);
            assert_eq!(cfg.device_id, id, "{}", p.name);
            cfg.validate().unwrap_or_else(|e| panic!("{}: {e}", p.name));
        }
    }

    #[test]
    fn capabilities_only_grow_from_one_generation_to_the_next() {
        for pair in PROFILES.windows(2) {
            let (old, new) = (&pair[0], &pair[1]);
            assert_eq!(
                old.device_caps & !new.device_caps,
                0,
                "{} loses capabilities of {}",
                new.name,
                old.name
            );
            assert!(new.cq_notifications >= old.cq_notifications);
            assert!(new.queue_attr_2 >= old.queue_attr_2);
        }
    }

    #[test]
    fn the_first_generation_has_no_rdma_and_no_cq_notifications() {
        let cfg = configured("efa0");
        assert_eq!(cfg.device_caps, 0);
        assert!(!cfg.cq_doorbells && !cfg.event_queue_attr && !cfg.queue_attr_2);
        assert_eq!((cfg.limits.max_eq, cfg.limits.max_rdma_size), (0, 0));
        assert_eq!(
            u32::from(cfg.limits.inline_buf_size_ex),
            cfg.limits.inline_buf_size
        );
    }

    #[test]
    fn the_newest_generation_has_everything_the_driver_knows() {
        let cfg = configured("efa4");
        assert_eq!(cfg.device_caps, DEFAULT_DEVICE_CAPS);
        assert!(cfg.cq_doorbells && cfg.event_queue_attr && cfg.queue_attr_2);
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let e = Profile::by_name("efa9").unwrap_err();
        assert!(e.contains("efa0, efa1, efa2, efa3, efa4"), "{e}");
    }
}
