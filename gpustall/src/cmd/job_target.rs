//! `trace --slurm-job ID` and `--report-to-job`: a job that does not exist yet when gpustall
//! starts (the node's Prolog starts it, and slurmd starts the job's tasks once the Prolog has
//! returned), and the verdict's first lines in the job's own output. See deploy/slurm/README.md.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use crate::{
    model::proctree::ProcessTree,
    output::job_stderr::{self, JobStderr},
    sources::slurm,
};

/// How long `--slurm-job` waits for the job's first task: the Prolog runs just before the first
/// step's tasks (with `PrologFlags=Alloc`, at the allocation, before any step).
const FIRST_TASK_WITHIN: Duration = Duration::from_secs(600);
/// How often the job's cgroups are looked at until then: a task found late has forked (and
/// perhaps been killed) untraced.
const WAIT_POLL: Duration = Duration::from_millis(20);

/// The Slurm job to follow, if any, and the job's standard error once opened.
pub struct JobTarget {
    slurm_job: Option<u64>,
    report_to_job: bool,
    stderr: Option<JobStderr>,
}

impl JobTarget {
    pub fn new(slurm_job: Option<u64>, report_to_job: bool) -> Self {
        JobTarget { slurm_job, report_to_job, stderr: None }
    }

    /// `--slurm-job`: blocks until the job's first task on this node exists and returns it (the
    /// batch step's where there is one); `None` without --slurm-job.
    pub fn wait_for_first_task(&mut self) -> anyhow::Result<Option<u32>> {
        let Some(job) = self.slurm_job else { return Ok(None) };
        // The Prolog waits for this line: from here on a task that starts is found.
        say!("gpustall: waiting for Slurm job {job}'s first task on this node");
        let end = Instant::now() + FIRST_TASK_WITHIN;
        while Instant::now() < end {
            if let Some(&pid) = self.tasks().first() {
                say!("gpustall: Slurm job {job}: its first task is pid {pid}");
                return Ok(Some(pid));
            }
            std::thread::sleep(WAIT_POLL);
        }
        anyhow::bail!(
            "Slurm job {job} started no task on this node within {} (is it running here? `scontrol show job {job}`)",
            humantime::format_duration(FIRST_TASK_WITHIN)
        )
    }

    /// The tasks of the job now, in its cgroups (`--slurm-job`), not yet in `tree`.
    pub fn new_tasks(&self, tree: &ProcessTree) -> Vec<u32> {
        let me = std::process::id();
        self.tasks().into_iter().filter(|&p| p != me && !tree.contains(p)).collect()
    }

    /// Looked for anew each time: slurmd makes the job's cgroup in one v1 controller before
    /// another, and some (proctrack's freezer) have no task cgroups.
    fn tasks(&self) -> Vec<u32> {
        let Some(job) = self.slurm_job else { return Vec::new() };
        slurm::task_pids(&slurm::job_cgroups(Path::new("/sys/fs/cgroup"), job))
    }

    /// `--report-to-job`: holds `pid`'s standard error open for the verdict (the first task's
    /// that has a file there), while it is still alive.
    pub fn hold_stderr_of(&mut self, pid: u32) {
        if !self.report_to_job || self.stderr.is_some() {
            return;
        }
        match JobStderr::open(pid) {
            Ok(s) => {
                say!("gpustall: the verdict goes to the end of {} too", s.path.display());
                self.stderr = Some(s);
            }
            Err(e) => say!("gpustall: note: no verdict in the job's output from pid {pid}: {e}"),
        }
    }

    /// The verdict's first lines at the end of the job's standard error, and where the rest is.
    pub fn write_verdict(&mut self, report: &str, rest: &[&Path]) {
        let Some(s) = self.stderr.as_mut() else {
            if self.report_to_job {
                say!("gpustall: warning: the job's output was never opened: no verdict in it");
            }
            return;
        };
        match s.append(&job_stderr::verdict_lines(report, rest)) {
            Ok(()) => say!("gpustall: wrote the verdict to {}", s.path.display()),
            Err(e) => say!("gpustall: warning: the verdict to {}: {e}", s.path.display()),
        }
    }
}
