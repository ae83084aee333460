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

    // A directory of recordings of two runs, merged without naming the files: grouped by run.
    let other = format!("other-{}", tests::unique());
    let env = [("RANK", "0"), ("WORLD_SIZE", "1"), ("TORCHELASTIC_RUN_ID", other.as_str())];
    trace_launch(&dir, "other0", &["sh", "-c", "sleep 1"], &env);
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
    for r in [&run, &other] {
        assert!(text.contains(&format!("#### run {r} ####")), "a verdict per run: {text}");
    }
    let json = merged.to_str().expect("utf-8");
    let (code, text) = merge(&["--summary-json", json]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("choose one with --run ID"), "{text}");
    let (code, text) = merge(&["--run", &run, "--summary-json", json]);
    assert_eq!(code, Some(0), "{text}");
    let m = summary(&merged);
    assert_eq!(m["warnings"], serde_json::json!([]), "both ranks of the run: {}", m["warnings"]);
    let labels: Vec<&str> =
        m["nodes"].as_array().expect("nodes").iter().filter_map(|n| n["label"].as_str()).collect();
    assert!(labels.len() == 2 && labels[0].contains("rank 0"), "{labels:?}");
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
    // names the cgroup the verdict could not read in time.
    let cgroup = format!("Memory cgroup {}", cg.cgroup_path());
    assert!(v["text"].as_str().is_some_and(|t| t.contains(&cgroup)), "{cgroup}: {v:#}");
    assert!(text.contains("rank 1"), "{text}");
}

/// Removes a cgroup tree made by a test, deepest first, whatever happened.
struct CgroupTree(Vec<std::path::PathBuf>);

impl Drop for CgroupTree {
    fn drop(&mut self) {
        for d in self.0.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A process in a cgroup named exactly as the kubelet's cgroupfs driver names a burstable
/// pod's container (a unique pod UID per run). Made by the test: no kubelet runs here.
#[test]
fn a_process_in_a_pods_cgroup_is_named_by_its_pod_and_container() {
    tests::require_privileged_env();
    let base = ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(Path::new)
        .find(|b| b.join("cgroup.procs").exists())
        .expect("a cgroup hierarchy");
    let n = tests::unique();
    let uid = format!("{:08x}-0000-4000-8000-{:012x}", std::process::id(), n & 0xffff_ffff_ffff);
    let cid = format!("{:064x}", n);
    let mut dirs = Vec::new();
    let mut d = base.to_path_buf();
    let guard = {
        for part in ["kubepods".to_string(), "burstable".into(), format!("pod{uid}"), cid.clone()] {
            d = d.join(part);
            if !d.exists() {
                std::fs::create_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
                dirs.push(d.clone());
            }
        }
        CgroupTree(dirs)
    };
    let workload = Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut w = Workload::start(workload, &["hog", "8", "8", "1500"], None);
    std::fs::write(d.join("cgroup.procs"), w.pid().to_string()).expect("moving it into the pod");
    let tracer = Tracer::start_with_env(w.pid(), &["--quiet", "--no-gpu"], &[]);
    w.go();
    let _ = w.wait(Duration::from_secs(30));
    let t = tracer.wait(Duration::from_secs(30));
    let job = &t.summary["job"];
    assert_eq!(job["pod_uid"].as_str(), Some(uid.as_str()), "{job}");
    assert_eq!(job["container_id"].as_str(), Some(cid.as_str()), "{job}");
    drop(guard);
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
