//! Property test of every text output against names from the job's world: a real recording
//! (`trace-v1.jsonl`, an OOM kill of a DataLoader worker) with every process name, command
//! line, exec'd file, path, identity and kernel-log text replaced by arbitrary bytes, replayed
//! and written out as each output gpustall has: the text report and a bundle's report.txt, the
//! HTML page, the summary JSON, the Perfetto trace, merge's text and page, the status line, the
//! lines `trace --report-to-job` appends to the job's output, a Prometheus info series and an
//! OTLP log record. None may hold a control character (a text output's own newlines aside),
//! and a name may not add a line.

use crate::model::untrusted::is_clean_text;

const RECORDING: &str = include_str!("../recording/testdata/trace-v1.jsonl");

/// Keys whose string values come from the job's world in the recording.
const NAME_KEYS: [&str; 7] =
    ["comm", "new_comm", "victim_comm", "target_comm", "cmdline", "filename", "path"];

/// The recording with every value of [`NAME_KEYS`] replaced by `name` (one per process name, so
/// the roles stay apart: a worker keeps "pt_data_worker" in front), and a kernel-log line and
/// an identity naming the job added.
fn recording_with(name: &str) -> String {
    let mut out = String::new();
    for line in RECORDING.lines() {
        let mut v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        if let Some(o) = v.as_object_mut() {
            for key in NAME_KEYS {
                if let Some(serde_json::Value::String(s)) = o.get_mut(key) {
                    // Workers keep their prefix so they are still found as workers.
                    *s = if s.starts_with("pt_data_worker") {
                        format!("pt_data_worker{name}")
                    } else {
                        format!("{name}{}", &s[..s.len().min(3)])
                    };
                }
            }
        }
        out.push_str(&v.to_string());
        out.push('\n');
        if v["kind"] == "seed" {
            let t = v["t_ns"].as_u64().unwrap_or(0);
            let pid = v["pid"].as_u64().unwrap_or(0);
            let extra = [
                serde_json::json!({"type":"sample","kind":"identity","t_ns":t,"pid":pid,
                    "pod":name,"namespace":name,"container":name,"run_id":name,
                    "slurm_user":name,"master":name,"rank":0,"world_size":2}),
                serde_json::json!({"type":"sample","kind":"kernel_log","t_ns":t + 1,"seq":7,
                    "what":"gpu_xid","pid":pid,"comm":name,"device":name,"xid":79,
                    "text":format!("NVRM: Xid (PCI:{name}): 79, pid={pid}, name={name}, fell off")}),
            ];
            for e in extra {
                out.push_str(&e.to_string());
                out.push('\n');
            }
        }
    }
    out
}

/// Every output of one recording, by name (`name`: the name the recording holds).
fn outputs(recording: &str, name: &str) -> Vec<(&'static str, String)> {
    let dir = std::env::temp_dir().join(format!(
        "gpustall-untrusted-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("record.jsonl");
    std::fs::write(&file, recording).expect("writing the recording");

    let r = crate::recording::replay::replay(recording.as_bytes());
    assert!(r.error.is_none(), "{:?}", r.error);
    let summary = crate::pipeline::conclude::summary(&r.model, r.end_ns, true);
    let timeline = crate::output::timeline::from_file(&file, usize::MAX).expect("timeline");
    let report = crate::output::text::render(&summary);
    // `trace --report-to-job`: what goes to the end of the job's own output, as written.
    let rest = std::path::PathBuf::from(format!("/var/lib/gpustall/slurm/{name}"));
    let to_job = crate::output::job_stderr::verdict_lines(&report, &[&rest]);
    let mut out = vec![
        ("report.txt", crate::model::untrusted::lines(&report).into_owned()),
        ("text report", report),
        ("html", crate::output::html::render(&summary, &timeline)),
        ("summary json", serde_json::to_string_pretty(&summary).expect("json")),
        ("perfetto", crate::output::perfetto::render(&timeline).to_string()),
        ("status line", crate::output::status_line::waiting_part(&r.model)),
        ("limit forecast", crate::output::status_line::limit_part(&r.model)),
    ];

    out.push(("job's output", crate::model::untrusted::lines(&to_job).into_owned()));

    let (lane, err) = crate::pipeline::lanes::load(&file, true).expect("merge load");
    assert!(err.is_none(), "{err:?}");
    let mut lanes = vec![lane];
    let (verdict, warnings) = crate::pipeline::lanes::conclude_job(&mut lanes, 1_000_000_000);
    out.push(("merge text", crate::output::merged::text(&lanes, &verdict, &warnings)));
    out.push(("merge html", crate::output::merged::html_page(&lanes, &verdict, &warnings)));

    // The daemon's outputs, given the raw name as the job's name and bundle path (they are
    // made from the job's process name) and the identity as read.
    let identity = r.model.job_identity().unwrap_or_default();
    let metrics = crate::cmd::watch::metrics::Metrics::new();
    metrics.set_job_identity(name, &identity);
    out.push(("prometheus", metrics.encode()));
    out.push(("otlp", otlp_strings(&summary, &identity, name)));

    let _ = std::fs::remove_dir_all(&dir);
    out
}

#[test]
fn arbitrary_bytes_as_names_reach_no_output_as_control_characters() {
    let plain: Vec<(&str, usize)> = outputs(&recording_with("name"), "name")
        .into_iter()
        .map(|(k, v)| (k, v.lines().count()))
        .collect();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut names: Vec<String> = vec![
        "\x1b]0;owned\x07".into(),
        "\x1b]52;c;Y2xpcA==\x07".into(),
        "\x1b[2J\x1b[H".into(),
        "a\ngpustall: wrote incident bundle /tmp/x (fake)".into(),
        "\r\u{9b}31m\u{202e}\u{2028}".into(),
    ];
    for _ in 0..20 {
        let len = 1 + (xorshift(&mut seed) % 24) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| xorshift(&mut seed) as u8).collect();
        names.push(String::from_utf8_lossy(&bytes).into_owned());
    }
    for name in &names {
        let outs = outputs(&recording_with(name), name);
        // The name is there, shown: the report still says who was killed.
        let shown = crate::model::untrusted::one_line(name);
        assert!(outs[1].1.contains(&format!("pt_data_worker{shown}")), "{}", outs[1].1);
        for ((what, text), (_, plain_lines)) in outs.iter().zip(&plain) {
            let bad = text.chars().find(|&c| !is_clean_text(&c.to_string()));
            assert!(bad.is_none(), "{what} holds {bad:?} for the name {name:?}:\n{text}");
            assert_eq!(text.lines().count(), *plain_lines, "{what}: a line added by {name:?}");
        }
    }
}

/// Every string an OTLP log record of the incident carries (body and attributes), a line each.
fn otlp_strings(
    summary: &crate::output::summary::Summary,
    identity: &crate::model::identity::Identity,
    name: &str,
) -> String {
    use crate::cmd::watch::otlp;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let v = &summary.verdict;
    let log = otlp::IncidentLog {
        at_unix_ns: 1,
        kind: "oom_kill".into(),
        pid: 1,
        more: 0,
        job: Some(name.to_string()),
        identity: identity.clone(),
        verdict: Some(otlp::VerdictLine {
            cause: v.cause.to_string(),
            title: v.cause.title().to_string(),
            severity: v.cause.severity(),
            text: v.text.clone(),
            advice: v.advice.clone(),
        }),
        bundle: Ok(format!("/var/lib/gpustall/{name}")),
    };
    let from = otlp::Sender {
        node: "node".into(),
        started_unix_ns: 0,
        k8s_node: false,
        resource: Vec::new(),
    };
    let req = otlp::logs(&[log], &from, 2);
    let record = &req.resource_logs[0].scope_logs[0].log_records[0];
    let values = record.attributes.iter().filter_map(|kv| kv.value.as_ref());
    let mut strings = Vec::new();
    for value in record.body.iter().chain(values) {
        match &value.value {
            Some(Value::StringValue(s)) => strings.push(s.clone()),
            Some(Value::ArrayValue(a)) => {
                for item in &a.values {
                    if let Some(Value::StringValue(s)) = &item.value {
                        strings.push(s.clone());
                    }
                }
            }
            _ => {}
        }
    }
    strings.join("\n")
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}
