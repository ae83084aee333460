//! Booting one kernel under qemu: a busybox initramfs (`xtask/vm/init`) that mounts the host's
//! root read-only over 9p, and the qemu command line. Software emulation (TCG): the host's
//! /dev/kvm cannot run stock kernels.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::fetch::Kernel;
use crate::util::run_cmd;

/// The initramfs's /init (busybox sh).
const INIT: &str = include_str!("../../vm/init");

/// Modules the boot needs before the host root is mounted (the rest load from it by modprobe).
const BOOT_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "overlay", "virtio_blk"];

/// `modprobe --show-depends` for the kernel's own module tree: the .ko files, in load order.
fn module_files(k: &Kernel) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = Vec::new();
    for m in BOOT_MODULES {
        let out = Command::new("modprobe")
            .arg("-d")
            .arg(&k.module_base)
            .args(["-S", &k.release, "--show-depends", m])
            .output()
            .context("running modprobe (kmod)")?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(ko) = line.strip_prefix("insmod ") {
                let ko = PathBuf::from(ko.split_whitespace().next().unwrap_or(ko));
                if !files.contains(&ko) {
                    files.push(ko);
                }
            }
        }
    }
    Ok(files)
}

/// Copies a module into the initramfs, decompressed (busybox insmod takes plain ELF).
fn copy_module(ko: &Path, mods: &Path) -> anyhow::Result<String> {
    let name = ko.file_name().context("module name")?.to_string_lossy().into_owned();
    let (plain, tool) = match name.rsplit_once('.') {
        Some((p, "xz")) => (p.to_string(), Some("xz")),
        Some((p, "zst")) => (p.to_string(), Some("zstd")),
        Some((p, "gz")) => (p.to_string(), Some("gzip")),
        _ => (name.clone(), None),
    };
    let dest = mods.join(&plain);
    match tool {
        Some(tool) => {
            let out = std::fs::File::create(&dest)?;
            run_cmd(Command::new(tool).args(["-dc"]).arg(ko).stdout(out))?;
        }
        None => {
            std::fs::copy(ko, &dest)?;
        }
    }
    Ok(plain)
}

/// Builds the initramfs for `k` at `out` (a gzip'd newc cpio).
pub fn initrd(k: &Kernel, work: &Path, out: &Path) -> anyhow::Result<()> {
    let st = work.join("initrd");
    let _ = std::fs::remove_dir_all(&st);
    for d in ["bin", "dev", "proc", "sys", "newroot", "mods"] {
        std::fs::create_dir_all(st.join(d))?;
    }
    std::fs::copy("/bin/busybox", st.join("bin/busybox")).context("copying /bin/busybox")?;
    for applet in ["sh", "mount", "insmod", "switch_root", "mkdir", "cat", "echo", "sed", "cut"] {
        std::os::unix::fs::symlink("busybox", st.join("bin").join(applet))?;
    }
    let mut order = String::new();
    for ko in module_files(k)? {
        order.push_str(&copy_module(&ko, &st.join("mods"))?);
        order.push('\n');
    }
    std::fs::write(st.join("mods/order"), order)?;
    let init = st.join("init");
    std::fs::write(&init, INIT)?;
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    run_cmd(
        Command::new("sh")
            .arg("-c")
            .arg("find . | cpio -o -H newc --quiet | gzip -1 > \"$0\"")
            .arg(out)
            .current_dir(&st),
    )?;
    let _ = std::fs::remove_dir_all(&st);
    Ok(())
}

/// What to boot and run.
pub struct Boot<'a> {
    pub kernel: &'a Kernel,
    pub initrd: &'a Path,
    /// Run in the guest after switch_root, with `arg`.
    pub run: &'a Path,
    pub arg: &'a Path,
    /// A scratch disk image (virtio).
    pub disk: &'a Path,
    pub extra_cmdline: &'a str,
    pub timeout: Duration,
    /// A guest silent this long (no console line) is hung: stopped, and said so (`hung`).
    pub silence: Duration,
    /// Every console line goes here too.
    pub log: &'a Path,
}

/// The console output of a boot, line by line (CR stripped), and whether the guest finished
/// (powered off by itself) before the timeout.
pub struct Console {
    pub lines: Vec<String>,
    pub finished: bool,
    /// Stopped for printing nothing for `Boot::silence`.
    pub hung: bool,
    pub wall: Duration,
}

fn qemu_command(b: &Boot) -> Command {
    let mut cmdline = format!(
        "console=ttyS0 quiet loglevel=1 panic=-1 rdinit=/init vmtest_moddir={} vmtest_run={} vmtest_arg={}",
        b.kernel.module_dir().display(),
        b.run.display(),
        b.arg.display()
    );
    if !b.extra_cmdline.is_empty() {
        cmdline.push(' ');
        cmdline.push_str(b.extra_cmdline);
    }
    let mut c = Command::new("qemu-system-x86_64");
    c.args(["-accel", "tcg,thread=multi", "-M", "pc", "-cpu", "max", "-smp", "2", "-m", "4G"]);
    c.args(["-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio", "-no-reboot"]);
    // qboot boots in a fraction of SeaBIOS's time.
    if Path::new("/usr/share/qemu/qboot.rom").is_file() {
        c.args(["-bios", "/usr/share/qemu/qboot.rom"]);
    }
    c.arg("-kernel").arg(&b.kernel.vmlinuz).arg("-initrd").arg(b.initrd);
    c.arg("-append").arg(cmdline);
    c.args([
        "-fsdev",
        "local,id=hr,path=/,security_model=none,readonly=on,multidevs=remap",
        "-device",
        "virtio-9p-pci,fsdev=hr,mount_tag=hostroot",
    ]);
    c.arg("-drive").arg(format!("file={},format=raw,if=virtio,cache=unsafe", b.disk.display()));
    c
}

/// Boots, echoes the lines `show` selects as they come, and returns the whole console.
pub fn boot(b: &Boot, show: impl Fn(&str) -> bool) -> anyhow::Result<Console> {
    let start = Instant::now();
    let (reader, writer) = std::io::pipe()?;
    let mut cmd = qemu_command(b);
    cmd.stdin(Stdio::null()).stdout(writer.try_clone()?).stderr(writer);
    let mut child = cmd.spawn().context("starting qemu-system-x86_64")?;
    drop(cmd);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).split(b'\n').map_while(Result::ok) {
            let line = String::from_utf8_lossy(&line).replace('\r', "");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = std::fs::File::create(b.log)?;
    let mut lines = Vec::new();
    let end = start + b.timeout;
    // The guest's own output, not its kernel's log: a guest whose kernel prints a soft lockup
    // every half minute and runs nothing else is as hung as a silent one.
    let mut last_progress = Instant::now();
    let mut hung = false;
    let finished = loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                if !is_kernel_log(&line) {
                    last_progress = Instant::now();
                }
                use std::io::Write as _;
                let _ = writeln!(log, "{line}");
                if show(&line) {
                    eprintln!("  | {line}");
                }
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break true,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() > end {
            let _ = child.kill();
            break false;
        }
        if last_progress.elapsed() > b.silence {
            let _ = child.kill();
            hung = true;
            break false;
        }
    };
    let _ = child.wait();
    Ok(Console { lines, finished, hung, wall: start.elapsed() })
}

/// A line of the guest kernel's log (`[  764.998335] watchdog: ...`), not of the tests.
fn is_kernel_log(line: &str) -> bool {
    line.strip_prefix('[').and_then(|rest| rest.split_once(']')).is_some_and(|(stamp, _)| {
        let stamp = stamp.trim();
        !stamp.is_empty() && stamp.chars().all(|c| c.is_ascii_digit() || c == '.')
    })
}

#[cfg(test)]
mod kernel_log_tests {
    #[test]
    fn kernel_log_lines_are_told_from_the_tests() {
        assert!(super::is_kernel_log(
            "[  764.998335] watchdog: BUG: soft lockup - CPU#0 stuck for 22s!"
        ));
        assert!(super::is_kernel_log("[18.341519] Kernel panic - not syncing"));
        assert!(!super::is_kernel_log("@@BEGIN block_io uptime=10.07"));
        assert!(!super::is_kernel_log("test block_io ... ok"));
        assert!(!super::is_kernel_log("[DEBUG gpustall] x"));
    }
}
