//! The Debian package as a user gets it: installed with apt on this machine, its
//! `/usr/bin/gpustall` traces a job and reports on it, `man gpustall` finds the page, the unit
//! resolves to the packaged binary, the completions load, the rules and dashboard are the
//! repository's; then it is purged (by a guard, on failure too) and nothing of it is left.
//!
//! The package is built by `cargo xtask test` (`cargo xtask dist`: the glibc 2.17 release
//! binary and cargo-deb, minutes) and passed as `$GPUSTALL_TEST_DEB`: a cargo test cannot build
//! it.

use std::{
    path::{Path, PathBuf},
    process::Command,
};
use tests::{run_ok, stdout_ok};

const PACKAGE: &str = "gpustall";
const UNIT: &str = "/usr/lib/systemd/system/gpustall-watch.service";

/// What the package must hold, beside the binary and the unit.
const FILES: &[&str] = &[
    "/usr/bin/gpustall",
    UNIT,
    "/usr/share/man/man1/gpustall.1.gz",
    "/usr/share/bash-completion/completions/gpustall",
    "/usr/share/zsh/vendor-completions/_gpustall",
    "/usr/share/fish/vendor_completions.d/gpustall.fish",
    "/usr/share/gpustall/prometheus/gpustall-alerts.yml",
    "/usr/share/gpustall/grafana/gpustall-dashboard.json",
];

fn the_deb() -> PathBuf {
    const VAR: &str = "GPUSTALL_TEST_DEB";
    let deb = std::env::var_os(VAR).map(PathBuf::from).unwrap_or_else(|| {
        panic!("{VAR} is not set: run this test through `cargo xtask test`, which builds the package (cargo xtask dist)")
    });
    assert!(deb.is_file(), "{VAR}={} does not exist: run `cargo xtask test`", deb.display());
    deb
}

fn installed() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", PACKAGE])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("ok installed"))
}

/// The package installed; purged on drop, also when the test fails.
struct Installed;

impl Installed {
    fn new(deb: &Path) -> Self {
        assert!(
            !installed(),
            "the {PACKAGE} package is installed on this machine already: this test installs and purges its own (dpkg --purge {PACKAGE} first)"
        );
        let guard = Self;
        // apt rather than dpkg -i: what a user runs, and it would pull missing dependencies.
        run_ok(
            Command::new("apt-get")
                .args(["-o", "DPkg::Lock::Timeout=300", "install", "-y", "--no-install-recommends"])
                .arg(deb)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        );
        guard
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let purged = Command::new("dpkg").args(["--purge", PACKAGE]).output();
        if !purged.is_ok_and(|o| o.status.success()) {
            eprintln!("warning: dpkg --purge {PACKAGE} failed: remove it by hand");
        }
    }
}

/// `gpustall trace -- sleep 1` from the package: the job traced, the report says by which
/// gpustall, the summary has the job's process.
fn trace_from_the_package(version: &str) {
    let dir = tests::TempDir::new("deb");
    let summary_path = dir.path("summary.json");
    let o = run_ok(
        Command::new("/usr/bin/gpustall")
            .args(["trace", "--duration", "10", "--no-gpu", "--summary-json"])
            .arg(&summary_path)
            .args(["--", "sleep", "1"])
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID"),
    );
    let report = String::from_utf8_lossy(&o.stdout);
    let tool = format!("gpustall {version}");
    assert!(report.contains(&tool), "the report names {tool}:\n{report}");
    assert!(report.contains("(sleep 1)"), "the report names the traced command:\n{report}");
    let text = std::fs::read_to_string(&summary_path).expect("the summary");
    let summary: serde_json::Value = serde_json::from_str(&text).expect("summary JSON");
    let procs = summary["processes"].as_array().expect("processes");
    assert!(procs.iter().any(|p| p["comm"] == "sleep"), "sleep traced: {procs:?}");
    assert_eq!(summary["origin"]["tool"], tool.as_str(), "{}", summary["origin"]);
}

/// The man page found by man and rendered; the unit's `ExecStart=gpustall` resolved by systemd
/// to an executable (verify fails on a command it cannot find); the bash completion loads.
fn man_unit_and_completions() {
    let page = stdout_ok(Command::new("man").args(["-w", "gpustall"]));
    assert_eq!(page.trim(), "/usr/share/man/man1/gpustall.1.gz");
    let rendered = stdout_ok(Command::new("man").arg("gpustall").env("MANPAGER", "cat"));
    assert!(rendered.contains("trace") && rendered.contains("watch"), "{rendered}");
    run_ok(Command::new("systemd-analyze").args(["verify", UNIT]));
    let complete =
        stdout_ok(Command::new("bash").args([
            "-c",
            ". /usr/share/bash-completion/completions/gpustall && complete -p gpustall",
        ]));
    assert!(complete.contains("gpustall"), "{complete}");
}

/// The shipped rules, dashboard, unit and Slurm scripts are the repository's.
fn same_as_the_repository() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    for (shipped, source) in [
        ("/usr/share/gpustall/prometheus/gpustall-alerts.yml", "prometheus/gpustall-alerts.yml"),
        ("/usr/share/gpustall/grafana/gpustall-dashboard.json", "grafana/gpustall-dashboard.json"),
        (UNIT, "gpustall-watch.service"),
        ("/usr/share/gpustall/slurm/gpustall-prolog.sh", "slurm/gpustall-prolog.sh"),
        ("/usr/share/gpustall/slurm/gpustall-epilog.sh", "slurm/gpustall-epilog.sh"),
    ] {
        let (a, b) = (std::fs::read(shipped), std::fs::read(repo.join(source)));
        assert!(a.is_ok() && a.ok() == b.ok(), "{shipped} differs from deploy/{source}");
    }
}

#[test]
fn the_debian_package_installs_traces_and_removes_cleanly() {
    tests::require_privileged_env();
    let deb = the_deb();
    let _apt = tests::apt_lock();
    let package = Installed::new(&deb);
    let listed = stdout_ok(Command::new("dpkg").args(["-L", PACKAGE]));
    for f in FILES {
        assert!(listed.lines().any(|l| l == *f), "the package has no {f}:\n{listed}");
    }
    let version = stdout_ok(Command::new("dpkg-query").args(["-W", "-f=${Version}", PACKAGE]));
    // 0.1.0-1: the crate's version and the package's revision.
    let version = version.split('-').next().unwrap_or_default().to_string();
    trace_from_the_package(&version);
    man_unit_and_completions();
    same_as_the_repository();

    drop(package);
    assert!(!installed(), "{PACKAGE} is still installed after dpkg --purge");
    for f in FILES {
        assert!(!Path::new(f).exists(), "{f} is left after dpkg --purge");
    }
}
