//! GGUF block formats kept as the file stores them: the K-quants (Q4_K, Q5_K, Q6_K: super-blocks
//! of 256 values with 6- or 8-bit sub-block scales) and the legacy 5-bit and 4-bit ones (Q5_0,
//! Q5_1, Q4_0: blocks of 32). A Q4_K_M file mixes Q4_K, Q6_K and, for rows that are not a
//! multiple of 256 long (Gemma 3's 640), Q5_0; each stays at its own 4.5-6.6 bits per weight
//! instead of the 9 of an int8 copy, which is what a memory-bound decode step pays for.
//!
//! Every format is read through one shape: a *unit* (a super-block, or two legacy blocks) is
//! unpacked into unsigned values `q` (0..64) with, per sub-block of 16 values, a scale and a
//! minimum (`value = scale * q + min`). The formats differ only in [`unpack`]; the integer dot
//! products against int8 activations (`Q8Acts`, blocks of 32) are shared by the scalar, AVX2 and
//! AVX-512 VNNI tiers (`blocks_simd`):
//!
//! `sum_v w_v x_v = sum_j [scale_j * s_a * sum_{v in j} q_v a_v] + min_j * s_a * sum_{v in j} a_v`
//!
//! where the second sum is `Q8Acts::scaled_sums16`, computed once per activation row. The unit
//! is unpacked once per tile of weight rows and reused for every activation row of the tile.
//!
//! Layouts (ggml's, read from its format description): Q4_K is f16 d, f16 dmin, 12 bytes of
//! 6-bit scales and mins for eight sub-blocks of 32, then 128 bytes of nibbles where bytes
//! `32i..32i+32` hold sub-block `2i` (low nibbles) and `2i+1` (high); `value = d*sc*q - dmin*m`.
//! Q5_K adds 32 bytes of fifth bits before the nibbles (bit `j` of byte `l` belongs to value `l`
//! of sub-block `j`). Q6_K is 128 bytes of low nibbles, 64 of two-bit highs, sixteen i8 scales
//! (sub-blocks of 16) and f16 d; `value = d*sc*(q - 32)`.
#![allow(clippy::needless_range_loop)] // index arithmetic mirrors the layouts above

use super::q8::QK;
use candle_core::quantized::GgmlDType;

/// Values per K-quant super-block.
pub const QK_K: usize = 256;

/// The block formats served natively.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFormat {
    Q4_0,
    Q5_0,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
}

impl BlockFormat {
    /// The format of a GGUF tensor type, when it is one of these.
    pub fn of(dtype: GgmlDType) -> Option<Self> {
        Some(match dtype {
            GgmlDType::Q4_0 => BlockFormat::Q4_0,
            GgmlDType::Q5_0 => BlockFormat::Q5_0,
            GgmlDType::Q5_1 => BlockFormat::Q5_1,
            GgmlDType::Q4K => BlockFormat::Q4K,
            GgmlDType::Q5K => BlockFormat::Q5K,
            GgmlDType::Q6K => BlockFormat::Q6K,
            _ => return None,
        })
    }

    pub fn dtype(self) -> GgmlDType {
        match self {
            BlockFormat::Q4_0 => GgmlDType::Q4_0,
            BlockFormat::Q5_0 => GgmlDType::Q5_0,
            BlockFormat::Q5_1 => GgmlDType::Q5_1,
            BlockFormat::Q4K => GgmlDType::Q4K,
            BlockFormat::Q5K => GgmlDType::Q5K,
            BlockFormat::Q6K => GgmlDType::Q6K,
        }
    }

    /// Values of one GGUF block.
    fn block_values(self) -> usize {
        match self {
            BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => QK,
            _ => QK_K,
        }
    }

    /// Bytes of one GGUF block.
    fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q4_0 => 18,
            BlockFormat::Q5_0 => 22,
            BlockFormat::Q5_1 => 24,
            BlockFormat::Q4K => 144,
            BlockFormat::Q5K => 176,
            BlockFormat::Q6K => 210,
        }
    }

    /// Values of one unit: a super-block, or two legacy blocks (the SIMD tiers work on 64).
    pub fn unit_values(self) -> usize {
        self.block_values().max(2 * QK)
    }

    pub fn unit_bytes(self) -> usize {
        self.block_bytes() * self.unit_values() / self.block_values()
    }

    /// Whether rows of `cols` values are whole units.
    pub fn fits(self, cols: usize) -> bool {
        cols > 0 && cols.is_multiple_of(self.unit_values())
    }
}

/// One unit unpacked: values, each group of four values' scale (`lane_scale[v / 4]`, the layout of
/// the SIMD tiers' i32 lanes), and each sub-block of 16 values' minimum.
pub struct Unpacked {
    pub q: [u8; QK_K],
    pub lane_scale: [f32; QK_K / 4],
    pub min: [f32; QK_K / 16],
}

impl Default for Unpacked {
    fn default() -> Self {
        Unpacked { q: [0; QK_K], lane_scale: [0.0; QK_K / 4], min: [0.0; QK_K / 16] }
    }
}

impl Unpacked {
    /// Sets sub-block `j`'s (16 values) scale and minimum.
    #[inline(always)]
    fn sub(&mut self, j: usize, scale: f32, min: f32) {
        self.lane_scale[4 * j..4 * j + 4].fill(scale);
        self.min[j] = min;
    }

    /// The scale of sub-block `j`.
    pub fn scale(&self, j: usize) -> f32 {
        self.lane_scale[4 * j]
    }
}

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) of a Q4_K / Q5_K super-block.
#[inline(always)]
fn scale_min_k4(j: usize, s: &[u8]) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    };
    (sc as f32, m as f32)
}

/// Unpacks one unit (`raw` is exactly [`BlockFormat::unit_bytes`] long). Inlined into each
/// tier, so that its loops are vectorised with that tier's instructions.
#[inline(always)]
pub fn unpack(format: BlockFormat, raw: &[u8], out: &mut Unpacked) {
    assert_eq!(raw.len(), format.unit_bytes());
    match format {
        BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
            let bb = format.block_bytes();
            for half in 0..2 {
                let b = &raw[half * bb..(half + 1) * bb];
                let d = f16_at(b, 0);
                let (min, qh, qs) = match format {
                    BlockFormat::Q4_0 => (-8.0 * d, 0u32, &b[2..18]),
                    BlockFormat::Q5_0 => (-16.0 * d, u32::from_le_bytes([b[2], b[3], b[4], b[5]]), &b[6..22]),
                    _ => (f16_at(b, 2), u32::from_le_bytes([b[4], b[5], b[6], b[7]]), &b[8..24]),
                };
                let q = &mut out.q[half * QK..(half + 1) * QK];
                for l in 0..16 {
                    // Value l is the low nibble of byte l, value l + 16 the high; Q5's fifth bits
                    // are bits l and l + 16 of qh (zero for Q4_0).
                    q[l] = (qs[l] & 0x0F) | ((((qh >> l) & 1) as u8) << 4);
                    q[l + 16] = (qs[l] >> 4) | ((((qh >> (l + 16)) & 1) as u8) << 4);
                }
                out.sub(2 * half, d, min);
                out.sub(2 * half + 1, d, min);
            }
        }
        BlockFormat::Q4K | BlockFormat::Q5K => {
            let (d, dmin) = (f16_at(raw, 0), f16_at(raw, 2));
            let scales = &raw[4..16];
            let (qh, qs) =
                if format == BlockFormat::Q5K { (&raw[16..48], &raw[48..176]) } else { (&raw[..0], &raw[16..144]) };
            for i in 0..4 {
                let (lo, hi) = out.q[64 * i..64 * i + 64].split_at_mut(32);
                let bytes = &qs[32 * i..32 * i + 32];
                for l in 0..32 {
                    lo[l] = bytes[l] & 0x0F;
                    hi[l] = bytes[l] >> 4;
                }
                if format == BlockFormat::Q5K {
                    for l in 0..32 {
                        lo[l] |= ((qh[l] >> (2 * i)) & 1) << 4;
                        hi[l] |= ((qh[l] >> (2 * i + 1)) & 1) << 4;
                    }
                }
            }
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, scales);
                out.sub(2 * j, d * sc, -dmin * m);
                out.sub(2 * j + 1, d * sc, -dmin * m);
            }
        }
        BlockFormat::Q6K => {
            let (ql, qh, sc) = (&raw[..128], &raw[128..192], &raw[192..208]);
            let d = f16_at(raw, 208);
            for n in 0..2 {
                let (ql, qh) = (&ql[64 * n..64 * n + 64], &qh[32 * n..32 * n + 32]);
                let q = &mut out.q[128 * n..128 * n + 128];
                for l in 0..32 {
                    q[l] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
                    q[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
                    q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                    q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                }
            }
            for j in 0..16 {
                let scale = d * (sc[j] as i8) as f32;
                out.sub(j, scale, -32.0 * scale);
            }
        }
    }
}

/// A (rows, cols) matrix of one block format, its rows' blocks as the GGUF stores them.
#[derive(Debug, Clone)]
pub struct BlockMatrix {
    format: BlockFormat,
    rows: usize,
    cols: usize,
    raw: Vec<u8>,
    /// The same blocks in groups of 16 rows for the lane kernels (AVX-512 VNNI and AVX2), on CPUs
    /// that have either.
    #[cfg(target_arch = "x86_64")]
    pub(crate) lanes: Option<std::sync::Arc<super::blocks_lanes::BlockLanes>>,
}

impl BlockMatrix {
    /// From a GGUF tensor's bytes; `None` when the shape is not whole units or the length is off.
    pub fn from_raw(format: BlockFormat, raw: Vec<u8>, rows: usize, cols: usize) -> Option<Self> {
        if !format.fits(cols) || raw.len() != rows * cols / format.unit_values() * format.unit_bytes() {
            return None;
        }
        Some(
            BlockMatrix {
                format,
                rows,
                cols,
                raw,
                #[cfg(target_arch = "x86_64")]
                lanes: None,
            }
            .packed(),
        )
    }

    /// With the lane-packed copy when the CPU has AVX2 (the VNNI and AVX2 lane kernels read it).
    fn packed(mut self) -> Self {
        #[cfg(target_arch = "x86_64")]
        if super::has_avx2() {
            self.lanes = Some(std::sync::Arc::new(super::blocks_lanes::BlockLanes::from_blocks(&self)));
        }
        self
    }

    /// Keeps only the lane-packed copy when there is one, as [`super::Q4Matrix::lanes_only`].
    pub fn lanes_only(mut self) -> Self {
        #[cfg(target_arch = "x86_64")]
        if self.lanes.is_some() {
            self.raw = Vec::new();
        }
        self
    }

    /// Without the lane-packed copy (tests of the row kernels).
    #[doc(hidden)]
    pub fn without_lanes(mut self) -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            self.lanes = None;
        }
        self
    }

    pub fn format(&self) -> BlockFormat {
        self.format
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn bytes(&self) -> usize {
        #[cfg(target_arch = "x86_64")]
        let lanes = self.lanes.as_ref().map_or(0, |p| p.bytes());
        #[cfg(not(target_arch = "x86_64"))]
        let lanes = 0;
        self.raw.len() + lanes
    }

    /// Units per row.
    pub fn units(&self) -> usize {
        self.cols / self.format.unit_values()
    }

    /// Unit `u` of row `r`, as stored.
    #[inline(always)]
    pub fn unit(&self, r: usize, u: usize) -> &[u8] {
        assert!(!self.raw.is_empty(), "units of a lanes-only matrix");
        let ub = self.format.unit_bytes();
        let at = (r * self.units() + u) * ub;
        &self.raw[at..at + ub]
    }

    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if let (true, Some(lanes)) = (self.raw.is_empty(), &self.lanes) {
            return lanes.dequantize_row(r, out);
        }
        let uv = self.format.unit_values();
        assert!(r < self.rows && out.len() >= self.cols);
        let mut up = Unpacked::default();
        for u in 0..self.units() {
            unpack(self.format, self.unit(r, u), &mut up);
            for v in 0..uv {
                out[u * uv + v] = up.lane_scale[v / 4] * up.q[v] as f32 + up.min[v / 16];
            }
        }
    }

    /// Stacks matrices of one format with equal `cols` (rows are whole units, so bytes append).
    pub fn vstack(parts: &[BlockMatrix]) -> BlockMatrix {
        let (format, cols) = (parts[0].format, parts[0].cols);
        assert!(parts.iter().all(|p| p.format == format && p.cols == cols && !p.raw.is_empty()));
        BlockMatrix {
            format,
            rows: parts.iter().map(|p| p.rows).sum(),
            cols,
            raw: parts.iter().flat_map(|p| p.raw.iter().copied()).collect(),
            #[cfg(target_arch = "x86_64")]
            lanes: None,
        }
        .packed()
    }
}

/// Which instructions a kernel runs with (the tests pick each one the CPU has).
#[derive(Debug, Clone, Copy)]
pub enum Tier {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(super::cpu::Avx2Fma),
    /// AVX2 with AVX-VNNI's 256-bit `vpdpbusd` (the lane tile only; other paths run AVX2's).
    #[cfg(target_arch = "x86_64")]
    AvxVnni(super::cpu::AvxVnni),
    #[cfg(target_arch = "x86_64")]
    Vnni(super::cpu::Avx512Vnni),
}

impl Tier {
    /// The fastest tier this CPU runs.
    pub fn best() -> Tier {
        #[cfg(target_arch = "x86_64")]
        if let Some(vnni) = super::cpu::cpu().vnni {
            return Tier::Vnni(vnni);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(avxvnni) = super::cpu::cpu().avxvnni {
            return Tier::AvxVnni(avxvnni);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(avx2) = super::cpu::cpu().avx2 {
            return Tier::Avx2(avx2);
        }
        Tier::Scalar
    }

    /// Every tier this CPU runs, slowest first.
    pub fn available() -> Vec<Tier> {
        let mut tiers = vec![Tier::Scalar];
        #[cfg(target_arch = "x86_64")]
        tiers.extend(super::cpu::cpu().avx2.map(Tier::Avx2));
        #[cfg(target_arch = "x86_64")]
        tiers.extend(super::cpu::cpu().avxvnni.map(Tier::AvxVnni));
        #[cfg(target_arch = "x86_64")]
        tiers.extend(super::cpu::cpu().vnni.map(Tier::Vnni));
        tiers
    }
}

/// The block formats' matmul (`blocks`) on one tier: `out[t, n] = sum_k w[n, k] * a[t, k]`.
pub fn matmul_blocks(w: &BlockMatrix, a: &super::Q8Acts, out: &mut [f32], tier: Tier) {
    let (n_out, t_rows) = (w.rows(), a.rows());
    assert_eq!(w.cols(), a.cols(), "inner dimensions differ");
    assert_eq!(out.len(), n_out * t_rows);
    #[cfg(target_arch = "x86_64")]
    if let (Tier::Vnni(vnni), Some(packed)) = (tier, w.lanes.as_deref()) {
        return super::blocks_tile::matmul(vnni, packed, a, out);
    }
    #[cfg(target_arch = "x86_64")]
    if let (Tier::Avx2(avx2), Some(packed)) = (tier, w.lanes.as_deref()) {
        return super::blocks_tile_avx2::matmul(avx2, None, packed, a, out);
    }
    #[cfg(target_arch = "x86_64")]
    if let (Tier::AvxVnni(vnni), Some(packed)) = (tier, w.lanes.as_deref()) {
        return super::blocks_tile_avx2::matmul(vnni.avx2(), Some(vnni), packed, a, out);
    }
    super::tiled(n_out, t_rows, out, |cols| super::tiles_of(cols, BlockTile(tier, w, a)));
}

/// The block formats' tile kernel on one tier.
struct BlockTile<'a>(Tier, &'a BlockMatrix, &'a super::Q8Acts);

impl super::TileCall for BlockTile<'_> {
    #[inline(always)]
    fn call<const R: usize, const C: usize>(&self, n: usize, t: usize) -> [[f32; C]; R] {
        let (w, a) = (self.1, self.2);
        assert!(n + R <= w.rows() && t + C <= a.rows() && w.cols() == a.cols());
        match self.0 {
            Tier::Scalar => tile_scalar::<R, C>(w, a, n, t),
            // SAFETY: the tokens prove the features; the rows exist and the widths agree (asserted).
            #[cfg(target_arch = "x86_64")]
            Tier::Avx2(avx2) => unsafe { super::blocks_simd::tile_avx2::<R, C>(avx2, w, a, n, t) },
            #[cfg(target_arch = "x86_64")]
            Tier::AvxVnni(vnni) => unsafe { super::blocks_simd::tile_avx2::<R, C>(vnni.avx2(), w, a, n, t) },
            #[cfg(target_arch = "x86_64")]
            Tier::Vnni(vnni) => unsafe { super::blocks_simd::tile_vnni::<R, C>(vnni, w, a, n, t) },
        }
    }
}

/// The scalar tier: weight rows `n..n+R` times activation rows `t..t+C`, the reference the SIMD
/// tiers are tested against (same sums, other float order).
pub(crate) fn tile_scalar<const R: usize, const C: usize>(
    w: &BlockMatrix,
    a: &super::Q8Acts,
    n: usize,
    t: usize,
) -> [[f32; C]; R] {
    let uv = w.format.unit_values();
    let mut up: [Unpacked; R] = std::array::from_fn(|_| Unpacked::default());
    let mut acc = [[0f32; C]; R];
    for u in 0..w.units() {
        for r in 0..R {
            unpack(w.format, w.unit(n + r, u), &mut up[r]);
        }
        for c in 0..C {
            let (aq, s) = a.row(t + c);
            let ss16 = a.scaled_sums16(t + c);
            for r in 0..R {
                for j in 0..uv / 16 {
                    let v0 = u * uv + 16 * j;
                    let isum: i32 = (0..16).map(|i| up[r].q[16 * j + i] as i32 * aq[v0 + i] as i32).sum();
                    acc[r][c] += up[r].scale(j) * s[v0 / QK] * isum as f32 + up[r].min[j] * ss16[v0 / 16];
                }
            }
        }
    }
    acc
}
