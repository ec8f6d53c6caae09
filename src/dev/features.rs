// SPDX-License-Identifier: GPL-2.0

//! What the device tells about itself through GET_FEATURE, read once at
//! probe.

use super::Core;
use crate::hw::admin::{
    DeviceAttr,
    EventQueueAttr,
    FeatureId,
    HwHints,
    NetworkAttr,
    QueueAttr1,
    QueueAttr2, //
};
use kernel::{
    prelude::*,
    time::Delta, //
};

/// The device's attributes and limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceAttrs {
    /// `DEVICE_ATTR`.
    pub(crate) device: DeviceAttr,
    /// `QUEUE_ATTR_1`.
    pub(crate) queues: QueueAttr1,
    /// `QUEUE_ATTR_2`, when the device has it.
    pub(crate) queues_ex: Option<QueueAttr2>,
    /// `NETWORK_ATTR`.
    pub(crate) network: NetworkAttr,
    /// `EVENT_QUEUE_ATTR`, when the device has it.
    pub(crate) event_queues: Option<EventQueueAttr>,
}

impl DeviceAttrs {
    /// A device with capabilities `device_caps` and no limits or
    /// attributes otherwise: the fixture of the verbs' unit tests.
    #[cfg(CONFIG_KUNIT)]
    pub(crate) fn with_device_caps(device_caps: u32) -> Self {
        use crate::hw::wire::Wire;
        Self {
            device: DeviceAttr {
                device_caps,
                ..DeviceAttr::ZERO
            },
            queues: QueueAttr1::ZERO,
            queues_ex: None,
            network: NetworkAttr::ZERO,
            event_queues: None,
        }
    }

    /// Reads the attributes from the device.
    pub(crate) fn query(core: &Core<'_>) -> Result<Self> {
        let device = core.get_feature(FeatureId::DeviceAttr, 0)?.device_attr();
        if device.admin_api_version < 1 {
            dev_err!(
                core.dev(),
                "device reports admin API version {}, at least 1 is needed\n",
                device.admin_api_version
            );
            return Err(EINVAL);
        }
        let features = device.supported_features;
        let queues = core
            .get_feature(FeatureId::QueueAttr1, features)?
            .queue_attr_1();
        let queues_ex = core
            .get_optional_feature(FeatureId::QueueAttr2, features)?
            .map(|r| r.queue_attr_2());
        let network = core
            .get_feature(FeatureId::NetworkAttr, features)?
            .network_attr();
        let event_queues = core
            .get_optional_feature(FeatureId::EventQueueAttr, features)?
            .map(|r| r.event_queue_attr());
        Ok(Self {
            device,
            queues,
            queues_ex,
            network,
            event_queues,
        })
    }

    /// Whether the device announces `feature`.
    pub(crate) fn supports(&self, feature: FeatureId) -> bool {
        feature.is_supported(self.device.supported_features)
    }

    /// Whether `device_caps` has `cap`.
    pub(crate) fn has_cap(&self, cap: crate::hw::wire::Field<u32>) -> bool {
        cap.is_set(self.device.device_caps)
    }

    /// Link speed in Gbit/s; devices that report none run at the default.
    pub(crate) fn link_speed_gbps(&self) -> u16 {
        match self.device.max_link_speed_gbps {
            0 => DeviceAttr::DEFAULT_LINK_SPEED_GBPS,
            gbps => gbps,
        }
    }

    /// Largest inline send with 128-byte WQEs; without `QUEUE_ATTR_2` the
    /// same as with 64-byte ones.
    pub(crate) fn inline_buf_size_ex(&self) -> u32 {
        self.queues_ex
            .map_or(self.queues.inline_buf_size, |q| q.inline_buf_size_ex.into())
    }
}

/// The device's timing hints (`HW_HINTS`), in units of time. Zero in a
/// field means "the driver's default", here `None`.
///
/// Every field is in milliseconds. The 7.3 C driver takes
/// `admin_completion_timeout` as microseconds, so a device hinting 3000
/// (3 s) gets a 3 ms timeout from it; refa reads all four alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hints {
    /// Readless register read timeout.
    pub(crate) mmio_read_timeout: Option<Delta>,
    /// Keep-alive watchdog limit.
    pub(crate) watchdog_timeout: Option<Delta>,
    /// Admin command timeout.
    pub(crate) admin_timeout: Option<Delta>,
    /// Admin polling interval.
    pub(crate) poll_interval: Option<Delta>,
}

impl From<HwHints> for Hints {
    fn from(hints: HwHints) -> Self {
        let ms = |v: u16| (v != 0).then(|| Delta::from_millis(v.into()));
        Self {
            mmio_read_timeout: ms(hints.mmio_read_timeout),
            watchdog_timeout: ms(hints.driver_watchdog_timeout),
            admin_timeout: ms(hints.admin_completion_timeout),
            poll_interval: ms(hints.poll_interval),
        }
    }
}

#[kunit_tests(refa_features)]
mod tests {
    use super::*;

    #[test]
    fn hints_are_milliseconds_and_zero_is_default() {
        let hints = Hints::from(HwHints {
            mmio_read_timeout: 10,
            driver_watchdog_timeout: 0,
            admin_completion_timeout: 3000,
            poll_interval: 5,
        });
        assert_eq!(
            hints,
            Hints {
                mmio_read_timeout: Some(Delta::from_millis(10)),
                watchdog_timeout: None,
                admin_timeout: Some(Delta::from_secs(3)),
                poll_interval: Some(Delta::from_millis(5)),
            }
        );
        assert_eq!(Hints::from(HwHints::default()), Hints::default());
    }
}
