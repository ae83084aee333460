//! Real OpenTelemetry (OTLP/HTTP) receivers for end-to-end tests of what gpustall exports:
//! rotel, a collector that prints the metrics and log records it receives, and a Prometheus with
//! its OTLP receiver. Neither is in Debian bookworm at a usable version, so both are fetched once
//! into `target/test-tools` (rotel's binary out of its PyPI wheel; Prometheus from Debian trixie
//! through a private apt directory), one fetch at a time across test processes. A fetch that
//! fails panics: a test needing a receiver fails, never skips. Debian builds its prometheus
//! without the OTLP receiver (trixie's and sid's too), so `prometheus_otlp()` panics saying so
//! until a build with one can be fetched.
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
/// Prometheus's OTLP receiver (`--enable-feature=otlp-write-receiver`) came with 2.47.
const PROMETHEUS_MIN: (u32, u32) = (2, 47);

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

/// `(major, minor)` from `prometheus --version`'s "prometheus, version 2.53.3+ds1 (...)".
fn prometheus_version(out: &str) -> Option<(u32, u32)> {
    let v = out.split("version ").nth(1)?;
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The flag that turns on the OTLP receiver of the `prometheus` at `bin` (3.x:
/// `--web.enable-otlp-receiver`; 2.47 to 2.55: a feature flag), or None when the build has none:
/// Debian patches the receiver out of its packages (bookworm's to sid's, 3.5.3+ds1-6, have none).
fn otlp_flag(bin: &Path) -> Option<&'static str> {
    let o = Command::new(bin).arg("--help").output().ok()?;
    let help =
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    if help.contains("--web.enable-otlp-receiver") {
        Some("--web.enable-otlp-receiver")
    } else if help.contains("otlp-write-receiver") {
        Some("--enable-feature=otlp-write-receiver")
    } else {
        None
    }
}

/// A `prometheus` (>= 2.47) with the OTLP receiver: Debian trixie's package, downloaded with a
/// private apt configuration (the system's sources stay as they are) and unpacked, not installed.
/// Panics when that build has no OTLP receiver, as Debian's 2.53.3+ds1-2 has not.
pub fn prometheus_otlp() -> PathBuf {
    let bin = prometheus_trixie();
    assert!(
        otlp_flag(&bin).is_some(),
        "{} ({}) is built without the OTLP receiver (Debian patches it out): no Prometheus with one is packaged where these tests can fetch from",
        bin.display(),
        version_of(&bin).unwrap_or_default().lines().next().unwrap_or_default()
    );
    bin
}

/// Debian trixie's `prometheus` (>= 2.47), fetched once.
fn prometheus_trixie() -> PathBuf {
    let dir = tools_dir().join("prometheus-trixie");
    let bin = dir.join("root/usr/bin/prometheus");
    let usable = || version_of(&bin).and_then(|v| prometheus_version(&v)) >= Some(PROMETHEUS_MIN);
    if usable() {
        return bin;
    }
    let _lock = lock();
    if usable() {
        return bin;
    }
    eprintln!("fetching Prometheus from Debian trixie into {}", dir.display());
    let apt = dir.join("apt");
    let debs = dir.join("debs");
    let _ = std::fs::remove_dir_all(&debs);
    let _ = std::fs::remove_dir_all(dir.join("root"));
    for d in ["sources.list.d", "preferences.d", "lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(apt.join(d)).expect("the private apt directory");
    }
    std::fs::create_dir_all(&debs).expect("the download directory");
    let sources = apt.join("sources.list");
    std::fs::write(
        &sources,
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main\n",
    )
    .expect("the private sources.list");
    let apt_get = |args: &[&str]| {
        let mut c = Command::new("apt-get");
        let opt = |k: &str, v: &Path| format!("{k}={}", v.display());
        // Only trixie's list, kept here: the system's sources, pins and lists are not read.
        for o in [
            opt("Dir::Etc::SourceList", &sources),
            opt("Dir::Etc::SourceParts", &apt.join("sources.list.d")),
            opt("Dir::Etc::Preferences", &apt.join("preferences")),
            opt("Dir::Etc::PreferencesParts", &apt.join("preferences.d")),
            opt("Dir::State::Lists", &apt.join("lists")),
            opt("Dir::Cache", &apt.join("cache")),
        ] {
            c.args(["-o", &o]);
        }
        // As root apt downloads as _apt, which may not reach a directory under /work or /root.
        c.args(["-o", "APT::Sandbox::User=root", "-q"]).args(args).current_dir(&debs);
        c.env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    run("apt-get update (private trixie list)", &mut apt_get(&["update"]));
    run("apt-get download prometheus (trixie)", &mut apt_get(&["download", "prometheus"]));
    let deb = std::fs::read_dir(&debs)
        .expect("the download directory")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .unwrap_or_else(|| {
            panic!("apt-get download prometheus left no .deb in {}", debs.display())
        });
    run(
        "dpkg-deb -x (trixie prometheus)",
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(dir.join("root")),
    );
    let v = version_of(&bin)
        .unwrap_or_else(|| panic!("{} (from {}) does not run", bin.display(), deb.display()));
    assert!(
        prometheus_version(&v) >= Some(PROMETHEUS_MIN),
        "Debian trixie's prometheus is older than 2.47 (no OTLP receiver): {}",
        v.lines().next().unwrap_or_default()
    );
    bin
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

/// The body of a raw HTTP/1.1 response (as `watcher::get` returns it), and its status line.
fn split_response(resp: &str) -> (&str, String) {
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((resp, ""));
    let status = head.lines().next().unwrap_or_default();
    if !head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return (status, body.to_string());
    }
    // Chunked: size line, data, CRLF, ... up to the empty chunk.
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    (status, out)
}

/// `s` percent-encoded for a URL's query (everything but RFC 3986's unreserved characters).
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus of its own with the OTLP receiver on: loopback only, a temporary data directory,
/// no scrape jobs (what it holds came through OTLP).
pub struct Prometheus {
    _child: Guarded,
    addr: String,
    dir: TempDir,
}

impl Prometheus {
    /// Started and ready (`/-/ready` answers 200).
    pub fn start() -> Self {
        let bin = prometheus_otlp();
        let dir = TempDir::new("prometheus-otlp");
        let config = dir.path("prometheus.yml");
        std::fs::write(&config, "global: {evaluation_interval: 1s}\nscrape_configs: []\n")
            .expect("prometheus.yml");
        let [port] = free_ports();
        let addr = format!("127.0.0.1:{port}");
        let log = File::create(dir.path("prometheus.log")).expect("prometheus.log");
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg(otlp_flag(&bin).expect("checked by prometheus_otlp"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        // Guarded before the wait, so that a start that fails is killed too.
        let mut child = Guarded(child);
        let log = || std::fs::read_to_string(dir.path("prometheus.log")).unwrap_or_default();
        wait_ready("prometheus", &mut child.0, log, || {
            TcpStream::connect(&addr).is_ok()
                && split_response(&crate::watcher::get(&addr, "/-/ready")).0.contains(" 200")
        });
        Self { _child: child, addr, dir }
    }

    /// Where OTLP/HTTP metrics (protobuf `ExportMetricsServiceRequest`) are POSTed.
    pub fn otlp_metrics_url(&self) -> String {
        format!("http://{}/api/v1/otlp/v1/metrics", self.addr)
    }

    /// The `data.result` array of an instant query (`/api/v1/query`).
    pub fn query(&self, promql: &str) -> serde_json::Value {
        let path = format!("/api/v1/query?query={}", url_encode(promql));
        let resp = crate::watcher::get(&self.addr, &path);
        let (status, body) = split_response(&resp);
        let v: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("query {promql:?}: {status}: {e}: {body}"));
        assert_eq!(v["status"], "success", "query {promql:?}: {status}: {body}");
        v["data"]["result"].clone()
    }

    /// What Prometheus logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path("prometheus.log")).unwrap_or_default()
    }
}

/// rotel as an OTLP receiver that prints the metrics and log records it receives (its debug log,
/// detailed) and exports nothing (the blackhole exporter); loopback only.
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
