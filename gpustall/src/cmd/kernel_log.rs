//! The kernel log's flag, shared by `trace` and `watch`.

/// Whose lines in the kernel log count as the kernel's.
#[derive(clap::Args)]
pub struct KernelLogArgs {
    /// Count lines user space writes into the kernel log (/dev/kmsg) as the kernel's: for
    /// testing, or where a trusted daemon relays driver messages. Without it such a line is
    /// shown as user space's and no verdict rests on it (a fake Xid is no GPU fault).
    #[arg(long, hide_short_help = true)]
    pub trust_user_kernel_log: bool,
}
