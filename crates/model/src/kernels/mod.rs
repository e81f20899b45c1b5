//! CPU kernels of the inference forward pass, on plain slices.
//!
//! The hot operation is [`matmul_q8`]: int8 weights (Q8_0-style blocks of 32 with one f32 scale)
//! times int8-quantized activations. For a batch of T rows it loads each weight block once and
//! uses it for every row, so batched decode costs little more memory traffic than one stream;
//! that is what candle's quantized matmul does not do (its cost per token stays flat with batch
//! size). Each (row, output) value is computed by the same instruction sequence whatever T is,
//! so batched results equal unbatched ones bit for bit.
//!
//! x86-64 takes the AVX-512 VNNI or AVX2+FMA path, chosen at run time from the features
//! detected once (`cpu`, whose tokens every `unsafe` SIMD function requires); anything else the
//! scalar path. All are tested against each other.
#![allow(unsafe_code)] // SIMD intrinsics: each needs a feature token, and its lengths are asserted

use crate::arch::Activation;

pub mod adapter;
#[cfg(target_arch = "x86_64")]
mod adapter_avx2;

mod attend;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod blocks;
#[cfg(target_arch = "x86_64")]
mod blocks_lanes;
#[cfg(target_arch = "x86_64")]
mod blocks_lanes_avx2;
#[cfg(target_arch = "x86_64")]
mod blocks_simd;
#[cfg(target_arch = "x86_64")]
mod blocks_tile;
#[cfg(target_arch = "x86_64")]
mod blocks_tile_avx2;
pub mod causal;
pub mod cpu;
mod dense;
#[cfg(target_arch = "x86_64")]
mod lanes;
#[cfg(target_arch = "x86_64")]
mod lanes_avx2;
pub mod peak;
mod q4;
mod q8;
mod q8k;
#[cfg(target_arch = "x86_64")]
mod quantize_avx2;
pub mod sgemm;
mod simd;
pub mod team;
mod through;

pub use adapter::{add_ranks, dots, Bf16, Widen};
pub use attend::{attend, attend_group, HeadKv, KEY_TILE, MAX_GROUP};
pub use blocks::{matmul_blocks, BlockFormat, BlockMatrix, Tier};
use cpu::{cpu, Avx2Fma, SharedOut};
pub use dense::F32Matrix;
pub use q4::Q4Matrix;
pub use q8::{Q8Acts, Q8Matrix, QK};
pub use q8k::KActs;
pub use through::{matmul_through, Transposed};

/// A weight matrix in one of the kernels' formats.
#[derive(Debug, Clone)]
pub enum Weights {
    Q8(Q8Matrix),
    /// GGUF Q4_1 as stored (decode reads half the bytes).
    Q4(Q4Matrix),
    /// The K-quants and Q4_0/Q5_0/Q5_1 as stored (`blocks`).
    Block(BlockMatrix),
    /// Plain f32 (`--quantize none`); needs the activations' f32 copy (`Q8Acts::keep_f32`).
    F32(F32Matrix),
}

impl Weights {
    pub fn rows(&self) -> usize {
        match self {
            Weights::Q8(w) => w.rows(),
            Weights::Q4(w) => w.rows(),
            Weights::Block(w) => w.rows(),
            Weights::F32(w) => w.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Weights::Q8(w) => w.cols(),
            Weights::Q4(w) => w.cols(),
            Weights::Block(w) => w.cols(),
            Weights::F32(w) => w.cols(),
        }
    }

    pub fn bytes(&self) -> usize {
        match self {
            Weights::Q8(w) => w.bytes(),
            Weights::Q4(w) => w.bytes(),
            Weights::Block(w) => w.bytes(),
            Weights::F32(w) => w.bytes(),
        }
    }

    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        match self {
            Weights::Q8(w) => w.dequantize_row(r, out),
            Weights::Q4(w) => w.dequantize_row(r, out),
            Weights::Block(w) => w.dequantize_row(r, out),
            Weights::F32(w) => w.dequantize_row(r, out),
        }
    }

    /// Keeps only the lane-packed copy where there is one (see [`Q4Matrix::lanes_only`]).
    pub fn lanes_only(self) -> Weights {
        match self {
            Weights::Q8(w) => Weights::Q8(w.lanes_only()),
            Weights::Q4(w) => Weights::Q4(w.lanes_only()),
            Weights::Block(w) => Weights::Block(w.lanes_only()),
            w @ Weights::F32(_) => w,
        }
    }

    /// Stacks matrices vertically (fused q/k/v, gate/up); mixed formats become int8.
    pub fn vstack(parts: Vec<Weights>) -> Weights {
        // After `stackable` the parts share one format: the first part's.
        let parts = Weights::stackable(parts);
        match parts.first() {
            Some(Weights::Block(_)) => {
                let blocks: Vec<BlockMatrix> =
                    parts.into_iter().filter_map(|p| if let Weights::Block(w) = p { Some(w) } else { None }).collect();
                Weights::Block(BlockMatrix::vstack(&blocks))
            }
            Some(Weights::F32(_)) => {
                let dense: Vec<F32Matrix> =
                    parts.into_iter().filter_map(|p| if let Weights::F32(w) = p { Some(w) } else { None }).collect();
                Weights::F32(F32Matrix::vstack(&dense))
            }
            Some(Weights::Q4(_)) => {
                let q4: Vec<Q4Matrix> =
                    parts.into_iter().filter_map(|p| if let Weights::Q4(w) = p { Some(w) } else { None }).collect();
                Weights::Q4(Q4Matrix::vstack(&q4))
            }
            _ => {
                let q8: Vec<Q8Matrix> = parts.into_iter().map(|p| p.into_q8()).collect();
                Weights::Q8(Q8Matrix::vstack(&q8))
            }
        }
    }

    /// The parts in the formats [`Weights::vstack`] stacks them in: as they are when they share
    /// one (a block format, Q4_1 or f32), else each converted to int8. The trainer keeps q, k, v
    /// (and gate, up) apart but in these formats, so that its products are the server's.
    pub fn stackable(parts: Vec<Weights>) -> Vec<Weights> {
        let same = match parts.first() {
            Some(Weights::Block(first)) => {
                parts.iter().all(|p| matches!(p, Weights::Block(b) if b.format() == first.format()))
            }
            Some(Weights::F32(_)) => parts.iter().all(|p| matches!(p, Weights::F32(_))),
            Some(Weights::Q4(_)) => parts.iter().all(|p| matches!(p, Weights::Q4(_))),
            _ => false,
        };
        if same {
            parts
        } else {
            parts.into_iter().map(|p| Weights::Q8(p.into_q8())).collect()
        }
    }

    fn into_q8(self) -> Q8Matrix {
        match self {
            Weights::Q8(w) => w,
            w => {
                let mut data = vec![0f32; w.rows() * w.cols()];
                for (r, row) in data.chunks_exact_mut(w.cols()).enumerate() {
                    w.dequantize_row(r, row);
                }
                Q8Matrix::from_f32(&data, w.rows(), w.cols())
            }
        }
    }
}

impl Weights {
    /// Whether multiplying needs the activations' f32 copy (`Q8Acts::keep_f32`).
    pub fn needs_f32_acts(&self) -> bool {
        matches!(self, Weights::F32(_))
    }

    /// Whether multiplying is faster with the activations also quantised per 256 values
    /// (`Q8Acts::k_quants`): K-quant weights lane-packed for the VNNI kernel.
    pub fn wants_k_acts(&self) -> bool {
        matches!(self, Weights::Block(b) if b.lanes.is_some()
            && matches!(b.format(), BlockFormat::Q4K | BlockFormat::Q5K | BlockFormat::Q6K))
    }
}

/// `out[t, n] = sum_k w[n, k] * a[t, k]` for any weight format. `out` is row-major (T, N).
pub fn matmul(w: &Weights, a: &Q8Acts, out: &mut [f32]) {
    match w {
        Weights::Q8(w) => matmul_q8(w, a, out),
        Weights::Q4(w) => matmul_q4(w, a, out),
        Weights::Block(w) => matmul_blocks(w, a, out, Tier::best()),
        Weights::F32(w) => dense::matmul_f32(w, a, out),
    }
}

/// The Q4_1 matmul: same tiling as [`matmul_q8`]; AVX-512 VNNI where the CPU has it.
pub fn matmul_q4(w: &Q4Matrix, a: &Q8Acts, out: &mut [f32]) {
    let (n_out, t_rows) = (w.rows(), a.rows());
    assert_eq!(w.cols(), a.cols(), "inner dimensions differ");
    assert_eq!(out.len(), n_out * t_rows);
    #[cfg(target_arch = "x86_64")]
    if let (Some(packed), Some(vnni)) = (w.lanes.as_deref(), cpu().vnni) {
        return lanes::matmul(vnni, packed, a, out);
    }
    #[cfg(target_arch = "x86_64")]
    if let (Some(packed), Some(avx2)) = (w.lanes.as_deref(), cpu().avx2) {
        return lanes_avx2::matmul(avx2, cpu().avxvnni, packed, a, out);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(vnni) = cpu().vnni.filter(|_| (w.cols() / QK).is_multiple_of(2)) {
        return tiled(n_out, t_rows, out, |cols| tiles_of(cols, Q4Tile(vnni, w, a)));
    }
    if let Some(avx2) = cpu().avx2 {
        return q4::matmul_avx2(avx2, w, a, out);
    }
    tiled(n_out, t_rows, out, |cols| {
        for n in cols.n0..cols.n1 {
            for t in 0..t_rows {
                let (aq, as_) = a.row(t);
                cols.put(n, t, [[dot_q4_row(w, n, aq, as_, a.sums(t), None)]]);
            }
        }
    });
}

/// Rows `n0..n1` of a matmul with an AVX-512 tile kernel, in tiles of two weight rows by eight
/// activation rows (then four, then one; odd weight rows one at a time), each entry through the
/// same arithmetic whatever the tile. Two by eight measured no slower than four by four and keeps
/// the accumulators in registers (four by four spilled). `call::<R, C>(n, t)` computes weight
/// rows `n..n+R` times activation rows `t..t+C`.
#[inline(always)]
fn tiles_of(cols: Cols, call: impl TileCall) {
    let (n1, t_rows) = (cols.n1, cols.t_rows);
    let mut n = cols.n0;
    while n < n1 {
        let two = n + 2 <= n1;
        let mut t = 0;
        while t < t_rows {
            let c = if t + 8 <= t_rows {
                8
            } else if t + 4 <= t_rows {
                4
            } else {
                1
            };
            match (two, c) {
                (true, 8) => cols.put(n, t, call.call::<2, 8>(n, t)),
                (true, 4) => cols.put(n, t, call.call::<2, 4>(n, t)),
                (true, _) => cols.put(n, t, call.call::<2, 1>(n, t)),
                (false, 8) => cols.put(n, t, call.call::<1, 8>(n, t)),
                (false, 4) => cols.put(n, t, call.call::<1, 4>(n, t)),
                (false, _) => cols.put(n, t, call.call::<1, 1>(n, t)),
            }
            t += c;
        }
        n += if two { 2 } else { 1 };
    }
}

/// A tile kernel with its operands bound (closures cannot be generic over the tile shape).
trait TileCall {
    fn call<const R: usize, const C: usize>(&self, n: usize, t: usize) -> [[f32; C]; R];
}

/// The Q4_1 tile kernel; only built with the VNNI token, after the even block count was checked.
#[cfg(target_arch = "x86_64")]
struct Q4Tile<'a>(cpu::Avx512Vnni, &'a Q4Matrix, &'a Q8Acts);

#[cfg(target_arch = "x86_64")]
impl TileCall for Q4Tile<'_> {
    #[inline(always)]
    fn call<const R: usize, const C: usize>(&self, n: usize, t: usize) -> [[f32; C]; R] {
        let (vnni, w, a) = (self.0, self.1, self.2);
        assert!(n + R <= w.rows() && t + C <= a.rows() && w.cols() == a.cols() && (w.cols() / QK).is_multiple_of(2));
        // SAFETY: the token proves AVX-512 F/BW/VNNI; the block count is even and the R weight
        // rows and C activation rows exist (asserted above).
        unsafe { avx512::q4_tile::<R, C>(vnni, w.rows_from(n), a.rows_from(t), w.cols() / QK) }
    }
}

/// The int8 tile kernel; only built with the VNNI token, after the even block count was checked.
#[cfg(target_arch = "x86_64")]
struct Q8Tile<'a>(cpu::Avx512Vnni, &'a Q8Matrix, &'a Q8Acts);

#[cfg(target_arch = "x86_64")]
impl TileCall for Q8Tile<'_> {
    #[inline(always)]
    fn call<const R: usize, const C: usize>(&self, n: usize, t: usize) -> [[f32; C]; R] {
        let (vnni, w, a) = (self.0, self.1, self.2);
        assert!(n + R <= w.rows() && t + C <= a.rows() && w.cols() == a.cols() && (w.cols() / QK).is_multiple_of(2));
        // SAFETY: as for Q4Tile.
        unsafe { avx512::q8_tile::<R, C>(vnni, w.rows_from(n), a.rows_from(t), w.cols() / QK) }
    }
}

#[inline]
fn dot_q4_row(w: &Q4Matrix, n: usize, aq: &[i8], as_: &[f32], sums: &[i32], avx2: Option<Avx2Fma>) -> f32 {
    match avx2 {
        Some(avx2) => q4::dot_row_avx2(avx2, w, n, aq, as_, sums),
        None => {
            let (q, d, m) = w.row(n);
            q4::dot_q4_scalar(q, d, m, aq, as_, sums)
        }
    }
}

/// Splits the N weight rows into chunks, one parallel task each; `fill(cols)` computes the output
/// columns `cols.n0..cols.n1` (weight rows) for every activation row, writing them straight into
/// the (T, N) output.
fn tiled(n_out: usize, t_rows: usize, out: &mut [f32], fill: impl Fn(Cols) + Sync) {
    assert_eq!(out.len(), n_out * t_rows);
    let chunk = chunk_rows(n_out, t_rows);
    let shared = SharedOut::new(out);
    team::for_each(n_out.div_ceil(chunk), |c| {
        let (n0, n1) = (c * chunk, ((c + 1) * chunk).min(n_out));
        fill(Cols { out: &shared, n_out, t_rows, n0, n1, _borrow: std::marker::PhantomData });
    });
}

/// One task's columns `n0..n1` of the (T, N) output: every write is checked to lie in them, so
/// the tasks of one [`tiled`] call, sharing its output pointer, never write the same element.
struct Cols<'a> {
    out: &'a SharedOut,
    n_out: usize,
    t_rows: usize,
    n0: usize,
    n1: usize,
    _borrow: std::marker::PhantomData<&'a mut [f32]>,
}

impl Cols<'_> {
    /// Writes `v[r][c]` to output row `t + c`, column `n + r`.
    #[inline(always)]
    fn put<const R: usize, const C: usize>(&self, n: usize, t: usize, v: [[f32; C]; R]) {
        assert!(n >= self.n0 && n + R <= self.n1 && t + C <= self.t_rows);
        for (r, row) in v.iter().enumerate() {
            for (c, x) in row.iter().enumerate() {
                // SAFETY: in bounds and inside this task's columns (asserted above).
                unsafe { *self.out.ptr().add((t + c) * self.n_out + n + r) = *x };
            }
        }
    }
}

/// True when the AVX2 kernels can run on this CPU.
pub fn has_avx2() -> bool {
    cpu().avx2.is_some()
}

/// True when the AVX-512F kernels (attention) can run on this CPU.
pub fn has_avx512f() -> bool {
    cpu().avx512f.is_some()
}

/// True when the AVX-512 VNNI kernels can run on this CPU.
pub fn has_avx512_vnni() -> bool {
    cpu().vnni.is_some()
}

/// `out[t, n] = sum_k w[n, k] * a[t, k]` for quantized weights and activations.
/// `out` is row-major (T, N).
pub fn matmul_q8(w: &Q8Matrix, a: &Q8Acts, out: &mut [f32]) {
    let (n_out, t_rows) = (w.rows(), a.rows());
    assert_eq!(w.cols(), a.cols(), "inner dimensions differ");
    assert_eq!(out.len(), n_out * t_rows);
    #[cfg(target_arch = "x86_64")]
    if let (Some(packed), Some(vnni)) = (w.lanes.as_deref(), cpu().vnni) {
        return lanes::matmul(vnni, packed, a, out);
    }
    #[cfg(target_arch = "x86_64")]
    if let (Some(packed), Some(avx2)) = (w.lanes.as_deref(), cpu().avx2) {
        return lanes_avx2::matmul(avx2, cpu().avxvnni, packed, a, out);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(vnni) = cpu().vnni.filter(|_| (w.cols() / QK).is_multiple_of(2)) {
        return tiled(n_out, t_rows, out, |cols| tiles_of(cols, Q8Tile(vnni, w, a)));
    }
    let avx2 = cpu().avx2;
    tiled(n_out, t_rows, out, |cols| {
        let n1 = cols.n1;
        let mut n = cols.n0;
        // Four weight rows at a time where possible (same per-row arithmetic as one at a time).
        if let Some(avx2) = avx2 {
            while n + 4 <= n1 {
                let rows = [w.row(n), w.row(n + 1), w.row(n + 2), w.row(n + 3)];
                for t in 0..t_rows {
                    let (aq, as_) = a.row(t);
                    let d = simd::dot_q8x4(
                        avx2,
                        [rows[0].0, rows[1].0, rows[2].0, rows[3].0],
                        [rows[0].1, rows[1].1, rows[2].1, rows[3].1],
                        aq,
                        as_,
                    );
                    cols.put(n, t, d.map(|x| [x]));
                }
                n += 4;
            }
        }
        for n in n..n1 {
            for t in 0..t_rows {
                cols.put(n, t, [[dot_row(w, n, a, t, avx2)]]);
            }
        }
    });
}

/// Rows per task: enough work per task to amortise the hand-off, enough tasks to balance 2+ cores.
fn chunk_rows(n_out: usize, t_rows: usize) -> usize {
    let threads = team::threads();
    let by_balance = n_out.div_ceil(threads * 4);
    let by_work = (16_384 / t_rows.max(1)).max(8);
    by_balance.min(by_work).max(1)
}

#[inline]
fn dot_row(w: &Q8Matrix, n: usize, a: &Q8Acts, t: usize, avx2: Option<Avx2Fma>) -> f32 {
    let (wq, ws) = w.row(n);
    let (aq, as_) = a.row(t);
    match avx2 {
        Some(avx2) => simd::dot_q8(avx2, wq, ws, aq, as_),
        None => q8::dot_q8_scalar(wq, ws, aq, as_),
    }
}

/// `sum(a[i] * b[i])` in f32, vectorised where the CPU allows.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    match cpu().avx2 {
        Some(avx2) => simd::dot_f32(avx2, a, b),
        None => dot_generic(a, b),
    }
}

/// Eight independent accumulators, so the compiler can vectorise without reassociating.
#[inline(always)]
pub(crate) fn dot_generic(a: &[f32], b: &[f32]) -> f32 {
    dot_tile::<1, 1, f32, false>([a], [b])[0][0]
}

/// The dots of `R` rows by `C` rows, each as [`dot_generic`] computes one: eight lanes of
/// multiply-then-add along the rows, a sequential tail, then the lanes summed in one fixed order;
/// the multiply and the add rounded apart, or with `FUSED` once, as a fused multiply-add (the
/// adapters' products). The tile shape changes only how many chains run at once, never an entry.
#[inline(always)]
pub(crate) fn dot_tile<const R: usize, const C: usize, W: Widen, const FUSED: bool>(
    xs: [&[f32]; R],
    ws: [&[W]; C],
) -> [[f32; C]; R] {
    let madd = |w: f32, x: f32, acc: f32| if FUSED { w.mul_add(x, acc) } else { acc + w * x };
    let n = xs[0].len();
    let chunks = n / 8;
    let mut acc = [[[0f32; 8]; C]; R];
    for c in 0..chunks {
        let xv: [&[f32; 8]; R] = std::array::from_fn(|i| xs[i][c * 8..c * 8 + 8].try_into().unwrap());
        let wv: [&[W; 8]; C] = std::array::from_fn(|j| ws[j][c * 8..c * 8 + 8].try_into().unwrap());
        for i in 0..R {
            for j in 0..C {
                for l in 0..8 {
                    acc[i][j][l] = madd(wv[j][l].widen(), xv[i][l], acc[i][j][l]);
                }
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for i in 0..R {
        for j in 0..C {
            let mut s = 0f32;
            for k in chunks * 8..n {
                s = madd(ws[j][k].widen(), xs[i][k], s);
            }
            let a = &acc[i][j];
            out[i][j] = (a[0] + a[4]) + (a[1] + a[5]) + (a[2] + a[6]) + (a[3] + a[7]) + s;
        }
    }
    out
}

/// `e^x` for x <= 0 (softmax arguments), relative error below 2e-6 over [-20, 0], without a libm call so that
/// loops over it vectorise: `2^(x log2 e)` split into an integer power (set in the exponent bits)
/// and a fraction in [-0.5, 0.5] (a degree-6 polynomial). The integer is `t` rounded to nearest
/// by adding and removing 1.5 * 2^23 (plain adds: `floor` is a libm call in code built without
/// SSE4.1, ~2% of a training step).
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    let t = (x * std::f32::consts::LOG2_E).max(-126.0);
    let k = (t + ROUND) - ROUND;
    let f = t - k;
    let p = 1.0
        + f * (std::f32::consts::LN_2
            + f * (0.240_226_5
                + f * (0.055_504_11 + f * (0.009_618_129 + f * (0.001_333_355_8 + f * 0.000_154_035_3)))));
    let scale = f32::from_bits(((k as i32 + 127) as u32) << 23);
    p * scale
}

/// Softmax of `scale * row` in place (scale > 0); returns (max of `scale * row`, the sum of the
/// exponentials before normalising, and `sum_j e_j * scale * row_j`), from which callers take
/// the log-sum-exp (`max + ln sum`) and the entropy (`lse - weighted / sum`). Sixteen partial
/// sums, so the loops vectorise; AVX-512 where the CPU has it (this crate is built for baseline
/// x86-64, where the same loops get 4-wide SSE).
pub fn exp_normalize(row: &mut [f32], scale: f32) -> (f32, f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if let Some(avx512) = cpu().avx512f {
        // SAFETY: the token proves AVX-512F; the body is safe code on any slice.
        return unsafe { exp_normalize_avx512(avx512, row, scale) };
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(avx2) = cpu().avx2 {
        // SAFETY: the token proves AVX2 and FMA; the body is safe code on any slice.
        return unsafe { exp_normalize_avx2(avx2, row, scale) };
    }
    exp_normalize_body(row, scale)
}

/// [`exp_normalize_body`] compiled with AVX2 and FMA enabled so that it vectorises to 256 bits.
///
/// # Safety
/// None beyond the target features, which the token proves.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_normalize_avx2(_: Avx2Fma, row: &mut [f32], scale: f32) -> (f32, f32, f32) {
    exp_normalize_body(row, scale)
}

/// [`exp_normalize_body`] compiled with AVX-512F enabled so that it vectorises to 512 bits.
///
/// # Safety
/// None beyond the target feature, which the token proves.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn exp_normalize_avx512(_: cpu::Avx512F, row: &mut [f32], scale: f32) -> (f32, f32, f32) {
    exp_normalize_body(row, scale)
}

#[inline(always)]
fn exp_normalize_body(row: &mut [f32], scale: f32) -> (f32, f32, f32) {
    const L: usize = 16;
    let split = row.len() / L * L;
    let mut m = [f32::NEG_INFINITY; L];
    for chunk in row[..split].chunks_exact(L) {
        for l in 0..L {
            m[l] = m[l].max(chunk[l]);
        }
    }
    let max = row[split..].iter().chain(&m).fold(f32::NEG_INFINITY, |a, &b| a.max(b)) * scale;
    let (mut s, mut w) = ([0f32; L], [0f32; L]);
    for chunk in row[..split].chunks_exact_mut(L) {
        for l in 0..L {
            let z = chunk[l] * scale;
            let e = exp_approx(z - max);
            chunk[l] = e;
            s[l] += e;
            w[l] += e * z;
        }
    }
    let (mut sum, mut weighted) = (s.iter().sum::<f32>(), w.iter().sum::<f32>());
    for x in &mut row[split..] {
        let z = *x * scale;
        let e = exp_approx(z - max);
        *x = e;
        sum += e;
        weighted += e * z;
    }
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|x| *x *= inv);
    (max, sum, weighted)
}

/// `y += alpha * x`.
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// RMS-normalises `x` in place and multiplies by `weight`.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    let mean_sq = dot(x, x) / x.len() as f32;
    let inv = 1.0 / (mean_sq + eps).sqrt();
    for (xi, wi) in x.iter_mut().zip(weight) {
        *xi *= inv * wi;
    }
}

/// Softmax in place over `x`.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `gate <- silu(gate) * up`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    act_mul(Activation::Silu, gate, up)
}

/// `gate <- gelu_tanh(gate) * up` (Gemma's GeGLU).
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    act_mul(Activation::GeluTanh, gate, up)
}

/// `gate <- act(gate) * up`. Both activations are `x * sigmoid(z)`: SiLU with `z = x`, GELU's tanh
/// form with `z = 2 sqrt(2/pi) (x + 0.044715 x^3)` (as `(1 + tanh(u)) / 2 = sigmoid(2u)`). The
/// sigmoid is taken from `e = exp(-|z|)` (an argument <= 0, what [`exp_approx`] covers) as
/// `1 / (1 + e)` or `e / (1 + e)`, so the loop has no libm call and vectorises (a libm `expf` per
/// element cost ~10% of prefill).
pub fn act_mul(act: Activation, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    match cpu().avx2 {
        Some(avx2) => simd::act_mul(avx2, act, gate, up),
        None => act_mul_generic(act, gate, up),
    }
}

/// `sqrt(2 / pi)`, GELU's tanh-form constant.
pub const GELU_C: f32 = 0.797_884_6;

/// The sigmoid argument of `act` at `x` (see [`act_mul`]), clamped so that a huge or infinite
/// input cannot make it NaN.
#[inline(always)]
pub fn act_z(act: Activation, x: f32) -> f32 {
    match act {
        Activation::Silu => x,
        Activation::GeluTanh => (2.0 * GELU_C * (x + 0.044_715 * x * x * x)).clamp(-200.0, 200.0),
    }
}

#[inline(always)]
pub(crate) fn act_mul_generic(act: Activation, gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        let z = act_z(act, *g);
        let e = exp_approx(-z.abs());
        let sigmoid = if z >= 0.0 { 1.0 } else { e } / (1.0 + e);
        *g = *g * sigmoid * u;
    }
}

/// Rotates adjacent pairs `(x[2i], x[2i+1])` of every head by the angle whose cosine and sine are
/// `cos[i]`, `sin[i]` (GGUF's Llama layout: llama.cpp's converter permutes q/k rows so that the
/// rotated pairs are adjacent).
pub fn rope_inplace(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..head_dim / 2 {
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = a * cos[i] - b * sin[i];
            head[2 * i + 1] = a * sin[i] + b * cos[i];
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod blocks_tests;
