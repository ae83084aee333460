//! The one sanitiser for strings from the job's world: process names (the kernel lets a process
//! name itself anything with `prctl(PR_SET_NAME)`), command lines, paths, pod and run names,
//! kernel-log text. Raw, a name holding `ESC ] 0 ; title BEL`, `ESC [ 2 J` or OSC 52 would act
//! on the operator's terminal, and one holding a newline would forge lines in the daemon's log.
//! Every control character is shown as `\xNN` (as /dev/kmsg and the kernel's own `%pE` print
//! them): the C0 set, DEL and the C1 set (U+0080-U+009F, which some terminals obey as the
//! 8-bit forms of ESC sequences). Unicode's text-direction overrides and line separators, which
//! reorder or break what a reader sees without being control characters, are shown as `\u{NNNN}`.
//!
//! The model stores names through [`one_line`], so every output (text, JSON, HTML, Prometheus,
//! OTLP) starts from clean names; the writers to a terminal, a log or a file pass what they
//! write through [`lines`] as well, for text that reached them another way (another node's
//! summary in a merge, an error naming a path).

use std::borrow::Cow;
use std::fmt::Write as _;

/// Characters that reorder or break a line without being control characters: the bidirectional
/// embeddings, overrides and isolates ("Trojan Source"), and the line and paragraph separators.
fn is_layout_char(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}')
}

fn needs_escape(c: char, keep_newlines: bool) -> bool {
    (c.is_control() && !(keep_newlines && c == '\n')) || is_layout_char(c)
}

fn escape(s: &str, keep_newlines: bool) -> Cow<'_, str> {
    if !s.chars().any(|c| needs_escape(c, keep_newlines)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !needs_escape(c, keep_newlines) {
            out.push(c);
        } else if (c as u32) < 0x100 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:04x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// `s` as one line: every control character, newlines included, as `\xNN`.
pub fn one_line(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

/// [`one_line`] into an owned `String`: what the model stores.
pub fn name(s: &str) -> String {
    one_line(s).into_owned()
}

/// A text of several lines (a report) as it may be written: its own newlines kept, every other
/// control character as `\xNN`.
pub fn lines(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

/// `v` with every string in it, at any depth, shown by [`one_line`]; `None` when no string
/// needed it (the usual case: nothing is copied). For the samples that carry the job's names
/// and paths (a process found at the start, a command line, an identity, a context sample with
/// cgroup and mount paths and the names of the host's busiest processes, a kernel-log line):
/// every string field, including those added later, is covered without a list to keep.
pub fn cleaned<T: serde::Serialize + serde::de::DeserializeOwned>(v: &T) -> Option<T> {
    let mut value = serde_json::to_value(v).ok()?;
    clean_json(&mut value).then(|| serde_json::from_value(value).ok()).flatten()
}

/// Cleans every string (and object key) in `v`, at any depth; whether any changed.
pub fn clean_json(v: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::String(s) => match one_line(s) {
            Cow::Owned(o) => {
                *s = o;
                true
            }
            Cow::Borrowed(_) => false,
        },
        Value::Array(a) => a.iter_mut().fold(false, |changed, x| clean_json(x) | changed),
        Value::Object(m) => {
            let dirty_keys = m.keys().any(|k| matches!(one_line(k), Cow::Owned(_)));
            if dirty_keys {
                *m = std::mem::take(m).into_iter().map(|(k, v)| (name(&k), v)).collect();
            }
            m.values_mut().fold(dirty_keys, |changed, x| clean_json(x) | changed)
        }
        _ => false,
    }
}

/// Whether `s` holds nothing [`lines`] would escape: what the tests assert of every output.
#[cfg(test)]
pub fn is_clean_text(s: &str) -> bool {
    !s.chars().any(|c| needs_escape(c, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_sequences_are_shown_not_obeyed() {
        assert_eq!(one_line("a\x1b]0;title\x07b"), "a\\x1b]0;title\\x07b");
        assert_eq!(one_line("\x1b[2J"), "\\x1b[2J");
        assert_eq!(one_line("x\u{9b}31m"), "x\\x9b31m");
        assert_eq!(one_line("del\x7f"), "del\\x7f");
    }

    #[test]
    fn a_newline_in_a_name_cannot_start_a_line() {
        assert_eq!(one_line("py\ngpustall: fake"), "py\\x0agpustall: fake");
        assert_eq!(lines("report\nline\r\n"), "report\nline\\x0d\n");
    }

    #[test]
    fn direction_overrides_are_shown() {
        assert_eq!(one_line("a\u{202e}b\u{2028}"), "a\\u{202e}b\\u{2028}");
    }

    #[test]
    fn clean_names_are_borrowed_untouched() {
        assert!(matches!(one_line("pt_data_worker ü 日本"), Cow::Borrowed(_)));
        assert!(is_clean_text("two\nlines"));
        assert!(!is_clean_text("bell\x07"));
    }

    /// Every string of every byte sequence comes out clean, and as one line.
    #[test]
    fn arbitrary_bytes_come_out_clean() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..5000 {
            let len = (xorshift(&mut seed) % 40) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| xorshift(&mut seed) as u8).collect();
            let s = String::from_utf8_lossy(&bytes);
            let shown = one_line(&s);
            assert!(is_clean_text(&shown) && !shown.contains('\n'), "{bytes:?} -> {shown:?}");
        }
    }

    /// Live, names reach the model without a recording: a process that renamed itself with
    /// an escape sequence and a newline is stored shown, and so is every name in a sample.
    #[test]
    fn the_model_stores_names_shown_live() {
        use crate::model::samples::Sample;
        let mut m = crate::model::Model::default();
        let comm = "py\x1b]0;t\x07\nfake".to_string();
        m.observe(&Sample::Seed { t_ns: 1, pid: 10, ppid: 1, comm: comm.clone(), is_target: true });
        m.observe(&Sample::Cmdline { t_ns: 1, pid: 10, cmdline: format!("python {comm}") });
        let n = m.tree.get(10).expect("seeded");
        assert_eq!(n.comm, "py\\x1b]0;t\\x07\\x0afake");
        assert!(n.cmdline.as_deref().is_some_and(|c| !c.contains('\x1b') && !c.contains('\n')));
        // A rename and an OOM kill, as events decoded from the kernel.
        let h = crate::model::event::Header { t_ns: 2, pid: 10, tid: 10, comm: comm.clone() };
        m.apply(&crate::model::event::Event::Rename {
            h,
            renamed_tid: 10,
            new_comm: "w\u{9b}2J".into(),
        });
        assert_eq!(m.tree.get(10).expect("seeded").comm, "w\\x9b2J");
    }

    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }
}
