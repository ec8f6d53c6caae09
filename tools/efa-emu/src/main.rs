//! `efa-emu`: serves a software EFA device to QEMU over vfio-user.
//!
//! The device model is not written yet; until it is, this binary only checks
//! its arguments and says so.

use std::process::ExitCode;

const USAGE: &str = "usage: efa-emu --socket PATH [--persist]

  --socket PATH  the vfio-user socket QEMU connects to
                 (-device '{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"PATH\",\"type\":\"unix\"}}')
  --persist      after the guest disconnects, wait for the next one

Guest RAM must be shareable: -object memory-backend-memfd,id=mem,size=...,share=on
-machine ...,memory-backend=mem. Set RUST_LOG=debug for a trace.";

fn main() -> ExitCode {
    env_logger::init();
    let mut args = std::env::args().skip(1);
    let mut socket = None;
    let mut persist = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--socket" => socket = args.next(),
            "--persist" => persist = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ => {
                eprintln!("efa-emu: unknown argument {arg:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(socket) = socket else {
        eprintln!("efa-emu: --socket is required\n{USAGE}");
        return ExitCode::from(2);
    };
    let _ = (socket, persist);
    eprintln!("efa-emu: the EFA device model is not written yet (the vfio-user transport is: efa_emu::vfio)");
    ExitCode::FAILURE
}
