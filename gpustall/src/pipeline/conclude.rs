//! A model's conclusion: its facts, the verdict decided from them and the summary that prints
//! both. The one place `diagnose/` is called from, live (trace, watch) and offline (report,
//! export, merge, a bundle's replay), so every command says the same of the same model.

use crate::diagnose::{facts, verdict};
use crate::model::Model;
use crate::output::summary::Summary;

/// The summary of `m` at `now_ns`, with its verdict.
pub fn summary(m: &Model, now_ns: u64, is_final: bool) -> Summary {
    let facts = facts::from_model(m, now_ns);
    let verdict = verdict::decide(&facts);
    Summary::from_model(m, &facts, now_ns, is_final, verdict)
}
