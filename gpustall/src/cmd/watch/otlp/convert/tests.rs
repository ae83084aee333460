//! What goes on the wire, decoded field by field: names and units Prometheus's OTLP receiver
//! maps back to the scraped names, counters as cumulative sums, info series as gauges of 1,
//! an incident's verdict and identity as a log record's body and attributes.

use opentelemetry_proto::tonic::{
    common::v1::{any_value::Value, KeyValue},
    metrics::v1::{metric::Data, number_data_point, AggregationTemporality},
};

use super::*;
use crate::{
    cmd::watch::metrics::{JobRole, Metrics, ProcDelta},
    diagnose::verdict::Severity,
    model::identity::Identity,
};

fn sender() -> Sender {
    Sender {
        node: "node-a".into(),
        started_unix_ns: 1_000,
        k8s_node: true,
        resource: vec![("k8s.cluster.name".into(), "prod".into())],
    }
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attrs.iter().find(|a| a.key == key)?.value.as_ref()?.value.as_ref()
}

fn text<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(attrs, key)? {
        Value::StringValue(s) => Some(s),
        _ => None,
    }
}

#[test]
fn the_registry_becomes_sums_and_gauges_named_as_prometheus_stores_them() {
    let m = Metrics::new();
    let job = JobRole { training_job: "python-42".into(), role: "worker".into() };
    m.add(&job, ProcDelta { reclaim_stall_seconds: 1.5, swapout_pages: 7, ..Default::default() });
    m.set_memory(&job, 4096, 0);
    m.set_gpu(&crate::cmd::watch::metrics::GpuLabel { gpu: "0".into() }, 0.25, None);
    let req = metrics(&m.snapshot().unwrap(), &sender(), 5_000);
    let rm = &req.resource_metrics[0];
    let res = &rm.resource.as_ref().unwrap().attributes;
    assert_eq!(text(res, "service.name"), Some("gpustall"));
    assert_eq!(text(res, "service.instance.id"), Some("node-a"));
    assert_eq!(text(res, "k8s.node.name"), Some("node-a"));
    assert_eq!(text(res, "k8s.cluster.name"), Some("prod"), "the user's own attributes");
    let all = &rm.scope_metrics[0].metrics;
    let find = |name: &str| all.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("{name}"));

    let stall = find("gpustall.reclaim_stall");
    assert_eq!(stall.unit, "s");
    let Some(Data::Sum(sum)) = &stall.data else { panic!("{stall:?}") };
    assert!(sum.is_monotonic);
    assert_eq!(sum.aggregation_temporality, AggregationTemporality::Cumulative as i32);
    let p = &sum.data_points[0];
    assert_eq!((p.start_time_unix_nano, p.time_unix_nano), (1_000, 5_000));
    assert_eq!(p.value, Some(number_data_point::Value::AsDouble(1.5)));
    assert_eq!(text(&p.attributes, "training_job"), Some("python-42"));
    assert_eq!(text(&p.attributes, "role"), Some("worker"));

    let pages = find("gpustall.swapout_pages");
    let Some(Data::Sum(sum)) = &pages.data else { panic!() };
    assert_eq!(sum.data_points[0].value, Some(number_data_point::Value::AsDouble(7.0)));

    let rss = find("gpustall.process_resident");
    assert_eq!(rss.unit, "By");
    let Some(Data::Gauge(g)) = &rss.data else { panic!("{rss:?}") };
    assert_eq!(g.data_points[0].value, Some(number_data_point::Value::AsDouble(4096.0)));

    // Info: a gauge of 1, its labels as attributes, named as Prometheus stores it.
    let build = find("gpustall.build_info");
    let Some(Data::Gauge(g)) = &build.data else { panic!("{build:?}") };
    assert_eq!(g.data_points[0].value, Some(number_data_point::Value::AsDouble(1.0)));
    assert_eq!(text(&g.data_points[0].attributes, "version"), Some(env!("CARGO_PKG_VERSION")));
    assert_eq!(find("gpustall.gpu_utilization").unit, "1");
    // No temperature was read: no metric without points.
    assert!(all.iter().all(|m| m.name != "gpustall.gpu_temperature"));
}

#[test]
fn empty_labels_are_absent_attributes() {
    let m = Metrics::new();
    m.set_job_identity(
        "python-42",
        &Identity { pod: Some("train-0".into()), ..Default::default() },
    );
    let req = metrics(&m.snapshot().unwrap(), &sender(), 5_000);
    let info = req.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .find(|m| m.name == "gpustall.job_info")
        .unwrap();
    let Some(Data::Gauge(g)) = &info.data else { panic!() };
    let a = &g.data_points[0].attributes;
    assert_eq!(text(a, "pod"), Some("train-0"));
    assert_eq!(attr(a, "namespace"), None, "{a:?}");
}

fn incident(verdict: Option<VerdictLine>, bundle: Result<String, String>) -> IncidentLog {
    IncidentLog {
        at_unix_ns: 2_000,
        kind: "oom_kill".into(),
        pid: 4242,
        more: 3,
        job: Some("torchrun-7".into()),
        identity: Identity {
            namespace: Some("ml".into()),
            pod: Some("train-0".into()),
            container: Some("trainer".into()),
            run_id: Some("r1".into()),
            rank: Some(1),
            world_size: Some(2),
            ..Default::default()
        },
        verdict,
        bundle,
    }
}

#[test]
fn an_incident_is_a_log_record_with_its_verdict_job_and_bundle() {
    let v = VerdictLine {
        cause: "memory_pressure".into(),
        title: "Host memory ran out".into(),
        severity: Severity::Failure,
        text: "worker 4242 grew to 3 GiB".into(),
        advice: vec!["num_workers=2".into()],
    };
    let req = logs(&[incident(Some(v), Ok("/var/lib/gpustall/incidents/x".into()))], &sender(), 9);
    let r = &req.resource_logs[0].scope_logs[0].log_records[0];
    assert_eq!(r.event_name, "gpustall.incident");
    assert_eq!((r.time_unix_nano, r.observed_time_unix_nano), (2_000, 9));
    assert_eq!(r.severity_text, "ERROR");
    let Some(Value::StringValue(body)) = r.body.as_ref().and_then(|b| b.value.as_ref()) else {
        panic!()
    };
    assert_eq!(body, "Host memory ran out: worker 4242 grew to 3 GiB");
    let a = &r.attributes;
    assert_eq!(text(a, "gpustall.incident.kind"), Some("oom_kill"));
    assert_eq!(attr(a, "process.pid"), Some(&Value::IntValue(4242)));
    assert_eq!(attr(a, "gpustall.incident.more"), Some(&Value::IntValue(3)));
    assert_eq!(text(a, "gpustall.training_job"), Some("torchrun-7"));
    assert_eq!(text(a, "k8s.namespace.name"), Some("ml"));
    assert_eq!(text(a, "k8s.pod.name"), Some("train-0"));
    assert_eq!(text(a, "k8s.container.name"), Some("trainer"));
    assert_eq!(text(a, "gpustall.torch.run_id"), Some("r1"));
    assert_eq!(attr(a, "gpustall.torch.rank"), Some(&Value::IntValue(1)));
    assert_eq!(attr(a, "gpustall.slurm.job_id"), None, "nothing invented");
    assert_eq!(text(a, "gpustall.verdict.cause"), Some("memory_pressure"));
    assert_eq!(text(a, "gpustall.bundle.path"), Some("/var/lib/gpustall/incidents/x"));
    let Some(Value::ArrayValue(advice)) = attr(a, "gpustall.verdict.advice") else { panic!() };
    assert_eq!(advice.values.len(), 1);
}

#[test]
fn an_incident_without_a_bundle_says_why() {
    let req = logs(&[incident(None, Err("disk full".into()))], &sender(), 9);
    let r = &req.resource_logs[0].scope_logs[0].log_records[0];
    assert_eq!(r.severity_text, "ERROR");
    assert_eq!(text(&r.attributes, "gpustall.bundle.error"), Some("disk full"));
    let Some(Value::StringValue(body)) = r.body.as_ref().and_then(|b| b.value.as_ref()) else {
        panic!()
    };
    assert!(body.contains("no bundle: disk full"), "{body}");
}
