//! The job-level verdict over several recordings (`gpustall merge`): one per node or traced rank,
//! each on its own CLOCK_MONOTONIC, put on one timeline by their wall clocks.
//!
//! A multi-node job fails as a chain: one rank's worker is OOM-killed, that rank stops, and the
//! others wait in a collective until their timeout. Every node sees only its part, so the
//! question is which node stalled first, by how long it preceded the others, and what its own
//! verdict says. Pure: the recordings arrive as models (replayed by the caller), the answer is
//! plain data, unit-tested on hand-built input.

use serde::Serialize;

use crate::diagnose::verdict::Verdict;
use crate::model::Model;

/// SI_KERNEL: the signal was sent by the kernel itself (the OOM killer's SIGKILL, which the
/// OOM kill it belongs to already stands for).
const SI_KERNEL: i32 = 0x80;

/// One recording, as the merge knows it: where it was made, when, and what went wrong in it.
#[derive(Debug, Clone, Serialize)]
pub struct Source {
    /// How the node is named in the merge: its host, made unique when a host has several.
    pub label: String,
    pub host: String,
    pub kernel: String,
    /// The recording's start on its own monotonic clock, and the wall clock at that moment.
    pub mono_start_ns: u64,
    pub wall_start_ns: u64,
    /// The end of the recording, on its monotonic clock.
    pub mono_end_ns: u64,
    /// What went wrong, earliest first, on the recording's monotonic clock.
    pub onsets: Vec<Onset>,
    /// The rank or trainer the first onset belongs to (`rank pid 4242 (python)`).
    pub rank: Option<String>,
    /// The node's own verdict, from its own facts.
    pub verdict: Verdict,
}

/// What makes a node count as stalled, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnsetKind {
    OomKill,
    /// A fatal signal from user space (a launcher, an operator, systemd-oomd).
    Signal,
    GpuStall,
    /// A traced process ended with a non-zero status or by a signal (a rank giving up on a
    /// collective after its timeout exits with an error).
    AbnormalExit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Onset {
    pub t_ns: u64,
    pub kind: OnsetKind,
    pub pid: u32,
    /// One line: `dataloader_worker pid 812 (pt_data_worker) OOM-killed`.
    pub what: String,
}

impl Source {
    /// Nanoseconds since the Unix epoch of a time on this recording's monotonic clock.
    pub fn wall(&self, mono_ns: u64) -> u64 {
        let d = i128::from(mono_ns) - i128::from(self.mono_start_ns);
        u64::try_from((i128::from(self.wall_start_ns) + d).max(0)).unwrap_or(u64::MAX)
    }

    pub fn wall_end(&self) -> u64 {
        self.wall(self.mono_end_ns)
    }

    /// The first onset, in wall-clock ns.
    pub fn first_onset(&self) -> Option<(u64, &Onset)> {
        self.onsets.first().map(|o| (self.wall(o.t_ns), o))
    }

    /// Wall minus monotonic: constant for one boot of one host unless its wall clock was stepped.
    fn clock_offset(&self) -> i128 {
        i128::from(self.wall_start_ns) - i128::from(self.mono_start_ns)
    }
}

fn role_name(m: &Model, pid: u32) -> &'static str {
    m.tree.role(pid).as_str()
}

fn comm_of(m: &Model, pid: u32) -> String {
    m.tree.get(pid).map_or_else(|| "?".into(), |n| n.comm.clone())
}

/// Everything in a model that counts as a stall, earliest first.
pub fn onsets(m: &Model) -> Vec<Onset> {
    let mut v: Vec<Onset> = m
        .oom_kills
        .iter()
        .map(|k| Onset {
            t_ns: k.t_ns,
            kind: OnsetKind::OomKill,
            pid: k.victim_pid,
            what: format!(
                "{} pid {} ({}) OOM-killed",
                role_name(m, k.victim_pid),
                k.victim_pid,
                k.victim_comm
            ),
        })
        .collect();
    v.extend(m.signals.iter().filter(|s| s.si_code != SI_KERNEL).map(|s| Onset {
        t_ns: s.t_ns,
        kind: OnsetKind::Signal,
        pid: s.target_pid,
        what: format!(
            "{} pid {} ({}) sent signal {} by pid {} ({})",
            role_name(m, s.target_pid),
            s.target_pid,
            s.target_comm,
            s.sig,
            s.sender_pid,
            s.sender_comm
        ),
    }));
    v.extend(m.gpu.stalls.iter().map(|s| Onset {
        t_ns: s.start_ns,
        kind: OnsetKind::GpuStall,
        pid: s.pids.first().copied().unwrap_or(0),
        what: format!("GPU {} stalled ({:.1} s idle)", s.gpu_index, s.duration_ns as f64 / 1e9),
    }));
    v.extend(m.tree.iter().filter_map(|n| {
        let how = match (n.exit_signal(), n.exit_status()) {
            (Some(sig), _) => format!("killed by signal {sig}"),
            (_, Some(code)) if code != 0 && !is_helper(m, n) => {
                format!("exited with status {code}")
            }
            _ => return None,
        };
        Some(Onset {
            t_ns: n.exit_ns?,
            kind: OnsetKind::AbnormalExit,
            pid: n.pid,
            what: format!("{} pid {} ({}) {how}", role_name(m, n.pid), n.pid, n.comm),
        })
    }));
    v.sort_by_key(|o| o.t_ns);
    v
}

/// A short-lived process of no role (a launcher's or a shell's helper: pyenv's `readlink`, a
/// `grep` in a wrapper script): its non-zero status is its own answer, not a failure of the
/// job, and never the first sign of a stall.
fn is_helper(m: &Model, n: &crate::model::proctree::ProcNode) -> bool {
    const HELPER_LIFETIME_NS: u64 = 10_000_000_000;
    let lived = n.exit_ns.map(|e| e.saturating_sub(n.started_ns));
    m.tree.role(n.pid) == crate::model::proctree::Role::Other
        && lived.is_some_and(|l| l < HELPER_LIFETIME_NS)
}

/// The rank (or trainer) a process belongs to: its nearest ancestor that is a rank, else the
/// root of its tree. The rank number itself is not in a recording, its process is.
pub fn rank_of(m: &Model, pid: u32) -> Option<String> {
    let mut root = m.tree.get(pid)?;
    // A bounded walk that a reused pid cannot send into another process's tree.
    for cur in m.tree.ancestors(pid) {
        if m.tree.role(cur.pid).is_main() {
            if let Some(r) = m.identities.get(&cur.pid).and_then(|i| i.rank) {
                return Some(format!("rank {r} (pid {}, {})", cur.pid, cur.comm));
            }
            return Some(format!("{} pid {} ({})", role_name(m, cur.pid), cur.pid, cur.comm));
        }
        root = cur;
    }
    Some(format!("process tree of pid {} ({})", root.pid, comm_of(m, root.pid)))
}

/// One node in the job's order of stalls.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeStall {
    pub label: String,
    /// Wall clock, ns since the epoch.
    pub onset_wall_ns: u64,
    /// After the first node's onset (0 for the first).
    pub after_first_s: f64,
    pub what: String,
    /// Until when the node was seen (its last abnormal exit, else the end of its recording).
    pub until_wall_ns: u64,
    pub until: String,
}

/// The answer for the whole job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobVerdict {
    /// The node that stalled first, when any did.
    pub first: Option<String>,
    pub rank: Option<String>,
    /// The first node's own cause.
    pub cause: Option<String>,
    /// By how long the first node preceded the next one (`None`: no other node stalled).
    pub lead_s: Option<f64>,
    /// False when the lead is within the clock skew assumed between nodes.
    pub order_certain: bool,
    /// The answer in one paragraph.
    pub text: String,
    /// Every node that stalled, in the order it did.
    pub order: Vec<NodeStall>,
    /// Nodes with nothing wrong in their recording.
    pub quiet: Vec<String>,
    /// How clock skew bears on the answer, one sentence.
    pub clock: String,
}

/// A wall-clock time for people: `12:03:05.123` (UTC).
pub fn clock_time(wall_ns: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(wall_ns);
    let s = humantime::format_rfc3339_millis(t).to_string();
    // 2026-12-02T12:03:05.123Z -> 12:03:05.123
    s.get(11..23).map_or(s.clone(), String::from)
}

/// A wall-clock date for people: `2026-12-02 12:03:05.123 UTC`.
pub fn date_time(wall_ns: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(wall_ns);
    humantime::format_rfc3339_millis(t).to_string().replace('T', " ").replace('Z', " UTC")
}

fn stall_of(s: &Source, first_wall: u64) -> Option<NodeStall> {
    let (onset, o) = s.first_onset()?;
    let last_exit = s
        .onsets
        .iter()
        .filter(|o| o.kind == OnsetKind::AbnormalExit)
        .max_by_key(|o| o.t_ns)
        .map(|o| (s.wall(o.t_ns), o.what.clone()));
    let (until_wall_ns, until) =
        last_exit.unwrap_or_else(|| (s.wall_end(), "the end of its recording".into()));
    Some(NodeStall {
        label: s.label.clone(),
        onset_wall_ns: onset,
        after_first_s: onset.saturating_sub(first_wall) as f64 / 1e9,
        what: o.what.clone(),
        until_wall_ns,
        until,
    })
}

/// Which node stalled first, by how long it preceded the others, and its own verdict as the
/// cause. `max_skew_ns` is how far the nodes' wall clocks may disagree: a lead shorter than
/// that cannot order them.
pub fn decide(sources: &[Source], max_skew_ns: u64) -> JobVerdict {
    let first_wall = sources.iter().filter_map(|s| s.first_onset().map(|o| o.0)).min();
    let mut order: Vec<NodeStall> =
        sources.iter().filter_map(|s| stall_of(s, first_wall.unwrap_or(0))).collect();
    order.sort_by_key(|n| n.onset_wall_ns);
    let quiet: Vec<String> =
        sources.iter().filter(|s| s.onsets.is_empty()).map(|s| s.label.clone()).collect();
    let skew_s = max_skew_ns as f64 / 1e9;
    let Some(first) = order.first().cloned() else {
        return JobVerdict {
            first: None,
            rank: None,
            cause: None,
            lead_s: None,
            order_certain: true,
            text: format!(
                "No node stalled: no OOM kill, fatal signal, GPU stall or failed process in the {} recordings.",
                sources.len()
            ),
            order,
            quiet,
            clock: String::new(),
        };
    };
    let src = sources.iter().find(|s| s.label == first.label);
    let lead_s = order.get(1).map(|n| n.after_first_s);
    let order_certain = lead_s.is_none_or(|l| l > skew_s);
    let clock = match lead_s {
        Some(l) if !order_certain => format!(
            "The lead ({l:.3} s) is within the clock skew assumed between nodes (--max-skew {skew_s} s): which node came first is uncertain. Check the nodes' clock sync (chronyc tracking)."
        ),
        Some(l) => format!(
            "Aligned on each node's wall clock: a skew up to --max-skew {skew_s} s (NTP keeps nodes within milliseconds) cannot undo a lead of {l:.3} s."
        ),
        None => format!("Aligned on each node's wall clock (--max-skew {skew_s} s)."),
    };
    let text = job_text(&first, &order[1..], &quiet, src, lead_s, order_certain);
    JobVerdict {
        first: Some(first.label.clone()),
        rank: src.and_then(|s| s.rank.clone()),
        cause: src.map(|s| s.verdict.cause.to_string()),
        lead_s,
        order_certain,
        text,
        order,
        quiet,
        clock,
    }
}

/// "node-b rank pid 3 (python): worker pid N OOM-killed at 12:03:05; cause on node-b: ...;
/// node-a waited from 12:03:06 until ..."
fn job_text(
    first: &NodeStall,
    rest: &[NodeStall],
    quiet: &[String],
    src: Option<&Source>,
    lead_s: Option<f64>,
    certain: bool,
) -> String {
    let who = match src.and_then(|s| s.rank.as_deref()) {
        Some(r) => format!("{} {r}", first.label),
        None => first.label.clone(),
    };
    let mut t =
        format!("{} stalled first: {} at {}.", who, first.what, clock_time(first.onset_wall_ns));
    if let Some(s) = src {
        t.push_str(&format!(" Its own verdict: {}: {}", s.verdict.cause, s.verdict.text));
    }
    match lead_s {
        Some(l) => {
            let hedge = if certain { "" } else { " (within clock skew: uncertain)" };
            t.push_str(&format!(" It preceded the others by {l:.1} s{hedge}:"));
            for n in rest {
                t.push_str(&format!(
                    " {} waited from {} ({}, +{:.1} s) until {} ({});",
                    n.label,
                    clock_time(n.onset_wall_ns),
                    n.what,
                    n.after_first_s,
                    clock_time(n.until_wall_ns),
                    n.until
                ));
            }
            t.pop();
            t.push('.');
        }
        None => t.push_str(" No other node stalled in its recording."),
    }
    if !quiet.is_empty() {
        t.push_str(&format!(" Nothing went wrong on {}.", quiet.join(", ")));
    }
    t
}

/// Names each source after its host, and tells sources of the same host apart by `tag` (the
/// traced pid or the file): `node-a`, or `node-a [pid 4242]` when node-a has several.
pub fn labels(hosts_and_tags: &[(String, String)]) -> Vec<String> {
    hosts_and_tags
        .iter()
        .map(|(h, tag)| {
            let shared = hosts_and_tags.iter().filter(|(o, _)| o == h).count() > 1;
            let host = if h.is_empty() { "unknown-host" } else { h.as_str() };
            if shared {
                format!("{host} [{tag}]")
            } else {
                host.to_string()
            }
        })
        .collect()
}

/// Recordings further apart than this are not one chain of failures: the longest collective
/// timeouts (torch.distributed's NCCL default is 10 min, some jobs raise it to 30) are shorter.
const FAR_APART_NS: u64 = 30 * 60 * 1_000_000_000;

/// Where recordings disagree on facts they share, one warning each: a host whose wall clock
/// moved between two of its recordings, a host that ran two kernels at once, an OOM kill both
/// saw at different times, recordings too far apart to be one incident.
pub fn disagreements(sources: &[Source], max_skew_ns: u64) -> Vec<String> {
    let mut w = Vec::new();
    for (i, a) in sources.iter().enumerate() {
        for b in &sources[i + 1..] {
            let gap =
                a.wall_start_ns.max(b.wall_start_ns).saturating_sub(a.wall_end().min(b.wall_end()));
            if gap > FAR_APART_NS {
                w.push(format!(
                    "{} and {} are {:.1} s apart, more than any collective timeout: not the same incident, or a node's clock is off",
                    a.label,
                    b.label,
                    gap as f64 / 1e9
                ));
            }
            if a.host == b.host {
                same_host(a, b, max_skew_ns, &mut w);
            }
        }
    }
    w
}

/// Whether two recordings of one host are of one boot: the later one's boot time (wall minus
/// monotonic) is before the earlier one ended. After a reboot it would be after.
fn one_boot(a: &Source, b: &Source) -> bool {
    let (early, late) = if a.wall_start_ns <= b.wall_start_ns { (a, b) } else { (b, a) };
    late.clock_offset() < i128::from(early.wall_end())
}

/// Two recordings of one boot of one host share its clocks, its kernel and its OOM kills.
fn same_host(a: &Source, b: &Source, max_skew_ns: u64, w: &mut Vec<String>) {
    if !one_boot(a, b) {
        return;
    }
    let d = (a.clock_offset() - b.clock_offset()).unsigned_abs();
    if d > u128::from(max_skew_ns) {
        w.push(format!(
            "{} and {} are both from host {} but their clocks disagree by {:.3} s (wall minus monotonic): its wall clock was stepped between them, or a header was edited; each is aligned on its own wall clock",
            a.label,
            b.label,
            a.host,
            d as f64 / 1e9
        ));
    }
    if a.kernel != b.kernel && !a.kernel.is_empty() && !b.kernel.is_empty() {
        w.push(format!(
            "{} and {} are both from one boot of host {} but name different kernels ({} and {})",
            a.label, b.label, a.host, a.kernel, b.kernel
        ));
    }
    for oa in a.onsets.iter().filter(|o| o.kind == OnsetKind::OomKill) {
        let Some(ob) = b.onsets.iter().find(|o| o.kind == OnsetKind::OomKill && o.pid == oa.pid)
        else {
            continue;
        };
        let d = a.wall(oa.t_ns).abs_diff(b.wall(ob.t_ns));
        if d > max_skew_ns {
            w.push(format!(
                "{} and {} both saw the OOM kill of pid {} on {}, {:.3} s apart",
                a.label,
                b.label,
                oa.pid,
                a.host,
                d as f64 / 1e9
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::verdict::Cause;

    const S: u64 = 1_000_000_000;
    /// 2026-12-02 12:00:00 UTC.
    const NOON: u64 = 1_796_212_800 * S;

    fn verdict(cause: Cause, text: &str) -> Verdict {
        Verdict {
            cause,
            culprit_pids: vec![],
            text: text.into(),
            evidence: vec![],
            advice: vec![],
            advice_num_workers: None,
        }
    }

    #[test]
    fn a_helper_that_exits_non_zero_is_no_onset_the_trainer_is() {
        use crate::model::event::{Event, Header};
        use crate::model::samples::Sample;
        let mut m = Model::default();
        let seed =
            Sample::Seed { t_ns: 0, pid: 10, ppid: 1, comm: "python".into(), is_target: true };
        m.observe(&seed);
        let h = |pid, t_ns, comm: &str| Header { t_ns, pid, tid: pid, comm: comm.into() };
        m.apply(&Event::Fork { h: h(10, S, "python"), child_pid: 11, clone_flags: 0x11 });
        m.apply(&Event::Exec {
            h: h(11, S, "readlink"),
            old_pid: 11,
            filename: "/usr/bin/readlink".into(),
        });
        m.apply(&Event::Exit { h: h(11, S + S / 10, "readlink"), exit_code: Some(1 << 8) });
        assert!(onsets(&m).is_empty(), "a helper's status 1: {:?}", onsets(&m));
        m.apply(&Event::Exit { h: h(10, 30 * S, "python"), exit_code: Some(1 << 8) });
        let o = onsets(&m);
        assert_eq!((o.len(), o[0].pid, o[0].kind), (1, 10, OnsetKind::AbnormalExit), "{o:?}");
    }

    fn onset(t_ns: u64, kind: OnsetKind, pid: u32, what: &str) -> Onset {
        Onset { t_ns, kind, pid, what: what.into() }
    }

    /// A node whose monotonic clock started at `mono0` (another boot time on every machine).
    fn source(label: &str, mono0: u64, wall0: u64, len_s: u64, onsets: Vec<Onset>) -> Source {
        Source {
            label: label.into(),
            host: label.into(),
            kernel: "6.18.0".into(),
            mono_start_ns: mono0,
            wall_start_ns: wall0,
            mono_end_ns: mono0 + len_s * S,
            onsets,
            rank: Some("trainer pid 1 (python)".into()),
            verdict: verdict(Cause::NoneDetected, "nothing"),
        }
    }

    #[test]
    fn aligns_on_wall_clocks_not_on_monotonic_ones() {
        // node-a booted long ago (a large monotonic clock), node-b recently: by their monotonic
        // stamps node-b's failure comes first, by the wall clock node-a's OOM kill does.
        let mut a = source(
            "node-a",
            900_000 * S,
            NOON,
            60,
            vec![onset(900_000 * S + 5 * S, OnsetKind::OomKill, 812, "worker pid 812 OOM-killed")],
        );
        a.verdict = verdict(Cause::HostMemoryOom, "memory ran out.");
        let b = source(
            "node-b",
            50 * S,
            NOON + 2 * S,
            60,
            vec![
                onset(50 * S + 4 * S, OnsetKind::GpuStall, 0, "GPU 0 stalled"),
                onset(50 * S + 40 * S, OnsetKind::AbnormalExit, 7, "trainer pid 7 exited 1"),
            ],
        );
        let c = source("node-c", 10 * S, NOON, 60, vec![]);
        let v = decide(&[b, a, c], S / 2);
        assert_eq!(v.first.as_deref(), Some("node-a"));
        assert_eq!(v.cause.as_deref(), Some("host_memory_oom"));
        // node-a at 12:00:05, node-b's GPU stalled at 12:00:06.
        assert_eq!(v.lead_s, Some(1.0));
        assert!(v.order_certain);
        assert_eq!(v.order[1].label, "node-b");
        assert_eq!(v.order[1].until_wall_ns, NOON + 42 * S, "until its trainer gave up");
        assert_eq!(v.quiet, vec!["node-c".to_string()]);
        assert!(v.text.starts_with("node-a trainer pid 1 (python) stalled first: worker pid 812 OOM-killed at 12:00:05.000."), "{}", v.text);
        assert!(v.text.contains("host_memory_oom: memory ran out."), "{}", v.text);
        assert!(
            v.text.contains("node-b waited from 12:00:06.000 (GPU 0 stalled, +1.0 s) until 12:00:42.000 (trainer pid 7 exited 1)."),
            "{}",
            v.text
        );
    }

    #[test]
    fn a_lead_within_the_skew_is_uncertain() {
        let a = source("a", 0, NOON, 10, vec![onset(S, OnsetKind::OomKill, 1, "x")]);
        let b = source("b", 0, NOON + S / 10, 10, vec![onset(S, OnsetKind::AbnormalExit, 2, "y")]);
        let v = decide(&[a.clone(), b.clone()], S / 2);
        assert_eq!(v.first.as_deref(), Some("a"));
        assert!(!v.order_certain);
        assert!(v.clock.contains("uncertain"), "{}", v.clock);
        assert!(decide(&[a, b], S / 20).order_certain, "a tighter skew orders them");
    }

    #[test]
    fn nothing_wrong_anywhere_is_said() {
        let v = decide(&[source("a", 0, NOON, 10, vec![])], S);
        assert_eq!(v.first, None);
        assert!(v.text.starts_with("No node stalled"), "{}", v.text);
    }

    #[test]
    fn same_host_recordings_must_agree() {
        let kill = |t| vec![onset(t, OnsetKind::OomKill, 812, "w")];
        let a = source("node-a", 100 * S, NOON, 30, kill(110 * S));
        let mut b = source("node-a", 100 * S, NOON, 30, kill(110 * S));
        assert!(disagreements(&[a.clone(), b.clone()], S / 2).is_empty());
        // The same boot, a wall clock 3 s ahead in the second recording.
        b.wall_start_ns += 3 * S;
        b.kernel = "6.1.0".into();
        let w = disagreements(&[a.clone(), b.clone()], S / 2);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("clocks disagree by 3.000 s"), "{w:?}");
        assert!(w[1].contains("different kernels (6.18.0 and 6.1.0)"), "{w:?}");
        assert!(w[2].contains("OOM kill of pid 812 on node-a, 3.000 s apart"), "{w:?}");
        // After a reboot (its boot time after the first recording's end) the clocks owe nothing
        // to each other.
        let rebooted = source("node-a", 5 * S, NOON + 600 * S, 30, vec![]);
        assert!(disagreements(&[a.clone(), rebooted], S / 2).is_empty());
        // Different hosts never share clocks; an hour apart they are not one incident.
        let c = source("node-c", 0, NOON + 3600 * S, 30, vec![]);
        let w = disagreements(&[a, c], S / 2);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("are 3570.0 s apart"), "{w:?}");
    }

    #[test]
    fn labels_are_hosts_made_unique() {
        let l = labels(&[
            ("node-a".into(), "pid 1".into()),
            ("node-b".into(), "pid 2".into()),
            ("node-a".into(), "pid 3".into()),
        ]);
        assert_eq!(l, ["node-a [pid 1]", "node-b", "node-a [pid 3]"]);
    }

    #[test]
    fn times_read_as_utc_clock_times() {
        assert_eq!(clock_time(NOON + 3_723_456_000_000), "13:02:03.456");
        assert_eq!(date_time(NOON), "2026-12-02 12:00:00.000 UTC");
    }
}
