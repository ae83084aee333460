//! Unit tests of the parent module.
use super::*;
use crate::model::host::{disk_busy, vm_delta, VmDelta};

/// A temp dir removed on drop, to fake /proc and /sys/fs/cgroup.
pub(crate) struct FakeRoot(pub PathBuf);

impl FakeRoot {
    pub fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("gpustall-hostctx-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("test setup");
        FakeRoot(dir)
    }

    pub fn write(&self, rel: &str, text: &str) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().expect("test setup")).expect("test setup");
        std::fs::write(p, text).expect("test setup");
    }

    pub fn mkdir(&self, rel: &str) {
        std::fs::create_dir_all(self.0.join(rel)).expect("test setup");
    }
}

impl Drop for FakeRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn vm_delta_sums_allocstall_and_saturates() {
    let before = parse_vmstat_keys(
        "pswpin 10\npswpout 100\npgmajfault 5\noom_kill 0\npgscan_direct 1000\n\
         pgsteal_direct 900\npgscan_kswapd 50\nallocstall_normal 2\nallocstall_movable 1\n",
        |_| true,
    );
    let after = parse_vmstat_keys(
        "pswpin 15\npswpout 400\npgmajfault 4\noom_kill 1\npgscan_direct 3000\n\
         pgsteal_direct 2500\npgscan_kswapd 80\nallocstall_normal 7\nallocstall_movable 3\n\
         allocstall_dma32 1\n",
        |_| true,
    );
    let d = vm_delta(&before, &after);
    let want = VmDelta {
        pswpin: 5,
        pswpout: 300,
        pgmajfault: 0, // went backwards: saturates, never wraps
        oom_kill: 1,
        pgscan_direct: 2000,
        pgsteal_direct: 1600,
        pgscan_kswapd: 30,
        allocstall: 5 + 2 + 1,
    };
    assert_eq!(d, want);
    assert!(!read_vmstat_keys(|_| true).is_empty(), "/proc/vmstat is readable on Linux");
}

const DISKSTATS_1: &str = "\
 259       0 nvme0n1 1000 0 2048 10 500 0 4096 20 0 1000 30 0 0 0 0 0 0
 259       1 nvme0n1p1 900 0 2000 9 400 0 4000 19 0 900 28 0 0 0 0 0 0
   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0
   8       0 sda 10 0 8 1 1 0 8 1 0 100 2
garbage line
";

const DISKSTATS_2: &str = "\
 259       0 nvme0n1 1100 0 4096 12 900 0 8192 40 3 1900 50 0 0 0 0 0 0
 259       1 nvme0n1p1 1000 0 4000 11 800 0 8000 38 3 1800 48 0 0 0 0 0 0
   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0
   8       0 sda 10 0 8 1 1 0 8 1 0 3000 2
   8      16 sdb 1 0 8 1 1 0 8 1 0 100 2
";

#[test]
fn diskstats_parse_and_busy() {
    let before = parse_diskstats(DISKSTATS_1);
    assert_eq!(before.len(), 4);
    assert_eq!(
        before[0],
        DiskStat {
            name: "nvme0n1".into(),
            major: 259,
            minor: 0,
            read_bytes: 2048 * 512,
            write_bytes: 4096 * 512,
            io_ticks_ms: 1000,
            lower: vec![],
        }
    );
    let after = parse_diskstats(DISKSTATS_2);
    let busy = disk_busy(&before, &after, 1000);
    // sdb has no baseline.
    let names: Vec<&str> = busy.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["nvme0n1", "nvme0n1p1", "loop0", "sda"]);
    assert_eq!(busy[0].dev, "259:0");
    assert!((busy[0].busy_pct - 90.0).abs() < 1e-9);
    assert_eq!((busy[0].read_bytes, busy[0].write_bytes), (2048 * 512, 4096 * 512));
    assert_eq!(busy[3].busy_pct, 100.0, "clamped");
    assert_eq!(disk_busy(&before, &after, 0)[0].busy_pct, 0.0);
}

#[test]
fn whole_disks_drop_partitions_and_idle_loops() {
    let r = FakeRoot::new("sysblock");
    for d in ["nvme0n1", "loop0", "sda"] {
        r.mkdir(&format!("block/{d}"));
    }
    let kept = DiskTopology::new(&r.0.join("block")).whole_disks(parse_diskstats(DISKSTATS_2));
    let names: Vec<&str> = kept.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["nvme0n1", "sda"]);
}

#[test]
fn stacked_devices_name_what_they_sit_on() {
    let r = FakeRoot::new("sysblock-stacked");
    for d in ["block/nvme0n1", "block/sda", "block/sda/slaves"] {
        r.mkdir(d);
    }
    // A RAID1 (or LVM) over two partitions: slaves/ holds one entry per lower device.
    r.mkdir("block/sda/slaves/sdb1");
    r.mkdir("block/sda/slaves/nvme0n1p1");
    let kept = DiskTopology::new(&r.0.join("block")).whole_disks(parse_diskstats(DISKSTATS_2));
    let sda = kept.iter().find(|d| d.name == "sda").expect("sda kept");
    assert_eq!(sda.lower, ["nvme0n1p1", "sdb1"]);
    assert!(kept.iter().find(|d| d.name == "nvme0n1").is_some_and(|d| d.lower.is_empty()));
}

#[test]
fn disks_are_looked_up_again_when_the_names_change() {
    let r = FakeRoot::new("sysblock-cache");
    r.mkdir("block/sda");
    let mut topo = DiskTopology::new(&r.0.join("block"));
    let names = |d: Vec<DiskStat>| d.into_iter().map(|d| d.name).collect::<Vec<_>>();
    let line = |name: &str| format!("8 0 {name} 1 0 8 1 1 0 8 1 0 1 2 0 0 0 0\n");
    assert_eq!(names(topo.whole_disks(parse_diskstats(&line("sda")))), ["sda"]);
    // The same names: /sys/block is not looked at again.
    r.mkdir("block/sda/slaves/nvme0n1p1");
    assert!(topo.whole_disks(parse_diskstats(&line("sda")))[0].lower.is_empty());
    // A device appears: everything is looked up again.
    r.mkdir("block/sdb");
    let both = topo.whole_disks(parse_diskstats(&(line("sda") + &line("sdb"))));
    assert_eq!(both[0].lower, ["nvme0n1p1"]);
    assert_eq!(names(both), ["sda", "sdb"]);
}

#[test]
fn meminfo_gives_the_host_figures() {
    let text = "MemTotal:       24683664 kB\nMemFree:        19409396 kB\n\
                MemAvailable:   23907756 kB\nBuffers: 1 kB\nSwapTotal: 1048572 kB\n\
                SwapFree: 1000 kB\n";
    let m = parse_meminfo(text).expect("parses");
    assert_eq!(
        (m.mem_total_kb, m.mem_available_kb, m.swap_total_kb, m.swap_free_kb),
        (24683664, 23907756, 1048572, 1000)
    );
    // Before Linux 3.14: no MemAvailable, free memory stands for it.
    let old = parse_meminfo("MemTotal: 100 kB\nMemFree: 40 kB\n").expect("parses");
    assert_eq!((old.mem_available_kb, old.swap_total_kb), (40, 0));
    assert!(parse_meminfo("MemFree: 40 kB\n").is_none());
    assert!(read_host_mem().is_some_and(|m| m.mem_total_kb > 0));
}

#[test]
fn fs_usage_of_root_is_sane() {
    let u = fs_usage_of(&open_dir(Path::new("/")).expect("test setup")).expect("statvfs");
    assert!(u.total_bytes > 0);
    assert!(u.avail_bytes <= u.total_bytes);
    assert!((0.0..=100.0).contains(&u.used_pct), "{u:?}");
    assert!(u.dev.as_deref().is_some_and(|d| d.contains(':')), "{u:?}");
    assert!(open_dir(Path::new("/no/such/dir/gpustall")).is_none());
}

#[test]
fn a_fifo_where_a_directory_should_be_is_refused_without_blocking() {
    let dir = std::env::temp_dir().join(format!("gpustall-fifo-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("no NUL");
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    // No writer: an open that waited for one would hang this test.
    assert!(open_dir(&dir).is_none());
    std::fs::remove_file(&dir).expect("cleanup");
}

#[test]
fn task_state_of_this_process() {
    let me = std::process::id();
    // Burn a little CPU so utime is not 0 at tick granularity.
    let mut x = 0u64;
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(30) {
        x = x.wrapping_add(std::hint::black_box(1));
    }
    std::hint::black_box(x);
    let t = task_state(me).expect("test setup");
    assert_eq!(t.pid, me);
    assert!(matches!(t.state, 'R' | 'S'), "{t:?}");
    assert!(t.cpu_ticks > 0, "{t:?}");
    assert!(t.read_bytes.is_some(), "own /proc/self/io is readable");
    assert!(cmdline(me).is_some_and(|c| !c.is_empty()));
    assert!(cwd(me).is_some());
}

#[test]
fn task_state_from_fake_proc() {
    let r = FakeRoot::new("task");
    // A comm with a space and a ')' must not shift the fields.
    r.write(
        "9/stat",
        "9 (pt_data (w) 0) D 1 9 9 0 -1 4194560 100 0 7 0 250 50 0 0 20 0 1 0 5 0 0\n",
    );
    r.write("9/wchan", "folio_wait_bit_common");
    r.write("9/io", "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 8192\nwrite_bytes: 0\n");
    r.write("9/schedstat", "123456789 2345678 421\n");
    let t = task_state_at(&r.0, 9).expect("test setup");
    let want = TaskState {
        pid: 9,
        state: 'D',
        wchan: "folio_wait_bit_common".into(),
        cpu_ticks: 300,
        majflt: 7,
        read_bytes: Some(8192),
        write_bytes: Some(0),
        runs: Some(421),
    };
    assert_eq!(t, want);
    r.write("9/wchan", "0");
    std::fs::remove_file(r.0.join("9/io")).expect("test setup");
    let t = task_state_at(&r.0, 9).expect("test setup");
    assert_eq!((t.wchan.as_str(), t.read_bytes), ("", None));
    assert_eq!(task_state_at(&r.0, 10), None);
}

#[test]
fn cmdline_split() {
    assert_eq!(
        split_cmdline(b"python\0train.py\0--log\0x.log\0"),
        ["python", "train.py", "--log", "x.log"]
    );
    assert!(split_cmdline(b"").is_empty());
}

/// A process named with bytes that are not UTF-8 (prctl takes any) is still read: its memory,
/// from the real /proc of a thread of this test renamed so.
#[test]
fn a_name_that_is_not_utf8_does_not_make_a_process_unreadable() {
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        // SAFETY: PR_SET_NAME copies at most 16 bytes from a NUL-terminated buffer.
        unsafe { libc::prctl(libc::PR_SET_NAME, c"gs\xff\xfejob".as_ptr()) };
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() } as u32).expect("send");
        let _ = done_rx.recv();
    });
    let tid = rx.recv().expect("tid");
    let status = read_text(Path::new(&format!("/proc/{tid}/status"))).expect("status read");
    assert!(status.starts_with("Name:\tgs\u{fffd}\u{fffd}job"), "{status}");
    let mem = crate::sources::procfs::sample_mem(tid).expect("memory read");
    assert!(mem.rss_kb > 0);
    let _ = done_tx.send(());
    t.join().expect("thread");
}
