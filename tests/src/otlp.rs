//! A real OpenTelemetry (OTLP/HTTP) receiver for end-to-end tests of what gpustall exports:
//! rotel, a collector (Streamfold's, in Rust) that prints the metrics and log records it
//! receives. Debian packages no OTLP receiver (its prometheus, bookworm's to sid's, is built
//! without Prometheus's), so rotel's binary is fetched once out of its PyPI wheel into
//! `target/test-tools`, one fetch at a time across test processes. A fetch that fails panics: a
//! test needing the receiver fails, never skips.
//!
//! Each receiver runs on loopback on free ports and is killed (and reaped) when its guard drops,
//! also when the test fails.

use std::{
    fs::File,
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::TempDir;

/// The rotel release pinned here (its wheel carries the `rotel-agent` binary).
const ROTEL_VERSION: &str = "0.0.1a15";
const ROTEL_WHEEL: &str = "rotel-0.0.1a15-cp311-cp311-manylinux_2_34_x86_64.whl";
/// Where fetched tools are kept between test runs.
fn tools_dir() -> PathBuf {
    crate::workspace_root().join("target/test-tools")
}

/// A machine-wide lock (flock) held while a tool is fetched: two test processes fetching into
/// the same directory would corrupt each other's download.
fn lock() -> File {
    use std::os::fd::AsRawFd;
    let f = File::create("/run/lock/gpustall-tests-otlp-tools.lock")
        .expect("the OTLP tools lock file (/run/lock/gpustall-tests-otlp-tools.lock)");
    // SAFETY: a valid fd; the lock goes with the file.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
    f
}

/// What `bin --version` prints (stdout and stderr), or None when it does not run: a cached tool
/// is used only when it runs, so a half-written one from a killed fetch is fetched again.
fn version_of(bin: &Path) -> Option<String> {
    let o = Command::new(bin).arg("--version").output().ok()?;
    o.status.success().then(|| {
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    })
}

/// Runs `cmd`, panicking with `what` and its output when it fails.
fn run(what: &str, cmd: &mut Command) {
    let o = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{what} failed ({}): {}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout).trim(),
        String::from_utf8_lossy(&o.stderr).trim()
    );
}

/// The `rotel-agent` binary of the PyPI package rotel (pinned), out of its wheel.
pub fn rotel() -> PathBuf {
    let dir = tools_dir().join(format!("rotel-{ROTEL_VERSION}"));
    let bin = dir.join("rotel-agent");
    if version_of(&bin).is_some() {
        return bin;
    }
    let _lock = lock();
    if version_of(&bin).is_some() {
        return bin;
    }
    eprintln!("fetching rotel {ROTEL_VERSION} from PyPI into {}", dir.display());
    let pip_present = || {
        Command::new("python3")
            .args(["-m", "pip", "--version"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    // A fresh Debian 12 has python3 but not pip.
    crate::apt::ensure("python3-pip", pip_present);
    let wheels = dir.join("wheel");
    std::fs::create_dir_all(&wheels).expect("the rotel download directory");
    // The wheel's tags are pinned so that whatever python3 this is, the same file comes.
    run(
        "pip download rotel",
        Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"])
            .args(["--platform", "manylinux_2_34_x86_64", "--python-version", "3.11"])
            .args(["--implementation", "cp", "--abi", "cp311"])
            .arg(format!("rotel=={ROTEL_VERSION}"))
            .arg("-d")
            .arg(&wheels),
    );
    let wheel = wheels.join(ROTEL_WHEEL);
    assert!(wheel.exists(), "pip download rotel=={ROTEL_VERSION} did not give {ROTEL_WHEEL}");
    // Written aside and renamed, so that the cached path never holds a partial binary.
    let part = dir.join("rotel-agent.part");
    run(
        "unpacking rotel/rotel-agent from the wheel",
        Command::new("python3")
            .args([
                "-c",
                "import os, sys, zipfile\n\
                 data = zipfile.ZipFile(sys.argv[1]).read('rotel/rotel-agent')\n\
                 open(sys.argv[2], 'wb').write(data)\n\
                 os.chmod(sys.argv[2], 0o755)",
            ])
            .arg(&wheel)
            .arg(&part),
    );
    std::fs::rename(&part, &bin).expect("renaming rotel-agent into place");
    assert!(version_of(&bin).is_some(), "{} (from {ROTEL_WHEEL}) does not run", bin.display());
    bin
}

/// Ports free on loopback now (all held until each is picked, so they differ); the receiver
/// binds them right after.
fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<TcpListener> =
        (0..N).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")).collect();
    std::array::from_fn(|i| held[i].local_addr().expect("local_addr").port())
}

/// A child that is killed and reaped on drop.
struct Guarded(Child);

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `ready()` holds, panicking (with `log()`) when the child exits first or 60 s pass.
fn wait_ready(name: &str, child: &mut Child, log: impl Fn() -> String, ready: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            panic!("{name} exited ({s}) before it was ready:\n{}", log());
        }
        if ready() {
            return;
        }
        assert!(Instant::now() < end, "{name} not ready within 60 s:\n{}", log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub struct Rotel {
    _child: Guarded,
    http: String,
    dir: TempDir,
}

impl Rotel {
    /// Started and ready (its OTLP/HTTP port accepts connections).
    pub fn start() -> Self {
        let bin = rotel();
        let dir = TempDir::new("rotel");
        let [http, grpc] = free_ports();
        let (http, grpc) = (format!("127.0.0.1:{http}"), format!("127.0.0.1:{grpc}"));
        let out = File::create(dir.path("rotel.out")).expect("rotel.out");
        // Without --daemon rotel stays in the foreground and logs (its debug log included) to
        // stdout; --log-file and --pid-file are only used by --daemon, but point into the temp
        // dir so that no run touches /tmp/rotel-agent.*.
        let child = Command::new(&bin)
            .arg("start")
            .args(["--otlp-http-endpoint", &http, "--otlp-grpc-endpoint", &grpc])
            .args(["--exporter", "blackhole"])
            .args(["--debug-log", "metrics", "--debug-log", "logs"])
            .args(["--debug-log-verbosity", "detailed"])
            .arg("--log-file")
            .arg(dir.path("rotel.log"))
            .arg("--pid-file")
            .arg(dir.path("rotel.pid"))
            // Plain text: its tracing output has colour codes even into a file otherwise.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("rotel.out"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let mut child = Guarded(child);
        let out = || std::fs::read_to_string(dir.path("rotel.out")).unwrap_or_default();
        wait_ready("rotel", &mut child.0, out, || TcpStream::connect(&http).is_ok());
        Self { _child: child, http, dir }
    }

    /// Where OTLP/HTTP logs (protobuf `ExportLogsServiceRequest`) are POSTed.
    pub fn otlp_logs_url(&self) -> String {
        format!("http://{}/v1/logs", self.http)
    }

    /// Where OTLP/HTTP metrics (protobuf `ExportMetricsServiceRequest`) are POSTed.
    pub fn otlp_metrics_url(&self) -> String {
        format!("http://{}/v1/metrics", self.http)
    }

    /// Everything rotel printed so far: its start-up lines, then what its debug log says about
    /// each batch of metrics and log records received.
    pub fn received(&self) -> String {
        std::fs::read_to_string(self.dir.path("rotel.out")).unwrap_or_default()
    }
}
