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

/// `task_struct.exit_code`, or `None` (with the reason logged) when BTF is unavailable.
pub fn task_exit_code_offset() -> Option<u32> {
    match Btf::from_file(VMLINUX) {
        Ok(btf) => {
            let off = member_offset(&btf, "task_struct", "exit_code");
            if off.is_none() {
                log::warn!("task_struct.exit_code not in BTF: exit codes will be unknown");
            }
            off
        }
        Err(e) => {
            log::warn!("cannot read {VMLINUX} ({e}): exit codes will be unknown");
            None
        }
    }
}
