//! `gpustall watch` run by a test: its stderr followed line by line, its metrics scraped; the
//! daemon is killed when the guard drops, also on a test's failure.

use std::{
    io::{BufRead, BufReader, Read, Write},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

pub struct Watcher {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Watcher {
    pub fn start(args: &[&str]) -> Self {
        let mut cmd = Command::new(crate::gpustall_bin());
        cmd.arg("watch").args(args);
        Self::spawn(cmd)
    }

    pub fn spawn(mut cmd: Command) -> Self {
        let mut child =
            cmd.stderr(Stdio::piped()).stdout(Stdio::null()).spawn().expect("gpustall watch");
        let err = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        Self { child, lines: rx, seen: Vec::new() }
    }

    /// The daemon's stderr lines read so far.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }

    /// Reads the daemon's stderr lines for `d`, whatever they say.
    pub fn read_for(&mut self, d: Duration) {
        let end = Instant::now() + d;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            if let Ok(l) = self.lines.recv_timeout(left.min(Duration::from_millis(100))) {
                self.seen.push(l);
            }
        }
    }

    /// Waits for a stderr line containing `needle`.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        if let Some(l) = self.seen.iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        while Instant::now() < end {
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(100)) {
                self.seen.push(l.clone());
                if l.contains(needle) {
                    return l;
                }
            }
            if let Ok(Some(s)) = self.child.try_wait() {
                panic!("gpustall watch exited ({s}):\n{}", self.seen.join("\n"));
            }
        }
        panic!("no {needle:?} from gpustall watch within {timeout:?}:\n{}", self.seen.join("\n"));
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `watch ARGS` charged to the memory cgroup `cg` from its first page (the shell moves itself
/// there, then execs gpustall).
pub fn in_cgroup(cg: &crate::cgroup::MemCgroup, args: &[&str]) -> Watcher {
    let procs = cg.path.join("cgroup.procs");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("echo $$ > {} && exec \"$0\" \"$@\"", procs.display()))
        .arg(crate::gpustall_bin())
        .arg("watch")
        .args(args);
    Watcher::spawn(cmd)
}

/// `watch` for the jobs `rule` matches, bundling into `dir` 2 s after an incident and serving
/// metrics on a free port: the watcher, once it serves, and that address.
pub fn bundling_watcher(rule: &str, dir: &str) -> (Watcher, String) {
    bundling_watcher_with(rule, dir, &[])
}

/// [`bundling_watcher`] with `extra` arguments.
pub fn bundling_watcher_with(rule: &str, dir: &str, extra: &[&str]) -> (Watcher, String) {
    let args = [
        "--match",
        rule,
        "--bundle-dir",
        dir,
        "--listen",
        "127.0.0.1:0",
        "--no-gpu",
        "--after",
        "2s",
        "--scan-every",
        "500ms",
    ];
    let args: Vec<&str> = args.iter().chain(extra).copied().collect();
    let mut w = Watcher::start(&args);
    let started = w.wait_for("metrics on http://", Duration::from_secs(60));
    let addr = started.split("http://").nth(1).and_then(|r| r.split('/').next()).expect("address");
    let addr = addr.to_string();
    (w, addr)
}

pub fn scrape(addr: &str) -> String {
    let body = get(addr, "/metrics");
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    body
}

/// `GET path` on the daemon's endpoint: the whole response, status line first.
pub fn get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .expect("request");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("response");
    body
}

/// The value of the first series starting with `prefix`.
pub fn value(metrics: &str, prefix: &str) -> Option<f64> {
    metrics.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}
