//! Recordings: JSON Lines written as the trace goes ([`writer`]), or kept in memory for the
//! last minutes ([`flight`]), and replayed offline into the same model ([`replay`]).

pub mod files;
pub mod flight;
pub mod header;
pub mod record;
pub mod replay;
pub mod writer;
