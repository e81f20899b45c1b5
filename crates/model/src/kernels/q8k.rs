//! Activations quantised per super-block of 256 values, as llama.cpp's Q8_K, for the K-quant
//! weights' lane kernel (`blocks_lanes::ktile`).
//!
//! Why a second quantisation: with one activation scale per 32 values, every 32-value block of a
//! K-quant weight row needs its own float epilogue per weight group and activation row (convert,
//! multiply, two FMAs), a third of the tile's time at Qwen2.5-1.5B's shapes. With one scale per
//! 256 values the sub-blocks' integer sums are scaled by the weights' integer sub-block codes and
//! added in integers, and the float work runs once per super-block.
//!
//! Per row and super-block this keeps: the quants (`x / d` rounded, `d = max|x| / 127`), `d`,
//! the eight 32-value sums of the quants as i16 pairs (the minimum's term of Q4_K/Q5_K, one
//! `vpdpwssd` per two sub-blocks), and per 16 values `-32 * sum` (Q6_K's offset, the start of its
//! integer sums).

use super::blocks::QK_K;

#[derive(Debug, Clone, Default)]
pub struct KActs {
    rows: usize,
    cols: usize,
    quants: Vec<i8>,
    scales: Vec<f32>,
    /// Per (row, super-block), 4 words: sums of sub-blocks `2p` (low half) and `2p + 1` (high).
    pairs: Vec<i32>,
    /// Per (row, 16 values): `-32 * sum of the quants`.
    q6_start: Vec<i32>,
}

impl KActs {
    /// Quantises (rows, cols) activations (`cols` a multiple of 256), rows split over the thread
    /// pool as `Q8Acts::quantize` splits them.
    pub fn quantize(&mut self, data: &[f32], rows: usize, cols: usize) {
        assert!(data.len() == rows * cols && cols.is_multiple_of(QK_K));
        let supers = cols / QK_K;
        self.rows = rows;
        self.cols = cols;
        self.quants.resize(rows * cols, 0);
        self.scales.resize(rows * supers, 0.0);
        self.pairs.resize(rows * supers * 4, 0);
        self.q6_start.resize(rows * cols / 16, 0);
        use super::team::Disjoint;
        let (q, s) = (Disjoint::new(&mut self.quants), Disjoint::new(&mut self.scales));
        let (p, q6) = (Disjoint::new(&mut self.pairs), Disjoint::new(&mut self.q6_start));
        let row = |r: usize| {
            // SAFETY: task r takes row r of each buffer, so no two tasks' slices overlap.
            let (q, s, p, q6) = unsafe {
                (
                    q.slice(r * cols, cols),
                    s.slice(r * supers, supers),
                    p.slice(r * supers * 4, supers * 4),
                    q6.slice(r * cols / 16, cols / 16),
                )
            };
            quantize_row(&data[r * cols..(r + 1) * cols], q, s, p, q6);
        };
        // Below this many values a split costs more than it saves (as for `Q8Acts`).
        if rows > 1 && rows * cols >= 32 * 1024 {
            super::team::for_each(rows, row);
        } else {
            (0..rows).for_each(row);
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Every row's quants, row after row.
    pub(crate) fn quants(&self) -> &[i8] {
        &self.quants
    }

    /// Per (row, super-block): the scale.
    pub(crate) fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Per (row, super-block): four words of two i16 sub-block sums (see [`KActs`]).
    pub(crate) fn pairs(&self) -> &[i32] {
        &self.pairs
    }

    /// Per (row, 16 values): `-32 * sum`.
    pub(crate) fn q6_start(&self) -> &[i32] {
        &self.q6_start
    }

    /// One row's quants and super-block scales (for the reference products in tests).
    pub fn row(&self, r: usize) -> (&[i8], &[f32]) {
        let supers = self.cols / QK_K;
        (&self.quants[r * self.cols..(r + 1) * self.cols], &self.scales[r * supers..(r + 1) * supers])
    }
}

/// One row: the rounding of `q8::quantize_into` (half away from zero, written so that it
/// vectorises) over 256 values per scale.
fn quantize_row(x: &[f32], q: &mut [i8], s: &mut [f32], pairs: &mut [i32], q6: &mut [i32]) {
    for (sb, ((x, q), d_out)) in x.chunks_exact(QK_K).zip(q.chunks_exact_mut(QK_K)).zip(s.iter_mut()).enumerate() {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (qi, v) in q.iter_mut().zip(x) {
            let v = v * inv;
            *qi = (v + 0.5f32.copysign(v)) as i32 as i8;
        }
        *d_out = d;
        let sum16: Vec<i32> = q.chunks_exact(16).map(|h| h.iter().map(|&v| v as i32).sum()).collect();
        for (i, s) in sum16.iter().enumerate() {
            q6[sb * 16 + i] = -32 * s;
        }
        for p in 0..4 {
            // |sum of 32 quants| <= 32 * 127: an i16.
            let (lo, hi) = (sum16[4 * p] + sum16[4 * p + 1], sum16[4 * p + 2] + sum16[4 * p + 3]);
            pairs[sb * 4 + p] = (lo as i16 as u16 as u32 | (hi as i16 as u16 as u32) << 16) as i32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_scale_per_super_block_and_its_sums() {
        // The first super-block's largest magnitude is 127 (d = 1, values exact); the second is
        // all zeros (d = 0, quants 0).
        let mut x = vec![0f32; 512];
        for (i, v) in x.iter_mut().enumerate().take(256) {
            *v = if i % 2 == 0 { 127.0 } else { -0.5 * (i % 7) as f32 };
        }
        let mut k = KActs::default();
        k.quantize(&x, 1, 512);
        let (q, s) = k.row(0);
        assert_eq!((s[0], s[1]), (1.0, 0.0));
        assert_eq!(q[0], 127);
        // -1.5 and -0.5: half away from zero.
        assert_eq!((q[3], q[1]), (-2, -1));
        assert!(q[256..].iter().all(|&v| v == 0));
        let sum = |a: usize, n: usize| q[a..a + n].iter().map(|&v| v as i32).sum::<i32>();
        assert_eq!(k.q6_start()[1], -32 * sum(16, 16));
        let p = k.pairs()[1];
        assert_eq!(((p & 0xFFFF) as i16 as i32, p >> 16), (sum(64, 32), sum(96, 32)));
        assert_eq!(k.pairs()[4..], [0; 4]);
    }
}
