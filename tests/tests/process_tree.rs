//! The process tree followed in the kernel: children and grandchildren with the right parent,
//! renames (PyTorch's `pt_data_worker`), exits.

use std::time::Duration;

use tests::procs::{Tracer, Workload};

#[test]
fn children_grandchildren_and_renames_are_followed() {
    tests::require_privileged_env();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpustall-workload"));
    let mut w = Workload::start(bin, &["tree"], None);
    let tracer = Tracer::start(w.pid(), &["--quiet"]);
    w.go();
    let (code, lines) = w.wait(Duration::from_secs(30));
    assert_eq!(code, Some(0));
    let t = tracer.wait(Duration::from_secs(30));
    assert_eq!(t.code, Some(0), "{}", t.stderr);

    let by_role = |r: &str| {
        lines.iter().find(|l| l["role"] == r).unwrap_or_else(|| panic!("no {r} in {lines:?}"))
    };
    let (parent, a, b, g) = (by_role("parent"), by_role("a"), by_role("b"), by_role("grandchild"));
    let pid = |v: &serde_json::Value| v["pid"].as_u64().expect("pid") as u32;
    assert_eq!(t.process(pid(parent))["role"], "trainer");
    assert_eq!(t.process(pid(a))["ppid"], parent["pid"]);
    assert_eq!(t.process(pid(b))["ppid"], parent["pid"]);
    assert_eq!(t.process(pid(g))["ppid"], a["pid"], "the grandchild hangs off the renamed child");
    assert_eq!(t.process(pid(a))["comm"], "pt_data_worker");
    assert_eq!(t.process(pid(a))["role"], "dataloader_worker");
    assert_eq!(t.process(pid(a))["worker_index"], 0);
    for v in [parent, a, b, g] {
        let p = t.process(pid(v));
        assert_eq!(p["alive"], false, "{p}");
        assert_eq!(p["exit_code"], 0, "{p}");
    }
    // Fork and exit events are in the recording, each a parseable line, header first.
    assert_eq!(t.record[0]["type"], "header");
    let forks = t.record.iter().filter(|r| r["kind"] == "fork").count();
    assert!(forks >= 3, "expected 3 forks in the recording, got {forks}");
    assert_eq!(t.record.last().map(|r| r["type"].clone()), Some("summary".into()));
    assert_eq!(t.summary["lost_events"], 0);
}
