//! Reading a run's console (the guest script's `@@` markers and libtest's lines) into outcomes,
//! and the table of test x kernel.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    /// Passed, on a kernel where gpustall used its documented next-best source.
    Degraded,
    Fail,
    /// Failed, then passed when its binary ran once more in the same guest: shown, with the
    /// first failure's output under the run, but not a failure of the matrix.
    Flaky,
    /// The VM was stopped before the test reported.
    Timeout,
}

impl Outcome {
    fn cell(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Degraded => "degraded",
            Outcome::Fail => "FAIL",
            Outcome::Flaky => "flaky",
            Outcome::Timeout => "TIMEOUT",
        }
    }
}

/// One kernel's results.
pub struct Run {
    /// As asked: `5.10`, `6.1:v1`, `host`.
    pub spec: String,
    pub release: String,
    /// `binary::test` -> outcome, for every selected test.
    pub outcomes: BTreeMap<String, Outcome>,
    /// `binary::test` -> what was degraded.
    pub degraded: BTreeMap<String, Vec<String>>,
    /// Seconds each test binary took, from the guest's clock.
    pub bin_secs: BTreeMap<String, f64>,
    pub wall: Duration,
    pub log: PathBuf,
    /// Its guest printed nothing for minutes and was stopped, or its kernel panicked.
    pub hung: bool,
    /// This is a second boot, after the first one's guest hung.
    pub retried_after_hang: bool,
}

impl Run {
    /// Tests that never reported (the VM stopped or crashed first).
    pub fn mark_unfinished(&mut self, outcome: Outcome) {
        for o in self.outcomes.values_mut() {
            if *o == Outcome::Timeout {
                *o = outcome;
            }
        }
    }
}

/// `test NAME ... ok|FAILED|ignored` -> (NAME, passed).
fn libtest_result(line: &str) -> Option<(&str, bool)> {
    let rest = line.strip_prefix("test ")?;
    let (name, result) = rest.rsplit_once(" ... ")?;
    match result.trim() {
        "ok" => Some((name, true)),
        "FAILED" => Some((name, false)),
        _ => None,
    }
}

/// What libtest printed about its failed tests (each one's output and panic message, between
/// the first `failures:` line and the list of names that follows), at most `max` lines: shown
/// under the run, since CI's log may be all there is of a guest that is gone.
pub fn failure_report(lines: &[String], max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in lines {
        if line.trim_end() == "failures:" {
            inside = !inside;
            continue;
        }
        if line.starts_with("@@END ") {
            inside = false;
        }
        if inside && !line.trim().is_empty() && out.len() < max {
            out.push(line.as_str());
        }
    }
    out
}

/// The outcomes of `selected` (binary, test) from a console.
pub fn parse(spec: &str, release: &str, lines: &[String], selected: &[(String, String)]) -> Run {
    let mut outcomes: BTreeMap<String, Outcome> =
        selected.iter().map(|(b, t)| (format!("{b}::{t}"), Outcome::Timeout)).collect();
    let mut degraded: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut bin_secs = BTreeMap::new();
    let mut bin = String::new();
    let mut seen: Vec<String> = Vec::new();
    let mut failed_first: Vec<String> = Vec::new();
    for line in lines {
        if let Some(b) = line.strip_prefix("@@BEGIN ") {
            bin = b.split_whitespace().next().unwrap_or_default().to_string();
            seen.clear();
        } else if let Some(end) = line.strip_prefix("@@END ") {
            let mut f = end.split_whitespace();
            let _ = f.next();
            let rc = f.next().and_then(|r| r.strip_prefix("rc=")).and_then(|r| r.parse().ok());
            let secs = f.next().and_then(|s| s.strip_prefix("secs=")).and_then(|s| s.parse().ok());
            *bin_secs.entry(bin.clone()).or_insert(0.0) += secs.unwrap_or(0.0);
            // A binary that exits 0 passed every selected test; otherwise a test without an
            // `ok` line failed (libtest's FAILED lines can be torn by other output).
            for (id, o) in outcomes.iter_mut().filter(|(id, _)| id.starts_with(&format!("{bin}::")))
            {
                if *o == Outcome::Timeout {
                    let ok = rc == Some(0) || seen.contains(id);
                    *o = if ok { Outcome::Pass } else { Outcome::Fail };
                }
            }
        } else if let Some(r) = line.strip_prefix("@@RETRY ") {
            // The binary runs once more: its failed tests are open again.
            let b = r.split_whitespace().next().unwrap_or_default();
            for (id, o) in outcomes.iter_mut().filter(|(id, _)| id.starts_with(&format!("{b}::"))) {
                if *o == Outcome::Fail {
                    failed_first.push(id.clone());
                    *o = Outcome::Timeout;
                }
            }
        } else if let Some(d) = line.strip_prefix("@@DEGRADED ") {
            let mut f = d.splitn(3, ' ');
            let (b, t, what) =
                (f.next().unwrap_or(""), f.next().unwrap_or(""), f.next().unwrap_or(""));
            // libtest names a test's thread after the test; anything else is the binary's.
            let id = format!("{b}::{t}");
            let notes = degraded.entry(id).or_default();
            if !notes.iter().any(|n| n == what) {
                notes.push(what.to_string());
            }
        } else if let Some((name, passed)) = libtest_result(line) {
            let id = format!("{bin}::{name}");
            if passed {
                seen.push(id);
            } else if let Some(o) = outcomes.get_mut(&id) {
                *o = Outcome::Fail;
            }
        }
    }
    for id in &failed_first {
        if let Some(o) = outcomes.get_mut(id) {
            if *o == Outcome::Pass {
                *o = Outcome::Flaky;
            }
        }
    }
    for (id, notes) in &degraded {
        if let Some(o) = outcomes.get_mut(id) {
            if *o == Outcome::Pass && !notes.is_empty() {
                *o = Outcome::Degraded;
            }
        }
    }
    Run {
        spec: spec.to_string(),
        release: release.to_string(),
        outcomes,
        degraded,
        bin_secs,
        wall: Duration::ZERO,
        log: PathBuf::new(),
        hung: false,
        retried_after_hang: false,
    }
}

pub struct Table {
    pub text: String,
    pub markdown: String,
    pub failures: usize,
}

/// The table of test x kernel, the degradations under it, and the time each kernel took.
pub fn table(runs: &[Run], total: Duration) -> Table {
    let mut ids: Vec<&String> = runs.iter().flat_map(|r| r.outcomes.keys()).collect();
    ids.sort();
    ids.dedup();
    let width = ids.iter().map(|i| i.len()).max().unwrap_or(4).max(4);
    let heads: Vec<String> = runs.iter().map(|r| r.spec.clone()).collect();
    let mut text = format!("{:width$}", "test");
    let mut md = format!("| test | {} |\n|---|{}\n", heads.join(" | "), "---|".repeat(runs.len()));
    for h in &heads {
        text.push_str(&format!("  {h:>9}"));
    }
    text.push('\n');
    let mut failures = 0;
    for id in &ids {
        text.push_str(&format!("{id:width$}"));
        md.push_str(&format!("| `{id}` |"));
        for r in runs {
            let cell = r.outcomes.get(*id).map_or("-", |o| o.cell());
            if matches!(r.outcomes.get(*id), Some(Outcome::Fail | Outcome::Timeout)) {
                failures += 1;
            }
            text.push_str(&format!("  {cell:>9}"));
            md.push_str(&format!(" {cell} |"));
        }
        text.push('\n');
        md.push('\n');
    }
    let mut notes = String::new();
    for r in runs {
        let secs: Vec<String> = r.bin_secs.iter().map(|(b, s)| format!("{b} {s:.0}s")).collect();
        notes.push_str(&format!(
            "\n{} = {}: {:.0} s ({})",
            r.spec,
            r.release,
            r.wall.as_secs_f64(),
            secs.join(", ")
        ));
        let mut all: Vec<&String> = r.degraded.values().flatten().collect();
        all.sort();
        all.dedup();
        for d in all {
            notes.push_str(&format!("\n    degraded: {d}"));
        }
        for (id, _) in r.outcomes.iter().filter(|(_, o)| **o == Outcome::Flaky) {
            notes.push_str(&format!(
                "\n    flaky: {id} failed, then passed when run again (the failure: in the console log, and printed under its run)"
            ));
        }
        if r.retried_after_hang {
            notes.push_str(
                "\n    retried: the first boot's guest hung or panicked (its console: vm/runs/<kernel>-console-hung.log)",
            );
        }
    }
    notes.push_str(&format!("\nmatrix: {:.0} s", total.as_secs_f64()));
    text.push_str(&notes);
    md.push_str("\n```");
    md.push_str(&notes);
    md.push_str("\n```\n");
    Table { text, markdown: md, failures }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_outcomes_degradations_and_times() {
        let lines: Vec<String> = [
            "@@BEGIN block_io uptime=5.0",
            "running 2 tests",
            "test a ... ok",
            "test b ... FAILED",
            "@@END block_io rc=101 secs=12.5",
            "@@DEGRADED block_io a request latency from the bio",
            "@@BEGIN oom_kill uptime=9.0",
            "test c ... [  1.0] torn",
            "@@END oom_kill rc=0 secs=3.0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let sel = [("block_io", "a"), ("block_io", "b"), ("oom_kill", "c"), ("watch", "d")]
            .map(|(b, t)| (b.to_string(), t.to_string()));
        let run = parse("5.10", "5.10.0-46-amd64", &lines, &sel);
        assert_eq!(run.outcomes["block_io::a"], Outcome::Degraded);
        assert_eq!(run.outcomes["block_io::b"], Outcome::Fail);
        assert_eq!(run.outcomes["oom_kill::c"], Outcome::Pass);
        assert_eq!(run.outcomes["watch::d"], Outcome::Timeout);
        assert_eq!(run.bin_secs["block_io"], 12.5);
        let t = table(&[run], Duration::from_secs(60));
        assert_eq!(t.failures, 2);
        assert!(t.markdown.contains("| `block_io::a` | degraded |"), "{}", t.markdown);
    }

    #[test]
    fn a_failed_tests_output_and_panic_are_picked_out() {
        let lines: Vec<String> = [
            "@@BEGIN memory_pressure uptime=5.0",
            "test r ... FAILED",
            "successes:",
            "failures:",
            "",
            "---- r stdout ----",
            "pswpout delta 10 pages",
            "thread 'r' panicked at tests/tests/memory_pressure.rs:66:5:",
            "not within 10%",
            "failures:",
            "    r",
            "@@END memory_pressure rc=101 secs=60.0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            failure_report(&lines, 50),
            [
                "---- r stdout ----",
                "pswpout delta 10 pages",
                "thread 'r' panicked at tests/tests/memory_pressure.rs:66:5:",
                "not within 10%"
            ]
        );
        assert_eq!(failure_report(&lines, 2).len(), 2);
    }

    #[test]
    fn a_test_that_fails_then_passes_on_its_binarys_second_run_is_flaky_not_failed() {
        let lines: Vec<String> = [
            "@@BEGIN memory_pressure uptime=5.0",
            "test r ... FAILED",
            "@@END memory_pressure rc=101 secs=60.0",
            "@@RETRY memory_pressure rc=101",
            "@@BEGIN memory_pressure uptime=65.0",
            "test r ... ok",
            "@@END memory_pressure rc=0 secs=58.0",
            "@@BEGIN oom_kill uptime=124.0",
            "test c ... FAILED",
            "@@END oom_kill rc=101 secs=3.0",
            "@@RETRY oom_kill rc=101",
            "@@BEGIN oom_kill uptime=128.0",
            "test c ... FAILED",
            "@@END oom_kill rc=101 secs=3.0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let sel = [("memory_pressure", "r"), ("oom_kill", "c")]
            .map(|(b, t)| (b.to_string(), t.to_string()));
        let run = parse("6.1", "6.1.0-57-amd64", &lines, &sel);
        assert_eq!(run.outcomes["memory_pressure::r"], Outcome::Flaky);
        assert_eq!(run.outcomes["oom_kill::c"], Outcome::Fail);
        assert_eq!(run.bin_secs["memory_pressure"], 118.0);
        let t = table(&[run], Duration::from_secs(200));
        assert_eq!(t.failures, 1);
        assert!(t.text.contains("flaky: memory_pressure::r failed"), "{}", t.text);
    }
}
