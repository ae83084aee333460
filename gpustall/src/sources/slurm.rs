//! A Slurm job's tasks, found in the cgroups slurmd makes for it: `trace --slurm-job N`, started
//! by the node's Prolog before the job's first task exists, waits here for it and picks up the
//! tasks of later steps as they appear.
//!
//! cgroup v1: `<controller>/slurm[_NODE]/uid_U/job_N/step_S/task_T` in each controller slurmd
//! uses; v2: `system.slice/slurmstepd.scope/job_N/step_S/user/task_T`. The extern step
//! (`step_extern`, `PrologFlags=Contain`) holds Slurm's own placeholder and adopted ssh
//! sessions, not the job's work: its tasks are left out.

use std::path::{Path, PathBuf};

/// The cgroup directories of Slurm job `job` under `root` (`/sys/fs/cgroup`): one per v1
/// controller slurmd made it in, or the v2 one. Empty until slurmd has made them.
pub fn job_cgroups(root: &Path, job: u64) -> Vec<PathBuf> {
    let name = format!("job_{job}");
    let mut dirs = Vec::new();
    // v1: every controller's slurm*/uid_*/job_N.
    for controller in subdirs(root) {
        for slurm in subdirs(&controller).into_iter().filter(|d| has_prefix(d, "slurm")) {
            for uid in subdirs(&slurm).into_iter().filter(|d| has_prefix(d, "uid_")) {
                dirs.push(uid.join(&name));
            }
        }
    }
    // v2: slurmstepd's own scope.
    dirs.push(root.join("system.slice/slurmstepd.scope").join(&name));
    dirs.retain(|d| d.is_dir());
    dirs
}

/// The processes in the job's task cgroups (every step's but the extern one's), the batch
/// step's first: its standard error is the job's `slurm-<id>.out`. Each pid once.
pub fn task_pids(job_dirs: &[PathBuf]) -> Vec<u32> {
    let mut tasks: Vec<(bool, u32)> = Vec::new();
    for dir in job_dirs {
        for step in subdirs(dir).into_iter().filter(|d| has_prefix(d, "step_")) {
            if step.ends_with("step_extern") {
                continue;
            }
            let batch = step.ends_with("step_batch");
            // v2 puts the tasks under `user/`.
            let parents = [step.clone(), step.join("user")];
            for task in parents.iter().flat_map(|p| subdirs(p)).filter(|d| has_prefix(d, "task_")) {
                let procs = std::fs::read_to_string(task.join("cgroup.procs")).unwrap_or_default();
                tasks.extend(
                    procs.lines().filter_map(|l| l.trim().parse().ok()).map(|p| (!batch, p)),
                );
            }
        }
    }
    // Stable: the batch step's first, each in the order its cgroup listed it.
    tasks.sort_by_key(|&(later, _)| later);
    let mut seen = std::collections::HashSet::new();
    tasks.into_iter().map(|(_, p)| p).filter(|p| seen.insert(*p)).collect()
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs
}

fn has_prefix(dir: &Path, prefix: &str) -> bool {
    dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake cgroup tree: each path a directory, with `cgroup.procs` where pids are given.
    fn tree(name: &str, dirs: &[(&str, &str)]) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("gpustall-slurm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (dir, procs) in dirs {
            std::fs::create_dir_all(root.join(dir)).expect("mkdir");
            if !procs.is_empty() {
                std::fs::write(root.join(dir).join("cgroup.procs"), procs).expect("procs");
            }
        }
        root
    }

    #[test]
    fn v1_tasks_of_every_step_but_the_extern_one_the_batch_steps_first() {
        let root = tree(
            "v1",
            &[
                ("memory/slurm_n1/uid_1000/job_7/step_0/task_0", "300\n301\n"),
                ("memory/slurm_n1/uid_1000/job_7/step_batch/task_0", "200\n"),
                ("memory/slurm_n1/uid_1000/job_7/step_extern/task_0", "100\n"),
                ("memory/slurm_n1/uid_1000/job_8/step_batch/task_0", "900\n"),
                ("freezer/slurm_n1/uid_1000/job_7/step_batch/task_0", "200\n"),
                ("cpu/kubepods/job_7", ""),
            ],
        );
        let dirs = job_cgroups(&root, 7);
        assert_eq!(
            dirs,
            vec![
                root.join("freezer/slurm_n1/uid_1000/job_7"),
                root.join("memory/slurm_n1/uid_1000/job_7")
            ]
        );
        assert_eq!(task_pids(&dirs), vec![200, 300, 301]);
        assert!(job_cgroups(&root, 70).is_empty(), "job_70 is not job_7");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn v2_tasks_under_user() {
        let root = tree(
            "v2",
            &[
                ("system.slice/slurmstepd.scope/job_77/step_batch/slurm", "50\n"),
                ("system.slice/slurmstepd.scope/job_77/step_batch/user/task_0", "51\n"),
            ],
        );
        let dirs = job_cgroups(&root, 77);
        assert_eq!(dirs, vec![root.join("system.slice/slurmstepd.scope/job_77")]);
        assert_eq!(task_pids(&dirs), vec![51], "slurmstepd itself is no task");
        let _ = std::fs::remove_dir_all(&root);
    }
}
