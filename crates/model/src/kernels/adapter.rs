//! The LoRA adapters' two thin products, on matrices held as bf16.
//!
//! Decode with many adapters is bound by the bytes of A and B every step reads (16 streams on 16
//! r8 adapters of SmolLM2 read 16 x 9.8 MB of f32 a step, more than the base's 85 MB), so served
//! adapters are kept in bf16, half the bytes, and widened to f32 as they are read: the widening
//! is exact, so the products are those of f32 kernels on the rounded values. The trainer's forward
//! rounds its f32 adapter the same way ([`Bf16::round_all`]) and calls these same kernels, which
//! is what keeps its logprobs the sampler's to the bit.

use super::cpu::cpu;
use super::dot_tile;

/// A bf16 number held as its bits: an f32's upper half.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Rounded to nearest, ties to even; NaN stays NaN (`half`'s conversion).
    pub fn from_f32(x: f32) -> Self {
        Bf16(half::bf16::from_f32(x).to_bits())
    }

    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }

    pub fn round_all(xs: &[f32]) -> Vec<Bf16> {
        xs.iter().map(|&x| Bf16::from_f32(x)).collect()
    }
}

/// An element the adapter kernels read: f32 as is (the trainer's exact path) or bf16 widened.
/// Sealed: the kernels' bit-equality arguments hold for these two only.
pub trait Widen: Copy + Send + Sync + sealed::Sealed {
    fn widen(self) -> f32;

    /// The slice as bf16, when it is (for the kernels written for that layout).
    fn as_bf16(m: &[Self]) -> Option<&[Bf16]>;

    /// The slice as f32, when it is.
    fn as_f32(m: &[Self]) -> Option<&[f32]>;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }

    fn as_bf16(_: &[f32]) -> Option<&[Bf16]> {
        None
    }

    fn as_f32(m: &[f32]) -> Option<&[f32]> {
        Some(m)
    }
}

impl Widen for Bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }

    fn as_bf16(m: &[Bf16]) -> Option<&[Bf16]> {
        Some(m)
    }

    fn as_f32(_: &[Bf16]) -> Option<&[f32]> {
        None
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::Bf16 {}
}

/// `out[t * rank + r] = dot(a_r, x_t)` for every row `x_t` of `xs` (rows of `a`'s width) and
/// every row `a_r` of `a` (`rank` of them), each entry [`super::dot`]'s order on the widened
/// values (eight lanes along the row, a tail, the lanes summed in one fixed order) with each
/// multiply-add fused, rounded once (since session 54: the separate multiply and add held these
/// products to ~27 GMAC/s a thread, fused ~38), computed in tiles of two rows by four ranks: a
/// lone dot waits on its one chain, a tile keeps eight chains in flight and loads each operand
/// once for several products. (The adapters' first product, `as_served::lora_down`, which the server runs over a
/// group of rows on one adapter and the trainer over its rows.)
pub fn dots<W: Widen>(a: &[W], rank: usize, xs: &[f32], out: &mut [f32]) {
    let n = a.len() / rank.max(1);
    assert!(a.len() == rank * n && n > 0 && xs.len().is_multiple_of(n) && out.len() == xs.len() / n * rank);
    // bf16 has its own AVX2 kernel: the generic tiles widened it an element at a time.
    match (cpu().avx2, W::as_bf16(a)) {
        (Some(avx2), Some(a)) => super::adapter_avx2::dots_bf16(avx2, a, rank, xs, out),
        (Some(avx2), None) => super::simd::dots(avx2, a, rank, xs, out),
        (None, _) => dots_generic(a, rank, xs, out),
    }
}

#[inline(always)]
pub(crate) fn dots_generic<W: Widen>(a: &[W], rank: usize, xs: &[f32], out: &mut [f32]) {
    let n = a.len() / rank;
    let x = |t: usize| &xs[t * n..(t + 1) * n];
    let w = |r: usize| &a[r * n..(r + 1) * n];
    for (t, r, two, four) in tiles(xs.len() / n, rank) {
        match (two, four) {
            (true, true) => {
                put(out, rank, t, r, dot_tile::<2, 4, W, true>([x(t), x(t + 1)], [w(r), w(r + 1), w(r + 2), w(r + 3)]))
            }
            (false, true) => {
                put(out, rank, t, r, dot_tile::<1, 4, W, true>([x(t)], [w(r), w(r + 1), w(r + 2), w(r + 3)]))
            }
            (true, false) => put(out, rank, t, r, dot_tile::<2, 1, W, true>([x(t), x(t + 1)], [w(r)])),
            (false, false) => put(out, rank, t, r, dot_tile::<1, 1, W, true>([x(t)], [w(r)])),
        }
    }
}

/// The tiles the dots kernels compute, `(first row, first rank, two rows?, four ranks?)`: two rows
/// by four ranks where that many remain, then what is left over. The shape changes only how many
/// chains run at once, never an entry.
#[inline(always)]
pub(crate) fn tiles(rows: usize, rank: usize) -> impl Iterator<Item = (usize, usize, bool, bool)> {
    let (rows2, rank4) = (rows / 2 * 2, rank / 4 * 4);
    let row_starts = (0..rows2).step_by(2).map(|t| (t, true)).chain((rows2..rows).map(|t| (t, false)));
    row_starts.flat_map(move |(t, two)| {
        let rank_starts = (0..rank4).step_by(4).map(|r| (r, true)).chain((rank4..rank).map(|r| (r, false)));
        rank_starts.map(move |(r, four)| (t, r, two, four))
    })
}

/// Writes a tile of dots (rows `t..t+R`, ranks `r..r+C`) into `out` (`rank` values a row).
#[inline(always)]
pub(crate) fn put<const R: usize, const C: usize>(out: &mut [f32], rank: usize, t: usize, r: usize, v: [[f32; C]; R]) {
    for (i, row) in v.iter().enumerate() {
        out[(t + i) * rank + r..(t + i) * rank + r + C].copy_from_slice(row);
    }
}

/// Outputs a tile of B holds: [`add_ranks`] keeps a row's tile in two 256-bit registers across
/// all the ranks.
pub const UP_COLS: usize = 16;

/// B `(out, rank)`, row-major as PEFT stores it, in the layout [`add_ranks`] reads: tiles of
/// [`UP_COLS`] outputs, each `(rank, UP_COLS)` row-major (the last one `(rank, out % UP_COLS)`),
/// so that a tile's ranks are one contiguous read (B transposed whole made eight interleaved
/// streams, one a rank, and the adapter pass waited on them).
pub fn b_tiles<T: Copy>(b: &[T], rank: usize) -> Vec<T> {
    let out = b.len() / rank.max(1);
    let mut tiles = Vec::with_capacity(b.len());
    for c in (0..out).step_by(UP_COLS) {
        let w = UP_COLS.min(out - c);
        for r in 0..rank {
            tiles.extend((c..c + w).map(|o| b[o * rank + r]));
        }
    }
    tiles
}

/// `outs[i][o] += sum_r ax[i * rank + r] * B[o][r]` for each row `i`, B given as [`b_tiles`]:
/// every output element takes its ranks in order, each a fused multiply-add rounded once
/// (`o = fma(ax_r, b_r, o)`), whatever the number of rows. The adapters' second product
/// (`as_served::lora_up`).
pub fn add_ranks<W: Widen>(ax: &[f32], b: &[W], outs: &mut [&mut [f32]]) {
    let rank = ax.len() / outs.len().max(1);
    let n = outs.first().map_or(0, |o| o.len());
    assert!(ax.len() == outs.len() * rank && rank > 0 && b.len() == rank * n && outs.iter().all(|o| o.len() == n));
    #[cfg(target_arch = "x86_64")]
    if let Some(avx2) = cpu().avx2 {
        match (W::as_bf16(b), W::as_f32(b)) {
            (Some(b), _) => return super::adapter_avx2::add_ranks(avx2, ax, b, outs),
            (_, Some(b)) => return super::adapter_avx2::add_ranks(avx2, ax, b, outs),
            _ => {}
        }
    }
    add_ranks_generic(ax, b, outs)
}

/// Each row's tile of [`UP_COLS`] outputs stays in registers across all the ranks, so an output is
/// loaded and stored once rather than once a rank (the loop is written for that; rustc keeps it
/// on the stack, which is why AVX2 has its own `block`).
#[inline(always)]
pub(crate) fn add_ranks_generic<W: Widen>(ax: &[f32], b: &[W], outs: &mut [&mut [f32]]) {
    let rank = ax.len() / outs.len();
    let n = outs[0].len();
    for_rank_blocks(outs.len(), n / UP_COLS, &mut GenericBlocks { ax, rank, b, outs });
    add_rest(ax, b, outs);
}

/// A kernel for the blocks of [`add_ranks`], called by [`for_rank_blocks`].
pub(crate) trait RankBlocks {
    /// Before the blocks of the strip of tiles `c0..end`.
    #[inline(always)]
    fn strip(&mut self, _c0: usize, _end: usize) {}

    /// Adds their ranks to rows `t..t+TR` by tiles `c..c+TC`: every output takes its ranks in
    /// order, `o = fma(ax_r, b_r, o)`.
    ///
    /// # Safety
    /// Rows `t..t+TR` and tiles `c..c+TC` exist (the bounds given to [`for_rank_blocks`]).
    unsafe fn block<const TR: usize, const TC: usize>(&mut self, t: usize, c: usize);
}

/// The one walk every `add_ranks` kernel takes over `rows` rows by `tiles` whole tiles of B. Rows
/// and tiles go in blocks of eight registers' worth (four rows of one tile, two rows of two tiles,
/// or one row of four tiles): an output's multiply-adds form one chain, one a rank, so a lone
/// tile would wait on their latency at every rank; eight independent chains keep the units busy.
/// B is taken in strips of four tiles (64 outputs, a few KB) across all the rows, each strip read
/// from memory once and from L1 for the further blocks of rows. The blocking changes which
/// outputs are computed together, never an output's own operations.
#[inline(always)]
pub(crate) fn for_rank_blocks<K: RankBlocks>(rows: usize, tiles: usize, k: &mut K) {
    for c0 in (0..tiles).step_by(4) {
        let end = tiles.min(c0 + 4);
        k.strip(c0, end);
        let mut t = 0;
        while t < rows {
            let tr = match rows - t {
                4.. => 4,
                2 | 3 => 2,
                _ => 1,
            };
            let mut c = c0;
            while c < end {
                let tc = match (tr, end - c) {
                    (4, _) | (2, 1) | (1, 1) => 1,
                    (2, _) | (1, 2 | 3) => 2,
                    _ => 4,
                };
                // SAFETY: t + tr <= rows and c + tc <= end <= tiles, as `block` requires.
                unsafe {
                    match (tr, tc) {
                        (4, _) => k.block::<4, 1>(t, c),
                        (2, 2) => k.block::<2, 2>(t, c),
                        (2, _) => k.block::<2, 1>(t, c),
                        (_, 4) => k.block::<1, 4>(t, c),
                        (_, 2) => k.block::<1, 2>(t, c),
                        _ => k.block::<1, 1>(t, c),
                    }
                }
                c += tc;
            }
            t += tr;
        }
    }
}

/// The outputs past B's last whole tile, held as one `(rank, out % UP_COLS)` tile: each row's
/// ranks in order, as every kernel's blocks add them.
#[inline(always)]
pub(crate) fn add_rest<W: Widen>(ax: &[f32], b: &[W], outs: &mut [&mut [f32]]) {
    let rank = ax.len() / outs.len();
    let whole = outs[0].len() / UP_COLS * UP_COLS;
    let w = outs[0].len() - whole;
    if w == 0 {
        return;
    }
    for (out, ax) in outs.iter_mut().zip(ax.chunks_exact(rank)) {
        for (a, b) in ax.iter().zip(b[whole * rank..].chunks_exact(w)) {
            for (o, b) in out[whole..].iter_mut().zip(b) {
                *o = a.mul_add(b.widen(), *o);
            }
        }
    }
}

/// The portable blocks: tiles in arrays, each widened once per rank for all the block's rows.
struct GenericBlocks<'a, 'o, W> {
    ax: &'a [f32],
    rank: usize,
    b: &'a [W],
    outs: &'a mut [&'o mut [f32]],
}

impl<W: Widen> RankBlocks for GenericBlocks<'_, '_, W> {
    #[inline(always)]
    unsafe fn block<const TR: usize, const TC: usize>(&mut self, t: usize, c: usize) {
        let (ax, rank, b) = (self.ax, self.rank, self.b);
        let span = rank * UP_COLS;
        let tile: [&[W]; TC] = std::array::from_fn(|j| &b[(c + j) * span..(c + j + 1) * span]);
        let mut acc = [[[0f32; UP_COLS]; TC]; TR];
        for (i, acc) in acc.iter_mut().enumerate() {
            for (j, acc) in acc.iter_mut().enumerate() {
                acc.copy_from_slice(&self.outs[t + i][(c + j) * UP_COLS..(c + j + 1) * UP_COLS]);
            }
        }
        for r in 0..rank {
            let mut wide = [[0f32; UP_COLS]; TC];
            for (wide, tile) in wide.iter_mut().zip(&tile) {
                for (w, v) in wide.iter_mut().zip(&tile[r * UP_COLS..(r + 1) * UP_COLS]) {
                    *w = v.widen();
                }
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let a = ax[(t + i) * rank + r];
                for (acc, wide) in acc.iter_mut().zip(&wide) {
                    for l in 0..UP_COLS {
                        acc[l] = a.mul_add(wide[l], acc[l]);
                    }
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            for (j, acc) in acc.iter().enumerate() {
                self.outs[t + i][(c + j) * UP_COLS..(c + j + 1) * UP_COLS].copy_from_slice(acc);
            }
        }
    }
}

/// A dot as the adapter kernels define it, written out for the tests: lane `l` takes positions
/// `8c + l`, each a fused multiply-add, the tail likewise, then the lanes in one fixed order.
#[cfg(test)]
pub(super) fn fused_dot(w: &[f32], x: &[f32]) -> f32 {
    let chunks = w.len() / 8;
    let mut acc = [0f32; 8];
    for c in 0..chunks {
        for (l, acc) in acc.iter_mut().enumerate() {
            *acc = w[c * 8 + l].mul_add(x[c * 8 + l], *acc);
        }
    }
    let s = (chunks * 8..w.len()).fold(0f32, |s, k| w[k].mul_add(x[k], s));
    (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]) + s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_widens_exactly() {
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
        assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
        assert_eq!(Bf16::from_f32(1.0 + 3.0 / 256.0).to_f32(), 1.0 + 1.0 / 64.0);
        // Just above a halfway point rounds up.
        assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0 + 1.0 / 65536.0).to_f32(), 1.0 + 1.0 / 128.0);
        assert_eq!(Bf16::from_f32(-0.375).to_f32(), -0.375);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
        assert_eq!(Bf16::from_f32(f32::INFINITY).to_f32(), f32::INFINITY);
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    #[test]
    fn bf16_kernels_equal_the_f32_ones_on_the_widened_values() {
        // Widths with a tail past the tiles (37 inputs, 43 outputs: two tiles of B and 11), 5
        // rows, rank 6 (a 4-tile and two single ranks).
        let (rank, inp, out, rows) = (6, 37, 43, 5);
        let a16 = Bf16::round_all(&values(rank * inp, 1));
        // B as PEFT stores it, (out, rank), and in the kernel's tiles.
        let b = Bf16::round_all(&values(out * rank, 2));
        let b16 = b_tiles(&b, rank);
        let a32: Vec<f32> = a16.iter().map(|v| v.to_f32()).collect();
        let b32: Vec<f32> = b16.iter().map(|v| v.to_f32()).collect();
        let xs = values(rows * inp, 3);
        let (mut d16, mut d32) = (vec![0f32; rows * rank], vec![0f32; rows * rank]);
        dots(&a16, rank, &xs, &mut d16);
        dots(&a32, rank, &xs, &mut d32);
        assert_eq!(d16, d32);
        // Each entry is the fused dot written out.
        for t in 0..rows {
            for r in 0..rank {
                let want = fused_dot(&a32[r * inp..(r + 1) * inp], &xs[t * inp..(t + 1) * inp]);
                assert_eq!(d32[t * rank + r].to_bits(), want.to_bits());
            }
        }
        let start = values(rows * out, 4);
        let (mut o16, mut o32) = (start.clone(), start.clone());
        add_ranks(&d16, &b16, &mut o16.chunks_exact_mut(out).collect::<Vec<_>>());
        add_ranks(&d32, &b32, &mut o32.chunks_exact_mut(out).collect::<Vec<_>>());
        assert_eq!(o16, o32);
        // Each element is its ranks added in order, one row at a time or all together.
        for (t, row) in o32.chunks_exact(out).enumerate() {
            let mut one = start[t * out..(t + 1) * out].to_vec();
            add_ranks(&d32[t * rank..(t + 1) * rank], &b32, &mut [&mut one[..]]);
            assert_eq!(row, &one[..]);
            for (o, got) in row.iter().enumerate() {
                let mut want = start[t * out + o];
                for r in 0..rank {
                    want = d32[t * rank + r].mul_add(b[o * rank + r].to_f32(), want);
                }
                assert_eq!(got.to_bits(), want.to_bits());
            }
        }
        // Every block shape (four rows of a tile, two of two, one of four, and what is left),
        // against each output's ranks added in order.
        for (rows, out) in [(1, 64), (1, 48), (2, 80), (3, 40), (4, 16), (7, 100), (8, 70)] {
            let b = Bf16::round_all(&values(out * rank, 5));
            let tiled = b_tiles(&b, rank);
            let ax = values(rows * rank, 6);
            let start = values(rows * out, 7);
            let mut got = start.clone();
            add_ranks(&ax, &tiled, &mut got.chunks_exact_mut(out).collect::<Vec<_>>());
            let mut generic = start.clone();
            add_ranks_generic(&ax, &tiled, &mut generic.chunks_exact_mut(out).collect::<Vec<_>>());
            for t in 0..rows {
                for o in 0..out {
                    let mut want = start[t * out + o];
                    for r in 0..rank {
                        want = ax[t * rank + r].mul_add(b[o * rank + r].to_f32(), want);
                    }
                    assert_eq!(got[t * out + o].to_bits(), want.to_bits(), "{rows} rows of {out}: ({t}, {o})");
                    assert_eq!(generic[t * out + o].to_bits(), want.to_bits(), "{rows} rows of {out}: ({t}, {o})");
                }
            }
        }
        // And the generic path, whatever this CPU selects.
        let mut generic = start.clone();
        add_ranks_generic(&d16, &b16, &mut generic.chunks_exact_mut(out).collect::<Vec<_>>());
        assert_eq!(generic, o16);
        let mut dg = vec![0f32; rows * rank];
        dots_generic(&a16, rank, &xs, &mut dg);
        assert_eq!(dg, d16);
    }
}
