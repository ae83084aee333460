//! Which job, which rank, which pod: a real torchrun job's ranks named with their rank and run,
//! two ranks' recordings merged in rank order without saying which go together, and a process
//! in a cgroup laid out as the kubelet lays out a pod's.

use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;
use tests::procs::{Tracer, Workload};

fn summary(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("summary")).expect("json")
}

/// `gpustall trace -- CMD`, its summary and its report's text.
fn trace_launch(
    dir: &tests::TempDir,
    name: &str,
    cmd: &[&str],
    env: &[(&str, &str)],
) -> (Value, String) {
    let out = dir.path(&format!("{name}.json"));
    let rec = dir.path(&format!("{name}.jsonl"));
    let o = Command::new(tests::gpustall_bin())
        .args(["trace", "--no-gpu", "--summary-json"])
        .arg(&out)
        .arg("--record")
        .arg(&rec)
        .arg("--")
        .args(cmd)
        .envs(env.iter().copied())
        .env_remove("SUDO_UID")
        .output()
        .expect("gpustall");
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    (summary(&out), String::from_utf8_lossy(&o.stdout).into_owned() + &stderr)
}

const ALL_REDUCE: &str = "
import time, torch, torch.distributed as dist
dist.init_process_group('gloo')
t = torch.ones(4)
for _ in range(20):
    dist.all_reduce(t)
    time.sleep(0.05)
dist.destroy_process_group()
";

#[test]
fn a_torchrun_jobs_ranks_are_named_with_their_rank_and_run() {
    tests::require_privileged_env();
    let python = tests::torch_python();
    let dir = tests::TempDir::new_in("/var/tmp", "identity-torchrun");
    let script = dir.path("all_reduce.py");
    std::fs::write(&script, ALL_REDUCE).expect("script");
    let python = python.to_str().expect("utf-8");
    let cmd = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"];
    let cmd: Vec<&str> = cmd.into_iter().chain([script.to_str().expect("utf-8")]).collect();
    let (s, report) = trace_launch(&dir, "torchrun", &cmd, &[]);
    let ranks: Vec<&Value> = s["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["identity"]["rank"].is_u64())
        .collect();
    let mut numbers: Vec<u64> =
        ranks.iter().filter_map(|p| p["identity"]["rank"].as_u64()).collect();
    numbers.sort();
    assert_eq!(numbers, [0, 1], "both ranks found: {}", s["processes"]);
    let run = s["job"]["run_id"].as_str().expect("the run id").to_string();
    for r in &ranks {
        let id = &r["identity"];
        assert_eq!(
            (id["run_id"].as_str(), id["world_size"].as_u64()),
            (Some(run.as_str()), Some(2)),
            "{r}"
        );
        assert!(id["master"].as_str().is_some_and(|m| m.contains(':')), "the rendezvous: {id}");
    }
    assert_eq!(s["job"]["world_size"], 2);
    assert!(s["job"].get("rank").is_none(), "a job of two ranks has no one rank: {}", s["job"]);
    let heading = format!("Job: torchrun run {run}, 2 ranks");
    assert!(report.contains(&heading), "the report says which job: {report}");
    // The Perfetto trace names each rank's process with its rank; the HTML page says the job.
    let (trace, html) = (dir.path("trace.json"), dir.path("report.html"));
    let rec = dir.path("torchrun.jsonl");
    let run_ok = |args: &[&std::ffi::OsStr]| {
        let o = Command::new(tests::gpustall_bin()).args(args).output().expect("gpustall");
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    };
    run_ok(&["export".as_ref(), "--perfetto".as_ref(), trace.as_os_str(), rec.as_os_str()]);
    run_ok(&["report".as_ref(), rec.as_os_str(), "--html".as_ref(), html.as_os_str()]);
    let trace = std::fs::read_to_string(&trace).expect("trace");
    for r in &ranks {
        let name = format!("({}, rank {})", r["pid"], r["identity"]["rank"]);
        assert!(trace.contains(&name), "Perfetto names {name}");
    }
    let html = std::fs::read_to_string(&html).expect("html");
    assert!(html.contains(&heading), "the page says which job");
}

/// One process per "rank" with the variables torchrun gives its ranks (no torch needed for
/// this: what is tested is the merge), each traced on its own.
/// A job whose environment claims 2^32 - 1 ranks: not taken as its world size, and a merge of
/// its recording, which once allocated a name per missing rank (140 GB), is quick and short.
#[test]
fn a_world_size_no_job_has_is_not_taken_and_merge_stays_small() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new_in("/var/tmp", "identity-world");
    let env = [("RANK", "0"), ("WORLD_SIZE", "4294967295")];
    let (s, out) = trace_launch(&dir, "huge", &["sh", "-c", "sleep 1"], &env);
    assert_eq!(s["job"]["world_size"], Value::Null, "{}", s["job"]);
    assert!(out.contains("is not a job's ranks"), "said once: {out}");
    let started = std::time::Instant::now();
    let o = Command::new(tests::gpustall_bin())
        .arg("merge")
        .arg(dir.path("huge.jsonl"))
        .arg("--summary-json")
        .arg(dir.path("merged.json"))
        .output()
        .expect("gpustall merge");
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.stdout.len() + o.stderr.len() < 100_000, "a short report");
    eprintln!("merge took {:?}", started.elapsed());
}

/// A directory of recordings of two runs (`run`'s two ranks in `dir`, and another run made
/// here), merged without naming the files: grouped by run.
fn a_directory_of_two_runs_merges_by_run(dir: &tests::TempDir, run: &str, merged: &Path) {
    let other = format!("other-{}", tests::unique());
    let env = [("RANK", "0"), ("WORLD_SIZE", "1"), ("TORCHELASTIC_RUN_ID", other.as_str())];
    trace_launch(dir, "other0", &["sh", "-c", "sleep 1"], &env);
    let merge = |extra: &[&str]| {
        let o = Command::new(tests::gpustall_bin())
            .arg("merge")
            .arg(&dir.0)
            .args(extra)
            .output()
            .expect("gpustall merge");
        let text =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        (o.status.code(), text)
    };
    let (code, text) = merge(&[]);
    assert_eq!(code, Some(0), "{text}");
    for r in [run, other.as_str()] {
        assert!(text.contains(&format!("#### run {r} ####")), "a verdict per run: {text}");
    }
    let json = merged.to_str().expect("utf-8");
    let (code, text) = merge(&["--summary-json", json]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("choose one with --run ID"), "{text}");
    let (code, text) = merge(&["--run", run, "--summary-json", json]);
    assert_eq!(code, Some(0), "{text}");
    let m = summary(merged);
    assert_eq!(m["warnings"], serde_json::json!([]), "both ranks of the run: {}", m["warnings"]);
    let labels: Vec<&str> =
        m["nodes"].as_array().expect("nodes").iter().filter_map(|n| n["label"].as_str()).collect();
    assert!(labels.len() == 2 && labels[0].contains("rank 0"), "{labels:?}");
}

#[test]
fn two_ranks_recordings_merge_in_rank_order_named_by_rank() {
    tests::require_privileged_env();
    let dir = tests::TempDir::new_in("/var/tmp", "identity-merge");
    let run = format!("run-{}", tests::unique());
    for rank in ["1", "0"] {
        let env = [
            ("RANK", rank),
            ("LOCAL_RANK", rank),
            ("WORLD_SIZE", "2"),
            ("TORCHELASTIC_RUN_ID", run.as_str()),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        let (s, _) = trace_launch(&dir, &format!("rank{rank}"), &["sh", "-c", "sleep 1"], &env);
        assert_eq!(s["job"]["rank"].as_u64(), rank.parse().ok(), "{}", s["job"]);
    }
    let merged = dir.path("merged.json");
    let o = Command::new(tests::gpustall_bin())
        .arg("merge")
        .arg(dir.path("rank1.jsonl"))
        .arg(dir.path("rank0.jsonl"))
        .arg("--summary-json")
        .arg(&merged)
        .output()
        .expect("gpustall merge");
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let m = summary(&merged);
    assert_eq!(m["warnings"], serde_json::json!([]), "all ranks are here: {}", m["warnings"]);
    let labels: Vec<String> = m["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["label"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(labels.len(), 2, "{m}");
    assert!(
        labels[0].contains("rank 0") && labels[1].contains("rank 1"),
        "in rank order: {labels:?}"
    );
    // One rank alone: the other is named missing.
    let o = Command::new(tests::gpustall_bin())
        .arg("merge")
        .arg(dir.path("rank1.jsonl"))
        .arg("--summary-json")
        .arg(&merged)
        .output()
        .expect("gpustall merge");
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let warnings = summary(&merged)["warnings"].to_string();
    assert!(warnings.contains("ranks 0 of 2 have no recording"), "{warnings}");
    // Another recording that says it is rank 0 of the same run: said, and both kept.
    let env = [("RANK", "0"), ("WORLD_SIZE", "2"), ("TORCHELASTIC_RUN_ID", run.as_str())];
    let dup = tests::TempDir::new_in("/var/tmp", "identity-dup");
    trace_launch(&dup, "rank0-again", &["sh", "-c", "sleep 1"], &env);
    let o = Command::new(tests::gpustall_bin())
        .arg("merge")
        .args([dir.path("rank0.jsonl"), dup.path("rank0-again.jsonl"), dir.path("rank1.jsonl")])
        .arg("--summary-json")
        .arg(&merged)
        .output()
        .expect("gpustall merge");
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let m = summary(&merged);
    assert!(
        m["warnings"].to_string().contains("more than one recording claims a rank (rank 0 in"),
        "{}",
        m["warnings"]
    );
    assert_eq!(m["nodes"].as_array().map(Vec::len), Some(3), "both kept: {m}");

    a_directory_of_two_runs_merges_by_run(&dir, &run, &merged);
}

/// Two ranks of one run traced at the same time, each on its own (as two nodes would be): rank
/// 1's DataLoader-shaped worker is OOM-killed in its 256 MiB memory cgroup while rank 0 only
/// waits. Merged, rank 1 stalled first and the job's verdict says why in ranks.
#[test]
fn the_rank_whose_worker_was_oom_killed_is_named_first() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let dir = tests::TempDir::new_in("/var/tmp", "identity-oom");
    let run = format!("oomrun-{}", tests::unique());
    let cg = tests::cgroup::MemCgroup::new("rank-oom", 256, false);
    let hog = format!(
        "echo $$ > {}/cgroup.procs && {} hog 600,40,40 8 3000; exit 0",
        cg.path.display(),
        env!("CARGO_BIN_EXE_gpustall-workload")
    );
    let env = |rank: &'static str| {
        [("RANK", rank), ("WORLD_SIZE", "2"), ("TORCHELASTIC_RUN_ID", run.as_str())]
    };
    std::thread::scope(|s| {
        let waiting = s.spawn(|| trace_launch(&dir, "rank0", &["sleep", "8"], &env("0")));
        std::thread::sleep(Duration::from_secs(1));
        trace_launch(&dir, "rank1", &["sh", "-c", &hog], &env("1"));
        waiting.join().expect("rank 0 traced");
    });
    let merged = dir.path("merged.json");
    let o = Command::new(tests::gpustall_bin())
        .arg("merge")
        .arg(&dir.0)
        .arg("--summary-json")
        .arg(&merged)
        .output()
        .expect("gpustall merge");
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v = &summary(&merged)["verdict"];
    eprintln!("merged verdict: {}", v["text"]);
    assert!(v["first"].as_str().is_some_and(|f| f.contains("rank 1")), "{v:#}");
    assert_eq!(v["cause"], "host_memory_oom", "{v:#}");
    assert!(v["text"].as_str().is_some_and(|t| t.contains("rank 1")), "in ranks: {v:#}");
    // The rank moved itself into the cgroup and died within a second: the kernel's OOM report
    // names the cgroup, and the agent reads it from there.
    let cgroup = format!("Memory cgroup {}", cg.cgroup_path());
    assert!(v["text"].as_str().is_some_and(|t| t.contains(&cgroup)), "{cgroup}: {v:#}");
    assert!(text.contains("rank 1"), "{text}");
}

/// Where the runtime mounts a pod's service account (/var/run/... through /var/run -> /run).
const SA: &str = "/run/secrets/kubernetes.io/serviceaccount";

/// What a test made on the host (cgroups, the kubelet's log entries), removed in reverse
/// order when dropped, on failure too.
#[derive(Default)]
struct Made(Vec<std::path::PathBuf>);

impl Made {
    fn dir(&mut self, d: &Path) {
        if !d.exists() {
            std::fs::create_dir(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            self.0.push(d.to_path_buf());
        }
    }

    fn symlink(&mut self, target: &Path, link: &Path) {
        std::os::unix::fs::symlink(target, link).expect("a link");
        self.0.push(link.to_path_buf());
    }

    fn file(&mut self, f: &Path) {
        std::fs::write(f, "").expect("a file");
        self.0.push(f.to_path_buf());
    }
}

impl Drop for Made {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.is_dir() => drop(std::fs::remove_dir(p)),
                _ => drop(std::fs::remove_file(p)),
            }
        }
    }
}

/// A pod of this test's own: its UID, container id and names, unique per run.
struct Pod {
    uid: String,
    cid: String,
    namespace: String,
    name: String,
    container: String,
    /// The pod's HOSTNAME: a hostNetwork pod's is the node's name, not the pod's.
    hostname: String,
}

impl Pod {
    fn new() -> Self {
        let (pid, n) = (std::process::id(), tests::unique());
        Pod {
            uid: format!("{pid:08x}-0000-4000-8000-{n:012x}"),
            cid: format!("{:032x}{pid:032x}", n),
            namespace: format!("gpustall-test-ns-{pid}-{n}"),
            name: format!("gpustall-test-pod-{pid}-{n}"),
            container: format!("trainer-{pid}-{n}"),
            hostname: format!("gpustall-test-node-{pid}-{n}"),
        }
    }

    /// Its container's cgroup, named as the kubelet's cgroupfs driver names a burstable pod's.
    fn cgroup(&self, made: &mut Made) -> std::path::PathBuf {
        let base = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .map(Path::new)
            .find(|b| b.join("cgroup.procs").exists())
            .expect("a cgroup hierarchy");
        let mut d = base.to_path_buf();
        for part in ["kubepods".to_string(), "burstable".into(), format!("pod{}", self.uid)] {
            d = d.join(part);
            made.dir(&d);
        }
        let d = d.join(&self.cid);
        made.dir(&d);
        d
    }

    /// Its log entries as the kubelet makes them: /var/log/pods/<ns>_<pod>_<uid>/<container>/0.log
    /// and the link /var/log/containers/<pod>_<ns>_<container>-<id>.log to it.
    fn kubelet_logs(&self, made: &mut Made) {
        let pods = Path::new("/var/log/pods");
        let containers = Path::new("/var/log/containers");
        made.dir(pods);
        made.dir(containers);
        let dir = pods.join(format!("{}_{}_{}", self.namespace, self.name, self.uid));
        made.dir(&dir);
        made.dir(&dir.join(&self.container));
        let log = dir.join(&self.container).join("0.log");
        made.file(&log);
        let link = format!("{}_{}_{}-{}.log", self.name, self.namespace, self.container, self.cid);
        made.symlink(&log, &containers.join(link));
    }

    /// Traces a workload run as a container of this pod: in its cgroup, with its HOSTNAME, in a
    /// mount namespace of its own where the service account's namespace file is mounted as the
    /// runtime mounts it (at /var/run/secrets/..., which is /run/secrets/... where /var/run is
    /// a link to /run, as on this host and in most images). The job's identity in the summary.
    fn trace(&self, cgroup: &Path) -> Value {
        self.trace_with(cgroup, &format!("echo {} > {SA}/namespace", self.namespace), "")
    }

    /// As [`Pod::trace`], with the service account's directory filled by `make_namespace` (a
    /// shell command, inside the container's mount namespace) and the workload run through
    /// `run_as` (e.g. setpriv to another user; "" for root).
    fn trace_with(&self, cgroup: &Path, make_namespace: &str, run_as: &str) -> Value {
        let script = format!(
            "mount -t tmpfs tmpfs /run && mkdir -p {SA} && {make_namespace} \
             && exec {run_as} \"$0\" \"$@\""
        );
        let workload = env!("CARGO_BIN_EXE_gpustall-workload");
        let hostname = format!("HOSTNAME={}", self.hostname);
        let args = [&hostname, "unshare", "--mount", "--propagation", "private", "sh", "-c"];
        let args: Vec<&str> =
            args.into_iter().chain([script.as_str(), workload, "hog", "8", "8", "1500"]).collect();
        let mut w = Workload::start(Path::new("/usr/bin/env"), &args, None);
        // Moved into the pod once the workload runs in its mount namespace.
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_link(format!("/proc/{}/exe", w.pid())).ok().as_deref()
            != Some(Path::new(workload))
        {
            assert!(std::time::Instant::now() < end, "the workload did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::fs::write(cgroup.join("cgroup.procs"), w.pid().to_string()).expect("into the pod");
        let tracer = Tracer::start_with_env(w.pid(), &["--quiet", "--no-gpu"], &[]);
        w.go();
        let _ = w.wait(Duration::from_secs(30));
        let t = tracer.wait(Duration::from_secs(30));
        t.summary["job"].clone()
    }
}

/// A process in a cgroup named exactly as the kubelet's cgroupfs driver names a burstable
/// pod's container, in a mount namespace with the service account's namespace file, then with
/// the kubelet's log entries for the pod. Made by the test: no kubelet runs here.
#[test]
fn a_process_in_a_pods_cgroup_is_named_by_its_pod_and_container() {
    tests::require_privileged_env();
    let pod = Pod::new();
    let mut made = Made::default();
    let cgroup = pod.cgroup(&mut made);
    // No kubelet log entries: the pod's name is its HOSTNAME, its namespace the service
    // account's, read inside the container (through its /var/run link, not gpustall's).
    let job = pod.trace(&cgroup);
    assert_eq!(job["pod_uid"].as_str(), Some(pod.uid.as_str()), "{job}");
    assert_eq!(job["container_id"].as_str(), Some(pod.cid.as_str()), "{job}");
    assert_eq!(job["namespace"].as_str(), Some(pod.namespace.as_str()), "{job}");
    assert_eq!(job["pod"].as_str(), Some(pod.hostname.as_str()), "{job}");
    assert_eq!(job["container"], Value::Null, "nothing invented: {job}");
    // With the kubelet's log entries: the pod's and the container's own names.
    pod.kubelet_logs(&mut made);
    let job = pod.trace(&cgroup);
    assert_eq!(job["pod"].as_str(), Some(pod.name.as_str()), "{job}");
    assert_eq!(job["namespace"].as_str(), Some(pod.namespace.as_str()), "{job}");
    assert_eq!(job["container"].as_str(), Some(pod.container.as_str()), "{job}");
    drop(made);
}

/// A hostile container arranges its service-account namespace file: a link to a root-only
/// file of the host (as a user who cannot read it), a link to a file that holds no namespace
/// (as root), a FIFO. gpustall reads as root, but publishes only what the job could read and
/// what a Kubernetes namespace can be, and is never stuck on a FIFO.
#[test]
fn a_service_account_file_the_job_arranged_is_neither_leaked_nor_waited_on() {
    tests::require_privileged_env();
    let pod = Pod::new();
    let mut made = Made::default();
    let cgroup = pod.cgroup(&mut made);
    let secret = std::env::temp_dir().join(format!("gpustall-test-secret-{}", tests::unique()));
    made.file(&secret);
    let nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups";
    let cases = [
        ("a valid name in a root-only file, as nobody", "leaked-secret", nobody, "ln -s"),
        ("a shadow line, as root", "root:$6$TOPSECRETHASH:19000:0:99999:7:::", "", "ln -s"),
        ("a FIFO", "", "", "mkfifo"),
    ];
    for (what, content, run_as, how) in cases {
        std::fs::write(&secret, content).expect("the secret");
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
        let make = match how {
            "mkfifo" => format!("mkfifo {SA}/namespace"),
            _ => format!("ln -s {} {SA}/namespace", secret.display()),
        };
        let started = std::time::Instant::now();
        let job = pod.trace_with(&cgroup, &make, run_as);
        eprintln!("{what}: {job} ({:?})", started.elapsed());
        assert_eq!(
            job["pod_uid"].as_str(),
            Some(pod.uid.as_str()),
            "{what}: still the pod's: {job}"
        );
        assert_eq!(job["namespace"], Value::Null, "{what}: nothing read: {job}");
        assert!(
            !job.to_string().contains("SECRET") && !job.to_string().contains("leaked"),
            "{job}"
        );
    }
    drop(made);
}

/// `gpustall watch` exports a watched job's identity as `gpustall_job_info`: one series per
/// job, its labels from the rank's environment.
#[test]
fn watch_exports_a_jobs_identity_as_its_info_series() {
    use tests::watcher::{bundling_watcher, scrape};
    tests::require_privileged_env();
    let bundles = tests::TempDir::new("identity-watch");
    let comm = tests::procs::unique_comm();
    let (mut w, addr) =
        bundling_watcher(&format!("comm:^{comm}$"), bundles.0.to_str().expect("utf-8"));
    let run = format!("run-{}", tests::unique());
    let workload = env!("CARGO_BIN_EXE_gpustall-workload");
    let env_args = ["RANK=1", "WORLD_SIZE=2", &format!("TORCHELASTIC_RUN_ID={run}")];
    let args: Vec<&str> = env_args.into_iter().chain([workload, "hog", "8", "8", "6000"]).collect();
    let mut job = Workload::start_named(&comm, Path::new("/usr/bin/env"), &args, None, None);
    w.wait_for(&format!("watching job {comm}-{}", job.pid()), Duration::from_secs(20));
    job.go();
    let want = format!("training_job=\"{comm}-{}\"", job.pid());
    let end = std::time::Instant::now() + Duration::from_secs(20);
    let line = loop {
        let metrics = scrape(&addr);
        // Every job has its info series; this one's carries the run once its identity is read.
        let found = metrics.lines().find(|l| {
            l.starts_with("gpustall_job_info{") && l.contains(&want) && l.contains("run_id=\"run")
        });
        if let Some(l) = found {
            break l.to_string();
        }
        assert!(std::time::Instant::now() < end, "no gpustall_job_info for {want}:\n{metrics}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(line.contains(&format!("run_id=\"{run}\"")), "{line}");
    assert!(line.contains("world_size=\"2\"") && line.ends_with(" 1"), "{line}");
    // The job is one rank: its rank is a label of its own.
    assert!(line.contains("rank=\"1\""), "{line}");
    let _ = job.wait(Duration::from_secs(30));
}
