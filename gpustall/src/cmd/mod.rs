//! The commands: `trace` and `watch` run the pipeline live through one [`event_loop`] over a
//! [`session::Session`]; `report` and `export` replay recordings offline.

pub mod event_loop;
pub mod export;
pub mod gpu;
pub mod report;
pub mod session;
pub mod trace;
pub mod units;
pub mod watch;
