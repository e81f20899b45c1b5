//! The block formats (`blocks`) against candle's own quantiser and dequantiser: candle writes
//! the blocks and reads them back to f32, independently of our unpacking, and every tier's
//! matmul must equal the plain product of those f32 weights with the int8 activations.

use super::blocks::{BlockFormat, BlockMatrix};
use super::*;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

const FORMATS: [BlockFormat; 6] =
    [BlockFormat::Q4_0, BlockFormat::Q5_0, BlockFormat::Q5_1, BlockFormat::Q4K, BlockFormat::Q5K, BlockFormat::Q6K];

/// Deterministic weights with a spread of magnitudes per row (so that sub-block scales differ).
fn weights(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..rows * cols)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            u * (1.0 + ((i / 16) % 5) as f32)
        })
        .collect()
}

/// The matrix in `format` as candle quantises it, and candle's dequantisation of it.
fn quantised(format: BlockFormat, rows: usize, cols: usize, seed: u64) -> (BlockMatrix, Vec<f32>) {
    let t = Tensor::from_vec(weights(rows, cols, seed), (rows, cols), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, format.dtype()).unwrap();
    let raw = q.data().unwrap().into_owned();
    let back = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    (BlockMatrix::from_raw(format, raw, rows, cols).unwrap(), back)
}

/// The matrix as each kernel sees it: as loaded (lane-packed on AVX2 and VNNI CPUs, read by
/// those tiers' lane kernels; on other CPUs the rows as the file has them), and row-major only
/// (the row tiles of every tier). Where the packed copy exists the scalar tier needs the rows.
fn variants(m: &BlockMatrix, tier: Tier) -> Vec<(&'static str, BlockMatrix)> {
    let mut v = vec![("row-major", m.clone().without_lanes())];
    if lane_tier(tier) || !has_avx2() {
        v.push(("loaded", m.clone().lanes_only()));
    }
    v
}

/// Whether `tier` has a lane kernel (AVX2 and VNNI).
fn lane_tier(tier: Tier) -> bool {
    !matches!(tier, Tier::Scalar)
}

/// Every (tier, variant) pair this CPU runs.
fn combos(m: &BlockMatrix) -> Vec<(Tier, &'static str, BlockMatrix)> {
    Tier::available().into_iter().flat_map(|t| variants(m, t).into_iter().map(move |(k, v)| (t, k, v))).collect()
}

fn cols_for(format: BlockFormat) -> usize {
    if format.unit_values() == 256 {
        512
    } else {
        320 // five units of two blocks: not a multiple of 256, like Gemma 3's 640
    }
}

#[test]
fn unpacking_equals_candles_dequantisation() {
    for format in FORMATS {
        let (rows, cols) = (5, cols_for(format));
        let (m, reference) = quantised(format, rows, cols, 1);
        assert_eq!(m.clone().without_lanes().bytes(), rows * cols / format.unit_values() * format.unit_bytes());
        let mut row = vec![0f32; cols];
        for (r, (_, _, m)) in (0..rows).flat_map(|r| combos(&m).into_iter().map(move |v| (r, v))) {
            m.dequantize_row(r, &mut row);
            for (i, (ours, theirs)) in row.iter().zip(&reference[r * cols..(r + 1) * cols]).enumerate() {
                // Same products, at most one rounding apart (`d*q + (-8d)` against `(q - 8)*d`).
                assert!(
                    (ours - theirs).abs() <= 1e-6 * theirs.abs().max(1.0),
                    "{format:?} row {r} value {i}: {ours} vs {theirs}"
                );
            }
        }
    }
}

#[test]
fn every_tier_equals_the_dequantised_product_and_batches_exactly() {
    // 37 rows (the tiles' one-row tail), 13 activation rows (tiles of 8, 4 and 1; on AVX2 the
    // tiles after a group's first read the unpacked bytes it kept, where a row alone unpacks).
    let (rows, t_rows) = (37, 13);
    for format in FORMATS {
        let cols = cols_for(format);
        let (m, w) = quantised(format, rows, cols, 2);
        let x = weights(t_rows, cols, 3);
        let mut a = Q8Acts::default();
        a.quantize(&x, t_rows, cols);
        // The plain product of candle's f32 weights and the activations as quantised, in f64.
        let mut exact = vec![0f64; t_rows * rows];
        let mut bound = vec![0f64; t_rows * rows];
        for t in 0..t_rows {
            let (aq, s) = a.row(t);
            for n in 0..rows {
                for k in 0..cols {
                    let term = w[n * cols + k] as f64 * aq[k] as f64 * s[k / QK] as f64;
                    exact[t * rows + n] += term;
                    bound[t * rows + n] += term.abs();
                }
            }
        }
        let mut first: Option<Vec<f32>> = None;
        for (tier, kind, m) in combos(&m) {
            let m = &m;
            let mut out = vec![0f32; t_rows * rows];
            matmul_blocks(m, &a, &mut out, tier);
            for (i, (got, want)) in out.iter().zip(&exact).enumerate() {
                let err = (*got as f64 - want).abs();
                assert!(err <= 1e-5 * bound[i] + 1e-6, "{format:?} {tier:?} {kind} output {i}: {got} vs {want}");
            }
            // Each row alone gives the same bits as in the batch.
            for t in [0, 5, 12] {
                let mut one = Q8Acts::default();
                one.quantize(&x[t * cols..(t + 1) * cols], 1, cols);
                let mut single = vec![0f32; rows];
                matmul_blocks(m, &one, &mut single, tier);
                assert_eq!(&out[t * rows..(t + 1) * rows], &single[..], "{format:?} {tier:?} {kind} row {t}");
            }
            // The tiers sum in other orders: close, not equal.
            if let Some(first) = &first {
                for (i, (x, y)) in out.iter().zip(first).enumerate() {
                    assert!(
                        ((x - y) as f64).abs() <= 1e-5 * bound[i] + 1e-6,
                        "{format:?} {tier:?} {kind} vs scalar at {i}"
                    );
                }
            } else {
                first = Some(out);
            }
        }
    }
}

#[test]
fn extreme_blocks_stay_exact() {
    // Largest magnitudes the formats hold: every value at the top of its range, so the unsigned
    // values reach 15, 31 or 63 and AVX2's pairwise i16 sums their largest (63 * 127 * 2).
    for format in FORMATS {
        let cols = cols_for(format);
        let mut data = vec![1000f32; cols];
        for (i, v) in data.iter_mut().enumerate() {
            if i % 3 == 0 {
                *v = -1000.0;
            }
        }
        let t = Tensor::from_vec(data.clone(), (1, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, format.dtype()).unwrap();
        let w = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let m = BlockMatrix::from_raw(format, q.data().unwrap().into_owned(), 1, cols).unwrap();
        let x: Vec<f32> = (0..cols).map(|i| if i % 2 == 0 { 127.0 } else { -127.0 }).collect();
        let mut a = Q8Acts::default();
        a.quantize(&x, 1, cols);
        let (aq, s) = a.row(0);
        let want: f64 = (0..cols).map(|k| w[k] as f64 * aq[k] as f64 * s[k / QK] as f64).sum();
        let bound: f64 = (0..cols).map(|k| (w[k] as f64 * aq[k] as f64 * s[k / QK] as f64).abs()).sum();
        for (tier, _, m) in combos(&m) {
            let mut out = [0f32];
            matmul_blocks(&m, &a, &mut out, tier);
            assert!((out[0] as f64 - want).abs() <= 1e-5 * bound, "{format:?} {tier:?}: {} vs {want}", out[0]);
        }
    }
}

#[test]
fn shapes_that_are_not_whole_units_are_refused() {
    assert!(BlockMatrix::from_raw(BlockFormat::Q4K, vec![0; 144], 1, 256).is_some());
    assert!(BlockMatrix::from_raw(BlockFormat::Q4K, vec![0; 143], 1, 256).is_none());
    assert!(BlockMatrix::from_raw(BlockFormat::Q4K, vec![0; 72], 1, 128).is_none());
    // One legacy block is half a unit.
    assert!(BlockMatrix::from_raw(BlockFormat::Q5_0, vec![0; 22], 1, 32).is_none());
    assert!(BlockMatrix::from_raw(BlockFormat::Q5_0, vec![0; 44], 1, 64).is_some());
    assert_eq!(BlockFormat::of(GgmlDType::Q6K), Some(BlockFormat::Q6K));
    assert_eq!(BlockFormat::of(GgmlDType::Q8_0), None);
}

#[test]
fn stacked_blocks_compute_each_part() {
    let cols = 256;
    let (a1, _) = quantised(BlockFormat::Q6K, 3, cols, 7);
    let (a2, _) = quantised(BlockFormat::Q6K, 4, cols, 8);
    let stacked = Weights::vstack(vec![Weights::Block(a1.clone()), Weights::Block(a2.clone())]);
    assert!(matches!(&stacked, Weights::Block(b) if b.rows() == 7));
    let (mut r1, mut r2, mut all) = (vec![0f32; cols], vec![0f32; cols], vec![0f32; cols]);
    a1.dequantize_row(2, &mut r1);
    stacked.dequantize_row(2, &mut all);
    assert_eq!(r1, all);
    a2.dequantize_row(0, &mut r2);
    stacked.dequantize_row(3, &mut all);
    assert_eq!(r2, all);
    // Mixed formats fall back to int8.
    let (b, _) = quantised(BlockFormat::Q4K, 2, cols, 9);
    assert!(matches!(Weights::vstack(vec![Weights::Block(a1), Weights::Block(b)]), Weights::Q8(_)));
}

#[test]
fn f32_weights_use_the_float_activations_and_batch_exactly() {
    let (rows, cols, t_rows) = (19, 96, 6);
    let w = weights(rows, cols, 11);
    let x = weights(t_rows, cols, 12);
    let m = Weights::F32(F32Matrix::new(w.clone(), rows, cols));
    assert!(m.needs_f32_acts());
    let mut a = Q8Acts::default();
    a.keep_f32 = true;
    a.quantize(&x, t_rows, cols);
    let mut out = vec![0f32; t_rows * rows];
    matmul(&m, &a, &mut out);
    for t in 0..t_rows {
        for n in 0..rows {
            let want: f64 = (0..cols).map(|k| w[n * cols + k] as f64 * x[t * cols + k] as f64).sum();
            assert!((out[t * rows + n] as f64 - want).abs() < 1e-4, "({t}, {n})");
        }
        let mut one = Q8Acts::default();
        one.keep_f32 = true;
        one.quantize(&x[t * cols..(t + 1) * cols], 1, cols);
        let mut single = vec![0f32; rows];
        matmul(&m, &one, &mut single);
        assert_eq!(&out[t * rows..(t + 1) * rows], &single[..]);
    }
    // Without the float copy the product is refused, not computed from stale values.
    let mut plain = Q8Acts::default();
    plain.quantize(&x, t_rows, cols);
    assert!(plain.values().is_none());
    assert!(std::panic::catch_unwind(|| matmul(&m, &plain, &mut vec![0f32; t_rows * rows])).is_err());
}

#[test]
fn q8_0_blocks_are_taken_as_they_are() {
    let (rows, cols) = (17, 96);
    let t = Tensor::from_vec(weights(rows, cols, 21), (rows, cols), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
    let mut raw = q.data().unwrap().into_owned();
    let back = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let m = Q8Matrix::from_q8_0_bytes(raw.clone(), rows, cols).unwrap();
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        m.dequantize_row(r, &mut row);
        assert_eq!(&row[..], &back[r * cols..(r + 1) * cols], "row {r}");
    }
    assert!(Q8Matrix::from_q8_0_bytes(raw[1..].to_vec(), rows, cols).is_none());
    // A -128 in a file is read as -127, the kernels' range.
    raw[2] = 0x80;
    let m = Q8Matrix::from_q8_0_bytes(raw.clone(), rows, cols).unwrap();
    m.dequantize_row(0, &mut row);
    let d = half::f16::from_le_bytes([raw[0], raw[1]]).to_f32();
    assert_eq!(row[0], -127.0 * d);
}

/// The K-quants' lane kernel with activations per 256 values (`Q8Acts::k_quants`): the plain
/// product of candle's f32 weights and those activations, each row alone bit for bit as in the
/// batch, and the formats' extreme values without overflow.
#[test]
fn k_quants_with_activations_per_super_block() {
    for tier in Tier::available().into_iter().filter(|t| lane_tier(*t)) {
        k_quants_on(tier);
    }
}

fn k_quants_on(tier: Tier) {
    let (rows, t_rows, cols) = (37, 13, 768);
    for format in [BlockFormat::Q4K, BlockFormat::Q5K, BlockFormat::Q6K] {
        let (m, w) = quantised(format, rows, cols, 4);
        let m = m.lanes_only();
        let mut x = weights(t_rows, cols, 5);
        // One row of extremes: every activation at +-127 of its scale.
        for (i, v) in x[..cols].iter_mut().enumerate() {
            *v = if i % 3 == 0 { -9.0 } else { 9.0 };
        }
        let mut a = Q8Acts::default();
        a.k_quants = true;
        a.quantize(&x, t_rows, cols);
        let k = a.k().expect("per-256 activations");
        let mut out = vec![0f32; t_rows * rows];
        matmul_blocks(&m, &a, &mut out, tier);
        for t in 0..t_rows {
            let (kq, kd) = k.row(t);
            for n in 0..rows {
                let terms = (0..cols).map(|c| w[n * cols + c] as f64 * kq[c] as f64 * kd[c / 256] as f64);
                let (want, bound) = terms.fold((0f64, 0f64), |(s, b), v| (s + v, b + v.abs()));
                let got = out[t * rows + n] as f64;
                assert!((got - want).abs() <= 1e-5 * bound + 1e-6, "{format:?} {tier:?} ({t}, {n}): {got} vs {want}");
            }
            let mut one = Q8Acts::default();
            one.k_quants = true;
            one.quantize(&x[t * cols..(t + 1) * cols], 1, cols);
            let mut single = vec![0f32; rows];
            matmul_blocks(&m, &one, &mut single, tier);
            assert_eq!(&out[t * rows..(t + 1) * rows], &single[..], "{format:?} {tier:?} row {t}");
        }
    }
    // Weights at the top of their range against activations at +-127: the largest integer sums.
    for format in [BlockFormat::Q4K, BlockFormat::Q5K, BlockFormat::Q6K] {
        let cols = 512;
        let data: Vec<f32> = (0..cols).map(|i| if i % 3 == 0 { -1000.0 } else { 1000.0 }).collect();
        let t = Tensor::from_vec(data, (1, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, format.dtype()).unwrap();
        let w = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let m = BlockMatrix::from_raw(format, q.data().unwrap().into_owned(), 1, cols).unwrap().lanes_only();
        let x: Vec<f32> = w.iter().map(|v| 127.0 * v.signum()).collect();
        let mut a = Q8Acts::default();
        a.k_quants = true;
        a.quantize(&x, 1, cols);
        let (kq, kd) = a.k().unwrap().row(0);
        let terms = (0..cols).map(|c| w[c] as f64 * kq[c] as f64 * kd[c / 256] as f64);
        let (want, bound) = terms.fold((0f64, 0f64), |(s, b), v| (s + v, b + v.abs()));
        let mut out = [0f32];
        matmul_blocks(&m, &a, &mut out, tier);
        assert!((out[0] as f64 - want).abs() <= 1e-5 * bound, "{format:?} {tier:?}: {} vs {want}", out[0]);
    }
}

/// The AVX2 lane kernel sums the same integers as the VNNI one and runs its float epilogue
/// instruction for instruction: on a CPU with both, equal bits, with activations per 32 values
/// and (K-quants) per 256. The AVX-VNNI tile (Intel since Alder Lake) too, where the CPU has it.
#[test]
fn avx2_lanes_equal_vnni_lanes_bit_for_bit() {
    let tiers: Vec<Tier> = Tier::available().into_iter().filter(|t| lane_tier(*t)).collect();
    let Some((&avx2, others)) = tiers.split_first().filter(|(_, o)| !o.is_empty()) else {
        eprintln!("SKIPPED: fewer than two lane tiers on this CPU");
        return;
    };
    // 45 rows: two whole groups and a third of 13 (the stores' partial halves); 13 activation
    // rows: tiles of 4 and a tail of 1, which read the groups' kept unpacked bytes (`UNPACK`).
    let (rows, t_rows) = (45, 13);
    for format in FORMATS {
        let cols = 2 * cols_for(format);
        let m = quantised(format, rows, cols, 6).0.lanes_only();
        let x = weights(t_rows, cols, 7);
        for k_quants in [false, true] {
            let mut a = Q8Acts::default();
            a.k_quants = k_quants;
            a.quantize(&x, t_rows, cols);
            let mut one = vec![0f32; t_rows * rows];
            matmul_blocks(&m, &a, &mut one, avx2);
            for &other in others {
                let mut two = vec![0f32; t_rows * rows];
                matmul_blocks(&m, &a, &mut two, other);
                assert_eq!(one, two, "{format:?} k_quants {k_quants}: {avx2:?} against {other:?}");
            }
        }
    }
}

/// A lane-packed group read back at once equals its rows read one by one, every format, the last
/// group partly padding (what the transposed copies of `dy W` read).
#[cfg(target_arch = "x86_64")]
#[test]
fn a_packed_group_read_at_once_equals_its_rows() {
    for format in FORMATS {
        let (rows, cols) = (21, cols_for(format));
        let (m, _) = quantised(format, rows, cols, 4);
        let Some(lanes) = m.lanes.as_deref() else {
            eprintln!("SKIPPED: no lane-packed copy on this CPU");
            return;
        };
        for g in 0..rows.div_ceil(16) {
            // What the CPU reads it with (AVX2 where present), and value by value.
            let (mut group, mut scalar) = (vec![f32::NAN; 16 * cols], vec![f32::NAN; 16 * cols]);
            lanes.dequantize_group(g, &mut group);
            lanes.dequantize_group_scalar(g, &mut scalar);
            for (lane, (got, one_by_one)) in
                group.chunks_exact(cols).zip(scalar.chunks_exact(cols)).enumerate().take(rows - g * 16)
            {
                let mut want = vec![0f32; cols];
                m.dequantize_row(g * 16 + lane, &mut want);
                assert_eq!(got, &want[..], "{format:?} group {g} lane {lane}");
                assert_eq!(one_by_one, &want[..], "{format:?} group {g} lane {lane}, value by value");
            }
            // Rows past the matrix are left as they were.
            let valid = (rows - g * 16).min(16);
            assert!(group[valid * cols..].iter().all(|v| v.is_nan()), "{format:?} group {g}: padding rows written");
        }
    }
}
