//! The traced process tree as the agent knows it: who forked whom, names (following renames
//! and execs), how each process ended, and its role in a training job.

use std::collections::BTreeMap;

use crate::model::untrusted;

mod roles;

pub use roles::{Role, ThreadRole};

/// How a process was ended by someone else.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Killer {
    pub sig: i32,
    pub sender_pid: u32,
    pub sender_comm: String,
    /// SI_KERNEL (0x80) when the kernel itself sent it (the OOM killer).
    pub si_code: i32,
    pub t_ns: u64,
}

#[derive(Clone, Debug)]
pub struct ProcNode {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// Names of threads that renamed themselves (`pt_data_pin`, `pt_thread_data_0`, ...).
    pub thread_names: BTreeMap<u32, String>,
    pub exec_filename: Option<String>,
    /// The command line, read from /proc at seed, fork and exec (best effort).
    pub cmdline: Option<String>,
    pub is_target: bool,
    /// When it was forked, or when tracing began for processes that were already there.
    pub started_ns: u64,
    /// Order of appearance, for worker indices.
    pub order: u64,
    pub exit_ns: Option<u64>,
    /// Raw wait status from the kernel (`(status << 8) | signal`).
    pub exit_code: Option<u32>,
    pub oom_killed: bool,
    pub killed_by: Option<Killer>,
}

impl ProcNode {
    pub fn alive(&self) -> bool {
        self.exit_ns.is_none()
    }
    /// The signal that ended it, from the wait status.
    pub fn exit_signal(&self) -> Option<i32> {
        self.exit_code.map(|c| (c & 0x7f) as i32).filter(|&s| s != 0)
    }
    /// The exit status of a normal exit.
    pub fn exit_status(&self) -> Option<i32> {
        self.exit_code.filter(|c| c & 0x7f == 0).map(|c| ((c >> 8) & 0xff) as i32)
    }
}

#[derive(Default)]
pub struct ProcessTree {
    nodes: BTreeMap<u32, ProcNode>,
    next_order: u64,
}

impl ProcessTree {
    fn insert(&mut self, pid: u32, ppid: u32, comm: &str, is_target: bool, started_ns: u64) {
        let order = self.next_order;
        self.next_order += 1;
        self.nodes.insert(
            pid,
            ProcNode {
                pid,
                ppid,
                comm: untrusted::name(comm),
                thread_names: BTreeMap::new(),
                exec_filename: None,
                cmdline: None,
                is_target,
                started_ns,
                order,
                exit_ns: None,
                exit_code: None,
                oom_killed: false,
                killed_by: None,
            },
        );
    }

    /// A process found in /proc when tracing started.
    pub fn seed(&mut self, pid: u32, ppid: u32, comm: &str, is_target: bool, t_ns: u64) {
        if !self.nodes.contains_key(&pid) {
            self.insert(pid, ppid, comm, is_target, t_ns);
        }
    }

    /// A child inherits its parent's name until it renames or execs.
    pub fn on_fork(&mut self, parent: u32, child: u32, parent_comm: &str, t_ns: u64) {
        self.nodes.remove(&child); // a reused pid is a new process
        self.insert(child, parent, parent_comm, false, t_ns);
    }

    pub fn on_exit(&mut self, pid: u32, exit_code: Option<u32>, t_ns: u64) {
        if let Some(n) = self.nodes.get_mut(&pid) {
            n.exit_ns = Some(t_ns);
            n.exit_code = exit_code;
        }
    }

    /// `tid` renamed itself; the process's name is its main thread's.
    pub fn on_rename(&mut self, pid: u32, tid: u32, comm: &str) {
        let owner = if self.nodes.contains_key(&tid) { tid } else { pid };
        if let Some(n) = self.nodes.get_mut(&owner) {
            if tid == owner {
                n.comm = untrusted::name(comm);
            } else {
                n.thread_names.insert(tid, untrusted::name(comm));
            }
        }
    }

    pub fn on_exec(&mut self, pid: u32, comm: &str, filename: &str) {
        if let Some(n) = self.nodes.get_mut(&pid) {
            n.comm = untrusted::name(comm);
            n.exec_filename = Some(untrusted::name(filename));
        }
    }

    pub fn on_oom_victim(&mut self, pid: u32) {
        if let Some(n) = self.nodes.get_mut(&pid) {
            n.oom_killed = true;
        }
    }

    pub fn on_signal(&mut self, target: u32, killer: Killer) {
        if let Some(n) = self.nodes.get_mut(&target) {
            // The first fatal signal is what ended it; later ones (e.g. a SIGKILL after the
            // OOM kill's own) add nothing.
            if n.killed_by.is_none() {
                n.killed_by = Some(killer);
            }
        }
    }

    /// Forgets a process (the daemon prunes those long gone, to stay bounded).
    pub fn remove(&mut self, pid: u32) {
        self.nodes.remove(&pid);
    }

    pub fn get(&self, pid: u32) -> Option<&ProcNode> {
        self.nodes.get(&pid)
    }

    pub fn contains(&self, pid: u32) -> bool {
        self.nodes.contains_key(&pid)
    }

    /// How many processes the tree holds, alive or exited.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &ProcNode> {
        self.nodes.values()
    }

    pub fn alive_pids(&self) -> Vec<u32> {
        self.nodes.values().filter(|n| n.alive()).map(|n| n.pid).collect()
    }

    /// Marks a process as gone without an exit event (it vanished from /proc while an event
    /// was lost); its exit code stays unknown.
    pub fn mark_vanished(&mut self, pid: u32, t_ns: u64) {
        if let Some(n) = self.nodes.get_mut(&pid) {
            if n.exit_ns.is_none() {
                n.exit_ns = Some(t_ns);
            }
        }
    }

    pub fn set_cmdline(&mut self, pid: u32, cmdline: String) {
        if let Some(n) = self.nodes.get_mut(&pid) {
            n.cmdline = Some(untrusted::one_line(&cmdline).into_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> ProcessTree {
        let mut t = ProcessTree::default();
        t.seed(100, 1, "python", true, 0);
        t.on_fork(100, 200, "python", 0);
        t.on_fork(100, 201, "python", 0);
        t.on_fork(200, 300, "python", 0);
        t
    }

    #[test]
    fn fork_links_parent_and_inherits_name() {
        let t = tree();
        assert_eq!(t.get(300).map(|n| (n.ppid, n.comm.as_str())), Some((200, "python")));
        assert_eq!(t.role(100), Role::Trainer);
        assert_eq!(t.alive_pids(), vec![100, 200, 201, 300]);
    }

    #[test]
    fn rename_of_other_thread_is_a_thread_name() {
        let mut t = tree();
        t.on_rename(100, 105, "pt_data_pin");
        assert_eq!(t.get(100).map(|n| n.comm.as_str()), Some("python"));
        assert_eq!(
            t.get(100).and_then(|n| n.thread_names.get(&105)).map(String::as_str),
            Some("pt_data_pin")
        );
    }

    #[test]
    fn exit_status_and_signal_from_wait_status() {
        let mut t = tree();
        t.on_exit(200, Some(9), 50);
        t.on_exit(201, Some(3 << 8), 51);
        let killed = t.get(200).expect("200");
        assert_eq!((killed.exit_signal(), killed.exit_status()), (Some(9), None));
        let exited = t.get(201).expect("201");
        assert_eq!((exited.exit_signal(), exited.exit_status()), (None, Some(3)));
        assert_eq!(t.alive_pids(), vec![100, 300]);
    }

    #[test]
    fn first_fatal_signal_wins_and_pid_reuse_is_a_new_process() {
        let mut t = tree();
        let k = |sig, sender| Killer {
            sig,
            sender_pid: sender,
            sender_comm: "x".into(),
            si_code: 0x80,
            t_ns: 1,
        };
        t.on_signal(300, k(9, 200));
        t.on_signal(300, k(15, 1));
        assert_eq!(t.get(300).and_then(|n| n.killed_by.as_ref()).map(|k| k.sig), Some(9));
        t.on_exit(300, Some(9), 60);
        t.on_fork(201, 300, "python", 0);
        let n = t.get(300).expect("300");
        assert!(n.alive() && n.killed_by.is_none() && n.ppid == 201);
    }
}
