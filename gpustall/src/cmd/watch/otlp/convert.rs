//! The daemon's figures and incidents as OTLP messages: pure functions from what the daemon
//! has (the Prometheus registry's values, a written bundle's verdict) to the OpenTelemetry
//! project's message types, so what goes on the wire is tested without a network.
//!
//! Names and units are chosen so a Prometheus that ingests OTLP stores the very series
//! `/metrics` serves (`gpustall.reclaim_stall` in seconds, a monotonic sum, becomes
//! `gpustall_reclaim_stall_seconds_total`): the shipped alert rules and dashboard work on
//! either path.

use opentelemetry_proto::tonic::{
    collector::{logs::v1::ExportLogsServiceRequest, metrics::v1::ExportMetricsServiceRequest},
    common::v1::{any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue},
    logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber},
    metrics::v1::{
        metric, number_data_point, AggregationTemporality, Gauge, Metric, NumberDataPoint,
        ResourceMetrics, ScopeMetrics, Sum,
    },
    resource::v1::Resource,
};
use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model as pm;

use crate::{diagnose::verdict::Severity, model::identity::Identity};

/// Who sends: the resource every metric and log record is attached to.
#[derive(Clone, Debug)]
pub struct Sender {
    /// The node's name (NODE_NAME where the DaemonSet sets it, else the host name).
    pub node: String,
    /// When the daemon started (Unix ns): the start of every cumulative sum.
    pub started_unix_ns: u64,
    /// Set where Kubernetes runs the daemon (NODE_NAME in its environment).
    pub k8s_node: bool,
    /// The user's resource attributes: each replaces gpustall's own of the same key.
    pub resource: Vec<(String, String)>,
}

impl Sender {
    fn resource(&self) -> Resource {
        let mut attributes = vec![
            kv("service.name", "gpustall"),
            kv("service.version", env!("CARGO_PKG_VERSION")),
            // One daemon per node: the node names the instance (Prometheus's `instance`).
            kv("service.instance.id", &self.node),
            kv("host.name", &self.node),
        ];
        if self.k8s_node {
            attributes.push(kv("k8s.node.name", &self.node));
        }
        for (k, v) in &self.resource {
            attributes.retain(|a| a.key != *k);
            attributes.push(kv(k, v));
        }
        Resource { attributes, ..Default::default() }
    }

    fn scope() -> InstrumentationScope {
        InstrumentationScope {
            name: "gpustall".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        }
    }
}

/// A string attribute; its value, a name or text from the job's world, shown safely.
fn kv(key: &str, value: &str) -> KeyValue {
    any(key, any_value::Value::StringValue(crate::model::untrusted::name(value)))
}

fn any(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// A Prometheus unit as UCUM, OTLP's units (what Prometheus's OTLP receiver maps back).
fn ucum(unit: &str) -> &str {
    match unit {
        "seconds" => "s",
        "bytes" => "By",
        "celsius" => "Cel",
        "ratio" => "1",
        other => other,
    }
}

/// A registry family's exposition name (`gpustall_reclaim_stall_seconds_total`) as an OTel
/// metric name: the unit and `_total` are the unit field's and the sum's to say, and the
/// namespace is dotted (`gpustall.reclaim_stall`).
fn otel_name(f: &pm::MetricFamily, counter: bool) -> String {
    let mut name = f.name.as_str();
    if counter {
        name = name.strip_suffix("_total").unwrap_or(name);
    }
    if !f.unit.is_empty() {
        name = name.strip_suffix(&format!("_{}", f.unit)).unwrap_or(name);
    }
    match name.strip_prefix("gpustall_") {
        Some(stem) => format!("gpustall.{stem}"),
        None => name.to_string(),
    }
}

/// Labels as attributes; an empty label is no label (as to Prometheus): absent, not "".
fn attributes(labels: &[pm::LabelPair]) -> Vec<KeyValue> {
    labels.iter().filter(|l| !l.value.is_empty()).map(|l| kv(&l.name, &l.value)).collect()
}

/// The registry's values now (`Metrics::snapshot`) as one OTLP metrics export: counters as
/// cumulative monotonic sums from the daemon's start, gauges (info series among them, at 1)
/// as gauges.
pub fn metrics(
    set: &[pm::MetricFamily],
    from: &Sender,
    now_unix_ns: u64,
) -> ExportMetricsServiceRequest {
    let metrics = set.iter().filter_map(|f| family(f, from, now_unix_ns));
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(from.resource()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(Sender::scope()),
                metrics: metrics.collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn family(f: &pm::MetricFamily, from: &Sender, now: u64) -> Option<Metric> {
    let point = |m: &pm::Metric, v: f64| NumberDataPoint {
        attributes: attributes(&m.label),
        start_time_unix_nano: from.started_unix_ns,
        time_unix_nano: now,
        // Every value is a double in the registry's model: sent as one, so a series never
        // changes type between exports.
        value: Some(number_data_point::Value::AsDouble(v)),
        ..Default::default()
    };
    let kind = pm::MetricType::try_from(f.r#type).ok()?;
    let data = match kind {
        pm::MetricType::Counter => {
            let points = f.metric.iter().filter_map(|m| Some(point(m, m.counter.as_ref()?.value)));
            metric::Data::Sum(Sum {
                data_points: points.collect(),
                aggregation_temporality: AggregationTemporality::Cumulative as i32,
                is_monotonic: true,
            })
        }
        pm::MetricType::Gauge => {
            let points = f.metric.iter().filter_map(|m| Some(point(m, m.gauge.as_ref()?.value)));
            metric::Data::Gauge(Gauge { data_points: points.collect() })
        }
        // The daemon registers no histograms or summaries; were one added, it is left out
        // here rather than sent wrong.
        _ => return None,
    };
    // A family with no series yet (no GPU sampled) is not sent: a metric without points.
    let empty = match &data {
        metric::Data::Sum(s) => s.data_points.is_empty(),
        metric::Data::Gauge(g) => g.data_points.is_empty(),
        _ => false,
    };
    if empty {
        return None;
    }
    Some(Metric {
        name: otel_name(f, kind == pm::MetricType::Counter),
        description: f.help.trim_end_matches('.').to_string(),
        unit: ucum(&f.unit).to_string(),
        data: Some(data),
        ..Default::default()
    })
}

/// One incident bundle, as the daemon wrote it (or failed to).
#[derive(Clone, Debug)]
pub struct IncidentLog {
    /// When the incident happened (Unix ns).
    pub at_unix_ns: u64,
    pub kind: String,
    pub pid: u32,
    /// Incidents folded into the same bundle besides this one.
    pub more: u64,
    /// The watched job it belongs to (`gpustall_job_info`'s `training_job`), if any.
    pub job: Option<String>,
    pub identity: Identity,
    /// The bundle's verdict; `None` when the bundle could not be written (`bundle` says why).
    pub verdict: Option<VerdictLine>,
    /// The bundle's directory, or why there is none.
    pub bundle: Result<String, String>,
}

#[derive(Clone, Debug)]
pub struct VerdictLine {
    pub cause: String,
    pub title: String,
    pub severity: Severity,
    pub text: String,
    pub advice: Vec<String>,
}

/// Incidents as OTLP log records (event `gpustall.incident`): the body is the verdict in
/// words; the attributes say which job (the OTel semantic conventions' `k8s.*` and
/// `container.id` where they have a name for it) and where the bundle is.
pub fn logs(
    incidents: &[IncidentLog],
    from: &Sender,
    now_unix_ns: u64,
) -> ExportLogsServiceRequest {
    let records = incidents.iter().map(|i| record(i, now_unix_ns)).collect();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(from.resource()),
            scope_logs: vec![ScopeLogs {
                scope: Some(Sender::scope()),
                log_records: records,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn record(i: &IncidentLog, now: u64) -> LogRecord {
    let (severity, text) = match i.verdict.as_ref().map(|v| v.severity) {
        // An incident with no verdict is still a failure seen: a kill or a fault.
        Some(Severity::Failure) | None => (SeverityNumber::Error, "ERROR"),
        Some(Severity::Slowdown) => (SeverityNumber::Warn, "WARN"),
        Some(Severity::Clear) => (SeverityNumber::Info, "INFO"),
    };
    let body = match (&i.verdict, &i.bundle) {
        (Some(v), _) => format!("{}: {}", v.title, v.text),
        (None, Err(why)) => {
            format!("incident {} of pid {} (no bundle: {why})", i.kind, i.pid)
        }
        (None, Ok(_)) => format!("incident {} of pid {}", i.kind, i.pid),
    };
    let int = |k: &str, v: i64| any(k, any_value::Value::IntValue(v));
    let mut a = vec![kv("gpustall.incident.kind", &i.kind), int("process.pid", i64::from(i.pid))];
    if i.more > 0 {
        a.push(int("gpustall.incident.more", i64::try_from(i.more).unwrap_or(i64::MAX)));
    }
    if let Some(job) = &i.job {
        a.push(kv("gpustall.training_job", job));
    }
    a.extend(identity(&i.identity));
    if let Some(v) = &i.verdict {
        a.push(kv("gpustall.verdict.cause", &v.cause));
        a.push(kv("gpustall.verdict.title", &v.title));
        if !v.advice.is_empty() {
            let values = v.advice.iter().map(|s| AnyValue {
                value: Some(any_value::Value::StringValue(crate::model::untrusted::name(s))),
            });
            let array = ArrayValue { values: values.collect() };
            a.push(any("gpustall.verdict.advice", any_value::Value::ArrayValue(array)));
        }
    }
    match &i.bundle {
        Ok(path) => a.push(kv("gpustall.bundle.path", path)),
        Err(why) => a.push(kv("gpustall.bundle.error", why)),
    }
    LogRecord {
        time_unix_nano: i.at_unix_ns,
        observed_time_unix_nano: now,
        severity_number: severity as i32,
        severity_text: text.into(),
        body: Some(AnyValue {
            value: Some(any_value::Value::StringValue(crate::model::untrusted::name(&body))),
        }),
        attributes: a,
        event_name: "gpustall.incident".into(),
        ..Default::default()
    }
}

/// The job's identity as attributes: what was found, nothing invented.
fn identity(id: &Identity) -> Vec<KeyValue> {
    let text = [
        ("k8s.namespace.name", &id.namespace),
        ("k8s.pod.name", &id.pod),
        ("k8s.pod.uid", &id.pod_uid),
        ("container.id", &id.container_id),
        ("k8s.container.name", &id.container),
        ("gpustall.slurm.job_id", &id.slurm_job),
        ("gpustall.slurm.step_id", &id.slurm_step),
        ("gpustall.slurm.user", &id.slurm_user),
        ("gpustall.torch.run_id", &id.run_id),
        ("gpustall.torch.master", &id.master),
    ];
    let numbers = [
        ("gpustall.torch.rank", id.rank),
        ("gpustall.torch.local_rank", id.local_rank),
        ("gpustall.torch.world_size", id.world_size),
        ("gpustall.torch.group_rank", id.group_rank),
        ("gpustall.slurm.uid", id.slurm_uid),
    ];
    let text = text.into_iter().filter_map(|(k, v)| Some(kv(k, v.as_deref()?)));
    let numbers = numbers
        .into_iter()
        .filter_map(|(k, v)| Some(any(k, any_value::Value::IntValue(i64::from(v?)))));
    text.chain(numbers).collect()
}

#[cfg(test)]
mod tests;
