//! The pipeline's one rule, held by a test: the model and the diagnosis are pure. They import
//! nothing from the stages that touch the machine (`kernel`, `sources`), nothing from the
//! stages after them (`recording`, `output`, `cmd`), no aya or tokio, and read no files, so
//! both run the same live and on a replayed recording and are unit-tested on hand-built input.

use std::path::Path;

/// What `model/` and `diagnose/` must not mention.
const FORBIDDEN: &[&str] = &[
    "crate::kernel",
    "crate::sources",
    "crate::recording",
    "crate::output",
    "crate::cmd",
    "aya::",
    "tokio",
    "std::fs",
    "std::net",
    "\"/proc",
    "\"/sys",
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source dir").flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn model_and_diagnose_touch_no_machine_and_no_later_stage() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for stage in ["model", "diagnose"] {
        rust_files(&src.join(stage), &mut files);
    }
    assert!(files.len() >= 10, "found the stages' files: {files:?}");
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("source file");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for bad in FORBIDDEN.iter().filter(|b| code.contains(*b)) {
                found.push(format!("{}:{}: {bad}", f.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "the pure stages reach outside:\n{}", found.join("\n"));
}
