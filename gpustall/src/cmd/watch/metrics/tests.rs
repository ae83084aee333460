//! Unit tests of the parent module.
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

fn jr(job: &str, role: &str) -> JobRole {
    JobRole { training_job: job.into(), role: role.into() }
}

/// Asserts that the exposition `t` has the sample line `series value`.
#[track_caller]
fn has(t: &str, series: &str, value: &str) {
    let line = format!("{series} {value}");
    assert!(t.lines().any(|l| l == line), "no line `{line}` in:\n{t}");
}

#[test]
fn encode_has_the_series_with_labels_and_values() {
    let m = Metrics::new();
    let w = jr("train-7", "worker");
    let d = ProcDelta {
        reclaim_stall_seconds: 1.5,
        reclaim_stalls: 3,
        swapout_pages: 100,
        swapout_bytes: 409_600,
        block_read_bytes: 4096,
        block_write_bytes: 8192,
        reclaim_io_bytes: 409_600,
        data_wait_seconds: 0.0,
        gpu_wait_seconds: 0.0,
    };
    m.add(&w, d);
    let trainer = jr("train-7", "trainer");
    m.add(
        &trainer,
        ProcDelta { data_wait_seconds: 2.5, gpu_wait_seconds: 7.25, ..Default::default() },
    );
    m.set_open_data_wait(&trainer, 40_000_000_000);
    m.add(&w, ProcDelta { reclaim_stall_seconds: 0.25, reclaim_stalls: 1, ..Default::default() });
    m.oom_kill(&w);
    m.set_memory(&jr("train-7", "trainer"), 10 << 30, 1 << 20);
    let gpu = GpuLabel { gpu: "0".into() };
    m.set_gpu(&gpu, 0.42, Some(71.0));
    m.gpu_stall(&gpu);
    m.set_watched(2, 17);
    m.incident("oom_kill", "train-7");
    m.set_lost_events("bulk_ring", 5);
    m.set_agent(0.5, 30 << 20);

    let t = m.encode();
    let w = r#"{training_job="train-7",role="worker"}"#;
    has(&t, &format!("gpustall_reclaim_stall_seconds_total{w}"), "1.75");
    has(&t, &format!("gpustall_reclaim_stalls_total{w}"), "4");
    has(&t, &format!("gpustall_swapout_pages_total{w}"), "100");
    has(&t, &format!("gpustall_swapout_bytes_total{w}"), "409600");
    has(&t, &format!("gpustall_block_read_bytes_total{w}"), "4096");
    has(&t, &format!("gpustall_block_write_bytes_total{w}"), "8192");
    has(&t, &format!("gpustall_reclaim_io_bytes_total{w}"), "409600");
    has(&t, &format!("gpustall_oom_kills_total{w}"), "1");
    let tr = r#"{training_job="train-7",role="trainer"}"#;
    has(&t, &format!("gpustall_process_resident_bytes{tr}"), "10737418240");
    has(&t, &format!("gpustall_process_swap_bytes{tr}"), "1048576");
    has(&t, &format!("gpustall_data_wait_seconds_total{tr}"), "2.5");
    has(&t, &format!("gpustall_gpu_wait_seconds_total{tr}"), "7.25");
    has(&t, &format!("gpustall_data_wait_open_seconds{tr}"), "40.0");
    has(&t, r#"gpustall_gpu_utilization_ratio{gpu="0"}"#, "0.42");
    has(&t, r#"gpustall_gpu_temperature_celsius{gpu="0"}"#, "71.0");
    has(&t, r#"gpustall_gpu_stall_episodes_total{gpu="0"}"#, "1");
    has(&t, "gpustall_watched_jobs", "2");
    has(&t, "gpustall_watched_processes", "17");
    has(&t, r#"gpustall_incidents_total{kind="oom_kill",training_job="train-7"}"#, "1");
    has(&t, r#"gpustall_lost_events_total{reason="bulk_ring"}"#, "5");
    has(&t, "gpustall_agent_cpu_seconds_total", "0.5");
    has(&t, "gpustall_agent_resident_memory_bytes", "31457280");
    // Help on every family, units where they apply, and a complete exposition.
    assert!(t.contains("# HELP gpustall_reclaim_stall_seconds Time processes"));
    assert!(t.contains("# UNIT gpustall_reclaim_stall_seconds seconds"));
    assert!(t.contains("# TYPE gpustall_oom_kills counter"));
    assert!(t.contains("# TYPE gpustall_process_resident_bytes gauge"));
    assert_eq!(t.matches("# HELP ").count(), t.matches("# TYPE ").count());
    assert!(t.ends_with("# EOF\n"));
}

#[test]
fn label_values_are_escaped() {
    let m = Metrics::new();
    m.oom_kill(&jr("a\"b\\c\nd", "worker"));
    has(&m.encode(), r#"gpustall_oom_kills_total{training_job="a\"b\\c\nd",role="worker"}"#, "1");
}

#[test]
fn forget_job_removes_only_that_jobs_series() {
    let m = Metrics::new();
    let pages = |n| ProcDelta { swapout_pages: n, ..Default::default() };
    for role in ["trainer", "worker"] {
        m.add(&jr("gone", role), pages(1));
        m.set_memory(&jr("gone", role), 1, 2);
    }
    m.oom_kill(&jr("gone", "worker"));
    m.set_open_data_wait(&jr("gone", "trainer"), 3_000_000_000);
    // Every family a job has, its cgroup's included (each declared once: see `families`).
    m.set_job_cgroup("gone", &cgroup::tests::cg(3, 1_000), None);
    m.set_job_cgroup("gone", &cgroup::tests::cg(7, 2_000), None);
    m.add(&jr("kept", "trainer"), pages(7));

    m.forget_job("gone");
    let t = m.encode();
    assert!(!t.contains(r#"job="gone""#), "{t}");
    has(&t, r#"gpustall_swapout_pages_total{training_job="kept",role="trainer"}"#, "7");
    // The metadata stays; a job seen again starts from zero.
    assert!(t.contains("# TYPE gpustall_swapout_pages counter"));
    m.oom_kill(&jr("gone", "worker"));
    has(&m.encode(), r#"gpustall_oom_kills_total{training_job="gone",role="worker"}"#, "1");
    m.forget_job("never-seen");
}

#[test]
fn cumulative_totals_only_add_differences() {
    let m = Metrics::new();
    let lost = r#"gpustall_lost_events_total{reason="map_full"}"#;
    m.set_lost_events("map_full", 10);
    m.set_lost_events("map_full", 10);
    has(&m.encode(), lost, "10");
    // A smaller total (the source was reset) neither decreases the counter nor panics ...
    m.set_lost_events("map_full", 4);
    has(&m.encode(), lost, "10");
    // ... and becomes the base for what follows.
    m.set_lost_events("map_full", 6);
    has(&m.encode(), lost, "12");
    m.set_lost_events("map_full", u64::MAX);
    m.set_lost_events("map_full", 0);

    for cpu in [2.0, 1.0, f64::NAN, -5.0, f64::INFINITY, 1.5] {
        m.set_agent(cpu, 1);
    }
    has(&m.encode(), "gpustall_agent_cpu_seconds_total", "2.5");
}

#[test]
fn odd_inputs_are_tamed() {
    let m = Metrics::new();
    let gpu = GpuLabel { gpu: "1".into() };
    m.set_gpu(&gpu, 1.7, Some(60.0));
    m.set_gpu(&gpu, f64::NAN, None);
    let t = m.encode();
    has(&t, r#"gpustall_gpu_utilization_ratio{gpu="1"}"#, "1.0");
    assert!(!t.contains("gpustall_gpu_temperature_celsius{"), "{t}");
    m.add(&jr("j", "trainer"), ProcDelta { reclaim_stall_seconds: -1.0, ..Default::default() });
    has(
        &m.encode(),
        r#"gpustall_reclaim_stall_seconds_total{training_job="j",role="trainer"}"#,
        "0.0",
    );
}

/// Sends `request` over a fresh connection and returns the whole response.
async fn http(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("send the request");
    let mut buf = Vec::new();
    let read = s.read_to_end(&mut buf);
    let read = tokio::time::timeout(Duration::from_secs(10), read).await;
    read.expect("a response within 10 s").expect("read the response");
    String::from_utf8(buf).expect("a UTF-8 response")
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
}

#[tokio::test]
async fn serves_metrics_over_http() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local address");
    let metrics = Arc::new(Metrics::new());
    metrics.oom_kill(&jr("job", "worker"));
    let server = tokio::spawn(serve(listener, Arc::clone(&metrics)));

    let r = http(addr, &get("/metrics")).await;
    let (head, body) = r.split_once("\r\n\r\n").expect("a header and a body");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    let ct = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-type").then(|| value.trim())
    });
    assert_eq!(ct, Some(OPENMETRICS_CONTENT_TYPE));
    has(body, r#"gpustall_oom_kills_total{training_job="job",role="worker"}"#, "1");
    assert!(body.ends_with("# EOF\n"));

    let r = http(addr, &get("/")).await;
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n") && r.contains("/metrics"), "{r}");
    let r = http(addr, &get("/nope")).await;
    assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"), "{r}");
    let r = http(
        addr,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{r}");

    // A garbage request is that connection's problem only.
    let r = http(addr, "NOT HTTP AT ALL\r\n\r\n").await;
    assert!(r.is_empty() || r.starts_with("HTTP/1.1 400"), "{r}");
    let r = http(addr, &get("/metrics")).await;
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");

    assert!(!server.is_finished());
    server.abort();
}

/// An exposition with every family the agent exports holding a series.
fn every_series() -> String {
    let m = Metrics::new();
    let w = jr("train-7", "dataloader_worker");
    m.add(&w, ProcDelta { reclaim_stall_seconds: 1.0, reclaim_stalls: 1, ..Default::default() });
    m.oom_kill(&w);
    m.set_memory(&w, 1 << 30, 1 << 20);
    m.set_open_data_wait(&jr("train-7", "trainer"), 0);
    let gpu = GpuLabel { gpu: "0".into() };
    m.set_gpu(&gpu, 0.5, Some(60.0));
    m.gpu_stall(&gpu);
    m.gpu_xid("0000:3b:00", 79, 1);
    m.set_watched(1, 4);
    m.incident("oom_kill", "train-7");
    m.set_lost_events("bulk_ring", 1);
    m.set_agent(0.5, 40 << 20);
    m.set_flight_recorder(1 << 20, 64 << 20, 3);
    m.otlp_enabled("logs");
    // A cgroup v2 job: its limit, events and PSI.
    let cg = super::cgroup::tests::cg(0, 5);
    let forecast = crate::model::limit_clock::Forecast {
        seconds: 300.0,
        rate_bytes_s: 1e6,
        level_bytes: 1 << 29,
        limit_bytes: 1 << 30,
        at_ns: 0,
    };
    m.set_job_cgroup("train-7", &cg, Some(forecast));
    m.set_job_identity("train-7", &crate::model::identity::Identity::default());
    m.encode()
}

/// The gpustall_ metric names in `text` (PromQL in the deploy files).
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let re = regex::Regex::new(r"\bgpustall_[a-z0-9_]+").expect("regex");
    re.find_iter(text).map(|m| m.as_str().to_string()).collect()
}

/// Strings under the keys Grafana keeps PromQL in (panel targets, variables, annotations).
fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, v) in o {
                match (k.as_str(), v.as_str()) {
                    ("expr" | "query" | "definition", Some(q)) => out.push(q.to_string()),
                    _ => queries(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| queries(v, out)),
        _ => {}
    }
}

/// Asserts every name is a series of the exposition.
#[track_caller]
fn all_exported(names: &std::collections::BTreeSet<String>, what: &str) {
    let exposition = every_series();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| {
            !exposition.lines().any(|l| {
                l.strip_prefix(n.as_str()).is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
            })
        })
        .collect();
    assert!(missing.is_empty(), "{what} uses metrics gpustall does not export: {missing:?}");
}

#[test]
fn every_metric_the_dashboard_queries_is_exported() {
    let text = include_str!("../../../../../deploy/grafana/gpustall-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(text).expect("dashboard json");
    let mut q = Vec::new();
    queries(&dash, &mut q);
    assert!(
        q.iter().any(|q| q.contains("DCGM_FI_DEV_GPU_UTIL")),
        "GPU utilisation from dcgm-exporter"
    );
    let names = metric_names(&q.join("\n"));
    assert!(names.len() >= 18, "the dashboard covers the exporter: {names:?}");
    // Nodes come from the agents' own build_info, not a `node` label only a relabelling adds.
    let vars = dash["templating"]["list"].as_array().expect("variables");
    let node = vars.iter().find(|v| v["name"] == "node").expect("a node variable");
    assert_eq!(node["definition"], "label_values(gpustall_build_info, hostname)");
    assert!(!text.contains("node=~"), "no query needs a relabelled node label");
    all_exported(&names, "the dashboard");
}

#[test]
fn every_metric_the_alerts_use_is_exported() {
    let text = include_str!("../../../../../deploy/prometheus/gpustall-alerts.yml");
    let names = metric_names(text);
    assert!(names.contains("gpustall_oom_kills_total"), "{names:?}");
    all_exported(&names, "the alerting rules");
}

#[test]
fn the_flight_recorder_and_its_budget_are_exported() {
    let m = Metrics::new();
    m.set_flight_recorder(1000, 64 << 20, 3);
    m.set_flight_recorder(2000, 64 << 20, 5);
    let t = m.encode();
    has(&t, "gpustall_flight_recorder_bytes", "2000");
    has(&t, "gpustall_agent_memory_budget_bytes", "67108864");
    has(&t, "gpustall_flight_recorder_dropped_lines_total", "5");
}

/// A job's counters exist at zero from its first update on: an OOM kill is then an increase
/// Prometheus sees, not a series born at 1.
#[test]
fn a_new_jobs_series_start_at_zero() {
    let m = Metrics::new();
    m.set_memory(&jr("j", "dataloader_worker"), 1, 0);
    let t = m.encode();
    has(&t, r#"gpustall_oom_kills_total{training_job="j",role="dataloader_worker"}"#, "0");
    has(
        &t,
        r#"gpustall_reclaim_stall_seconds_total{training_job="j",role="dataloader_worker"}"#,
        "0.0",
    );
    let gpu = GpuLabel { gpu: "1".into() };
    m.set_gpu(&gpu, 0.9, None);
    has(&m.encode(), r#"gpustall_gpu_stall_episodes_total{gpu="1"}"#, "0");
}

#[test]
fn a_jobs_identity_is_one_info_series_replaced_when_it_changes() {
    use crate::model::identity::Identity;
    let m = Metrics::new();
    let id = Identity {
        namespace: Some("ml-team".into()),
        pod: Some("train-7f9c".into()),
        container: Some("trainer".into()),
        run_id: Some("run-1".into()),
        world_size: Some(2),
        ..Default::default()
    };
    m.set_job_identity("train-7", &id);
    let series = r#"gpustall_job_info{training_job="train-7",namespace="ml-team",pod="train-7f9c",container="trainer",slurm_job="",run_id="run-1",rank="",world_size="2"}"#;
    has(&m.encode(), series, "1");
    m.set_job_identity("train-7", &Identity { slurm_job: Some("42".into()), ..id });
    let text = m.encode();
    assert!(!text.contains(series), "the old labels are gone:\n{text}");
    assert!(text.contains(r#"slurm_job="42""#), "{text}");
    m.forget_job("train-7");
    assert!(!m.encode().contains("gpustall_job_info{"), "forgotten with its job");
}

#[test]
fn build_info_names_the_version_the_kernel_and_the_node() {
    let text = Metrics::new().encode();
    let want = format!("gpustall_build_info{{version=\"{}\",kernel=\"", env!("CARGO_PKG_VERSION"));
    let node = format!(",hostname=\"{}\"}} 1", crate::sources::host::node_name());
    assert!(text.lines().any(|l| l.starts_with(&want) && l.ends_with(&node)), "{text}");
}
