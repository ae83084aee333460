//! Incident bundles written by `gpustall watch`: a directory per incident with the recording
//! of the window around it (replayable with `gpustall report`), the summary and verdict, the
//! text report and a Perfetto trace. Bundles are rotated by count and total size.

use anyhow::Context as _;
use std::{
    io::Write,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

use serde_json::Value;

use crate::model::samples::CountersSample;
use crate::model::samples::Sample;

/// Counters in a flight-recorder window are cumulative since the daemon started: make them
/// count from the window's first read instead, one line at a time.
#[derive(Default)]
pub struct Rebase {
    base: Option<CountersSample>,
}

impl Rebase {
    pub fn line(&mut self, v: Value) -> Value {
        if v["type"] != "sample" || v["kind"] != "counters" {
            return v;
        }
        let Ok(Sample::Counters(c)) = serde_json::from_value::<Sample>(v.clone()) else {
            return v;
        };
        let b = self.base.get_or_insert_with(|| c.clone());
        Sample::Counters(c.minus(b)).to_json()
    }
}

/// A context sample of a window as the job rooted at `root` saw it: `gpustall watch` reads
/// each job's cgroup and filesystems into `jobs`; the bundle's replay (and so its verdict)
/// takes the incident's job's as the sample's own. Without a job (a GPU stall no process is
/// named for) the node's context is left without a cgroup. Other lines pass as they are.
pub fn context_of_job(mut v: Value, root: Option<u32>) -> Value {
    if v["type"] != "sample" || v["kind"] != "context" {
        return v;
    }
    let job = v["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| root.is_some_and(|r| j["root"] == r)))
        .cloned();
    if let Some(obj) = v.as_object_mut() {
        obj.remove("jobs");
        if let Some(job) = job {
            obj.insert("cgroup".into(), job["cgroup"].clone());
            obj.insert("filesystems".into(), job["filesystems"].clone());
        }
    }
    v
}

/// Writes one bundle from its lines, streamed: each line goes to record.jsonl as it comes and
/// is dropped; the summary, the report and the Perfetto trace are then read back from that
/// file one line at a time. No whole-window copy is held (an incident of 8,000 processes in a
/// 256 MiB cgroup). Returns the bundle's directory and its summary.
pub fn write(
    root: &Path,
    name: &str,
    lines: impl Iterator<Item = Value>,
) -> anyhow::Result<(PathBuf, crate::output::summary::Summary)> {
    let dir = root.join(name);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let record = dir.join("record.jsonl");
    let mut rec = std::io::BufWriter::new(crate::output::files::create_private(&record)?);
    for v in lines {
        serde_json::to_writer(&mut rec, &v)?;
        rec.write_all(b"\n")?;
    }
    rec.flush()?;
    drop(rec);
    let summary = {
        let f = std::fs::File::open(&record)
            .with_context(|| format!("reading back {}", record.display()))?;
        let r = crate::recording::replay::replay(std::io::BufReader::new(f));
        crate::output::summary::Summary::of(&r.model, r.end_ns, true)
    };
    crate::output::summary::write_json(&summary, &dir.join("summary.json"))?;
    let report = crate::output::text::render(&summary);
    crate::output::files::write_private(&dir.join("report.txt"), report.as_bytes())?;
    let timeline = crate::output::timeline::from_file(&record, usize::MAX)?;
    crate::output::files::write_private_with(&dir.join("trace.json"), |w| {
        crate::output::perfetto::write_to(&timeline, w)
    })?;
    Ok((dir, summary))
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
pub fn rotate(root: &Path, max_count: usize, max_bytes: u64) -> Vec<PathBuf> {
    let mut bundles: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_dir()
                && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("incident-"))
        })
        .collect();
    bundles.sort();
    let mut sizes: Vec<u64> = bundles.iter().map(|b| dir_bytes(b)).collect();
    let mut removed = Vec::new();
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
        assert_eq!(rotate(&root, 3, 1 << 20).len(), 2);
        assert_eq!(rotate(&root, 10, 150).len(), 2);
        let left: Vec<_> = std::fs::read_dir(&root).expect("dir").filter_map(|e| e.ok()).collect();
        assert_eq!(left.len(), 1);
        assert!(left[0].file_name().to_string_lossy().contains("000000000004"));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_bundle_takes_its_jobs_context() {
        let ctx = serde_json::json!({"type": "sample", "kind": "context", "t_ns": 1,
        "cgroup": null, "filesystems": [],
        "jobs": [
            {"root": 10, "cgroup": {"path": "/a"}, "filesystems": [{"path": "/dev/shm"}]},
            {"root": 20, "cgroup": {"path": "/b"}, "filesystems": []}
        ]});
        let other = serde_json::json!({"type": "event"});
        let out = context_of_job(ctx.clone(), Some(20));
        assert_eq!(out["cgroup"]["path"], "/b");
        assert!(out.get("jobs").is_none());
        assert_eq!(context_of_job(other.clone(), Some(20)), other);
        let out = context_of_job(ctx.clone(), Some(10));
        assert_eq!(out["filesystems"][0]["path"], "/dev/shm");
        let out = context_of_job(ctx, None);
        assert!(out["cgroup"].is_null(), "no job, no cgroup");
    }

    #[test]
    fn counters_in_a_window_start_from_zero() {
        let c = |ns: u64| {
            Sample::Counters(CountersSample { t_ns: ns, host: vec![ns], ..Default::default() })
                .to_json()
        };
        let mut r = Rebase::default();
        assert_eq!(r.line(c(10))["host"][0], 0);
        assert_eq!(r.line(serde_json::json!({"type": "event"}))["type"], "event");
        assert_eq!(r.line(c(25))["host"][0], 15);
    }
}
