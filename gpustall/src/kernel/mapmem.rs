//! How much kernel memory the tracer's BPF maps take, as a function of the CPU count: the
//! kernel's own accounting (`map_mem_usage`, shown as `memlock` in a map's fdinfo) written out
//! for the map types gpustall uses. The struct sizes are kernel 6.18's, checked against what
//! that kernel charged on this project's test machine (see the tests); other kernels differ by
//! a few hundred bytes per map. It answers the question a fleet operator asks before rolling
//! out: what does this cost on a 256-CPU host? Per-CPU maps would cost entries x value x CPUs;
//! gpustall's per-process maps are shared by all CPUs (atomic adds), so the total stays flat.

/// The parts of a map definition that decide its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapDef {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

// BPF map types (include/uapi/linux/bpf.h).
const HASH: u32 = 1;
const ARRAY: u32 = 2;
const PERCPU_HASH: u32 = 5;
const PERCPU_ARRAY: u32 = 6;
const LRU_HASH: u32 = 9;
const LRU_PERCPU_HASH: u32 = 10;
const RINGBUF: u32 = 27;
const BPF_F_NO_PREALLOC: u32 = 1;

// Kernel struct sizes (x86_64, 6.18).
const SIZEOF_BPF_HTAB: u64 = 896;
const SIZEOF_BUCKET: u64 = 16;
const SIZEOF_HTAB_ELEM: u64 = 48;
const HASHTAB_MAP_LOCK_COUNT: u64 = 8;
const SIZEOF_BPF_ARRAY: u64 = 312;
const SIZEOF_RINGBUF_HEADERS: u64 = 304;
const RINGBUF_META_PAGES: u64 = 3;
const PAGE: u64 = 4096;
const PTR: u64 = 8;

fn round8(n: u32) -> u64 {
    u64::from(n).div_ceil(8) * 8
}

/// Bytes the kernel charges for `m` on a host with `ncpu` possible CPUs, with every entry of a
/// map that allocates on demand in use (its worst case).
pub fn kernel_bytes(m: &MapDef, ncpu: u64) -> u64 {
    match m.map_type {
        HASH | PERCPU_HASH | LRU_HASH | LRU_PERCPU_HASH => hash_bytes(m, ncpu),
        ARRAY => SIZEOF_BPF_ARRAY + u64::from(m.max_entries) * round8(m.value_size),
        PERCPU_ARRAY => {
            let n = u64::from(m.max_entries);
            SIZEOF_BPF_ARRAY + n * PTR + n * round8(m.value_size) * ncpu
        }
        RINGBUF => {
            let pages = u64::from(m.max_entries) / PAGE;
            SIZEOF_RINGBUF_HEADERS
                + (RINGBUF_META_PAGES + pages) * PAGE
                + (RINGBUF_META_PAGES + 2 * pages) * PTR
        }
        // Not a type gpustall uses: count its values, at least.
        _ => u64::from(m.max_entries) * (round8(m.key_size) + round8(m.value_size)),
    }
}

/// `htab_map_mem_usage` (kernel/bpf/hashtab.c).
fn hash_bytes(m: &MapDef, ncpu: u64) -> u64 {
    let percpu = matches!(m.map_type, PERCPU_HASH | LRU_PERCPU_HASH);
    let lru = matches!(m.map_type, LRU_HASH | LRU_PERCPU_HASH);
    let prealloc = lru || m.flags & BPF_F_NO_PREALLOC == 0;
    let entries = u64::from(m.max_entries);
    let buckets = entries.next_power_of_two();
    let value = round8(m.value_size);
    let elem = SIZEOF_HTAB_ELEM + round8(m.key_size) + if percpu { PTR } else { value };
    let mut bytes = SIZEOF_BPF_HTAB + SIZEOF_BUCKET * buckets + 4 * ncpu * HASHTAB_MAP_LOCK_COUNT;
    if prealloc {
        // One spare element per CPU for plain preallocated maps (updates of a full map).
        let extra = !percpu && !lru;
        let n = entries + if extra { ncpu } else { 0 };
        bytes += elem * n;
        if percpu {
            bytes += value * ncpu * n;
        } else if !lru {
            bytes += PTR * ncpu;
        }
    } else {
        const LLIST_NODE: u64 = 8;
        bytes += (elem + LLIST_NODE) * entries;
        if percpu {
            bytes += (LLIST_NODE + PTR) * entries + value * ncpu * entries;
        }
    }
    bytes
}

/// Each BPF map this process holds: what the kernel charges for it now (`memlock` in its
/// fdinfo: per-CPU copies and preallocated elements included; not in the agent's RSS) and the
/// most it can take on this host, by name.
pub fn held_maps() -> Vec<crate::model::overhead::MapMemory> {
    let ncpu = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|t| cpu_count(&t))
        .unwrap_or(1);
    let mut by_id = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fdinfo") else {
        return Vec::new();
    };
    for entry in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
        let Some((id, bytes, def)) = map_fdinfo(&text) else {
            continue; // not a BPF map
        };
        let name = aya::maps::MapInfo::from_id(id)
            .ok()
            .and_then(|i| i.name_as_str().map(String::from))
            .unwrap_or_else(|| format!("map {id}"));
        let at_full_use_bytes = kernel_bytes(&def, ncpu).max(bytes);
        by_id.insert(id, crate::model::overhead::MapMemory { name, bytes, at_full_use_bytes });
    }
    let mut maps: Vec<_> = by_id.into_values().collect();
    maps.sort_by(|a, b| a.name.cmp(&b.name));
    maps
}

/// A BPF map's fdinfo: its id, the bytes charged, its definition. `None` for other files.
fn map_fdinfo(text: &str) -> Option<(u32, u64, MapDef)> {
    let field = |key: &str| -> Option<u64> {
        text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().parse().ok())
    };
    // map_flags is hexadecimal (0x...).
    let flags = text.lines().find_map(|l| {
        let v = l.strip_prefix("map_flags:")?.trim();
        u32::from_str_radix(v.trim_start_matches("0x"), 16).ok()
    });
    let def = MapDef {
        map_type: field("map_type")? as u32,
        key_size: field("key_size")? as u32,
        value_size: field("value_size")? as u32,
        max_entries: field("max_entries")? as u32,
        flags: flags.unwrap_or(0),
    };
    Some((field("map_id")? as u32, field("memlock")?, def))
}

/// CPUs in a cpu list such as `/sys/devices/system/cpu/possible` (`0-3,8-11`).
fn cpu_count(list: &str) -> Option<u64> {
    list.trim().split(',').try_fold(0, |n, part| {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
        Some(n + b.checked_sub(a)? + 1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(map_type: u32, key: u32, value: u32, entries: u32, flags: u32) -> MapDef {
        MapDef { map_type, key_size: key, value_size: value, max_entries: entries, flags }
    }

    /// Every map of the built object, as the loader creates them.
    fn object_maps() -> Vec<(String, MapDef)> {
        let bytes = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpustall"));
        let obj = aya_obj::Object::parse(bytes).expect("the built eBPF object parses");
        obj.maps
            .iter()
            .map(|(name, m)| {
                let d = def(m.map_type(), m.key_size(), m.value_size(), m.max_entries(), 0);
                (name.clone(), MapDef { flags: m.map_flags(), ..d })
            })
            .collect()
    }

    /// What kernel 6.18 charged (fdinfo memlock) for gpustall's maps on a 2-CPU host: the
    /// preallocated maps in full, the on-demand ones empty.
    #[test]
    fn the_formula_matches_what_6_18_charged() {
        assert_eq!(kernel_bytes(&def(HASH, 4, 4, 32768, 0), 2), 2_622_544, "TRACKED");
        assert_eq!(kernel_bytes(&def(HASH, 4, 16, 16384, 0), 2), 1_442_912, "RECLAIM_START");
        assert_eq!(kernel_bytes(&def(LRU_HASH, 16, 24, 16384, 0), 2), 1_704_896, "LRU 16384");
        assert_eq!(kernel_bytes(&def(PERCPU_ARRAY, 4, 8, 120, 0), 2), 3_192, "IO_LATENCY");
        assert_eq!(kernel_bytes(&def(RINGBUF, 0, 0, 1 << 20, 0), 2), 1_065_288, "CRITICAL");
        assert_eq!(kernel_bytes(&def(RINGBUF, 0, 0, 4 << 20, 0), 2), 4_223_304, "BULK at 4 MiB");
    }

    #[test]
    fn fdinfo_and_cpu_lists_are_read() {
        let t = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nmap_type:\t1\n\
                 key_size:\t4\nvalue_size:\t80\nmax_entries:\t32768\nmap_flags:\t0x1\n\
                 map_extra:\t0x0\nmemlock:\t525248\nmap_id:\t41\nfrozen:\t0\n";
        let (id, bytes, d) = map_fdinfo(t).expect("a map");
        assert_eq!((id, bytes), (41, 525_248));
        assert_eq!(d, def(HASH, 4, 80, 32768, BPF_F_NO_PREALLOC));
        assert_eq!(map_fdinfo("pos:\t0\nflags:\t02\n"), None, "a plain file");
        assert_eq!(cpu_count("0-1\n"), Some(2));
        assert_eq!(cpu_count("0-3,8-11"), Some(8));
        assert_eq!(cpu_count("0"), Some(1));
        assert_eq!(cpu_count("3-1"), None);
    }

    /// The object's maps as the loader sizes them, with the typed request programs or without
    /// (and the kernel side's lines off, as unless RUST_LOG asks: aya-log's ring one page).
    fn loaded_maps(typed_pair: bool) -> Vec<(String, MapDef)> {
        let (inflight, slots) = crate::kernel::maps::inflight_entries(typed_pair);
        let mut maps = object_maps();
        for (name, m) in &mut maps {
            match name.as_str() {
                "IO_INFLIGHT" => m.max_entries = inflight,
                "RQ_SLOTS" => m.max_entries = slots,
                crate::kernel::klog::LOG_MAP => m.max_entries = PAGE as u32,
                _ => {}
            }
        }
        maps
    }

    #[test]
    fn at_most_16_mib_on_a_256_cpu_host_whatever_the_map_use() {
        for typed_pair in [false, true] {
            let maps = loaded_maps(typed_pair);
            let total: u64 = maps.iter().map(|(_, m)| kernel_bytes(m, 256)).sum();
            let detail: Vec<_> = maps.iter().map(|(n, m)| (n, kernel_bytes(m, 256))).collect();
            assert!(total <= 16 << 20, "{total} bytes at 256 CPUs: {detail:?}");
            // And it barely moves with the CPU count.
            let small: u64 = maps.iter().map(|(_, m)| kernel_bytes(m, 2)).sum();
            assert!(total - small < 1 << 20, "2 CPUs {small}, 256 CPUs {total}");
        }
    }

    #[test]
    fn per_cpu_counter_maps_would_grow_with_the_cpus() {
        // The design this replaced: per-process counters in per-CPU hash maps.
        let proc = def(PERCPU_HASH, 4, 80, 32768, 0);
        let io = def(PERCPU_HASH, 16, 40, 16384, 0);
        let at = |ncpu| kernel_bytes(&proc, ncpu) + kernel_bytes(&io, ncpu);
        assert!(at(224) > 700 << 20, "{} bytes at 224 CPUs", at(224));
        assert!(at(2) < 16 << 20);
    }
}
