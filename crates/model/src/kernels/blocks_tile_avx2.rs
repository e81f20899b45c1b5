//! The lane-packed block formats' (`blocks_lanes`) AVX2 matmul, the twin of the VNNI one
//! (`blocks_tile`) for the CPUs most users have.
//!
//! Why: without it the AVX2 tier unpacked every 256-value unit of a K-quant row into bytes and
//! per-lane scales on each call (`blocks_simd::tile_avx2`), and a decode step, where each unit
//! meets a single activation row, spent most of its time unpacking: Qwen2.5-Coder 1.5B Q4_K_M
//! decoded at 0.25x llama.cpp's AVX2 build (docs/benchmarks.md, session 41).
//!
//! A 16-row group is two registers of eight lanes (bytes `32h..32h+32` of each 64-byte step hold
//! lanes `8h..8h+8`). `vpdpbusd` becomes `vpmaddubsw` (u8 weights x i8 activations into i16
//! pairs) then `vpmaddwd` (into the lane's i32). AVX2 runs half as many lanes an instruction and
//! has no fused byte dot product, so the widening is spent sparingly: products stay in i16 for as
//! many steps as cannot overflow (a `vpmaddubsw` pair is at most 2 * 15 * 127 for 4-bit values,
//! 2 * 31 * 127 for 5-bit and 2 * 63 * 127 for Q6_K's 6-bit halves, and activations never reach
//! -128: four steps of both nibbles, or two steps, stay under 32767), and for the K-quants with
//! activations per 256 the widening multiplies by the sub-block's code at once (each lane's code
//! in both i16 halves), which replaces the VNNI kernel's widening and its `vpmulld`. The integer
//! sums are exact whichever way they are added, and the float epilogue is the VNNI kernel's
//! instruction for instruction, so this tier's results equal that tier's bit for bit on the same
//! weights and activations (`blocks_tests` asserts it where both run).
//!
//! With eight or more activation rows the formats with a fifth or sixth bit (Q5_0, Q5_1, Q5_K,
//! Q6_K) unpack each group once, in its first tile, and keep the unpacked registers for the
//! group's other tiles (see [`UNPACK`]); Q6_K's offset is one `vpmaddwd` a block and row.
//!
//! Intel's chips since Alder Lake have no AVX-512 but do have AVX-VNNI, `vpdpbusd` on 256 bits:
//! there (`TANDEM_CPU=avxvnni`, the default on such a CPU) the same tile sums each step's
//! products with it directly (`lanes_tile_vnni`), and the bits stay the same.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)] // register arrays indexed as in the math

use super::blocks_lanes::{planes, BlockLanes, LANES};
use super::blocks_tile::{
    for_format, for_mode, keeps, kept, offset_of, planes_of, KEEP, KEPT, KEPT_BLOCK, Q4K, Q4_0, Q5K, Q5_0, Q5_1, Q6K,
};
use super::cpu::{Avx2Fma, AvxVnni, SharedOut};
use super::lanes_avx2::{prefetch, store, PREFETCH_AHEAD};
use super::q8::QK;
use super::{KActs, Q8Acts};
use std::arch::x86_64::*;

/// `out[t, n] = sum_k w[n, k] * a[t, k]`, driven as `lanes::matmul` is; with `vnni`, the
/// products are AVX-VNNI's `vpdpbusd` (see `lanes_tile_vnni`).
pub fn matmul(avx2: Avx2Fma, vnni: Option<AvxVnni>, w: &BlockLanes, a: &Q8Acts, out: &mut [f32]) {
    assert_eq!(w.blocks * QK, a.cols(), "inner dimensions differ");
    assert_eq!(out.len(), w.rows * a.rows());
    super::lanes::for_each_tile(&Tiles { avx2, vnni, w, a, no_k: KActs::default() }, w.groups(), a.rows(), out);
}

struct Tiles<'a> {
    avx2: Avx2Fma,
    vnni: Option<AvxVnni>,
    w: &'a BlockLanes,
    a: &'a Q8Acts,
    no_k: KActs,
}

impl super::lanes::GroupTiles for Tiles<'_> {
    #[inline(always)]
    fn tile<const R: usize, const C: usize>(&self, g: usize, t: usize, out: &SharedOut) {
        assert!((g + R) * LANES < self.w.rows + LANES && t + C <= self.a.rows());
        for r in 0..R {
            self.group::<C>(g + r, r, t, out);
        }
    }
}

impl Tiles<'_> {
    #[inline(always)]
    fn group<const C: usize>(&self, g: usize, slot: usize, t: usize, out: &SharedOut) {
        let (avx2, w, a) = (self.avx2, self.w, self.a);
        // Slot `slot` of the buffer is group g's (see `blocks_tile::kept`).
        let (mode, buf) = kept(keeps(planes(w.format)), a.rows(), t, w.blocks);
        let buf = buf.wrapping_add(slot * w.blocks * KEPT_BLOCK);
        // SAFETY: the tokens prove the features; group g and rows t..t+C exist (asserted by the
        // caller; `matmul` asserted the shapes); `k`, when used, is `a`'s own per-256
        // quantisation; each task owns the output columns of its groups; `buf`, unless
        // unpacking, is this thread's slot of 512 bytes a block, which the group's KEEP tile
        // filled before any KEPT tile of it reads (see `blocks_tile::kept`).
        unsafe {
            macro_rules! halves {
                ($tile:ident, $token:expr, $F:ident, $KQ:ident, $k:expr, $P:expr) => {
                    if C == 1 {
                        $tile::<C, $F, $KQ, 0, 2, { $P }>($token, w, a, $k, g, t, buf)
                    } else {
                        let [h0] = $tile::<C, $F, $KQ, 0, 1, { $P }>($token, w, a, $k, g, t, buf);
                        let [h1] = $tile::<C, $F, $KQ, 1, 1, { $P }>($token, w, a, $k, g, t, buf);
                        [h0, h1]
                    }
                };
                ($tile:ident, $token:expr, $F:ident, $KQ:ident, $k:expr) => {
                    for_mode!(mode, |P| halves!($tile, $token, $F, $KQ, $k, P))
                };
            }
            let acc = for_format!(w.format, a, &self.no_k, |F, KQ, k| match self.vnni {
                Some(vnni) => halves!(lanes_tile_vnni, vnni, F, KQ, k),
                None => halves!(lanes_tile, avx2, F, KQ, k),
            });
            store::<C>(avx2, &acc, g, t, w.rows, out.ptr());
        }
    }
}

/// Lanes `8*H0..8*(H0+HN)` of group `g` (both halves, or one) times activation rows `t..t+C`
/// (up to four). The passes and epilogues are `blocks_tile::block_tile`'s; see there for why.
///
/// Why a half at a time for several rows: unpacking a step's weights costs three to six
/// instructions a register, as many as a row's products of it or more, so the more rows meet one
/// unpacked register the faster the tile (prefill and many streams are bound by these
/// instructions, not by memory). Both halves of a group for four rows need more than AVX2's
/// sixteen registers (the kernel spilled at two rows); one half for four rows fits. The price is
/// a broadcast of the activations per half instead of per group, so the 4-bit formats, whose
/// unpacking is cheapest, gain least (Q4_K level, Q5_0 and Q6_K ~20% on Zen 3:
/// `matmul_bench blocks`). One activation row (decode) keeps both halves in one pass: it reads
/// the group from memory once, where a second pass would read it again from L2.
/// Each lane's float epilogue is unchanged, so the bits are too.
///
/// # Safety
/// Group `g` of `w` and rows `t..t+C` of `a` exist, `w.blocks * QK == a.cols()`, `F` is
/// `w.format`'s code, and with `KQ` the format is a K-quant and `k` is `a`'s per-256
/// quantisation. With `P` KEEP, `buf` has `512 * w.blocks` writable bytes; with KEPT, those
/// bytes were written by a KEEP tile of the same group (and both halves, or the halves read).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes_tile<const C: usize, const F: u8, const KQ: bool, const H0: usize, const HN: usize, const P: u8>(
    _: Avx2Fma,
    w: &BlockLanes,
    a: &Q8Acts,
    k: &KActs,
    g: usize,
    t: usize,
    buf: *mut u8,
) -> [[__m256; C]; HN] {
    // SAFETY: the caller's; the token proves the features the body's instructions need.
    unsafe { tile_body::<C, F, KQ, H0, HN, P, false>(w, a, k, g, t, buf) }
}

/// [`lanes_tile`] with AVX-VNNI: each step's products go straight into the lanes' i32 sums with
/// `vpdpbusd`, which replaces `vpmaddubsw`, the i16 additions and the widening `vpmaddwd` (three
/// to five instructions a step and row, for one or two), and the K-quants' sub-block codes
/// multiply each block's sum once with `vpmulld`, as the AVX-512 VNNI kernel does. The integer
/// sums are the same, so the bits are too (`blocks_tests` compares the tiers).
///
/// # Safety
/// As for [`lanes_tile`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn lanes_tile_vnni<
    const C: usize,
    const F: u8,
    const KQ: bool,
    const H0: usize,
    const HN: usize,
    const P: u8,
>(
    _: AvxVnni,
    w: &BlockLanes,
    a: &Q8Acts,
    k: &KActs,
    g: usize,
    t: usize,
    buf: *mut u8,
) -> [[__m256; C]; HN] {
    // SAFETY: the caller's; the token proves the features the body's instructions need.
    unsafe { tile_body::<C, F, KQ, H0, HN, P, true>(w, a, k, g, t, buf) }
}

/// The body of both tiles, inlined into each so that it compiles with its features (`V`: AVX-VNNI).
///
/// # Safety
/// As for [`lanes_tile`], and the CPU runs AVX2, FMA, F16C (and with `V`, AVX-VNNI).
#[inline(always)]
unsafe fn tile_body<
    const C: usize,
    const F: u8,
    const KQ: bool,
    const H0: usize,
    const HN: usize,
    const P: u8,
    const V: bool,
>(
    w: &BlockLanes,
    a: &Q8Acts,
    k: &KActs,
    g: usize,
    t: usize,
    buf: *mut u8,
) -> [[__m256; C]; HN] {
    let (blocks, bb, sb) = (w.blocks, w.block_bytes(), w.scale_blocks());
    let n_planes = planes_of(F);
    let off = offset_of(F);
    let cols = blocks * QK;
    let nib = _mm256_set1_epi8(0x0F);
    let (bit4, crumb) = (_mm256_set1_epi8(0x10), _mm256_set1_epi8(0x30));
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); C]; HN];
    let aq = if KQ { k.quants().as_ptr() } else { a.quants().as_ptr() };
    let (scales, ss32, ss16) = (a.scales().as_ptr(), a.all_scaled_sums().as_ptr(), a.all_scaled_sums16().as_ptr());
    let (kscales, kpairs, kq6) = (k.scales().as_ptr(), k.pairs().as_ptr(), k.q6_start().as_ptr());
    let kneg = k.q6_neg().as_ptr();
    let f16x8 = |p: *const u16| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
    let u8x8 = |p: *const u8| _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
    let i8x8 = |p: *const u8| _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i));
    let mut isb = [[_mm256_setzero_si256(); C]; HN];
    // SAFETY (whole body): as in `blocks_tile::block_tile` for group g alone: every (group,
    // block) offset of q and codes, (group, scale block) offset of d16 and m16, activation byte
    // and per-256 entry read below exists; a half h reads bytes 32h..32h+32 of a 64-byte step or
    // plane, and entries 8h..8h+8 of 16 lanes; a kept step's registers lie at
    // `64 * (2 * (4b + step) + h)` in `buf`, under `512 * blocks` (the caller's).
    unsafe {
        for b in 0..blocks {
            let base = w.q.as_ptr().add((g * blocks + b) * bb);
            if t == 0 && H0 == 0 && P != KEPT {
                // The first tile of a group streams its weights from memory (see `prefetch`);
                // the codes come 32 bytes a block, so as far ahead in blocks.
                prefetch(base.wrapping_add(PREFETCH_AHEAD), bb);
                if KQ && b % 2 == 0 {
                    prefetch(w.codes.as_ptr().wrapping_add((g * blocks + b) * 32 + PREFETCH_AHEAD * 32 / bb), 64);
                }
            }
            macro_rules! pass {
                ($half:expr) => {{
                    const HALF: usize = $half;
                    // The weights' sub-block codes of this block (KQ), each lane's code in both
                    // of its i16 halves, so that `vpmaddwd` widens the pair sums and scales them
                    // in one instruction (VNNI, and AVX-VNNI here: a block's sum, then `vpmulld`).
                    // With AVX-VNNI and activations per 256, Q6_K's block is one pass (HALF 2)
                    // over its two sub-blocks of 16 values, each with its code (`sc16[u]`, u the
                    // nibble; the i32 sums need no widening between them); else one code.
                    let q6_both = KQ && F == Q6K && HALF == 2;
                    let mut sc16 = [[_mm256_setzero_si256(); HN]; 2];
                    if KQ {
                        for u in 0..(if q6_both { 2 } else { 1 }) {
                            let hb = if q6_both { u } else { HALF & 1 };
                            for j in 0..HN {
                                let h = H0 + j;
                                let q6 = w.codes.as_ptr().add((g * blocks + b) * 32 + 16 * hb + 8 * h);
                                sc16[u][j] = if V {
                                    // AVX-VNNI: the code as each lane's i32, for `vpmulld`.
                                    if F == Q6K {
                                        i8x8(q6)
                                    } else {
                                        u8x8(w.codes.as_ptr().add(w.sc_at(g, b) + 8 * h))
                                    }
                                } else if F == Q6K {
                                    let x = _mm_loadl_epi64(q6 as *const __m128i);
                                    _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(x, x))
                                } else {
                                    let x =
                                        _mm_loadl_epi64(w.codes.as_ptr().add(w.sc_at(g, b) + 8 * h) as *const __m128i);
                                    _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(x, x))
                                };
                                if V && F == Q6K {
                                    // Q6_K's offset: -32 * the half's activation sum, times the code
                                    // (without AVX-VNNI, once a block, before the passes).
                                    let sc = i8x8(q6);
                                    for c in 0..C {
                                        let start = _mm256_set1_epi32(*kq6.add((t + c) * cols / 16 + 2 * b + hb));
                                        isb[j][c] = _mm256_add_epi32(isb[j][c], _mm256_mullo_epi32(start, sc));
                                    }
                                }
                            }
                        }
                    }
                    let mut isum = [[_mm256_setzero_si256(); C]; HN];
                    // i16 pair sums since the last widening: SPAN steps fit (4 for the 4-bit
                    // formats, 2 with a fifth or sixth bit; see the module's bounds).
                    let mut p16 = [[_mm256_setzero_si256(); C]; HN];
                    let span = if n_planes == 0 && HALF == 2 { 4 } else { 2 };
                    // AVX-VNNI: the block's i32 sums, two a lane (the low and high nibbles', or
                    // even and odd steps'), so that no `vpdpbusd` waits on the one before.
                    let mut v32 = [[[_mm256_setzero_si256(); C]; HN]; 2];
                    for step in 0..4 {
                        let mut lo = [_mm256_setzero_si256(); HN];
                        let mut hi = [_mm256_setzero_si256(); HN];
                        for j in 0..HN {
                            let h = H0 + j;
                            // This step's unpacked registers of half h in the kept group.
                            let kept = buf.wrapping_add(((b * 4 + step) * 2 + h) * 64) as *mut __m256i;
                            if P == KEPT {
                                if HALF != 1 {
                                    lo[j] = _mm256_loadu_si256(kept);
                                }
                                if HALF != 0 {
                                    hi[j] = _mm256_loadu_si256(kept.add(1));
                                }
                                continue;
                            }
                            let v = _mm256_loadu_si256(base.add(step * 64 + 32 * h) as *const _);
                            if HALF != 1 {
                                lo[j] = _mm256_and_si256(v, nib);
                            }
                            if HALF != 0 {
                                hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                            }
                            if n_planes == 2 {
                                let c = _mm256_loadu_si256(base.add(256 + 64 * (step / 2) + 32 * h) as *const _);
                                if HALF != 1 {
                                    let l = if step % 2 == 0 { c } else { _mm256_slli_epi16(c, 4) };
                                    lo[j] = _mm256_or_si256(lo[j], _mm256_and_si256(l, crumb));
                                }
                                if HALF != 0 {
                                    let s =
                                        if step % 2 == 0 { _mm256_srli_epi16(c, 2) } else { _mm256_slli_epi16(c, 2) };
                                    hi[j] = _mm256_or_si256(hi[j], _mm256_and_si256(s, crumb));
                                }
                            } else if n_planes == 1 {
                                let p0 = _mm256_loadu_si256(base.add(256 + 32 * h) as *const _);
                                let up = _mm256_sll_epi16(p0, _mm_cvtsi32_si128(4 - step as i32));
                                lo[j] = _mm256_or_si256(lo[j], _mm256_and_si256(up, bit4));
                                let down = _mm256_srl_epi16(p0, _mm_cvtsi32_si128(step as i32));
                                hi[j] = _mm256_or_si256(hi[j], _mm256_and_si256(down, bit4));
                            }
                            if P == KEEP {
                                if HALF != 1 {
                                    _mm256_storeu_si256(kept, lo[j]);
                                }
                                if HALF != 0 {
                                    _mm256_storeu_si256(kept.add(1), hi[j]);
                                }
                            }
                        }
                        for c in 0..C {
                            let at = aq.add((t + c) * cols + b * QK + step * 4);
                            let a_lo = _mm256_set1_epi32((at as *const i32).read_unaligned());
                            let a_hi = _mm256_set1_epi32((at.add(16) as *const i32).read_unaligned());
                            for j in 0..HN {
                                if V {
                                    let u = step % 2;
                                    match HALF {
                                        0 => v32[u][j][c] = _mm256_dpbusd_avx_epi32(v32[u][j][c], lo[j], a_lo),
                                        1 => v32[u][j][c] = _mm256_dpbusd_avx_epi32(v32[u][j][c], hi[j], a_hi),
                                        _ => {
                                            v32[0][j][c] = _mm256_dpbusd_avx_epi32(v32[0][j][c], lo[j], a_lo);
                                            v32[1][j][c] = _mm256_dpbusd_avx_epi32(v32[1][j][c], hi[j], a_hi);
                                        }
                                    }
                                    continue;
                                }
                                let pairs = match HALF {
                                    0 => _mm256_maddubs_epi16(lo[j], a_lo),
                                    1 => _mm256_maddubs_epi16(hi[j], a_hi),
                                    _ => _mm256_add_epi16(
                                        _mm256_maddubs_epi16(lo[j], a_lo),
                                        _mm256_maddubs_epi16(hi[j], a_hi),
                                    ),
                                };
                                p16[j][c] = _mm256_add_epi16(p16[j][c], pairs);
                            }
                        }
                        if !V && (step + 1) % span == 0 {
                            for j in 0..HN {
                                for c in 0..C {
                                    if KQ {
                                        let scaled = _mm256_madd_epi16(p16[j][c], sc16[0][j]);
                                        isb[j][c] = _mm256_add_epi32(isb[j][c], scaled);
                                    } else {
                                        isum[j][c] = _mm256_add_epi32(isum[j][c], _mm256_madd_epi16(p16[j][c], ones));
                                    }
                                    p16[j][c] = _mm256_setzero_si256();
                                }
                            }
                        }
                    }
                    if V {
                        for j in 0..HN {
                            for c in 0..C {
                                let sum = _mm256_add_epi32(v32[0][j][c], v32[1][j][c]);
                                if q6_both {
                                    let lo = _mm256_mullo_epi32(v32[0][j][c], sc16[0][j]);
                                    let hi = _mm256_mullo_epi32(v32[1][j][c], sc16[1][j]);
                                    isb[j][c] = _mm256_add_epi32(isb[j][c], _mm256_add_epi32(lo, hi));
                                } else if KQ {
                                    isb[j][c] = _mm256_add_epi32(isb[j][c], _mm256_mullo_epi32(sum, sc16[0][j]));
                                } else {
                                    isum[j][c] = sum;
                                }
                            }
                        }
                    }
                    if !KQ {
                        let mut sa = [_mm256_setzero_ps(); C];
                        let mut sums = [_mm256_setzero_ps(); C];
                        for c in 0..C {
                            let row = t + c;
                            sa[c] = _mm256_set1_ps(*scales.add(row * blocks + b));
                            let sum = if HALF == 2 {
                                *ss32.add(row * blocks + b)
                            } else {
                                *ss16.add(row * blocks * 2 + 2 * b + HALF)
                            };
                            sums[c] = _mm256_set1_ps(if off != 0.0 { off * sum } else { sum });
                        }
                        for j in 0..HN {
                            let h = H0 + j;
                            let (s, m) = match F {
                                Q4_0 | Q5_0 | Q5_1 => {
                                    let at = (g * sb + b) * LANES + 8 * h;
                                    let m = if F == Q5_1 { f16x8(w.m16.as_ptr().add(at)) } else { _mm256_setzero_ps() };
                                    (f16x8(w.d16.as_ptr().add(at)), m)
                                }
                                Q4K | Q5K => {
                                    let at = (g * sb + b / 8) * LANES + 8 * h;
                                    let (d, dmin) = (f16x8(w.d16.as_ptr().add(at)), f16x8(w.m16.as_ptr().add(at)));
                                    let sc = _mm256_cvtepi32_ps(u8x8(w.codes.as_ptr().add(w.sc_at(g, b) + 8 * h)));
                                    let pairs = _mm256_cvtepu8_epi16(_mm_loadu_si128(
                                        w.codes.as_ptr().add(w.m_at(g, b & !1, 0) + 16 * h) as *const __m128i,
                                    ));
                                    let shifted = _mm256_srl_epi32(pairs, _mm_cvtsi32_si128(16 * (b & 1) as i32));
                                    let mc = _mm256_cvtepi32_ps(_mm256_and_si256(shifted, _mm256_set1_epi32(0xFFFF)));
                                    (_mm256_mul_ps(d, sc), _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(dmin, mc)))
                                }
                                _ => {
                                    let d = f16x8(w.d16.as_ptr().add((g * sb + b / 8) * LANES + 8 * h));
                                    let sc =
                                        i8x8(w.codes.as_ptr().add((g * blocks + b) * 32 + 16 * (HALF & 1) + 8 * h));
                                    (_mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)), _mm256_setzero_ps())
                                }
                            };
                            for c in 0..C {
                                let q = _mm256_cvtepi32_ps(isum[j][c]);
                                acc[j][c] = if off != 0.0 {
                                    _mm256_fmadd_ps(_mm256_fmsub_ps(q, sa[c], sums[c]), s, acc[j][c])
                                } else {
                                    let acc1 = _mm256_fmadd_ps(q, _mm256_mul_ps(s, sa[c]), acc[j][c]);
                                    _mm256_fmadd_ps(m, sums[c], acc1)
                                };
                            }
                        }
                    }
                }};
            }
            if KQ && F == Q6K && !V {
                // Q6_K's offset, -32 * each 16 values' activation sum times their code, for both
                // sub-blocks of the block in one `vpmaddwd` a row: the codes times 32 (at most
                // 4,096 in magnitude) as each lane's i16 pair, the rows' `-sum` pairs (at most
                // 2,032) broadcast. The sum is the two `vpmulld` products', exactly.
                for j in 0..HN {
                    let q6 = w.codes.as_ptr().add((g * blocks + b) * 32 + 8 * (H0 + j));
                    let (c0, c1) =
                        (_mm_loadl_epi64(q6 as *const __m128i), _mm_loadl_epi64(q6.add(16) as *const __m128i));
                    let codes = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(c0, c1)), 5);
                    for c in 0..C {
                        let neg = (kneg.add((t + c) * cols / 16 + 2 * b) as *const i32).read_unaligned();
                        isb[j][c] = _mm256_add_epi32(isb[j][c], _mm256_madd_epi16(codes, _mm256_set1_epi32(neg)));
                    }
                }
            }
            if F == Q6K && !(V && KQ) {
                pass!(0);
                pass!(1);
            } else {
                pass!(2);
            }
            if KQ && b % 8 == 7 {
                let sbk = b / 8;
                let mut kd = [_mm256_setzero_ps(); C];
                for c in 0..C {
                    kd[c] = _mm256_set1_ps(*kscales.add((t + c) * sb + sbk));
                }
                for j in 0..HN {
                    let at = (g * sb + sbk) * LANES + 8 * (H0 + j);
                    let d = f16x8(w.d16.as_ptr().add(at));
                    if F == Q6K {
                        for c in 0..C {
                            acc[j][c] =
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(isb[j][c]), _mm256_mul_ps(d, kd[c]), acc[j][c]);
                        }
                    } else {
                        let dmin = f16x8(w.m16.as_ptr().add(at));
                        let mut mins = [_mm256_setzero_si256(); 4];
                        for p in 0..4 {
                            let pairs = w.codes.as_ptr().add(w.m_at(g, sbk * 8 + 2 * p, 0) + 16 * (H0 + j));
                            mins[p] = _mm256_cvtepu8_epi16(_mm_loadu_si128(pairs as *const __m128i));
                        }
                        for c in 0..C {
                            let sums = kpairs.add(((t + c) * sb + sbk) * 4);
                            let mut mn = _mm256_setzero_si256();
                            for p in 0..4 {
                                mn = _mm256_add_epi32(mn, _mm256_madd_epi16(mins[p], _mm256_set1_epi32(*sums.add(p))));
                            }
                            let acc1 =
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(isb[j][c]), _mm256_mul_ps(d, kd[c]), acc[j][c]);
                            acc[j][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mn), _mm256_mul_ps(dmin, kd[c]), acc1);
                        }
                    }
                    isb[j] = [_mm256_setzero_si256(); C];
                }
            }
        }
    }
    acc
}
