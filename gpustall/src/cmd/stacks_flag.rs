//! The Python stacks' flag, shared by `trace` and `watch`.

/// How often the job's Python stacks are sampled.
#[derive(clap::Args)]
pub struct StacksArgs {
    /// Sample the Python stacks of the trainers, ranks and DataLoader workers (py-spy, without
    /// pausing them): `auto` (at most 0.5 % of one CPU in all), `off`, or samples a second.
    #[arg(long, value_name = "RATE", default_value = "auto")]
    pub py_stacks: crate::sources::pyspy::Rate,
}
