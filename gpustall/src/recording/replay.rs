//! `gpustall report FILE`: rebuilds the model from a recording, line by line, through the same
//! `Model::apply` / `Model::observe` the live agent used, so the summary is the live one.
//! A corrupt or truncated file stops the replay at the bad line; what came before still counts.

use anyhow::Context as _;
use std::{
    io::{BufRead, BufReader},
    path::Path,
};

use serde_json::Value;

use crate::model::samples::Sample;
use crate::model::Model;
use crate::recording::header::Header;
use crate::recording::record::{Record, RecordError};

/// A line longer than this is not a record (a recording's lines are a few KB; a summary of
/// thousands of processes a few MB): it is an error naming the line, never a reason to hold
/// gigabytes (`report /dev/zero`, a NUL-filled tail after a crash).
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// How far back in time (ns) a line may be before it counts as out of order: the two rings
/// are drained every 100 ms and samples stamped once a second, so a few seconds is normal.
const OUT_OF_ORDER_NS: u64 = 5_000_000_000;

/// The furthest a line's time may lie past the latest time before it (the agent writes every
/// second; a day covers a suspended agent). Further is a corrupt or crafted time (u64::MAX):
/// taken in, one such line stretched every chart to 584 years.
const MAX_JUMP_NS: u64 = 24 * 3600 * 1_000_000_000;

/// More memory than any machine has (64 TiB in KiB): a process's figure above it is a corrupt
/// or crafted line (rss = u64::MAX printed as 18014398509481984 MiB), not a measurement.
const MAX_MEM_KB: u64 = 1 << 36;

/// How many recent lines are remembered to tell a duplicated line (a retried copy, `cat f f`).
const DUPLICATE_WINDOW: usize = 65_536;

/// Reads `\n`-terminated lines of at most [`MAX_LINE_BYTES`].
pub struct Lines<R> {
    input: R,
    line: usize,
}

impl<R: BufRead> Lines<R> {
    pub fn new(input: R) -> Self {
        Self { input, line: 0 }
    }

    /// The next line (without its newline), `None` at the end; `Err` names the line.
    pub fn next_line(&mut self, buf: &mut Vec<u8>) -> Option<Result<usize, ReplayError>> {
        buf.clear();
        self.line += 1;
        let limit = MAX_LINE_BYTES as u64 + 1;
        match std::io::Read::take(&mut self.input, limit).read_until(b'\n', buf) {
            Ok(0) => None,
            Ok(_) if buf.len() > MAX_LINE_BYTES => Some(Err(ReplayError {
                line: self.line,
                why: format!("longer than {} MiB: not a record", MAX_LINE_BYTES >> 20),
            })),
            Ok(_) => {
                if buf.last() == Some(&b'\n') {
                    buf.pop();
                }
                Some(Ok(self.line))
            }
            Err(e) => Some(Err(ReplayError { line: self.line, why: format!("cannot read: {e}") })),
        }
    }
}

/// Where and why a replay stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayError {
    /// 1-based line number.
    pub line: usize,
    pub why: String,
}

pub struct Replay {
    pub model: Model,
    /// The end of the trace: the final summary's time, else the last time seen.
    pub end_ns: u64,
    /// The first line (`None` when it was not a header).
    pub header: Option<Header>,
    /// Lines read successfully.
    pub lines: usize,
    pub error: Option<ReplayError>,
    /// The recording's own final summary, when it has one.
    pub recorded_summary: Option<Value>,
    /// What was odd but not fatal (duplicates skipped, lines out of time order, lines of a
    /// newer gpustall), one line each.
    pub warnings: Vec<String>,
}

/// The times a recording can hold: from a little before its header's start on, each within
/// [`MAX_JUMP_NS`] of the latest before it. A line outside is skipped and counted, so one bad
/// time cannot stretch the model, the charts or the end of the trace.
#[derive(Default)]
pub struct Span {
    start_ns: u64,
    latest_ns: u64,
    outside: usize,
    first_outside: usize,
}

impl Span {
    pub fn new(start_ns: u64) -> Self {
        Span { start_ns, latest_ns: start_ns, ..Default::default() }
    }

    /// Whether line `n`, at `t_ns`, lies within the span (a line without a time does).
    pub fn admits(&mut self, n: usize, t_ns: Option<u64>) -> bool {
        let Some(t) = t_ns else { return true };
        let early = t.saturating_add(MAX_JUMP_NS) < self.start_ns;
        let late = t > self.latest_ns.saturating_add(MAX_JUMP_NS);
        if early || late {
            self.outside += 1;
            if self.first_outside == 0 {
                self.first_outside = n;
            }
            return false;
        }
        self.latest_ns = self.latest_ns.max(t);
        true
    }

    fn warning(&self) -> Option<String> {
        (self.outside > 0).then(|| {
            format!(
                "{} lines with a time outside the recording's span skipped (the first at line {}): a corrupt or edited time",
                self.outside, self.first_outside
            )
        })
    }
}

/// Duplicated and out-of-order lines, counted as the replay goes.
#[derive(Default)]
struct Oddities {
    recent: std::collections::VecDeque<u64>,
    seen: std::collections::HashSet<u64>,
    duplicates: usize,
    first_duplicate: usize,
    max_t_ns: u64,
    out_of_order: usize,
    first_out_of_order: usize,
    worst_back_ns: u64,
    /// Lines of a type or kind this gpustall does not know, by name.
    unknown: std::collections::BTreeMap<String, usize>,
    span: Span,
    /// Memory samples with figures no machine has, skipped.
    implausible: usize,
    first_implausible: usize,
    /// Exited processes the recording never folded, folded by the replay.
    folded_on_replay: usize,
}

/// A live trace folds exited processes as it goes (`Sample::Fold`, leaving
/// `folded::KEEP_EXITED`), so its recording never replays into a tree this large; one that does
/// was written by something else (a recording cut from another, or crafted), and its exited,
/// unremarkable processes are folded on replay, or a million forks held 2.1 GB.
const REPLAY_FOLD_AT: usize = 20_000;
/// Lines between two looks at the tree's size.
const FOLD_CHECK_EVERY: usize = 4096;

impl Oddities {
    /// Folds what a live trace would have folded, once the tree outgrows any live one.
    fn fold_unfolded(&mut self, model: &mut Model) {
        if model.tree.len() < REPLAY_FOLD_AT {
            return;
        }
        let pids = model.foldable();
        self.folded_on_replay += pids.len();
        model.fold(&pids);
    }

    /// True when this exact line was among the recent ones: skip it.
    fn duplicate(&mut self, n: usize, line: &[u8]) -> bool {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        line.hash(&mut h);
        let h = h.finish();
        if !self.seen.insert(h) {
            self.duplicates += 1;
            if self.first_duplicate == 0 {
                self.first_duplicate = n;
            }
            return true;
        }
        self.recent.push_back(h);
        if self.recent.len() > DUPLICATE_WINDOW {
            if let Some(old) = self.recent.pop_front() {
                self.seen.remove(&old);
            }
        }
        false
    }

    fn time(&mut self, n: usize, t_ns: Option<u64>) {
        let Some(t) = t_ns else { return };
        if t.saturating_add(OUT_OF_ORDER_NS) < self.max_t_ns {
            self.out_of_order += 1;
            if self.first_out_of_order == 0 {
                self.first_out_of_order = n;
            }
            self.worst_back_ns = self.worst_back_ns.max(self.max_t_ns - t);
        }
        self.max_t_ns = self.max_t_ns.max(t);
    }

    fn unknown(&mut self, line_type: String, kind: Option<String>) {
        let name = match kind {
            Some(k) => format!("{line_type} {k}"),
            None => line_type,
        };
        *self.unknown.entry(name).or_default() += 1;
    }

    /// True when a memory sample's figures are beyond any machine's: skip it.
    fn implausible_mem(&mut self, n: usize, mem: &crate::model::stats::MemSample) -> bool {
        let figures = [mem.rss_kb, mem.anon_kb, mem.file_kb, mem.shmem_kb, mem.swap_kb, mem.hwm_kb];
        let bad = figures.into_iter().chain(mem.pss_kb).any(|kb| kb > MAX_MEM_KB);
        if bad {
            self.implausible += 1;
            if self.first_implausible == 0 {
                self.first_implausible = n;
            }
        }
        bad
    }

    fn warnings(&self) -> Vec<String> {
        let mut w: Vec<String> = self.span.warning().into_iter().collect();
        if self.implausible > 0 {
            w.push(format!(
                "{} memory samples with more memory than any machine has skipped (the first at line {}): a corrupt or edited figure",
                self.implausible, self.first_implausible
            ));
        }
        if !self.unknown.is_empty() {
            let names: Vec<String> =
                self.unknown.iter().map(|(name, n)| format!("{n} x {name}")).collect();
            w.push(format!(
                "lines a newer gpustall wrote were skipped ({}): a newer gpustall reads them",
                names.join(", ")
            ));
        }
        if self.folded_on_replay > 0 {
            w.push(format!(
                "{} exited processes that the recording never folded were folded on replay (gpustall's trace folds them as it goes; this recording was written otherwise)",
                self.folded_on_replay
            ));
        }
        if self.duplicates > 0 {
            w.push(format!(
                "{} duplicated lines skipped (the first at line {})",
                self.duplicates, self.first_duplicate
            ));
        }
        if self.out_of_order > 0 {
            w.push(format!(
                "{} lines out of time order (the first at line {}, up to {:.1} s back): replayed in file order",
                self.out_of_order,
                self.first_out_of_order,
                self.worst_back_ns as f64 / 1e9
            ));
        }
        w
    }
}

fn apply_header(model: &mut Model, h: &Header) -> Result<(), String> {
    if h.version > crate::recording::header::VERSION {
        return Err(format!(
            "recording format version {} is newer than this gpustall reads ({}): use a newer gpustall",
            h.version,
            crate::recording::header::VERSION
        ));
    }
    model.start_ns = h.start_ns;
    model.last_ns = h.start_ns;
    model.origin = Some(h.origin());
    let gpu = &h.gpu;
    if gpu.enabled {
        let threshold = gpu.threshold_pct.ok_or("gpu.threshold_pct missing")?;
        let window = gpu.window_ns.ok_or("gpu.window_ns missing")?;
        model.gpu.enable(gpu.status.clone(), threshold, window);
    } else {
        model.gpu.status = gpu.status.clone();
    }
    Ok(())
}

fn apply_record(
    r: &mut Replay,
    odd: &mut Oddities,
    n: usize,
    record: Record,
) -> Result<(), String> {
    match record {
        Record::Sample(Sample::ProcMem { mem, .. }) if odd.implausible_mem(n, &mem) => {}
        Record::Event(e) => {
            r.model.apply(&e);
        }
        Record::Sample(s) => {
            r.model.observe(&s);
        }
        // Derived: the replay finds the stalls again from the GPU samples.
        Record::GpuStall(_) => {}
        Record::Summary(s) if s.is_final => {
            r.end_ns = s.t_ns.unwrap_or(r.end_ns);
            r.recorded_summary = Some(s.body);
        }
        Record::Summary(_) => {}
        Record::Header(_) => return Err("a second header".into()),
        // A newer gpustall may add record types and kinds: skip, do not fail.
        Record::Unknown { line_type, kind } => odd.unknown(line_type, kind),
    }
    Ok(())
}

pub fn replay(input: impl BufRead) -> Replay {
    let mut r = Replay {
        model: Model::default(),
        end_ns: 0,
        header: None,
        lines: 0,
        error: None,
        recorded_summary: None,
        warnings: Vec::new(),
    };
    let mut odd = Oddities::default();
    let mut lines = Lines::new(input);
    let mut line = Vec::new();
    while let Some(n) = lines.next_line(&mut line) {
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                r.error = Some(e);
                break;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if n > 1 && odd.duplicate(n, &line) {
            r.lines = n;
            continue;
        }
        if let Err(why) = replay_line(&mut r, &mut odd, n, &line) {
            r.error = Some(ReplayError { line: n, why });
            break;
        }
        r.lines = n;
        if n % FOLD_CHECK_EVERY == 0 {
            odd.fold_unfolded(&mut r.model);
        }
    }
    if r.recorded_summary.is_none() {
        r.end_ns = r.model.last_ns;
    }
    r.warnings = odd.warnings();
    let end = r.end_ns;
    r.model.finish(end);
    r
}

fn replay_line(r: &mut Replay, odd: &mut Oddities, n: usize, line: &[u8]) -> Result<(), String> {
    let record = Record::parse(line);
    if n == 1 {
        let h = match record {
            Ok(Record::Header(h)) => h,
            Err(e @ (RecordError::Truncated | RecordError::NotJson(_))) => {
                return Err(e.to_string())
            }
            _ => return Err("not a gpustall recording: the first line is not a header".into()),
        };
        apply_header(&mut r.model, &h)?;
        odd.span = Span::new(h.start_ns);
        r.header = Some(*h);
        return Ok(());
    }
    let record = record.map_err(|e| e.to_string())?;
    if !odd.span.admits(n, record.t_ns()) {
        return Ok(());
    }
    if !matches!(record, Record::Summary(_)) {
        odd.time(n, record.t_ns());
    }
    apply_record(r, odd, n, record)
}

/// Replays the recording at `file`, saying its warnings; an error when it holds nothing that
/// parses. A recording cut short comes back with its `error` (the caller reports what parsed).
pub fn open(file: &Path) -> anyhow::Result<Replay> {
    let f = open_nonblocking(file)
        .with_context(|| format!("cannot open the recording {}", file.display()))?;
    let r = replay(BufReader::new(f));
    for w in &r.warnings {
        say!("gpustall: warning: {}: {w}", file.display());
    }
    if r.lines == 0 {
        let why = r
            .error
            .as_ref()
            .map_or("it is empty".to_string(), |e| format!("line {}: {}", e.line, e.why));
        anyhow::bail!("{} is not a gpustall recording: {why}", file.display());
    }
    Ok(r)
}

/// Opens for reading without waiting for a writer: a FIFO nobody writes to reads as empty
/// (and is refused as such) instead of hanging the command. Reads then block as usual.
fn open_nonblocking(file: &Path) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(file)?;
    // SAFETY: fcntl on a descriptor this function owns.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    Ok(f)
}

/// Calls `f` on each record of a recording, up to `max_lines` (a corrupt tail is left out, as
/// the replay leaves it out), one at a time: memory does not grow with the file.
pub fn for_each_record(
    file: &Path,
    max_lines: usize,
    mut f: impl FnMut(Record),
) -> anyhow::Result<()> {
    let input = std::fs::File::open(file)
        .with_context(|| format!("cannot open the recording {}", file.display()))?;
    let mut lines = Lines::new(BufReader::new(input));
    let mut line = Vec::new();
    let mut span = Span::default();
    while let Some(Ok(n)) = lines.next_line(&mut line) {
        if n > max_lines {
            break;
        }
        match Record::parse(&line) {
            Ok(Record::Header(h)) if n == 1 => {
                span = Span::new(h.start_ns);
                f(Record::Header(h))
            }
            // Skipped as the replay skips it (and warns).
            Ok(r) if !span.admits(n, r.t_ns()) => {}
            Ok(r) => f(r),
            Err(_) if line.iter().all(u8::is_ascii_whitespace) => {}
            Err(_) => break,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str =
        r#"{"type":"header","version":1,"start_ns":1000,"gpu":{"enabled":false,"status":"off"}}"#;

    #[test]
    fn replays_seeds_events_and_samples() {
        let text = format!(
            "{HEADER}\n{}\n{}\n{}\n",
            r#"{"type":"sample","kind":"seed","t_ns":1000,"pid":10,"ppid":1,"comm":"python","is_target":true}"#,
            r#"{"type":"event","kind":"fork","t_ns":2000,"pid":10,"tid":10,"comm":"python","child_pid":11,"clone_flags":17}"#,
            r#"{"type":"sample","kind":"proc_mem","t_ns":3000,"pid":11,"rss_kb":5,"anon_kb":5,"file_kb":0,"shmem_kb":0,"swap_kb":0,"hwm_kb":6,"majflt":0}"#,
        );
        let r = replay(text.as_bytes());
        assert_eq!(r.error, None);
        assert_eq!(r.lines, 4);
        assert_eq!(r.model.tree.get(11).map(|n| n.ppid), Some(10));
        assert_eq!(r.model.procs[&11].peak_rss_kb, 6);
        assert_eq!(r.end_ns, 3000);
    }

    #[test]
    fn a_truncated_last_line_is_named_and_the_rest_kept() {
        let text = format!(
            "{HEADER}\n{}\n{{\"type\":\"event\",\"kind\":\"fo",
            r#"{"type":"sample","kind":"seed","t_ns":1000,"pid":10,"ppid":1,"comm":"python","is_target":true}"#
        );
        let r = replay(text.as_bytes());
        let e = r.error.expect("an error");
        assert_eq!(e.line, 3);
        assert!(e.why.contains("truncated"), "{}", e.why);
        assert!(r.model.tree.contains(10));
    }

    #[test]
    fn garbage_and_missing_headers_are_errors_with_line_numbers() {
        let r = replay("hello\n".as_bytes());
        assert_eq!(r.error.map(|e| e.line), Some(1));
        let r = replay(r#"{"type":"event"}"#.as_bytes());
        assert!(r.error.is_some_and(|e| e.why.contains("not a gpustall recording")));
        let r = replay(format!("{HEADER}\n{{\"type\":\"event\",\"kind\":\"exit\"}}\n").as_bytes());
        assert_eq!(r.error.map(|e| e.line), Some(2));
    }

    /// A recording made by gpustall before events were serialised by serde derive
    /// (testdata/trace-v1.jsonl: fork, exec, rename, memcg reclaim, a throttled reclaim, an OOM
    /// kill and its signals, exits, GPU samples and a stall, from the stand-in NVML). It must
    /// still replay into the very summary it recorded, and every event must serialise back to
    /// the line it was read from: the format did not change.
    #[test]
    fn a_recording_from_before_replays_to_its_own_summary_and_lines() {
        let text = include_str!("testdata/trace-v1.jsonl");
        let r = replay(text.as_bytes());
        assert!(r.error.is_none(), "{:?}", r.error);
        assert!(r.warnings.is_empty(), "a clean recording: {:?}", r.warnings);
        let recorded = r.recorded_summary.clone().expect("the recording's final summary");
        let replayed =
            serde_json::to_value(crate::pipeline::conclude::summary(&r.model, r.end_ns, true))
                .expect("summary json");
        // Everything measured replays the same; the verdict's wording and advice are the
        // decision of the gpustall that replays it (they improved since): its cause is stable.
        // Fields added since, derived from what the recording holds, are left out too.
        let without_verdict = |v: &Value| {
            let mut v = v.clone();
            v.as_object_mut().map(|o| o.remove("verdict"));
            // Where and when: from the header, which the summary did not repeat then.
            v.as_object_mut().map(|o| o.remove("origin"));
            // The kernel log's counts were not summed then.
            v.as_object_mut().map(|o| o.remove("kernel_log"));
            for p in v["processes"].as_array_mut().into_iter().flatten() {
                p.as_object_mut().map(|o| o.remove("dataloader_of"));
                // A trainer's GPU waits were not probed then: that is said now.
                p.as_object_mut().map(|o| o.remove("gpu_wait_unmeasured"));
                // An OOM victim's peak is now at least the kill report's figure.
                if p["oom_killed"] == true {
                    p.as_object_mut().map(|o| o.remove("peak_rss_kb"));
                    p.as_object_mut().map(|o| o.remove("peak_mem_kb"));
                }
                // A device's kernel name, from the recording's disk samples; its timed requests,
                // from the counters' `completed`.
                for d in p["io_by_device"].as_array_mut().into_iter().flatten() {
                    d.as_object_mut().map(|o| o.remove("name"));
                    d.as_object_mut().map(|o| o.remove("requests"));
                }
            }
            // Skipped program runs (from the overhead samples' `missed`) were not counted then.
            v["lost"].as_object_mut().map(|o| o.remove("program_skipped"));
            // The cgroup's events and PSI were not read then: their absence is noted now.
            for k in ["cgroup_memory_events", "cgroup_pressure", "host_pressure", "context_notes"] {
                v["context"].as_object_mut().map(|o| o.remove(k));
            }
            v
        };
        assert_eq!(without_verdict(&replayed), without_verdict(&recorded));
        let kill = &replayed["oom_kills"][0];
        let victim = replayed["processes"].as_array().into_iter().flatten();
        let victim = victim.clone().find(|p| p["pid"] == kill["victim_pid"]).expect("the victim");
        let at_kill = ["anon_rss_kb", "file_rss_kb", "shmem_rss_kb"]
            .iter()
            .map(|k| kill[k].as_u64().unwrap_or(0))
            .sum::<u64>();
        assert_eq!(victim["peak_rss_kb"].as_u64(), Some(at_kill), "the kill's own figure");
        assert_eq!(replayed["verdict"]["cause"], recorded["verdict"]["cause"]);
        assert_eq!(recorded["verdict"]["cause"], "host_memory_oom");
        let mut kinds = std::collections::BTreeSet::new();
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).expect("json line");
            let Ok(Record::Event(e)) = Record::parse(line.as_bytes()) else { continue };
            let written = serde_json::to_value(crate::recording::record::Line::Event(&e));
            assert_eq!(written.expect("json"), v, "{line}");
            kinds.insert(v["kind"].as_str().unwrap_or_default().to_string());
        }
        let all = [
            "exec",
            "exit",
            "fork",
            "oom_kill",
            "reclaim",
            "reclaim_throttled",
            "rename",
            "signal",
        ];
        assert_eq!(kinds, all.iter().map(|k| k.to_string()).collect());
    }

    #[test]
    fn a_newer_format_is_refused_with_what_to_do() {
        let text = r#"{"type":"header","version":99,"start_ns":1,"gpu":{"enabled":false}}"#;
        let r = replay(text.as_bytes());
        let e = r.error.expect("refused");
        assert_eq!(e.line, 1);
        assert!(e.why.contains("version 99 is newer"), "{}", e.why);
    }

    /// A recording with a million short children that a live trace would have folded (a
    /// crafted one): the replay folds them, says so, and its tree stays small.
    #[test]
    fn exited_processes_a_recording_never_folded_are_folded_on_replay() {
        let mut text = format!("{HEADER}\n");
        let children: u32 = 30_000;
        for i in 0..children {
            let (c, t) = (100_000 + i, 1_000_000 + u64::from(i) * 1_000);
            text.push_str(&format!(
                "{{\"type\":\"event\",\"kind\":\"fork\",\"t_ns\":{t},\"pid\":1,\"tid\":1,\"comm\":\"sh\",\"child_pid\":{c},\"clone_flags\":0}}\n{{\"type\":\"event\",\"kind\":\"exit\",\"t_ns\":{},\"pid\":{c},\"tid\":{c},\"comm\":\"sh\",\"exit_code\":0,\"wait_status\":0}}\n",
                t + 500
            ));
        }
        let r = replay(text.as_bytes());
        assert!(r.error.is_none(), "{:?}", r.error);
        assert!(r.model.tree.len() < REPLAY_FOLD_AT, "{} processes held", r.model.tree.len());
        let folded: u64 = r.model.folded.values().map(|t| t.processes).sum();
        assert_eq!(folded as usize + r.model.tree.len(), children as usize, "none lost");
        assert!(
            r.warnings.iter().any(|w| w.contains(&format!("{folded} exited processes"))),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn duplicated_lines_are_skipped_and_time_travel_is_warned() {
        let fork = r#"{"type":"event","kind":"fork","t_ns":9000000000,"pid":1,"tid":1,"comm":"a","child_pid":2,"clone_flags":0}"#;
        let early = r#"{"type":"sample","kind":"vanished","t_ns":1000,"pid":2}"#;
        let text = format!("{HEADER}\n{fork}\n{fork}\n{early}\n");
        let r = replay(text.as_bytes());
        assert!(r.error.is_none(), "{:?}", r.error);
        assert_eq!(r.model.events, 1, "the copy is not applied twice");
        assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
        assert!(
            r.warnings[0].contains("1 duplicated lines skipped (the first at line 3)"),
            "{:?}",
            r.warnings
        );
        assert!(
            r.warnings[1].contains("out of time order (the first at line 4"),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn a_time_outside_the_recordings_span_is_skipped_and_said() {
        let fork = r#"{"type":"event","kind":"fork","t_ns":2000,"pid":1,"tid":1,"comm":"a","child_pid":2,"clone_flags":0}"#;
        let crafted = r#"{"type":"sample","kind":"vanished","t_ns":18446744073709551615,"pid":2}"#;
        let later = r#"{"type":"sample","kind":"vanished","t_ns":3000,"pid":2}"#;
        let text = format!("{HEADER}\n{fork}\n{crafted}\n{later}\n");
        let r = replay(text.as_bytes());
        assert!(r.error.is_none(), "{:?}", r.error);
        assert_eq!(r.end_ns, 3000, "the end is the last time in the span");
        assert!(
            r.warnings.iter().any(|w| w.contains(
                "1 lines with a time outside the recording's span skipped (the first at line 3)"
            )),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn a_memory_figure_no_machine_has_is_skipped_and_said() {
        let seed = r#"{"type":"sample","kind":"seed","t_ns":1000,"pid":10,"ppid":1,"comm":"python","is_target":true}"#;
        let mem = |rss: u64| {
            format!(
                r#"{{"type":"sample","kind":"proc_mem","t_ns":2000,"pid":10,"rss_kb":{rss},"anon_kb":5,"file_kb":0,"shmem_kb":0,"swap_kb":0,"hwm_kb":6,"majflt":0}}"#
            )
        };
        let text = format!("{HEADER}\n{seed}\n{}\n{}\n", mem(u64::MAX), mem(5));
        let r = replay(text.as_bytes());
        assert!(r.error.is_none(), "{:?}", r.error);
        assert_eq!(r.model.procs[&10].peak_rss_kb, 6, "the crafted figure is not taken in");
        assert!(r.warnings.iter().any(|w| w.contains("1 memory samples with more memory than any machine has skipped (the first at line 3)")), "{:?}", r.warnings);
    }

    #[test]
    fn a_line_without_end_is_an_error_not_a_memory_hog() {
        let mut input = format!("{HEADER}\n").into_bytes();
        input.extend(std::iter::repeat_n(0u8, MAX_LINE_BYTES + 10));
        let r = replay(input.as_slice());
        let e = r.error.expect("refused");
        assert_eq!((e.line, r.lines), (2, 1));
        assert!(e.why.contains("longer than"), "{}", e.why);
    }
}
