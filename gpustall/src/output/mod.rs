//! Stage 5, what people read: the summary (JSON), the text report, the live status line, and
//! the timeline drawn as a self-contained HTML page or a Perfetto trace.

pub mod html;
pub mod job_stderr;
pub mod merged;
pub mod perfetto;
pub mod status_line;
pub mod summary;
pub mod text;
pub mod timeline;
pub mod trace_event;
