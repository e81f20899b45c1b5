//! The lane-packed block formats' (`blocks_lanes`) AVX-512 VNNI matmul: one tile kernel per
//! format (a const generic), with activations per 32 values, or for the K-quants per 256
//! (`KActs`), whose sub-block sums are then scaled and added in integers.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)] // register arrays indexed as in the math

use super::blocks_lanes::{planes, BlockLanes, LANES};
use super::cpu::{Avx512Vnni, SharedOut};
use super::q8::QK;
use super::{KActs, Q8Acts};
use std::arch::x86_64::*;

/// `out[t, n] = sum_k w[n, k] * a[t, k]`, driven as `lanes::matmul` is.
pub fn matmul(vnni: Avx512Vnni, w: &BlockLanes, a: &Q8Acts, out: &mut [f32]) {
    assert_eq!(w.blocks * QK, a.cols(), "inner dimensions differ");
    assert_eq!(out.len(), w.rows * a.rows());
    super::lanes::for_each_tile(&Tiles { vnni, w, a, no_k: KActs::default() }, w.groups(), a.rows(), out);
}

/// Lane-packed block-format weights times one activation matrix.
struct Tiles<'a> {
    vnni: Avx512Vnni,
    w: &'a BlockLanes,
    a: &'a Q8Acts,
    /// An empty per-256 quantisation, for the tiles that do not read one.
    no_k: KActs,
}

impl super::lanes::GroupTiles for Tiles<'_> {
    #[inline(always)]
    fn tile<const R: usize, const C: usize>(&self, g: usize, t: usize, out: &SharedOut) {
        let (vnni, w, a) = (self.vnni, self.w, self.a);
        assert!((g + R) * LANES < w.rows + LANES && t + C <= a.rows());
        let (mode, buf) = kept(keeps(planes(w.format)), a.rows(), t, w.blocks);
        // SAFETY: the token proves the features; groups g..g+R and rows t..t+C exist (asserted;
        // `matmul` asserted the shapes); `k`, when used, is `a`'s own quantisation (same
        // shape); each task owns the output columns of its groups; `buf`, unless unpacking, is
        // this thread's two slots of `KEPT_BLOCK` bytes a block, which the groups' KEEP tile
        // filled before any KEPT tile of them reads (see `kept`).
        unsafe {
            let acc = for_format!(w.format, a, &self.no_k, |F, KQ, k| for_mode!(
                mode,
                |P| block_tile::<R, C, F, KQ, P>(vnni, w, a, k, g, t, buf)
            ));
            super::lanes::store::<R, C>(vnni, &acc, g, t, w.rows, out.ptr());
        }
    }
}

/// `$call` with the format's const code bound to `$f`, `$kq` true when the K-quant tile reads the
/// per-256 activations (`Q8Acts::k_quants`, when the caller made them), and `$k` those
/// activations or `$none`: one dispatch for the VNNI and the AVX2 tiles.
macro_rules! for_format {
    ($format:expr, $acts:expr, $none:expr, |$f:ident, $kq:ident, $k:ident| $call:expr) => {{
        use super::blocks::BlockFormat;
        match ($format, $acts.k().filter(|_| super::blocks_lanes::kquant($format))) {
            (BlockFormat::Q4K, Some($k)) => for_format!(@ Q4K, true, $f, $kq, $call),
            (BlockFormat::Q5K, Some($k)) => for_format!(@ Q5K, true, $f, $kq, $call),
            (BlockFormat::Q6K, Some($k)) => for_format!(@ Q6K, true, $f, $kq, $call),
            (format, _) => {
                let $k = $none;
                match format {
                    BlockFormat::Q4_0 => for_format!(@ Q4_0, false, $f, $kq, $call),
                    BlockFormat::Q5_0 => for_format!(@ Q5_0, false, $f, $kq, $call),
                    BlockFormat::Q5_1 => for_format!(@ Q5_1, false, $f, $kq, $call),
                    BlockFormat::Q4K => for_format!(@ Q4K, false, $f, $kq, $call),
                    BlockFormat::Q5K => for_format!(@ Q5K, false, $f, $kq, $call),
                    BlockFormat::Q6K => for_format!(@ Q6K, false, $f, $kq, $call),
                }
            }
        }
    }};
    (@ $code:ident, $is_kq:expr, $f:ident, $kq:ident, $call:expr) => {{
        const $f: u8 = $code;
        const $kq: bool = $is_kq;
        $call
    }};
}
pub(super) use for_format;

// The formats as const-generic codes: each tile is compiled for one format, so its plane count,
// halves and scale epilogue are constants and its four steps unroll. With the format a run-time
// value the compiler kept the step loop, indexed the bit planes through the stack and spilled
// accumulators (Q6_K at 2x4 ran at 2/3 of Q4_K's rate).
pub(super) const Q4_0: u8 = 0;
pub(super) const Q5_0: u8 = 1;
pub(super) const Q5_1: u8 = 2;
pub(super) const Q4K: u8 = 3;
pub(super) const Q5K: u8 = 4;
pub(super) const Q6K: u8 = 5;

pub(super) const fn planes_of(f: u8) -> usize {
    match f {
        Q4_0 | Q4K => 0,
        Q6K => 2,
        _ => 1,
    }
}

/// The constant a format subtracts from its unsigned values (`value = scale * (q - offset)`), or
/// 0 when it stores a minimum per block instead.
pub(super) const fn offset_of(f: u8) -> f32 {
    match f {
        Q4_0 => 8.0,
        Q5_0 => 16.0,
        Q6K => 32.0,
        _ => 0.0,
    }
}

/// What a tile does with its groups' unpacked bytes: unpacks them (few rows: a decode step),
/// unpacks and keeps them (a group's first tile), or reads the kept ones (its later tiles).
///
/// Why: with many rows (prefill, many streams) each group meets every row in tiles of four, and
/// each tile unpacked the same weights again: for the formats with bit planes four to six vector
/// instructions a register, shared by only four rows' products. The first tile writes each
/// step's unpacked registers (`lo` and `hi`) to a per-thread buffer (512 bytes a group and
/// block: at most ~290 KB a thread at the 1.5B's 8,960 columns) and the others load them. The
/// bytes are those the tile would compute, so the sums and bits are unchanged (`blocks_tests`
/// compares a batch with its rows alone). Which formats are kept: see `keeps`.
pub(super) const UNPACK: u8 = 0;
pub(super) const KEEP: u8 = 1;
pub(super) const KEPT: u8 = 2;

/// `$call` with the tile's mode (from [`kept`]) bound to the const `$p`: the one dispatch of every
/// tile that keeps groups.
macro_rules! for_mode {
    ($mode:expr, |$p:ident| $call:expr) => {{
        use super::blocks_tile::{KEEP, KEPT, UNPACK};
        match $mode {
            UNPACK => {
                const $p: u8 = UNPACK;
                $call
            }
            KEEP => {
                const $p: u8 = KEEP;
                $call
            }
            _ => {
                const $p: u8 = KEPT;
                $call
            }
        }
    }};
}
pub(super) use for_mode;

/// Activation rows from which a group's unpacked bytes are kept for the tiles after its first
/// (see [`UNPACK`]); below, each tile unpacks what it reads.
const KEEP_ROWS: usize = 8;

/// Bytes of one group's unpacked block in the kept buffer: four steps of both nibbles' 16 lanes.
pub(super) const KEPT_BLOCK: usize = 512;

thread_local! {
    /// Each thread's unpacked groups: two slots, one per group of a tile (see [`UNPACK`]).
    static UNPACKED: std::cell::RefCell<Vec<Line>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// 64 unpacked bytes, aligned as an AVX-512 register (and so as two AVX2 ones).
#[derive(Clone, Copy)]
#[repr(align(64))]
struct Line(#[allow(dead_code)] [u8; 64]);

/// Which formats' groups the tiles keep (`TANDEM_KEEP_UNPACKED`, read once): the block formats
/// and Q4_1 (`lanes::q4_tile`, `lanes_avx2::q4_body`; 4-bit).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// None: every tile unpacks (the baseline, for measuring).
    None,
    /// The formats with bit planes (Q5_0, Q5_1, Q5_K, Q6_K): four to six instructions a
    /// register unpacked, more than reading it back from L2 costs on every CPU measured.
    Planes,
    /// Every format: the 4-bit ones too, which unpack in three instructions a register.
    All,
}

/// The 4-bit formats are kept on Intel's CPUs and not on AMD's, as measured: on a Sapphire
/// Rapids class Xeon kept Q4_K ran ~1.2x at the 1.5B's shapes with 128 rows in every tier
/// (AVX-512 VNNI 167 -> 200 GMAC/s at 17920x1536, AVX-VNNI 116 -> 137, AVX2 100 -> 115), and on
/// Zen 3's AVX2 tile 0.75x (90 -> 67: reading the bytes back from L2 cost more than unpacking
/// them). Zen 4 and 5 were not measured with it (`TANDEM_KEEP_UNPACKED=all|planes|none`).
/// `planes`: the format's bit planes (`blocks_lanes::planes`; 0 for the 4-bit formats).
pub(super) fn keeps(planes: usize) -> bool {
    static KEEP: std::sync::OnceLock<Keep> = std::sync::OnceLock::new();
    let keep = *KEEP.get_or_init(|| match std::env::var("TANDEM_KEEP_UNPACKED").as_deref() {
        Ok("none") => Keep::None,
        Ok("planes") => Keep::Planes,
        Ok("all") => Keep::All,
        _ if super::cpu::intel() => Keep::All,
        _ => Keep::Planes,
    });
    match keep {
        Keep::None => false,
        Keep::Planes => planes > 0,
        Keep::All => true,
    }
}

/// The mode of the tile at activation row `t` of a matmul of `rows` rows over `blocks` blocks,
/// where the format is kept (`keep`, from [`keeps`]), and with KEEP or KEPT this thread's
/// buffer: two slots of `KEPT_BLOCK * blocks` bytes (null when unpacking).
///
/// A slot holds a group's bytes from its first tile to its last: the driver
/// (`lanes::for_each_tile`) runs a group's tiles in order of t on one thread, each tile's groups
/// in the same slots, and nothing else between them on this thread touches the buffer. It grows
/// only when too small for the matmul (`Vec::resize` keeps the content), which every tile of one
/// matmul asks the same of.
pub(super) fn kept(keep: bool, rows: usize, t: usize, blocks: usize) -> (u8, *mut u8) {
    if rows < KEEP_ROWS || !keep {
        return (UNPACK, std::ptr::null_mut());
    }
    let lines = 2 * blocks * KEPT_BLOCK / size_of::<Line>();
    let buf = UNPACKED.with_borrow_mut(|b| {
        if b.len() < lines {
            b.resize(lines, Line([0; 64]));
        }
        b.as_mut_ptr() as *mut u8
    });
    (if t == 0 { KEEP } else { KEPT }, buf)
}

/// Groups `g..g+R` times activation rows `t..t+C`: 16 outputs per register.
///
/// Q6_K gives a block's two halves (values 0..16 and 16..32) their own scales, so it runs a
/// block as two passes, one per half, each with its own integer sums; one pass with both halves
/// in one sum would hold twice the integer registers (2x4 tiles spilled). Every other format
/// has one scale per block: one pass.
///
/// Without `KQ` (activations per 32 values) each pass ends in a float epilogue per activation
/// row: the conversion and the scale and minimum terms, together as costly as the pass's
/// integer dot products. With `KQ` (K-quants and activations per 256, `KActs`) a pass's sums
/// are multiplied by the weights' integer sub-block scale codes and added in integers, and the
/// float epilogue (and the minima's integer `vpdpwssd`) runs once per super-block.
///
/// # Safety
/// Groups `g..g+R` of `w` and rows `t..t+C` of `a` exist, `w.blocks * QK == a.cols()`, `F` is
/// `w.format`'s code, and with `KQ` the format is a K-quant and `k` is `a`'s per-256
/// quantisation. With `P` KEEP, `buf` has `2 * KEPT_BLOCK * w.blocks` writable bytes; with
/// KEPT, the first `R * KEPT_BLOCK * w.blocks` of them were written by a KEEP tile of the same
/// groups.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn block_tile<const R: usize, const C: usize, const F: u8, const KQ: bool, const P: u8>(
    _: Avx512Vnni,
    w: &BlockLanes,
    a: &Q8Acts,
    k: &KActs,
    g: usize,
    t: usize,
    buf: *mut u8,
) -> [[__m512; C]; R] {
    let (blocks, bb, sb) = (w.blocks, w.block_bytes(), w.scale_blocks());
    let n_planes = planes_of(F);
    let off = offset_of(F);
    let cols = blocks * QK;
    let nib = _mm512_set1_epi8(0x0F);
    let (bit4, crumb) = (_mm512_set1_epi8(0x10), _mm512_set1_epi8(0x30));
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let aq = if KQ { k.quants().as_ptr() } else { a.quants().as_ptr() };
    let (scales, ss32, ss16) = (a.scales().as_ptr(), a.all_scaled_sums().as_ptr(), a.all_scaled_sums16().as_ptr());
    let (kscales, kpairs, kq6) = (k.scales().as_ptr(), k.pairs().as_ptr(), k.q6_start().as_ptr());
    let f16x16 = |p: *const u16| _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
    let u8x16 = |p: *const u8| _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
    let i8x16 = |p: *const u8| _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i));
    // The integer sums of the current super-block, scaled by their sub-block codes (`KQ`).
    let mut isb = [[_mm512_setzero_si512(); C]; R];
    // SAFETY (whole body): (g + r) * blocks + b indexes an existing (group, block) of q and codes,
    // (g + r) * sb + scale block an existing one of d16 and m16, (t + c) * cols + b * 32 + 31 an
    // existing activation byte, and with `KQ` (t + c) * sb + b / 8 an existing super-block of
    // `k`, for every r, c, b below; a kept step's two registers lie at
    // `128 * ((r * blocks + b) * 4 + step)` in `buf`, under `R * KEPT_BLOCK * blocks`.
    unsafe {
        for b in 0..blocks {
            let base = |r: usize| w.q.as_ptr().add(((g + r) * blocks + b) * bb);
            // The weights of a tile's first pass come from memory: asked for ahead, as the
            // AVX2 tiles do (`lanes_avx2::prefetch`); later passes find them in L1.
            for r in (0..R).filter(|_| P != KEPT) {
                super::lanes_avx2::prefetch(base(r).wrapping_add(super::lanes_avx2::PREFETCH_AHEAD), bb);
            }
            // One pass over the block's four steps: half 0 (low nibbles), 1 (high) or 2 (both).
            macro_rules! pass {
                ($half:expr) => {{
                    const HALF: usize = $half;
                    let mut isum = [[_mm512_setzero_si512(); C]; R];
                    if KQ && F == Q6K {
                        // Q6_K's offset: the sums start at -32 * the half's activation sum.
                        for c in 0..C {
                            let start = _mm512_set1_epi32(*kq6.add((t + c) * cols / 16 + 2 * b + HALF));
                            for r in 0..R {
                                isum[r][c] = start;
                            }
                        }
                    }
                    for step in 0..4 {
                        let mut lo = [_mm512_setzero_si512(); R];
                        let mut hi = [_mm512_setzero_si512(); R];
                        for r in 0..R {
                            // This step's unpacked registers of group g + r, when kept.
                            let kept = buf.wrapping_add(((r * blocks + b) * 4 + step) * 128) as *mut __m512i;
                            if P == KEPT {
                                if HALF != 1 {
                                    lo[r] = _mm512_loadu_si512(kept as *const _);
                                }
                                if HALF != 0 {
                                    hi[r] = _mm512_loadu_si512(kept.add(1) as *const _);
                                }
                                continue;
                            }
                            let v = _mm512_loadu_si512(base(r).add(step * 64) as *const _);
                            if HALF != 1 {
                                lo[r] = _mm512_and_si512(v, nib);
                            }
                            if HALF != 0 {
                                hi[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                            }
                            if n_planes == 2 {
                                // Q6_K's crumbs (`crumb_values`): bits 4-5 and 6-7 of an even
                                // step, 0-1 and 2-3 of an odd one, each moved to bits 4-5 by one
                                // 16-bit shift (bits crossing into the next byte land outside
                                // the mask).
                                let c = _mm512_loadu_si512(base(r).add(256 + 64 * (step / 2)) as *const _);
                                if HALF != 1 {
                                    let l = if step % 2 == 0 { c } else { _mm512_slli_epi16(c, 4) };
                                    lo[r] = _mm512_or_si512(lo[r], _mm512_and_si512(l, crumb));
                                }
                                if HALF != 0 {
                                    let h =
                                        if step % 2 == 0 { _mm512_srli_epi16(c, 2) } else { _mm512_slli_epi16(c, 2) };
                                    hi[r] = _mm512_or_si512(hi[r], _mm512_and_si512(h, crumb));
                                }
                            } else if n_planes == 1 {
                                // Bit s of the plane's byte to bit 4: step s for the low half,
                                // s + 4 for the high half; 16-bit shifts of at most 4 keep every
                                // bit in its byte.
                                let p0 = _mm512_loadu_si512(base(r).add(256) as *const _);
                                let up = _mm512_sll_epi16(p0, _mm_cvtsi32_si128(4 - step as i32));
                                lo[r] = _mm512_or_si512(lo[r], _mm512_and_si512(up, bit4));
                                let down = _mm512_srl_epi16(p0, _mm_cvtsi32_si128(step as i32));
                                hi[r] = _mm512_or_si512(hi[r], _mm512_and_si512(down, bit4));
                            }
                            if P == KEEP {
                                if HALF != 1 {
                                    _mm512_storeu_si512(kept as *mut _, lo[r]);
                                }
                                if HALF != 0 {
                                    _mm512_storeu_si512(kept.add(1) as *mut _, hi[r]);
                                }
                            }
                        }
                        for c in 0..C {
                            let at = aq.add((t + c) * cols + b * QK + step * 4);
                            if HALF != 1 {
                                let a_lo = _mm512_set1_epi32((at as *const i32).read_unaligned());
                                for r in 0..R {
                                    isum[r][c] = _mm512_dpbusd_epi32(isum[r][c], lo[r], a_lo);
                                }
                            }
                            if HALF != 0 {
                                let a_hi = _mm512_set1_epi32((at.add(16) as *const i32).read_unaligned());
                                for r in 0..R {
                                    isum[r][c] = _mm512_dpbusd_epi32(isum[r][c], hi[r], a_hi);
                                }
                            }
                        }
                    }
                    if KQ {
                        // Sub-block codes (Q4_K/Q5_K: 6-bit scales; Q6_K: signed 8-bit) times
                        // the pass's sums, into the super-block's sums.
                        for r in 0..R {
                            let gr = g + r;
                            let sc = if F == Q6K {
                                i8x16(w.codes.as_ptr().add((gr * blocks + b) * 32 + 16 * (HALF & 1)))
                            } else {
                                u8x16(w.codes.as_ptr().add(w.sc_at(gr, b)))
                            };
                            for c in 0..C {
                                isb[r][c] = _mm512_add_epi32(isb[r][c], _mm512_mullo_epi32(isum[r][c], sc));
                            }
                        }
                    } else {
                        // Per activation row: its block scale, and its dequantised sum (of the
                        // half, or of the block), times the format's offset where it has one.
                        let mut sa = [_mm512_setzero_ps(); C];
                        let mut sums = [_mm512_setzero_ps(); C];
                        for c in 0..C {
                            let row = t + c;
                            sa[c] = _mm512_set1_ps(*scales.add(row * blocks + b));
                            let sum = if HALF == 2 {
                                *ss32.add(row * blocks + b)
                            } else {
                                *ss16.add(row * blocks * 2 + 2 * b + HALF)
                            };
                            sums[c] = _mm512_set1_ps(if off != 0.0 { off * sum } else { sum });
                        }
                        for r in 0..R {
                            let gr = g + r;
                            // Per-lane scale, and the minimum where the format stores one.
                            let (s, m) = match F {
                                Q4_0 | Q5_0 | Q5_1 => {
                                    let at = (gr * sb + b) * LANES;
                                    let m =
                                        if F == Q5_1 { f16x16(w.m16.as_ptr().add(at)) } else { _mm512_setzero_ps() };
                                    (f16x16(w.d16.as_ptr().add(at)), m)
                                }
                                Q4K | Q5K => {
                                    let at = (gr * sb + b / 8) * LANES;
                                    let (d, dmin) = (f16x16(w.d16.as_ptr().add(at)), f16x16(w.m16.as_ptr().add(at)));
                                    let sc = _mm512_cvtepi32_ps(u8x16(w.codes.as_ptr().add(w.sc_at(gr, b))));
                                    // The lanes' minimum codes of this block: the low (even block)
                                    // or high (odd) byte of each zero-extended pair.
                                    let pairs = _mm512_cvtepu8_epi16(_mm256_loadu_si256(w.codes.as_ptr().add(w.m_at(
                                        gr,
                                        b & !1,
                                        0,
                                    ))
                                        as *const __m256i));
                                    let shifted = _mm512_srl_epi32(pairs, _mm_cvtsi32_si128(16 * (b & 1) as i32));
                                    let mc = _mm512_cvtepi32_ps(_mm512_and_si512(shifted, _mm512_set1_epi32(0xFFFF)));
                                    (_mm512_mul_ps(d, sc), _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, mc)))
                                }
                                _ => {
                                    let d = f16x16(w.d16.as_ptr().add((gr * sb + b / 8) * LANES));
                                    let sc = i8x16(w.codes.as_ptr().add((gr * blocks + b) * 32 + 16 * (HALF & 1)));
                                    (_mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)), _mm512_setzero_ps())
                                }
                            };
                            for c in 0..C {
                                let q = _mm512_cvtepi32_ps(isum[r][c]);
                                acc[r][c] = if off != 0.0 {
                                    // scale * (s_a * sum q a - offset * s_a * sum a)
                                    _mm512_fmadd_ps(_mm512_fmsub_ps(q, sa[c], sums[c]), s, acc[r][c])
                                } else {
                                    // scale * s_a * sum q a + minimum * s_a * sum a
                                    let acc1 = _mm512_fmadd_ps(q, _mm512_mul_ps(s, sa[c]), acc[r][c]);
                                    _mm512_fmadd_ps(m, sums[c], acc1)
                                };
                            }
                        }
                    }
                }};
            }
            if F == Q6K {
                pass!(0);
                pass!(1);
            } else {
                pass!(2);
            }
            if KQ && b % 8 == 7 {
                // The super-block's float epilogue: d * s_a * (sum of code * sums), and for
                // Q4_K/Q5_K - dmin * s_a * (sum of minimum code * 32-value activation sum),
                // the latter as i16 pairs through `vpdpwssd`.
                let sbk = b / 8;
                let mut kd = [_mm512_setzero_ps(); C];
                for c in 0..C {
                    kd[c] = _mm512_set1_ps(*kscales.add((t + c) * sb + sbk));
                }
                for r in 0..R {
                    let gr = g + r;
                    let at = (gr * sb + sbk) * LANES;
                    let d = f16x16(w.d16.as_ptr().add(at));
                    if F == Q6K {
                        for c in 0..C {
                            acc[r][c] =
                                _mm512_fmadd_ps(_mm512_cvtepi32_ps(isb[r][c]), _mm512_mul_ps(d, kd[c]), acc[r][c]);
                        }
                    } else {
                        let dmin = f16x16(w.m16.as_ptr().add(at));
                        let mut mins = [_mm512_setzero_si512(); 4];
                        for p in 0..4 {
                            let pairs = w.codes.as_ptr().add(w.m_at(gr, sbk * 8 + 2 * p, 0));
                            mins[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(pairs as *const __m256i));
                        }
                        for c in 0..C {
                            let sums = kpairs.add(((t + c) * sb + sbk) * 4);
                            let mut mn = _mm512_setzero_si512();
                            for p in 0..4 {
                                mn = _mm512_dpwssd_epi32(mn, mins[p], _mm512_set1_epi32(*sums.add(p)));
                            }
                            let acc1 =
                                _mm512_fmadd_ps(_mm512_cvtepi32_ps(isb[r][c]), _mm512_mul_ps(d, kd[c]), acc[r][c]);
                            acc[r][c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mn), _mm512_mul_ps(dmin, kd[c]), acc1);
                        }
                    }
                    for c in 0..C {
                        isb[r][c] = _mm512_setzero_si512();
                    }
                }
            }
        }
    }
    acc
}
