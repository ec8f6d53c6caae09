//! What the fuzz targets share: one fake driver's device, reused across
//! inputs (a fresh one costs 48 MiB of zeroed guest memory), restarted
//! for each input so that every input starts from the same state.

use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::support::{test_config, Fake};

/// The device, reset and brought up again.
pub fn fake() -> MutexGuard<'static, Fake> {
    static FAKE: OnceLock<Mutex<Fake>> = OnceLock::new();
    let mut f = FAKE
        .get_or_init(|| {
            // The model's warnings are expected by the thousand here.
            Mutex::new(Fake::up(test_config()))
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    f.restart();
    f
}

/// What the data-path target works with: a queue pair in RTS (UD or SRD),
/// a registered buffer and an address handle for the device's own GID.
pub struct DataPath {
    pub ep: crate::support::dp::Ep,
    pub buf: crate::support::dp::Buf,
    pub ah: u16,
}

/// Sets up [`DataPath`] on a restarted device; the same handles, keys and
/// addresses every time (the seed corpus names them).
pub fn data_path(f: &mut Fake, srd: bool) -> DataPath {
    use crate::support::dp::EpOpts;
    use efa_hw::admin::RegMrCmd;
    let ep = f.ep(if srd { EpOpts::srd() } else { EpOpts::ud() });
    let perms = RegMrCmd::LOCAL_WRITE_ENABLE.mask()
        | RegMrCmd::REMOTE_READ_ENABLE.mask()
        | RegMrCmd::REMOTE_WRITE_ENABLE.mask();
    let buf = f.mr(ep.pd, 8192, perms, 0x5a);
    let gid = f.dev.config().gid;
    let ah = f.ah(ep.pd, gid);
    DataPath { ep, buf, ah }
}
