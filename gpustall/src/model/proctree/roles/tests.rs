//! The role rules on hand-built trees, one start method at a time: the events and command
//! lines the agent sees for each (fork, exec, rename), in the order it sees them.

use super::super::ProcessTree;
use super::*;

const TRAIN: &str = "python3 train.py";
const SPAWN: &str =
    "python3 -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7) --multiprocessing-fork";
const FORKSERVER: &str =
    "python3 -c from multiprocessing.forkserver import main; main(7, 8, ['__main__'], **{'sys_path': []})";

/// A tree whose target runs `cmdline`, renamed as torch does on import.
fn job(cmdline: &str) -> ProcessTree {
    let mut t = ProcessTree::default();
    t.seed(100, 1, "python3", true, 0);
    t.set_cmdline(100, cmdline.into());
    t.on_rename(100, 100, "pt_main_thread");
    t
}

/// A fork: the child runs its parent's program, and /proc shows its parent's command line.
fn fork(t: &mut ProcessTree, parent: u32, child: u32) {
    let (comm, cmdline) =
        t.get(parent).map(|p| (p.comm.clone(), p.cmdline.clone())).expect("parent");
    t.on_fork(parent, child, &comm, 0);
    if let Some(c) = cmdline {
        t.set_cmdline(child, c);
    }
}

/// A fork and exec of `cmdline` (its first word the file exec'd).
fn exec(t: &mut ProcessTree, parent: u32, child: u32, cmdline: &str) {
    fork(t, parent, child);
    let file = cmdline.split(' ').next().expect("a program");
    t.on_exec(child, file.rsplit('/').next().expect("a name"), file);
    t.set_cmdline(child, cmdline.into());
}

/// multiprocessing's spawn: a fork and exec of spawn_main; the child imports torch.
fn spawn(t: &mut ProcessTree, parent: u32, child: u32) {
    exec(t, parent, child, SPAWN);
    t.on_rename(child, child, "pt_main_thread");
}

fn name_worker(t: &mut ProcessTree, pid: u32) {
    t.on_rename(pid, pid, "pt_data_worker");
}

fn roles(t: &ProcessTree, pids: &[u32]) -> Vec<Role> {
    pids.iter().map(|&p| t.role(p)).collect()
}

#[test]
fn fork_named_children_are_workers_and_a_plain_fork_is_nothing() {
    let mut t = job(TRAIN);
    for w in [200, 201, 202] {
        fork(&mut t, 100, w);
    }
    name_worker(&mut t, 201);
    name_worker(&mut t, 200);
    assert_eq!(t.role(100), Role::Trainer);
    assert_eq!(
        roles(&t, &[200, 201, 202]),
        [Role::DataloaderWorker, Role::DataloaderWorker, Role::Other]
    );
    // Index by start order, not by rename order.
    assert_eq!(
        (t.worker_index(200), t.worker_index(201), t.worker_index(100)),
        (Some(0), Some(1), None)
    );
    assert_eq!(t.dataloader_of(201), Some(100));
}

#[test]
fn torchrun_ranks_exec_or_fork_and_their_forked_workers() {
    // torchrun runs each rank as `python train.py` (fork + exec).
    let mut t = job("/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 2 train.py");
    exec(&mut t, 100, 200, TRAIN);
    exec(&mut t, 100, 201, TRAIN);
    exec(&mut t, 100, 202, "python3 -c from multiprocessing.resource_tracker import main;main(5)");
    // torchrun's own helpers: ctypes.util.find_library runs ldconfig, a shell runs a probe.
    exec(&mut t, 100, 203, "/sbin/ldconfig -p");
    exec(&mut t, 100, 204, "/bin/sh -c uname -p 2> /dev/null");
    assert_eq!(roles(&t, &[203, 204]), [Role::Other, Role::Other]);
    // One gone before its command line was read still shows torchrun's (its fork's).
    fork(&mut t, 100, 205);
    t.on_exec(205, "ldconfig", "/sbin/ldconfig");
    assert_eq!(t.role(205), Role::Other);
    for (rank, w) in [(200, 300), (200, 301), (201, 310)] {
        fork(&mut t, rank, w);
        name_worker(&mut t, w);
    }
    assert_eq!(roles(&t, &[200, 201, 202]), [Role::Rank, Role::Rank, Role::Other]);
    assert_eq!(
        [300, 301, 310].map(|w| (t.role(w), t.dataloader_of(w), t.worker_index(w))),
        [
            (Role::DataloaderWorker, Some(200), Some(0)),
            (Role::DataloaderWorker, Some(200), Some(1)),
            (Role::DataloaderWorker, Some(201), Some(0)),
        ]
    );
    // A launcher that forks its ranks: they carry its command line, and are ranks; their own
    // forks are not (a fork of a rank is not a launcher's child).
    let mut t = job("python3 /tmp/torchrun ranks");
    fork(&mut t, 100, 200);
    fork(&mut t, 200, 300);
    assert_eq!(roles(&t, &[200, 300]), [Role::Rank, Role::Other]);
    name_worker(&mut t, 300);
    assert_eq!((t.role(300), t.dataloader_of(300)), (Role::DataloaderWorker, Some(200)));
    // `torchrun --no-python ./train`: the ranks are programs of their own.
    let mut t = job("/usr/bin/python3 /usr/local/bin/torchrun --no-python ./train");
    exec(&mut t, 100, 200, "./train --epochs 3");
    assert_eq!(t.role(200), Role::Rank);
    // A rank that is no Python program but has a DataLoader-like pool is a rank all the same.
    let mut t = job("/usr/bin/python3 /usr/local/bin/torchrun train.py");
    exec(&mut t, 100, 200, "/opt/conda/bin/train-launcher train.py");
    fork(&mut t, 200, 300);
    name_worker(&mut t, 300);
    assert_eq!(t.role(200), Role::Rank);
}

#[test]
fn python_interpreters_are_told_from_other_programs() {
    for p in ["python", "python3", "python3.11", "/usr/bin/python3.12", "/venv/bin/python"] {
        assert!(is_python(p), "{p}");
    }
    for p in ["/sbin/ldconfig", "pythonista", "sh", "/usr/bin/python3-config", "ipython"] {
        assert!(!is_python(p), "{p}");
    }
}

#[test]
fn spawned_children_of_the_script_are_ranks_and_their_workers_hang_off_them() {
    // torch.multiprocessing.spawn(main, nprocs=2): the script spawns the ranks.
    let mut t = job(TRAIN);
    spawn(&mut t, 100, 200);
    spawn(&mut t, 100, 201);
    assert_eq!(roles(&t, &[200, 201]), [Role::Rank, Role::Rank]);
    // Rank 200's DataLoader forks its workers (they carry the rank's spawn_main command line
    // until they rename, and are no spawned children of their own).
    fork(&mut t, 200, 300);
    assert_eq!(t.role(300), Role::Other, "a fork says nothing until it names itself");
    name_worker(&mut t, 300);
    fork(&mut t, 200, 301);
    name_worker(&mut t, 301);
    // Rank 201's DataLoader has multiprocessing_context="spawn": workers before they rename.
    spawn(&mut t, 201, 310);
    spawn(&mut t, 201, 311);
    assert_eq!(roles(&t, &[200, 201]), [Role::Rank, Role::Rank]);
    assert_eq!(
        [300, 301, 310, 311].map(|w| (t.role(w), t.dataloader_of(w), t.worker_index(w))),
        [
            (Role::DataloaderWorker, Some(200), Some(0)),
            (Role::DataloaderWorker, Some(200), Some(1)),
            (Role::DataloaderWorker, Some(201), Some(0)),
            (Role::DataloaderWorker, Some(201), Some(1)),
        ]
    );
}

#[test]
fn spawn_context_workers_of_a_single_trainer_are_workers_once_one_names_itself() {
    let mut t = job(TRAIN);
    spawn(&mut t, 100, 200);
    spawn(&mut t, 100, 201);
    // Unnamed, they look like torch.multiprocessing.spawn's ranks.
    assert_eq!(roles(&t, &[200, 201]), [Role::Rank, Role::Rank]);
    name_worker(&mut t, 200);
    assert_eq!(roles(&t, &[200, 201]), [Role::DataloaderWorker, Role::DataloaderWorker]);
    assert_eq!(t.worker_index(201), Some(1));
}

#[test]
fn forkserver_children_are_their_owners_workers_not_forkservers() {
    // The trainer's DataLoader with the forkserver start method.
    let mut t = job(TRAIN);
    exec(&mut t, 100, 150, FORKSERVER);
    fork(&mut t, 150, 200);
    fork(&mut t, 150, 201);
    assert_eq!(t.role(150), Role::Forkserver);
    // Unnamed (before the rename, or a PyTorch that never renames): still workers.
    assert_eq!(
        [200, 201].map(|w| (t.role(w), t.dataloader_of(w), t.worker_index(w))),
        [
            (Role::DataloaderWorker, Some(100), Some(0)),
            (Role::DataloaderWorker, Some(100), Some(1))
        ]
    );
    name_worker(&mut t, 201);
    assert_eq!((t.role(201), t.dataloader_of(201)), (Role::DataloaderWorker, Some(100)));

    // Ranks of torchrun, each with its own forkserver.
    let mut t = job("torchrun train.py");
    exec(&mut t, 100, 200, TRAIN);
    exec(&mut t, 200, 250, FORKSERVER);
    fork(&mut t, 250, 300);
    assert_eq!(roles(&t, &[200, 250, 300]), [Role::Rank, Role::Forkserver, Role::DataloaderWorker]);
    assert_eq!(t.dataloader_of(300), Some(200));

    // mp.start_processes(start_method="forkserver"): a forkserver child with workers of its
    // own is a rank.
    let mut t = job(TRAIN);
    exec(&mut t, 100, 150, FORKSERVER);
    fork(&mut t, 150, 200);
    fork(&mut t, 200, 300);
    name_worker(&mut t, 300);
    assert_eq!(roles(&t, &[200, 300]), [Role::Rank, Role::DataloaderWorker]);
    assert_eq!(t.dataloader_of(300), Some(200));
}

#[test]
fn the_pin_memory_thread_is_a_thread_role_of_its_process() {
    let mut t = job(TRAIN);
    t.on_rename(100, 105, "pt_data_pin");
    t.on_rename(100, 106, "pt_autograd_0");
    let n = t.get(100).expect("trainer");
    assert_eq!(n.thread_roles().collect::<Vec<_>>(), [(105, ThreadRole::PinMemory)]);
    assert_eq!(t.role(100), Role::Trainer);
}

#[test]
fn the_walk_up_the_tree_is_bounded_and_survives_pid_reuse() {
    // 10 forks 20, 20 forks 30; 20 exits and its pid is reused by a child of 30: 30's parent
    // link now names a younger process whose own parent is 30, a loop in the raw ppids.
    let mut t = job(TRAIN);
    spawn(&mut t, 100, 20);
    spawn(&mut t, 20, 30);
    t.on_exit(20, Some(0), 5);
    spawn(&mut t, 30, 20);
    assert_eq!(t.get(30).map(|n| n.ppid), Some(20));
    assert_eq!(t.ancestors(30).map(|n| n.pid).collect::<Vec<_>>(), [30]);
    assert_eq!(t.ancestors(20).map(|n| n.pid).collect::<Vec<_>>(), [20, 30]);
    assert_eq!(t.role(30), Role::Other, "its parent is gone");
    assert_eq!(t.role(20), Role::Other);

    // A chain far deeper than any job: the walk stops at MAX_DEPTH.
    let mut t = job(TRAIN);
    for pid in 1000..1000 + 10 * MAX_DEPTH as u32 {
        spawn(&mut t, if pid == 1000 { 100 } else { pid - 1 }, pid);
    }
    let last = 1000 + 10 * MAX_DEPTH as u32 - 1;
    assert_eq!(t.ancestors(last).count(), MAX_DEPTH + 1);
    assert_eq!(t.role(last), Role::Other);
    assert_eq!((t.role(1000), t.role(1001)), (Role::Rank, Role::DataloaderWorker));
}

#[test]
fn a_roles_name_is_its_serde_name() {
    for r in [Role::Trainer, Role::Rank, Role::DataloaderWorker, Role::Forkserver, Role::Other] {
        assert_eq!(serde_json::to_value(r).unwrap(), r.as_str(), "{r:?}");
    }
    assert!(Role::Trainer.is_main() && Role::Rank.is_main() && !Role::DataloaderWorker.is_main());
}
