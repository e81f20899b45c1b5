//! Per-sequence KV cache, owned by the sequence so that a batch can mix any lengths. For each
//! layer, values are row-major (position, kv_heads * head_dim); keys are in tiles of
//! [`KEY_TILE`] positions stored transposed (tile, kv_heads * head_dim, position in tile), the
//! layout the attention kernel reads a tile's scores from (see `kernels::attend`).

use crate::kernels::{HeadKv, KEY_TILE};

#[derive(Debug, Clone)]
pub struct KvCache {
    kv_dim: usize,
    /// Per layer: (keys, values), each `capacity * kv_dim` floats, capacity in whole tiles.
    layers: Vec<(Vec<f32>, Vec<f32>)>,
    len: usize,
}

impl KvCache {
    pub fn new(n_layer: usize, kv_dim: usize) -> Self {
        KvCache { kv_dim, layers: vec![(Vec::new(), Vec::new()); n_layer], len: 0 }
    }

    /// Positions already committed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes k and v of `pos` in `layer` (a position at or after `len`, during a step).
    pub(crate) fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        let (keys, values) = &mut self.layers[layer];
        let need = (pos + 1).next_multiple_of(KEY_TILE) * d;
        if keys.len() < need {
            let grow = need.max((keys.len() * 3 / 2).next_multiple_of(KEY_TILE * d));
            keys.resize(grow, 0.0);
            values.resize(grow, 0.0);
        }
        let (tile, lane) = (pos / KEY_TILE, pos % KEY_TILE);
        let base = tile * KEY_TILE * d + lane;
        for (e, x) in k.iter().enumerate() {
            keys[base + e * KEY_TILE] = *x;
        }
        values[pos * d..(pos + 1) * d].copy_from_slice(v);
    }

    /// Makes the positions written during a step part of the cache.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// Keys and values of `layer` from position 0 on, for one kv head.
    #[inline]
    pub(crate) fn head(&self, layer: usize, kv_head: usize, head_dim: usize) -> HeadKv<'_> {
        let off = kv_head * head_dim;
        let (k, v) = &self.layers[layer];
        HeadKv {
            keys: &k[off * KEY_TILE..],
            tile_stride: self.kv_dim * KEY_TILE,
            values: &v[off..],
            stride: self.kv_dim,
        }
    }

    /// An empty cache of the same shape, holding no memory (a preempted sequence's).
    pub fn emptied(&self) -> KvCache {
        KvCache::new(self.layers.len(), self.kv_dim)
    }

    /// Forgets every position from `len` on (to reuse a cached prefix).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Copies positions `0..n` of `other` into this empty cache (prefix-cache hits).
    pub fn copy_prefix(&mut self, other: &KvCache, n: usize) {
        assert!(n <= other.len && self.kv_dim == other.kv_dim);
        // Whole key tiles (lanes past n are never read: attention stops at the context length).
        let d = self.kv_dim;
        for ((k, v), (ok, ov)) in self.layers.iter_mut().zip(&other.layers) {
            k.clear();
            v.clear();
            k.extend_from_slice(&ok[..n.next_multiple_of(KEY_TILE) * d]);
            v.extend_from_slice(&ov[..n.next_multiple_of(KEY_TILE) * d]);
        }
        self.len = n;
    }

    /// Appends `n` zero positions (fixtures in other crates' tests).
    #[doc(hidden)]
    pub fn fill_for_test(&mut self, n: usize) {
        let zeros = vec![0f32; self.kv_dim];
        for layer in 0..self.layers.len() {
            for pos in self.len..self.len + n {
                self.write(layer, pos, &zeros, &zeros);
            }
        }
        self.len += n;
    }

    /// Bytes held, for memory accounting.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|(k, v)| (k.capacity() + v.capacity()) * 4).sum()
    }
}
