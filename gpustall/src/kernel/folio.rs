//! Where this kernel keeps a folio's flags and order ([`FolioLayout`]), from its BTF, for the
//! BTF-typed `mm_vmscan_write_folio` program that counts the pages of each folio written out.
//! The order's home moved twice: the second page's `compound_order` (struct page, before
//! 5.18), `folio._folio_order` (6.0 to 6.5), the low byte of `folio._flags_1` (6.6+).

use btf_rs::{Btf, Type};
use gpustall_common::folio::FolioLayout;

use crate::kernel::btf::member_offset;

/// What the layout is made of, as read from BTF (a plain struct so the choice is unit-tested).
#[derive(Debug, Default, Clone, Copy)]
pub struct FolioBtf {
    /// `struct folio` exists (5.16+); its flags are at `folio_flags`.
    pub folio_flags: Option<u32>,
    pub folio_order: Option<u32>,
    pub folio_flags_1: Option<u32>,
    pub page_flags: Option<u32>,
    pub page_compound_order: Option<u32>,
    pub page_size: Option<u32>,
    pub pg_head: Option<u32>,
    pub pg_swapbacked: Option<u32>,
}

/// The layout, or what BTF does not give for it.
pub fn layout(b: &FolioBtf) -> Result<FolioLayout, &'static str> {
    let head_bit = b.pg_head.ok_or("PG_head in enum pageflags")?;
    let swapbacked_bit = b.pg_swapbacked.ok_or("PG_swapbacked in enum pageflags")?;
    if head_bit >= 64 || swapbacked_bit >= 64 {
        return Err("PG_head and PG_swapbacked within the first flags word");
    }
    // `_folio_order` first: 6.0-6.5 also have `_flags_1`, whose low byte is not the order there.
    let order = b
        .folio_order
        .or(b.folio_flags_1)
        .or_else(|| Some(b.page_size? + b.page_compound_order?))
        .ok_or("the folio's order (folio._folio_order, folio._flags_1 or page.compound_order)")?;
    let flags = b.folio_flags.or(b.page_flags).ok_or("folio.flags or page.flags")?;
    Ok(FolioLayout { flags, order, head_bit, swapbacked_bit })
}

fn enum_value(btf: &Btf, name: &str, member: &str) -> Option<u32> {
    btf.resolve_types_by_name(name).ok()?.iter().find_map(|t| match t {
        Type::Enum(e) => e
            .members
            .iter()
            .find(|m| btf.resolve_name(*m).is_ok_and(|n| n == member))
            .map(|m| m.val()),
        _ => None,
    })
}

fn struct_size(btf: &Btf, name: &str) -> Option<u32> {
    btf.resolve_types_by_name(name).ok()?.iter().find_map(|t| match t {
        Type::Struct(s) => u32::try_from(s.size()).ok(),
        _ => None,
    })
}

/// Reads the parts of the layout from a kernel's BTF.
pub fn read(btf: &Btf) -> FolioBtf {
    FolioBtf {
        folio_flags: member_offset(btf, "folio", "flags"),
        folio_order: member_offset(btf, "folio", "_folio_order"),
        folio_flags_1: member_offset(btf, "folio", "_flags_1"),
        page_flags: member_offset(btf, "page", "flags"),
        page_compound_order: member_offset(btf, "page", "compound_order"),
        page_size: struct_size(btf, "page"),
        pg_head: enum_value(btf, "pageflags", "PG_head"),
        pg_swapbacked: enum_value(btf, "pageflags", "PG_swapbacked"),
    }
}

/// Whether the tracepoint's first argument is what the program reads: the folio, or its head
/// page (the same memory: a folio overlays its pages).
pub fn takes_a_folio(first_arg: Option<&str>) -> bool {
    matches!(first_arg, Some("struct folio *" | "struct page *"))
}

/// This kernel's layout, or what its BTF does not give for it.
pub fn from_btf(btf: &Btf) -> Result<FolioLayout, &'static str> {
    let first_arg = ["mm_vmscan_write_folio", "mm_vmscan_writepage"]
        .iter()
        .find_map(|e| crate::kernel::btf::tracepoint_args(btf, e))
        .and_then(|args| args.into_iter().next());
    if !takes_a_folio(first_arg.as_deref()) {
        return Err("a folio or page as mm_vmscan_write_folio's first argument");
    }
    layout(&read(btf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> FolioBtf {
        FolioBtf { pg_head: Some(6), pg_swapbacked: Some(17), ..Default::default() }
    }

    #[test]
    fn picks_the_order_of_each_kernel_generation() {
        // 6.6+: the low byte of _flags_1 (the second page's flags word).
        let new = FolioBtf { folio_flags: Some(0), folio_flags_1: Some(64), ..base() };
        assert_eq!(layout(&new).map(|l| (l.flags, l.order)), Ok((0, 64)));
        // 6.1: _folio_order, although _flags_1 is there too.
        let mid = FolioBtf { folio_order: Some(80), ..new };
        assert_eq!(layout(&mid).map(|l| l.order), Ok(80));
        // 5.10: no struct folio, the second page's compound_order.
        let old = FolioBtf {
            page_flags: Some(0),
            page_size: Some(64),
            page_compound_order: Some(17),
            ..base()
        };
        assert_eq!(layout(&old).map(|l| (l.flags, l.order)), Ok((0, 81)));
    }

    #[test]
    fn the_argument_must_be_a_folio_or_its_page() {
        assert!(takes_a_folio(Some("struct folio *")), "5.18+");
        assert!(takes_a_folio(Some("struct page *")), "mm_vmscan_writepage");
        assert!(!takes_a_folio(Some("unsigned long")) && !takes_a_folio(None));
    }

    #[test]
    fn no_layout_without_the_flag_bits_or_an_order() {
        let no_head =
            FolioBtf { pg_head: None, folio_flags: Some(0), folio_flags_1: Some(64), ..base() };
        assert!(layout(&no_head).is_err());
        assert!(layout(&FolioBtf { folio_flags: Some(0), ..base() }).is_err());
    }

    /// The running kernel's BTF gives a layout (every kernel gpustall supports has one of the
    /// three), with the flag bits where `include/linux/page-flags.h` puts them on x86-64.
    #[test]
    fn this_kernel_has_a_layout() {
        let vmlinux = crate::kernel::btf::VMLINUX;
        if !std::path::Path::new(vmlinux).exists() {
            eprintln!("no {vmlinux}: nothing to check");
            return;
        }
        let btf = Btf::from_file(vmlinux).expect("BTF");
        let b = read(&btf);
        let l = from_btf(&btf).expect("a layout");
        eprintln!("{b:?} -> {l:?}");
        assert_eq!(l.flags, 0);
        assert!(l.order >= 64, "the order is in the second page: {l:?}");
    }
}
