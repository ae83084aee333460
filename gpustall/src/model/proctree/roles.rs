//! Roles in a training job, for each of multiprocessing's start methods, from what the kernel
//! and /proc give cheaply: the tree, exec, comm renames and command lines.
//!
//! - fork (DataLoader's default on Linux before Python 3.14; torchrun-like launchers that fork):
//!   the child runs its parent's program, no exec, same command line. A forked child is a
//!   worker only when it names itself (`pt_data_worker`): a plain fork says nothing.
//! - spawn (torch.multiprocessing.spawn, Lightning ddp_spawn, `multiprocessing_context="spawn"`):
//!   an exec of `python -c 'from multiprocessing.spawn import spawn_main; ...'`. Started by the
//!   top-level script, those are ranks; started by a rank, DataLoader workers. A spawned child
//!   of the top-level script that has workers of its own is a rank; one whose spawned siblings
//!   named themselves `pt_data_worker` is a worker that has not renamed yet (a spawned worker
//!   imports torch first, a second or more).
//! - forkserver (Python 3.14's default): the forkserver is an exec of `python -c 'from
//!   multiprocessing.forkserver import main; ...'`; its children are forks of it, so they carry
//!   its command line: a child of the forkserver is its owner's worker, never a forkserver.
//!
//! - launchers (torchrun, torch.distributed.run/launch): their children are ranks, except the
//!   programs a launcher runs for itself (ldconfig through ctypes.util.find_library, a shell):
//!   a rank runs the Python interpreter (unless `--no-python`) or has a pool of its own.
//!
//! PyTorch renames every process that imports torch `pt_main_thread` (trainer, ranks and
//! spawned workers alike), so that name tells nothing apart. The environment would
//! (/proc/PID/environ: torchrun sets LOCAL_RANK), but forked and spawned workers inherit it,
//! so it says "inside rank N", not "is a rank", and the tree already finds torchrun's ranks.
//!
//! The pin-memory "process" does not exist: `pt_data_pin` is a thread of the trainer or rank
//! (a [`ThreadRole`]). The kernel sums waits per process, so the pin-memory thread's waits for
//! the workers count as its process's.
//!
//! The walk up the tree is bounded ([`MAX_DEPTH`]) and follows a parent only when it appeared
//! before its child: a pid reused by a later process is not the parent, so the walk cannot loop.

use super::{ProcNode, ProcessTree};

/// What a process is to the training job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The `--pid` given to gpustall.
    Trainer,
    /// A training process: a child of torchrun / torch.distributed (elastic agent), or a
    /// spawned child of the top-level script (torch.multiprocessing.spawn, ddp_spawn).
    Rank,
    /// A PyTorch DataLoader worker process (`pt_data_worker`, `pt_multiprocess`), or a spawned
    /// or forkserver-started child of a rank.
    DataloaderWorker,
    /// multiprocessing's forkserver (Python 3.14's default start method): workers hang off it.
    Forkserver,
    Other,
}

impl Role {
    /// Its name in every output (JSON, text, labels): the same as its serde name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Trainer => "trainer",
            Role::Rank => "rank",
            Role::DataloaderWorker => "dataloader_worker",
            Role::Forkserver => "forkserver",
            Role::Other => "other",
        }
    }

    /// The process a trainer's or rank's waits are accounted for: one that consumes batches.
    pub fn is_main(self) -> bool {
        matches!(self, Role::Trainer | Role::Rank)
    }
}

/// What a thread is to its process, for the threads PyTorch names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ThreadRole {
    /// The DataLoader's pin-memory thread (`pt_data_pin`, pin_memory=True): it takes the
    /// workers' batches and copies them to pinned memory for the main thread.
    PinMemory,
}

/// The role of a thread named `name`, if PyTorch gives it one.
pub fn thread_role(name: &str) -> Option<ThreadRole> {
    name.starts_with("pt_data_pin").then_some(ThreadRole::PinMemory)
}

/// How far up the tree a role looks: a job is a handful of levels deep (launcher, rank,
/// forkserver, worker); past this a process is `Other`.
pub const MAX_DEPTH: usize = 16;

/// PyTorch names its DataLoader worker processes `pt_data_worker` (older releases) or
/// `pt_multiprocess` (newer); comm is cut at 15 bytes.
pub fn is_worker_name(comm: &str) -> bool {
    comm.starts_with("pt_data_worker") || comm.starts_with("pt_multiprocess")
}

fn cmdline_has(n: &ProcNode, any: &[&str]) -> bool {
    n.cmdline.as_deref().is_some_and(|c| any.iter().any(|s| c.contains(s)))
}

/// torchrun and the elastic agent, whose children are the ranks.
fn is_launcher_cmd(n: &ProcNode) -> bool {
    n.comm == "torchrun"
        || cmdline_has(n, &["torchrun", "torch.distributed.run", "torch.distributed.launch"])
}

fn is_forkserver_cmd(n: &ProcNode) -> bool {
    cmdline_has(n, &["multiprocessing.forkserver"])
}

fn is_spawn_cmd(n: &ProcNode) -> bool {
    cmdline_has(n, &["multiprocessing.spawn", "spawn_main"])
}

/// A Python interpreter's name (`python`, `python3`, `python3.11`, a path to one).
fn is_python(program: &str) -> bool {
    let base = program.rsplit('/').next().unwrap_or(program);
    base.strip_prefix("python").is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// multiprocessing's own helper (the resource tracker): no part of the job's roles.
fn is_mp_helper(n: &ProcNode) -> bool {
    cmdline_has(n, &["multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker"])
}

/// How a process started, relative to its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    /// A fork running its parent's program: no exec, its parent's command line.
    Fork,
    /// multiprocessing's spawn: an exec of `spawn_main`.
    Spawn,
    /// Any other program: an exec seen, or a command line of its own (a process already there
    /// when tracing began), or no parent known.
    Exec,
}

fn start_of(n: &ProcNode, parent: Option<&ProcNode>) -> Start {
    let own_program = n.exec_filename.is_some()
        || match (n.cmdline.as_deref(), parent) {
            (_, None) => true,
            (Some(c), Some(p)) => p.cmdline.as_deref().is_some_and(|pc| pc != c),
            (None, Some(_)) => false,
        };
    match (own_program, is_spawn_cmd(n)) {
        (false, _) => Start::Fork,
        (true, true) => Start::Spawn,
        (true, false) => Start::Exec,
    }
}

impl ProcessTree {
    /// `n`'s parent, when the tree knows the process that forked it: a process that appeared
    /// after `n` under the parent's pid reused it (the parent is gone), and following it could
    /// loop.
    pub fn parent_of(&self, n: &ProcNode) -> Option<&ProcNode> {
        self.nodes.get(&n.ppid).filter(|p| p.pid != n.pid && p.order < n.order)
    }

    /// `pid`, then its ancestors, nearest first, at most [`MAX_DEPTH`] of them.
    pub fn ancestors(&self, pid: u32) -> impl Iterator<Item = &ProcNode> {
        std::iter::successors(self.nodes.get(&pid), |n| self.parent_of(n)).take(MAX_DEPTH + 1)
    }

    fn children_of<'a>(&'a self, n: &'a ProcNode) -> impl Iterator<Item = &'a ProcNode> {
        self.nodes.values().filter(move |c| self.parent_of(c).is_some_and(|p| p.pid == n.pid))
    }

    /// The process itself is multiprocessing's forkserver (not one of its children, which
    /// carry its command line).
    fn is_forkserver(&self, n: &ProcNode) -> bool {
        is_forkserver_cmd(n) && start_of(n, self.parent_of(n)) != Start::Fork
    }

    /// The process itself is a launcher (not a fork of one: the ranks of a launcher that
    /// forks them carry its command line).
    fn is_launcher(&self, n: &ProcNode) -> bool {
        is_launcher_cmd(n) && start_of(n, self.parent_of(n)) != Start::Fork
    }

    /// A program the launcher ran for itself, not a rank: ldconfig (torchrun's
    /// ctypes.util.find_library), a shell, a probe. torchrun runs each rank as
    /// `sys.executable -u script` (or forks it), so a rank is a Python interpreter, unless
    /// `--no-python` says the ranks are programs of their own; a process with a pool of its own
    /// is a rank whatever it runs.
    fn is_launchers_helper(&self, n: &ProcNode, launcher: &ProcNode) -> bool {
        // The file it exec'd (a short-lived helper is gone before its command line is read,
        // and still shows its parent's), else its command line's first word.
        let program = n
            .exec_filename
            .as_deref()
            .or_else(|| n.cmdline.as_deref().and_then(|c| c.split_whitespace().next()));
        start_of(n, Some(launcher)) == Start::Exec
            && program.is_some_and(|p| !is_python(p))
            && !cmdline_has(launcher, &["--no-python", "--no_python"])
            && !self.starts_pool(n)
    }

    /// `n` started a pool of its own: children named as workers, spawned children, or a
    /// forkserver. Only a rank (or the trainer) does.
    fn starts_pool(&self, n: &ProcNode) -> bool {
        self.children_of(n).any(|c| {
            is_worker_name(&c.comm) || start_of(c, Some(n)) == Start::Spawn || self.is_forkserver(c)
        })
    }

    /// A sibling of `n` under `parent` that PyTorch named a worker.
    fn sibling_named_worker(&self, n: &ProcNode, parent: &ProcNode) -> bool {
        self.children_of(parent).any(|s| s.pid != n.pid && is_worker_name(&s.comm))
    }

    pub fn role(&self, pid: u32) -> Role {
        self.role_at(pid, 0)
    }

    fn role_at(&self, pid: u32, depth: usize) -> Role {
        let Some(n) = self.nodes.get(&pid) else {
            return Role::Other;
        };
        if n.is_target {
            return Role::Trainer;
        }
        if is_worker_name(&n.comm) {
            return Role::DataloaderWorker;
        }
        if depth >= MAX_DEPTH || is_mp_helper(n) {
            return Role::Other;
        }
        if self.is_forkserver(n) {
            return Role::Forkserver;
        }
        let Some(parent) = self.parent_of(n) else {
            return Role::Other;
        };
        if self.is_launcher(parent) {
            return if self.is_launchers_helper(n, parent) { Role::Other } else { Role::Rank };
        }
        // A forkserver's children are its owner's, as spawned children are their parent's.
        let (owner, by_forkserver) = if self.is_forkserver(parent) {
            (self.parent_of(parent), true)
        } else {
            (Some(parent), false)
        };
        if !by_forkserver && start_of(n, Some(parent)) != Start::Spawn {
            return Role::Other;
        }
        let Some(owner) = owner else {
            return Role::Other;
        };
        match self.role_at(owner.pid, depth + 1) {
            Role::Rank => Role::DataloaderWorker,
            Role::Trainer if self.starts_pool(n) => Role::Rank,
            Role::Trainer if self.sibling_named_worker(n, parent) => Role::DataloaderWorker,
            // torch.multiprocessing.spawn starts ranks; a forkserver starts pools' workers.
            Role::Trainer if by_forkserver => Role::DataloaderWorker,
            Role::Trainer => Role::Rank,
            _ => Role::Other,
        }
    }

    /// The trainer or rank whose DataLoader a worker serves: its parent, or the owner of the
    /// forkserver that started it.
    pub fn dataloader_of(&self, pid: u32) -> Option<u32> {
        if self.role(pid) != Role::DataloaderWorker {
            return None;
        }
        let parent = self.parent_of(self.nodes.get(&pid)?)?;
        if self.is_forkserver(parent) {
            return self.parent_of(parent).map(|o| o.pid);
        }
        Some(parent.pid)
    }

    /// Index of a DataLoader worker among its DataLoader's workers, by start order.
    pub fn worker_index(&self, pid: u32) -> Option<usize> {
        let loader = self.dataloader_of(pid)?;
        let mut siblings: Vec<&ProcNode> = self
            .nodes
            .values()
            .filter(|s| s.pid == pid || self.dataloader_of(s.pid) == Some(loader))
            .collect();
        siblings.sort_by_key(|s| s.order);
        siblings.iter().position(|s| s.pid == pid)
    }
}

impl ProcNode {
    /// Its threads that PyTorch named for a role, by thread id.
    pub fn thread_roles(&self) -> impl Iterator<Item = (u32, ThreadRole)> + '_ {
        self.thread_names.iter().filter_map(|(&tid, name)| Some((tid, thread_role(name)?)))
    }
}

#[cfg(test)]
mod tests;
