//! The OTLP receiver the end-to-end tests export to (tests/src/otlp.rs) really receive: one
//! OTLP/HTTP protobuf request per signal, built with the OpenTelemetry protos, and the data seen on the
//! other side (rotel's debug log).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::{
    collector::{logs::v1::ExportLogsServiceRequest, metrics::v1::ExportMetricsServiceRequest},
    common::v1::{any_value, AnyValue, KeyValue},
    logs::v1::{LogRecord, ResourceLogs, ScopeLogs},
    metrics::v1::{
        metric::Data, number_data_point, Gauge, Metric, NumberDataPoint, ResourceMetrics,
        ScopeMetrics,
    },
    resource::v1::Resource,
};
use prost::Message;
use tests::otlp::Rotel;

fn string(s: &str) -> Option<AnyValue> {
    Some(AnyValue { value: Some(any_value::Value::StringValue(s.into())) })
}

fn attr(key: &str, value: &str) -> KeyValue {
    KeyValue { key: key.into(), value: string(value), ..Default::default() }
}

fn now_nanos() -> u64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970");
    u64::try_from(d.as_nanos()).expect("nanoseconds fit u64")
}

fn resource() -> Option<Resource> {
    Some(Resource {
        attributes: vec![attr("service.name", "gpustall-smoke")],
        ..Default::default()
    })
}

/// POSTs `msg` as OTLP/HTTP protobuf; the receiver must answer 2xx.
fn post(url: &str, msg: &impl Message) {
    let resp = ureq::post(url)
        .header("Content-Type", "application/x-protobuf")
        .send(&msg.encode_to_vec()[..]);
    if let Err(e) = resp {
        panic!("POST {url}: {e}");
    }
}

/// Polls `f` every 250 ms until it gives something or 30 s pass (then explains `what`).
fn poll<T>(what: impl Fn() -> String, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "{} within 30 s", what());
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The gauge `gpustall_smoke` = 42 with training_job="smoke-1".
fn smoke_gauge() -> ExportMetricsServiceRequest {
    let point = NumberDataPoint {
        attributes: vec![attr("training_job", "smoke-1")],
        time_unix_nano: now_nanos(),
        value: Some(number_data_point::Value::AsDouble(42.0)),
        ..Default::default()
    };
    let metric = Metric {
        name: "gpustall_smoke".into(),
        data: Some(Data::Gauge(Gauge { data_points: vec![point] })),
        ..Default::default()
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: resource(),
            scope_metrics: vec![ScopeMetrics { metrics: vec![metric], ..Default::default() }],
            ..Default::default()
        }],
    }
}

#[test]
fn rotel_receives_an_otlp_log_record() {
    tests::require_privileged_env();
    let rotel = Rotel::start();
    let record = LogRecord {
        time_unix_nano: now_nanos(),
        observed_time_unix_nano: now_nanos(),
        severity_text: "WARN".into(),
        body: string("smoke incident"),
        attributes: vec![attr("training_job", "smoke-1")],
        ..Default::default()
    };
    let req = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: resource(),
            scope_logs: vec![ScopeLogs { log_records: vec![record], ..Default::default() }],
            ..Default::default()
        }],
    };
    post(&rotel.otlp_logs_url(), &req);
    let out = poll(
        || format!("the log record in rotel's output:\n{}", rotel.received()),
        || {
            let out = rotel.received();
            (out.contains("smoke incident") && out.contains("smoke-1")).then_some(out)
        },
    );
    eprintln!("rotel printed:\n{out}");
    assert!(out.contains("training_job"), "{out}");
}

#[test]
fn rotel_receives_an_otlp_gauge() {
    tests::require_privileged_env();
    let rotel = Rotel::start();
    post(&rotel.otlp_metrics_url(), &smoke_gauge());
    let out = poll(
        || format!("the gauge in rotel's output:\n{}", rotel.received()),
        || {
            let out = rotel.received();
            (out.contains("gpustall_smoke") && out.contains("smoke-1")).then_some(out)
        },
    );
    eprintln!("rotel printed:\n{out}");
    assert!(out.contains("training_job"), "{out}");
}
