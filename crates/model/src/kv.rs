//! Per-sequence KV cache, owned by the sequence so that a batch can mix any lengths. For each
//! layer, values are row-major (position, kv_heads * head_dim); keys are in tiles of
//! [`KEY_TILE`] positions stored transposed (tile, kv_heads * head_dim, position in tile), the
//! layout the attention kernel reads a tile's scores from (see `kernels::attend`).
//!
//! Copy-on-write prefix: positions `0..base` may live in a read-only segment shared (through an
//! `Arc`) with other caches: the `n` choices of one request, which all continue the same prompt,
//! and prefix-cache entries and the sequences that reuse them. `base` is a whole number of tiles,
//! so the sequence's own part starts at a tile boundary and both parts keep the tile layout; the
//! attention kernel reads the shared tiles, then the own ones. Writes only ever go to the own part
//! (positions at or after `base`), so nothing shared is ever changed, and `n` choices of a long
//! prompt hold the prompt once plus at most a tile each, instead of `n` copies.
//!
//! Values are stored as f16 (vLLM's default `--kv-cache-dtype auto` is the model's 16-bit type):
//! half the memory of f32, so twice the sequences or context in the same budget, and half the
//! bytes attention reads per position. The forward computes k and v in f32 and rounds them here;
//! the golden test holds the result to the f32 forward.

use crate::kernels::{HeadKv, KEY_TILE};
use half::f16;
use std::sync::Arc;

/// Bytes one cached key or value takes.
pub const KV_VALUE_BYTES: usize = std::mem::size_of::<f16>();

/// Rounds `xs` as the cache stores them (to f16 and back), for the trainer's attention: it then
/// computes from the keys and values the server attends to, so that the learner's logprobs of
/// a sampled sequence match the sampler's, as they did with an f32 cache.
pub fn round_as_cached(xs: &mut [f32]) {
    xs.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32());
}

/// Per layer: (keys, values), each a whole number of tiles of `kv_dim`-wide positions.
type Layers = Vec<(Vec<f16>, Vec<f16>)>;

#[derive(Debug, Clone)]
pub struct KvCache {
    kv_dim: usize,
    /// Positions `0..base`, shared and read-only (`None` when `base` is 0).
    shared: Option<Arc<Layers>>,
    base: usize,
    /// Positions `base..`, capacity in whole tiles.
    own: Layers,
    len: usize,
}

impl KvCache {
    pub fn new(n_layer: usize, kv_dim: usize) -> Self {
        KvCache { kv_dim, shared: None, base: 0, own: vec![(Vec::new(), Vec::new()); n_layer], len: 0 }
    }

    /// Positions already committed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions in the shared, read-only segment.
    pub fn shared_len(&self) -> usize {
        self.base
    }

    /// Writes k and v of `pos` in `layer` (a position at or after `len`, during a step).
    pub(crate) fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        assert!(pos >= self.base, "position {pos} lies in the shared prefix (0..{})", self.base);
        let pos = pos - self.base;
        let d = self.kv_dim;
        let (keys, values) = &mut self.own[layer];
        let need = (pos + 1).next_multiple_of(KEY_TILE) * d;
        if keys.len() < need {
            let grow = need.max((keys.len() * 3 / 2).next_multiple_of(KEY_TILE * d));
            // Exactly `grow`: `resize` alone lets the Vec double its capacity, so 16 streams of a
            // hundred tokens held 2.4x their cache (Qwen2.5 0.5B: 43 MB for 18; session 32).
            keys.reserve_exact(grow - keys.len());
            values.reserve_exact(grow - values.len());
            keys.resize(grow, f16::ZERO);
            values.resize(grow, f16::ZERO);
        }
        let (tile, lane) = (pos / KEY_TILE, pos % KEY_TILE);
        let base = tile * KEY_TILE * d + lane;
        for (e, x) in k.iter().enumerate() {
            keys[base + e * KEY_TILE] = f16::from_f32(*x);
        }
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(&mut values[pos * d..(pos + 1) * d], v);
    }

    /// Makes the positions written during a step part of the cache.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// Keys and values of `layer` from position 0 on, for one kv head.
    #[inline]
    pub(crate) fn head(&self, layer: usize, kv_head: usize, head_dim: usize) -> HeadKv<'_> {
        let off = kv_head * head_dim;
        let (k, v) = &self.own[layer];
        let (sk, sv): (&[f16], &[f16]) = match &self.shared {
            Some(s) => (&s[layer].0[off * KEY_TILE..], &s[layer].1[off..]),
            None => (&[], &[]),
        };
        HeadKv {
            keys: [sk, k.get(off * KEY_TILE..).unwrap_or(&[])],
            values: [sv, v.get(off..).unwrap_or(&[])],
            shared_tiles: self.base / KEY_TILE,
            tile_stride: self.kv_dim * KEY_TILE,
            stride: self.kv_dim,
        }
    }

    /// An empty cache of the same shape, holding no memory (a preempted sequence's).
    pub fn emptied(&self) -> KvCache {
        KvCache::new(self.own.len(), self.kv_dim)
    }

    /// Forgets every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        if len < self.base {
            // The shared segment cannot shrink in place; keep a share of its whole tiles.
            *self = KvCache::prefix_of(self, len);
        }
        self.len = self.len.min(len);
    }

    /// Moves every whole tile of committed positions into the shared segment, so that clones of
    /// this cache (forked choices, prefix-cache entries) share them instead of copying them.
    pub fn freeze(&mut self) {
        let tiles = self.len / KEY_TILE;
        if tiles * KEY_TILE <= self.base {
            return;
        }
        let d = self.kv_dim;
        let own_tiles = tiles - self.base / KEY_TILE;
        let split = own_tiles * KEY_TILE * d;
        let shared = self.base * d;
        // What stays own: the partial last tile only (not the spare capacity grown for writes,
        // which every clone would copy).
        let keep = (self.len - tiles * KEY_TILE).next_multiple_of(KEY_TILE) * d;
        let trim = |v: &mut Vec<f16>| {
            v.truncate(keep);
            v.shrink_to_fit();
        };
        let frozen: Layers = match self.shared.take() {
            // The common case (a fresh prompt): the own vectors become the shared ones, uncopied.
            None => self
                .own
                .iter_mut()
                .map(|(k, v)| {
                    let (mut tk, mut tv) = (k.split_off(split), v.split_off(split));
                    trim(&mut tk);
                    trim(&mut tv);
                    let (mut k, mut v) = (std::mem::replace(k, tk), std::mem::replace(v, tv));
                    k.shrink_to_fit();
                    v.shrink_to_fit();
                    (k, v)
                })
                .collect(),
            // Already sharing a prefix (a prefix-cache hit): one new segment of both parts.
            Some(old) => old
                .iter()
                .zip(self.own.iter_mut())
                .map(|((ok, ov), (k, v))| {
                    let mut nk = Vec::with_capacity(shared + split);
                    nk.extend_from_slice(&ok[..shared]);
                    nk.extend_from_slice(&k[..split]);
                    let mut nv = Vec::with_capacity(shared + split);
                    nv.extend_from_slice(&ov[..shared]);
                    nv.extend_from_slice(&v[..split]);
                    k.drain(..split);
                    v.drain(..split);
                    trim(k);
                    trim(v);
                    (nk, nv)
                })
                .collect(),
        };
        self.shared = Some(Arc::new(frozen));
        self.base = tiles * KEY_TILE;
    }

    /// A cache holding positions `0..n` of `other`: its shared tiles shared, the rest copied
    /// (prefix-cache hits).
    pub fn prefix_of(other: &KvCache, n: usize) -> KvCache {
        assert!(n <= other.len);
        let d = other.kv_dim;
        let base = other.base.min(n / KEY_TILE * KEY_TILE);
        let mut out = KvCache {
            kv_dim: d,
            shared: if base > 0 { other.shared.clone() } else { None },
            base,
            own: Vec::with_capacity(other.own.len()),
            len: n,
        };
        let tile = KEY_TILE * d;
        // Whole tiles from `base` on (lanes past n are never read: attention stops at the context).
        let (first, last) = (base / KEY_TILE, n.div_ceil(KEY_TILE));
        for (layer, (k, v)) in other.own.iter().enumerate() {
            let (mut nk, mut nv) =
                (Vec::with_capacity((last - first) * tile), Vec::with_capacity((last - first) * tile));
            for t in first..last {
                let (src_k, src_v, at) = if t * KEY_TILE < other.base {
                    let s = other.shared.as_ref().expect("positions below base are shared");
                    (&s[layer].0, &s[layer].1, t)
                } else {
                    (k, v, t - other.base / KEY_TILE)
                };
                nk.extend_from_slice(&src_k[at * tile..(at + 1) * tile]);
                nv.extend_from_slice(&src_v[at * tile..(at + 1) * tile]);
            }
            out.own.push((nk, nv));
        }
        out
    }

    /// Appends `n` zero positions (fixtures in other crates' tests).
    #[doc(hidden)]
    pub fn fill_for_test(&mut self, n: usize) {
        let zeros = vec![0f32; self.kv_dim];
        for layer in 0..self.own.len() {
            for pos in self.len..self.len + n {
                self.write(layer, pos, &zeros, &zeros);
            }
        }
        self.len += n;
    }

    /// KV positions this cache accounts for: its own ones, and its part of the shared segment
    /// (split evenly between the caches sharing it, so a sum over caches counts it once).
    pub fn positions_held(&self) -> usize {
        let own = self.len - self.base;
        match &self.shared {
            Some(s) => own + self.base.div_ceil(Arc::strong_count(s)),
            None => own,
        }
    }

    /// Bytes of memory this cache alone holds (its own part), for memory accounting.
    pub fn own_bytes(&self) -> usize {
        self.own.iter().map(|(k, v)| (k.capacity() + v.capacity()) * KV_VALUE_BYTES).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache whose position p, element e holds `p * 100 + e` in keys and the negation in values.
    fn numbered(n: usize, d: usize) -> KvCache {
        let mut c = KvCache::new(2, d);
        for p in 0..n {
            let k: Vec<f32> = (0..d).map(|e| (p * 100 + e) as f32).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            for layer in 0..2 {
                c.write(layer, p, &k, &v);
            }
            c.commit(1);
        }
        c
    }

    /// Every position's k and v as read through `head`, the way attention reads them.
    fn read(c: &KvCache, layer: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
        let h = c.head(layer, 0, c.kv_dim);
        (0..c.len)
            .map(|p| {
                let (seg, p_in) = if p < c.base { (0, p) } else { (1, p - c.base) };
                let (t, lane) = (p_in / KEY_TILE, p_in % KEY_TILE);
                let k = (0..c.kv_dim).map(|e| h.keys[seg][t * h.tile_stride + e * KEY_TILE + lane].to_f32()).collect();
                let v = h.values[seg][p_in * h.stride..p_in * h.stride + c.kv_dim].iter().map(|x| x.to_f32()).collect();
                (k, v)
            })
            .collect()
    }

    #[test]
    fn a_growing_cache_holds_at_most_half_again_what_it_wrote() {
        // 100 positions grow the capacity 16, 32, 48, 80, 128 positions (by half, in whole
        // tiles): 128, where a Vec left to itself doubles to 160 or more.
        let c = numbered(100, 3);
        assert_eq!(c.own_bytes(), 2 * 2 * 128 * 3 * KV_VALUE_BYTES);
    }

    #[test]
    fn freeze_shares_whole_tiles_and_forks_write_only_their_own_part() {
        let mut a = numbered(37, 3);
        let before = read(&a, 1);
        a.freeze();
        assert_eq!((a.shared_len(), a.len()), (32, 37));
        assert_eq!(read(&a, 1), before, "freezing changes no value");
        // Two forks share the 32 positions; each copies only the 5-position tail tile.
        let (mut b, c) = (a.clone(), a.clone());
        assert!(Arc::ptr_eq(a.shared.as_ref().unwrap(), b.shared.as_ref().unwrap()));
        // One tile per layer for keys and values: none of the capacity grown for 37 writes.
        assert_eq!(b.own_bytes(), 2 * 2 * KEY_TILE * 3 * KV_VALUE_BYTES);
        assert_eq!(a.own_bytes(), b.own_bytes());
        // Each: its 5 own positions and a third of the shared 32, rounded up (11).
        assert_eq!(a.positions_held() + b.positions_held() + c.positions_held(), 3 * (5 + 11));
        // b diverges at position 37; a and c still read their own.
        for layer in 0..2 {
            b.write(layer, 37, &[7.0; 3], &[8.0; 3]);
        }
        b.commit(1);
        assert_eq!(read(&b, 0)[37], (vec![7.0; 3], vec![8.0; 3]));
        assert_eq!(read(&b, 0)[..37], before[..]);
        assert_eq!(read(&c, 0), before);
    }

    #[test]
    fn freezing_keeps_no_spare_capacity_for_clones_to_copy() {
        // 100 writes grew each vector to 128 positions; 96 become shared, 4 stay own.
        let mut a = numbered(100, 2);
        a.freeze();
        assert_eq!(a.shared_len(), 96);
        assert_eq!(a.clone().own_bytes(), 2 * 2 * KEY_TILE * 2 * KV_VALUE_BYTES);
    }

    #[test]
    fn prefix_of_and_truncate_keep_the_same_values() {
        let mut a = numbered(50, 2);
        let all = read(&a, 0);
        a.freeze();
        for n in [0, 5, 16, 31, 32, 33, 48, 50] {
            let p = KvCache::prefix_of(&a, n);
            assert_eq!(p.len(), n);
            assert_eq!(p.shared_len(), n / KEY_TILE * KEY_TILE);
            assert_eq!(read(&p, 0), all[..n], "prefix of {n}");
            let mut t = a.clone();
            t.truncate(n);
            assert_eq!(read(&t, 0), all[..n], "truncate to {n}");
        }
        // A prefix-cache hit that continues, then freezes again: one merged segment.
        let mut p = KvCache::prefix_of(&a, 20);
        for pos in 20..40 {
            for layer in 0..2 {
                p.write(layer, pos, &[pos as f32; 2], &[0.5; 2]);
            }
            p.commit(1);
        }
        p.freeze();
        assert_eq!(p.shared_len(), 32);
        let got = read(&p, 0);
        assert_eq!(got[..20], all[..20]);
        assert_eq!(got[33], (vec![33.0; 2], vec![0.5; 2]));
    }

    #[test]
    #[should_panic(expected = "shared prefix")]
    fn writing_into_the_shared_prefix_is_refused() {
        let mut a = numbered(20, 2);
        a.freeze();
        a.write(0, 3, &[0.0; 2], &[0.0; 2]);
    }
}
