//! The block formats (`blocks`) repacked at load into groups of 16 rows for the AVX-512 VNNI
//! kernel (`blocks_tile`), as `lanes.rs` does for Q4_1 and int8, bit for bit what the file holds.
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
//!   and minimum, laid out per two blocks as `sc_at` and `m_at` say; Q6_K: the two 8-bit scales
//!   of its 16-value halves).
//!
//! A block's two halves (values 0..16 and 16..32) can get their own integer sums, which the
//! nibble order makes free (low nibbles are the first half, high the second), so Q6_K's 16-value
//! scales and the 32-value ones of every other format share one kernel (`blocks_tile`).

use super::blocks::{unpack, BlockFormat, BlockMatrix, Unpacked, QK_K};
use super::q8::QK;

/// Weight rows per group.
pub(super) const LANES: usize = 16;

#[derive(Debug, Clone)]
pub struct BlockLanes {
    pub(super) format: BlockFormat,
    pub(super) rows: usize,
    pub(super) blocks: usize,
    /// Per (group, block): 256 bytes of nibbles, then the high-bit planes.
    pub(super) q: Vec<u8>,
    /// 32 bytes per (group, block) of the 16 rows' codes (K-quants only). Q6_K: per block, the
    /// 16 lanes' first-half scales, then their second-half ones. Q4_K/Q5_K: per two blocks (64
    /// bytes), the scale codes of the even block, of the odd block, then per lane the two
    /// minimum codes side by side (even, odd), so that one zero-extension to 16 bits gives the
    /// K tile's `vpdpwssd` its pairs (`sc_at`, `m_at`).
    pub(super) codes: Vec<u8>,
    /// Per (group, scale block), 16 lanes of f16 bits: the scale (legacy: per block; K: `d` per
    /// super-block) and the minimum (Q5_1's `m`, K's `dmin`).
    pub(super) d16: Vec<u16>,
    pub(super) m16: Vec<u16>,
}

/// High-bit planes (64 bytes each) after a block's 256 bytes of nibbles.
pub(super) fn planes(format: BlockFormat) -> usize {
    match format {
        BlockFormat::Q4_0 | BlockFormat::Q4K => 0,
        BlockFormat::Q5_0 | BlockFormat::Q5_1 | BlockFormat::Q5K => 1,
        BlockFormat::Q6K => 2,
    }
}

pub(super) fn kquant(format: BlockFormat) -> bool {
    matches!(format, BlockFormat::Q4K | BlockFormat::Q5K | BlockFormat::Q6K)
}

fn f16_bits(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

impl BlockLanes {
    pub(super) fn block_bytes(&self) -> usize {
        256 + 64 * planes(self.format)
    }

    pub(super) fn groups(&self) -> usize {
        self.rows.div_ceil(LANES)
    }

    /// Q4_K/Q5_K: where block `b`'s 16 scale codes of group `g` start in `codes`.
    pub(super) fn sc_at(&self, g: usize, b: usize) -> usize {
        (g * self.blocks + (b & !1)) * 32 + 16 * (b & 1)
    }

    /// Q4_K/Q5_K: where lane `lane`'s minimum code of block `b` of group `g` is in `codes`.
    pub(super) fn m_at(&self, g: usize, b: usize, lane: usize) -> usize {
        (g * self.blocks + (b & !1)) * 32 + 32 + 2 * lane + (b & 1)
    }

    /// Scale blocks per row: one per block, or one per super-block for the K-quants.
    pub(super) fn scale_blocks(&self) -> usize {
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
                            let (sc_at, m_at) = (p.sc_at(g, u * 8 + j), p.m_at(g, u * 8 + j, lane));
                            p.codes[sc_at + lane] = sc;
                            p.codes[m_at] = m;
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
        let group = &self.q[g * self.blocks * bb..(g + 1) * self.blocks * bb];
        for (b, (src, block)) in group.chunks_exact(bb).zip(out.chunks_exact_mut(QK)).enumerate() {
            self.block_values(g, b, lane, src, block.try_into().expect("a block"));
        }
    }

    /// The 16 rows of group `g` in f32, each as [`BlockLanes::dequantize_row`] gives it, into
    /// `out` (16 rows of `blocks * QK` values, row-major; rows past the matrix are left as they
    /// are), each block's bytes read once for all its lanes.
    pub fn dequantize_group(&self, g: usize, out: &mut [f32]) {
        match super::cpu().avx2 {
            Some(avx2) => super::blocks_lanes_avx2::dequantize_group(avx2, self, g, out),
            None => self.dequantize_group_scalar(g, out),
        }
    }

    /// [`BlockLanes::dequantize_group`] value by value (CPUs without AVX2; the reference the
    /// vector one is tested against).
    pub(super) fn dequantize_group_scalar(&self, g: usize, out: &mut [f32]) {
        let cols = self.blocks * QK;
        assert!(g < self.groups() && out.len() >= LANES * cols);
        let valid = (self.rows - g * LANES).min(LANES);
        let bb = self.block_bytes();
        let group = &self.q[g * self.blocks * bb..(g + 1) * self.blocks * bb];
        for (b, src) in group.chunks_exact(bb).enumerate() {
            for lane in 0..valid {
                let block = &mut out[lane * cols + b * QK..][..QK];
                self.block_values(g, b, lane, src, block.try_into().expect("a block"));
            }
        }
    }

    /// Block `b` of row `16 g + lane` from the block's bytes `src` (nibbles, then the high bits).
    fn block_values(&self, g: usize, b: usize, lane: usize, src: &[u8], out: &mut [f32; QK]) {
        let f = |bits: u16| half::f16::from_bits(bits).to_f32();
        // Each value's bits in a u32 of its own, each source word read once (a byte array
        // or-ed into bit by bit stalled on its own stores).
        let word = |bytes: &[u8]| u32::from_le_bytes(bytes[4 * lane..4 * lane + 4].try_into().expect("4 bytes"));
        let mut q = [0u32; QK];
        let (nibbles, high) = src.split_at(256);
        for (s, chunk) in nibbles.chunks_exact(64).enumerate() {
            let w = word(chunk);
            for e in 0..4 {
                q[4 * s + e] = (w >> (8 * e)) & 0x0F;
                q[16 + 4 * s + e] = (w >> (8 * e + 4)) & 0x0F;
            }
        }
        if self.format == BlockFormat::Q6K {
            for (pair, bits) in high.chunks_exact(64).enumerate() {
                let w = word(bits);
                for e in 0..4 {
                    let byte = (w >> (8 * e)) & 0xFF;
                    for (v, at) in crumb_values(e)[pair].into_iter().zip(CRUMB_BITS) {
                        q[v] |= ((byte >> at) & 3) << 4;
                    }
                }
            }
        } else {
            for (plane, bits) in high.chunks_exact(64).enumerate() {
                let w = word(bits);
                for e in 0..4 {
                    for s in 0..8 {
                        q[4 * s + e] |= ((w >> (8 * e + s)) & 1) << (4 + plane);
                    }
                }
            }
        }
        let [(s0, m0), (s1, m1)] = self.half_scales(g, b, lane, f);
        let (low, up) = out.split_at_mut(16);
        for v in 0..16 {
            low[v] = s0 * q[v] as f32 + m0;
            up[v] = s1 * q[16 + v] as f32 + m1;
        }
    }

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
                let (sc, m) = (self.codes[self.sc_at(g, b) + lane] as f32, self.codes[self.m_at(g, b, lane)] as f32);
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
