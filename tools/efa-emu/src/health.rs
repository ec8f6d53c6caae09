//! efa-emu's own health: what the model saw go wrong, counted by class,
//! its warnings rate-limited, and how the process ends.
//!
//! # Classes
//!
//! Every warning the model logs about something a driver (or a fabric
//! peer) did wrong is counted in one [`Class`]. The counts are what a test
//! harness reads to tell a driver that merely passed its tests from one
//! that also never upset the device:
//!
//! | class | what |
//! |-|-|
//! | `guest_bug` | a driver-side protocol error: malformed admin entries, bad descriptors, doorbells for unknown queues, commands the state forbids |
//! | `dma_failed` | a DMA to or from guest memory failed |
//! | `qp_error` | the model put a QP in the error state |
//! | `admin_error` | an admin command failed for another reason than injection |
//! | `injected` | a fault was injected on request |
//! | `fabric_rejected` | a fabric packet was dropped as unauthenticated, malformed or unmatched |
//! | `suppressed` | log lines the rate limiter suppressed (not a class of its own) |
//!
//! # Rate limit
//!
//! A guest can provoke a warning per doorbell. Each kind of warning (a
//! call site) may log [`BURST`] lines per [`PERIOD`]; the rest are counted
//! in `suppressed`, and the next line of that kind that is logged (or the
//! process's end) says how many were left out. The first warning of each
//! class is logged whatever the limiter says.
//!
//! # The end of the process
//!
//! [`Health::finish`] ends the process: it writes the summary line
//!
//! ```text
//! efa-emu: summary: exit=<clean|panic|error> guest_bug=N dma_failed=N qp_error=N admin_error=N injected=N fabric_rejected=N suppressed=N
//! ```
//!
//! as the last line on stderr and exits with [`Exit::code`]. The panic hook
//! ([`install_panic_hook`]) does the same for a panic in any thread, so a
//! panic is never swallowed by a thread that goes on without its peer.

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

/// Lines of one kind logged per [`PERIOD`] before the limiter steps in.
pub const BURST: u32 = 10;
/// The rate limiter's period.
pub const PERIOD: Duration = Duration::from_secs(5);
/// Least time between two writes of the health file.
const FILE_INTERVAL: Duration = Duration::from_millis(100);

/// A class of things that went wrong (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// A driver-side protocol error.
    GuestBug,
    /// DMA to or from guest memory failed.
    DmaFailed,
    /// A QP put in the error state by the model.
    QpError,
    /// An admin command failed for a reason other than injection.
    AdminError,
    /// A fault injected on request.
    Injected,
    /// A fabric packet dropped as unauthenticated, malformed or unmatched.
    FabricRejected,
}

impl Class {
    /// Every class, in the order of the summary line.
    pub const ALL: [Class; 6] = [
        Class::GuestBug,
        Class::DmaFailed,
        Class::QpError,
        Class::AdminError,
        Class::Injected,
        Class::FabricRejected,
    ];

    /// The name in the summary line.
    pub fn name(self) -> &'static str {
        match self {
            Class::GuestBug => "guest_bug",
            Class::DmaFailed => "dma_failed",
            Class::QpError => "qp_error",
            Class::AdminError => "admin_error",
            Class::Injected => "injected",
            Class::FabricRejected => "fabric_rejected",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// How the process ends (or that it has not yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Still running (the health file only).
    Running,
    /// Stopped by a signal or by the client's disconnect; status 0.
    Clean,
    /// Gone at once because the guest asked through the control window;
    /// status [`REQUESTED_STATUS`], so that the harness can tell a test's
    /// request from a model that merely ended early.
    Requested,
    /// A thread panicked; status [`PANIC_STATUS`].
    Panic,
    /// An error (bad arguments, a socket that cannot be served, a
    /// transport failure); status 1.
    Error,
}

/// The exit status after a panic (EX_SOFTWARE).
pub const PANIC_STATUS: i32 = 70;

/// The exit status when the guest asked the model to exit (EX_TEMPFAIL).
pub const REQUESTED_STATUS: i32 = 75;

impl Exit {
    /// The word in the summary line.
    pub fn name(self) -> &'static str {
        match self {
            Exit::Running => "running",
            Exit::Clean => "clean",
            Exit::Requested => "requested",
            Exit::Panic => "panic",
            Exit::Error => "error",
        }
    }

    /// The process exit status.
    pub fn code(self) -> i32 {
        match self {
            Exit::Running | Exit::Clean => 0,
            Exit::Requested => REQUESTED_STATUS,
            Exit::Panic => PANIC_STATUS,
            Exit::Error => 1,
        }
    }
}

/// A snapshot of the counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Per class, in [`Class::ALL`] order.
    pub classes: [u64; 6],
    /// Log lines suppressed by the rate limiter.
    pub suppressed: u64,
}

impl Counts {
    /// The count of `class`.
    pub fn get(&self, class: Class) -> u64 {
        self.classes[class.index()]
    }

    /// The summary line (without a newline).
    pub fn summary(&self, exit: Exit) -> String {
        let mut s = format!("efa-emu: summary: exit={}", exit.name());
        for c in Class::ALL {
            s.push_str(&format!(" {}={}", c.name(), self.get(c)));
        }
        s.push_str(&format!(" suppressed={}", self.suppressed));
        s
    }
}

/// Per kind of warning: the current period and what was left out.
#[derive(Debug)]
struct Bucket {
    since: Instant,
    logged: u32,
    /// Suppressed since the last line of this kind was logged.
    pending: u64,
}

/// What the limiter says about one line.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Log it, after a note that this many similar lines were suppressed.
    Log { suppressed_before: u64 },
    /// Count it only.
    Suppress,
}

#[derive(Debug, Default)]
struct Limiter {
    kinds: HashMap<&'static str, Bucket>,
}

impl Limiter {
    fn admit(&mut self, kind: &'static str, now: Instant, force: bool) -> Verdict {
        let b = self.kinds.entry(kind).or_insert(Bucket {
            since: now,
            logged: 0,
            pending: 0,
        });
        if now.saturating_duration_since(b.since) >= PERIOD {
            b.since = now;
            b.logged = 0;
        }
        if b.logged >= BURST && !force {
            b.pending += 1;
            return Verdict::Suppress;
        }
        b.logged += 1;
        Verdict::Log {
            suppressed_before: std::mem::take(&mut b.pending),
        }
    }

    /// Kinds with suppressed lines not yet reported, and how many.
    fn drain(&mut self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<_> = self
            .kinds
            .iter_mut()
            .filter(|(_, b)| b.pending > 0)
            .map(|(k, b)| (*k, std::mem::take(&mut b.pending)))
            .collect();
        v.sort();
        v
    }
}

/// The counters, the rate limiter and the health file of one efa-emu
/// process (or of one device, in tests).
#[derive(Debug, Default)]
pub struct Health {
    classes: [AtomicU64; 6],
    suppressed: AtomicU64,
    limiter: Mutex<Limiter>,
    file: Mutex<Option<PathBuf>>,
    /// Set on every change; the file writer clears it.
    dirty: Mutex<bool>,
    changed: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Logging is over: the summary line has been written (see [`Health::finish`]).
static LOG_CLOSED: AtomicBool = AtomicBool::new(false);
/// Held by whoever ends the process, so that only one summary line is
/// written and nothing follows it.
static FINAL: Mutex<()> = Mutex::new(());

/// Held (shared) by every log line being written, so that the summary
/// line waits for lines in flight.
static LOG_GATE: RwLock<()> = RwLock::new(());

/// Whether the process is ending and must log nothing more.
pub fn logging_closed() -> bool {
    LOG_CLOSED.load(Ordering::SeqCst)
}

/// Permission to write one log line: `None` once the process is ending
/// (the summary line must stay the last line). The binary's logger holds
/// the guard while it writes.
pub fn log_gate() -> Option<RwLockReadGuard<'static, ()>> {
    let g = LOG_GATE.read().unwrap_or_else(|e| e.into_inner());
    (!logging_closed()).then_some(g)
}

/// Stops logging and waits for the lines being written.
fn close_logging() {
    LOG_CLOSED.store(true, Ordering::SeqCst);
    drop(LOG_GATE.write().unwrap_or_else(|e| e.into_inner()));
}

impl Health {
    /// Fresh counters, no file.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Writes the counters to `path` (atomically: a temporary file renamed
    /// over it) now, and again after every change while
    /// [`Health::spawn_file_writer`]'s thread runs.
    pub fn set_file(&self, path: &Path) -> std::io::Result<()> {
        *lock(&self.file) = Some(path.to_path_buf());
        self.write_file(Exit::Running)
    }

    /// Starts the thread that rewrites the health file after changes, at
    /// most every 100 ms.
    pub fn spawn_file_writer(self: &Arc<Self>) -> std::io::Result<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("health-file".into())
            .spawn(move || loop {
                {
                    let mut dirty = lock(&me.dirty);
                    while !*dirty {
                        dirty = me.changed.wait(dirty).unwrap_or_else(|e| e.into_inner());
                    }
                    *dirty = false;
                }
                if logging_closed() {
                    return;
                }
                if let Err(e) = me.write_file(Exit::Running) {
                    log::debug!("health file: {e}");
                }
                std::thread::sleep(FILE_INTERVAL);
            })
            .map(|_| ())
    }

    fn write_file(&self, exit: Exit) -> std::io::Result<()> {
        // Held while writing: the final line (written after logging
        // closed) is never overtaken by a late `running` one.
        let file = lock(&self.file);
        let Some(path) = file.clone() else {
            return Ok(());
        };
        if exit == Exit::Running && logging_closed() {
            return Ok(());
        }
        let mut tmp = path.clone().into_os_string();
        tmp.push(format!(".tmp{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let line = self.counts().summary(exit);
        std::fs::write(&tmp, format!("{line}\n"))?;
        std::fs::rename(&tmp, &path)
    }

    fn touch(&self) {
        *lock(&self.dirty) = true;
        self.changed.notify_all();
    }

    /// The counters now.
    pub fn counts(&self) -> Counts {
        Counts {
            classes: std::array::from_fn(|i| self.classes[i].load(Ordering::Relaxed)),
            suppressed: self.suppressed.load(Ordering::Relaxed),
        }
    }

    /// The count of `class`.
    pub fn get(&self, class: Class) -> u64 {
        self.classes[class.index()].load(Ordering::Relaxed)
    }

    /// Counts `n` events of `class` that are not logged one by one (packets
    /// dropped by injected loss, say).
    pub fn count(&self, class: Class, n: u64) {
        if n > 0 {
            self.classes[class.index()].fetch_add(n, Ordering::Relaxed);
            self.touch();
        }
    }

    /// Counts one event of `class` (if any) and logs `args` at `level`
    /// unless the rate limiter for `kind` suppresses it. The first event of
    /// a class is always logged. Use the [`report!`](crate::report) macro.
    pub fn report(
        &self,
        level: log::Level,
        class: Option<Class>,
        kind: &'static str,
        args: fmt::Arguments<'_>,
    ) {
        let first =
            class.is_some_and(|c| self.classes[c.index()].fetch_add(1, Ordering::Relaxed) == 0);
        let verdict = lock(&self.limiter).admit(kind, Instant::now(), first);
        match verdict {
            Verdict::Log { suppressed_before } => {
                if suppressed_before > 0 {
                    log::log!(
                        target: "efa_emu",
                        level,
                        "{suppressed_before} similar messages suppressed ({kind})"
                    );
                }
                log::log!(target: "efa_emu", level, "{args}");
            }
            Verdict::Suppress => {
                self.suppressed.fetch_add(1, Ordering::Relaxed);
            }
        }
        if class.is_some() || verdict == Verdict::Suppress {
            self.touch();
        }
    }

    /// Logs the suppressed lines not yet reported (at the end). Skipped if
    /// the limiter is busy (a thread panicked holding it).
    pub fn flush_suppressed(&self) {
        let drained = match self.limiter.try_lock() {
            Ok(mut l) => l.drain(),
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner().drain(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        for (kind, n) in drained {
            log::warn!(target: "efa_emu", "{n} similar messages suppressed ({kind})");
        }
    }

    /// Ends the process: reports what the limiter left out, writes the
    /// health file and the summary line (the last line on stderr: logging
    /// stops here) and exits with `exit`'s status. Only the first caller
    /// gets through; any other thread that calls this (or panics) waits
    /// for the exit.
    pub fn finish(&self, exit: Exit) -> ! {
        let _last = FINAL.lock().unwrap_or_else(|e| e.into_inner());
        self.finish_locked(exit)
    }

    fn finish_locked(&self, exit: Exit) -> ! {
        self.flush_suppressed();
        close_logging();
        let _ = self.write_file(exit);
        let line = self.counts().summary(exit);
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{line}");
        let _ = err.flush();
        std::process::exit(exit.code())
    }
}

/// Makes every panic, in any thread, end the process at once: the panic
/// is reported with the thread's name, then the summary line with
/// `exit=panic`, and the status is [`PANIC_STATUS`].
pub fn install_panic_hook(health: Arc<Health>) {
    std::panic::set_hook(Box::new(move |info| {
        let _last = FINAL.lock().unwrap_or_else(|e| e.into_inner());
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "Box<dyn Any>".into());
        let at = info
            .location()
            .map_or_else(String::new, |l| format!(" at {l}"));
        {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "efa-emu: thread '{name}' panicked{at}: {msg}");
            let bt = std::backtrace::Backtrace::capture();
            if bt.status() == std::backtrace::BacktraceStatus::Captured {
                let _ = writeln!(err, "{bt}");
            }
        }
        health.finish_locked(Exit::Panic)
    }));
}

/// Counts one event of a class (or `None`) and logs a line, rate-limited
/// per kind: `report!(health, Warn, Some(Class::GuestBug), "kind", "fmt", args...)`.
#[macro_export]
macro_rules! report {
    ($health:expr, $level:ident, $class:expr, $kind:expr, $($arg:tt)+) => {
        $health.report(log::Level::$level, $class, $kind, format_args!($($arg)+))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limiter_lets_a_burst_through_per_period_and_says_what_it_left_out() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        for i in 0..BURST {
            assert_eq!(
                l.admit("a", t0, false),
                Verdict::Log {
                    suppressed_before: 0
                },
                "line {i}"
            );
        }
        for _ in 0..5 {
            assert_eq!(
                l.admit("a", t0 + Duration::from_secs(1), false),
                Verdict::Suppress
            );
        }
        assert_eq!(
            l.admit("b", t0, false),
            Verdict::Log {
                suppressed_before: 0
            },
            "kinds are limited apart"
        );
        assert_eq!(
            l.admit("a", t0, true),
            Verdict::Log {
                suppressed_before: 5
            },
            "forced through, with the note"
        );
        assert_eq!(l.admit("a", t0, false), Verdict::Suppress);
        assert_eq!(
            l.admit("a", t0 + PERIOD, false),
            Verdict::Log {
                suppressed_before: 1
            },
            "a new period"
        );
        assert_eq!(
            l.admit("a", t0 + PERIOD, false),
            Verdict::Log {
                suppressed_before: 0
            }
        );
        for _ in 0..20 {
            l.admit("c", t0, false);
        }
        assert_eq!(l.drain(), vec![("c", 10)]);
        assert_eq!(l.drain(), vec![]);
    }

    #[test]
    fn a_flood_is_counted_and_mostly_suppressed() {
        let h = Health::new();
        for i in 0..1000 {
            report!(h, Warn, Some(Class::QpError), "flood", "line {i}");
        }
        report!(
            h,
            Warn,
            Some(Class::GuestBug),
            "flood",
            "another class, logged"
        );
        let c = h.counts();
        assert_eq!(c.get(Class::QpError), 1000);
        assert_eq!(c.get(Class::GuestBug), 1);
        assert!(c.suppressed >= 1000 - u64::from(BURST), "{c:?}");
        h.count(Class::Injected, 3);
        assert_eq!(
            h.counts().summary(Exit::Clean),
            format!(
                "efa-emu: summary: exit=clean guest_bug=1 dma_failed=0 qp_error=1000 \
                 admin_error=0 injected=3 fabric_rejected=0 suppressed={}",
                c.suppressed
            )
        );
    }

    #[test]
    fn the_health_file_is_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("efa-health-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("health");
        let h = Health::new();
        h.set_file(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("efa-emu: summary: exit=running guest_bug=0 "),
            "{text}"
        );
        h.count(Class::DmaFailed, 2);
        h.write_file(Exit::Error).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("exit=error ") && text.contains(" dma_failed=2 "));
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary left"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn exit_codes() {
        assert_eq!(
            [Exit::Clean, Exit::Requested, Exit::Panic, Exit::Error].map(Exit::code),
            [0, 75, 70, 1]
        );
    }
}
