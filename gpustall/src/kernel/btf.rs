//! Offsets inside kernel structures, from the running kernel's BTF. Tracepoint formats do not
//! carry a process's exit code; `task_struct.exit_code` does, read in sched_process_exit.

use btf_rs::{Btf, Type};

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// Byte offset of `member` in `struct name`, looking through anonymous structs and unions
/// (randomized layouts wrap fields in one).
pub fn member_offset(btf: &Btf, name: &str, member: &str) -> Option<u32> {
    let types = btf.resolve_types_by_name(name).ok()?;
    types.iter().find_map(|t| match t {
        Type::Struct(s) => find_in(btf, s, member, 0),
        _ => None,
    })
}

/// The size in bytes of `struct name`.
pub fn struct_size(btf: &Btf, name: &str) -> Option<usize> {
    let types = btf.resolve_types_by_name(name).ok()?;
    types.iter().find_map(|t| match t {
        Type::Struct(s) => Some(s.size()),
        _ => None,
    })
}

/// Whether `enum name` has a member `member` (`bpf_func_id` names the helpers this kernel has).
pub fn enum_has(btf: &Btf, name: &str, member: &str) -> bool {
    let Ok(types) = btf.resolve_types_by_name(name) else { return false };
    types.iter().any(|t| match t {
        Type::Enum(e) => e.members.iter().any(|m| btf.resolve_name(m).is_ok_and(|n| n == member)),
        _ => false,
    })
}

fn find_in(btf: &Btf, s: &btf_rs::Struct, member: &str, base_bits: u32) -> Option<u32> {
    for m in &s.members {
        let bits = base_bits + m.bit_offset();
        let mname = btf.resolve_name(m).unwrap_or_default();
        if mname == member {
            return Some(bits / 8);
        }
        if mname.is_empty() {
            if let Ok(Type::Struct(inner) | Type::Union(inner)) = btf.resolve_chained_type(m) {
                if let Some(off) = find_in(btf, &inner, member, bits) {
                    return Some(off);
                }
            }
        }
    }
    None
}

/// `task_struct.exit_code`, or `None` (with the reason logged) when BTF lacks it.
pub fn task_exit_code_offset(btf: &Btf) -> Option<u32> {
    let off = member_offset(btf, "task_struct", "exit_code");
    if off.is_none() {
        log::warn!("task_struct.exit_code not in BTF: exit codes will be unknown");
    }
    off
}

/// `task_struct.se.sum_exec_runtime`: the thread's CPU time, as the scheduler last updated it.
pub fn cpu_time_offset(btf: &Btf) -> Option<u32> {
    let se = member_offset(btf, "task_struct", "se")?;
    Some(se + member_offset(btf, "sched_entity", "sum_exec_runtime")?)
}

/// The running kernel's BTF, or why it cannot be read (a kernel built without
/// CONFIG_DEBUG_INFO_BTF): the typed programs then fall back to classic tracepoints.
///
/// Read whole first, then parsed from memory: parsed from the file, btf-rs seeks before each of
/// its small reads (126,000 `lseek` calls on 6.18's BTF, a few per cent of the start-up CPU;
/// the verifier's work on the programs is most of the rest).
pub fn open() -> Result<Btf, String> {
    let bytes = std::fs::read(VMLINUX).map_err(|e| format!("cannot read {VMLINUX}: {e}"))?;
    Btf::from_bytes(&bytes).map_err(|e| format!("cannot read {VMLINUX}: {e}"))
}

/// The task fields the typed programs read (see `gpustall_common::task`).
pub fn task_offsets(btf: &Btf) -> gpustall_common::task::TaskOffsets {
    use gpustall_common::task::UNKNOWN;
    let at = |s: &str, m: &str| member_offset(btf, s, m).unwrap_or(UNKNOWN);
    gpustall_common::task::TaskOffsets {
        task_pid: at("task_struct", "pid"),
        task_tgid: at("task_struct", "tgid"),
        task_comm: at("task_struct", "comm"),
        task_signal: at("task_struct", "signal"),
        signal_live: at("signal_struct", "live"),
        siginfo_code: at("kernel_siginfo", "si_code"),
    }
}

/// The block-layer fields the typed block programs read (see `gpustall_common::blocklayout`).
pub fn block_layout(btf: &Btf) -> gpustall_common::blocklayout::BlockLayout {
    use gpustall_common::blocklayout::{BlockLayout, UNKNOWN};
    let at = |s: &str, m: &str| member_offset(btf, s, m);
    // `bio.bi_iter` is a `struct bvec_iter`: its fields' offsets add to the iterator's.
    let in_iter = |m: &str| Some(at("bio", "bi_iter")? + at("bvec_iter", m)?);
    let or_unknown = |o: Option<u32>| o.unwrap_or(UNKNOWN);
    BlockLayout {
        bio_bdev: or_unknown(at("bio", "bi_bdev")),
        bio_opf: or_unknown(at("bio", "bi_opf")),
        bio_sector: or_unknown(in_iter("bi_sector")),
        bio_size: or_unknown(in_iter("bi_size")),
        bdev_disk: or_unknown(at("block_device", "bd_disk")),
        disk_major: or_unknown(at("gendisk", "major")),
        disk_first_minor: or_unknown(at("gendisk", "first_minor")),
        rq_q: or_unknown(at("request", "q")),
        q_disk: or_unknown(at("request_queue", "disk")),
        rq_sector: or_unknown(at("request", "__sector")),
        rq_cmd_flags: or_unknown(at("request", "cmd_flags")),
        task_flags: or_unknown(at("task_struct", "flags")),
    }
}

/// The C types of a tracepoint's arguments as this kernel declares them (its
/// `btf_trace_<event>` typedef, less the leading `void *__data`), e.g. `["int",
/// "struct kernel_siginfo *", "struct task_struct *", "int", "int"]` for signal_generate;
/// `None` when BTF has no such tracepoint.
pub fn tracepoint_args(btf: &Btf, event: &str) -> Option<Vec<String>> {
    let types = btf.resolve_types_by_name(&format!("btf_trace_{event}")).ok()?;
    let Some(Type::Typedef(td)) = types.into_iter().find(|t| matches!(t, Type::Typedef(_))) else {
        return None;
    };
    let Ok(Type::Ptr(ptr)) = btf.resolve_chained_type(&td) else { return None };
    let Ok(Type::FuncProto(proto)) = btf.resolve_chained_type(&ptr) else { return None };
    proto
        .parameters
        .iter()
        .skip(1)
        .map(|p| btf.resolve_chained_type(p).ok().map(|t| c_type(btf, &t, 0)))
        .collect()
}

/// A type as C spells it (`struct task_struct *`, `const char *`, `uid_t`): typedefs keep
/// their names, as the kernel's prototypes use them.
fn c_type(btf: &Btf, t: &Type, depth: u32) -> String {
    let named = |prefix: &str, bt: &dyn btf_rs::BtfType| {
        let name = btf.resolve_name(bt).unwrap_or_default();
        if prefix.is_empty() {
            name
        } else {
            format!("{prefix} {name}")
        }
    };
    let inner = |bt: &dyn btf_rs::BtfType| match btf.resolve_chained_type(bt) {
        Ok(t) if depth < 8 => c_type(btf, &t, depth + 1),
        _ => "void".to_string(),
    };
    match t {
        Type::Void => "void".to_string(),
        Type::Int(i) => named("", i),
        Type::Float(f) => named("", f),
        Type::Typedef(td) => named("", td),
        Type::Struct(s) => named("struct", s),
        Type::Union(u) => named("union", u),
        Type::Enum(e) => named("enum", e),
        Type::Enum64(e) => named("enum", e),
        Type::Fwd(f) => named(if f.is_union() { "union" } else { "struct" }, f),
        Type::Ptr(p) => format!("{} *", inner(p)),
        Type::Const(c) => format!("const {}", inner(c)),
        Type::Volatile(v) => format!("volatile {}", inner(v)),
        Type::Restrict(r) => inner(r),
        Type::TypeTag(tt) => inner(tt),
        other => other.name().to_string(),
    }
}

/// Whether a tracepoint's arguments begin with those a program reads (by position: a typed
/// program reads its arguments as 8-byte slots, so only their order and kinds matter).
pub fn prototype_matches(actual: &[String], expected: &[&str]) -> bool {
    actual.len() >= expected.len() && actual.iter().zip(expected).all(|(a, e)| a == e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_prototype_matches_by_position_and_type() {
        let signal_generate =
            args(&["int", "struct kernel_siginfo *", "struct task_struct *", "int", "int"]);
        let expected = ["int", "struct kernel_siginfo *", "struct task_struct *"];
        assert!(prototype_matches(&signal_generate, &expected));
        // mark_victim: `int pid` before 6.8, `struct task_struct *task, uid_t uid` since.
        assert!(!prototype_matches(&args(&["int"]), &["struct task_struct *"]));
        assert!(prototype_matches(
            &args(&["struct task_struct *", "uid_t"]),
            &["struct task_struct *"]
        ));
        // A program that reads more arguments than the event has.
        assert!(!prototype_matches(&args(&["int"]), &["int", "int"]));
    }
}
