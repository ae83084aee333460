//! The trainer's waits for the GPU (uprobes on the CUDA driver's synchronising calls,
//! `model::gpuwait`): where they were measured, a trainer's time is split into waiting for
//! data, waiting for the GPU, its own CPU work and the rest, and a trainer that spent most of
//! its time in the driver is GPU-bound: its input pipeline keeps up, and the CPU it burned
//! spinning there is not its own work (`trainer_bound` leaves it out).

use super::{
    datawait::{waiters, DATA_WAIT_SHARE},
    evidence::{at, name},
    rules::Ctx,
    Cause, Verdict,
};
use crate::diagnose::facts::{Facts, ProcFacts};

/// A trainer inside the driver's synchronising calls at least this share of its time is
/// GPU-bound.
const GPU_BOUND_SHARE: f64 = 0.5;

/// A trainer's or rank's time, each part measured on its own: the data wait
/// (the kernel's waits its workers ended), the GPU wait (the uprobes), its own CPU (/proc's
/// CPU time less the part spent spinning in the driver); the rest is what none of them
/// covers (waiting for a CPU, other blocks), never negative.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq)]
pub struct TimeSplit {
    pub life_ns: u64,
    pub data_wait_ns: u64,
    pub gpu_wait_ns: u64,
    pub own_cpu_ns: u64,
    /// The three measured parts add up to this share of the life (1.0: all of it).
    pub measured_share: f64,
}

impl TimeSplit {
    /// `p`'s split, where its GPU waits were measured; `data_wait_ns` from `datawait`.
    /// Over the span since its first DataLoader worker came where that was measured (the
    /// training loop, its imports and start-up left out), else over its life.
    pub fn of(p: &ProcFacts, data_wait_ns: u64) -> Option<Self> {
        let g = p.gpu_wait.as_ref()?;
        let spun = g.on_cpu_ns.unwrap_or(0);
        // /proc's CPU time is read once a second: the part since the mark, over the span its
        // readings cover, scaled to the whole window (as `Split` scales a life's).
        let (life, own) = match (p.cpu_since_workers, p.since_workers_ns) {
            (Some((cpu, span)), Some(window)) if span > 0 && window > 0 => {
                (window, ((cpu as f64 * window as f64 / span as f64) as u64).saturating_sub(spun))
            }
            _ => (p.lifetime_ns.max(1), own_cpu_ns(p)),
        };
        let sum = data_wait_ns + g.wait_ns + own;
        Some(Self {
            life_ns: life,
            data_wait_ns,
            gpu_wait_ns: g.wait_ns,
            own_cpu_ns: own,
            measured_share: sum as f64 / life as f64,
        })
    }

    fn share(&self, ns: u64) -> f64 {
        ns as f64 / self.life_ns as f64
    }

    /// "62 % waiting for the GPU, 20 % for data, 15 % its own CPU work, 3 % neither"
    pub fn words(&self) -> String {
        let rest = 1.0 - self.measured_share;
        format!(
            "{:.0} % waiting for the GPU, {:.0} % for data, {:.0} % on its own CPU work, {}",
            100.0 * self.share(self.gpu_wait_ns),
            100.0 * self.share(self.data_wait_ns),
            100.0 * self.share(self.own_cpu_ns),
            if rest >= 0.0 {
                format!("{:.0} % neither (waiting for a CPU, other blocks)", 100.0 * rest)
            } else {
                format!("the parts overlap by {:.0} %", -100.0 * rest)
            }
        )
    }
}

/// `p`'s CPU time that was its own work: its CPU time over its life, less what its threads
/// spent on a CPU inside the driver's synchronising calls (spinning for the GPU).
pub fn own_cpu_ns(p: &ProcFacts) -> u64 {
    let cpu = super::input::Split::of(p).cpu_ns;
    let spun = p.gpu_wait.as_ref().and_then(|g| g.on_cpu_ns).unwrap_or(0);
    cpu.saturating_sub(spun)
}

/// The evidence link of a trainer's split, where its GPU waits were measured.
pub fn split_link(f: &Facts, p: &ProcFacts, data_wait_ns: u64) -> Option<(u64, String)> {
    let s = TimeSplit::of(p, data_wait_ns)?;
    let g = p.gpu_wait.as_ref()?;
    let t = p.started_ns.max(f.start_ns);
    let spin = match (g.on_cpu_ns, g.off_cpu_ns) {
        (Some(c), Some(b)) => {
            format!(", {:.2} s of it on a CPU (spinning) and {:.2} s off it", secs(c), secs(b))
        }
        _ => String::new(),
    };
    Some((
        t,
        format!(
            "{}: {}'s {:.2} s: {}; {} synchronising calls into the CUDA driver ({}) took {:.2} s{spin}, the longest {:.3} s",
            at(f, t),
            name(p),
            secs(s.life_ns),
            s.words(),
            g.calls,
            g.symbols.join(", "),
            secs(g.wait_ns),
            secs(g.longest_ns),
        ),
    ))
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// A trainer or rank that waited for the GPU most of its time, and for data little: the job
/// is GPU-bound, and the input pipeline is not what limits it.
pub fn gpu_bound(c: &Ctx) -> Option<Verdict> {
    let f = c.f;
    let (main, wait, share) = waiters(f)
        .into_iter()
        .filter(|(p, _, _)| p.gpu_wait.is_some())
        .max_by_key(|(p, _, _)| p.gpu_wait.as_ref().map_or(0, |g| g.wait_ns))?;
    let split = TimeSplit::of(main, wait)?;
    let gpu_share = split.share(split.gpu_wait_ns);
    if share >= DATA_WAIT_SHARE || gpu_share < GPU_BOUND_SHARE {
        return None;
    }
    // Said over the split's window (the training loop), as the evidence says it.
    let share = split.share(split.data_wait_ns);
    let mut chain = c.chain();
    if let Some((t, text)) = split_link(f, main, wait) {
        chain.push(t, text);
    }
    let text = format!(
        "The job is GPU-bound: {} waited for the GPU {:.0} % of its time, inside the CUDA driver's synchronising calls, and for data only {:.0} %: the input pipeline keeps up.",
        name(main),
        100.0 * gpu_share,
        100.0 * share
    );
    let advice = vec![
        "the input pipeline does not limit this job: more DataLoader workers, faster storage or more host memory will not make it faster".to_string(),
        "to make it faster, make the GPU's work cheaper: mixed precision (torch.autocast, bf16), torch.compile, a larger batch where memory allows; and synchronise less (each loss.item(), .cpu() or print of a tensor waits for the GPU)".to_string(),
    ];
    Some(c.verdict(Cause::GpuBound, text, vec![main.pid], chain, advice))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gpuwait::GpuWaitSummary;

    fn trainer(life: u64, cpu: u64, gpu_wait: u64, on_cpu: u64) -> ProcFacts {
        ProcFacts {
            pid: 10,
            is_trainer: true,
            lifetime_ns: life,
            cpu_ns: Some(cpu),
            cpu_span_ns: life,
            gpu_wait: Some(GpuWaitSummary {
                calls: 100,
                wait_ns: gpu_wait,
                on_cpu_ns: Some(on_cpu),
                off_cpu_ns: Some(gpu_wait - on_cpu),
                longest_ns: gpu_wait / 100,
                library: "/usr/lib/libcuda.so.1".into(),
                symbols: vec!["cuStreamSynchronize".into()],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_cpu_spent_spinning_for_the_gpu_is_not_the_trainers_own_work() {
        // 10 s: 9 s on CPU, of which 6 s spinning in the driver; 1 s waiting for data.
        let p = trainer(10_000_000_000, 9_000_000_000, 6_000_000_000, 6_000_000_000);
        assert_eq!(own_cpu_ns(&p), 3_000_000_000);
        let s = TimeSplit::of(&p, 1_000_000_000).unwrap();
        assert!((s.measured_share - 1.0).abs() < 1e-9, "{s:?}");
        assert_eq!(
            s.words(),
            "60 % waiting for the GPU, 10 % for data, 30 % on its own CPU work, 0 % neither (waiting for a CPU, other blocks)"
        );
    }

    #[test]
    fn no_split_where_the_gpu_waits_were_not_measured() {
        let p = ProcFacts { gpu_wait: None, ..trainer(1, 1, 1, 0) };
        assert_eq!(TimeSplit::of(&p, 0), None);
    }
}
