//! The GPU flags `trace` and `watch` share, and opening NVML as they ask.

use crate::model::gpu::GpuSample;
use crate::model::gpu::GpuState;
use crate::recording::header::GpuHeader;
use crate::sources::nvml::GpuSampler;

/// What the GPU side was asked to do (`None` when --no-gpu).
pub struct GpuOptions {
    pub nvml_lib: Option<std::path::PathBuf>,
    pub interval: std::time::Duration,
    pub threshold_pct: u32,
    pub window: std::time::Duration,
}

/// Opens NVML as asked: turns GPU data on in `state`, or records (and prints, once) why it is
/// off. Returns the sampler, if any, and the `gpu` object of the recording's header.
pub fn open(opts: Option<&GpuOptions>, state: &mut GpuState) -> (Option<GpuWatch>, GpuHeader) {
    let Some(g) = opts else {
        state.status = "GPU data is off (--no-gpu)".into();
        return (
            None,
            GpuHeader { enabled: false, status: state.status.clone(), ..Default::default() },
        );
    };
    let window_ns = g.window.as_nanos() as u64;
    let (watch, status) = match GpuWatch::open(g.nvml_lib.as_deref()) {
        Ok((w, status)) => {
            state.enable(status.clone(), g.threshold_pct, window_ns);
            (Some(w), status)
        }
        Err(why) => (None, why),
    };
    state.status = status.clone();
    say!("gpustall: {status}");
    let header = GpuHeader {
        enabled: watch.is_some(),
        status,
        threshold_pct: Some(g.threshold_pct),
        window_ns: Some(window_ns),
    };
    (watch, header)
}

/// GPU options shared by `trace` and `watch` (whose defaults differ).
#[derive(clap::Args)]
pub struct GpuArgs {
    /// The NVML library to load (default: $GPUSTALL_NVML_LIB, else the driver's libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    nvml_lib: Option<std::path::PathBuf>,
    /// How often the GPUs are sampled [default: 500ms for trace, 1s for watch].
    #[arg(long, value_name = "D", value_parser = crate::cmd::units::parse_duration)]
    gpu_interval: Option<std::time::Duration>,
    /// A GPU at or under this utilisation (%) is idle.
    #[arg(long, value_name = "PCT", default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=100))]
    stall_threshold: u32,
    /// An idle GPU of the job is a stall once it has been idle this long [default: 3s for trace,
    /// 30s for watch].
    #[arg(long, value_name = "D", value_parser = crate::cmd::units::parse_duration)]
    stall_window: Option<std::time::Duration>,
    /// Do not load NVML at all.
    #[arg(long)]
    no_gpu: bool,
}

impl GpuArgs {
    pub fn options(
        self,
        interval: std::time::Duration,
        window: std::time::Duration,
    ) -> Option<GpuOptions> {
        (!self.no_gpu).then(|| GpuOptions {
            nvml_lib: self.nvml_lib,
            interval: self.gpu_interval.unwrap_or(interval),
            threshold_pct: self.stall_threshold,
            window: self.stall_window.unwrap_or(window),
        })
    }
}

/// NVML, opened once.
pub struct GpuWatch {
    sampler: GpuSampler,
}

impl GpuWatch {
    /// Opens NVML: the GPUs and driver on success, or the one-line reason GPU data is off.
    pub fn open(lib: Option<&std::path::Path>) -> Result<(Self, String), String> {
        match GpuSampler::open(lib) {
            Ok(sampler) => {
                let status = format!(
                    "{} GPU(s), driver {}",
                    sampler.gpu_count(),
                    sampler.driver_version().unwrap_or_else(|| "?".into())
                );
                Ok((Self { sampler }, status))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    pub fn sample(&mut self) -> Vec<GpuSample> {
        self.sampler.sample()
    }
}
