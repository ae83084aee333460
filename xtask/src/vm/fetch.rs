//! Debian kernels for the matrix: downloaded with a private apt state (never installed into the
//! host), unpacked once under `<target>/vm/kernels/<series>/`, the newest of each series at the
//! time of the first fetch.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::util::{output, run_cmd};

/// An unpacked kernel: its image and module tree.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// `uname -r` of the kernel, e.g. `6.1.0-57-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
    /// The directory that holds `lib/modules/<release>` (modprobe's `-d`).
    pub module_base: PathBuf,
}

impl Kernel {
    pub fn module_dir(&self) -> PathBuf {
        self.module_base.join("lib/modules").join(&self.release)
    }
}

/// The Debian suites that carry the kernels of the matrix (5.10: bullseye, 6.1: bookworm, 6.12:
/// bookworm-backports and trixie, 7.x: sid), main and security archives.
const SUITES: &str = "bookworm bookworm-backports trixie bullseye sid";
const SECURITY_SUITES: &str = "bookworm-security trixie-security bullseye-security";

/// The host's Debian mirror and security mirror, from its apt sources.
fn mirrors() -> (String, String) {
    let sources = std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources")
        .or_else(|_| std::fs::read_to_string("/etc/apt/sources.list"))
        .unwrap_or_default();
    let uris: Vec<String> = sources
        .lines()
        .filter_map(|l| {
            l.strip_prefix("URIs:")
                .map(str::trim)
                .or_else(|| l.strip_prefix("deb ").and_then(|r| r.split_whitespace().next()))
        })
        .map(str::to_string)
        .collect();
    let main = uris
        .iter()
        .find(|u| !u.contains("security"))
        .cloned()
        .unwrap_or_else(|| "http://deb.debian.org/debian".into());
    let security = uris
        .iter()
        .find(|u| u.contains("security"))
        .cloned()
        .unwrap_or_else(|| "http://deb.debian.org/debian-security".into());
    (main, security)
}

/// A private apt configuration under `dir` (its own lists and cache), and `apt-get update` on it
/// once per fetch.
fn apt_config(dir: &Path) -> anyhow::Result<PathBuf> {
    let a = dir.join("apt");
    for d in ["lists/partial", "cache/archives/partial", "etc/sources.list.d", "etc/preferences.d"]
    {
        std::fs::create_dir_all(a.join(d))?;
    }
    let (main, security) = mirrors();
    let key = "/usr/share/keyrings/debian-archive-keyring.gpg";
    std::fs::write(
        a.join("etc/sources.list.d/vm-kernels.sources"),
        format!(
            "Types: deb\nURIs: {main}\nSuites: {SUITES}\nComponents: main\nSigned-By: {key}\n\n\
             Types: deb\nURIs: {security}\nSuites: {SECURITY_SUITES}\nComponents: main\nSigned-By: {key}\n"
        ),
    )?;
    let conf = dir.join("apt.conf");
    let a = a.display();
    std::fs::write(
        &conf,
        format!(
            "Dir::Etc::SourceList \"/dev/null\";\nDir::Etc::SourceParts \"{a}/etc/sources.list.d\";\n\
             Dir::Etc::Preferences \"/dev/null\";\nDir::Etc::PreferencesParts \"{a}/etc/preferences.d\";\n\
             Dir::State::Lists \"{a}/lists\";\nDir::Cache \"{a}/cache\";\n\
             APT::Sandbox::User \"root\";\n"
        ),
    )?;
    Ok(conf)
}

/// Numbers of a version string, for ordering: `6.12.118+deb13` -> [6, 12, 118, 13].
fn version_key(v: &str) -> Vec<u64> {
    v.split(|c: char| !c.is_ascii_digit()).filter_map(|t| t.parse().ok()).collect()
}

/// The newest generic amd64 kernel release of `series` among apt's package names, and the
/// packages that carry it (an image package, or sid's split binary + modules + base).
pub fn pick(series: &str, names: &[String]) -> Option<(String, Vec<String>)> {
    let releases = names.iter().filter_map(|n| {
        let rest = n.strip_prefix("linux-image-").or_else(|| n.strip_prefix("linux-binary-"))?;
        let release = rest.strip_suffix("-unsigned").unwrap_or(rest);
        let version = release.strip_suffix("-amd64")?;
        let generic = !version.contains("-cloud") && !version.contains("-rt");
        let in_series = version.strip_prefix(series).is_some_and(|r| r.starts_with(['.', '-']));
        (generic && in_series).then(|| release.to_string())
    });
    let release = releases.max_by(|a, b| version_key(a).cmp(&version_key(b)).then(a.cmp(b)))?;
    let has = |n: &str| names.iter().any(|x| x == n);
    let packages: Vec<String> = if has(&format!("linux-binary-{release}")) {
        ["binary", "modules", "base"]
            .iter()
            .map(|p| format!("linux-{p}-{release}"))
            .filter(|p| has(p))
            .collect()
    } else if has(&format!("linux-image-{release}-unsigned")) {
        vec![format!("linux-image-{release}-unsigned")]
    } else {
        vec![format!("linux-image-{release}")]
    };
    Some((release, packages))
}

/// The kernel of `series`, fetched and unpacked on first use under `cache`.
pub fn kernel(cache: &Path, series: &str) -> anyhow::Result<Kernel> {
    let dir = cache.join(series);
    let done = dir.join("release");
    if let Ok(release) = std::fs::read_to_string(&done) {
        return locate(&dir.join("root"), release.trim());
    }
    eprintln!("xtask: vm-test: fetching the newest Debian {series} kernel");
    let apt = apt_config(cache)?;
    run_cmd(Command::new("apt-get").args(["update", "-qq"]).env("APT_CONFIG", &apt))?;
    let mut names = Vec::new();
    for prefix in ["linux-image-", "linux-binary-", "linux-modules-", "linux-base-"] {
        let out =
            output(Command::new("apt-cache").args(["pkgnames", prefix]).env("APT_CONFIG", &apt))
                .unwrap_or_default();
        names.extend(out.lines().map(str::to_string));
    }
    let Some((release, packages)) = pick(series, &names) else {
        bail!("Debian's archive has no generic amd64 kernel of the {series} series");
    };
    eprintln!("xtask: vm-test: {series} is {release} ({})", packages.join(", "));
    let debs = dir.join("debs");
    let root = dir.join("root");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&debs)?;
    run_cmd(
        Command::new("apt-get")
            .arg("download")
            .args(&packages)
            .env("APT_CONFIG", &apt)
            .current_dir(&debs),
    )?;
    for deb in std::fs::read_dir(&debs)? {
        run_cmd(Command::new("dpkg").arg("-x").arg(deb?.path()).arg(&root))?;
    }
    // The debs are not needed once unpacked.
    let _ = std::fs::remove_dir_all(&debs);
    let k = locate(&root, &release)?;
    std::fs::write(&done, &release)?;
    Ok(k)
}

/// Finds the image and the module tree of an unpacked kernel (`/boot` and `/lib`, or `/usr/lib`
/// in the split packages), making `modules.dep` where the package ships none.
fn locate(root: &Path, release: &str) -> anyhow::Result<Kernel> {
    let module_base = [root.to_path_buf(), root.join("usr")]
        .into_iter()
        .find(|b| b.join("lib/modules").join(release).is_dir())
        .with_context(|| format!("no lib/modules/{release} in {}", root.display()))?;
    let vmlinuz = [
        root.join("boot").join(format!("vmlinuz-{release}")),
        module_base.join("lib/modules").join(release).join("vmlinuz"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .with_context(|| format!("no vmlinuz for {release} in {}", root.display()))?;
    let k = Kernel { release: release.to_string(), vmlinuz, module_base };
    if !k.module_dir().join("modules.dep").is_file() {
        run_cmd(Command::new("depmod").arg("-b").arg(&k.module_base).arg(release))?;
    }
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::pick;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn picks_the_newest_generic_kernel_of_a_series() {
        let n = names(&[
            "linux-image-6.1.0-9-amd64-unsigned",
            "linux-image-6.1.0-57-amd64-unsigned",
            "linux-image-6.1.0-57-amd64",
            "linux-image-6.1.0-58-cloud-amd64-unsigned",
            "linux-image-6.12.118+deb12-amd64-unsigned",
            "linux-image-5.10.0-46-amd64-unsigned",
        ]);
        assert_eq!(
            pick("6.1", &n),
            Some((
                "6.1.0-57-amd64".to_string(),
                vec!["linux-image-6.1.0-57-amd64-unsigned".to_string()]
            ))
        );
        assert_eq!(pick("6.12", &n).map(|p| p.0), Some("6.12.118+deb12-amd64".to_string()));
        assert_eq!(pick("5.10", &n).map(|p| p.0), Some("5.10.0-46-amd64".to_string()));
        assert_eq!(pick("6.6", &n), None);
    }

    #[test]
    fn split_packages_bring_binary_modules_and_base() {
        let n = names(&[
            "linux-image-7.2.13+deb14-amd64",
            "linux-binary-7.2.13+deb14-amd64",
            "linux-binary-7.2.13+deb14-rt-amd64",
            "linux-modules-7.2.13+deb14-amd64",
            "linux-base-7.2.13+deb14-amd64",
        ]);
        let (release, packages) = pick("7.2", &n).expect("7.2");
        assert_eq!(release, "7.2.13+deb14-amd64");
        assert_eq!(
            packages,
            names(&[
                "linux-binary-7.2.13+deb14-amd64",
                "linux-modules-7.2.13+deb14-amd64",
                "linux-base-7.2.13+deb14-amd64"
            ])
        );
    }
}
