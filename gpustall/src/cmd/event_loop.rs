//! The one event loop `trace` and `watch` share. It owns the two rings, the timers and the
//! signals; what a command does once a second is its [`Beat`].
//!
//! The kernel side wakes the agent only for OOM kills and signals (the critical ring); every
//! other record waits in the bulk ring, drained on a 100 ms timer and before each beat, so that
//! a beat never sees a process as vanished while its exit event is still in a ring.

use std::time::Duration;

use aya::maps::{MapData, RingBuf};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{signal, SignalKind},
    time::{interval, Instant, Interval, MissedTickBehavior},
};

use crate::{
    cmd::{gpu::GpuWatch, session::Session},
    kernel::loader::KernelMaps,
    model::samples::Sample,
    sources::clock::monotonic_ns,
};

/// How often the rings are drained when no wakeup came.
const DRAIN_EVERY: Duration = Duration::from_millis(100);
/// How often a command's [`Beat`] runs.
const BEAT_EVERY: Duration = Duration::from_secs(1);

/// A command as the loop drives it: its session takes the records and samples, and once a
/// second, after both rings were drained, it does its own work.
pub trait Beat {
    fn session(&mut self) -> &mut Session;
    /// `Some(reason)` ends the loop.
    fn beat(&mut self, maps: &mut KernelMaps, now_ns: u64) -> Option<Stop>;
    /// A signal arrived; `true` ends the loop (the default). `trace -- CMD` passes it to the
    /// job instead and goes on until the job has exited.
    fn on_signal(&mut self, _sig: i32) -> bool {
        true
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

    /// Takes in whatever both rings hold.
    pub fn drain(&mut self, session: &mut Session) {
        session.drain(self.critical.get_mut());
        session.drain(self.bulk.get_mut());
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
    maps: &mut KernelMaps,
    gpu: GpuTicks,
    deadline: Option<Duration>,
) -> anyhow::Result<Stop> {
    let GpuTicks { watch: mut gpu, every: gpu_every } = gpu;
    let mut drain_tick = ticker(DRAIN_EVERY);
    let mut beat_tick = ticker(BEAT_EVERY);
    let mut gpu_tick = ticker(gpu_every.max(Duration::from_millis(50)));
    let deadline = deadline.and_then(|d| Instant::now().checked_add(d));
    // Created once: a handler made anew each turn misses a signal that lands between turns.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let stop = loop {
        tokio::select! {
            guard = rings.critical.readable_mut() => {
                let mut guard = guard?;
                cmd.session().drain(guard.get_inner_mut());
                guard.clear_ready();
                // An OOM kill or a fatal signal: on disk now, in case the storm takes us too.
                cmd.session().sync_if_due();
            }
            guard = rings.bulk.readable_mut() => {
                let mut guard = guard?;
                cmd.session().drain(guard.get_inner_mut());
                guard.clear_ready();
            }
            _ = drain_tick.tick() => rings.drain(cmd.session()),
            _ = gpu_tick.tick(), if gpu.is_some() => {
                if let Some(g) = gpu.as_mut() {
                    let gpus = g.sample();
                    let t_ns = gpus.first().map_or_else(monotonic_ns, |s| s.t_ns);
                    cmd.session().observe(Sample::Gpu { t_ns, gpus });
                }
            }
            _ = beat_tick.tick() => {
                rings.drain(cmd.session());
                let stop = cmd.beat(maps, monotonic_ns());
                cmd.session().sync_if_due();
                if let Some(stop) = stop {
                    break stop;
                }
            }
            _ = sleep_until(deadline) => break Stop::Deadline,
            _ = sigint.recv() => if cmd.on_signal(libc::SIGINT) { break Stop::Signal("SIGINT") },
            _ = sigterm.recv() => if cmd.on_signal(libc::SIGTERM) { break Stop::Signal("SIGTERM") },
            _ = sighup.recv() => if cmd.on_signal(libc::SIGHUP) { break Stop::Signal("SIGHUP") },
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
