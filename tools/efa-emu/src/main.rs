//! `efa-emu`: serves a software EFA device to QEMU over vfio-user.
//!
//! However it ends, the last line on stderr is the summary line of
//! [`efa_emu::health`], and the status says how: 0 clean, 70 a panic in
//! any thread, 1 an error.

use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::sync::Arc;

use efa_emu::control_socket::ControlSocket;
use efa_emu::device::config::{self, Config, InjectRule, Limits};
use efa_emu::device::fabric::auth::FabricKey;
use efa_emu::device::fabric::{udp, NetFaults, UdpConfig};
use efa_emu::device::profile::Profile;
use efa_emu::device::EfaDevice;
use efa_emu::health::{self, Exit, Health};
use efa_emu::vfio::VfioUserServer;

const USAGE: &str = "usage: efa-emu --socket PATH [options]

Serves one emulated EFA device (PCI 1d0f:efa2) to QEMU's vfio-user-pci and
exits when QEMU disconnects (or on SIGTERM/SIGINT).

  --socket PATH           the vfio-user socket QEMU connects to
  --index N               device index (logs, default GID; default 0)
  --gid ADDR              the device GID, IPv6 notation (default: fe80::02xx:xxxx:xxxx:NNNN,
                          a hash of the socket path and the index)
  --mtu N                 largest payload in bytes (default 8928)
  --link-speed GBPS       reported link speed (default 100)
  --device-id ID          PCI device id, 0xefa0..0xefa4 (default 0xefa2)
  --profile efa0..efa4    a device generation: its PCI id and the capabilities it
                          reports (RDMA read/write, RNR retry, CQ notifications and
                          doorbells, ...; see Documentation/efa-emu.md); options
                          after it override its values
  --no-cq-doorbells       CREATE_CQ gives no CQ doorbell (CQs are polled only; needs
                          --limit max_eq=0, since a CQ that cannot be armed gets no
                          event)
  --api-version 1|2|3     VERSION register minor: 2 adds completion checksums,
                          3 (default) 128-byte admin entries with checksums
  --msix N                MSI-X vectors: 1 admin + N-1 for event queues (default 33)
  --limit NAME=VALUE      a queue limit (repeatable): max_qp, max_cq, max_pd, max_ah,
                          max_mr, max_mr_pages, max_sq_depth, max_rq_depth, max_cq_depth,
                          max_llq_size, max_eq, max_eq_depth, max_uar, sub_cqs_per_cq, ...
  --llq-mib N             size of the LLQ pool in BAR2 (default 63)
  --keep-alive-ms N       keep-alive AENQ period, 0 for none (default 1000)
  --admin-timeout-ms N    admin timeout reported in CAPS, 100..1500, 0 = driver default
                          of 30 s (default 0)
  --in-order              complete admin commands in submission order
  --inject SPEC           opcode=N,count=K,mode=fail|timeout|late[,status=S][,skip=J]
                          (repeatable): after J (default 0) that run normally, the
                          next K commands of opcode N fail with status S (default 6,
                          UNKNOWN_ERROR), never complete, or (late) are held until the
                          control window completes them late with status S
  --hostile SPEC          NAME[,seed=S][,after=K][,count=C]: the device misbehaves on
                          purpose (tests only; NAME 'random' picks one by the seed;
                          a wrong NAME lists them)
  --fabric DIR            where devices of different efa-emu processes meet (a Unix
                          datagram socket per device GID); default: the directory of
                          --socket, so the devices of one VM reach each other
  --no-fabric             reach no other process (devices of this one only)
  --udp ADDRESS           the fabric over UDP instead: this device's port binds ADDRESS
                          (192.0.2.1:4792, [2001:db8::1]:4792, an address alone for port
                          4792, or a port alone on 127.0.0.1); other GIDs are reached at
                          the addresses of the peer map
  --peer GID=ADDRESS      a peer map entry (repeatable)
  --peers FILE            peer map entries, 'GID ADDRESS' a line ('#' comments)
  --fabric-key FILE       the fabric's shared key: 64 hex digits in a file only you can
                          read (mode 0600); needed to bind anything but loopback
  --capture FILE          write the fabric's packets to FILE (pcap, created; decode with
                          tools/efa-emu/wireshark/efa-emu.lua)
  --net-loss PPM          drop arriving packets with this probability (parts per million)
  --net-delay-us N        delay arriving packets by up to N us (reorders them)
  --net-reorder PPM       hold arriving packets back 1 ms with this probability, so that
                          later ones pass them
  --net-dup PPM           deliver arriving packets twice with this probability
  --net-link GID,FAULT=N,...  faults for the packets from GID only, instead of the
                          above (repeatable): loss=PPM, delay-us=N, reorder=PPM, dup=PPM
  --spin-us N             after work, poll the doorbells for up to N us of CPU before napping
                          while work comes that fast (default 0: never). Shortens a
                          doorbell's wait from tens of us to a few on a host with a
                          core to spare (KVM); costs a TCG guest the CPU it needs
  --data-cpus LIST        run each device's data path on these CPUs only (0,2 or 1-3):
                          keeps it off the cores of the vCPUs it serves
  --persist               after QEMU disconnects, wait for the next one
  --test-control          turn on the emulator's control window in BAR0 (fault
                          injection and more from inside the guest: tests only)
  --control-socket PATH   with --test-control: the control window from the host too,
                          on a Unix socket (mode 0600, in a directory only you can
                          write to): lines 'read OFFSET' and 'write OFFSET VALUE'
                          (tools/efa-emu/guest/efa-emu-inject --control-socket PATH)
  --health-file PATH      keep the health counters in PATH (rewritten on change)
  -v, --verbose           log every admin command and its answer

Guest RAM must be shareable: -object memory-backend-memfd,id=mem,size=...,share=on
-machine ...,memory-backend=mem. RUST_LOG overrides the log filter (default info).
The last line on stderr is always 'efa-emu: summary: exit=clean|panic|error
guest_bug=N ...'; the exit status is 0 (clean), 70 (a thread panicked) or 1 (error).
See Documentation/efa-emu.md.";

struct Args {
    socket: PathBuf,
    control_socket: Option<PathBuf>,
    persist: bool,
    health_file: Option<PathBuf>,
    cfg: Config,
}

fn parse_args(health: &Arc<Health>) -> Result<Option<Args>, String> {
    let mut args = std::env::args().skip(1);
    let mut socket = None;
    let mut control_socket = None;
    let mut health_file = None;
    let mut index = 0u16;
    let mut gid = None;
    let mut persist = false;
    let mut fabric: Option<Option<PathBuf>> = None;
    let mut udp: Option<std::net::SocketAddr> = None;
    let mut peers = udp::PeerMap::new();
    let mut key_file: Option<PathBuf> = None;
    let mut cfg = Config::new(0, [0; 16]);
    cfg.health = health.clone();
    let mut limits = Limits::default();
    fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        let parsed = match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16)
                .ok()
                .and_then(|n| n.to_string().parse().ok()),
            None => v.parse().ok(),
        };
        parsed.ok_or_else(|| format!("{flag}: bad value '{v}'"))
    }
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--socket" => socket = Some(PathBuf::from(args.next().ok_or("--socket needs a path")?)),
            "--index" => index = num("--index", args.next())?,
            "--gid" => {
                let v = args.next().ok_or("--gid needs an address")?;
                let a: Ipv6Addr = v.parse().map_err(|e| format!("--gid {v}: {e}"))?;
                gid = Some(a.octets());
            }
            "--mtu" => cfg.mtu = num("--mtu", args.next())?,
            "--link-speed" => cfg.link_speed_gbps = num("--link-speed", args.next())?,
            "--device-id" => cfg.device_id = num("--device-id", args.next())?,
            "--profile" => {
                let name = args.next().ok_or("--profile needs a name")?;
                Profile::by_name(&name)?.apply(&mut cfg, &mut limits);
            }
            "--no-cq-doorbells" => cfg.cq_doorbells = false,
            "--api-version" => cfg.api_minor = num("--api-version", args.next())?,
            "--msix" => cfg.msix_vectors = num("--msix", args.next())?,
            "--limit" => limits.set_spec(&args.next().ok_or("--limit needs NAME=VALUE")?)?,
            "--llq-mib" => cfg.llq_pool_size = num::<u64>("--llq-mib", args.next())? << 20,
            "--keep-alive-ms" => cfg.keep_alive_ms = num("--keep-alive-ms", args.next())?,
            "--admin-timeout-ms" => cfg.admin_timeout_ms = num("--admin-timeout-ms", args.next())?,
            "--in-order" => cfg.reorder = false,
            "--inject" => cfg.inject.push(
                InjectRule::parse(&args.next().ok_or("--inject needs a spec")?)
                    .map_err(|e| format!("--inject: {e}"))?,
            ),
            "--hostile" => {
                let spec = args.next().ok_or("--hostile needs a spec")?;
                cfg.hostile = Some(
                    efa_emu::device::hostile::HostileSpec::parse(&spec)
                        .map_err(|e| format!("--hostile: {e}"))?,
                );
            }
            "--fabric" => {
                fabric = Some(Some(PathBuf::from(
                    args.next().ok_or("--fabric needs a directory")?,
                )))
            }
            "--no-fabric" => fabric = Some(None),
            "--udp" => {
                let v = args.next().ok_or("--udp needs an address")?;
                let a = match v.parse::<u16>() {
                    Ok(port) => std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                    Err(_) => {
                        udp::parse_addr(&v).ok_or_else(|| format!("--udp {v}: not an address"))?
                    }
                };
                udp = Some(a);
            }
            "--peer" => {
                let v = args.next().ok_or("--peer needs GID=ADDRESS")?;
                udp::add_peer(&mut peers, &v, "--peer").map_err(|e| e.to_string())?;
            }
            "--peers" => {
                let path = PathBuf::from(args.next().ok_or("--peers needs a file")?);
                udp::read_peers(&mut peers, &path).map_err(|e| e.to_string())?;
            }
            "--fabric-key" => {
                key_file = Some(PathBuf::from(
                    args.next().ok_or("--fabric-key needs a file")?,
                ))
            }
            "--capture" => {
                cfg.capture = Some(PathBuf::from(args.next().ok_or("--capture needs a file")?))
            }
            "--net-loss" => cfg.net_faults.loss_ppm = num("--net-loss", args.next())?,
            "--net-delay-us" => cfg.net_faults.delay_us = num("--net-delay-us", args.next())?,
            "--net-reorder" => cfg.net_faults.reorder_ppm = num("--net-reorder", args.next())?,
            "--net-dup" => cfg.net_faults.dup_ppm = num("--net-dup", args.next())?,
            "--net-link" => {
                let v = args.next().ok_or("--net-link needs GID,FAULT=N,...")?;
                cfg.net_links.push(parse_link(&v)?);
            }
            "--data-cpus" => {
                cfg.data_cpus = parse_cpus(&args.next().ok_or("--data-cpus needs a CPU list")?)?;
            }
            "--spin-us" => {
                cfg.spin = std::time::Duration::from_micros(num("--spin-us", args.next())?);
            }
            "--persist" => persist = true,
            "--test-control" => cfg.test_control = true,
            "--control-socket" => {
                control_socket = Some(PathBuf::from(
                    args.next().ok_or("--control-socket needs a path")?,
                ))
            }
            "--health-file" => {
                health_file = Some(PathBuf::from(
                    args.next().ok_or("--health-file needs a path")?,
                ))
            }
            "-v" | "--verbose" => cfg.verbose = true,
            "-h" | "--help" => return Ok(None),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    let socket = socket.ok_or("--socket is required")?;
    if control_socket.is_some() && !cfg.test_control {
        return Err("--control-socket needs --test-control (the window is off without it)".into());
    }
    cfg.index = index;
    cfg.gid = gid.unwrap_or_else(|| config::default_gid(index, &socket));
    cfg.limits = limits;
    if udp.is_some() || !peers.is_empty() {
        if matches!(fabric, Some(Some(_))) {
            return Err(
                "--fabric DIR is the Unix socket fabric: not with --udp or a peer map".into(),
            );
        }
        // --udp overrides the map's entry for this device: behind NAT the
        // map has the address its peers reach, --udp the one it binds.
        if let Some(a) = udp {
            peers.insert(cfg.gid, a);
        }
        let key = match &key_file {
            Some(path) => Some(FabricKey::from_file(path).map_err(|e| e.to_string())?),
            None => None,
        };
        cfg.udp = Some(UdpConfig {
            peers: Arc::new(peers),
            key,
        });
        fabric = Some(None);
    } else if key_file.is_some() {
        return Err("--fabric-key is the UDP fabric's: give --udp ADDRESS too".into());
    }
    cfg.fabric_dir = match fabric {
        Some(dir) => dir,
        None => Some(
            socket
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."))
                .to_path_buf(),
        ),
    };
    cfg.validate()?;
    Ok(Some(Args {
        socket,
        control_socket,
        persist,
        health_file,
        cfg,
    }))
}

/// A CPU list as `taskset -c` takes it: numbers and ranges, `0,2,4-7`.
fn parse_cpus(v: &str) -> Result<Vec<usize>, String> {
    let bad = || format!("--data-cpus: bad CPU list '{v}' (0,2 or 1-3)");
    let mut cpus = Vec::new();
    for part in v.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
        if a > b || b >= libc::CPU_SETSIZE as usize {
            return Err(bad());
        }
        cpus.extend(a..=b);
    }
    Ok(cpus)
}

/// `GID,loss=PPM,delay-us=N,reorder=PPM,dup=PPM` (any of the faults).
fn parse_link(v: &str) -> Result<([u8; 16], NetFaults), String> {
    let bad = || format!("--net-link {v}: not GID,FAULT=N,... (loss, delay-us, reorder, dup)");
    let mut parts = v.split(',');
    let gid: Ipv6Addr = parts.next().unwrap_or("").parse().map_err(|_| bad())?;
    let mut f = NetFaults::default();
    for p in parts {
        let (k, n) = p.split_once('=').ok_or_else(bad)?;
        let n: u32 = n.parse().map_err(|_| bad())?;
        match k {
            "loss" => f.loss_ppm = n,
            "delay-us" => f.delay_us = n,
            "reorder" => f.reorder_ppm = n,
            "dup" => f.dup_ppm = n,
            _ => return Err(bad()),
        }
    }
    Ok((gid.octets(), f))
}

/// Blocks SIGTERM and SIGINT in this thread (and so in every thread it
/// starts later) and returns the set, for a thread to `sigwait` on.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data that sigemptyset initialises; the
    // calls get valid pointers to it and valid signal numbers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// env_logger, silenced once the summary line is due (see `health::log_gate`).
struct Logger(env_logger::Logger);

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        self.0.enabled(m)
    }

    fn log(&self, r: &log::Record<'_>) {
        if let Some(_gate) = health::log_gate() {
            self.0.log(r);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}

fn main() {
    // Before any thread exists (each inherits the mask): only the watcher
    // thread takes SIGTERM and SIGINT, and stops in order.
    let signals = block_stop_signals();
    let health = Health::new();
    // A panic in any thread ends the process, saying which thread.
    health::install_panic_hook(health.clone());
    // Sockets, directories and files efa-emu creates are its user's alone.
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0o077) };
    let logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).build();
    let max = logger.filter();
    if log::set_boxed_logger(Box::new(Logger(logger))).is_ok() {
        log::set_max_level(max);
    }
    let exit = run(&health, signals);
    health.finish(exit)
}

fn run(health: &Arc<Health>, signals: libc::sigset_t) -> Exit {
    let mut args = match parse_args(health) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return Exit::Clean;
        }
        Err(e) => {
            eprintln!("efa-emu: {e}\n\n{USAGE}");
            return Exit::Error;
        }
    };
    if let Some(path) = &args.health_file {
        let r = health
            .set_file(path)
            .and_then(|()| health.spawn_file_writer());
        if let Err(e) = r {
            eprintln!("efa-emu: health file {}: {e}", path.display());
            return Exit::Error;
        }
    }
    let server = match VfioUserServer::bind(&args.socket) {
        Ok(s) => s.with_health(health.clone()),
        Err(e) => {
            eprintln!("efa-emu: cannot listen on {}: {e}", args.socket.display());
            return Exit::Error;
        }
    };
    let index = args.cfg.index;
    // The guest asked the model to die (control window): go as a crash
    // would, without an orderly vfio-user goodbye, but after the write that
    // asked has been answered (QEMU would otherwise stall the vCPU until
    // its message timeout). It is a test's request: its own status says so.
    let h = health.clone();
    args.cfg.on_exit = Some(Arc::new(move || {
        log::warn!("efa{index}: exiting, as requested by the guest");
        let h = h.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            h.finish(Exit::Requested);
        });
    }));
    log::info!(
        "efa{index}: {:?}, GID {}, on {}",
        args.cfg,
        Ipv6Addr::from(args.cfg.gid),
        args.socket.display()
    );
    let device = match EfaDevice::new(args.cfg, server.guest_memory(), server.interrupts()) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            eprintln!("efa-emu: {e}");
            return Exit::Error;
        }
    };
    let control = match &args.control_socket {
        Some(path) => match ControlSocket::bind(path, device.clone()) {
            Ok(c) => {
                log::info!("efa{index}: control window on {}", path.display());
                Some(c)
            }
            Err(e) => {
                eprintln!("efa-emu: control socket {}: {e}", path.display());
                return Exit::Error;
            }
        },
        None => None,
    };
    let stopper = server.stopper();
    let watcher = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: `signals` is an initialised set and `sig` a live int.
            if unsafe { libc::sigwait(&signals, &mut sig) } == 0 {
                log::info!("efa{index}: signal {sig}, stopping");
                stopper.stop();
            }
        });
    if let Err(e) = watcher {
        log::warn!("no signal watcher ({e}): SIGTERM will not stop cleanly");
    }
    let result = server.serve(&*device, args.persist);
    // The control socket's thread holds the device: it goes first.
    drop(control);
    drop(device);
    drop(server);
    match result {
        Ok(()) => {
            log::info!("efa{index}: done");
            Exit::Clean
        }
        Err(e) => {
            log::error!("efa{index}: {e}");
            Exit::Error
        }
    }
}
