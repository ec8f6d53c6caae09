//! Every input kept in `fuzz/regressions/TARGET/` (crashes `make fuzz`
//! found) replayed through the fuzz target's body, as an ordinary test: a
//! fixed crash stays fixed.

#[path = "../fuzz/fuzz_targets/bodies.rs"]
mod bodies;
#[path = "../fuzz/fuzz_targets/common.rs"]
#[allow(dead_code)]
mod common;
mod support;

use std::path::Path;

fn replay(target: &str, body: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| {
        p.file_name()
            .is_some_and(|n| !n.to_string_lossy().starts_with('.'))
    });
    files.sort();
    for f in &files {
        eprintln!("replaying {}", f.display());
        body(&std::fs::read(f).expect("a regression input"));
    }
    files.len()
}

#[test]
fn admin_regressions() {
    replay("admin", bodies::admin);
}

#[test]
fn datapath_regressions() {
    replay("datapath", bodies::datapath);
}

#[test]
fn fabric_regressions() {
    replay("fabric", bodies::fabric);
}

#[test]
fn vfio_regressions() {
    replay("vfio", bodies::vfio);
}

#[test]
fn udp_regressions() {
    replay("udp", bodies::udp);
}
