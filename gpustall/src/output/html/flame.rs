//! The flame graphs of the job's Python stacks on CPU, drawn by inferno, each in a frame of
//! its own inside the page.

use std::fmt::Write as _;

use super::esc;
use crate::output::summary::Summary;

/// One flame graph per role of the job's Python processes' on-CPU stacks (the summary's
/// folded lines), drawn by inferno, each in a frame of its own ([`framed`]).
pub fn graphs(o: &mut String, summary: &Summary) {
    use crate::model::proctree::Role;
    let roles: [(&str, &[Role]); 2] = [
        ("The trainer's and ranks' Python stacks on CPU", &[Role::Trainer, Role::Rank]),
        ("The DataLoader workers' Python stacks on CPU", &[Role::DataloaderWorker]),
    ];
    for (title, roles) in roles {
        let mut lines: std::collections::BTreeMap<&str, u64> = Default::default();
        for p in summary.processes.iter().filter(|p| roles.contains(&p.role)) {
            for (stack, n) in p.py_stacks.iter().flat_map(|s| &s.folded) {
                *lines.entry(stack.as_str()).or_default() += n;
            }
        }
        if let Some(svg) = flame_graph(title, &lines) {
            let _ = write!(o, "<h2>{}</h2>{}", esc(title), framed(title, &svg));
        }
    }
}

/// The SVG element inferno draws for folded `lines`, or `None` without any.
fn flame_graph(title: &str, lines: &std::collections::BTreeMap<&str, u64>) -> Option<String> {
    if lines.is_empty() {
        return None;
    }
    let folded: Vec<String> = lines.iter().map(|(s, n)| format!("{s} {n}")).collect();
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = "samples".to_string();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, folded.iter().map(String::as_str), &mut svg).ok()?;
    let svg = String::from_utf8(svg).ok()?;
    // Inline in the page: the element without its XML prolog and doctype.
    svg.find("<svg").map(|at| svg[at..].to_string())
}

/// A flame graph's SVG in a frame of its own: its script takes the page's first SVG for its
/// own and refits it, and its style sets every SVG text's font (a page's first chart shrank to
/// 300 px, all charts' text turned 12 px monospace). `srcdoc` keeps the page one file; the
/// frame runs the flame graph's script (zoom, search) and nothing of the page's.
fn framed(title: &str, svg: &str) -> String {
    let height = svg.split("height=\"").nth(1).and_then(|h| h.split('"').next()?.parse().ok());
    // As wide as the frame: its script, made for an SVG file of its own, drops the width.
    let doc = format!(
        r#"<!doctype html><html><head><style>body{{margin:0}} svg{{width:100%}}</style></head><body>{svg}</body></html>"#
    );
    format!(
        r#"<iframe class="flame" sandbox="allow-scripts" title="{}" style="height:{}px" srcdoc="{}"></iframe>"#,
        esc(title),
        height.unwrap_or(600u32),
        doc.replace('&', "&amp;").replace('"', "&quot;")
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_flame_graph_is_an_inline_svg_whose_frames_cannot_inject_markup() {
        let lines = [
            ("main (train.py:3);decode (ds.py:9)", 7),
            ("main (train.py:3);<script>alert(1)</script> (x.py:1)", 2),
        ]
        .into_iter()
        .collect();
        let svg = super::flame_graph("workers", &lines).expect("drawn");
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.contains("decode (ds.py:9)"), "the frame is named");
        assert!(!svg.contains("<script>alert"), "escaped");
        assert!(super::flame_graph("none", &Default::default()).is_none());
        // In a frame of its own: the page's markup around it is whole, its quotes escaped.
        let frame = super::framed("workers", &svg);
        let srcdoc = frame.split(r#"srcdoc=""#).nth(1).expect("srcdoc");
        assert_eq!(srcdoc.find('"'), Some(srcdoc.len() - r#""></iframe>"#.len()), "{frame}");
        assert!(!frame.contains("&lt;script&gt;alert"), "escaped twice: {frame}");
        assert!(frame.contains("&amp;lt;script&amp;gt;alert"), "{frame}");
    }
}
