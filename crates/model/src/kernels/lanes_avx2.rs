//! The lane-packed Q4_1 and int8 weights' (`lanes`) AVX2 matmul, the twin of the VNNI one.
//!
//! Why: the AVX2 tier's row kernels (`q4::matmul_avx2`, `simd::dot_q8x4`) unpack each block for
//! every few activation rows and end every output in a horizontal sum, which holds prefill at
//! llama.cpp's AVX2 level (0.94x on SmolLM2, docs/benchmarks.md) and makes the trainer's int8
//! forward, which the sampler's agreement needs, 1.5x slower than f32 GEMMs there. Here, as with
//! VNNI, one broadcast of four activation bytes meets eight rows' four bytes, the block's scales
//! are applied once per eight rows, and outputs are stored as they are.
//!
//! A 16-row group is two registers of eight lanes. `vpdpbusd` becomes `vpmaddubsw` (unsigned x
//! signed bytes into i16 pairs) and `vpmaddwd` with ones. Q4_1's products, at most 2 * 15 * 127
//! a pair, stay in i16 for the block's four steps of both nibbles and widen once. int8 weights
//! are stored with their top bit flipped (`w + 128`) for `vpdpbusd`; 255 * 127 * 2 would
//! saturate `vpmaddubsw`, so the flip is undone and the sign moved onto the activations (`|w|`
//! times `a` with `w`'s sign, at most 2 * 127 * 127), and the lanes start at zero instead of
//! `-128 * sum(a)`. The integer sums are exact either way and the float epilogue is the VNNI
//! kernel's, so both tiers give equal bits. Several activation rows take a group one half (eight
//! lanes) at a time, four rows at once, which fits AVX2's sixteen registers (see `q4_half`).
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)] // register arrays indexed as in the math

use super::blocks_tile::{for_mode, keeps, kept, KEEP, KEPT, KEPT_BLOCK};
use super::cpu::{Avx2Fma, AvxVnni, SharedOut};
use super::lanes::{GroupTiles, Packed, LANES};
use super::q8::QK;
use super::Q8Acts;
use std::arch::x86_64::*;

/// `out[t, n] = sum_k w[n, k] * a[t, k]`, driven as `lanes::matmul` is; with `vnni`, the
/// products are AVX-VNNI's `vpdpbusd` (see `q4_half_vnni`).
pub fn matmul(avx2: Avx2Fma, vnni: Option<AvxVnni>, w: &Packed, a: &Q8Acts, out: &mut [f32]) {
    assert_eq!(w.blocks * QK, a.cols(), "inner dimensions differ");
    assert_eq!(out.len(), w.rows * a.rows());
    super::lanes::for_each_tile(&Tiles { avx2, vnni, w, a }, w.groups(), a.rows(), out);
}

struct Tiles<'a> {
    avx2: Avx2Fma,
    vnni: Option<AvxVnni>,
    w: &'a Packed,
    a: &'a Q8Acts,
}

impl GroupTiles for Tiles<'_> {
    #[inline(always)]
    fn tile<const R: usize, const C: usize>(&self, g: usize, t: usize, out: &SharedOut) {
        let (avx2, w, a) = (self.avx2, self.w, self.a);
        assert!((g + R) * LANES < w.rows + LANES && t + C <= a.rows());
        // One row (decode) takes both halves of a group in one pass, reading it from memory
        // once; more rows take a half at a time (see `q4_half`).
        macro_rules! group {
            ($kernel:ident, $token:expr, $g:expr $(, $p:expr, $buf:expr)?) => {
                if C == 1 {
                    $kernel::<C, 0, 2 $(, { $p })?>($token, w, a, $g, t $(, $buf)?)
                } else {
                    let [h0] = $kernel::<C, 0, 1 $(, { $p })?>($token, w, a, $g, t $(, $buf)?);
                    let [h1] = $kernel::<C, 1, 1 $(, { $p })?>($token, w, a, $g, t $(, $buf)?);
                    [h0, h1]
                }
            };
        }
        // Q4_1's groups unpacked once with many rows, where the CPU gains (`blocks_tile::kept`).
        let (mode, buf) = kept(w.q4 && keeps(0), a.rows(), t, w.blocks);
        for r in 0..R {
            // Slot r of the buffer is group g + r's.
            let buf = buf.wrapping_add(r * w.blocks * KEPT_BLOCK);
            // SAFETY: the token proves the features; the group and rows exist (asserted;
            // `matmul` asserted the shapes); each task owns its groups' columns; `buf`, unless
            // unpacking, is this thread's slot of `KEPT_BLOCK` bytes a block, which the group's
            // KEEP tile filled before any KEPT tile of it reads (`blocks_tile::kept`).
            unsafe {
                let acc = match (self.vnni, w.q4) {
                    (Some(vnni), true) => for_mode!(mode, |P| group!(q4_half_vnni, vnni, g + r, P, buf)),
                    (Some(vnni), false) => group!(q8_half_vnni, vnni, g + r),
                    (None, true) => for_mode!(mode, |P| group!(q4_half, avx2, g + r, P, buf)),
                    (None, false) => group!(q8_half, avx2, g + r),
                };
                store::<C>(avx2, &acc, g + r, t, w.rows, out.ptr());
            }
        }
    }
}

/// How far ahead of the tile the weights are prefetched, in bytes.
///
/// Why: a decode step's tile meets each weight byte once, and on the AVX2 tier its unpacking
/// takes about as long as the byte's fetch from memory. Zen 1's prefetchers did not run far
/// enough ahead to overlap the two: Qwen2.5-Coder 1.5B's 28 layers at T=1 on two threads took
/// ~77 ms a pass at 10.5 GB/s, against 20 GB/s that plain loads reach. Asking for the bytes
/// ~2 KiB (about seven Q4_K blocks of a group) ahead: ~45-55 ms, ~17 GB/s (`matmul_bench
/// layers 1 2`, distances 512 to 3072 tried; docs/benchmarks.md, session 46). The AVX-512 VNNI
/// tiles (`lanes::q4_tile`, `q8_tile`, `blocks_tile`) ask the same way since session 50: on Zen 5
/// a tile of several activation rows computes fast enough that its first pass over a group
/// waited on memory (the 1.5B's layers at T=16: ~54 -> ~45 ms a pass; T=4: ~31 -> ~20 ms).
pub(super) const PREFETCH_AHEAD: usize = 2048;

/// Prefetches `bytes` from `at` into L1, a line at a time. Callers point [`PREFETCH_AHEAD`]
/// past what they read now (or as many blocks ahead in a thinner stream); groups are laid out
/// one after the other, so past a group's end that is the next group's start, which the same
/// task takes next. A prefetch never faults, so an address past the buffer is harmless, and it
/// is computed with `wrapping_add`, without `add`'s in-bounds promise.
#[inline(always)]
pub(super) fn prefetch(at: *const u8, bytes: usize) {
    let mut line = 0;
    while line < bytes {
        // SAFETY: a prefetch is a hint that reads nothing the program can see and never faults;
        // SSE is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line) as *const i8) };
        line += 64;
    }
}

/// Writes a group's two registers per activation row to output rows `t..t+C` (padding lanes
/// left out).
///
/// # Safety
/// Rows `t..t+C` and the existing columns of group `g` lie inside the (T, n_out) output.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn store<const C: usize>(
    _: Avx2Fma,
    acc: &[[__m256; C]; 2],
    g: usize,
    t: usize,
    n_out: usize,
    out: *mut f32,
) {
    for h in 0..2 {
        let n = g * LANES + 8 * h;
        let valid = n_out.saturating_sub(n).min(8);
        for c in 0..C {
            // SAFETY (caller): columns n..n+valid of row t + c are inside the output.
            unsafe {
                let dst = out.add((t + c) * n_out + n);
                if valid == 8 {
                    _mm256_storeu_ps(dst, acc[h][c]);
                } else if valid > 0 {
                    let mut lanes = [0f32; 8];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[h][c]);
                    std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, valid);
                }
            }
        }
    }
}

/// Lanes `8*H0..8*(H0+HN)` of Q4_1 group `g` (both halves, or one) times activation rows
/// `t..t+C` (up to four).
///
/// Why a half at a time for several rows: with both halves for two rows LLVM kept a block's
/// eight activation broadcasts of each row on the stack to reuse them for the second half (16
/// spilled stores and reloads a block), and the kernel ran ~21 multiply-adds a cycle on Zen 3
/// where its instructions allow ~38. One half for up to four rows fits AVX2's sixteen registers
/// (four i16 sums, two unpacked registers, the mask and two broadcasts; the float sums wait in
/// memory between blocks), as in `blocks_tile_avx2::lanes_tile`. One activation row (decode)
/// keeps both halves in one pass, reading the group from memory once. The integer sums are exact
/// in any order and each lane's float epilogue is unchanged, so the bits are those of the VNNI
/// kernel.
///
/// # Safety
/// Group `g` of `w` (Q4_1) and rows `t..t+C` of `a` exist, `w.blocks * QK == a.cols()`, and
/// `H0 + HN <= 2`. With `P` KEEP, `buf` has `KEPT_BLOCK * w.blocks` writable bytes; with KEPT,
/// a KEEP tile of the same group wrote the halves read (`blocks_tile::kept`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_half<const C: usize, const H0: usize, const HN: usize, const P: u8>(
    _: Avx2Fma,
    w: &Packed,
    a: &Q8Acts,
    g: usize,
    t: usize,
    buf: *mut u8,
) -> [[__m256; C]; HN] {
    // SAFETY: the caller's; the token proves the features the body's instructions need.
    unsafe { q4_body::<C, H0, HN, P, false>(w, a, g, t, buf) }
}

/// [`q4_half`] with AVX-VNNI (Intel's chips since Alder Lake): `vpdpbusd` adds each step's
/// products to the lanes' i32 sums, in place of `vpmaddubsw`, two i16 additions and the block's
/// widening. The same integers, so the same bits.
///
/// # Safety
/// As for [`q4_half`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn q4_half_vnni<const C: usize, const H0: usize, const HN: usize, const P: u8>(
    _: AvxVnni,
    w: &Packed,
    a: &Q8Acts,
    g: usize,
    t: usize,
    buf: *mut u8,
) -> [[__m256; C]; HN] {
    // SAFETY: the caller's; the token proves the features the body's instructions need.
    unsafe { q4_body::<C, H0, HN, P, true>(w, a, g, t, buf) }
}

/// The body of both Q4_1 tiles, inlined into each so that it compiles with its features (`V`:
/// AVX-VNNI).
///
/// # Safety
/// As for [`q4_half`], and the CPU runs AVX2, FMA, F16C (and with `V`, AVX-VNNI).
#[inline(always)]
unsafe fn q4_body<const C: usize, const H0: usize, const HN: usize, const P: u8, const V: bool>(
    w: &Packed,
    a: &Q8Acts,
    g: usize,
    t: usize,
    buf: *mut u8,
) -> [[__m256; C]; HN] {
    let blocks = w.blocks;
    let k = blocks * QK;
    let (mask, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
    // The float sums live in memory, read and written once a block (volatile, so LLVM keeps
    // them there): in registers they left too few for the block's products, which LLVM then
    // spilled every step (~70 -> ~77 GMAC/s a thread at 16 rows on Zen 3, `matmul_bench`).
    let mut acc = [[_mm256_setzero_ps(); C]; HN];
    let (aq, scales, ss) = (a.quants().as_ptr(), a.scales().as_ptr(), a.all_scaled_sums().as_ptr());
    // SAFETY (whole body): g * blocks + b indexes an existing (group, block) of 256 bytes and 16
    // f16 scales and minimums (a half reads bytes 32h..32h+32 of each 64-byte step, entries
    // 8h..8h+8), and (t + c) * k + b * 32 + 31 an existing activation byte; a kept step's
    // registers of half h lie at `64 * (2 * (4b + step) + h)` in `buf`, under `512 * blocks`.
    unsafe {
        for b in 0..blocks {
            let gb = g * blocks + b;
            if t == 0 && H0 == 0 && P != KEPT {
                // The first tile of a group streams it (see `prefetch`); the scales and minimums
                // come 32 bytes a block, so as far ahead in blocks.
                prefetch(w.q.as_ptr().wrapping_add(gb * 256 + PREFETCH_AHEAD), 256);
                if b % 2 == 0 {
                    prefetch((w.d16.as_ptr() as *const u8).wrapping_add(gb * 32 + PREFETCH_AHEAD / 8), 64);
                    prefetch((w.m16.as_ptr() as *const u8).wrapping_add(gb * 32 + PREFETCH_AHEAD / 8), 64);
                }
            }
            // The block's four steps stay in i16 (at most 4 * 2 * 2 * 15 * 127 = 30480) and widen
            // once.
            let mut p16 = [[_mm256_setzero_si256(); C]; HN];
            // AVX-VNNI: the low and high nibbles' i32 sums apart, so that no `vpdpbusd` waits
            // on the one before.
            let mut v32 = [[[_mm256_setzero_si256(); C]; HN]; 2];
            for step in 0..4 {
                let mut lo = [_mm256_setzero_si256(); HN];
                let mut hi = [_mm256_setzero_si256(); HN];
                for j in 0..HN {
                    // As `blocks_tile_avx2`'s tile lays a kept step out: half h's lo then hi.
                    let kept = buf.wrapping_add(((b * 4 + step) * 2 + H0 + j) * 64) as *mut __m256i;
                    if P == KEPT {
                        lo[j] = _mm256_loadu_si256(kept);
                        hi[j] = _mm256_loadu_si256(kept.add(1));
                        continue;
                    }
                    let v = _mm256_loadu_si256(w.q.as_ptr().add(gb * 256 + step * 64 + 32 * (H0 + j)) as *const _);
                    lo[j] = _mm256_and_si256(v, mask);
                    hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
                    if P == KEEP {
                        _mm256_storeu_si256(kept, lo[j]);
                        _mm256_storeu_si256(kept.add(1), hi[j]);
                    }
                }
                for c in 0..C {
                    let at = aq.add((t + c) * k + b * QK + step * 4);
                    let a_lo = _mm256_set1_epi32((at as *const i32).read_unaligned());
                    let a_hi = _mm256_set1_epi32((at.add(16) as *const i32).read_unaligned());
                    for j in 0..HN {
                        if V {
                            v32[0][j][c] = _mm256_dpbusd_avx_epi32(v32[0][j][c], lo[j], a_lo);
                            v32[1][j][c] = _mm256_dpbusd_avx_epi32(v32[1][j][c], hi[j], a_hi);
                            continue;
                        }
                        let pairs =
                            _mm256_add_epi16(_mm256_maddubs_epi16(lo[j], a_lo), _mm256_maddubs_epi16(hi[j], a_hi));
                        p16[j][c] = _mm256_add_epi16(p16[j][c], pairs);
                    }
                }
            }
            for j in 0..HN {
                let h = H0 + j;
                let dv = _mm256_cvtph_ps(_mm_loadu_si128(w.d16.as_ptr().add(gb * LANES + 8 * h) as *const __m128i));
                let mv = _mm256_cvtph_ps(_mm_loadu_si128(w.m16.as_ptr().add(gb * LANES + 8 * h) as *const __m128i));
                for c in 0..C {
                    let s = _mm256_set1_ps(*scales.add((t + c) * blocks + b));
                    let sum = _mm256_set1_ps(*ss.add((t + c) * blocks + b));
                    let isum = if V {
                        _mm256_add_epi32(v32[0][j][c], v32[1][j][c])
                    } else {
                        _mm256_madd_epi16(p16[j][c], ones)
                    };
                    let at = &mut acc[j][c] as *mut __m256;
                    let mut v = at.read_volatile();
                    v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dv, s), v);
                    at.write_volatile(_mm256_fmadd_ps(mv, sum, v));
                }
            }
        }
    }
    acc
}

/// Lanes `8*H0..8*(H0+HN)` of int8 group `g` times activation rows `t..t+C`, laid out as
/// [`q4_half`] for the same reasons.
///
/// # Safety
/// Group `g` of `w` (int8) and rows `t..t+C` of `a` exist, `w.blocks * QK == a.cols()`, and
/// `H0 + HN <= 2`.
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_half<const C: usize, const H0: usize, const HN: usize>(
    _: Avx2Fma,
    w: &Packed,
    a: &Q8Acts,
    g: usize,
    t: usize,
) -> [[__m256; C]; HN] {
    // SAFETY: the caller's; the token proves the features the body's instructions need.
    unsafe { q8_body::<C, H0, HN, false>(w, a, g, t) }
}

/// [`q8_half`] with AVX-VNNI: `vpdpbusd` of `|w|` and the signed activations, in place of
/// `vpmaddubsw`, the widening `vpmaddwd` and the addition. The same integers, so the same bits.
///
/// # Safety
/// As for [`q8_half`].
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn q8_half_vnni<const C: usize, const H0: usize, const HN: usize>(
    _: AvxVnni,
    w: &Packed,
    a: &Q8Acts,
    g: usize,
    t: usize,
) -> [[__m256; C]; HN] {
    // SAFETY: the caller's; the token proves the features the body's instructions need.
    unsafe { q8_body::<C, H0, HN, true>(w, a, g, t) }
}

/// The body of both int8 tiles (`V`: AVX-VNNI), inlined into each.
///
/// # Safety
/// As for [`q8_half`], and the CPU runs AVX2 and FMA (and with `V`, AVX-VNNI).
#[inline(always)]
unsafe fn q8_body<const C: usize, const H0: usize, const HN: usize, const V: bool>(
    w: &Packed,
    a: &Q8Acts,
    g: usize,
    t: usize,
) -> [[__m256; C]; HN] {
    let blocks = w.blocks;
    let k = blocks * QK;
    let (flip, ones) = (_mm256_set1_epi8(-128), _mm256_set1_epi16(1));
    // In memory between blocks, as in `q4_half`.
    let mut acc = [[_mm256_setzero_ps(); C]; HN];
    let (aq, scales) = (a.quants().as_ptr(), a.scales().as_ptr());
    // SAFETY (whole body): as in q4_half, with 512 bytes and 16 f32 scales per (group, block).
    unsafe {
        for b in 0..blocks {
            let gb = g * blocks + b;
            if t == 0 && H0 == 0 {
                // As in `q4_half`: 512 bytes of weights and 64 of f32 scales a block.
                prefetch(w.q.as_ptr().wrapping_add(gb * 512 + PREFETCH_AHEAD), 512);
                prefetch((w.d.as_ptr() as *const u8).wrapping_add(gb * 64 + PREFETCH_AHEAD / 8), 64);
            }
            let mut isum = [[_mm256_setzero_si256(); C]; HN];
            // AVX-VNNI: even and odd steps' sums apart, so that no `vpdpbusd` waits on the last.
            let mut v32 = [[[_mm256_setzero_si256(); C]; HN]; 2];
            for step in 0..8 {
                let mut mag = [_mm256_setzero_si256(); HN];
                let mut wv = [_mm256_setzero_si256(); HN];
                for j in 0..HN {
                    let v = _mm256_loadu_si256(w.q.as_ptr().add(gb * 512 + step * 64 + 32 * (H0 + j)) as *const _);
                    wv[j] = _mm256_xor_si256(v, flip);
                    mag[j] = _mm256_abs_epi8(wv[j]);
                }
                for c in 0..C {
                    let av =
                        _mm256_set1_epi32((aq.add((t + c) * k + b * QK + step * 4) as *const i32).read_unaligned());
                    for j in 0..HN {
                        let signed = _mm256_sign_epi8(av, wv[j]);
                        if V {
                            let u = step % 2;
                            v32[u][j][c] = _mm256_dpbusd_avx_epi32(v32[u][j][c], mag[j], signed);
                            continue;
                        }
                        let pairs = _mm256_maddubs_epi16(mag[j], signed);
                        isum[j][c] = _mm256_add_epi32(isum[j][c], _mm256_madd_epi16(pairs, ones));
                    }
                }
            }
            if V {
                for j in 0..HN {
                    for c in 0..C {
                        isum[j][c] = _mm256_add_epi32(v32[0][j][c], v32[1][j][c]);
                    }
                }
            }
            for j in 0..HN {
                let dv = _mm256_loadu_ps(w.d.as_ptr().add(gb * LANES + 8 * (H0 + j)));
                for c in 0..C {
                    let s = _mm256_set1_ps(*scales.add((t + c) * blocks + b));
                    let at = &mut acc[j][c] as *mut __m256;
                    at.write_volatile(_mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(isum[j][c]),
                        _mm256_mul_ps(dv, s),
                        at.read_volatile(),
                    ));
                }
            }
        }
    }
    acc
}
