//! Workloads for gpustall's end-to-end tests: real processes doing real things (forking,
//! renaming, allocating until the kernel reclaims, swaps or OOM-kills them).
//!
//! Every mode first waits for a line on stdin, so a test can start the tracer on this process
//! and release the workload once the tracer is attached. Each process reports itself as one
//! JSON line on stdout: `{"role":..,"pid":..,"ppid":..}`.

use std::io::{BufRead, Write};

fn say(role: &str, extra: &str) {
    // SAFETY: getpid/getppid cannot fail.
    let (pid, ppid) = unsafe { (libc::getpid(), libc::getppid()) };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{{\"role\":\"{role}\",\"pid\":{pid},\"ppid\":{ppid}{extra}}}");
    let _ = out.flush();
}

fn wait_for_go() {
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
}

fn set_name(name: &str) {
    let c = std::ffi::CString::new(name).expect("no NUL in name");
    // SAFETY: PR_SET_NAME with a valid NUL-terminated string (the kernel copies 16 bytes max).
    unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// Forks; the child runs `f` and exits with its return value.
fn fork_child(f: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the child only runs `f` (no locks held across fork in this single-threaded
    // program) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        panic!("fork failed: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        let code = f();
        let _ = std::io::stdout().flush();
        // SAFETY: ends the child without running the parent's atexit handlers twice.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Waits for one child; returns (pid, raw wait status).
fn wait_any() -> Option<(libc::pid_t, i32)> {
    let mut status = 0;
    // SAFETY: valid out pointer.
    let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
    (pid > 0).then_some((pid, status))
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

/// A parent, two children, a grandchild; child "a" renames itself like a DataLoader worker.
fn tree() -> i32 {
    wait_for_go();
    say("parent", "");
    fork_child(|| {
        set_name("pt_data_worker");
        say("a", "");
        fork_child(|| {
            say("grandchild", "");
            sleep_ms(300);
            0
        });
        while wait_any().is_some() {}
        0
    });
    fork_child(|| {
        say("b", "");
        sleep_ms(300);
        0
    });
    while wait_any().is_some() {}
    0
}

/// Runs a command as a child once released: the traced process is this one, the I/O is its
/// child's.
fn spawn(cmd: &[String]) -> i32 {
    wait_for_go();
    say("parent", "");
    let status = std::process::Command::new(&cmd[0]).args(&cmd[1..]).status();
    match status {
        Ok(s) => s.code().unwrap_or(1),
        Err(e) => {
            eprintln!("workload: cannot run {}: {e}", cmd[0]);
            127
        }
    }
}

/// Anonymous memory that the kernel must keep, swap or kill for: every page is written.
struct Hoard {
    chunks: Vec<(*mut u8, usize)>,
    /// Large folios (`hog .. huge`): MADV_HUGEPAGE on 2 MiB-aligned chunks, so reclaim swaps
    /// THPs and mTHPs whole; else 4 KiB folios, one swapped folio one page.
    huge: bool,
}

const HUGE_ALIGN: usize = 2 << 20;

impl Hoard {
    fn grow(&mut self, bytes: usize) {
        let extra = if self.huge { HUGE_ALIGN } else { 0 };
        // SAFETY: a fresh private anonymous mapping; checked for MAP_FAILED below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes + extra,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            panic!("mmap failed: {}", std::io::Error::last_os_error());
        }
        let p = if self.huge {
            // A 2 MiB-aligned start, the excess on both sides unmapped: every 2 MiB of the
            // chunk can be one THP.
            let head = (HUGE_ALIGN - p as usize % HUGE_ALIGN) % HUGE_ALIGN;
            // SAFETY: both ranges lie inside the mapping just made.
            unsafe {
                if head > 0 {
                    libc::munmap(p, head);
                }
                libc::munmap(p.cast::<u8>().add(head + bytes).cast(), extra - head);
            }
            p.cast::<u8>().wrapping_add(head).cast::<libc::c_void>()
        } else {
            p
        };
        let advice = if self.huge { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
        // SAFETY: our own mapping.
        unsafe { libc::madvise(p, bytes, advice) };
        let p = p as *mut u8;
        Self::touch(p, bytes, 1);
        self.chunks.push((p, bytes));
    }

    fn touch(p: *mut u8, bytes: usize, salt: u8) {
        for off in (0..bytes).step_by(4096) {
            // SAFETY: inside the mapping; a non-zero write makes the page real anon memory.
            unsafe { p.add(off).write_volatile(salt.wrapping_add((off >> 12) as u8) | 1) };
        }
    }

    fn touch_all(&self, salt: u8) {
        for &(p, n) in &self.chunks {
            Self::touch(p, n, salt);
        }
    }
}

/// Workers named like PyTorch's that allocate `mib[i]` MiB in `step` MiB steps, hold it for
/// `hold_ms` (re-writing it, so swapped pages come back and go out again), then exit 0. If one
/// is killed, the parent stops the others and exits 1. With `pace_ms`, the steps come that far
/// apart (a leak, not a burst).
fn hog(mib: &[usize], step: usize, hold_ms: u64, huge: bool, pace_ms: u64) -> i32 {
    wait_for_go();
    say("parent", "");
    let mut pids = Vec::new();
    for (i, &target) in mib.iter().enumerate() {
        pids.push(fork_child(move || {
            set_name("pt_data_worker");
            say("worker", &format!(",\"index\":{i}"));
            let mut h = Hoard { chunks: Vec::new(), huge };
            let mut have = 0;
            while have < target {
                let n = step.min(target - have);
                h.grow(n << 20);
                have += n;
                if pace_ms > 0 {
                    sleep_ms(pace_ms);
                }
            }
            let end = std::time::Instant::now() + std::time::Duration::from_millis(hold_ms);
            let mut salt = 2u8;
            while std::time::Instant::now() < end {
                h.touch_all(salt);
                salt = salt.wrapping_add(1);
                sleep_ms(50);
            }
            0
        }));
    }
    let mut code = 0;
    while let Some((_, status)) = wait_any() {
        if libc::WIFSIGNALED(status) && code == 0 {
            code = 1;
            for &p in &pids {
                // SAFETY: plain kill of our own children; an already dead one gives ESRCH.
                unsafe { libc::kill(p, libc::SIGTERM) };
            }
        }
    }
    code
}

/// A fork burst: `n` short children, each one 4 KiB O_DIRECT write into `dir` (16 files
/// reused), at most 64 alive at a time; then the parent holds for `hold_ms` (so the job stays
/// alive while its children age out of a watch window).
fn burst(n: usize, dir: &str, hold_ms: u64) -> i32 {
    wait_for_go();
    say("parent", "");
    let mut alive = 0;
    for i in 0..n {
        if alive >= 64 {
            let _ = wait_any();
            alive -= 1;
        }
        let path = format!("{dir}/f{}", i % 16);
        fork_child(move || direct_write(&path));
        alive += 1;
    }
    while wait_any().is_some() {}
    sleep_ms(hold_ms);
    0
}

/// One 4 KiB write that bypasses the page cache, so it is a real block I/O of this process.
fn direct_write(path: &str) -> i32 {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(mut f) = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    else {
        return 1;
    };
    // O_DIRECT needs an aligned buffer: a 4 KiB-aligned anonymous page.
    // SAFETY: a fresh private anonymous mapping, checked below, unmapped at process exit.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return 1;
    }
    // SAFETY: the mapping is 4096 bytes, readable.
    let buf = unsafe { std::slice::from_raw_parts(p as *const u8, 4096) };
    i32::from(std::io::Write::write_all(&mut f, buf).is_err())
}

/// Pid reuse inside one trace: a child writes `first` 4 KiB O_DIRECT blocks into `dir` and
/// exits; 1.5 s later (a pid comes back only after the kernel has handed out all the others:
/// never within a beat of its exit, unless pid_max is tiny), through
/// /proc/sys/kernel/ns_last_pid, a second child gets the same pid and writes `second` blocks.
/// Prints `first` and `second` lines with their pids.
fn reuse(dir: &str, first: usize, second: usize) -> i32 {
    wait_for_go();
    say("parent", "");
    let writes = |n: usize, name: &'static str| {
        let path = format!("{dir}/{name}");
        move || (0..n).map(|_| direct_write(&path)).sum::<i32>()
    };
    let a = fork_child(move || {
        say("first", "");
        writes(first, "a")()
    });
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(a, std::ptr::null_mut(), 0) };
    sleep_ms(1500);
    for _ in 0..200 {
        // The next pid the kernel hands out is ns_last_pid + 1 (others may fork meanwhile).
        let _ = std::fs::write("/proc/sys/kernel/ns_last_pid", (a - 1).to_string());
        let b = fork_child(move || {
            // SAFETY: getpid cannot fail.
            if unsafe { libc::getpid() } != a {
                return 3; // not the reused pid: leave no trace, the parent tries again
            }
            say("second", "");
            writes(second, "b")()
        });
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(b, &mut status, 0) };
        if b == a {
            return i32::from(libc::WEXITSTATUS(status) != 0);
        }
    }
    2
}

/// A trainer fed over pipes by two DataLoader-like workers: worker "slow" sleeps `slow_ms`
/// before each batch, worker "fast" `fast_ms`; the trainer reads a batch from each in turn,
/// then computes (spins) `busy_ms`. It measures the truth itself: the time spent inside its
/// blocking reads (`blocked_ns`, per worker), and its compute time (`busy_ns`).
fn feed(slow_ms: u64, fast_ms: u64, batches: usize, busy_ms: u64) -> i32 {
    const BATCH: usize = 4096;
    wait_for_go();
    // The tracer raises the trainer to off-CPU accounting at its next beat (once a second).
    sleep_ms(1200);
    let worker = |name: &'static str, pause_ms: u64| {
        let mut fds = [0; 2];
        // SAFETY: valid out array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
        let (r, w) = (fds[0], fds[1]);
        let pid = fork_child(move || {
            set_name("pt_data_worker");
            say(name, "");
            // SAFETY: our own pipe ends.
            unsafe { libc::close(r) };
            let batch = [7u8; BATCH];
            for _ in 0..batches {
                sleep_ms(pause_ms);
                // SAFETY: a valid buffer; a 4 KiB write to a pipe is atomic.
                if unsafe { libc::write(w, batch.as_ptr().cast(), BATCH) } != BATCH as isize {
                    return 1;
                }
            }
            0
        });
        // SAFETY: our own pipe end.
        unsafe { libc::close(w) };
        (pid, r)
    };
    let (slow_pid, slow) = worker("slow", slow_ms);
    let (fast_pid, fast) = worker("fast", fast_ms);
    let read_batch = |fd: i32| -> Option<u64> {
        let start = std::time::Instant::now();
        let mut buf = [0u8; BATCH];
        let mut got = 0;
        while got < BATCH {
            // SAFETY: reads into the rest of `buf`.
            let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), BATCH - got) };
            if n <= 0 {
                return None;
            }
            got += n as usize;
        }
        Some(start.elapsed().as_nanos() as u64)
    };
    let (mut blocked_slow, mut blocked_fast, mut busy) = (0u64, 0u64, 0u64);
    for _ in 0..batches {
        let (Some(a), Some(b)) = (read_batch(slow), read_batch(fast)) else { return 1 };
        blocked_slow += a;
        blocked_fast += b;
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(busy_ms) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        busy += start.elapsed().as_nanos() as u64;
    }
    // The kernel's own count of this process's voluntary context switches (it blocked).
    // SAFETY: valid out pointer.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    while wait_any().is_some() {}
    say(
        "trainer",
        &format!(
            ",\"slow_pid\":{slow_pid},\"fast_pid\":{fast_pid},\"blocked_ns\":{},\"blocked_slow_ns\":{blocked_slow},\"blocked_fast_ns\":{blocked_fast},\"busy_ns\":{busy},\"nvcsw\":{}",
            blocked_slow + blocked_fast,
            ru.ru_nvcsw
        ),
    );
    0
}

/// A trainer that sleeps in an ioctl a worker ends, `waits` times: a seccomp user-notification
/// listener (`SECCOMP_IOCTL_NOTIF_RECV` sleeps interruptibly until a filtered process makes the
/// trapped syscall) and a child named like a DataLoader worker that makes that syscall every
/// `pause_ms`. Like a blocking CUDA synchronize, the trainer waits in a driver's ioctl; unlike
/// one, a process of the job ends each wait, as a worker's batch would: only the syscall tells
/// it from a wait for data. Reports the time spent inside the ioctls (`blocked_ns`).
fn ioctl_wait(pause_ms: u64, waits: usize) -> i32 {
    // No kernel has this syscall: nothing else makes it, and the filter hands it to us.
    const TRAPPED: u32 = 0x1234;
    wait_for_go();
    // The tracer raises the trainer to off-CPU accounting at its next beat (once a second).
    sleep_ms(1200);
    let Some(listener) = seccomp_listener(TRAPPED) else { return 1 };
    let worker = fork_child(move || {
        set_name("pt_data_worker");
        say("worker", "");
        for _ in 0..waits {
            sleep_ms(pause_ms);
            // SAFETY: a syscall that does not exist; the trainer answers it with 0.
            unsafe { libc::syscall(libc::c_long::from(TRAPPED)) };
        }
        0
    });
    let mut blocked = 0u64;
    for _ in 0..waits {
        // SAFETY: the kernel wants a zeroed request; all-integer struct.
        let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        let start = std::time::Instant::now();
        // SAFETY: our listener fd and a request of the size the ioctl encodes.
        if unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut req) } != 0 {
            return 1;
        }
        blocked += start.elapsed().as_nanos() as u64;
        let mut resp = libc::seccomp_notif_resp { id: req.id, val: 0, error: 0, flags: 0 };
        // SAFETY: as above, with the response.
        if unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp) } != 0 {
            return 1;
        }
    }
    let ok = wait_any().is_some_and(|(pid, st)| pid == worker && st == 0);
    say("trainer", &format!(",\"worker_pid\":{worker},\"blocked_ns\":{blocked}"));
    i32::from(!ok)
}

/// Installs a seccomp filter on this process (and the children it forks from now on) that
/// hands syscall `nr` to a listener; returns the listener's fd.
fn seccomp_listener(nr: u32) -> Option<i32> {
    // Classic BPF: load the syscall number (seccomp_data.nr, offset 0); if it is `nr`, notify
    // the listener, else allow.
    let stmt = |code: u16, k: u32| libc::sock_filter { code, jt: 0, jf: 0, k };
    let (ld_w_abs, jeq_k, ret_k) = (0x20, 0x15, 0x06);
    let mut filter = [
        stmt(ld_w_abs, 0),
        libc::sock_filter { code: jeq_k, jt: 0, jf: 1, k: nr },
        stmt(ret_k, libc::SECCOMP_RET_USER_NOTIF),
        stmt(ret_k, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_mut_ptr() };
    // SAFETY: prctl and seccomp with valid arguments; `prog` outlives the call.
    let fd = unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &prog,
        )
    };
    if fd < 0 {
        eprintln!("seccomp listener: {}", std::io::Error::last_os_error());
        return None;
    }
    Some(fd as i32)
}

/// A context-switch-heavy job: the process and a child named like a DataLoader worker pass one
/// byte back and forth over two pipes for `ms` milliseconds, after `settle_ms` (time for a
/// tracer's next beat to account the child). Each round trip is two blocking reads, two
/// wakeups and four context switches. The parent reports `round_trips` and `seconds`.
fn pingpong(ms: u64, settle_ms: u64) -> i32 {
    wait_for_go();
    let (mut there, mut back) = ([0; 2], [0; 2]);
    // SAFETY: valid out arrays.
    assert_eq!(unsafe { libc::pipe(there.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::pipe(back.as_mut_ptr()) }, 0, "pipe");
    let child = fork_child(move || {
        set_name("pt_data_worker");
        let mut b = [0u8; 1];
        // SAFETY: our own pipe ends and a 1-byte buffer.
        unsafe {
            libc::close(there[1]);
            libc::close(back[0]);
            while libc::read(there[0], b.as_mut_ptr().cast(), 1) == 1 {
                if libc::write(back[1], b.as_ptr().cast(), 1) != 1 {
                    return 1;
                }
            }
        }
        0
    });
    // SAFETY: the child's ends, ours no more.
    unsafe {
        libc::close(there[0]);
        libc::close(back[1]);
    }
    sleep_ms(settle_ms);
    let start = std::time::Instant::now();
    let limit = std::time::Duration::from_millis(ms);
    let mut n = 0u64;
    let mut b = [1u8; 1];
    while !n.is_multiple_of(256) || start.elapsed() < limit {
        // SAFETY: our own pipe ends and a 1-byte buffer.
        let ok = unsafe {
            libc::write(there[1], b.as_ptr().cast(), 1) == 1
                && libc::read(back[0], b.as_mut_ptr().cast(), 1) == 1
        };
        if !ok {
            return 1;
        }
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    // SAFETY: closing our end ends the child's loop.
    unsafe { libc::close(there[1]) };
    let ok = wait_any().is_some_and(|(pid, st)| pid == child && st == 0);
    say("trainer", &format!(",\"round_trips\":{n},\"seconds\":{secs}"));
    i32::from(!ok)
}

/// A trainer that waits for its GPU: a DataLoader-like worker (so that it is a trainer), then
/// the CUDA driver at `lib` (the project's stand-in) loaded with dlopen, and `calls` calls of
/// its `cuStreamSynchronize`, each timed here (what GPUSTALL_CUDA_STUB makes them wait).
fn cuda_sync(lib: &str, calls: usize) -> i32 {
    wait_for_go();
    let worker = fork_child(|| {
        set_name("pt_data_worker");
        say("worker", "");
        sleep_ms(60_000);
        0
    });
    let Ok(path) = std::ffi::CString::new(lib) else { return 1 };
    // SAFETY: a library path; the stand-in runs no constructors of note.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    // SAFETY: a symbol name, looked up in the library just opened.
    let sym = unsafe { libc::dlsym(handle, c"cuStreamSynchronize".as_ptr()) };
    if handle.is_null() || sym.is_null() {
        return 1;
    }
    // SAFETY: the stand-in exports it as `extern "C" fn(*mut c_void) -> i32`.
    let sync: extern "C" fn(*mut libc::c_void) -> i32 = unsafe { std::mem::transmute(sym) };
    // The tracer finds the driver in this process's maps at a beat (once a second) and probes it.
    sleep_ms(2500);
    let mut sync_ns = 0u64;
    for _ in 0..calls {
        let start = std::time::Instant::now();
        if sync(std::ptr::null_mut()) != 0 {
            return 1;
        }
        sync_ns += start.elapsed().as_nanos() as u64;
    }
    // SAFETY: our own child.
    unsafe { libc::kill(worker, libc::SIGKILL) };
    let _ = wait_any();
    say("trainer", &format!(",\"calls\":{calls},\"sync_ns\":{sync_ns}"));
    0
}

fn main() {
    // A name unique to the test that started this workload, so that a test selecting processes
    // by name (watch --match comm:) only ever sees its own, whatever runs beside it.
    if let Ok(comm) = std::env::var("GPUSTALL_WORKLOAD_COMM") {
        set_name(&comm);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("tree") => tree(),
        Some("spawn") if args.len() > 1 => spawn(&args[1..]),
        Some("feed") if args.len() > 4 => {
            // feed SLOW_MS FAST_MS BATCHES BUSY_MS
            let n = |i: usize| args[i].parse().unwrap_or(0);
            feed(n(1), n(2), n(3) as usize, n(4))
        }
        Some("ioctlwait") if args.len() > 2 => {
            // ioctlwait PAUSE_MS WAITS
            let n = |i: usize| args[i].parse().unwrap_or(0);
            ioctl_wait(n(1), n(2) as usize)
        }
        Some("pingpong") if args.len() > 2 => {
            // pingpong MS SETTLE_MS
            let n = |i: usize| args[i].parse().unwrap_or(0);
            pingpong(n(1), n(2))
        }
        Some("burst") if args.len() > 2 => {
            // burst N DIR [HOLD_MS]
            let n = args[1].parse().unwrap_or(0);
            let hold = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
            burst(n, &args[2], hold)
        }
        Some("reuse") if args.len() > 3 => {
            // reuse DIR FIRST_BLOCKS SECOND_BLOCKS
            let n = |i: usize| args[i].parse().unwrap_or(0);
            reuse(&args[1], n(2), n(3))
        }
        Some("cudasync") if args.len() > 2 => {
            // cudasync LIBCUDA CALLS
            cuda_sync(&args[1], args[2].parse().unwrap_or(0))
        }
        Some("hog") => {
            // hog MIB[,MIB..] STEP_MIB HOLD_MS [huge] [pace=MS]
            let mib: Vec<usize> = args
                .get(1)
                .map(|s| s.split(',').filter_map(|v| v.parse().ok()).collect())
                .unwrap_or_default();
            let step = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8);
            let hold = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
            let extra = args.get(4..).unwrap_or_default();
            let pace = extra.iter().find_map(|a| a.strip_prefix("pace=")?.parse().ok());
            hog(&mib, step, hold, extra.iter().any(|a| a == "huge"), pace.unwrap_or(0))
        }
        _ => {
            eprintln!("usage: gpustall-workload tree | spawn CMD [ARGS..] | hog MIB[,MIB..] STEP_MIB HOLD_MS [huge] [pace=MS] | burst N DIR [HOLD_MS] | reuse DIR FIRST SECOND | pingpong MS SETTLE_MS | ioctlwait PAUSE_MS WAITS | cudasync LIBCUDA CALLS");
            2
        }
    };
    std::process::exit(code);
}
