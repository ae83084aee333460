//! Whole-map reads in a few system calls: `BPF_MAP_LOOKUP_BATCH` (Linux 5.6+).
//!
//! Why: aya iterates a map with two `bpf(2)` calls per entry (next key, then lookup) and reads a
//! per-CPU array one index at a time. The agent reads every counter map once a second, so that
//! was its largest cost: ~140 calls a second for an idle job (the I/O latency histogram alone
//! has 120 slots), thousands under I/O (the in-flight request map). One batch call returns up
//! to [`CHUNK`] entries. Where the kernel has no batch lookup (before 5.6, or a map type
//! without it) the functions return `None` and the caller iterates as before.
//!
//! Decoding the kernel's key and value buffers is pure and unit-tested apart from the call.

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::{maps::MapData, Pod};

/// Entries asked for per call. A hash map answers whole buckets only, and fails with ENOSPC
/// when one bucket holds more than asked: the chunk then doubles.
const CHUNK: usize = 256;

/// `bpf_attr.batch` (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}
const _: () = assert!(size_of::<BatchAttr>() == 56);

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// What one batch call gave.
enum Step {
    /// `n` entries, and more may follow.
    More(usize),
    /// `n` entries, the last ones.
    Last(usize),
    /// The chunk is smaller than one hash bucket.
    TooSmall,
    /// No batch lookup here (EINVAL before 5.6, ENOTSUPP for the map type), or another error.
    Unsupported,
}

/// Calls the kernel for the map's next entries into `keys` and `values`; `token` is the
/// kernel's position (`None`: from the start).
fn lookup_batch(
    fd: i32,
    token: Option<&[u8]>,
    next: &mut [u8],
    keys: &mut [u8],
    values: &mut [u8],
    count: usize,
) -> Step {
    let mut attr = BatchAttr {
        in_batch: token.map_or(0, |t| t.as_ptr() as u64),
        out_batch: next.as_mut_ptr() as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: count as u32,
        map_fd: fd as u32,
        ..Default::default()
    };
    // SAFETY: bpf(2) with an attr the size the kernel checks; the kernel writes at most `count`
    // keys and values into buffers the caller sized for `count` entries, and the position
    // (a bucket index, or a key) into `next`, sized for the larger of both.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_BATCH,
            &mut attr as *mut BatchAttr,
            size_of::<BatchAttr>(),
        )
    };
    let n = attr.count as usize;
    // Success with nothing returned would ask again from the same place: take it as the end.
    if rc == 0 {
        return if n == 0 { Step::Last(0) } else { Step::More(n) };
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENOENT) => Step::Last(n),
        Some(libc::ENOSPC) if n == 0 => Step::TooSmall,
        _ => Step::Unsupported,
    }
}

/// Every entry of `map` as raw key and value bytes, `value_stride` bytes a value (a per-CPU
/// map's value is one slot per possible CPU). `None` where batches are not supported.
fn read_all(map: &MapData, key_size: usize, value_stride: usize) -> Option<(Vec<u8>, Vec<u8>)> {
    let fd = map.fd().as_fd().as_raw_fd();
    let mut chunk = CHUNK;
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    let mut token: Option<Vec<u8>> = None;
    let mut next = vec![0u8; key_size.max(8)];
    loop {
        let (k0, v0) = (keys.len(), values.len());
        keys.resize(k0 + chunk * key_size, 0);
        values.resize(v0 + chunk * value_stride, 0);
        let step = lookup_batch(
            fd,
            token.as_deref(),
            &mut next,
            &mut keys[k0..],
            &mut values[v0..],
            chunk,
        );
        let keep = |keys: &mut Vec<u8>, values: &mut Vec<u8>, n: usize| {
            keys.truncate(k0 + n * key_size);
            values.truncate(v0 + n * value_stride);
        };
        match step {
            Step::More(n) => {
                keep(&mut keys, &mut values, n);
                token = Some(next.clone());
            }
            Step::Last(n) => {
                keep(&mut keys, &mut values, n);
                return Some((keys, values));
            }
            Step::TooSmall => {
                keep(&mut keys, &mut values, 0);
                chunk *= 2;
            }
            Step::Unsupported => return None,
        }
    }
}

/// Every entry of a hash map (not per-CPU), `None` where batches are not supported.
pub fn entries<K: Pod, V: Pod>(map: &MapData) -> Option<Vec<(K, V)>> {
    let (keys, values) = read_all(map, size_of::<K>(), size_of::<V>())?;
    Some(decode_entries(&keys, &values))
}

/// A per-CPU array of u64 counters, each index summed over the CPUs; `None` where batches are
/// not supported.
pub fn per_cpu_sums(map: &MapData, len: u32) -> Option<Vec<u64>> {
    let cpus = aya::util::nr_cpus().ok()?;
    let (keys, values) = read_all(map, size_of::<u32>(), 8 * cpus)?;
    sums_by_index(&keys, &values, cpus, len)
}

/// Reads one plain-old-data value from the front of `bytes`.
fn read_pod<T: Pod>(bytes: &[u8]) -> Option<T> {
    (bytes.len() >= size_of::<T>()).then(|| {
        // SAFETY: `T: Pod` is valid for any bit pattern, and `bytes` holds size_of::<T>()
        // bytes (checked); read_unaligned copies them without an alignment requirement.
        unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
    })
}

/// The kernel's key and value buffers as (key, value) pairs.
fn decode_entries<K: Pod, V: Pod>(keys: &[u8], values: &[u8]) -> Vec<(K, V)> {
    let keys = keys.chunks_exact(size_of::<K>()).filter_map(read_pod::<K>);
    let values = values.chunks_exact(size_of::<V>()).filter_map(read_pod::<V>);
    keys.zip(values).collect()
}

/// A per-CPU u64 array's batch (keys: u32 indices; values: `cpus` u64 slots an index) as one
/// sum per index, `len` of them; `None` when an index is out of range (a layout mismatch).
fn sums_by_index(keys: &[u8], values: &[u8], cpus: usize, len: u32) -> Option<Vec<u64>> {
    let mut out = vec![0u64; len as usize];
    let stride = 8 * cpus;
    for (k, v) in keys.chunks_exact(4).zip(values.chunks_exact(stride)) {
        let i = read_pod::<u32>(k)? as usize;
        let slot = out.get_mut(i)?;
        *slot = v.chunks_exact(8).filter_map(read_pod::<u64>).fold(0u64, u64::wrapping_add);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_pair_each_key_with_its_value() {
        let keys: Vec<u8> = [7u32, 9].iter().flat_map(|k| k.to_ne_bytes()).collect();
        let values: Vec<u8> = [70u64, 90].iter().flat_map(|v| v.to_ne_bytes()).collect();
        let got: Vec<(u32, u64)> = decode_entries(&keys, &values);
        assert_eq!(got, vec![(7, 70), (9, 90)]);
        // A short buffer (cannot happen: the kernel fills whole entries) loses no pairing.
        let got: Vec<(u32, u64)> = decode_entries(&keys, &values[..12]);
        assert_eq!(got, vec![(7, 70)]);
    }

    #[test]
    fn per_cpu_values_are_summed_per_index() {
        // Two CPUs, three indices returned out of order.
        let keys: Vec<u8> = [2u32, 0, 1].iter().flat_map(|k| k.to_ne_bytes()).collect();
        let values: Vec<u8> = [5u64, 6, 1, 2, 0, 0].iter().flat_map(|v| v.to_ne_bytes()).collect();
        assert_eq!(sums_by_index(&keys, &values, 2, 3), Some(vec![3, 0, 11]));
        // Indices the kernel did not return stay at zero.
        assert_eq!(sums_by_index(&keys[..4], &values[..16], 2, 4), Some(vec![0, 0, 11, 0]));
        // An index past the array: the caller falls back to per-index reads.
        assert_eq!(sums_by_index(&keys, &values, 2, 2), None);
    }
}
