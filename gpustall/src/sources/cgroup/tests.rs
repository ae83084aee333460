//! Unit tests of the parent module, on fake /proc and cgroup trees.
use super::*;
use crate::sources::host::tests::FakeRoot;

const EVENTS: &str = "low 0\nhigh 0\nmax 42\noom 2\noom_kill 1\noom_group_kill 0\n";

/// The cgroup of `pid` in a fake /proc under `r`, with the usual mounts under `r`/cg.
fn at(r: &FakeRoot, pid: u32) -> Option<MemCgroupDir> {
    memory_cgroup_dir_in(&r.0.join("proc"), &default_mounts(&r.0.join("cg")), pid, 1)
}

/// A cgroup directory `rel` under `r`, seen as `path`, alone under its mount.
fn leaf(r: &FakeRoot, rel: &str, path: &str, version: u8) -> MemCgroupDir {
    MemCgroupDir { dir: r.0.join(rel), path: path.into(), version, mount_point: r.0.join(rel) }
}

const HYBRID: &str = "12:cpu,cpuacct:/job\n5:memory,hugetlb:/job/rank0\n0::/user.slice/x\n";

#[test]
fn v1_combined_controllers_line() {
    let r = FakeRoot::new("cg-v1");
    r.write("proc/42/cgroup", HYBRID);
    r.mkdir("cg/memory/job/rank0");
    let got = at(&r, 42).expect("test setup");
    assert_eq!(
        (got.dir, got.path.as_str(), got.version),
        (r.0.join("cg/memory/job/rank0"), "/job/rank0", 1)
    );
}

#[test]
fn v2_line_plain_and_unified() {
    let r = FakeRoot::new("cg-v2");
    r.write("proc/7/cgroup", "0::/gpustall-test-x\n");
    r.write("cg/gpustall-test-x/memory.max", "max\n");
    let got = at(&r, 7).expect("test setup");
    assert_eq!(
        (got.dir, got.path.as_str(), got.version),
        (r.0.join("cg/gpustall-test-x"), "/gpustall-test-x", 2)
    );

    // Hybrid mount: the unified tree lives under cgroup_root/unified.
    r.write("proc/8/cgroup", "0::/svc\n");
    r.write("cg/unified/svc/memory.current", "0\n");
    let got = at(&r, 8).expect("test setup");
    assert_eq!(got.dir, r.0.join("cg/unified/svc"));
    // A v2 directory without memory files is no memory cgroup.
    r.write("proc/9/cgroup", "0::/nomem\n");
    r.mkdir("cg/nomem");
    assert_eq!(at(&r, 9), None);
}

#[test]
fn both_present_prefers_v1_when_its_dir_exists() {
    let r = FakeRoot::new("cg-both");
    r.write("proc/42/cgroup", HYBRID);
    r.write("cg/user.slice/x/memory.current", "1\n");
    // No v1 memory dir: fall back to v2.
    assert_eq!(at(&r, 42).expect("test setup").version, 2);
    r.mkdir("cg/memory/job/rank0");
    assert_eq!(at(&r, 42).expect("test setup").version, 1);
    assert_eq!(at(&r, 43), None);
}

#[test]
fn root_cgroup_path_is_the_mount_itself() {
    let r = FakeRoot::new("cg-ns");
    // Inside a cgroup namespace the job's cgroup shows as "/".
    r.write("proc/1/cgroup", "0::/\n");
    r.write("cg/memory.max", "1048576\n");
    let got = at(&r, 1).expect("test setup");
    assert_eq!(got.dir, r.0.join("cg"));
}

#[test]
fn read_v1_memsw_and_oom_control() {
    let r = FakeRoot::new("mem-v1");
    r.write("m/memory.limit_in_bytes", "9223372036854771712\n");
    r.write("m/memory.usage_in_bytes", "1000\n");
    r.write("m/memory.max_usage_in_bytes", "4000\n");
    r.write("m/memory.memsw.usage_in_bytes", "1500\n");
    r.write("m/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
    r.write("m/memory.failcnt", "17\n");
    // The leaf's own counts, then the hierarchical totals that count.
    r.write(
        "m/memory.stat",
        "active_file 1\ninactive_file 2\ntotal_rss 300\ntotal_inactive_file 200\ntotal_active_file 100\n",
    );
    let m = read_cgroup_mem(&leaf(&r, "m", "/job", 1)).expect("test setup");
    let want = CgroupMem {
        path: "/job".into(),
        version: 1,
        limit_bytes: None,
        usage_bytes: 1000,
        peak_bytes: Some(4000),
        swap_usage_bytes: Some(500),
        oom_kills: Some(3),
        failcnt: Some(17),
        limit_set_by: None,
        swap_limit_bytes: None,
        swap_limit_set_by: None,
        events: None,
        pressure: None,
        file_bytes: Some(300),
    };
    assert_eq!(m, want);
    r.write("m/memory.limit_in_bytes", "2147483648\n");
    let m = read_cgroup_mem(&leaf(&r, "m", "/job", 1)).expect("test setup");
    assert_eq!(m.limit_bytes, Some(2 << 30));
}

#[test]
fn read_v2_max_and_events() {
    let r = FakeRoot::new("mem-v2");
    r.write("m/memory.max", "max\n");
    r.write("m/memory.current", "123456\n");
    r.write("m/memory.events", EVENTS);
    let m = read_cgroup_mem(&leaf(&r, "m", "/x", 2)).expect("test setup");
    let want = CgroupMem {
        path: "/x".into(),
        version: 2,
        limit_bytes: None,
        usage_bytes: 123456,
        peak_bytes: None,
        swap_usage_bytes: None,
        oom_kills: Some(1),
        failcnt: Some(42),
        limit_set_by: None,
        swap_limit_bytes: None,
        swap_limit_set_by: None,
        events: crate::sources::cgroup::limits::parse_events(EVENTS),
        pressure: None,
        file_bytes: None,
    };
    assert_eq!(m, want);
    r.write("m/memory.max", "536870912\n");
    r.write("m/memory.peak", "600000000\n");
    r.write("m/memory.swap.current", "4096\n");
    let m = read_cgroup_mem(&leaf(&r, "m", "/x", 2)).expect("test setup");
    assert_eq!(
        (m.limit_bytes, m.peak_bytes, m.swap_usage_bytes),
        (Some(512 << 20), Some(600_000_000), Some(4096))
    );
    // A removed cgroup reads as None.
    assert_eq!(read_cgroup_mem(&leaf(&r, "gone", "/gone", 2)), None);
}

#[test]
fn v2_parents_limit_and_its_events() {
    // A pod: the pod cgroup sets 1 GiB and 256 MiB of swap, the container says max.
    let r = FakeRoot::new("cg-parent-v2");
    r.write("proc/5/cgroup", "0::/kubepods/pod1/ctr\n");
    r.write("cg/kubepods/memory.max", "max\n");
    r.write("cg/kubepods/pod1/memory.max", "1073741824\n");
    r.write("cg/kubepods/pod1/memory.swap.max", "268435456\n");
    r.write("cg/kubepods/pod1/memory.events", "low 0\nhigh 0\nmax 1234\noom 3\noom_kill 3\n");
    r.write("cg/kubepods/pod1/ctr/memory.max", "max\n");
    r.write("cg/kubepods/pod1/ctr/memory.swap.max", "max\n");
    r.write("cg/kubepods/pod1/ctr/memory.current", "5000\n");
    r.write("cg/kubepods/pod1/ctr/memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 2\n");
    r.write("cg/kubepods/pod1/ctr/memory.pressure", "some avg10=1.00 avg60=0.00 avg300=0.00 total=77\nfull avg10=0.50 avg60=0.00 avg300=0.00 total=33\n");
    let cg = at(&r, 5).expect("found");
    let m = read_cgroup_mem(&cg).expect("read");
    assert_eq!((m.limit_bytes, m.limit_set_by.as_deref()), (Some(1 << 30), Some("/kubepods/pod1")));
    assert_eq!(
        (m.swap_limit_bytes, m.swap_limit_set_by.as_deref()),
        (Some(256 << 20), Some("/kubepods/pod1"))
    );
    assert_eq!(m.events.as_ref().map(|e| e.max), Some(1234), "the limiting cgroup's events");
    assert_eq!(m.oom_kills, Some(2), "the job's own cgroup's kills");
    assert_eq!(m.pressure.map(|p| (p.some_total_us, p.full_total_us)), Some((77, 33)));
}

#[test]
fn v1_parents_limit_through_use_hierarchy() {
    let r = FakeRoot::new("cg-parent-v1");
    r.write("proc/6/cgroup", "4:memory:/slurm/job_1/step_0\n");
    r.write("cg/memory/slurm/job_1/memory.limit_in_bytes", "536870912\n");
    r.write("cg/memory/slurm/job_1/memory.memsw.limit_in_bytes", "805306368\n");
    r.write("cg/memory/slurm/job_1/memory.use_hierarchy", "1\n");
    r.write("cg/memory/slurm/job_1/step_0/memory.limit_in_bytes", "9223372036854771712\n");
    r.write("cg/memory/slurm/job_1/step_0/memory.usage_in_bytes", "100\n");
    let cg = at(&r, 6).expect("found");
    let m = read_cgroup_mem(&cg).expect("read");
    assert_eq!((m.limit_bytes, m.limit_set_by.as_deref()), (Some(512 << 20), Some("/slurm/job_1")));
    assert_eq!(m.swap_limit_bytes, Some(256 << 20), "memsw less memory");
    assert_eq!((m.events, m.pressure), (None, None), "v1 has neither");
    // Without use_hierarchy the parent does not see the step's charges.
    r.write("cg/memory/slurm/job_1/memory.use_hierarchy", "0\n");
    assert_eq!(read_cgroup_mem(&cg).expect("read").limit_bytes, None);
}

#[test]
fn an_agent_in_a_cgroup_namespace_finds_a_sibling_jobs_cgroup() {
    // The agent (pid 1 here) runs in a namespace rooted at /agent; the host's v2 tree is
    // mounted at cg with root "/.."; the job's /proc/PID/cgroup reads "/../job".
    let r = FakeRoot::new("cg-ns-agent");
    r.write("proc/1/cgroup", "0::/\n");
    r.write("proc/9/cgroup", "0::/../job\n");
    r.write("cg/agent/cgroup.procs", "1\n");
    r.write("cg/job/cgroup.procs", "9\n");
    r.write("cg/job/memory.current", "1\n");
    let mounts =
        vec![mounts::CgroupMount { mount_point: r.0.join("cg"), root: "/..".into(), version: 2 }];
    let cg = memory_cgroup_dir_in(&r.0.join("proc"), &mounts, 9, 1).expect("found");
    assert_eq!((cg.dir, cg.path.as_str()), (r.0.join("cg/job"), "/job"));
}
