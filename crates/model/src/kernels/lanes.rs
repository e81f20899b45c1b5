//! Lane-packed weights and their AVX-512 VNNI matmul: the kernels of prefill, batched decode and
//! the output head on CPUs with VNNI.
//!
//! Layout and why it is fast: weights are repacked at load into groups of 16 rows. For each block
//! of 32 columns a group stores, per step of 4 columns, the 4 bytes of each of its 16 rows side by
//! side (64 bytes), so one `vpdpbusd` multiplies 16 rows by the same 4 activation bytes (a
//! broadcast, which is a load, not an ALU instruction) and adds each row's products into its own
//! i32 lane. Eight steps finish a block with every row's exact integer dot product in its lane;
//! only then is the block's scale applied, once per 16 rows (convert, multiply, add). The row-wise
//! kernels in `avx512.rs` spend a convert, a multiply and an add per two blocks *and* row, plus a
//! horizontal sum per output: 4 ALU instructions per 64 multiply-adds, against ~12 per 512 here.
//! Lanes are output columns, so results are stored as they are, no horizontal sums.
//!
//! Q4_1 groups keep the GGUF nibble bytes: byte `i` of a block holds value `i` (low nibble) and
//! value `i + 16` (high nibble), so the 64 bytes of steps `p` and `p + 4` are the GGUF bytes
//! `4p..4p+4` of the 16 rows, split with one `and` and one shift. int8 weights are stored with
//! their top bit flipped (`w + 128`, the unsigned operand `vpdpbusd` wants); each block's lanes
//! start at `-128 * sum(a)` to take the offset back out exactly.
//!
//! Every output goes through the same instruction sequence whatever the tile, so batched results
//! equal unbatched ones bit for bit. Rows past the matrix's end are zero padding, never stored.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)] // register arrays indexed as in the math

use super::blocks_tile::{for_mode, keeps, kept, KEEP, KEPT};
use super::cpu::{Avx512Vnni, SharedOut};
use super::q8::QK;
use super::team::Disjoint;
use super::{Q4Matrix, Q8Acts, Q8Matrix};
use std::arch::x86_64::*;

/// Weight rows per group (one zmm of i32 or f32 lanes).
pub const LANES: usize = 16;

/// A weight matrix repacked into groups of [`LANES`] rows.
#[derive(Debug, Clone)]
pub struct Packed {
    pub(super) rows: usize,
    pub(super) blocks: usize,
    /// Q4_1: 256 bytes per (group, block); int8: 512.
    pub(super) q: Vec<u8>,
    /// int8: per (group, block), the 16 rows' scales.
    pub(super) d: Vec<f32>,
    /// Q4_1: per (group, block), the 16 rows' scales and minimums as f16 bits, exactly as the
    /// GGUF stores them: decode is bound by memory traffic, and f32 copies made the weights
    /// 6 bits each instead of 5.
    pub(super) d16: Vec<u16>,
    pub(super) m16: Vec<u16>,
    pub(super) q4: bool,
}

impl Packed {
    pub(super) fn groups(&self) -> usize {
        self.rows.div_ceil(LANES)
    }

    /// Q4_1 rows regrouped (padding rows are zero: value 0, scale 0, minimum 0).
    pub fn from_q4(w: &Q4Matrix) -> Packed {
        let (rows, blocks) = (w.rows(), w.cols() / QK);
        let groups = rows.div_ceil(LANES);
        let mut p = Packed {
            rows,
            blocks,
            q: vec![0; groups * blocks * 256],
            d: Vec::new(),
            d16: vec![0; groups * blocks * LANES],
            m16: vec![0; groups * blocks * LANES],
            q4: true,
        };
        for r in 0..rows {
            let (g, lane) = (r / LANES, r % LANES);
            let (nib, d, m) = w.row(r);
            for b in 0..blocks {
                let gb = g * blocks + b;
                for step in 0..4 {
                    let dst = gb * 256 + step * 64 + lane * 4;
                    p.q[dst..dst + 4].copy_from_slice(&nib[b * 16 + step * 4..b * 16 + step * 4 + 4]);
                }
                // Exact: the values came from the GGUF's f16.
                p.d16[gb * LANES + lane] = half::f16::from_f32(d[b]).to_bits();
                p.m16[gb * LANES + lane] = half::f16::from_f32(m[b]).to_bits();
            }
        }
        p
    }

    /// `W^T` for any weight matrix `w (rows, cols)`: `cols` int8 rows of `rows` values (padded
    /// with zeros to whole pairs of blocks), quantised per block of [`QK`] symmetrically to
    /// [-127, 127], written straight into the groups. Each task takes 32 rows of `w` at a time,
    /// dequantised into a tile that stays in cache, and writes the one block they make of every
    /// group: no f32 copy of the matrix, no row-major copy to repack. What `dy W` multiplies by
    /// (`super::through`).
    pub(super) fn transposed(w: &super::Weights) -> Packed {
        use rayon::prelude::*;
        let (rows, cols) = (w.rows(), w.cols());
        let blocks = rows.next_multiple_of(2 * QK) / QK;
        let groups = cols.div_ceil(LANES);
        let mut p = Packed {
            rows: cols,
            blocks,
            // Every byte and scale is written below (padding lanes as 128, which is 0 after the
            // flip, from zero columns).
            q: vec![0; groups * blocks * 512],
            d: vec![0.0; groups * blocks * LANES],
            d16: Vec::new(),
            m16: Vec::new(),
            q4: false,
        };
        let (q, d) = (Disjoint::new(&mut p.q), Disjoint::new(&mut p.d));
        let avx512 = super::cpu().avx512f;
        (0..blocks).into_par_iter().for_each_init(
            || vec![0f32; QK * cols],
            |tile, b| {
                fill_tile(w, b * QK, tile);
                for g in 0..groups {
                    let gb = g * blocks + b;
                    // SAFETY: block `b` of every group is written by this task alone (one task
                    // per block); `slice` checks the bounds.
                    let (q, d) = unsafe { (q.slice(gb * 512, 512), d.slice(gb * LANES, LANES)) };
                    match avx512 {
                        Some(token) if g * LANES + LANES <= cols => {
                            let rows: [&[f32; LANES]; QK] = std::array::from_fn(|o| {
                                tile[o * cols + g * LANES..][..LANES].try_into().expect("16 columns")
                            });
                            let (q, d) = (q.try_into().expect("512 bytes"), d.try_into().expect("16 scales"));
                            // SAFETY: the token proves AVX-512F; the lengths are in the types.
                            unsafe { pack_block_avx512(token, &rows, q, d) }
                        }
                        _ => pack_block(tile, cols, g * LANES, q, d),
                    }
                }
            },
        );
        p
    }

    /// int8 rows regrouped, top bit flipped.
    pub fn from_q8(w: &Q8Matrix) -> Packed {
        let (rows, blocks) = (w.rows(), w.cols() / QK);
        let groups = rows.div_ceil(LANES);
        let mut p = Packed {
            rows,
            blocks,
            // Padding rows hold 128 (= 0 after the flip).
            q: vec![128; groups * blocks * 512],
            d: vec![0.0; groups * blocks * LANES],
            d16: Vec::new(),
            m16: Vec::new(),
            q4: false,
        };
        for r in 0..rows {
            let (g, lane) = (r / LANES, r % LANES);
            let (q, d) = w.row(r);
            for b in 0..blocks {
                let gb = g * blocks + b;
                for step in 0..8 {
                    let dst = gb * 512 + step * 64 + lane * 4;
                    for e in 0..4 {
                        p.q[dst + e] = (q[b * QK + step * 4 + e] as u8) ^ 0x80;
                    }
                }
                p.d[gb * LANES + lane] = d[b];
            }
        }
        p
    }

    pub fn bytes(&self) -> usize {
        self.q.len() + self.d.len() * 4 + (self.d16.len() + self.m16.len()) * 2
    }

    /// The 16 rows of group `g` in f32, as [`Packed::dequantize_row`] gives each (the same
    /// arithmetic), into `out` (16 rows of `blocks * QK` values, row-major; rows past the matrix
    /// are left as they are): each block's bytes read once and in order, rather than four bytes
    /// of every 64 per row. The transposed copies of `dy W` read matrices back this way.
    pub fn dequantize_group(&self, g: usize, out: &mut [f32]) {
        match super::cpu().avx2 {
            Some(avx2) => super::blocks_lanes_avx2::dequantize_packed_group(avx2, self, g, out),
            None => self.dequantize_group_scalar(g, out),
        }
    }

    /// [`Packed::dequantize_group`] value by value (CPUs without AVX2; the vector one's reference).
    pub(super) fn dequantize_group_scalar(&self, g: usize, out: &mut [f32]) {
        let cols = self.blocks * QK;
        assert!(g < self.groups() && out.len() >= LANES * cols);
        let valid = (self.rows - g * LANES).min(LANES);
        let per = if self.q4 { 256 } else { 512 };
        let group = &self.q[g * self.blocks * per..(g + 1) * self.blocks * per];
        for (b, src) in group.chunks_exact(per).enumerate() {
            let gb = g * self.blocks + b;
            if self.q4 {
                let f = |bits: &[u16]| -> [f32; LANES] {
                    std::array::from_fn(|l| half::f16::from_bits(bits[gb * LANES + l]).to_f32())
                };
                let (d, m) = (f(&self.d16), f(&self.m16));
                for (step, chunk) in src.chunks_exact(64).enumerate() {
                    for lane in 0..valid {
                        let row = &mut out[lane * cols + b * QK..][..QK];
                        for (e, byte) in chunk[lane * 4..lane * 4 + 4].iter().enumerate() {
                            row[step * 4 + e] = (byte & 0x0F) as f32 * d[lane] + m[lane];
                            row[16 + step * 4 + e] = (byte >> 4) as f32 * d[lane] + m[lane];
                        }
                    }
                }
            } else {
                let d: &[f32; LANES] = self.d[gb * LANES..(gb + 1) * LANES].try_into().expect("16 scales");
                for (step, chunk) in src.chunks_exact(64).enumerate() {
                    let chunk: &[u8; 64] = chunk.try_into().expect("64 bytes");
                    for lane in 0..valid {
                        let row = &mut out[lane * cols + b * QK + step * 4..][..4];
                        for (e, v) in row.iter_mut().enumerate() {
                            *v = ((chunk[lane * 4 + e] ^ 0x80) as i8) as f32 * d[lane];
                        }
                    }
                }
            }
        }
    }

    /// Row `r` in f32, read from the groups (for matrices that keep no row-major copy).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() >= self.blocks * QK);
        let (g, lane) = (r / LANES, r % LANES);
        // The group's blocks in order, each block's steps as 64-byte chunks of which this row
        // owns bytes `4 lane..4 lane + 4` (slices, so the loops carry no index checks).
        let per = if self.q4 { 256 } else { 512 };
        let group = &self.q[g * self.blocks * per..(g + 1) * self.blocks * per];
        for (b, (src, block)) in group.chunks_exact(per).zip(out.chunks_exact_mut(QK)).enumerate() {
            let gb = g * self.blocks + b;
            if self.q4 {
                let d = half::f16::from_bits(self.d16[gb * LANES + lane]).to_f32();
                let m = half::f16::from_bits(self.m16[gb * LANES + lane]).to_f32();
                let (low, high) = block.split_at_mut(16);
                for (step, chunk) in src.chunks_exact(64).enumerate() {
                    let four: &[u8; 4] = chunk[lane * 4..lane * 4 + 4].try_into().expect("4 bytes");
                    for (e, byte) in four.iter().enumerate() {
                        low[step * 4 + e] = (byte & 0x0F) as f32 * d + m;
                        high[step * 4 + e] = (byte >> 4) as f32 * d + m;
                    }
                }
            } else {
                let d = self.d[gb * LANES + lane];
                for (chunk, values) in src.chunks_exact(64).zip(block.chunks_exact_mut(4)) {
                    let four: &[u8; 4] = chunk[lane * 4..lane * 4 + 4].try_into().expect("4 bytes");
                    for (v, byte) in values.iter_mut().zip(four) {
                        *v = ((byte ^ 0x80) as i8) as f32 * d;
                    }
                }
            }
        }
    }
}

/// Rows `r0..r0 + 32` of `w` into `tile` (32 rows of `w.cols()`), rows past the matrix zero:
/// lane-packed matrices a group at a time, the others row by row.
fn fill_tile(w: &super::Weights, r0: usize, tile: &mut [f32]) {
    use super::Weights;
    /// A matrix's lane-packed groups, of either layout.
    enum Groups<'a> {
        Packed(&'a Packed),
        Blocks(&'a super::blocks_lanes::BlockLanes),
    }
    let (rows, cols) = (w.rows(), w.cols());
    let groups = match w {
        Weights::Q8(m) => m.lanes.as_deref().map(Groups::Packed),
        Weights::Q4(m) => m.lanes.as_deref().map(Groups::Packed),
        Weights::Block(m) => m.lanes.as_deref().map(Groups::Blocks),
        Weights::F32(_) => None,
    };
    let real = QK.min(rows.saturating_sub(r0));
    tile[real * cols..].fill(0.0);
    match groups {
        Some(groups) if r0.is_multiple_of(LANES) => {
            for (i, part) in tile.chunks_exact_mut(LANES * cols).enumerate() {
                let g = r0 / LANES + i;
                match (&groups, r0 + i * LANES < rows) {
                    (Groups::Packed(p), true) => p.dequantize_group(g, part),
                    (Groups::Blocks(b), true) => b.dequantize_group(g, part),
                    (_, false) => {}
                }
            }
        }
        _ => {
            for (i, row) in tile.chunks_exact_mut(cols).take(real).enumerate() {
                w.dequantize_row(r0 + i, row);
            }
        }
    }
}

/// One (group, block) of a transposed int8 matrix: columns `k0..k0 + 16` of `tile` (32 rows
/// `cols` wide; columns past its width count as zero), each quantised over its 32 values, into
/// the group's 512 bytes (`out`, top bit flipped) and 16 scales (`scales`).
fn pack_block(tile: &[f32], cols: usize, k0: usize, out: &mut [u8], scales: &mut [f32]) {
    let width = cols.saturating_sub(k0).min(LANES);
    // Fixed-size rows, so that the loops below vectorise.
    let mut rows = [[0f32; LANES]; QK];
    for (o, row) in rows.iter_mut().enumerate() {
        row[..width].copy_from_slice(&tile[o * cols + k0..][..width]);
    }
    let mut amax = [0f32; LANES];
    for row in &rows {
        for (m, x) in amax.iter_mut().zip(row) {
            *m = m.max(x.abs());
        }
    }
    let scale = amax.map(|m| m / 127.0);
    let inv = scale.map(|s| if s > 0.0 { 1.0 / s } else { 0.0 });
    scales.copy_from_slice(&scale);
    // Round to nearest through the float adder (|v| <= 127, so 1.5 * 2^23 + v holds the rounded
    // value in its low mantissa bits; ties go to even, where `quantize_into` goes away from zero:
    // a fresh rounding either way), then the byte with its top bit flipped.
    let byte = |v: f32| ((v + 12_582_912.0).to_bits() & 0xFF) ^ 0x80;
    for (step, four) in rows.chunks_exact(4).enumerate() {
        // Each column's four values of the step as one little-endian word.
        let mut words = [0u32; LANES];
        for l in 0..LANES {
            words[l] = byte(four[0][l] * inv[l])
                | byte(four[1][l] * inv[l]) << 8
                | byte(four[2][l] * inv[l]) << 16
                | byte(four[3][l] * inv[l]) << 24;
        }
        for (dst, w) in out[step * 64..(step + 1) * 64].chunks_exact_mut(4).zip(words) {
            dst.copy_from_slice(&w.to_le_bytes());
        }
    }
}

/// [`pack_block`] for a whole group, with AVX-512F: the same numbers (`cvtps` rounds to nearest
/// even, as the scalar float-adder trick does).
///
/// # Safety
/// The CPU runs AVX-512F (the token).
#[target_feature(enable = "avx512f")]
unsafe fn pack_block_avx512(
    _: super::cpu::Avx512F,
    rows: &[&[f32; LANES]; QK],
    out: &mut [u8; 512],
    scales: &mut [f32; LANES],
) {
    let v: [__m512; QK] = std::array::from_fn(|o| {
        // SAFETY: each row holds 16 floats (its type).
        unsafe { _mm512_loadu_ps(rows[o].as_ptr()) }
    });
    let mut amax = _mm512_setzero_ps();
    for x in &v {
        amax = _mm512_max_ps(amax, _mm512_abs_ps(*x));
    }
    let scale = _mm512_div_ps(amax, _mm512_set1_ps(127.0));
    let nonzero = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(scale, _mm512_setzero_ps());
    let inv = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(1.0), scale);
    // SAFETY: `scales` holds 16 floats.
    unsafe { _mm512_storeu_ps(scales.as_mut_ptr(), scale) };
    let low = _mm512_set1_epi32(0xFF);
    for step in 0..8 {
        let mut word = _mm512_setzero_si512();
        for e in 0..4 {
            let q = _mm512_cvtps_epi32(_mm512_mul_ps(v[4 * step + e], inv));
            let byte = _mm512_and_si512(q, low);
            word = _mm512_or_si512(word, _mm512_sllv_epi32(byte, _mm512_set1_epi32(8 * e as i32)));
        }
        let flipped = _mm512_xor_si512(word, _mm512_set1_epi32(0x8080_8080u32 as i32));
        // SAFETY: bytes `64 step..64 (step + 1)` lie in the 512.
        unsafe { _mm512_storeu_si512(out[step * 64..].as_mut_ptr().cast(), flipped) };
    }
}

/// `out[t, n] = sum_k w[n, k] * a[t, k]` with the lane kernels; `out` is row-major (T, N). The
/// token proves the CPU features; the shapes are asserted here and per tile.
pub fn matmul(vnni: Avx512Vnni, w: &Packed, a: &Q8Acts, out: &mut [f32]) {
    assert_eq!(w.blocks * QK, a.cols(), "inner dimensions differ");
    assert_eq!(out.len(), w.rows * a.rows());
    for_each_tile(&Tiles { vnni, w, a }, w.groups(), a.rows(), out);
}

/// A weight layout in 16-row lane groups, as [`for_each_tile`] drives it: `tile::<R, C>`
/// computes groups `g..g+R` times activation rows `t..t+C` into `out` (row-major (T, N)).
pub(crate) trait GroupTiles: Sync {
    fn tile<const R: usize, const C: usize>(&self, g: usize, t: usize, out: &SharedOut);
}

/// Runs a matmul of `groups` lane groups by `t_rows` activation rows as tasks of whole group
/// pairs, a few per thread for balance and fewer when T is large; inside a task, tiles of
/// 2 (or a last 1) groups by 4, 2 or 1 rows.
pub(crate) fn for_each_tile<K: GroupTiles>(k: &K, groups: usize, t_rows: usize, out: &mut [f32]) {
    let threads = super::team::threads();
    let by_balance = groups.div_ceil(threads * 4);
    let by_work = (1024 / t_rows.max(1)).max(2);
    let chunk = by_balance.min(by_work).max(1).next_multiple_of(2);
    let shared = SharedOut::new(out);
    super::team::for_each(groups.div_ceil(chunk), |c| {
        let (g0, g1) = (c * chunk, ((c + 1) * chunk).min(groups));
        let shared = &shared;
        let mut g = g0;
        while g < g1 {
            // One activation row (decode) streams the weights from memory: one group at a time
            // reads one sequential stream per task where two groups read two interleaved ones,
            // and the prefetchers keep up better (a Q4_K stream ten times the L3 on two
            // threads: ~24 -> ~31 GB/s, `matmul_bench stream`). With more rows the weights are
            // reused from cache and two groups a tile save activation loads.
            let two = g + 2 <= g1 && t_rows > 1;
            let mut t = 0;
            while t < t_rows {
                let cols = if t + 4 <= t_rows {
                    4
                } else if t + 2 <= t_rows {
                    2
                } else {
                    1
                };
                match (two, cols) {
                    (true, 4) => k.tile::<2, 4>(g, t, shared),
                    (true, 2) => k.tile::<2, 2>(g, t, shared),
                    (true, _) => k.tile::<2, 1>(g, t, shared),
                    (false, 4) => k.tile::<1, 4>(g, t, shared),
                    (false, 2) => k.tile::<1, 2>(g, t, shared),
                    (false, _) => k.tile::<1, 1>(g, t, shared),
                }
                t += cols;
            }
            g += if two { 2 } else { 1 };
        }
    });
}

/// Q4_1 or int8 lane-packed weights times one activation matrix.
struct Tiles<'a> {
    vnni: Avx512Vnni,
    w: &'a Packed,
    a: &'a Q8Acts,
}

impl GroupTiles for Tiles<'_> {
    #[inline(always)]
    fn tile<const R: usize, const C: usize>(&self, g: usize, t: usize, out: &SharedOut) {
        let (vnni, w, a) = (self.vnni, self.w, self.a);
        assert!((g + R) * LANES < w.rows + LANES && t + C <= a.rows());
        // SAFETY: the token proves the features; groups g..g+R and rows t..t+C exist (asserted;
        // `matmul` asserted the output's shape); each task owns the output columns of its groups,
        // so writes never overlap; `buf` is this thread's kept groups (`blocks_tile::kept`).
        unsafe {
            let acc = if w.q4 {
                // Unpacked once a group with many rows, where the CPU gains (`blocks_tile::kept`).
                let (mode, buf) = kept(keeps(0), a.rows(), t, w.blocks);
                for_mode!(mode, |P| q4_tile::<R, C, P>(vnni, w, a, g, t, buf))
            } else {
                q8_tile::<R, C>(vnni, w, a, g, t)
            };
            store::<R, C>(vnni, &acc, g, t, w.rows, out.ptr());
        }
    }
}

/// Writes a tile's registers to output rows `t..t+C`, columns of groups `g..g+R` (padding lanes
/// masked). Its own target-feature function so that the store intrinsic is inlined.
///
/// # Safety
/// Rows `t..t+C` and the columns of groups `g..g+R` lie inside the (T, n_out) output at `out`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn store<const R: usize, const C: usize>(
    _: Avx512Vnni,
    acc: &[[__m512; C]; R],
    g: usize,
    t: usize,
    n_out: usize,
    out: *mut f32,
) {
    for r in 0..R {
        let n = (g + r) * LANES;
        let valid = (n_out - n).min(LANES);
        let mask: __mmask16 = if valid == LANES { 0xFFFF } else { (1u16 << valid) - 1 };
        for c in 0..C {
            // SAFETY (caller): inside the output.
            unsafe { _mm512_mask_storeu_ps(out.add((t + c) * n_out + n), mask, acc[r][c]) };
        }
    }
}

/// Q4_1 groups `g..g+R` times activation rows `t..t+C`: 16 outputs per register.
///
/// # Safety
/// Groups `g..g+R` of `w` and rows `t..t+C` of `a` exist, and `w.blocks * QK == a.cols()`; with
/// `P` KEEP `buf` has `R * KEPT_BLOCK * w.blocks` writable bytes, with KEPT a KEEP tile of the
/// same groups wrote them (`blocks_tile::kept`).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q4_tile<const R: usize, const C: usize, const P: u8>(
    _: Avx512Vnni,
    w: &Packed,
    a: &Q8Acts,
    g: usize,
    t: usize,
    buf: *mut u8,
) -> [[__m512; C]; R] {
    let blocks = w.blocks;
    let k = blocks * QK;
    let mask = _mm512_set1_epi8(0x0F);
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let (aq, scales, ss) = (a.quants().as_ptr(), a.scales().as_ptr(), a.all_scaled_sums().as_ptr());
    // SAFETY (whole body): (g + r) * blocks + b indexes an existing (group, block), and
    // (t + c) * k + b * 32 + 31 an existing activation byte, for every r, c, b below; a kept
    // step's two registers lie at `128 * ((r * blocks + b) * 4 + step)` in `buf`.
    unsafe {
        for b in 0..blocks {
            // A tile's first pass reads the weights from memory: asked for ahead, as the AVX2
            // tiles do (`lanes_avx2::prefetch`); later passes find them in L1.
            for r in (0..R).filter(|_| P != KEPT) {
                let at = w.q.as_ptr().wrapping_add(((g + r) * blocks + b) * 256 + super::lanes_avx2::PREFETCH_AHEAD);
                super::lanes_avx2::prefetch(at, 256);
            }
            let mut isum = [[_mm512_setzero_si512(); C]; R];
            for step in 0..4 {
                let mut lo = [_mm512_setzero_si512(); R];
                let mut hi = [_mm512_setzero_si512(); R];
                for r in 0..R {
                    let kept = buf.wrapping_add(((r * blocks + b) * 4 + step) * 128) as *mut __m512i;
                    if P == KEPT {
                        lo[r] = _mm512_loadu_si512(kept as *const _);
                        hi[r] = _mm512_loadu_si512(kept.add(1) as *const _);
                        continue;
                    }
                    let v = _mm512_loadu_si512(w.q.as_ptr().add(((g + r) * blocks + b) * 256 + step * 64) as *const _);
                    lo[r] = _mm512_and_si512(v, mask);
                    hi[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
                    if P == KEEP {
                        _mm512_storeu_si512(kept as *mut _, lo[r]);
                        _mm512_storeu_si512(kept.add(1) as *mut _, hi[r]);
                    }
                }
                for c in 0..C {
                    let base = aq.add((t + c) * k + b * QK + step * 4);
                    let a_lo = _mm512_set1_epi32((base as *const i32).read_unaligned());
                    let a_hi = _mm512_set1_epi32((base.add(16) as *const i32).read_unaligned());
                    for r in 0..R {
                        isum[r][c] = _mm512_dpbusd_epi32(isum[r][c], lo[r], a_lo);
                        isum[r][c] = _mm512_dpbusd_epi32(isum[r][c], hi[r], a_hi);
                    }
                }
            }
            for r in 0..R {
                let gb = (g + r) * blocks + b;
                let dv = _mm512_cvtph_ps(_mm256_loadu_si256(w.d16.as_ptr().add(gb * LANES) as *const __m256i));
                let mv = _mm512_cvtph_ps(_mm256_loadu_si256(w.m16.as_ptr().add(gb * LANES) as *const __m256i));
                for c in 0..C {
                    let s = _mm512_set1_ps(*scales.add((t + c) * blocks + b));
                    let sum = _mm512_set1_ps(*ss.add((t + c) * blocks + b));
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]), _mm512_mul_ps(dv, s), acc[r][c]);
                    acc[r][c] = _mm512_fmadd_ps(mv, sum, acc[r][c]);
                }
            }
        }
    }
    acc
}

/// int8 groups `g..g+R` times activation rows `t..t+C`.
///
/// # Safety
/// As [`q4_tile`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8_tile<const R: usize, const C: usize>(
    _: Avx512Vnni,
    w: &Packed,
    a: &Q8Acts,
    g: usize,
    t: usize,
) -> [[__m512; C]; R] {
    let blocks = w.blocks;
    let k = blocks * QK;
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let (aq, scales, sums) = (a.quants().as_ptr(), a.scales().as_ptr(), a.all_sums().as_ptr());
    // SAFETY (whole body): as in q4_tile, with 512 bytes per (group, block).
    unsafe {
        for b in 0..blocks {
            for r in 0..R {
                let at = w.q.as_ptr().wrapping_add(((g + r) * blocks + b) * 512 + super::lanes_avx2::PREFETCH_AHEAD);
                super::lanes_avx2::prefetch(at, 512);
            }
            let mut isum = [[_mm512_setzero_si512(); C]; R];
            for c in 0..C {
                // Undo the +128 of every weight byte: -128 * sum(a) of this block, in every lane.
                let start = _mm512_set1_epi32(-(*sums.add((t + c) * blocks + b) << 7));
                for r in 0..R {
                    isum[r][c] = start;
                }
            }
            for step in 0..8 {
                let mut wv = [_mm512_setzero_si512(); R];
                for r in 0..R {
                    wv[r] = _mm512_loadu_si512(w.q.as_ptr().add(((g + r) * blocks + b) * 512 + step * 64) as *const _);
                }
                for c in 0..C {
                    let av =
                        _mm512_set1_epi32((aq.add((t + c) * k + b * QK + step * 4) as *const i32).read_unaligned());
                    for r in 0..R {
                        isum[r][c] = _mm512_dpbusd_epi32(isum[r][c], wv[r], av);
                    }
                }
            }
            for r in 0..R {
                let dv = _mm512_loadu_ps(w.d.as_ptr().add(((g + r) * blocks + b) * LANES));
                for c in 0..C {
                    let s = _mm512_set1_ps(*scales.add((t + c) * blocks + b));
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]), _mm512_mul_ps(dv, s), acc[r][c]);
                }
            }
        }
    }
    acc
}

#[cfg(test)]
mod pack_tests {
    use super::*;

    /// The AVX-512 transposing pack writes the scalar one's bytes and scales exactly, including a
    /// zero column (scale 0), ties and the extremes.
    #[test]
    fn the_vector_pack_equals_the_scalar_one() {
        let Some(token) = crate::kernels::cpu().avx512f else {
            eprintln!("SKIPPED: no AVX-512F here");
            return;
        };
        let cols = 48;
        let values = crate::kernels::tests::values(QK * cols, 11);
        let mut tile: Vec<f32> = values.iter().map(|v| v * 3.0).collect();
        for o in 0..QK {
            tile[o * cols + 5] = 0.0; // a zero column
            tile[o * cols + 6] = if o == 0 { 127.0 } else { (o as f32 - 16.0) + 0.5 };
            // ties
        }
        for k0 in [0, 16, 32] {
            let (mut q1, mut d1) = ([0u8; 512], [0f32; LANES]);
            pack_block(&tile, cols, k0, &mut q1, &mut d1);
            let rows: [&[f32; LANES]; QK] = std::array::from_fn(|o| tile[o * cols + k0..][..LANES].try_into().unwrap());
            let (mut q2, mut d2) = ([0u8; 512], [0f32; LANES]);
            // SAFETY: the token proves AVX-512F.
            unsafe { pack_block_avx512(token, &rows, &mut q2, &mut d2) };
            assert_eq!(d1, d2, "scales at {k0}");
            assert_eq!(q1, q2, "bytes at {k0}");
        }
    }

    /// A group read back at once (with AVX2 where present, and value by value) equals its rows
    /// read one by one, for Q4_1 and int8 groups, the last group partly padding (13 rows: an
    /// odd count past the first eight lanes).
    #[test]
    fn a_group_read_at_once_equals_its_rows() {
        let (rows, cols) = (45, 96);
        let data = crate::kernels::tests::values(rows * cols, 5);
        let q8 = Packed::from_q8(&Q8Matrix::from_f32(&data, rows, cols));
        let t = candle_core::Tensor::from_vec(data.clone(), (rows, cols), &candle_core::Device::Cpu).unwrap();
        let raw = candle_core::quantized::QTensor::quantize(&t, candle_core::quantized::GgmlDType::Q4_1).unwrap();
        let q4 = Packed::from_q4(&Q4Matrix::from_q4_1_bytes(&raw.data().unwrap(), rows, cols).unwrap());
        for p in [&q8, &q4] {
            for g in 0..p.groups() {
                let (mut group, mut scalar) = (vec![f32::NAN; LANES * cols], vec![f32::NAN; LANES * cols]);
                p.dequantize_group(g, &mut group);
                p.dequantize_group_scalar(g, &mut scalar);
                let valid = (rows - g * LANES).min(LANES);
                for (lane, (got, one_by_one)) in
                    group.chunks_exact(cols).zip(scalar.chunks_exact(cols)).enumerate().take(valid)
                {
                    let mut want = vec![0f32; cols];
                    p.dequantize_row(g * LANES + lane, &mut want);
                    assert_eq!(got, &want[..], "group {g}, lane {lane}");
                    assert_eq!(one_by_one, &want[..], "group {g}, lane {lane}, value by value");
                }
                assert!(group[valid * cols..].iter().all(|v| v.is_nan()), "group {g}: padding rows written");
            }
        }
    }
}
