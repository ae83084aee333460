//! `merge`'s core: each recording replayed into a lane of its own (its summary, its first
//! stalls, its rank, its timeline on the wall clock), then the job's answer across lanes:
//! which node stalled first, and where the recordings disagree.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

pub use crate::diagnose::job_verdict::JobVerdict;

use crate::{
    diagnose::job_verdict::{self, Source},
    model::identity::Identity,
    output::{
        merged::{self as out, Lane},
        timeline,
    },
    recording::header::Header,
};

/// The recording of an input: the file itself, or a bundle directory's record.jsonl.
pub fn recording_of(input: &Path) -> anyhow::Result<PathBuf> {
    if input.is_dir() {
        let rec = input.join("record.jsonl");
        anyhow::ensure!(
            rec.is_file(),
            "{} is a directory without record.jsonl: not an incident bundle",
            input.display()
        );
        return Ok(rec);
    }
    Ok(input.to_path_buf())
}

/// What tells two recordings of one host apart: the traced pid, else the incident, else the
/// file.
fn tag(h: &Header, input: &Path, job: Option<&Identity>) -> String {
    if let Some(rank) = job.and_then(|j| j.rank) {
        return format!("rank {rank}");
    }
    if let Some(pid) = h.targets.as_ref().and_then(|t| t.first()) {
        return format!("pid {pid}");
    }
    if let Some(i) = &h.incident {
        return format!("{} pid {}", i.kind, i.pid);
    }
    input.file_name().map_or_else(|| input.display().to_string(), |n| n.to_string_lossy().into())
}

/// One recording replayed: its lane (label filled in later) and whether it stopped early;
/// with its whole timeline when `timeline` (for the HTML page), else its tracks' names only.
pub fn load(input: &Path, timeline: bool) -> anyhow::Result<(Lane, Option<String>)> {
    let file = recording_of(input)?;
    let r = crate::recording::replay::open(&file)?;
    let header: Header = r
        .header
        .clone()
        .with_context(|| format!("{}: the first line is not a header", file.display()))?;
    anyhow::ensure!(
        header.wall_clock_at_start_ns > 0,
        "{} has no wall_clock_at_start_ns: it cannot be put on a shared timeline",
        file.display()
    );
    anyhow::ensure!(
        plausible_wall_clock(header.wall_clock_at_start_ns, crate::sources::clock::wall_ns()),
        "{}: its wall clock at start ({}) is not a date gpustall could have recorded: a node with a wrong clock cannot be put on the job's timeline",
        file.display(),
        job_verdict::date_time(header.wall_clock_at_start_ns)
    );
    let summary = crate::pipeline::conclude::summary(&r.model, r.end_ns, true);
    let onsets = job_verdict::onsets(&r.model);
    let rank = onsets.first().and_then(|o| job_verdict::rank_of(&r.model, o.pid));
    let source = Source {
        label: tag(&header, input, summary.job.as_ref()),
        host: header.host.clone(),
        kernel: header.kernel.clone(),
        mono_start_ns: header.start_ns,
        wall_start_ns: header.wall_clock_at_start_ns,
        mono_end_ns: r.end_ns.max(header.start_ns),
        onsets,
        rank,
        verdict: summary.verdict.clone(),
    };
    let mut tl = match timeline {
        true => timeline::from_file(&file, r.lines)?,
        false => timeline::tracks_from_file(&file, r.lines)?,
    };
    out::to_wall(&mut tl, |t| source.wall(t));
    let stopped = r.error.map(|e| {
        format!(
            "{} line {}: {}; the merge covers lines 1-{}",
            file.display(),
            e.line,
            e.why,
            r.lines
        )
    });
    let mode = header.mode.clone().unwrap_or_else(|| "trace".into());
    let lane = Lane {
        source,
        file: file.display().to_string(),
        mode,
        summary,
        timeline: tl,
        lines: r.lines,
        recording: file,
    };
    Ok((lane, stopped))
}

/// A recording's start on the wall clock can lie between 2000 and a day from now: a node
/// whose clock said 1970 (or a crafted header) would stretch the job's timeline over decades.
fn plausible_wall_clock(start_ns: u64, now_ns: u64) -> bool {
    const Y2000_NS: u64 = 946_684_800 * 1_000_000_000;
    const DAY_NS: u64 = 86_400 * 1_000_000_000;
    (Y2000_NS..=now_ns.saturating_add(DAY_NS)).contains(&start_ns)
}

/// A lane's place in the job: its rank (global, else its node's), where the recording says.
fn rank_key(l: &Lane) -> (bool, u32) {
    let rank = l.summary.job.as_ref().and_then(|j| j.rank.or(j.group_rank));
    (rank.is_none(), rank.unwrap_or(0))
}

/// The job's verdict over its lanes, and the disagreements between them; lanes in rank order
/// where their recordings say, each with its display name (host, and what tells two
/// recordings of one host apart: the rank, the pid, the incident).
pub fn conclude_job(lanes: &mut [Lane], max_skew_ns: u64) -> (JobVerdict, Vec<String>) {
    lanes.sort_by_key(rank_key);
    let names = job_verdict::labels(
        &lanes.iter().map(|l| (l.source.host.clone(), l.source.label.clone())).collect::<Vec<_>>(),
    );
    for (l, name) in lanes.iter_mut().zip(names) {
        l.source.label = name;
    }
    let sources: Vec<Source> = lanes.iter().map(|l| l.source.clone()).collect();
    let mut warnings = job_verdict::disagreements(&sources, max_skew_ns);
    warnings.extend(runs_differ(lanes));
    warnings.extend(missing_ranks(lanes));
    warnings.extend(duplicate_ranks(lanes));
    (job_verdict::decide(&sources, max_skew_ns), warnings)
}

/// Ranks of the job's world size that no recording holds (a merge of some ranks only).
fn missing_ranks(lanes: &[Lane]) -> Option<String> {
    let jobs: Vec<&Identity> = lanes.iter().filter_map(|l| l.summary.job.as_ref()).collect();
    let world = jobs.iter().filter_map(|j| j.world_size).max()?;
    let have: std::collections::BTreeSet<u32> = jobs.iter().filter_map(|j| j.rank).collect();
    if have.is_empty() {
        return None;
    }
    // A recording's world size is what its job's environment said: bounded, not trusted.
    if world > crate::model::identity::MAX_WORLD_SIZE {
        return Some(format!(
            "a recording says the job had {world} ranks: not a job's world size, not used"
        ));
    }
    let missing = rank_ranges((0..world).filter(|r| !have.contains(r)));
    (!missing.is_empty()).then(|| {
        format!(
            "ranks {} of {world} have no recording here: the first to stall may be among them",
            missing
        )
    })
}

/// Ranks that more than one recording claims (two recordings of one run, or two runs with the
/// same ranks): said, and every recording kept.
fn duplicate_ranks(lanes: &[Lane]) -> Option<String> {
    let mut by_rank: std::collections::BTreeMap<u32, Vec<&str>> = Default::default();
    for l in lanes {
        if let Some(r) = l.summary.job.as_ref().and_then(|j| j.rank) {
            by_rank.entry(r).or_default().push(l.file.as_str());
        }
    }
    let dup: Vec<String> = by_rank
        .iter()
        .filter(|(_, files)| files.len() > 1)
        .take(RANGES_SHOWN)
        .map(|(r, files)| format!("rank {r} in {}", files.join(" and ")))
        .collect();
    (!dup.is_empty()).then(|| {
        format!(
            "more than one recording claims a rank ({}): all are kept, side by side",
            dup.join("; ")
        )
    })
}

/// "2, 5-9, 12" for ascending ranks, the first [`RANGES_SHOWN`] runs and a count of the rest.
fn rank_ranges(ranks: impl Iterator<Item = u32>) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for r in ranks {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == r => *end = r,
            _ => runs.push((r, r)),
        }
    }
    let shown: Vec<String> = runs
        .iter()
        .take(RANGES_SHOWN)
        .map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
        .collect();
    let rest: u64 = runs.iter().skip(RANGES_SHOWN).map(|&(a, b)| u64::from(b - a) + 1).sum();
    match rest {
        0 => shown.join(", "),
        n => format!("{} and {n} more", shown.join(", ")),
    }
}

/// How many runs of missing ranks a warning names.
const RANGES_SHOWN: usize = 16;

/// Recordings of more than one torchrun run (or Slurm job) merged: said, not refused.
fn runs_differ(lanes: &[Lane]) -> Option<String> {
    let runs: std::collections::BTreeSet<String> = lanes
        .iter()
        .filter_map(|l| l.summary.job.as_ref())
        .filter_map(|j| j.run_id.clone().or_else(|| j.slurm_job.clone()))
        .collect();
    (runs.len() > 1).then(|| {
        let runs: Vec<String> = runs.into_iter().collect();
        format!(
            "the recordings are of {} different runs ({}): merged as one job",
            runs.len(),
            runs.join(", ")
        )
    })
}

/// The same recording given twice (a file and its bundle, a copy): one header, one start.
pub fn is_same_recording(a: &Source, b: &Source) -> bool {
    a.host == b.host && a.mono_start_ns == b.mono_start_ns && a.wall_start_ns == b.wall_start_ns
}

#[cfg(test)]
mod tests {
    #[test]
    fn missing_ranks_are_said_as_ranges_and_bounded() {
        assert_eq!(super::rank_ranges([0, 2, 3, 4, 9].into_iter()), "0, 2-4, 9");
        // Every other rank of a million: 16 named, the rest counted, in one short line.
        let s = super::rank_ranges((0..1_000_000u32).filter(|r| r % 2 == 1));
        assert!(s.ends_with("and 499984 more") && s.len() < 200, "{s}");
    }

    #[test]
    fn a_wall_clock_of_1970_or_the_far_future_is_not_plausible() {
        let now = 1_796_000_000 * 1_000_000_000;
        assert!(super::plausible_wall_clock(now - 3_600_000_000_000, now));
        assert!(!super::plausible_wall_clock(5_000_000_000, now), "1970");
        assert!(!super::plausible_wall_clock(u64::MAX, now));
    }
}
