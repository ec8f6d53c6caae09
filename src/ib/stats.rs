// SPDX-License-Identifier: GPL-2.0

//! Statistics: the device's counters (admin commands, keep-alives, failed
//! verbs by kind, failed mmaps) and the port's (from GET_STATS), under the
//! C driver's names, so that tools see the same statistics under either
//! driver (`rdma statistic`, sysfs `hw_counters`); and refa's own, last:
//! buffers the device was given and did not give back, kept until it is
//! reset (`mem_kept_until_reset`) or leaked on purpose for want of memory
//! to keep them (`mem_leaked`), and the device's failures, its recoveries
//! and the cause of the last failure (`device_failures`,
//! `device_recoveries`, `last_failure_cause`: `crate::recovery::Cause`),
//! counted across recoveries.

use super::data::VerbsData;
use crate::{
    hw::{
        admin::{
            DeviceAttr as HwDeviceAttr,
            GetStatsType,
            RdmaWriteStats, //
        },
        wire::Wire, //
    },
    rdma::stats::{
        hw_counters,
        HwCounters,
        HwStatsValues,
        StatsScope, //
    },
};
use kernel::{
    prelude::*,
    sync::atomic::ordering::Relaxed, //
};

/// The one port.
const PORT: u32 = super::PORT;

hw_counters!(
    DEVICE_COUNTERS = [
        c"submitted_cmds",
        c"completed_cmds",
        c"cmds_err",
        c"no_completion_cmds",
        c"keep_alive_rcvd",
        c"alloc_pd_err",
        c"create_qp_err",
        c"create_cq_err",
        c"reg_mr_err",
        c"alloc_ucontext_err",
        c"create_ah_err",
        c"mmap_err",
        c"mem_kept_until_reset",
        c"mem_leaked",
        c"device_failures",
        c"device_recoveries",
        c"last_failure_cause",
    ]
);

hw_counters!(
    PORT_COUNTERS = [
        c"tx_bytes",
        c"tx_pkts",
        c"rx_bytes",
        c"rx_pkts",
        c"rx_drops",
        c"send_bytes",
        c"send_wrs",
        c"recv_bytes",
        c"recv_wrs",
        c"rdma_read_wrs",
        c"rdma_read_bytes",
        c"rdma_read_wr_err",
        c"rdma_read_resp_bytes",
        c"rdma_write_wrs",
        c"rdma_write_bytes",
        c"rdma_write_wr_err",
        c"rdma_write_recv_bytes",
        c"retrans_bytes",
        c"retrans_pkts",
        c"retrans_timeout_events",
        c"unresponsive_remote_events",
        c"impaired_remote_conn_events",
    ]
);

/// The counters of `scope`.
pub(super) fn counters(scope: StatsScope) -> Option<&'static HwCounters> {
    match scope {
        StatsScope::Device => Some(&DEVICE_COUNTERS),
        StatsScope::Port(PORT) => Some(&PORT_COUNTERS),
        StatsScope::Port(_) => None,
    }
}

/// Fills `values` with the counters of `scope`; returns how many.
pub(super) fn fill(
    data: &VerbsData<'_>,
    scope: StatsScope,
    values: &mut HwStatsValues<'_>,
) -> Result<usize> {
    let filled: &[u64] = match scope {
        StatsScope::Device => &device_counters(data),
        StatsScope::Port(PORT) => &port_counters(data)?,
        StatsScope::Port(_) => return Err(EINVAL),
    };
    let values = values.values();
    let n = values.len().min(filled.len());
    values[..n].copy_from_slice(&filled[..n]);
    Ok(n)
}

/// The values of [`DEVICE_COUNTERS`], in order.
fn device_counters(data: &VerbsData<'_>) -> [u64; DEVICE_COUNTERS.len()] {
    let admin = data.core.admin().counters();
    let e = &data.errors;
    let (kept, leaked) = data.core.kept_memory();
    // The device's, not this incarnation's: they go on across recoveries.
    let (failures, recoveries, last_cause) = data.core.reporter().health().counters();
    [
        admin.submitted.load(Relaxed),
        admin.completed.load(Relaxed),
        admin.failed.load(Relaxed),
        admin.no_completion.load(Relaxed),
        data.core.watchdog().keep_alives_received(),
        e.alloc_pd.load(Relaxed),
        e.create_qp.load(Relaxed),
        e.create_cq.load(Relaxed),
        e.reg_mr.load(Relaxed),
        e.alloc_ucontext.load(Relaxed),
        e.create_ah.load(Relaxed),
        e.mmap.load(Relaxed),
        kept,
        leaked,
        failures,
        recoveries,
        last_cause,
    ]
}

/// The values of [`PORT_COUNTERS`], in order, from the device. Sets the
/// device does not have (RDMA write without the capability) read as zero.
fn port_counters(data: &VerbsData<'_>) -> Result<[u64; PORT_COUNTERS.len()]> {
    let core = &data.core;
    let basic = core.get_stats(GetStatsType::Basic)?.basic_stats();
    let msgs = core.get_stats(GetStatsType::Messages)?.messages_stats();
    let read = core.get_stats(GetStatsType::RdmaRead)?.rdma_read_stats();
    let write = if data.attrs.has_cap(HwDeviceAttr::RDMA_WRITE) {
        core.get_stats(GetStatsType::RdmaWrite)?.rdma_write_stats()
    } else {
        RdmaWriteStats::ZERO
    };
    let net = core.get_stats(GetStatsType::Network)?.network_stats();
    Ok([
        basic.tx_bytes,
        basic.tx_pkts,
        basic.rx_bytes,
        basic.rx_pkts,
        basic.rx_drops,
        msgs.send_bytes,
        msgs.send_wrs,
        msgs.recv_bytes,
        msgs.recv_wrs,
        read.read_wrs,
        read.read_bytes,
        read.read_wr_err,
        read.read_resp_bytes,
        write.write_wrs,
        write.write_bytes,
        write.write_wr_err,
        write.write_recv_bytes,
        net.retrans_bytes,
        net.retrans_pkts,
        net.retrans_timeout_events,
        net.unresponsive_remote_events,
        net.impaired_remote_conn_events,
    ])
}
