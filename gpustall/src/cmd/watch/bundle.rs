//! Incident bundles written by `gpustall watch`: a directory per incident with the recording
//! of the window around it (replayable with `gpustall report`), the summary and verdict, the
//! text report and a Perfetto trace. Bundles are rotated by count and total size.

use anyhow::Context as _;
use std::{
    io::Write,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

use crate::model::samples::CountersSample;
use crate::model::samples::Sample;
use crate::recording::record::Record;

/// Counters in a flight-recorder window are cumulative since the daemon started: make them
/// count from the window's first read instead, one record at a time.
#[derive(Default)]
pub struct Rebase {
    base: Option<CountersSample>,
}

impl Rebase {
    pub fn record(&mut self, r: Record) -> Record {
        let Record::Sample(Sample::Counters(c)) = r else { return r };
        let b = self.base.get_or_insert_with(|| c.clone());
        Record::Sample(Sample::Counters(c.minus(b)))
    }
}

/// A context sample of a window as the job rooted at `root` saw it: `gpustall watch` reads
/// each job's cgroup and filesystems into `jobs`; the bundle's replay (and so its verdict)
/// takes the incident's job's as the sample's own. Without a job (a GPU stall no process is
/// named for) the node's context is left without a cgroup. Other records pass as they are.
pub fn context_of_job(r: Record, root: Option<u32>) -> Record {
    let Record::Sample(Sample::Context(mut c)) = r else { return r };
    let jobs = std::mem::take(&mut c.jobs);
    if let Some(job) = jobs.into_iter().find(|j| Some(j.root) == root) {
        c.cgroup = job.cgroup;
        c.filesystems = job.filesystems;
    }
    Record::Sample(Sample::Context(c))
}

/// Whether a record of the window belongs in the bundle of a job whose processes are those
/// `in_job` says: a record about one process (an event, a process's sample) only when that
/// process is the job's, so the kills and exits of other jobs in the window never reach the
/// bundle's verdict; the node's records (context, GPUs, counters, the kernel log) always.
pub fn is_of_job(r: &Record, in_job: impl Fn(u32) -> bool) -> bool {
    match r {
        Record::Event(e) => in_job(e.subject_pid()),
        Record::Sample(s) => s.pid().is_none_or(in_job),
        _ => true,
    }
}

/// Writes one bundle from its lines, streamed: each line goes to record.jsonl as it comes and
/// is dropped; the summary, the report and the Perfetto trace are then read back from that
/// file one line at a time. No whole-window copy is held (an incident of 8,000 processes in a
/// 256 MiB cgroup). Returns the bundle's directory and its summary.
///
/// The bundle is written under a `.partial` name and renamed once whole: a bundle directory
/// named `incident-*` is always complete. What a failure (a full disk) or a kill left behind
/// is removed, now or at the next rotation.
pub fn write(
    root: &Path,
    name: &str,
    at_ns: u64,
    records: impl Iterator<Item = Record>,
) -> anyhow::Result<(PathBuf, crate::output::summary::Summary)> {
    let partial = root.join(format!(".{name}{PARTIAL}"));
    let written = write_files(&partial, at_ns, records);
    let done = written.and_then(|summary| {
        let dir = root.join(name);
        std::fs::rename(&partial, &dir)
            .with_context(|| format!("naming the bundle {}", dir.display()))?;
        Ok((dir, summary))
    });
    if done.is_err() {
        let _ = std::fs::remove_dir_all(&partial);
    }
    done
}

/// The suffix of a bundle being written.
const PARTIAL: &str = ".partial";

fn write_files(
    dir: &Path,
    at_ns: u64,
    records: impl Iterator<Item = Record>,
) -> anyhow::Result<crate::output::summary::Summary> {
    let dir = dir.to_path_buf();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    if let Some((uid, gid)) = crate::recording::files::sudo_caller() {
        // The bundle is the caller's to read, as its files are.
        let _ = std::os::unix::fs::chown(&dir, Some(uid), Some(gid));
    }
    let record = dir.join("record.jsonl");
    let mut rec = std::io::BufWriter::new(crate::recording::files::create_private(&record)?);
    // The Python stacks up to the incident (the window goes on past it).
    let mut stacks_then = crate::model::pystacks::PyStacks::default();
    for r in records {
        if let Record::Sample(crate::model::samples::Sample::PyStacks(s)) = &r {
            if s.t_ns <= at_ns {
                stacks_then
                    .apply(&crate::model::untrusted::cleaned(s).unwrap_or_else(|| s.clone()));
            }
        }
        if let Some(line) = r.as_line().map(|l| serde_json::to_vec(&l)) {
            rec.write_all(&line?)?;
            rec.write_all(b"\n")?;
        }
    }
    rec.flush()?;
    drop(rec);
    let summary = {
        let f = std::fs::File::open(&record)
            .with_context(|| format!("reading back {}", record.display()))?;
        let r = crate::recording::replay::replay(std::io::BufReader::new(f));
        crate::pipeline::conclude::summary(&r.model, r.end_ns, true)
    };
    crate::output::summary::write_json(&summary, &dir.join("summary.json"))?;
    let report = crate::output::text::render(&summary);
    let report = crate::model::untrusted::lines(&report);
    crate::recording::files::write_private(&dir.join("report.txt"), report.as_bytes())?;
    // The job's Python stacks as last seen before the incident, where any were.
    let stacks = crate::output::text::stacks(&summary, &stacks_then);
    if !stacks.is_empty() {
        let stacks = crate::model::untrusted::lines(&stacks);
        crate::recording::files::write_private(&dir.join("stacks.txt"), stacks.as_bytes())?;
    }
    crate::recording::files::write_private_with(&dir.join("trace.json"), |w| {
        crate::output::perfetto::write_recording(&record, usize::MAX, w)
    })?;
    Ok(summary)
}

fn is_partial(p: &Path) -> bool {
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    p.is_dir() && name.starts_with(".incident-") && name.ends_with(PARTIAL)
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// Deletes the oldest bundles until at most `max_count` remain and they take at most
/// `max_bytes` (the newest is always kept).
/// Bundles left half-written (the daemon killed mid-write) are removed first.
pub fn rotate(root: &Path, max_count: usize, max_bytes: u64) -> Vec<PathBuf> {
    let entries: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    let mut removed = Vec::new();
    for p in entries.iter().filter(|p| is_partial(p)) {
        if std::fs::remove_dir_all(p).is_ok() {
            removed.push(p.clone());
        }
    }
    let mut bundles: Vec<PathBuf> = entries
        .into_iter()
        .filter(|p| {
            p.is_dir()
                && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("incident-"))
        })
        .collect();
    bundles.sort();
    let mut sizes: Vec<u64> = bundles.iter().map(|b| dir_bytes(b)).collect();
    while bundles.len() > 1 && (bundles.len() > max_count || sizes.iter().sum::<u64>() > max_bytes)
    {
        let old = bundles.remove(0);
        sizes.remove(0);
        if std::fs::remove_dir_all(&old).is_ok() {
            removed.push(old);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_keeps_the_newest_within_count_and_size() {
        let root = std::env::temp_dir().join(format!("gpustall-bundles-{}", std::process::id()));
        for i in 0..5 {
            let d = root.join(format!("incident-{i:012}-oom_kill-1"));
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("record.jsonl"), vec![b'x'; 100]).expect("write");
        }
        let half = root.join(".incident-000000000009-oom_kill-1.partial");
        std::fs::create_dir_all(&half).expect("a bundle left half-written");
        assert_eq!(rotate(&root, 3, 1 << 20).len(), 3, "two old ones and the half-written one");
        assert!(!half.exists());
        assert_eq!(rotate(&root, 10, 150).len(), 2);
        let left: Vec<_> = std::fs::read_dir(&root).expect("dir").filter_map(|e| e.ok()).collect();
        assert_eq!(left.len(), 1);
        assert!(left[0].file_name().to_string_lossy().contains("000000000004"));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_bundle_takes_its_jobs_context() {
        use crate::model::host::{FsUsage, JobContext};
        use crate::model::samples::ContextSample;
        let fs = |path: &str| FsUsage {
            dev: None,
            path: path.into(),
            total_bytes: 1,
            avail_bytes: 1,
            used_pct: 0.0,
        };
        let job = |root, path| JobContext { root, cgroup: None, filesystems: vec![fs(path)] };
        let ctx = Record::Sample(Sample::Context(Box::new(ContextSample {
            t_ns: 1,
            jobs: vec![job(10, "/dev/shm"), job(20, "/data")],
            ..Default::default()
        })));
        let filesystems = |r: Record| match r {
            Record::Sample(Sample::Context(c)) => {
                assert!(c.jobs.is_empty(), "the jobs are folded in");
                c.filesystems.iter().map(|f| f.path.clone()).collect::<Vec<_>>()
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(filesystems(context_of_job(ctx.clone(), Some(20))), ["/data"]);
        assert_eq!(filesystems(context_of_job(ctx.clone(), Some(10))), ["/dev/shm"]);
        assert!(filesystems(context_of_job(ctx, None)).is_empty(), "no job, no filesystems");
        let other = Record::Sample(Sample::Vanished { t_ns: 1, pid: 2 });
        assert!(matches!(context_of_job(other, Some(20)), Record::Sample(Sample::Vanished { .. })));
    }

    #[test]
    fn counters_in_a_window_start_from_zero() {
        let c = |ns: u64| {
            Record::Sample(Sample::Counters(CountersSample {
                t_ns: ns,
                host: vec![ns],
                ..Default::default()
            }))
        };
        let host = |r: Record| match r {
            Record::Sample(Sample::Counters(c)) => c.host[0],
            other => panic!("{other:?}"),
        };
        let mut r = Rebase::default();
        assert_eq!(host(r.record(c(10))), 0);
        let other = r.record(Record::Sample(Sample::Vanished { t_ns: 1, pid: 2 }));
        assert!(matches!(other, Record::Sample(Sample::Vanished { .. })));
        assert_eq!(host(r.record(c(25))), 15);
    }
}
