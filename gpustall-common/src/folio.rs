//! How many pages one `mm_vmscan_write_folio` hit wrote. The classic tracepoint's record has
//! only the pfn and the reclaim flags: a 2 MiB THP swapped out whole is one hit for 512 pages.
//! The BTF-typed variant of the tracepoint gets the `struct folio *` (`struct page *` for
//! `mm_vmscan_writepage` before 5.18), and the order is read from it at offsets the agent takes
//! from the kernel's BTF ([`FolioLayout`]): aya has no CO-RE.

/// Where the flags and the order of a folio are, in this kernel's `struct folio` / `struct
/// page`. Written by the agent into the eBPF object's `FOLIO_LAYOUT` global before load.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FolioLayout {
    /// Offset of the head page's flags word (`folio.flags`, `page.flags`).
    pub flags: u32,
    /// Offset, from the head page, of the byte that holds the order of a large folio: the low
    /// byte of `_flags_1` (6.6+), `_folio_order` (6.0-6.5), the second page's `compound_order`
    /// (before). Little-endian: the low byte of `_flags_1` is its first.
    pub order: u32,
    /// `PG_head` (`enum pageflags`): set on the head of a large folio, whose order is then valid.
    pub head_bit: u32,
    /// `PG_swapbacked`: the tracepoint's `RECLAIM_WB_ANON` is `!folio_is_file_lru`, that is
    /// swap-backed.
    pub swapbacked_bit: u32,
}
const _: () = assert!(core::mem::size_of::<FolioLayout>() == 16);

/// The largest order counted as such; anything above is no folio reclaim writes (a PUD THP is
/// order 18 and is never swapped whole), so it reads as a bad layout and counts one page.
pub const MAX_ORDER: u8 = 18;

impl FolioLayout {
    /// No layout: the BTF program is not loaded and the classic tracepoint counts one page per
    /// folio.
    pub const fn unknown() -> Self {
        Self { flags: u32::MAX, order: u32::MAX, head_bit: 0, swapbacked_bit: 0 }
    }

    /// Whether the flags word says the folio is large (its order byte is to be read).
    #[inline(always)]
    pub fn is_large(&self, flags: u64) -> bool {
        flags & (1u64 << (self.head_bit & 63)) != 0
    }

    /// Whether the folio is swap-backed: its write-out is swap-out, not file writeback.
    #[inline(always)]
    pub fn is_anon(&self, flags: u64) -> bool {
        flags & (1u64 << (self.swapbacked_bit & 63)) != 0
    }
}

/// Pages in a folio of this order (`None`: an order-0 folio, or the order byte was not read).
#[inline(always)]
pub fn pages(order: Option<u8>) -> u64 {
    match order {
        Some(o) if o <= MAX_ORDER => 1u64 << o,
        _ => 1,
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding (size pinned above).
unsafe impl aya::Pod for FolioLayout {}

#[cfg(test)]
mod tests {
    use super::*;

    /// 6.18 x86-64: PG_head 6, PG_swapbacked 17 (values from that kernel's BTF).
    const L: FolioLayout = FolioLayout { flags: 0, order: 64, head_bit: 6, swapbacked_bit: 17 };

    #[test]
    fn counts_pages_by_order() {
        assert_eq!(pages(None), 1);
        assert_eq!(pages(Some(0)), 1);
        assert_eq!(pages(Some(4)), 16, "a 64 KiB mTHP of 4 KiB pages");
        assert_eq!(pages(Some(9)), 512, "a 2 MiB THP of 4 KiB pages");
        assert_eq!(pages(Some(5)), 32, "a 2 MiB THP of 64 KiB pages (arm64)");
        assert_eq!(pages(Some(200)), 1, "a byte that is no order counts the folio once");
    }

    #[test]
    fn reads_head_and_swapbacked_from_the_flags_word() {
        let head_anon = (1 << 6) | (1 << 17);
        assert!(L.is_large(head_anon) && L.is_anon(head_anon));
        assert!(!L.is_large(1 << 17) && L.is_anon(1 << 17));
        assert!(!L.is_anon(1 << 6), "a large page-cache folio is file writeback");
    }
}
