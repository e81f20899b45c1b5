//! Per-sequence KV cache: for each layer, keys and values of every position, row-major
//! (position, kv_heads * head_dim). Owned by the sequence, so a batch can mix any lengths.

#[derive(Debug, Clone)]
pub struct KvCache {
    kv_dim: usize,
    /// Per layer: (keys, values), each `capacity * kv_dim` floats.
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
        if keys.len() < (pos + 1) * d {
            let grow = ((pos + 1) * d).max(keys.len() * 3 / 2);
            keys.resize(grow, 0.0);
            values.resize(grow, 0.0);
        }
        keys[pos * d..(pos + 1) * d].copy_from_slice(k);
        values[pos * d..(pos + 1) * d].copy_from_slice(v);
    }

    /// Makes the positions written during a step part of the cache.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// Keys and values of `layer` from position 0 on, for one kv head: slices starting at that
    /// head, positions `kv_dim` floats apart.
    #[inline]
    pub(crate) fn head_rows(&self, layer: usize, kv_head: usize, head_dim: usize) -> (&[f32], &[f32], usize) {
        let off = kv_head * head_dim;
        let (k, v) = &self.layers[layer];
        (&k[off..], &v[off..], self.kv_dim)
    }

    /// Forgets every position from `len` on (to reuse a cached prefix).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Copies positions `0..n` of `other` into this empty cache (prefix-cache hits).
    pub fn copy_prefix(&mut self, other: &KvCache, n: usize) {
        assert!(n <= other.len && self.kv_dim == other.kv_dim);
        let d = self.kv_dim;
        for ((k, v), (ok, ov)) in self.layers.iter_mut().zip(&other.layers) {
            k.clear();
            v.clear();
            k.extend_from_slice(&ok[..n * d]);
            v.extend_from_slice(&ov[..n * d]);
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
