//! The one event loop `trace` and `watch` share. It owns the two rings, the timers and the
//! signals; what a command does once a second is its [`Beat`].
//!
//! The kernel side wakes the agent only for OOM kills and signals (the critical ring), and
//! when a ring is half full; every other record waits in its ring, drained on a timer and
//! before each beat, so that a beat never sees a process as vanished while its exit event is
//! still in a ring. The timer is [`DrainPace`]: every 100 ms while records come, backing off
//! while none do, so an idle job costs one wakeup a second (the beat), not eleven.

use std::time::Duration;

use aya::maps::{MapData, RingBuf};
use tokio::{
    io::unix::AsyncFd,
    time::{interval, Instant, Interval, MissedTickBehavior},
};

use crate::pipeline::session::{Moment, Session};
use crate::{
    cmd::{
        gpu::GpuWatch,
        signals::{Received, Signals},
    },
    kernel::loader::{KernelMaps, Probes},
    model::samples::Sample,
    sources::clock::monotonic_ns,
};

/// How often the rings are drained while records come.
const DRAIN_EVERY: Duration = Duration::from_millis(100);
/// The longest wait between drains: past the beat's second, only the beat drains.
const DRAIN_AT_MOST_EVERY: Duration = Duration::from_secs(2);
/// How often a command's [`Beat`] runs.
const BEAT_EVERY: Duration = Duration::from_secs(1);
// Past the beat's period the timed drain of a quiet job never comes: each beat drains first
// and pushes it back.
const _: () = assert!(DRAIN_AT_MOST_EVERY.as_millis() > BEAT_EVERY.as_millis());

/// When the rings are drained next: [`DRAIN_EVERY`] after a drain that found records, twice
/// the last wait after one that found none, up to [`DRAIN_AT_MOST_EVERY`]. A burst after a
/// quiet spell waits at most for the next beat, and the kernel wakes the agent at once when
/// a ring is half full, so nothing is lost by waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainPace {
    wait: Duration,
}

impl Default for DrainPace {
    fn default() -> Self {
        Self { wait: DRAIN_EVERY }
    }
}

impl DrainPace {
    /// The wait before the next drain, after one that took in `records`.
    pub fn after(&mut self, records: usize) -> Duration {
        self.wait =
            if records > 0 { DRAIN_EVERY } else { (self.wait * 2).min(DRAIN_AT_MOST_EVERY) };
        self.wait
    }
}

/// A command as the loop drives it: its session takes the records and samples, and once a
/// second, after both rings were drained, it does its own work.
pub trait Beat {
    fn session(&mut self) -> &mut Session;
    /// `Some(reason)` ends the loop.
    fn beat(&mut self, maps: &mut KernelMaps, now_ns: u64) -> Option<Stop>;
    /// A signal arrived; `true` ends the loop (the default). `trace -- CMD` passes it to the
    /// job instead, unless the job got it too, and goes on until the job has exited.
    fn on_signal(&mut self, _sig: Received) -> bool {
        true
    }
    /// When [`Beat::settle`] is due: a decision that waits for the kernel's records.
    fn settle_at(&self) -> Option<Instant> {
        None
    }
    /// Called at [`Beat::settle_at`], after both rings were drained.
    fn settle(&mut self) {}
    /// A drain took in a fatal signal, an exit or an exec: read what must be read while the
    /// job's processes are still there (see [`Moment`]).
    fn catch_up(&mut self, _why: Moment) {}
    /// After an exit: whether the beat may end the loop now (the job's last process exited),
    /// so that it runs at once rather than up to a beat later.
    fn may_have_ended(&mut self) -> bool {
        false
    }
}

/// Why the loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Every traced process has exited.
    JobEnded,
    /// `--duration` passed.
    Deadline,
    /// SIGINT, SIGTERM or SIGHUP (an SSH session that dropped).
    Signal(&'static str),
}

/// The kernel's two rings, registered with the runtime.
pub struct Rings {
    critical: AsyncFd<RingBuf<MapData>>,
    bulk: AsyncFd<RingBuf<MapData>>,
}

impl Rings {
    pub fn register(critical: RingBuf<MapData>, bulk: RingBuf<MapData>) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        // SAFETY: each AsyncFd owns its ring, and with it the map's fd, until both are dropped
        // together: the fd cannot be closed while registered.
        let critical =
            unsafe { AsyncFd::register(critical) }.context("watching the critical ring")?;
        // SAFETY: as above.
        let bulk = unsafe { AsyncFd::register(bulk) }.context("watching the bulk ring")?;
        Ok(Self { critical, bulk })
    }

    /// Takes in whatever both rings hold; returns how many records that was.
    pub fn drain(&mut self, session: &mut Session) -> usize {
        session.drain(self.critical.get_mut()) + session.drain(self.bulk.get_mut())
    }
}

/// GPU sampling as the loop drives it.
pub struct GpuTicks {
    pub watch: Option<GpuWatch>,
    pub every: Duration,
}

fn ticker(every: Duration) -> Interval {
    let mut t = interval(every);
    t.set_missed_tick_behavior(MissedTickBehavior::Skip);
    t
}

/// Runs until the beat, the deadline or a signal says stop; drains both rings before it
/// returns, so the caller's finish sees every record the kernel had.
pub async fn run(
    cmd: &mut impl Beat,
    rings: &mut Rings,
    probes: &mut Probes,
    gpu: GpuTicks,
    deadline: Option<Duration>,
) -> anyhow::Result<Stop> {
    let GpuTicks { watch: mut gpu, every: gpu_every } = gpu;
    let mut pace = DrainPace::default();
    let drain_tick = tokio::time::sleep(DRAIN_EVERY);
    tokio::pin!(drain_tick);
    // After a drain that took in `records`: the next timed drain.
    let mut paced = |records: usize, tick: std::pin::Pin<&mut tokio::time::Sleep>| {
        let next = Instant::now() + pace.after(records);
        // A wakeup's records bring the timed drain forward, never push it back.
        if records == 0 || next < tick.deadline() {
            tick.reset(next);
        }
    };
    let mut beat_tick = ticker(BEAT_EVERY);
    let mut gpu_tick = ticker(gpu_every.max(Duration::from_millis(50)));
    let deadline = deadline.and_then(|d| Instant::now().checked_add(d));
    // Created once: a handler made anew each turn misses a signal that lands between turns.
    let mut signals = Signals::install()?;
    let stop = loop {
        tokio::select! {
            guard = rings.critical.readable_mut() => {
                let mut guard = guard?;
                let records = cmd.session().drain(guard.get_inner_mut());
                guard.clear_ready();
                if records > 0 {
                    paced(records, drain_tick.as_mut());
                }
                // An OOM kill or a fatal signal: on disk now, in case the storm takes us too.
                cmd.session().sync_if_due();
            }
            guard = rings.bulk.readable_mut() => {
                let mut guard = guard?;
                let records = cmd.session().drain(guard.get_inner_mut());
                guard.clear_ready();
                if records > 0 {
                    paced(records, drain_tick.as_mut());
                }
            }
            () = &mut drain_tick => {
                let records = rings.drain(cmd.session());
                paced(records, drain_tick.as_mut());
            }
            _ = gpu_tick.tick(), if gpu.is_some() => {
                if let Some(g) = gpu.as_mut() {
                    let gpus = g.sample();
                    let t_ns = gpus.first().map_or_else(monotonic_ns, |s| s.t_ns);
                    cmd.session().observe(Sample::Gpu { t_ns, gpus });
                }
            }
            _ = beat_tick.tick() => {
                let records = rings.drain(cmd.session());
                paced(records, drain_tick.as_mut());
                let now = monotonic_ns();
                let stop = cmd.beat(&mut probes.maps, now);
                cmd.session().follow_cuda(probes, now);
                cmd.session().sync_if_due();
                if let Some(stop) = stop {
                    break stop;
                }
            }
            _ = sleep_until(deadline) => break Stop::Deadline,
            _ = sleep_until(cmd.settle_at()) => {
                rings.drain(cmd.session());
                cmd.settle();
            }
            received = signals.recv() => {
                let received = received?;
                if cmd.on_signal(received) {
                    break Stop::Signal(received.name());
                }
            }
        }
        cmd.session().follow_roles(&mut probes.maps);
        if let Some(why) = cmd.session().take_moment() {
            cmd.catch_up(why);
            if cmd.may_have_ended() {
                beat_tick.reset_immediately();
            }
        }
    };
    rings.drain(cmd.session());
    Ok(stop)
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_back_off_while_quiet_and_return_at_the_first_record() {
        let mut pace = DrainPace::default();
        let waits: Vec<u64> = [0, 0, 0, 0, 0, 0].map(|n| pace.after(n).as_millis() as u64).into();
        assert_eq!(waits, vec![200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(pace.after(3), DRAIN_EVERY);
        assert_eq!(pace.after(0), DRAIN_EVERY * 2);
    }
}
