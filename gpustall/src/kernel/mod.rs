//! Stage 1, the kernel: privileges and limits checked, the eBPF object loaded with this kernel's
//! tracepoint layouts (tracefs) and struct offsets (BTF), programs attached, ring records
//! decoded into [`crate::model::event::Event`]s and counter maps read. The only code that
//! touches aya.

mod attach;
pub mod batch;
pub mod btf;
pub mod cuda;
pub mod decode;
pub mod folio;
pub mod hint;
pub mod klog;
pub mod layouts;
pub mod loader;
pub mod mapmem;
pub mod maps;
pub mod offcpu_maps;
pub mod preflight;
mod probes;
pub mod prog_stats;
pub mod tracefs;
