//! The block formats (`blocks`) repacked at load into groups of 16 rows for the AVX-512 VNNI
//! kernel, as `lanes.rs` does for Q4_1 and int8, bit for bit what the file holds.
//!
//! Why: the row tiles of `blocks_simd` unpack a unit per tile of weight rows and spend a convert,
//! two multiplies and an FMA per 64 values and activation row; a 512-token prefill then ran at
//! 0.4x llama.cpp on Gemma 3. Here one `vpdpbusd` multiplies 16 rows by a broadcast 4-byte word of
//! activations, and a block's scales are applied once per 16 rows, as for Q4_1.
//!
//! Layout per (group of 16 rows, block of 32 values):
//! - 256 bytes of nibbles in Q4_1's lane order: byte `64s + 4*lane + e` holds value `4s + e`
//!   (low nibble) and value `16 + 4s + e` (high nibble) of row `lane`, s in 0..4;
//! - for the five-bit formats a plane of 64 bytes for the fifth bits: bit `s` of byte
//!   `4*lane + e` is that bit of value `4s + e` (s in 0..8), so step s of the dot product gets
//!   its bits with one 16-bit shift and one mask, never crossing a byte (the shifts are at most
//!   4); for Q6_K two vectors of 64 bytes holding the fifth and sixth bits of four values per
//!   byte (`crumb_values`);
//! - the scales, per format as the file has them (no rounding): legacy blocks keep the f16 scale
//!   (and Q5_1 the f16 minimum) per row and block; K-quants keep per row and super-block the
//!   f16 `d` and `dmin`, and per row and block two bytes of codes (Q4_K/Q5_K: the 6-bit scale
//!   and minimum; Q6_K: the two 8-bit scales of its 16-value halves).
//!
//! Each block's two halves (values 0..16 and 16..32) get their own integer sums, which the
//! nibble order makes free (low nibbles are the first half, high the second), so Q6_K's 16-value
//! scales and the 32-value ones of every other format share one kernel.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)] // register arrays indexed as in the math

use super::blocks::{unpack, BlockFormat, BlockMatrix, Unpacked, QK_K};
use super::cpu::{Avx512Vnni, SharedOut};
use super::q8::QK;
use super::Q8Acts;
use std::arch::x86_64::*;

/// Weight rows per group.
const LANES: usize = 16;

#[derive(Debug, Clone)]
pub struct BlockLanes {
    format: BlockFormat,
    rows: usize,
    blocks: usize,
    /// Per (group, block): 256 bytes of nibbles, then the high-bit planes.
    q: Vec<u8>,
    /// Per (group, block): the codes of 16 rows, first byte then second (K-quants only).
    codes: Vec<u8>,
    /// Per (group, scale block), 16 lanes of f16 bits: the scale (legacy: per block; K: `d` per
    /// super-block) and the minimum (Q5_1's `m`, K's `dmin`).
    d16: Vec<u16>,
    m16: Vec<u16>,
}

fn planes(format: BlockFormat) -> usize {
    match format {
        BlockFormat::Q4_0 | BlockFormat::Q4K => 0,
        BlockFormat::Q5_0 | BlockFormat::Q5_1 | BlockFormat::Q5K => 1,
        BlockFormat::Q6K => 2,
    }
}

fn kquant(format: BlockFormat) -> bool {
    matches!(format, BlockFormat::Q4K | BlockFormat::Q5K | BlockFormat::Q6K)
}

fn f16_bits(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

impl BlockLanes {
    fn block_bytes(&self) -> usize {
        256 + 64 * planes(self.format)
    }

    fn groups(&self) -> usize {
        self.rows.div_ceil(LANES)
    }

    /// Scale blocks per row: one per block, or one per super-block for the K-quants.
    fn scale_blocks(&self) -> usize {
        if kquant(self.format) {
            self.blocks * QK / QK_K
        } else {
            self.blocks
        }
    }

    pub fn bytes(&self) -> usize {
        self.q.len() + self.codes.len() + 2 * (self.d16.len() + self.m16.len())
    }

    /// Repacks `w` (padding rows are zero: value 0, scale 0).
    pub fn from_blocks(w: &BlockMatrix) -> BlockLanes {
        let (format, rows, blocks) = (w.format(), w.rows(), w.cols() / QK);
        let groups = rows.div_ceil(LANES);
        let mut p =
            BlockLanes { format, rows, blocks, q: Vec::new(), codes: Vec::new(), d16: Vec::new(), m16: Vec::new() };
        let (bb, sb) = (p.block_bytes(), p.scale_blocks());
        p.q = vec![0; groups * blocks * bb];
        p.d16 = vec![0; groups * sb * LANES];
        p.m16 = vec![0; groups * sb * LANES];
        if kquant(format) {
            p.codes = vec![0; groups * blocks * 32];
        }
        let uv = format.unit_values();
        let mut up = Unpacked::default();
        for r in 0..rows {
            let (g, lane) = (r / LANES, r % LANES);
            for u in 0..w.units() {
                let raw = w.unit(r, u);
                unpack(format, raw, &mut up);
                for bu in 0..uv / QK {
                    let b = u * uv / QK + bu;
                    let dst = (g * blocks + b) * bb;
                    let vals = &up.q[bu * QK..(bu + 1) * QK];
                    for s in 0..4 {
                        for e in 0..4 {
                            p.q[dst + 64 * s + 4 * lane + e] =
                                (vals[4 * s + e] & 0x0F) | ((vals[16 + 4 * s + e] & 0x0F) << 4);
                        }
                    }
                    if format == BlockFormat::Q6K {
                        for e in 0..4 {
                            for (pair, values) in crumb_values(e).into_iter().enumerate() {
                                p.q[dst + 256 + 64 * pair + 4 * lane + e] = values
                                    .into_iter()
                                    .zip(CRUMB_BITS)
                                    .fold(0, |byte, (v, at)| byte | ((vals[v] >> 4) & 3) << at);
                            }
                        }
                    } else {
                        for plane in 0..planes(format) {
                            for e in 0..4 {
                                let mut byte = 0u8;
                                for s in 0..8 {
                                    byte |= ((vals[4 * s + e] >> (4 + plane)) & 1) << s;
                                }
                                p.q[dst + 256 + 64 * plane + 4 * lane + e] = byte;
                            }
                        }
                    }
                }
                // The scales as stored: no arithmetic on them here.
                match format {
                    BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
                        let lb = if format == BlockFormat::Q4_0 {
                            18
                        } else if format == BlockFormat::Q5_0 {
                            22
                        } else {
                            24
                        };
                        for half in 0..2 {
                            let b = u * 2 + half;
                            p.d16[(g * sb + b) * LANES + lane] = f16_bits(raw, half * lb);
                            if format == BlockFormat::Q5_1 {
                                p.m16[(g * sb + b) * LANES + lane] = f16_bits(raw, half * lb + 2);
                            }
                        }
                    }
                    BlockFormat::Q4K | BlockFormat::Q5K => {
                        p.d16[(g * sb + u) * LANES + lane] = f16_bits(raw, 0);
                        p.m16[(g * sb + u) * LANES + lane] = f16_bits(raw, 2);
                        for j in 0..8 {
                            let (sc, m) = scale_min_codes(j, &raw[4..16]);
                            let at = (g * blocks + u * 8 + j) * 32;
                            p.codes[at + lane] = sc;
                            p.codes[at + 16 + lane] = m;
                        }
                    }
                    BlockFormat::Q6K => {
                        p.d16[(g * sb + u) * LANES + lane] = f16_bits(raw, 208);
                        for j in 0..8 {
                            let at = (g * blocks + u * 8 + j) * 32;
                            p.codes[at + lane] = raw[192 + 2 * j];
                            p.codes[at + 16 + lane] = raw[192 + 2 * j + 1];
                        }
                    }
                }
            }
        }
        p
    }

    /// Row `r` in f32, read from the groups (the row-major copy is dropped on VNNI CPUs).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() >= self.blocks * QK);
        let (g, lane) = (r / LANES, r % LANES);
        let bb = self.block_bytes();
        let f = |bits: u16| half::f16::from_bits(bits).to_f32();
        for b in 0..self.blocks {
            let base = (g * self.blocks + b) * bb;
            let mut q = [0u8; QK];
            for s in 0..4 {
                for e in 0..4 {
                    let byte = self.q[base + 64 * s + 4 * lane + e];
                    q[4 * s + e] = byte & 0x0F;
                    q[16 + 4 * s + e] = byte >> 4;
                }
            }
            if self.format == BlockFormat::Q6K {
                for e in 0..4 {
                    for (pair, values) in crumb_values(e).into_iter().enumerate() {
                        let byte = self.q[base + 256 + 64 * pair + 4 * lane + e];
                        for (v, at) in values.into_iter().zip(CRUMB_BITS) {
                            q[v] |= ((byte >> at) & 3) << 4;
                        }
                    }
                }
            } else {
                for plane in 0..planes(self.format) {
                    for e in 0..4 {
                        let byte = self.q[base + 256 + 64 * plane + 4 * lane + e];
                        for s in 0..8 {
                            q[4 * s + e] |= ((byte >> s) & 1) << (4 + plane);
                        }
                    }
                }
            }
            let [(s0, m0), (s1, m1)] = self.half_scales(g, b, lane, f);
            for v in 0..QK {
                let (s, m) = if v < 16 { (s0, m0) } else { (s1, m1) };
                out[b * QK + v] = s * q[v] as f32 + m;
            }
        }
    }

    /// (scale, minimum) of each half of block `b` of row `g * 16 + lane`, as the kernel forms them.
    fn half_scales(&self, g: usize, b: usize, lane: usize, f: impl Fn(u16) -> f32) -> [(f32, f32); 2] {
        let sb = self.scale_blocks();
        match self.format {
            BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
                let d = f(self.d16[(g * sb + b) * LANES + lane]);
                let m = match self.format {
                    BlockFormat::Q4_0 => -8.0 * d,
                    BlockFormat::Q5_0 => -16.0 * d,
                    _ => f(self.m16[(g * sb + b) * LANES + lane]),
                };
                [(d, m); 2]
            }
            BlockFormat::Q4K | BlockFormat::Q5K => {
                let at = (g * sb + b / 8) * LANES + lane;
                let (d, dmin) = (f(self.d16[at]), f(self.m16[at]));
                let c = (g * self.blocks + b) * 32;
                let (sc, m) = (self.codes[c + lane] as f32, self.codes[c + 16 + lane] as f32);
                [(d * sc, -(dmin * m)); 2]
            }
            BlockFormat::Q6K => {
                let d = f(self.d16[(g * sb + b / 8) * LANES + lane]);
                let c = (g * self.blocks + b) * 32;
                let s = |h: usize| d * (self.codes[c + 16 * h + lane] as i8) as f32;
                [(s(0), -32.0 * s(0)), (s(1), -32.0 * s(1))]
            }
        }
    }
}

/// Q6_K's two high bits of four values share a byte ("crumbs") rather than two bit planes: for
/// byte `4*lane + e` of high-bit vector `pair` (0 or 1), the values whose bits sit at bits 4-5,
/// 6-7, 0-1 and 2-3 (`CRUMB_BITS`): the low and high half's value of step `2 pair`, then of
/// step `2 pair + 1`.
/// The kernel then moves a step's bits into place with one shift and mask per half, where the two
/// planes took two each (Q6_K's unpacking was twice the integer work of the other formats').
const CRUMB_BITS: [u32; 4] = [4, 6, 0, 2];

fn crumb_values(e: usize) -> [[usize; 4]; 2] {
    let v = |step: usize, half: usize| 16 * half + 4 * step + e;
    [[v(0, 0), v(0, 1), v(1, 0), v(1, 1)], [v(2, 0), v(2, 1), v(3, 0), v(3, 1)]]
}

/// The 6-bit scale and minimum codes of sub-block `j` of a Q4_K / Q5_K super-block.
fn scale_min_codes(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// `out[t, n] = sum_k w[n, k] * a[t, k]`, driven as `lanes::matmul` is.
pub fn matmul(vnni: Avx512Vnni, w: &BlockLanes, a: &Q8Acts, out: &mut [f32]) {
    assert_eq!(w.blocks * QK, a.cols(), "inner dimensions differ");
    assert_eq!(out.len(), w.rows * a.rows());
    super::lanes::for_each_tile(&Tiles { vnni, w, a }, w.groups(), a.rows(), out);
}

/// Lane-packed block-format weights times one activation matrix.
struct Tiles<'a> {
    vnni: Avx512Vnni,
    w: &'a BlockLanes,
    a: &'a Q8Acts,
}

impl super::lanes::GroupTiles for Tiles<'_> {
    #[inline(always)]
    fn tile<const R: usize, const C: usize>(&self, g: usize, t: usize, out: &SharedOut) {
        let (vnni, w, a) = (self.vnni, self.w, self.a);
        assert!((g + R) * LANES < w.rows + LANES && t + C <= a.rows());
        // SAFETY: the token proves the features; groups g..g+R and rows t..t+C exist (asserted;
        // `matmul` asserted the shapes); each task owns the output columns of its groups.
        unsafe {
            let acc = if w.format == BlockFormat::Q6K {
                block_tile::<R, C, true>(vnni, w, a, g, t)
            } else {
                block_tile::<R, C, false>(vnni, w, a, g, t)
            };
            super::lanes::store::<R, C>(vnni, &acc, g, t, w.rows, out.ptr());
        }
    }
}

/// The constant a format subtracts from its unsigned values (`value = scale * (q - offset)`), or
/// `None` when it stores a minimum per block instead.
fn offset(format: BlockFormat) -> Option<f32> {
    match format {
        BlockFormat::Q4_0 => Some(8.0),
        BlockFormat::Q5_0 => Some(16.0),
        BlockFormat::Q6K => Some(32.0),
        BlockFormat::Q5_1 | BlockFormat::Q4K | BlockFormat::Q5K => None,
    }
}

/// Groups `g..g+R` times activation rows `t..t+C`: 16 outputs per register. `SPLIT` (Q6_K) keeps
/// a block's two halves apart because each has its own scale; every other format has one scale
/// per block, so both halves accumulate into one integer sum and the float epilogue (the
/// conversion and the scale and minimum terms, which cost as much as the integer dot products
/// when done per half) runs once per block.
///
/// # Safety
/// Groups `g..g+R` of `w` and rows `t..t+C` of `a` exist, and `w.blocks * QK == a.cols()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn block_tile<const R: usize, const C: usize, const SPLIT: bool>(
    _: Avx512Vnni,
    w: &BlockLanes,
    a: &Q8Acts,
    g: usize,
    t: usize,
) -> [[__m512; C]; R] {
    let (blocks, bb, sb) = (w.blocks, w.block_bytes(), w.scale_blocks());
    let (format, n_planes) = (w.format, planes(w.format));
    let off = offset(format);
    let k = blocks * QK;
    let nib = _mm512_set1_epi8(0x0F);
    let (bit4, crumb) = (_mm512_set1_epi8(0x10), _mm512_set1_epi8(0x30));
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let (aq, scales) = (a.quants().as_ptr(), a.scales().as_ptr());
    let (ss32, ss16) = (a.all_scaled_sums().as_ptr(), a.all_scaled_sums16().as_ptr());
    // SAFETY (whole body): (g + r) * blocks + b indexes an existing (group, block) of q and codes,
    // (g + r) * sb + scale block an existing one of d16 and m16, and (t + c) * k + b * 32 + 31 an
    // existing activation byte, for every r, c, b below.
    unsafe {
        for b in 0..blocks {
            let mut isum = [[[_mm512_setzero_si512(); 2]; C]; R];
            let mut planes_v = [[_mm512_setzero_si512(); 2]; R];
            for r in 0..R {
                let base = w.q.as_ptr().add(((g + r) * blocks + b) * bb);
                for p in 0..n_planes {
                    planes_v[r][p] = _mm512_loadu_si512(base.add(256 + 64 * p) as *const _);
                }
            }
            for step in 0..4 {
                let mut lo = [_mm512_setzero_si512(); R];
                let mut hi = [_mm512_setzero_si512(); R];
                for r in 0..R {
                    let v = _mm512_loadu_si512(w.q.as_ptr().add(((g + r) * blocks + b) * bb + step * 64) as *const _);
                    lo[r] = _mm512_and_si512(v, nib);
                    hi[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                    if n_planes == 2 {
                        // Q6_K's crumbs (`crumb_values`): bits 4-5 and 6-7 of an even step, 0-1
                        // and 2-3 of an odd one, each moved to bits 4-5 by one 16-bit shift (bits
                        // crossing into the next byte land outside the mask).
                        let c = planes_v[r][step / 2];
                        let (l, h) = if step % 2 == 0 {
                            (c, _mm512_srli_epi16(c, 2))
                        } else {
                            (_mm512_slli_epi16(c, 4), _mm512_slli_epi16(c, 2))
                        };
                        lo[r] = _mm512_or_si512(lo[r], _mm512_and_si512(l, crumb));
                        hi[r] = _mm512_or_si512(hi[r], _mm512_and_si512(h, crumb));
                    } else if n_planes == 1 {
                        // Bit s of the plane's byte to bit 4: step s for the low half, s + 4 for
                        // the high half; 16-bit shifts of at most 4 keep every bit in its byte.
                        let p0 = planes_v[r][0];
                        let up = _mm_cvtsi32_si128(4 - step as i32);
                        lo[r] = _mm512_or_si512(lo[r], _mm512_and_si512(_mm512_sll_epi16(p0, up), bit4));
                        hi[r] = _mm512_or_si512(
                            hi[r],
                            _mm512_and_si512(_mm512_srl_epi16(p0, _mm_cvtsi32_si128(step as i32)), bit4),
                        );
                    }
                }
                for c in 0..C {
                    let at = aq.add((t + c) * k + b * QK + step * 4);
                    let a_lo = _mm512_set1_epi32((at as *const i32).read_unaligned());
                    let a_hi = _mm512_set1_epi32((at.add(16) as *const i32).read_unaligned());
                    for r in 0..R {
                        isum[r][c][0] = _mm512_dpbusd_epi32(isum[r][c][0], lo[r], a_lo);
                        let h = usize::from(SPLIT);
                        isum[r][c][h] = _mm512_dpbusd_epi32(isum[r][c][h], hi[r], a_hi);
                    }
                }
            }
            // Per activation row: its block scale, and its dequantised sums (per half when
            // split), times the format's offset where it has one.
            let mut sa = [_mm512_setzero_ps(); C];
            let mut sums = [[_mm512_setzero_ps(); 2]; C];
            for c in 0..C {
                let row = t + c;
                sa[c] = _mm512_set1_ps(*scales.add(row * blocks + b));
                let times = off.unwrap_or(1.0);
                if SPLIT {
                    for h in 0..2 {
                        sums[c][h] = _mm512_set1_ps(times * *ss16.add(row * blocks * 2 + 2 * b + h));
                    }
                } else {
                    sums[c][0] = _mm512_set1_ps(times * *ss32.add(row * blocks + b));
                }
            }
            for r in 0..R {
                let gr = g + r;
                // Per-lane scale of each half, and the minimum where the format stores one.
                let (s, m): ([__m512; 2], __m512) = match format {
                    BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
                        let at = (gr * sb + b) * LANES;
                        let d = _mm512_cvtph_ps(_mm256_loadu_si256(w.d16.as_ptr().add(at) as *const __m256i));
                        let m = if format == BlockFormat::Q5_1 {
                            _mm512_cvtph_ps(_mm256_loadu_si256(w.m16.as_ptr().add(at) as *const __m256i))
                        } else {
                            _mm512_setzero_ps()
                        };
                        ([d, d], m)
                    }
                    BlockFormat::Q4K | BlockFormat::Q5K => {
                        let at = (gr * sb + b / 8) * LANES;
                        let d = _mm512_cvtph_ps(_mm256_loadu_si256(w.d16.as_ptr().add(at) as *const __m256i));
                        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(w.m16.as_ptr().add(at) as *const __m256i));
                        let c = w.codes.as_ptr().add((gr * blocks + b) * 32);
                        let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(c as *const __m128i)));
                        let mc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(c.add(16) as *const __m128i)));
                        let s = _mm512_mul_ps(d, sc);
                        ([s, s], _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, mc)))
                    }
                    BlockFormat::Q6K => {
                        let at = (gr * sb + b / 8) * LANES;
                        let d = _mm512_cvtph_ps(_mm256_loadu_si256(w.d16.as_ptr().add(at) as *const __m256i));
                        let c = w.codes.as_ptr().add((gr * blocks + b) * 32);
                        let s0 = _mm512_mul_ps(
                            d,
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c as *const __m128i))),
                        );
                        let s1 = _mm512_mul_ps(
                            d,
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c.add(16) as *const __m128i))),
                        );
                        ([s0, s1], _mm512_setzero_ps())
                    }
                };
                for c in 0..C {
                    for h in 0..1 + usize::from(SPLIT) {
                        let q = _mm512_cvtepi32_ps(isum[r][c][h]);
                        acc[r][c] = if off.is_some() {
                            // scale * (s_a * sum q a - offset * s_a * sum a)
                            _mm512_fmadd_ps(_mm512_fmsub_ps(q, sa[c], sums[c][h]), s[h], acc[r][c])
                        } else {
                            // scale * s_a * sum q a + minimum * s_a * sum a
                            let acc1 = _mm512_fmadd_ps(q, _mm512_mul_ps(s[h], sa[c]), acc[r][c]);
                            _mm512_fmadd_ps(m, sums[c][h], acc1)
                        };
                    }
                }
            }
        }
    }
    acc
}
