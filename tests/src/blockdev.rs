//! Stacked block devices for one test: a loop device over a file, a device-mapper target over
//! it, an md array over loop devices. Each is a guard that takes its device down on drop, on
//! failure too; names are unique to the test process.

use std::{path::Path, process::Command};

fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!("{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Loads a module if the kernel has it as one (a kernel with it built in, or without it, makes
/// this a no-op; the caller checks what it needs).
pub fn modprobe(module: &str) {
    let _ = Command::new("modprobe").arg(module).output();
}

/// `major:minor` of a block device as /sys/block/NAME/dev spells it.
pub fn dev_of(name: &str) -> String {
    std::fs::read_to_string(format!("/sys/block/{name}/dev"))
        .unwrap_or_else(|e| panic!("/sys/block/{name}/dev: {e}"))
        .trim()
        .to_string()
}

/// Bytes read and written by a whole block device so far, from /sys/block/NAME/stat (fields 3
/// and 7 are sectors read and written, 512 bytes each, whatever the device's block size).
pub fn stat_bytes(name: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/sys/block/{name}/stat"))
        .unwrap_or_else(|e| panic!("/sys/block/{name}/stat: {e}"));
    let f: Vec<u64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    (f[2] * 512, f[6] * 512)
}

/// Requests the device completed so far, reads + writes, from /sys/block/NAME/stat (fields 1
/// and 5; discards and flushes have fields of their own).
pub fn stat_completed(name: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/sys/block/{name}/stat"))
        .unwrap_or_else(|e| panic!("/sys/block/{name}/stat: {e}"));
    let f: Vec<u64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    f[0] + f[4]
}

/// Requests the device holds between start and completion now (/sys/block/NAME/inflight,
/// reads + writes).
pub fn in_flight(name: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/block/{name}/inflight"))
        .unwrap_or_else(|e| panic!("/sys/block/{name}/inflight: {e}"))
        .split_whitespace()
        .filter_map(|x| x.parse::<u64>().ok())
        .sum()
}

/// A block device used as swap (mkswap, swapon at a priority), swapped off on drop: drop it
/// before the device, and after whatever has pages on it (swapoff reads them all back).
pub struct SwapDevice {
    path: String,
}

impl SwapDevice {
    /// `priority` 32767 is the highest: used before any other swap area.
    pub fn on(path: &str, priority: i32) -> Result<Self, String> {
        run("mkswap", &["-q", path])?;
        run("swapon", &["-p", &priority.to_string(), path])?;
        Ok(Self { path: path.to_string() })
    }
}

impl Drop for SwapDevice {
    fn drop(&mut self) {
        if let Err(e) = run("swapoff", &[&self.path]) {
            eprintln!("could not swap off {}: {e}", self.path);
        }
    }
}

/// A loop device over a file, detached on drop.
pub struct LoopDevice {
    /// `/dev/loopN`.
    pub path: String,
}

impl LoopDevice {
    pub fn attach(file: &Path) -> Result<Self, String> {
        Self::attach_with(file, &[])
    }

    /// The same, with more `losetup` options (`--direct-io=on`: the loop reads and writes its
    /// file with O_DIRECT, so the file's page cache adds no memory of its own).
    pub fn attach_with(file: &Path, options: &[&str]) -> Result<Self, String> {
        let f = file.to_str().expect("utf-8 path");
        modprobe("loop");
        let mut args = vec!["--find", "--show"];
        args.extend(options);
        args.push(f);
        let path = run("losetup", &args)?;
        Ok(Self { path })
    }

    /// The loop reads and writes its file with O_DIRECT (/sys/block/NAME/loop/dio).
    pub fn direct_io(&self) -> bool {
        std::fs::read_to_string(format!("/sys/block/{}/loop/dio", self.name()))
            .is_ok_and(|s| s.trim() == "1")
    }

    /// `loopN`, its name under /sys/block.
    pub fn name(&self) -> &str {
        self.path.trim_start_matches("/dev/")
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = run("losetup", &["-d", &self.path]);
    }
}

/// A device-mapper device (`dmsetup create NAME` with a table), removed on drop.
pub struct DmDevice {
    pub name: String,
}

impl DmDevice {
    /// The kernel has device-mapper now (after loading dm_mod where it is a module).
    pub fn available() -> bool {
        modprobe("dm_mod");
        Path::new("/sys/class/misc/device-mapper").exists()
    }

    /// A dm-linear device over all of `lower` (a block device of `sectors` 512-byte sectors).
    pub fn linear(tag: &str, lower: &str, sectors: u64) -> Result<Self, String> {
        let name = format!("gpustall-{tag}-{}-{}", std::process::id(), crate::unique());
        let table = format!("0 {sectors} linear {lower} 0");
        run("dmsetup", &["create", &name, "--table", &table])?;
        let dm = Self { name };
        // Without udev (the VM), dmsetup makes /dev/mapper/NAME itself; with udev, wait for it.
        let _ = run("dmsetup", &["mknodes", &dm.name]);
        Ok(dm)
    }

    /// `/dev/mapper/NAME`.
    pub fn path(&self) -> String {
        format!("/dev/mapper/{}", self.name)
    }

    /// `dm-N`, its kernel name (under /sys/block).
    pub fn kernel_name(&self) -> String {
        let dirs = std::fs::read_dir("/sys/block").expect("/sys/block");
        dirs.filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| {
                std::fs::read_to_string(format!("/sys/block/{n}/dm/name"))
                    .is_ok_and(|s| s.trim() == self.name)
            })
            .unwrap_or_else(|| panic!("no /sys/block/dm-*/dm/name says {}", self.name))
    }
}

impl Drop for DmDevice {
    fn drop(&mut self) {
        // A process still holding it open (a killed dd not yet reaped) makes the first try fail.
        for _ in 0..20 {
            if run("dmsetup", &["remove", &self.name]).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("could not remove device-mapper device {}", self.name);
    }
}

/// A tracefs instance of its own recording some events, removed on drop: what the kernel
/// really fires, printed next to a test's figures.
pub struct TraceInstance {
    dir: std::path::PathBuf,
}

impl TraceInstance {
    pub fn new(tag: &str, events: &[&str]) -> Option<Self> {
        let name = format!("gpustall-{tag}-{}-{}", std::process::id(), crate::unique());
        let dir = Path::new("/sys/kernel/tracing/instances").join(name);
        std::fs::create_dir(&dir).ok()?;
        let t = Self { dir };
        let _ = std::fs::write(t.dir.join("buffer_size_kb"), "4096");
        for e in events {
            let _ = std::fs::write(t.dir.join("events").join(e).join("enable"), "1");
        }
        Some(t)
    }

    /// The lines recorded so far.
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("trace"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for TraceInstance {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("events/enable"), "0");
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// An md RAID1 array (mdadm, no bitmap, no resync), stopped on drop.
pub struct MdArray {
    /// `mdN`.
    name: String,
}

impl MdArray {
    /// The kernel has md RAID1 now (after loading raid1 where it is a module) and mdadm is here.
    pub fn available() -> bool {
        modprobe("raid1");
        let personality = std::fs::read_to_string("/proc/mdstat")
            .is_ok_and(|s| s.lines().next().is_some_and(|l| l.contains("raid1")));
        personality && run("mdadm", &["--version"]).is_ok()
    }

    /// A RAID1 of `devices`, on the first free `md1xx`.
    pub fn raid1(devices: &[&str]) -> Result<Self, String> {
        let n = (100..127)
            .find(|n| !Path::new(&format!("/sys/block/md{n}")).exists())
            .ok_or("no free md number in md100..md126")?;
        let md = Self { name: format!("md{n}") };
        let count = devices.len().to_string();
        let mut args = vec!["--create", "/dev/X", "--run", "--quiet", "--level=1"];
        let path = md.path();
        args[1] = &path;
        let count_arg = format!("--raid-devices={count}");
        args.extend([count_arg.as_str(), "--metadata=1.2", "--assume-clean", "--bitmap=none"]);
        args.extend(devices);
        run("mdadm", &args)?;
        Ok(md)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> String {
        format!("/dev/{}", self.name)
    }
}

impl Drop for MdArray {
    fn drop(&mut self) {
        for _ in 0..20 {
            if run("mdadm", &["--stop", &self.path()]).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("could not stop md array {}", self.name);
    }
}
