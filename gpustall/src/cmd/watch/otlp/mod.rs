//! OpenTelemetry export for `gpustall watch` (off unless asked): the same metrics `/metrics`
//! serves, pushed every `--otlp-every`, and each incident bundle as a log record, over
//! OTLP/HTTP with protobuf bodies, to the collector a cluster already runs.
//!
//! Sending happens on a thread of its own: a collector that is slow, down or behind a dead
//! route must never hold up the daemon's beat (which drains the kernel's rings). The beat only
//! encodes and hands over; a full queue drops the batch and counts it.

mod convert;

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use prost::Message as _;

#[cfg(test)]
pub use convert::logs;
pub use convert::{IncidentLog, Sender, VerdictLine};

use super::metrics::Metrics;

/// `gpustall watch`'s OTLP flags.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(next_help_heading = "OpenTelemetry export (OTLP/HTTP, protobuf)")]
pub struct OtlpArgs {
    /// Send the metrics and each incident (a log record: its verdict, the job's identity, the
    /// bundle's path) to the OpenTelemetry collector at URL, e.g. http://otel-collector:4318:
    /// metrics to URL/v1/metrics, incidents to URL/v1/logs. Headers come from
    /// OTEL_EXPORTER_OTLP_HEADERS (`key=value,...`, as OpenTelemetry's SDKs read it) and
    /// --otlp-header; the resource's attributes from OTEL_RESOURCE_ATTRIBUTES and
    /// OTEL_SERVICE_NAME. Off unless this or one of the two below is given (by flag or by
    /// the OpenTelemetry variable named here, as the OpenTelemetry Operator injects them).
    #[arg(long, value_name = "URL", value_parser = parse_url, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Metrics to this URL exactly, instead of --otlp-endpoint's (Prometheus's own receiver:
    /// http://prometheus:9090/api/v1/otlp/v1/metrics).
    #[arg(long, value_name = "URL", value_parser = parse_url, env = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")]
    otlp_metrics_endpoint: Option<String>,
    /// Incidents to this URL exactly, instead of --otlp-endpoint's.
    #[arg(long, value_name = "URL", value_parser = parse_url, env = "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")]
    otlp_logs_endpoint: Option<String>,
    /// An HTTP header on every OTLP request, e.g. `Authorization=Bearer TOKEN` (a secret is
    /// better in OTEL_EXPORTER_OTLP_HEADERS: the command line is visible to every user).
    /// Repeatable.
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_header)]
    otlp_header: Vec<(String, String)>,
    /// Compress each request's body: gzip (a third of the bytes with a job watched, for a
    /// collector that many nodes send to) or none. Every OTLP receiver takes both.
    #[arg(
        long,
        value_name = "HOW",
        value_enum,
        default_value_t,
        env = "OTEL_EXPORTER_OTLP_COMPRESSION"
    )]
    otlp_compression: Compression,
    /// How often the metrics are sent.
    #[arg(long, value_name = "D", default_value = "15s", value_parser = crate::cmd::units::parse_positive_duration)]
    otlp_every: Duration,
}

/// OTLP's request compressions (OTEL_EXPORTER_OTLP_COMPRESSION's values).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    #[default]
    None,
    Gzip,
}

impl Compression {
    /// The body as sent, and its Content-Encoding.
    fn apply(self, body: Vec<u8>) -> (Vec<u8>, Option<&'static str>) {
        use std::io::Write as _;
        match self {
            Compression::None => (body, None),
            Compression::Gzip => {
                let mut gz = flate2::write::GzEncoder::new(
                    Vec::with_capacity(body.len() / 4),
                    flate2::Compression::default(),
                );
                // Writing to a Vec cannot fail.
                let gzipped = gz.write_all(&body).and_then(|()| gz.finish());
                gzipped.map_or((body, None), |z| (z, Some("gzip")))
            }
        }
    }
}

/// Where and how to send; `None` from [`OtlpArgs::options`] when nothing was asked.
#[derive(Clone, Debug)]
pub struct OtlpOptions {
    pub metrics_url: Option<String>,
    pub logs_url: Option<String>,
    pub headers: Vec<(String, String)>,
    pub every: Duration,
    pub compression: Compression,
    /// The user's resource attributes (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME): they
    /// replace gpustall's own of the same key.
    pub resource: Vec<(String, String)>,
}

impl OtlpArgs {
    /// The options, headers from the environment first; an unreadable environment header is
    /// an error (a token silently not sent would look like the collector's fault).
    pub fn options(self) -> Result<Option<OtlpOptions>, String> {
        let base = self.otlp_endpoint.map(|u| u.trim_end_matches('/').to_string());
        let metrics_url =
            self.otlp_metrics_endpoint.or(base.as_ref().map(|b| format!("{b}/v1/metrics")));
        let logs_url = self.otlp_logs_endpoint.or(base.map(|b| b + "/v1/logs"));
        if metrics_url.is_none() && logs_url.is_none() {
            return Ok(None);
        }
        let mut headers = match std::env::var("OTEL_EXPORTER_OTLP_HEADERS") {
            Ok(v) => parse_env_headers(&v)?,
            Err(_) => Vec::new(),
        };
        headers.extend(self.otlp_header);
        let var = |k| std::env::var(k).ok();
        let resource = resource_attributes(
            var("OTEL_RESOURCE_ATTRIBUTES").as_deref(),
            var("OTEL_SERVICE_NAME").as_deref(),
        )?;
        Ok(Some(OtlpOptions {
            metrics_url,
            logs_url,
            headers,
            every: self.otlp_every,
            compression: self.otlp_compression,
            resource,
        }))
    }
}

/// OTEL_RESOURCE_ATTRIBUTES (`key=value,...`, values percent-encoded), then OTEL_SERVICE_NAME
/// over its `service.name`, as the OpenTelemetry specification orders them. A pair that does
/// not read is an error: a cluster's name silently missing would split its dashboards.
fn resource_attributes(
    attrs: Option<&str>,
    service: Option<&str>,
) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in attrs.unwrap_or("").split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            format!(
                "OTEL_RESOURCE_ATTRIBUTES: {pair:?} is not key=value, e.g. k8s.cluster.name=prod"
            )
        })?;
        let v = percent_encoding::percent_decode_str(v.trim()).decode_utf8_lossy();
        out.retain(|(key, _)| key != k.trim());
        out.push((k.trim().to_string(), v.into_owned()));
    }
    if let Some(name) = service.map(str::trim).filter(|n| !n.is_empty()) {
        out.retain(|(key, _)| key != "service.name");
        out.push(("service.name".into(), name.to_string()));
    }
    Ok(out)
}

fn parse_url(s: &str) -> Result<String, String> {
    let uri: ureq::http::Uri =
        s.parse().map_err(|e| format!("{e}: give a URL such as http://otel-collector:4318"))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(_)) => Ok(s.to_string()),
        _ => {
            Err("give an http:// or https:// URL with a host, e.g. http://otel-collector:4318"
                .into())
        }
    }
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or("give KEY=VALUE, e.g. Authorization=Bearer TOKEN")?;
    let k = k.trim();
    ureq::http::HeaderName::try_from(k).map_err(|_| format!("{k:?} is not an HTTP header name"))?;
    ureq::http::HeaderValue::try_from(v.trim())
        .map_err(|_| format!("the value of {k} is not a valid HTTP header value"))?;
    Ok((k.to_string(), v.trim().to_string()))
}

/// OTEL_EXPORTER_OTLP_HEADERS: `key=value` pairs separated by commas, values percent-encoded
/// (the OpenTelemetry specification's format).
fn parse_env_headers(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let decoded = percent_encoding::percent_decode_str(p).decode_utf8_lossy();
            parse_header(&decoded).map_err(|e| format!("OTEL_EXPORTER_OTLP_HEADERS: {e}"))
        })
        .collect()
}

/// Which signal a batch is: the failure counter's label and the log's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    Metrics,
    Logs,
}

impl Signal {
    fn as_str(self) -> &'static str {
        match self {
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }
}

struct Batch {
    signal: Signal,
    body: Vec<u8>,
}

/// Batches waiting for the sender thread: a minute of metrics at 1 s, or a storm's incidents;
/// beyond it a batch is dropped and counted rather than held in the daemon's memory.
const QUEUE: usize = 64;

/// The daemon's side: encodes, queues, and at exit gives the thread a last few seconds.
pub struct Exporter {
    opts: OtlpOptions,
    from: Sender,
    tx: Option<mpsc::SyncSender<Batch>>,
    worker: Option<JoinHandle<()>>,
    /// Told when the thread has sent its last batch.
    finished: mpsc::Receiver<()>,
    stopping: Arc<AtomicBool>,
    next_metrics: Instant,
    stats: Arc<Metrics>,
}

impl Exporter {
    pub fn start(opts: OtlpOptions, from: Sender, stats: Arc<Metrics>) -> std::io::Result<Self> {
        if opts.metrics_url.is_some() {
            stats.otlp_enabled(Signal::Metrics.as_str());
        }
        if opts.logs_url.is_some() {
            stats.otlp_enabled(Signal::Logs.as_str());
        }
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let (done, finished) = mpsc::channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let mut worker = Worker::new(&opts, stats.clone(), stopping.clone());
        let worker = std::thread::Builder::new().name("gpustall-otlp".into()).spawn(move || {
            while let Ok(b) = rx.recv() {
                worker.send(b);
            }
            let _ = done.send(());
        })?;
        Ok(Self {
            next_metrics: Instant::now(),
            opts,
            from,
            tx: Some(tx),
            worker: Some(worker),
            finished,
            stopping,
            stats,
        })
    }

    /// Where it sends, for the daemon's first lines.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(u) = &self.opts.metrics_url {
            parts.push(format!(
                "metrics every {} to {u}",
                humantime::format_duration(self.opts.every)
            ));
        }
        if let Some(u) = &self.opts.logs_url {
            parts.push(format!("incidents to {u}"));
        }
        if self.opts.compression == Compression::Gzip {
            parts.push("gzip".into());
        }
        parts.join(", ")
    }

    /// Sends the metrics when due (every beat asks).
    pub fn tick(&mut self, metrics: &Metrics) {
        if self.opts.metrics_url.is_none() || Instant::now() < self.next_metrics {
            return;
        }
        self.next_metrics = Instant::now() + self.opts.every;
        self.send_metrics(metrics);
    }

    fn send_metrics(&mut self, metrics: &Metrics) {
        let Some(set) = metrics.snapshot() else { return };
        let body = convert::metrics(&set, &self.from, unix_now_ns()).encode_to_vec();
        self.queue(Batch { signal: Signal::Metrics, body });
    }

    pub fn incident(&mut self, log: IncidentLog) {
        if self.opts.logs_url.is_none() {
            return;
        }
        let body = convert::logs(&[log], &self.from, unix_now_ns()).encode_to_vec();
        self.queue(Batch { signal: Signal::Logs, body });
    }

    fn queue(&mut self, b: Batch) {
        let Some(tx) = &self.tx else { return };
        if let Err(mpsc::TrySendError::Full(b) | mpsc::TrySendError::Disconnected(b)) =
            tx.try_send(b)
        {
            log::warn!(
                "OTLP {} export dropped: {QUEUE} batches are waiting for the collector",
                b.signal.as_str()
            );
            self.stats.otlp_failure(b.signal.as_str());
        }
    }

    /// The last metrics, then what is queued, within `grace`; a collector that does not answer
    /// in time does not hold the daemon's exit.
    pub fn finish(mut self, metrics: &Metrics, grace: Duration) {
        if self.opts.metrics_url.is_some() {
            self.send_metrics(metrics);
        }
        self.tx = None;
        // No retries after this: the queue gets one try each.
        self.stopping.store(true, Ordering::Relaxed);
        match self.finished.recv_timeout(grace) {
            Ok(()) => {
                if let Some(w) = self.worker.take() {
                    let _ = w.join();
                }
            }
            Err(_) => log::warn!(
                "OTLP: the collector did not take the last batches within {}; left unsent",
                humantime::format_duration(grace)
            ),
        }
    }
}

fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The thread's side: posts each batch, retries incidents, says when the collector fails and
/// when it works again (not at every failure: a collector down for an hour is one line).
struct Worker {
    agent: ureq::Agent,
    metrics_url: Option<String>,
    logs_url: Option<String>,
    headers: Vec<(String, String)>,
    compression: Compression,
    stats: Arc<Metrics>,
    stopping: Arc<AtomicBool>,
    failing: [bool; 2],
}

/// An incident is tried this many times (1, 2, 4, 8 s apart); metrics once, the next
/// export carrying the same cumulative values.
const LOG_TRIES: u32 = 5;

impl Worker {
    fn new(opts: &OtlpOptions, stats: Arc<Metrics>, stopping: Arc<AtomicBool>) -> Self {
        let tls = ureq::tls::TlsConfig::builder()
            // The system's certificate store: a cluster's private CA is trusted where the
            // node (or the image) trusts it.
            .root_certs(ureq::tls::RootCerts::PlatformVerifier)
            .build();
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .http_status_as_error(false)
            .tls_config(tls)
            .user_agent(concat!("gpustall/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Self {
            agent,
            metrics_url: opts.metrics_url.clone(),
            logs_url: opts.logs_url.clone(),
            headers: opts.headers.clone(),
            compression: opts.compression,
            stats,
            stopping,
            failing: [false; 2],
        }
    }

    fn send(&mut self, b: Batch) {
        let url = match b.signal {
            Signal::Metrics => self.metrics_url.clone(),
            Signal::Logs => self.logs_url.clone(),
        };
        let Some(url) = url else { return };
        let tries = if b.signal == Signal::Logs { LOG_TRIES } else { 1 };
        let raw = b.body.len();
        let (body, encoding) = self.compression.apply(b.body);
        let mut last = String::new();
        for attempt in 0..tries {
            if attempt > 0 {
                if self.stopping.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1 << (attempt - 1)));
            }
            match self.post(&url, &body, encoding) {
                Ok(()) => {
                    log::debug!(
                        "OTLP {}: {} bytes ({raw} before compression) to {url}",
                        b.signal.as_str(),
                        body.len()
                    );
                    return self.works(b.signal, &url);
                }
                Err(Failure { retry, why }) => {
                    last = why;
                    if !retry {
                        break;
                    }
                }
            }
        }
        self.stats.otlp_failure(b.signal.as_str());
        let slot = &mut self.failing[b.signal as usize];
        if !*slot {
            *slot = true;
            log::warn!(
                "OTLP {} export to {url} failed: {last} (counted in gpustall_otlp_export_failures_total; said again once it works)",
                b.signal.as_str()
            );
        }
    }

    fn works(&mut self, signal: Signal, url: &str) {
        let slot = &mut self.failing[signal as usize];
        if std::mem::take(slot) {
            say!("gpustall: OTLP {} export to {url} works again", signal.as_str());
        }
    }

    fn post(&self, url: &str, body: &[u8], encoding: Option<&str>) -> Result<(), Failure> {
        let mut req = self.agent.post(url).header("Content-Type", "application/x-protobuf");
        if let Some(e) = encoding {
            req = req.header("Content-Encoding", e);
        }
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        let resp = req.send(body).map_err(|e| Failure { retry: true, why: e.to_string() })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        // The OTLP specification's retryable answers; any other is final.
        let retry = matches!(status.as_u16(), 429 | 502 | 503 | 504);
        let mut text = resp.into_body().read_to_string().unwrap_or_default();
        text.truncate(200);
        Err(Failure { retry, why: format!("HTTP {status}: {}", text.trim()) })
    }
}

struct Failure {
    retry: bool,
    why: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_follow_the_otel_conventions() {
        let args = OtlpArgs {
            otlp_endpoint: Some("http://collector:4318/".into()),
            otlp_every: Duration::from_secs(15),
            ..Default::default()
        };
        let o = args.options().unwrap().unwrap();
        assert_eq!(o.metrics_url.as_deref(), Some("http://collector:4318/v1/metrics"));
        assert_eq!(o.logs_url.as_deref(), Some("http://collector:4318/v1/logs"));
        // A per-signal URL is used as it is; the other signal stays off without a base.
        let args = OtlpArgs {
            otlp_metrics_endpoint: Some("http://p:9090/api/v1/otlp/v1/metrics".into()),
            ..Default::default()
        };
        let o = args.options().unwrap().unwrap();
        assert_eq!(o.metrics_url.as_deref(), Some("http://p:9090/api/v1/otlp/v1/metrics"));
        assert_eq!(o.logs_url, None);
        assert!(OtlpArgs::default().options().unwrap().is_none(), "off unless asked");
    }

    #[test]
    fn the_users_resource_attributes_are_read_as_the_sdks_read_them() {
        let got = resource_attributes(
            Some("k8s.cluster.name=prod%2Deu, team = ml ,service.name=x,team=ml-2"),
            Some("trainer-agent"),
        )
        .unwrap();
        let want =
            [("k8s.cluster.name", "prod-eu"), ("team", "ml-2"), ("service.name", "trainer-agent")];
        let want: Vec<(String, String)> =
            want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_eq!(got, want);
        assert_eq!(resource_attributes(None, Some(" ")).unwrap(), vec![]);
        assert!(resource_attributes(Some("cluster"), None).unwrap_err().contains("key=value"));
    }

    #[test]
    fn gzip_bodies_read_back_as_sent() {
        use std::io::Read as _;
        let body: Vec<u8> = (0..4096u32).map(|i| (i % 7) as u8).collect();
        let (z, enc) = Compression::Gzip.apply(body.clone());
        assert_eq!(enc, Some("gzip"));
        assert!(z.len() < body.len() / 4, "{} bytes", z.len());
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(&z[..]).read_to_end(&mut back).unwrap();
        assert_eq!(back, body);
        assert_eq!(Compression::None.apply(body.clone()), (body, None));
    }

    #[test]
    fn urls_and_headers_are_checked_with_a_hint() {
        assert!(parse_url("https://otlp.example.com").is_ok());
        assert!(parse_url("collector:4318").unwrap_err().contains("http://"));
        assert!(parse_url("ftp://x").unwrap_err().contains("http://"));
        assert_eq!(
            parse_header("Authorization=Bearer a=b"),
            Ok(("Authorization".into(), "Bearer a=b".into()))
        );
        assert!(parse_header("no-equals").unwrap_err().contains("KEY=VALUE"));
        assert!(parse_header("bad name=1").unwrap_err().contains("header name"));
        assert_eq!(
            parse_env_headers("api-key=s%3Dcret, x-tenant=ml").unwrap(),
            vec![("api-key".into(), "s=cret".into()), ("x-tenant".into(), "ml".into())]
        );
    }
}
