//! The pipeline's core, between the commands and the outputs: a [`session::Session`] takes in
//! what the kernel and the sources observe (decode, record, apply to the model, incidents), and
//! [`conclude`] turns a model into its facts, verdict and summary. The commands only parse
//! arguments and wire stages; this is the only caller of `diagnose/`.

pub mod conclude;
pub mod lanes;
pub mod pss;
pub mod rate_incidents;
pub mod session;
