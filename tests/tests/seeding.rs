//! Seeding (issue 13, item 8): `trace --pid` starts while the job's tree keeps forking. A
//! grandchild forked between a /proc scan and its parent's entry in the kernel's tracked set
//! would never be followed; the agent rescans until a scan finds nothing new. Every process of
//! the tree must be in the recording, as a seed or as the child of a recorded fork.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tests::procs::{Tracer, Workload};

/// Forks a child every 20 ms for `FORK_S` seconds; each child forks a grandchild at once; all
/// of them sleep. Then it says so and sleeps too, until the test kills the tree.
const JOB: &str = r#"
import json, os, sys, time
end = time.time() + float(sys.argv[1])
while time.time() < end:
    if os.fork() == 0:
        if os.fork() == 0:
            time.sleep(600); os._exit(0)
        time.sleep(600); os._exit(0)
    time.sleep(0.02)
print(json.dumps({"role": "done"}), flush=True)
time.sleep(600)
"#;

/// The descendants of `root` now, from /proc's parent links.
fn descendants(root: u32) -> BTreeSet<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // The comm may hold spaces and parentheses: the fields start after the last ')'.
        let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
        if let Some(ppid) = rest.split(' ').nth(1).and_then(|p| p.parse().ok()) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            if out.insert(c) {
                todo.push(c);
            }
        }
    }
    out
}

#[test]
fn a_tree_forking_while_the_tracer_starts_is_followed_whole() {
    tests::require_privileged_env();
    const FORK_S: &str = "4";
    let mut w = Workload::start(std::path::Path::new("python3"), &["-c", JOB, FORK_S], None);
    let job = w.pid();
    // The tracer attaches while the tree grows (its start takes about a second of the four).
    let tracer = Tracer::start(job, &["--quiet", "--no-gpu"]);
    w.wait_for_role("done", Duration::from_secs(60));
    let tree = descendants(job);
    for &pid in &tree {
        // SAFETY: plain syscall on a pid of this test's own tree.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    // SAFETY: as above.
    unsafe { libc::kill(job as i32, libc::SIGKILL) };
    let _ = w.wait(Duration::from_secs(30));
    let t = tracer.wait(Duration::from_secs(60));
    assert_eq!(t.code, Some(0), "{}", t.stderr);

    let mut followed = BTreeSet::new();
    for v in &t.record {
        match (v["type"].as_str(), v["kind"].as_str()) {
            (Some("sample"), Some("seed")) => followed.insert(v["pid"].as_u64().unwrap_or(0)),
            (Some("event"), Some("fork")) => followed.insert(v["child_pid"].as_u64().unwrap_or(0)),
            _ => false,
        };
    }
    let missed: Vec<u32> =
        tree.iter().copied().filter(|p| !followed.contains(&u64::from(*p))).collect();
    eprintln!("{} processes in the tree, {} followed", tree.len(), followed.len());
    assert!(tree.len() > 100, "the job forked: {}", tree.len());
    assert!(missed.is_empty(), "not followed: {missed:?} of {}", tree.len());
}
