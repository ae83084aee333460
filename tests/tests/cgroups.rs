//! Containers and cgroups on the real kernel: a job bound by its PARENT cgroup's limit (a Slurm
//! step, a container in a pod) gets a verdict that names that limit and who sets it, with the
//! kernel's memory.events as evidence on v2 (checked against the cgroup's own file); and an
//! agent that runs in its own cgroup namespace (a DaemonSet with cgroupns=private) still finds
//! a job in another namespace at its host path. A job that moves itself into a cgroup and is
//! OOM-killed there a tenth of a second later gets that cgroup and its limit from the kernel's
//! OOM report.

use std::time::Duration;

use tests::{
    cgroup::MemCgroup,
    kernel::{oom_kills_among, Kmsg},
    procs::{Tracer, Workload},
};

/// Worker 0 grows past 256 MiB; 1 and 2 hold 40 MiB each: one OOM victim.
const HOG: [&str; 4] = ["hog", "600,40,40", "8", "3000"];

fn workload_bin() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"))
}

fn text(v: &serde_json::Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

#[test]
fn a_job_in_a_child_cgroup_is_bound_by_its_parents_limit() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    // Declared parent first: the child's guard runs first and empties it.
    let parent = MemCgroup::new("parent", 256, false);
    let step = parent.child("step");
    let events_before = ["max", "oom_kill"].map(|k| parent.memory_event(k));
    let psi_before = parent.is_v2().then(|| psi_some_total(&step));
    let mut kmsg = Kmsg::open_at_end();
    let mut w = Workload::start(workload_bin(), &HOG, Some(&step));
    let tracer = Tracer::start(w.pid(), &["--quiet"]);
    w.go();
    let (code, lines) = w.wait(Duration::from_secs(120));
    let t = tracer.wait(Duration::from_secs(30));
    assert_eq!(code, Some(1), "a worker was OOM-killed");
    let pids: Vec<u32> = lines.iter().filter_map(|l| l["pid"].as_u64()).map(|p| p as u32).collect();
    assert_eq!(oom_kills_among(&kmsg.read_new(), &pids).len(), 1, "one OOM kill in the job");

    let ctx = &t.summary["context"];
    let cg = &ctx["cgroup"];
    assert_eq!(cg["path"], step.cgroup_path(), "{ctx:#}");
    assert_eq!(cg["limit_bytes"], 256u64 << 20, "the parent's limit is the job's: {ctx:#}");
    assert_eq!(cg["limit_set_by"], parent.cgroup_path(), "{ctx:#}");
    let v = &t.summary["verdict"];
    assert_eq!(v["cause"], "host_memory_oom", "{v:#}");
    let want = format!("(limit 256 MiB, set by {})", parent.cgroup_path());
    assert!(text(&v["text"]).contains(&want), "{v:#}");
    let evidence = v["evidence"].to_string();
    assert!(evidence.contains("of the 256 MiB limit set by its ancestor"), "{evidence}");
    eprintln!("verdict: {}", text(&v["text"]));

    if !parent.is_v2() {
        assert!(ctx["cgroup_memory_events"].is_null(), "{ctx:#}");
        assert!(ctx["context_notes"].to_string().contains("memory cgroup v1"), "{ctx:#}");
        tests::degraded(
            "cgroup v1: no memory.events or memory.pressure (the verdict names the parent's limit through memory.use_hierarchy; failcnt and oom_control stand in)",
        );
        return;
    }
    // v2: the limiting cgroup's memory.events, over the trace, against the file itself.
    let [max_before, kills_before] = events_before.map(|e| e.expect("memory.events on v2"));
    let kernel_max = parent.memory_event("max").expect("max") - max_before;
    let kernel_kills = parent.memory_event("oom_kill").expect("oom_kill") - kills_before;
    let ev = &ctx["cgroup_memory_events"];
    eprintln!("memory.events over the trace: {ev}; the kernel's: max {kernel_max}, oom_kill {kernel_kills}");
    assert_eq!(kernel_kills, 1);
    assert_eq!(ev["oom_kill"], kernel_kills, "{ev}");
    let max = ev["max"].as_u64().expect("max");
    // The first context sample may come after the first hits: never more than the kernel's.
    assert!(max > 0 && max <= kernel_max, "max {max} of the kernel's {kernel_max}");
    let line = format!("memory cgroup {} hit its limit", parent.cgroup_path());
    assert!(evidence.contains(&line), "{evidence}");
    // PSI of the job's cgroup: within what the kernel's own total moved over the run.
    let kernel_some_us = psi_some_total(&step).saturating_sub(psi_before.unwrap_or(0));
    match ctx["cgroup_pressure"].as_object() {
        Some(p) => {
            let some_us = p["some_us"].as_u64().expect("some_us");
            eprintln!("memory.pressure some over the trace: {some_us} us; the kernel's: {kernel_some_us} us");
            assert!(some_us <= kernel_some_us, "{some_us} us of the kernel's {kernel_some_us}");
            if kernel_some_us == 0 {
                // 5.10: the job stalled in memcg reclaim, but its cgroup's PSI did not move.
                tests::degraded("memory.pressure did not count the job's memcg reclaim stall");
            }
        }
        None => {
            assert!(ctx["context_notes"].to_string().contains("PSI is off"), "{ctx:#}");
            tests::degraded("no memory.pressure: PSI is off on this kernel (psi=0, or Debian's default psi=1 not given)");
        }
    }
}

/// The `some` total (us) of a cgroup's memory.pressure; 0 where it cannot be read.
fn psi_some_total(cg: &MemCgroup) -> u64 {
    std::fs::read_to_string(cg.path.join("memory.pressure"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("some "))
        .find_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("total=")?.parse().ok()))
        .unwrap_or(0)
}

#[test]
fn an_agent_in_its_own_cgroup_namespace_finds_a_job_in_another() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let job_cg = MemCgroup::new("nsjob", 256, false);
    // The agent needs room for its maps and the recording: a generous limit of its own.
    let agent_cg = MemCgroup::new("nsagent", 2048, true);
    // Each moves into its cgroup, then into a new cgroup namespace rooted there, then execs:
    // each sees itself at "/" and the other at "/../<name>".
    let enter = |cg: &MemCgroup| {
        format!(
            "echo $$ > {}/cgroup.procs && exec unshare --cgroup \"$0\" \"$@\"",
            cg.path.display()
        )
    };
    let job_script = enter(&job_cg);
    let bin = workload_bin().to_str().expect("utf-8");
    let args = [&["-c", job_script.as_str(), bin][..], &HOG[..]].concat();
    let mut w = Workload::start(std::path::Path::new("sh"), &args, None);
    // The job is released only once it is in its namespace (unshare has exec'd the workload).
    let end = std::time::Instant::now() + Duration::from_secs(10);
    let own_ns = std::fs::read_link("/proc/self/ns/cgroup").expect("own cgroup ns");
    while std::fs::read_link(format!("/proc/{}/exe", w.pid())).ok().as_deref()
        != Some(workload_bin())
    {
        assert!(std::time::Instant::now() < end, "the job did not exec the workload");
        std::thread::sleep(Duration::from_millis(20));
    }
    let job_ns = std::fs::read_link(format!("/proc/{}/ns/cgroup", w.pid())).expect("job's ns");
    assert_ne!(job_ns, own_ns, "the job is in a cgroup namespace of its own");
    let agent_script = enter(&agent_cg);
    let tracer = Tracer::start_wrapped(&["sh", "-c", &agent_script], w.pid(), &["--quiet"]);
    let agent_ns = std::fs::read_link(format!("/proc/{}/ns/cgroup", tracer.pid())).expect("ns");
    assert!(agent_ns != own_ns && agent_ns != job_ns, "the agent is in a namespace of its own");
    w.go();
    let (code, _) = w.wait(Duration::from_secs(120));
    let t = tracer.wait(Duration::from_secs(30));
    assert_eq!(code, Some(1), "a worker was OOM-killed");
    let cg = &t.summary["context"]["cgroup"];
    eprintln!("the agent in its namespace read the job's cgroup as {cg}");
    assert_eq!(cg["path"], job_cg.cgroup_path(), "the job's host path, not '/' or '/..': {cg}");
    assert_eq!(cg["limit_bytes"], 256u64 << 20, "{cg}");
    let v = &t.summary["verdict"];
    let want = format!("Memory cgroup {} (limit 256 MiB)", job_cg.cgroup_path());
    assert!(text(&v["text"]).starts_with(&want), "{v:#}");
}

/// A shell starts a Python child that writes its own pid into a 64 MiB cgroup's cgroup.procs
/// and then fills 256 MiB: the child is killed a tenth of a second later, with no fork or exec
/// after its move for the agent to look again at, and the shell it stands for never moves. The
/// kernel's OOM report names the cgroup, and the agent reads it from there: the job's cgroup
/// and its limit are in the summary and the verdict, as for a job that started in it.
#[test]
fn a_job_killed_moments_after_joining_its_cgroup_gets_the_limit_from_the_oom_report() {
    tests::require_privileged_env();
    let _lock = tests::pressure_lock();
    let cg = MemCgroup::new("oom-report", 64, false);
    let dir = tests::TempDir::new("oom-report");
    let summary = dir.path("summary.json");
    let job = format!(
        "python3 -c \"import os; open('{}/cgroup.procs', 'w').write(str(os.getpid())); b = bytearray(256 << 20)\"; sleep 0.5",
        cg.path.display()
    );
    let o = std::process::Command::new(tests::gpustall_bin())
        .args(["trace", "--quiet", "--no-gpu", "--summary-json"])
        .arg(&summary)
        .args(["--", "sh", "-c", &job])
        .env_remove("SUDO_UID")
        .output()
        .expect("gpustall trace");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap_or_else(|e| {
            panic!("no summary ({e}): {}", String::from_utf8_lossy(&o.stderr))
        }))
        .expect("JSON");
    assert_eq!(cg.oom_kills(), 1, "the cgroup's own count");
    let v = &s["verdict"];
    assert_eq!(v["cause"], "host_memory_oom", "{v:#}");
    let cgroup = &s["context"]["cgroup"];
    eprintln!("cgroup: {cgroup}\nverdict: {}", v["text"]);
    assert_eq!(cgroup["path"].as_str(), Some(cg.cgroup_path().as_str()), "{cgroup:#}");
    assert_eq!(cgroup["limit_bytes"].as_u64(), Some(64 << 20), "{cgroup:#}");
    let said = text(&v["text"]);
    assert!(said.contains("(limit 64 MiB") && !said.contains("not read in time"), "{said}");
}
