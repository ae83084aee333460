//! Python stacks of the job's processes, sampled from outside (`sources::pyspy`, py-spy as a
//! library): where the workers' CPU goes, the line a stuck process blocks on, where the trainer
//! waits for data and how much of its CPU goes to receiving batches.
//!
//! Samples are counted, not timed: a share of a process's on-CPU samples, times the CPU time
//! the kernel counted for it, is the time that code took. The sampler takes a process on CPU
//! at times unrelated to what it runs, so the shares are unbiased whatever its rate.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// Distinct stacks kept per process; past it, samples are counted in `other_*` only.
pub const STACKS_PER_PROC: usize = 512;
/// Processes whose stacks are kept; a job with more (thousands of short-lived workers) keeps
/// the first ones and counts the rest in `PyStacks::dropped_procs`.
pub const PROCS_KEPT: usize = 1024;

/// One frame, as the interpreter had it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PyFrame {
    pub name: String,
    pub file: String,
    pub line: u32,
}

/// One distinct stack of one thread and how often it was seen on and off CPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct StackCount {
    /// The Python thread's name (`MainThread`, `Thread-1 (_pin_memory_loop)`).
    pub thread: String,
    /// Innermost first.
    pub frames: Vec<PyFrame>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub on_cpu: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub off_cpu: u64,
    /// The time its on-CPU samples stand for: each sample, the time since the process's
    /// previous one; the main thread's, its time on CPU or in the run queue since then (the
    /// kernel's schedstat), where the kernel keeps it (absent in recordings before it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub on_cpu_ns: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The recorded line (`Sample::PyStacks`): what one process's samples found since its last line.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct PyStacksRec {
    pub t_ns: u64,
    pub pid: u32,
    /// The interpreter's version, on the process's first line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// Why its stacks cannot be read (a version py-spy does not know, no permission), said once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
    /// It runs no Python interpreter (a launcher, a shell, a C++ trainer): nothing to read.
    #[serde(default, skip_serializing_if = "is_false")]
    pub not_python: bool,
    /// Times the process was sampled.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rounds: u64,
    /// Samples that could not be read (the interpreter changed what was being read).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<StackCount>,
    /// Its main thread's schedstat could not be read (a kernel without CONFIG_SCHED_INFO):
    /// its samples stand for the wall time since the one before, blocks included.
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_schedstat: bool,
}

/// Everything sampled of one process.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcStacks {
    pub python: Option<String>,
    pub unreadable: Option<String>,
    pub not_python: bool,
    pub rounds: u64,
    pub failed: u64,
    /// (thread, frames) -> (on CPU, off CPU).
    pub stacks: HashMap<(String, Vec<PyFrame>), (u64, u64)>,
    /// Samples past [`STACKS_PER_PROC`].
    pub other_on_cpu: u64,
    pub other_off_cpu: u64,
    /// Its main thread runnable inside the DataLoader's `__next__`: the time those samples
    /// stand for, their number, and the main thread's runnable samples in all.
    pub receiving_ns: u64,
    pub receiving_samples: u64,
    pub main_on_cpu: u64,
    /// Its main thread's samples stood for wall time, not its time runnable.
    pub no_schedstat: bool,
    /// The stacks of its last line: what it was doing most recently.
    pub latest: Vec<StackCount>,
    pub latest_ns: u64,
}

impl ProcStacks {
    fn apply(&mut self, r: &PyStacksRec) {
        if r.python.is_some() {
            self.python.clone_from(&r.python);
        }
        if r.unreadable.is_some() {
            self.unreadable.clone_from(&r.unreadable);
        }
        self.not_python |= r.not_python;
        self.no_schedstat |= r.no_schedstat;
        self.rounds += r.rounds;
        self.failed += r.failed;
        for s in &r.stacks {
            if s.thread == "MainThread" {
                self.main_on_cpu += s.on_cpu;
                if s.frames.iter().any(is_dataloader_next) {
                    self.receiving_ns += s.on_cpu_ns;
                    self.receiving_samples += s.on_cpu;
                }
            }
            let key = (s.thread.clone(), s.frames.clone());
            if self.stacks.len() >= STACKS_PER_PROC && !self.stacks.contains_key(&key) {
                self.other_on_cpu += s.on_cpu;
                self.other_off_cpu += s.off_cpu;
                continue;
            }
            let c = self.stacks.entry(key).or_default();
            c.0 += s.on_cpu;
            c.1 += s.off_cpu;
        }
        if !r.stacks.is_empty() {
            self.latest.clone_from(&r.stacks);
            self.latest_ns = r.t_ns;
        }
    }

    /// Each thread's most seen stack of the last line.
    fn last_seen(&self) -> Vec<ThreadSeen> {
        let mut by_thread: BTreeMap<&str, &StackCount> = BTreeMap::new();
        for s in &self.latest {
            let seen = |c: &StackCount| c.on_cpu + c.off_cpu;
            let e = by_thread.entry(&s.thread).or_insert(s);
            if seen(s) > seen(e) {
                *e = s;
            }
        }
        by_thread
            .into_values()
            .map(|s| ThreadSeen {
                thread: s.thread.clone(),
                on_cpu: s.on_cpu > s.off_cpu,
                frames: dump(&s.frames),
            })
            .collect()
    }

    /// On-CPU samples of every thread.
    pub fn on_cpu(&self) -> u64 {
        self.stacks.values().map(|c| c.0).sum::<u64>() + self.other_on_cpu
    }

    /// The stack its main thread was last seen blocked in (the most seen of its last line),
    /// innermost first.
    pub fn blocked_in(&self) -> Option<&[PyFrame]> {
        self.latest
            .iter()
            .filter(|s| s.off_cpu > 0 && s.thread == "MainThread" && !s.frames.is_empty())
            .max_by_key(|s| s.off_cpu)
            .map(|s| s.frames.as_slice())
    }

    /// The most seen off-CPU stack of the main thread that passes through the DataLoader's
    /// `__next__`: where the trainer waits for its batches.
    pub fn data_wait_stack(&self) -> Option<&[PyFrame]> {
        self.stacks
            .iter()
            .filter(|((thread, frames), c)| {
                c.1 > 0 && thread == "MainThread" && frames.iter().any(is_dataloader_next)
            })
            .max_by(|a, b| (a.1 .1, &a.0 .1).cmp(&(b.1 .1, &b.0 .1)))
            .map(|((_, frames), _)| frames.as_slice())
    }

    /// Its main thread's runnable samples inside the DataLoader's `__next__` (the trainer
    /// receiving batches: unpickling, mapping the workers' shared memory), and all of them.
    pub fn receiving(&self) -> (u64, u64) {
        (self.receiving_samples, self.main_on_cpu)
    }
}

/// Fewer on-CPU samples than this estimate no time: a share of a handful is noise.
pub const MIN_SAMPLES: u64 = 10;

/// Fewer samples inside the DataLoader's `__next__` than this estimate no time receiving: one
/// sample stands for a whole gap between two (on mmengine's OOM job at the auto rate, 1 of 10-15
/// runnable samples made 0.15-0.19 s, and, weighted by wall time, up to 3.3 s).
pub const MIN_SAMPLES_INSIDE: u64 = 5;

/// The trainer's time receiving batches: its main thread runnable (on CPU, or waiting for one)
/// inside the DataLoader's `__next__` (unpickling, fetching the workers' shared-memory file
/// descriptors, rebuilding tensors), which its blocked wait does not count but its loop's
/// `data_time` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Receiving {
    /// The time those samples stand for (each, the main thread's time on CPU or in the run
    /// queue since the sample before it).
    pub ns: u64,
    pub samples_inside: u64,
    pub samples_on_cpu: u64,
    /// Weighted by wall time, the kernel keeping no schedstat: it leans high (a sample after a
    /// block stands for the block too).
    #[serde(skip_serializing_if = "is_false")]
    pub wall_time_weighted: bool,
}

impl Receiving {
    pub fn estimate(p: &ProcStacks) -> Option<Self> {
        let (inside, all) = p.receiving();
        (all >= MIN_SAMPLES && inside >= MIN_SAMPLES_INSIDE && p.receiving_ns > 0).then_some(Self {
            ns: p.receiving_ns,
            samples_inside: inside,
            samples_on_cpu: all,
            wall_time_weighted: p.no_schedstat,
        })
    }
}

/// The DataLoader iterator's `__next__` (torch/utils/data/dataloader.py).
pub fn is_dataloader_next(f: &PyFrame) -> bool {
    (f.name == "__next__" || f.name.ends_with(".__next__"))
        && f.file.ends_with("torch/utils/data/dataloader.py")
}

/// A frame of the interpreter's own library or of an installed package, not of the job's code.
pub fn is_library(f: &PyFrame) -> bool {
    let file = f.file.as_str();
    file.starts_with('<')
        || file.contains("/site-packages/")
        || file.contains("/dist-packages/")
        || lib_python_dir(file).is_some()
}

/// Where `/lib/pythonX.Y/` (or `/lib64/...`) ends in a path, if it has one: the interpreter's
/// own library.
fn lib_python_dir(file: &str) -> Option<usize> {
    for marker in ["/lib/python", "/lib64/python"] {
        let mut from = 0;
        while let Some(i) = file[from..].find(marker) {
            let version = from + i + marker.len();
            let rest = &file[version..];
            if rest.starts_with(|c: char| c.is_ascii_digit()) {
                if let Some(end) = rest.find('/') {
                    return Some(version + end + 1);
                }
            }
            from = version;
        }
    }
    None
}

/// The job's own line in a stack (innermost first): its innermost frame that is not a library's.
pub fn user_frame(frames: &[PyFrame]) -> Option<&PyFrame> {
    frames.iter().find(|f| !is_library(f))
}

/// A file as a user reads it: a package's path from the package (`torch/utils/data/...`),
/// the job's own file by its name.
pub fn short_file(file: &str) -> &str {
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = file.rfind(marker) {
            return &file[i + marker.len()..];
        }
    }
    if let Some(i) = lib_python_dir(file) {
        return &file[i..];
    }
    file.rsplit('/').next().unwrap_or(file)
}

/// `file:line func`.
pub fn show(f: &PyFrame) -> String {
    format!("{}:{} `{}`", short_file(&f.file), f.line, f.name)
}

/// A share of the on-CPU samples of some processes, at one site.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HotSpot {
    pub site: String,
    pub samples: u64,
    pub share: f64,
}

/// Where the on-CPU samples of `procs` went, by site (the job's function and the innermost
/// function below it, each at its most sampled line), most first, with the number of samples
/// behind the shares. Lines are not sites: a hot loop spreads over several.
pub fn hot_spots(procs: &[&ProcStacks], top: usize) -> (Vec<HotSpot>, u64) {
    type Func = (String, String);
    /// Samples at a site, and by (the job's line, the innermost line).
    type Lines = (u64, BTreeMap<(u32, u32), u64>);
    let func = |f: &PyFrame| (f.file.clone(), f.name.clone());
    // (job's function, innermost function) -> its samples.
    let mut by_site: BTreeMap<(Func, Option<Func>), Lines> = BTreeMap::new();
    let mut total = 0;
    for p in procs {
        total += p.on_cpu();
        for ((_, frames), c) in &p.stacks {
            let Some(leaf) = frames.first().filter(|_| c.0 > 0) else { continue };
            let user = user_frame(frames).unwrap_or(leaf);
            let below = (user != leaf).then(|| func(leaf));
            let site = by_site.entry((func(user), below)).or_default();
            site.0 += c.0;
            *site.1.entry((user.line, leaf.line)).or_default() += c.0;
        }
    }
    let mut spots: Vec<HotSpot> = by_site
        .into_iter()
        .map(|(((file, name), below), (samples, lines))| {
            let (&(line, leaf_line), _) = lines
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
                .expect("counted");
            let user = PyFrame { name, file, line };
            let site = match below {
                Some((file, name)) => {
                    format!("{} -> {}", show(&user), show(&PyFrame { name, file, line: leaf_line }))
                }
                None => show(&user),
            };
            HotSpot {
                site,
                samples,
                share: if total == 0 { 0.0 } else { samples as f64 / total as f64 },
            }
        })
        .collect();
    spots.sort_by(|a, b| b.samples.cmp(&a.samples).then_with(|| a.site.cmp(&b.site)));
    spots.truncate(top);
    (spots, total)
}

/// A stack the way py-spy dump prints it, innermost first, one frame a line.
pub fn dump(frames: &[PyFrame]) -> Vec<String> {
    frames.iter().map(|f| format!("{} ({}:{})", f.name, short_file(&f.file), f.line)).collect()
}

/// Folded lines (outermost first, `;` between frames) with their on-CPU counts, for a flame
/// graph. A `;` inside a name would split a frame: it is shown as `:`.
pub fn folded(p: &ProcStacks) -> Vec<(String, u64)> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for ((_, frames), c) in &p.stacks {
        if c.0 == 0 || frames.is_empty() {
            continue;
        }
        let line: Vec<String> = frames
            .iter()
            .rev()
            .map(|f| format!("{} ({}:{})", f.name, short_file(&f.file), f.line).replace(';', ":"))
            .collect();
        *lines.entry(line.join(";")).or_default() += c.0;
    }
    lines.into_iter().collect()
}

/// Folded lines kept in a process's summary, the most sampled first.
const FOLDED_IN_SUMMARY: usize = 64;

/// One process's stacks in the summary (`processes[].py_stacks`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StacksSummary {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
    #[serde(skip_serializing_if = "is_false")]
    pub not_python: bool,
    /// Times it was sampled, times a sample could not be read, and its threads' samples on CPU.
    pub samples: u64,
    pub failed_samples: u64,
    pub on_cpu_samples: u64,
    /// Where its on-CPU samples went: the job's line and the innermost frame.
    pub top: Vec<HotSpot>,
    /// The stack its main thread was last seen blocked in, innermost first (py-spy dump's
    /// order).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocked_in: Vec<String>,
    /// Its threads' stacks at its last line (py-spy dump's order), and when that was.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub last_seen: Vec<ThreadSeen>,
    pub last_seen_ns: u64,
    /// On-CPU stacks as folded lines (outermost first, `;` between frames) with their samples:
    /// a flame graph's input (inferno, flamegraph.pl).
    pub folded: Vec<(String, u64)>,
}

/// A thread's stack as last seen.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ThreadSeen {
    pub thread: String,
    /// Seen on CPU (or runnable) in most of its last samples.
    pub on_cpu: bool,
    pub frames: Vec<String>,
}

impl ProcStacks {
    pub fn summary(&self) -> StacksSummary {
        let mut folded = folded(self);
        folded.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        folded.truncate(FOLDED_IN_SUMMARY);
        StacksSummary {
            python: self.python.clone(),
            unreadable: self.unreadable.clone(),
            not_python: self.not_python,
            samples: self.rounds,
            failed_samples: self.failed,
            on_cpu_samples: self.on_cpu(),
            top: hot_spots(&[self], 5).0,
            blocked_in: self.blocked_in().map(dump).unwrap_or_default(),
            last_seen: self.last_seen(),
            last_seen_ns: self.latest_ns,
            folded,
        }
    }
}

/// The model's stacks, per process.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PyStacks {
    pub procs: BTreeMap<u32, ProcStacks>,
    /// Processes past [`PROCS_KEPT`] whose lines were not kept.
    pub dropped_procs: u64,
}

impl PyStacks {
    pub fn apply(&mut self, r: &PyStacksRec) {
        if self.procs.len() >= PROCS_KEPT && !self.procs.contains_key(&r.pid) {
            self.dropped_procs += 1;
            return;
        }
        self.procs.entry(r.pid).or_default().apply(r);
    }

    pub fn get(&self, pid: u32) -> Option<&ProcStacks> {
        self.procs.get(&pid).filter(|p| p.rounds > 0)
    }

    /// Processes whose stacks could not be read, with why.
    pub fn unreadable(&self) -> impl Iterator<Item = (u32, &str)> {
        self.procs.iter().filter_map(|(pid, p)| p.unreadable.as_deref().map(|u| (*pid, u)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn frame(name: &str, file: &str, line: u32) -> PyFrame {
        PyFrame { name: name.into(), file: file.into(), line }
    }

    #[test]
    fn the_jobs_line_is_the_innermost_frame_outside_libraries() {
        let frames = vec![
            frame(
                "_wrapreduction",
                "/venv/lib/python3.11/site-packages/numpy/core/fromnumeric.py",
                86,
            ),
            frame("acquire", "/usr/lib/python3.11/threading.py", 12),
            frame("decode", "/job/dataset.py", 88),
            frame("<module>", "/job/train.py", 3),
        ];
        assert_eq!(user_frame(&frames).map(|f| f.line), Some(88));
        let p = ProcStacks {
            stacks: [(("MainThread".to_string(), frames), (3, 0))].into(),
            ..Default::default()
        };
        assert_eq!(
            hot_spots(&[&p], 1).0[0].site,
            "dataset.py:88 `decode` -> numpy/core/fromnumeric.py:86 `_wrapreduction`"
        );
        assert_eq!(short_file("/usr/lib/python3.11/threading.py"), "threading.py");
        assert_eq!(
            short_file("/usr/local/lib/python3.11/multiprocessing/queues.py"),
            "multiprocessing/queues.py"
        );
        assert!(is_library(&frame("f", "<frozen importlib._bootstrap>", 1)));
        assert!(!is_library(&frame("f", "/home/me/lib/python_tools/x.py", 1)));
    }

    fn rec(pid: u32, stacks: Vec<StackCount>) -> PyStacksRec {
        PyStacksRec { t_ns: 1, pid, rounds: stacks.len() as u64, stacks, ..Default::default() }
    }

    fn count(frames: Vec<PyFrame>, on: u64, off: u64) -> StackCount {
        StackCount {
            thread: "MainThread".into(),
            frames,
            on_cpu: on,
            off_cpu: off,
            on_cpu_ns: on * 100,
        }
    }

    #[test]
    fn hot_spots_are_shares_of_the_on_cpu_samples_of_all_the_processes_given() {
        let mut s = PyStacks::default();
        let hot = vec![frame("decode", "/job/ds.py", 9), frame("run", "/job/ds.py", 2)];
        let hot_too = vec![frame("decode", "/job/ds.py", 10), frame("run", "/job/ds.py", 2)];
        let cheap = vec![frame("load", "/job/ds.py", 20), frame("run", "/job/ds.py", 2)];
        s.apply(&rec(
            1,
            vec![count(hot.clone(), 4, 0), count(hot_too, 2, 0), count(cheap.clone(), 1, 3)],
        ));
        s.apply(&rec(2, vec![count(hot, 2, 0), count(cheap, 1, 0)]));
        let procs: Vec<&ProcStacks> = s.procs.values().collect();
        let (spots, total) = hot_spots(&procs, 5);
        assert_eq!(total, 10);
        assert_eq!(spots[0].site, "ds.py:9 `decode`");
        assert!((spots[0].share - 0.8).abs() < 1e-9, "{spots:?}");
        assert_eq!(spots[1].samples, 2);
    }

    #[test]
    fn a_stuck_process_is_shown_where_its_last_line_saw_it_blocked() {
        let mut s = PyStacks::default();
        let working = vec![frame("fetch", "/job/ds.py", 5)];
        let stuck = vec![frame("__getitem__", "/job/ds.py", 42), frame("fetch", "/job/ds.py", 5)];
        s.apply(&rec(7, vec![count(working, 4, 0)]));
        s.apply(&rec(7, vec![count(stuck.clone(), 0, 9)]));
        assert_eq!(s.get(7).and_then(|p| p.blocked_in()), Some(stuck.as_slice()));
        assert_eq!(dump(&stuck)[0], "__getitem__ (ds.py:42)");
    }

    #[test]
    fn receiving_counts_the_trainers_on_cpu_samples_inside_the_dataloaders_next() {
        let dl = "/v/lib/python3.11/site-packages/torch/utils/data/dataloader.py";
        let next = vec![
            frame(
                "rebuild_storage_fd",
                "/v/lib/python3.11/site-packages/torch/multiprocessing/reductions.py",
                3,
            ),
            frame("__next__", dl, 630),
            frame("main", "/job/train.py", 30),
        ];
        let wait = vec![
            frame("_poll", "/usr/lib/python3.11/multiprocessing/connection.py", 1),
            frame("__next__", dl, 630),
            frame("main", "/job/train.py", 30),
        ];
        let step = vec![frame("main", "/job/train.py", 33)];
        let mut s = PyStacks::default();
        s.apply(&rec(1, vec![count(next, 3, 0), count(wait.clone(), 0, 20), count(step, 7, 0)]));
        let p = s.get(1).expect("sampled");
        assert_eq!(p.receiving(), (3, 10));
        assert_eq!(p.data_wait_stack(), Some(wait.as_slice()));
        assert_eq!(user_frame(&wait).map(show).as_deref(), Some("train.py:30 `main`"));
    }

    #[test]
    fn stacks_and_processes_stay_bounded() {
        let mut s = PyStacks::default();
        for i in 0..(STACKS_PER_PROC as u32 + 10) {
            s.apply(&rec(1, vec![count(vec![frame("f", "/a.py", i)], 1, 0)]));
        }
        let p = s.get(1).expect("kept");
        assert_eq!(
            (p.stacks.len(), p.other_on_cpu, p.on_cpu()),
            (STACKS_PER_PROC, 10, STACKS_PER_PROC as u64 + 10)
        );
        for pid in 0..(PROCS_KEPT as u32 + 3) {
            s.apply(&rec(100 + pid, vec![]));
        }
        assert_eq!(s.dropped_procs, 4);
    }

    #[test]
    fn folded_lines_go_outermost_first_and_keep_semicolons_out_of_frames() {
        let mut s = PyStacks::default();
        s.apply(&rec(
            1,
            vec![count(vec![frame("in;ner", "/a.py", 2), frame("outer", "/a.py", 1)], 3, 0)],
        ));
        assert_eq!(
            folded(s.get(1).expect("kept")),
            vec![("outer (a.py:1);in:ner (a.py:2)".to_string(), 3)]
        );
    }
}
