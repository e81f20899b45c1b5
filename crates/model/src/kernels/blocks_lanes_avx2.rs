//! The lane groups read back to f32 with AVX2 (the block formats' of `blocks_lanes`, and Q4_1's
//! and int8's of `lanes`): what the transposed copies of `dy W` (`through.rs`) read the served
//! matrices through.
//!
//! Why: read value by value (`BlockLanes::block_values`), a group costs ~1.25 ns a value, and a
//! training step on Qwen2.5-Coder 0.5B, whose matrices are Q5_0, Q4_K and Q6_K, read its whole
//! model back that way for `dy W` (~8% of the step, session 48). Here a 64-byte step of the group
//! is two registers of eight lanes (as in `blocks_tile_avx2`): the nibbles and the high bits of
//! four values of each lane are merged with shifts and masks that never carry a bit across a
//! byte, widened eight bytes (two lanes) at a time, and scaled with each lane's scale and minimum
//! spread over its four values by a permute.
//!
//! The numbers are `block_values`' to the bit: the same f16 scales (F16C converts exactly), the
//! same products of scales and codes, and each value as a multiply then an add (no FMA).
#![allow(unsafe_code)]

use super::blocks::BlockFormat;
use super::blocks_lanes::{planes, BlockLanes, LANES};
use super::cpu::Avx2Fma;
use super::lanes::Packed;
use super::q8::QK;
use std::arch::x86_64::*;

/// The 16 rows of group `g` of `p` into `out` (16 rows of `p.blocks * QK`, row-major; rows past
/// the matrix are left as they are), as `BlockLanes::dequantize_group` defines them.
pub(super) fn dequantize_group(avx2: Avx2Fma, p: &BlockLanes, g: usize, out: &mut [f32]) {
    let cols = p.blocks * QK;
    assert!(g < p.groups() && out.len() >= LANES * cols);
    let valid = (p.rows - g * LANES).min(LANES);
    let bb = p.block_bytes();
    let group = &p.q[g * p.blocks * bb..(g + 1) * p.blocks * bb];
    for (b, src) in group.chunks_exact(bb).enumerate() {
        // SAFETY: the token proves AVX2, FMA and F16C; `src` is the block's bytes (256 of
        // nibbles and 64 per high-bit plane, as `block_bytes` says); `scales` reads 16 lanes of
        // the group's scales and codes, which `from_blocks` allocates for every group; `out`
        // holds 16 rows of `cols` (asserted) and only the first `valid` are written.
        unsafe {
            let scales = scales(avx2, p, g, b);
            block(avx2, p.format, src, &scales, valid, &mut out[b * QK..], cols);
        }
    }
}

/// Per half of the block (values 0..16, 16..32), 16 lanes' scale and minimum.
struct Scales {
    scale: [[f32; LANES]; 2],
    min: [[f32; LANES]; 2],
}

/// Block `b` of group `g`'s scales, as `BlockLanes::half_scales` computes each lane's.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales(_: Avx2Fma, p: &BlockLanes, g: usize, b: usize) -> Scales {
    let sb = p.scale_blocks();
    let f16s = |bits: &[u16]| -> [__m256; 2] {
        assert!(bits.len() >= LANES);
        let v = |o: usize| _mm256_cvtph_ps(_mm_loadu_si128(bits[o..].as_ptr().cast()));
        [v(0), v(8)]
    };
    let mul = |a: [__m256; 2], b: [__m256; 2]| [_mm256_mul_ps(a[0], b[0]), _mm256_mul_ps(a[1], b[1])];
    let splat = |x: f32| [_mm256_set1_ps(x); 2];
    let bytes = |codes: &[u8], signed: bool| -> [__m256; 2] {
        assert!(codes.len() >= LANES);
        let v = |o: usize| {
            let eight = _mm_loadl_epi64(codes[o..].as_ptr().cast());
            let wide = if signed { _mm256_cvtepi8_epi32(eight) } else { _mm256_cvtepu8_epi32(eight) };
            _mm256_cvtepi32_ps(wide)
        };
        [v(0), v(8)]
    };
    let (scale, min) = match p.format {
        BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
            let at = (g * sb + b) * LANES;
            let d = f16s(&p.d16[at..]);
            let m = match p.format {
                BlockFormat::Q4_0 => mul(splat(-8.0), d),
                BlockFormat::Q5_0 => mul(splat(-16.0), d),
                _ => f16s(&p.m16[at..]),
            };
            ([d; 2], [m; 2])
        }
        BlockFormat::Q4K | BlockFormat::Q5K => {
            let at = (g * sb + b / 8) * LANES;
            let (d, dmin) = (f16s(&p.d16[at..]), f16s(&p.m16[at..]));
            let sc = bytes(&p.codes[p.sc_at(g, b)..], false);
            // The minimum codes sit every other byte (`m_at`): 16-bit words, this block's byte.
            let m_codes = &p.codes[p.m_at(g, b, 0) - (b & 1)..][..2 * LANES];
            let shift = _mm_cvtsi32_si128(8 * (b & 1) as i32);
            let m = |o: usize| {
                let words = _mm256_cvtepu16_epi32(_mm_loadu_si128(m_codes[2 * o..].as_ptr().cast()));
                let byte = _mm256_and_si256(_mm256_srl_epi32(words, shift), _mm256_set1_epi32(0xFF));
                _mm256_cvtepi32_ps(byte)
            };
            let neg = |v: __m256| _mm256_xor_ps(v, _mm256_set1_ps(-0.0));
            let dm = mul(dmin, [m(0), m(8)]);
            let s = mul(d, sc);
            ([s; 2], [[neg(dm[0]), neg(dm[1])]; 2])
        }
        BlockFormat::Q6K => {
            let d = f16s(&p.d16[(g * sb + b / 8) * LANES..]);
            let c = (g * p.blocks + b) * 32;
            let s0 = mul(d, bytes(&p.codes[c..], true));
            let s1 = mul(d, bytes(&p.codes[c + 16..], true));
            ([s0, s1], [mul(splat(-32.0), s0), mul(splat(-32.0), s1)])
        }
    };
    let mut out = Scales { scale: [[0.0; LANES]; 2], min: [[0.0; LANES]; 2] };
    for h in 0..2 {
        for (o, i) in [(0, 0), (8, 1)] {
            _mm256_storeu_ps(out.scale[h][o..].as_mut_ptr(), scale[h][i]);
            _mm256_storeu_ps(out.min[h][o..].as_mut_ptr(), min[h][i]);
        }
    }
    out
}

/// One block of the group: values `4s..4s+4` and `16+4s..16+4s+4` of each of the first `valid`
/// lanes, for each step s, into `out[lane * cols..][4s..]` and `[16 + 4s..]`.
///
/// # Safety
/// `src` holds the block's bytes (`BlockLanes::block_bytes`) and `out` at least
/// `(valid - 1) * cols + QK` values; `valid <= 16`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block(_: Avx2Fma, format: BlockFormat, src: &[u8], s: &Scales, valid: usize, out: &mut [f32], cols: usize) {
    assert!(valid <= LANES && src.len() >= 256 + 64 * planes(format));
    assert!(valid == 0 || out.len() >= (valid - 1) * cols + QK);
    let low4 = _mm256_set1_epi8(0x0F);
    let bit4 = _mm256_set1_epi8(0x10);
    let bits45 = _mm256_set1_epi8(0x30);
    // Moves bit `from` of every byte to bit 4 (32-bit shifts: at most 4 places, so with the mask
    // no bit crosses into another byte's bit 4).
    let to_bit4 = |v: __m256i, from: i32| {
        let moved = if from >= 4 {
            _mm256_srl_epi32(v, _mm_cvtsi32_si128(from - 4))
        } else {
            _mm256_sll_epi32(v, _mm_cvtsi32_si128(4 - from))
        };
        _mm256_and_si256(moved, bit4)
    };
    for h in 0..2 {
        let first = 8 * h;
        if first >= valid {
            break;
        }
        let half = |v: &[f32; LANES]| _mm256_loadu_ps(v[first..].as_ptr());
        let (sc, mn) = ([half(&s.scale[0]), half(&s.scale[1])], [half(&s.min[0]), half(&s.min[1])]);
        for step in 0..4 {
            let n = _mm256_loadu_si256(src[64 * step + 32 * h..].as_ptr().cast());
            let (mut lo, mut hi) = (_mm256_and_si256(n, low4), _mm256_and_si256(_mm256_srli_epi32(n, 4), low4));
            match planes(format) {
                0 => {}
                1 => {
                    // Bit s of a plane byte is the fifth bit of value 4s + e (s in 0..8).
                    let plane = _mm256_loadu_si256(src[256 + 32 * h..].as_ptr().cast());
                    lo = _mm256_or_si256(lo, to_bit4(plane, step as i32));
                    hi = _mm256_or_si256(hi, to_bit4(plane, step as i32 + 4));
                }
                _ => {
                    // Q6_K's crumbs (`CRUMB_BITS`): steps 2p and 2p + 1 share vector p, the even
                    // step's halves at bits 4-5 and 6-7, the odd one's at 0-1 and 2-3.
                    let c = _mm256_loadu_si256(src[256 + 64 * (step / 2) + 32 * h..].as_ptr().cast());
                    let (l, u) = if step % 2 == 0 {
                        (c, _mm256_srli_epi32(c, 2))
                    } else {
                        (_mm256_slli_epi32(c, 4), _mm256_slli_epi32(c, 2))
                    };
                    lo = _mm256_or_si256(lo, _mm256_and_si256(l, bits45));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(u, bits45));
                }
            }
            let dst = Dst { first, valid, cols };
            emit(lo, Widen::Unsigned, sc[0], Some(mn[0]), &dst, out, 4 * step);
            emit(hi, Widen::Unsigned, sc[1], Some(mn[1]), &dst, out, 16 + 4 * step);
        }
    }
}

/// The group `g` of a lane-packed Q4_1 or int8 matrix (`lanes::Packed`) into `out`, as
/// `Packed::dequantize_group` defines it: each value `q d + m` (Q4_1: the f16 scale and minimum)
/// or `q d` (int8, top bit flipped back).
pub(super) fn dequantize_packed_group(avx2: Avx2Fma, p: &Packed, g: usize, out: &mut [f32]) {
    let cols = p.blocks * QK;
    assert!(g < p.groups() && out.len() >= LANES * cols);
    let valid = (p.rows - g * LANES).min(LANES);
    let per = if p.q4 { 256 } else { 512 };
    let group = &p.q[g * p.blocks * per..(g + 1) * p.blocks * per];
    for (b, src) in group.chunks_exact(per).enumerate() {
        let gb = g * p.blocks + b;
        // SAFETY: the token proves AVX2, FMA and F16C; `src` is the block's `per` bytes, the
        // scales are the group's 16 per block (`Packed` holds them for every group), `out` holds
        // 16 rows of `cols` (asserted) and only the first `valid` are written.
        unsafe {
            if p.q4 {
                packed_q4_block(
                    avx2,
                    src,
                    &p.d16[gb * LANES..][..LANES],
                    &p.m16[gb * LANES..][..LANES],
                    valid,
                    &mut out[b * QK..],
                    cols,
                )
            } else {
                packed_q8_block(avx2, src, &p.d[gb * LANES..][..LANES], valid, &mut out[b * QK..], cols)
            }
        }
    }
}

/// # Safety
/// As [`block`]'s, for Q4_1's 256 bytes a block.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn packed_q4_block(
    _: Avx2Fma,
    src: &[u8],
    d16: &[u16],
    m16: &[u16],
    valid: usize,
    out: &mut [f32],
    cols: usize,
) {
    assert!(valid <= LANES && src.len() >= 256 && d16.len() >= LANES && m16.len() >= LANES);
    assert!(valid == 0 || out.len() >= (valid - 1) * cols + QK);
    let low4 = _mm256_set1_epi8(0x0F);
    for h in 0..2 {
        let first = 8 * h;
        if first >= valid {
            break;
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(d16[first..].as_ptr().cast()));
        let m = _mm256_cvtph_ps(_mm_loadu_si128(m16[first..].as_ptr().cast()));
        let dst = Dst { first, valid, cols };
        for step in 0..4 {
            let n = _mm256_loadu_si256(src[64 * step + 32 * h..].as_ptr().cast());
            let (lo, hi) = (_mm256_and_si256(n, low4), _mm256_and_si256(_mm256_srli_epi32(n, 4), low4));
            emit(lo, Widen::Unsigned, d, Some(m), &dst, out, 4 * step);
            emit(hi, Widen::Unsigned, d, Some(m), &dst, out, 16 + 4 * step);
        }
    }
}

/// # Safety
/// As [`block`]'s, for int8's 512 bytes a block.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn packed_q8_block(_: Avx2Fma, src: &[u8], d: &[f32], valid: usize, out: &mut [f32], cols: usize) {
    assert!(valid <= LANES && src.len() >= 512 && d.len() >= LANES);
    assert!(valid == 0 || out.len() >= (valid - 1) * cols + QK);
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    for h in 0..2 {
        let first = 8 * h;
        if first >= valid {
            break;
        }
        let scale = _mm256_loadu_ps(d[first..].as_ptr());
        let dst = Dst { first, valid, cols };
        for step in 0..8 {
            let q = _mm256_xor_si256(_mm256_loadu_si256(src[64 * step + 32 * h..].as_ptr().cast()), flip);
            emit(q, Widen::Signed, scale, None, &dst, out, 4 * step);
        }
    }
}

/// Where [`emit`] writes: eight lanes from `first`, only those below `valid`, rows `cols` apart.
struct Dst {
    first: usize,
    valid: usize,
    cols: usize,
}

#[derive(Clone, Copy)]
enum Widen {
    Unsigned,
    Signed,
}

/// Eight lanes' four bytes each (`codes`: lane `first + i` at bytes `4i..4i+4`) as f32, times
/// their lane's `scale` plus its `min` (a multiply, then an add: `block_values`' rounding), into
/// columns `col..col + 4` of each lane's row.
#[inline(always)]
unsafe fn emit(
    codes: __m256i,
    widen: Widen,
    scale: __m256,
    min: Option<__m256>,
    dst: &Dst,
    out: &mut [f32],
    col: usize,
) {
    let halves = [_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1)];
    for j in 0..4 {
        let lane = dst.first + 2 * j;
        if lane >= dst.valid {
            break;
        }
        // Lane pair j's scale and minimum spread over its four values.
        let (a, b) = (2 * j as i32, 2 * j as i32 + 1);
        let spread = _mm256_setr_epi32(a, a, a, a, b, b, b, b);
        let eight = if j % 2 == 0 { halves[j / 2] } else { _mm_srli_si128(halves[j / 2], 8) };
        let wide = match widen {
            Widen::Unsigned => _mm256_cvtepu8_epi32(eight),
            Widen::Signed => _mm256_cvtepi8_epi32(eight),
        };
        let mut v = _mm256_mul_ps(_mm256_cvtepi32_ps(wide), _mm256_permutevar8x32_ps(scale, spread));
        if let Some(min) = min {
            v = _mm256_add_ps(v, _mm256_permutevar8x32_ps(min, spread));
        }
        let row = lane * dst.cols + col;
        _mm_storeu_ps(out[row..][..4].as_mut_ptr(), _mm256_castps256_ps128(v));
        if lane + 1 < dst.valid {
            _mm_storeu_ps(out[row + dst.cols..][..4].as_mut_ptr(), _mm256_extractf128_ps(v, 1));
        }
    }
}
