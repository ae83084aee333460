//! Debian packages a test needs (Prometheus, Chromium), installed when missing: one install at
//! a time across test processes (apt holds its own lock, but a second apt-get would fail on it
//! rather than wait), without the recommended extras.

use std::process::Command;

/// A machine-wide lock (flock) held while a test installs or removes a package: apt and dpkg
/// hold their own lock, but a second apt-get fails on it rather than wait long enough.
pub fn lock() -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::create("/run/lock/gpustall-tests-apt.lock").expect("the apt lock file");
    // SAFETY: a valid fd; the lock goes with the file.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
    f
}

/// Installs `package` unless `present()` says it is there (checked again under the lock);
/// panics naming the package when apt cannot.
pub fn ensure(package: &str, present: impl Fn() -> bool) {
    if present() {
        return;
    }
    let _lock = lock();
    if present() {
        return;
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=300"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    eprintln!("installing Debian's {package} package (apt-get install --no-install-recommends)");
    let install = ["install", "-y", "--no-install-recommends", package];
    let ok = apt(&install) || (apt(&["update"]) && apt(&install));
    assert!(ok, "apt-get install {package} failed: this test needs it");
}
