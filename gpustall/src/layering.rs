//! The pipeline's order, held by a test: each stage (a folder of `src/`) imports only the
//! stages before it, never one after it, so the data flows the way the folders say.
//!
//! ```text
//! model ──> diagnose ─────────────────────────────┐
//!   └─> sources ──> kernel                        ├─> pipeline ──> cmd
//!   └─> sources ──> recording ──> output ─────────┘
//! ```
//!
//! `model/` and `diagnose/` are pure besides: no aya, no tokio, no files or /proc, so both run
//! the same live and on a replayed recording and are unit-tested on hand-built input. Only
//! `pipeline/` calls the diagnosis (`output/` may name its types, to print them). Unit tests
//! (`#[cfg(test)] mod tests`, the files under a `tests` module) may reach anywhere.

use std::path::{Path, PathBuf};

const STAGES: &[&str] =
    &["model", "diagnose", "sources", "kernel", "recording", "output", "pipeline", "cmd"];

/// What each stage may import from the others.
fn allowed(stage: &str) -> &'static [&'static str] {
    match stage {
        "model" => &[],
        "diagnose" => &["model"],
        "sources" => &["model"],
        "kernel" => &["model", "sources"],
        "recording" => &["model", "sources"],
        "output" => &["model", "diagnose", "recording", "sources"],
        "pipeline" => &["model", "diagnose", "sources", "kernel", "recording", "output"],
        "cmd" => &["model", "sources", "kernel", "recording", "output", "pipeline"],
        _ => &[],
    }
}

/// What the pure stages must not mention at all.
const IMPURE: &[&str] = &["aya::", "tokio", "std::fs", "std::net", "\"/proc", "\"/sys"];

/// The diagnosis's deciding functions: called from `pipeline/` (and within `diagnose/`) only.
const DECIDING: &[&str] = &["facts::from_model", "verdict::decide", "job::decide", "job::onsets"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source dir").flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// A file's code lines before its unit tests, comments cut off.
fn code_lines(f: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(f).expect("source file");
    let is_test_file = f.file_stem().is_some_and(|s| s == "tests");
    let mut lines = Vec::new();
    let mut prev = "";
    for (n, line) in text.lines().enumerate() {
        if is_test_file || (prev.trim() == "#[cfg(test)]" && line.trim_start().starts_with("mod "))
        {
            break;
        }
        prev = line;
        lines.push((n + 1, line.split("//").next().unwrap_or_default().to_string()));
    }
    lines
}

/// Every place a stage names another it may not, or a pure stage reaches outside.
fn violations(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for stage in STAGES {
        let mut files = Vec::new();
        rust_files(&src.join(stage), &mut files);
        assert!(!files.is_empty(), "the stage {stage} has files");
        let pure = matches!(*stage, "model" | "diagnose");
        for f in &files {
            for (n, code) in code_lines(f) {
                let mut say = |what: &str| found.push(format!("{}:{n}: {what}", f.display()));
                for other in STAGES.iter().filter(|o| *o != stage) {
                    let named = code.contains(&format!("crate::{other}"))
                        || code.trim_start().starts_with(&format!("{other}::"));
                    if named && !allowed(stage).contains(other) {
                        say(&format!("{stage} imports {other}"));
                    }
                }
                for bad in IMPURE.iter().filter(|b| pure && code.contains(*b)) {
                    say(&format!("{stage} is pure but mentions {bad}"));
                }
                if !matches!(*stage, "pipeline" | "diagnose") {
                    for call in DECIDING.iter().filter(|c| code.contains(*c)) {
                        say(&format!("{stage} calls {call} (only pipeline/ decides)"));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn every_stage_imports_only_the_stages_before_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    assert!(found.is_empty(), "imports that run back up:\n{}", found.join("\n"));
}

#[test]
fn every_stage_folder_is_in_the_table() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut folders: Vec<String> = std::fs::read_dir(&src)
        .expect("src")
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    folders.sort();
    let mut stages: Vec<String> = STAGES.iter().map(|s| s.to_string()).collect();
    stages.sort();
    assert_eq!(folders, stages, "a new folder needs its place in the order");
}

/// Figures and names with one place each (issue "one figure, one place"): code that derives
/// them again by hand, as (what it says, why).
const DERIVED_ONCE: &[(&str, &str)] = &[
    ("direct_reclaim_count +", "reclaim episodes: ProcCounters/ProcessSummary::reclaim_count"),
    ("direct_reclaim_ns +", "reclaim stalls: ProcCounters/ProcessSummary::reclaim_ns"),
    ("== \"trainer\"", "a role compared as a string: compare the Role"),
    ("== \"rank\"", "a role compared as a string: compare the Role"),
    ("io_wait_ns.max(", "time blocked on I/O: ProcFacts::io_blocked_ns"),
];

#[test]
fn each_figure_and_name_is_derived_in_its_one_place() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for f in files.iter().filter(|f| !f.ends_with("layering.rs")) {
        for (n, code) in code_lines(f) {
            // The one place itself: the methods' bodies.
            if code.trim_start().starts_with("self.direct_reclaim")
                || code.trim_start().starts_with("self.io_wait_ns.max(")
            {
                continue;
            }
            for (bad, why) in DERIVED_ONCE.iter().filter(|(b, _)| code.contains(b)) {
                found.push(format!("{}:{n}: {bad} ({why})", f.display()));
            }
            if code.contains("to_value(") && code.contains("role") {
                found.push(format!(
                    "{}:{n}: a role named through serde (Role::as_str)",
                    f.display()
                ));
            }
        }
    }
    assert!(found.is_empty(), "derived again by hand:\n{}", found.join("\n"));
}

/// Every module of a stage (a file or folder directly in it) is named in its row of
/// docs/ARCHITECTURE.md's table: the map a newcomer reads first has no gaps.
#[test]
fn every_module_is_on_the_architecture_map() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("../docs/ARCHITECTURE.md")).expect("the map");
    let mut missing = Vec::new();
    for stage in STAGES {
        let row_start = format!("| `{stage}/` |");
        let row = doc.lines().find(|l| l.starts_with(&row_start)).unwrap_or_default();
        let named: Vec<&str> = row.split('`').skip(1).step_by(2).collect();
        for e in std::fs::read_dir(root.join("src").join(stage)).expect("stage").flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let module = name.strip_suffix(".rs").unwrap_or(&name).to_string();
            if matches!(module.as_str(), "mod" | "tests" | "testdata") || module.ends_with("_tests")
            {
                continue;
            }
            let on_map = named.iter().any(|n| {
                let n = n.trim_end_matches('/').trim_end_matches(".rs");
                n == module
                    || n.starts_with(&format!("{module}/"))
                    || n.starts_with(&format!("{module}::"))
            });
            if !on_map {
                missing.push(format!("{stage}/{module}"));
            }
        }
    }
    assert!(missing.is_empty(), "not on docs/ARCHITECTURE.md's map: {missing:?}");
}

/// No file name is used by two stages (nor twice within one): `kernel/offcpu.rs` beside
/// `model/offcpu.rs` made a reader ask which one a path meant. mod.rs, tests.rs and the like
/// are not names.
#[test]
fn no_file_name_is_used_by_two_stages() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut by_name: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for stage in STAGES {
        let mut files = Vec::new();
        rust_files(&src.join(stage), &mut files);
        for f in files {
            let stem = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let in_tests = f.components().any(|c| c.as_os_str() == "tests");
            if matches!(stem.as_str(), "mod" | "tests") || stem.ends_with("_tests") || in_tests {
                continue;
            }
            let at = f.strip_prefix(&src).unwrap_or(&f).display().to_string();
            by_name.entry(stem).or_default().push(at);
        }
    }
    let twice: Vec<_> = by_name.into_iter().filter(|(_, at)| at.len() > 1).collect();
    assert!(twice.is_empty(), "file names used more than once: {twice:?}");
}

/// One id vocabulary from the kernel's maps to the JSON: a process is a `pid`, a thread a `tid`
/// (ps's and /proc's words), in the agent, the shared types and the eBPF programs alike. The
/// kernel's `tgid` is named only in strings and comments, where its own fields are read
/// (`task_tgid`, the BTF field "tgid"), and in its helper's name; a `tgid` in code meant a
/// reader had to know which layer's words a line used.
#[test]
fn a_process_is_a_pid_in_every_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for krate in ["gpustall/src", "gpustall-common/src", "gpustall-ebpf/src"] {
        let mut files = Vec::new();
        rust_files(&root.join(krate), &mut files);
        for f in files {
            for (n, code) in code_lines(&f) {
                // Strings say what the kernel calls its fields.
                let code: String = code.split('"').step_by(2).collect();
                let word = |w: &str| w == "tgid" || w == "tgids" || w.ends_with("_tgid");
                let words = code.split(|c: char| !c.is_alphanumeric() && c != '_');
                // The kernel's offset of it, and the BPF helper's own name.
                let kernels = ["task_tgid", "bpf_get_current_pid_tgid"];
                if words.filter(|w| !kernels.contains(w)).any(word) {
                    found.push(format!("{}:{n}: {}", f.display(), code.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "a process named tgid, not pid:\n{}", found.join("\n"));
}
