//! A job whose cgroup limits its block reads (v1 blkio.throttle.read_bps_device, v2 io.max),
//! as systemd's IOReadBandwidthMax=, docker's --device-read-bps or a node policy do: 2
//! workers read 4 MiB samples with O_DIRECT from a loop device limited to 8 MiB/s. The throttle
//! holds their bios and issues them from a kernel thread, so the block layer's requests are no
//! process's: the verdict names the limit, and each worker is credited with what it read.
//! The job runs 9 s, so the agent's second reading of the limits (10 s after its first) comes
//! about when the job exits: it once replaced the limits with the root cgroup's none.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tests::{
    blockdev::{dev_of, LoopDevice},
    procs::{Tracer, Workload},
};

const LIMIT: u64 = 8 << 20;

/// A block I/O cgroup of this test's own with a read limit on one device, removed on drop.
struct IoCgroup(PathBuf);

impl IoCgroup {
    fn limiting(dev: &str, bps: u64) -> Self {
        let tag = format!("gpustall-test-io-{}-{}", std::process::id(), tests::unique());
        let v1 = Path::new("/sys/fs/cgroup/blkio");
        if v1.join("blkio.throttle.read_bps_device").exists() {
            let d = v1.join(tag);
            std::fs::create_dir(&d).expect("a blkio cgroup");
            std::fs::write(d.join("blkio.throttle.read_bps_device"), format!("{dev} {bps}"))
                .expect("the read limit");
            return Self(d);
        }
        let root = Path::new("/sys/fs/cgroup");
        let _ = std::fs::write(root.join("cgroup.subtree_control"), "+io");
        let d = root.join(tag);
        std::fs::create_dir(&d).expect("a cgroup");
        std::fs::write(d.join("io.max"), format!("{dev} rbps={bps}")).expect("io.max");
        Self(d)
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).expect("into the cgroup");
    }
}

impl Drop for IoCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn reads_held_by_a_cgroup_io_limit_are_named_with_the_limit_and_credited_to_their_readers() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new_in("/var/tmp", "io-throttle");
    let backing = dir.path("disk.img");
    std::fs::File::create(&backing).and_then(|f| f.set_len(256 << 20)).expect("a backing file");
    let lo = LoopDevice::attach(&backing).expect("a loop device");
    let dev = dev_of(lo.name());
    let cg = IoCgroup::limiting(&dev, LIMIT);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/jobs.py");
    let args = [
        "-u",
        script.to_str().expect("utf-8"),
        "reader",
        "--device",
        &lo.path,
        "--workers",
        "2",
        "--seconds",
        "9",
        "--wait-go",
    ];
    let mut w = Workload::start(Path::new("python3"), &args, None);
    cg.add(w.pid());
    let tracer = Tracer::start(w.pid(), &["--quiet", "--no-gpu"]);
    w.go();
    let (code, lines) = w.wait(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{lines:?}");
    let t = tracer.wait(Duration::from_secs(30));
    let v = &t.summary["verdict"];
    eprintln!("verdict: {v:#}");
    assert_eq!(v["cause"], "io_throttled", "{v:#}");
    let text = v["text"].as_str().expect("text");
    assert!(text.contains("8.0 MiB/s of reads") && text.contains(lo.name()), "{text}");
    // Each worker is credited with what it says it read, within 10 %.
    let done: Vec<&Value> = lines.iter().filter(|l| l["role"] == "worker_done").collect();
    assert_eq!(done.len(), 2, "{lines:?}");
    for d in done {
        let pid = d["pid"].as_u64().expect("pid") as u32;
        let read = d["read_bytes"].as_u64().expect("read_bytes") as f64;
        let credited = t.process(pid)["block_read_bytes"].as_u64().unwrap_or(0) as f64;
        eprintln!(
            "worker {pid}: read {:.1} MiB, credited {:.1} MiB",
            read / 1048576.0,
            credited / 1048576.0
        );
        assert!(
            (credited - read).abs() <= 0.1 * read,
            "worker {pid}: read {read}, credited {credited}"
        );
    }
    drop(cg);
}
