//! Slurm identity from a real slurmd: Debian's slurmctld and slurmd (and munge) started by the
//! test on this machine with a configuration of their own (a unique node and cluster name,
//! ports of their own, state in a temporary directory), a job run with `srun`, its processes in
//! the cgroups slurmd makes (cgroup v1 here: memory:/slurm_NODE/uid_0/job_N/step_0/task_0),
//! traced by pid: the summary and the report name the Slurm job and step. And the operator's
//! way, deploy/slurm: the node's Prolog traces every job, and a batch job OOM-killed in its
//! Slurm cgroup finds the verdict in its own `slurm-<id>.out`.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// The daemons and the job the test started, and the cgroups slurmd made for its node: all
/// stopped and removed when the test ends, passing or failing.
struct Cluster {
    children: Vec<Child>,
    node: String,
    munged: Option<u32>,
    /// slurm.conf's path.
    conf: String,
    /// Where the Prolog's tracers write their pid (`job-N/gpustall.pid`): stopped too.
    bundles: Option<PathBuf>,
    /// Released last, after the cleanup.
    _one_at_a_time: tests::PressureLock,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The job's processes first (slurmstepd and the task), found by their cgroups.
        for pid in procs_under(&self.node) {
            // SAFETY: kill(2) of a process in this test's own Slurm node's cgroups.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        // Each child leads its own process group (srun forks a helper of its own).
        for c in self.children.iter_mut().rev() {
            // SAFETY: kill(2) of the process group this test's child leads.
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            let _ = c.wait();
        }
        // A tracer the Epilog did not wait for (the test failed first).
        let pidfiles =
            self.bundles.iter().flat_map(std::fs::read_dir).flatten().filter_map(Result::ok);
        for pid in
            pidfiles.filter_map(|e| std::fs::read_to_string(e.path().join("gpustall.pid")).ok())
        {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: kill(2) of the tracer this test's Prolog started.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        if let Some(pid) = self.munged {
            // SAFETY: kill(2) of the munged this test started.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        std::thread::sleep(Duration::from_millis(300));
        for dir in node_cgroups(&self.node) {
            remove_tree(&dir);
        }
    }
}

/// The cgroup directories slurmd made for `node`, one per v1 controller (or the v2 one).
fn node_cgroups(node: &str) -> Vec<PathBuf> {
    let name = format!("slurm_{node}");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path().join(&name))
        .filter(|p| p.is_dir())
        .collect();
    if Path::new("/sys/fs/cgroup").join(&name).is_dir() {
        dirs.push(Path::new("/sys/fs/cgroup").join(&name));
    }
    dirs
}

fn procs_under(node: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for dir in node_cgroups(node) {
        walk(&dir, &mut |d| {
            let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|l| l.parse::<u32>().ok()));
        });
    }
    pids
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    f(dir);
    for e in std::fs::read_dir(dir).into_iter().flatten().filter_map(Result::ok) {
        if e.path().is_dir() {
            walk(&e.path(), f);
        }
    }
}

/// Removes a cgroup tree, deepest first.
fn remove_tree(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().filter_map(Result::ok) {
        if e.path().is_dir() {
            remove_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// munged on its usual socket (the one Slurm's auth/munge uses): the running one, or one this
/// test starts (its pid, to stop it).
fn munge() -> Option<u32> {
    let works = || {
        Command::new("munge").arg("-n").stdout(Stdio::null()).status().is_ok_and(|s| s.success())
    };
    if works() {
        return None;
    }
    std::fs::create_dir_all("/run/munge").expect("/run/munge");
    let chown = Command::new("chown").args(["munge:munge", "/run/munge"]).status();
    assert!(chown.is_ok_and(|s| s.success()), "chown /run/munge");
    let started =
        Command::new("su").args(["-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"]).status();
    assert!(started.is_ok_and(|s| s.success()), "munged did not start");
    assert!(works(), "munge -n fails after starting munged");
    std::fs::read_to_string("/run/munge/munged.pid").ok()?.trim().parse().ok()
}

/// slurm.conf and cgroup.conf in `dir`, with `extra` lines in slurm.conf.
fn config(dir: &tests::TempDir, node: &str, extra: &str) -> PathBuf {
    let d = dir.0.display();
    let conf = dir.path("slurm.conf");
    std::fs::write(
        &conf,
        format!(
            "ClusterName={node}\nSlurmctldHost=localhost\nSlurmctldPort={}\nSlurmdPort={}\n\
             SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nStateSaveLocation={d}/state\n\
             SlurmdSpoolDir={d}/spool\nSlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\nReturnToService=2\n\
             SchedulerType=sched/builtin\nSelectType=select/cons_tres\n{extra}\
             NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=1 RealMemory=512 \
             State=UNKNOWN\nPartitionName=gs Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
            free_port(),
            free_port()
        ),
    )
    .expect("slurm.conf");
    // No swap for the job either (a test elsewhere may have added some): its limit is RAM's.
    std::fs::write(
        dir.path("cgroup.conf"),
        "CgroupPlugin=autodetect\nConstrainRAMSpace=yes\nConstrainSwapSpace=yes\n",
    )
    .expect("cgroup.conf");
    for sub in ["state", "spool"] {
        std::fs::create_dir_all(dir.path(sub)).expect("state dirs");
    }
    conf
}

fn daemon(bin: &str, args: &[&str], log: PathBuf) -> Child {
    use std::os::unix::process::CommandExt as _;
    Command::new(bin)
        .args(args)
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log).expect("log")))
        .spawn()
        .unwrap_or_else(|e| panic!("{bin}: {e}"))
}

fn poll<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

impl Cluster {
    /// munged, slurmctld and slurmd on a node of their own, configured in `dir` (with `extra`
    /// lines in slurm.conf); returns once the node is idle.
    fn start(dir: &tests::TempDir, extra: &str) -> Cluster {
        tests::require_privileged_env();
        for (bin, package) in [
            ("/usr/sbin/munged", "munge"),
            ("/usr/sbin/slurmctld", "slurmctld"),
            ("/usr/sbin/slurmd", "slurmd"),
            ("/usr/bin/srun", "slurm-client"),
        ] {
            tests::apt::ensure(package, || Path::new(bin).exists());
        }
        let lock = tests::slurm_lock();
        let node = format!("gs{}x{}", std::process::id(), tests::unique());
        let conf = config(dir, &node, extra).to_str().expect("utf-8").to_string();
        let mut cluster = Cluster {
            children: Vec::new(),
            node,
            munged: munge(),
            conf,
            bundles: None,
            _one_at_a_time: lock,
        };
        let c = cluster.conf.clone();
        let slurmd = ["-D", "-N", &cluster.node, "-f", &c];
        cluster.children.push(daemon("slurmctld", &["-D", "-f", &c], dir.path("slurmctld.log")));
        cluster.children.push(daemon("slurmd", &slurmd, dir.path("slurmd.log")));
        poll(Duration::from_secs(60), "the node idle in sinfo", || {
            let o = cluster.command("sinfo").args(["-h", "-o", "%t"]).output().ok()?;
            String::from_utf8_lossy(&o.stdout).contains("idle").then_some(())
        });
        cluster
    }

    /// A Slurm client command for this cluster.
    fn command(&self, bin: &str) -> Command {
        let mut c = Command::new(bin);
        c.env("SLURM_CONF", &self.conf);
        c
    }
}

/// The daemons' logs, for a failure's message.
fn logs(dir: &tests::TempDir) -> String {
    ["slurmctld.log", "slurmd.log"]
        .map(|f| std::fs::read_to_string(dir.path(f)).unwrap_or_default())
        .join("\n")
}

#[test]
fn a_job_run_by_a_real_slurmd_is_named_by_its_slurm_job_and_step() {
    let dir = tests::TempDir::new("slurm");
    let mut cluster = Cluster::start(&dir, "");
    let node = cluster.node.clone();
    let srun = std::os::unix::process::CommandExt::process_group(&mut cluster.command("srun"), 0)
        .args(["-N1", "-J", "gpustall-test", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(dir.path("srun.log")).expect("log")))
        .spawn()
        .expect("srun");
    cluster.children.push(srun);
    // The job's task: the `sleep` in this node's cgroups.
    let task = poll(Duration::from_secs(60), "the job's task in slurmd's cgroups", || {
        procs_under(&node).into_iter().find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep")
        })
    });
    let cgroups = std::fs::read_to_string(format!("/proc/{task}/cgroup")).unwrap_or_default();
    let job: String = cgroups
        .split("/job_")
        .nth(1)
        .map(|r| r.chars().take_while(char::is_ascii_digit).collect())
        .unwrap_or_else(|| panic!("no job_ in the task's cgroups:\n{cgroups}\n{}", logs(&dir)));
    let summary = dir.path("summary.json");
    let o = Command::new(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--duration", "2", "--pid", &task.to_string()])
        .arg("--summary-json")
        .arg(&summary)
        .output()
        .expect("gpustall");
    let report = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    eprintln!("slurmd's cgroups for the task:\n{cgroups}gpustall: job {}", s["job"]);
    assert_eq!(s["job"]["slurm_job"], job.as_str(), "{}", s["job"]);
    assert_eq!(s["job"]["slurm_step"], "0", "{}", s["job"]);
    // The job is root's (this test's): its user from the v1 path or SLURM_JOB_UID, its name
    // from SLURM_JOB_USER.
    assert_eq!(s["job"]["slurm_uid"], 0, "{}", s["job"]);
    assert_eq!(s["job"]["slurm_user"], "root", "{}", s["job"]);
    assert!(report.contains(&format!("Job: Slurm job {job} step 0, user root")), "{report}");
    drop(cluster);
    assert!(node_cgroups(&node).is_empty(), "the node's cgroups are removed");
}

/// A shell script in `dir` that runs the shipped deploy/slurm `script` with gpustall's settings
/// for this test (slurmd gives a Prolog no environment of its own).
fn wrapper(dir: &tests::TempDir, script: &str, bundles: &Path) -> PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/slurm").join(script);
    let path = dir.path(script);
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nexport GPUSTALL_BIN='{}' GPUSTALL_SLURM_DIR='{}' GPUSTALL_SLURM_ARGS=--no-gpu\n\
             exec '{}'\n",
            tests::gpustall_bin().display(),
            bundles.display(),
            shipped.display()
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    path
}

#[test]
fn a_batch_job_oom_killed_in_its_slurm_cgroup_finds_the_verdict_in_its_own_output() {
    let dir = tests::TempDir::new("slurm-prolog");
    let bundles = dir.path("bundles");
    let extra = format!(
        "SelectTypeParameters=CR_Core_Memory\nProlog={}\nEpilog={}\n",
        wrapper(&dir, "gpustall-prolog.sh", &bundles).display(),
        wrapper(&dir, "gpustall-epilog.sh", &bundles).display()
    );
    let started = Instant::now();
    let mut cluster = Cluster::start(&dir, &extra);
    cluster.bundles = Some(bundles.clone());
    // A user's job, not root's (nobody's), in a directory it may write: its output file is
    // the user's, written by a tracer that runs as root.
    let work = dir.path("work");
    std::fs::create_dir(&work).expect("work dir");
    std::fs::set_permissions(&work, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    // A step of its own first (`srun sleep 2`: a task slurmd starts under another slurmstepd,
    // no descendant of the batch script, found in the job's cgroups), then a memory hog over
    // its 64 MiB: `tail` keeps every byte of a line that never ends.
    let o = cluster
        .command("sbatch")
        .args(["--parsable", "-J", "gs-oom", "--uid=65534", "--gid=65534", "--mem=64M"])
        .args(["--wrap", "srun sleep 2; tail /dev/zero"])
        .current_dir(&work)
        .output()
        .expect("sbatch");
    assert!(o.status.success(), "sbatch: {}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let job = out.trim().split(';').next().unwrap_or_default().to_string();
    assert!(job.parse::<u64>().is_ok(), "sbatch --parsable printed {out:?}");
    // Gone from squeue once the Epilog has waited for the tracer: the verdict is in by then.
    poll(Duration::from_secs(90), "the job to leave squeue", || {
        let o = cluster.command("squeue").args(["-h", "-j", &job]).output().ok()?;
        (o.status.success() && String::from_utf8_lossy(&o.stdout).trim().is_empty()).then_some(())
    });
    let took = started.elapsed();
    let out_file = work.join(format!("slurm-{job}.out"));
    let output = std::fs::read_to_string(&out_file).unwrap_or_default();
    let bundle = bundles.join(format!("job-{job}"));
    let log = std::fs::read_to_string(bundle.join("gpustall.log")).unwrap_or_default();
    eprintln!("slurm-{job}.out after {took:.1?}:\n{output}\ngpustall.log:\n{log}");
    let summary = std::fs::read_to_string(bundle.join("summary.json"))
        .unwrap_or_else(|e| panic!("{}: {e}\n{log}\n{}", bundle.display(), logs(&dir)));
    let s: serde_json::Value = serde_json::from_str(&summary).expect("json");
    assert_eq!(s["job"]["slurm_job"], job.as_str(), "{}", s["job"]);
    let kills = s["oom_kills"].as_array().expect("oom_kills");
    assert_eq!(kills.len(), 1, "{kills:?}");
    let victim = kills[0]["victim_pid"].as_u64().expect("victim_pid");
    assert_eq!(s["verdict"]["cause"], "host_memory_oom", "{}", s["verdict"]);
    let procs = s["processes"].as_array().expect("processes");
    let step_task = procs.iter().find(|p| p["comm"] == "sleep");
    let step_task = step_task.unwrap_or_else(|| panic!("step 0's task is traced: {procs:?}"));
    // Its parent is step 0's slurmstepd, not traced: the task was found in the cgroups.
    assert!(!procs.iter().any(|p| p["pid"] == step_task["ppid"]), "{step_task}");
    assert_eq!(step_task["identity"]["slurm_step"], "0", "{step_task}");
    eprintln!(
        "step 0's task, found in the job's cgroups: pid {} (parent {})",
        step_task["pid"], step_task["ppid"]
    );
    // The verdict's first lines, at the end of the job's own output.
    let verdict = output.split("\n== gpustall: ").nth(1).unwrap_or_else(|| panic!("{output}"));
    assert!(verdict.contains("(host_memory_oom) ==\n"), "{verdict}");
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&out_file).expect("out"));
    assert_eq!(owner, 65534, "slurm-{job}.out is the user's");
    let user = format!("Job: Slurm job {job} step batch, user nobody");
    assert!(verdict.contains(&user), "{verdict}");
    assert!(verdict.contains(&format!("pid {victim}")), "the victim is named: {verdict}");
    assert!(verdict.contains(&bundle.join("summary.json").display().to_string()), "{verdict}");
    assert!(bundle.join("recording.jsonl").is_file(), "the recording is in the bundle");
    assert!(took < Duration::from_secs(100), "{took:?}");
}
