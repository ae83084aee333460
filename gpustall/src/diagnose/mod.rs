//! Stage 4, the diagnosis: [`facts`] gathers plain figures from the model, [`verdict`] decides
//! the cause from them (a pure function, unit-tested on hand-built facts).

pub mod facts;
pub mod job_verdict;
pub mod verdict;
