use super::*;

/// A deterministic pseudo-random sequence (no RNG crate needed for fixtures).
pub(super) fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2654435761).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

#[test]
fn q8_matmul_matches_f32_within_quantisation_error() {
    let (n, k, t) = (37, 96, 5);
    let w = values(n * k, 1);
    let x = values(t * k, 2);
    let wq = Q8Matrix::from_f32(&w, n, k);
    let mut a = Q8Acts::default();
    a.quantize(&x, t, k);
    let mut out = vec![0f32; t * n];
    matmul_q8(&wq, &a, &mut out);
    for ti in 0..t {
        for ni in 0..n {
            let exact: f32 = (0..k).map(|i| w[ni * k + i] * x[ti * k + i]).sum();
            let got = out[ti * n + ni];
            assert!((got - exact).abs() < 0.05, "({ti},{ni}): {got} vs {exact}");
        }
    }
}

#[test]
fn batched_rows_equal_single_rows_exactly() {
    let (n, k, t) = (64, 128, 7);
    let wq = Q8Matrix::from_f32(&values(n * k, 3), n, k);
    let x = values(t * k, 4);
    let mut all = Q8Acts::default();
    all.quantize(&x, t, k);
    let mut batched = vec![0f32; t * n];
    matmul_q8(&wq, &all, &mut batched);
    for ti in 0..t {
        let mut one = Q8Acts::default();
        one.quantize(&x[ti * k..(ti + 1) * k], 1, k);
        let mut single = vec![0f32; n];
        matmul_q8(&wq, &one, &mut single);
        assert_eq!(&batched[ti * n..(ti + 1) * n], &single[..], "row {ti}");
    }
}

#[test]
fn simd_and_scalar_paths_agree() {
    let k = 576;
    let wq = Q8Matrix::from_f32(&values(k, 5), 1, k);
    let mut a = Q8Acts::default();
    a.quantize(&values(k, 6), 1, k);
    let (w_q, w_s) = wq.row(0);
    let (a_q, a_s) = a.row(0);
    let scalar = q8::dot_q8_scalar(w_q, w_s, a_q, a_s);
    let dispatched = dot_row(&wq, 0, &a, 0, cpu().avx2);
    assert!((scalar - dispatched).abs() <= 1e-4 * scalar.abs().max(1.0), "{scalar} vs {dispatched}");
    let (x, y) = (values(100, 7), values(100, 8));
    let plain: f32 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
    assert!((dot(&x, &y) - plain).abs() < 1e-4);
}

#[test]
fn tiled_dots_are_each_fused_dot_to_the_bit() {
    // Widths with and without a tail, ranks and rows that leave partial tiles.
    for (n, rank, rows) in [(576, 8, 5), (37, 3, 1), (1536, 16, 2), (8, 5, 3), (100, 1, 4)] {
        let (a, xs) = (values(n * rank, n as u32), values(n * rows, rank as u32 + 7));
        let mut out = vec![0f32; rows * rank];
        dots(&a, rank, &xs, &mut out);
        let mut generic = vec![0f32; rows * rank];
        adapter::dots_generic(&a, rank, &xs, &mut generic);
        // The same on bf16 weights (their own AVX2 kernel) against the fused dot of the widened values.
        let a16 = Bf16::round_all(&a);
        let wide: Vec<f32> = a16.iter().map(|v| v.to_f32()).collect();
        let mut out16 = vec![0f32; rows * rank];
        dots(&a16, rank, &xs, &mut out16);
        let mut generic16 = vec![0f32; rows * rank];
        adapter::dots_generic(&a16, rank, &xs, &mut generic16);
        for t in 0..rows {
            for r in 0..rank {
                let one = adapter::fused_dot(&a[r * n..(r + 1) * n], &xs[t * n..(t + 1) * n]);
                assert_eq!(out[t * rank + r].to_bits(), one.to_bits(), "n {n}, rank {r}, row {t}");
                assert_eq!(generic[t * rank + r].to_bits(), one.to_bits(), "generic: n {n}, rank {r}, row {t}");
                let one16 = adapter::fused_dot(&wide[r * n..(r + 1) * n], &xs[t * n..(t + 1) * n]);
                assert_eq!(out16[t * rank + r].to_bits(), one16.to_bits(), "bf16: n {n}, rank {r}, row {t}");
                assert_eq!(
                    generic16[t * rank + r].to_bits(),
                    one16.to_bits(),
                    "bf16 generic: n {n}, rank {r}, row {t}"
                );
            }
        }
    }
}

#[test]
fn quantisation_round_trip_and_extremes() {
    let mut row = vec![0f32; 32];
    row[0] = -1.27;
    row[1] = 1.27;
    row[2] = 0.5;
    let q = Q8Matrix::from_f32(&row, 1, 32);
    let (quants, scales) = q.row(0);
    assert_eq!((quants[0], quants[1]), (-127, 127));
    assert!((scales[0] - 0.01).abs() < 1e-7);
    let mut back = vec![0f32; 32];
    q.dequantize_row(0, &mut back);
    assert!((back[2] - 0.5).abs() <= 0.005);
    let zero = Q8Matrix::from_f32(&[0f32; 32], 1, 32);
    assert_eq!(zero.row(0).1[0], 0.0);
}

#[test]
fn norm_softmax_silu_rope_by_hand() {
    // rms of [3, 4] = sqrt(12.5); weights [1, 2]
    let mut x = vec![3.0, 4.0];
    rms_norm(&mut x, &[1.0, 2.0], 0.0);
    let r = 12.5f32.sqrt();
    assert!((x[0] - 3.0 / r).abs() < 1e-6 && (x[1] - 8.0 / r).abs() < 1e-6);

    let mut s = vec![0.0, (2.0f32).ln()];
    softmax(&mut s);
    assert!((s[0] - 1.0 / 3.0).abs() < 1e-6 && (s[1] - 2.0 / 3.0).abs() < 1e-6);

    let mut g = vec![0.0, 1.0];
    silu_mul(&mut g, &[5.0, 2.0]);
    assert_eq!(g[0], 0.0);
    assert!((g[1] - 2.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);

    // GELU's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) times up, by f64 libm;
    // the dispatched path (AVX2 where present) and the scalar one, also at huge and infinite
    // inputs, where it must be 0 or x * up, never NaN.
    let xs = [-6.0f32, -2.5, -1.0, -0.1, 0.0, 0.3, 1.0, 2.0, 7.5, -1e30, 1e30, 3.0, -3.0, 0.5, -0.5, 4.0, 9.0];
    let up = vec![2.0f32; xs.len()];
    let mut fast = xs.to_vec();
    gelu_mul(&mut fast, &up);
    let mut plain = xs.to_vec();
    act_mul_generic(crate::arch::Activation::GeluTanh, &mut plain, &up);
    for ((x, f), p) in xs.iter().zip(&fast).zip(&plain) {
        let x64 = *x as f64;
        let want = if x64.abs() > 1e10 {
            x64.max(0.0) * 2.0
        } else {
            0.5 * x64 * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x64 + 0.044715 * x64.powi(3))).tanh()) * 2.0
        };
        let tol = 1e-5 * want.abs().max(1.0);
        assert!((*f as f64 - want).abs() <= tol && (*p as f64 - want).abs() <= tol, "gelu({x}): {f} {p} vs {want}");
    }

    // A quarter turn maps (1, 0) to (0, 1) and (0, 1) to (-1, 0).
    let mut h = vec![1.0, 0.0, 0.0, 1.0];
    rope_inplace(&mut h, 2, &[0.0], &[1.0]);
    assert_eq!(h, vec![0.0, 1.0, -1.0, 0.0]);
}

#[test]
fn four_row_path_equals_row_by_row_exactly() {
    // 9 groups of four rows and one left over; an odd block count and no lane-packed copy keep
    // this on the AVX2 path.
    let (n, k, t) = (37, 96, 3);
    let wq = Q8Matrix::from_f32(&values(n * k, 9), n, k).without_lanes();
    let mut a = Q8Acts::default();
    a.quantize(&values(t * k, 10), t, k);
    let mut out = vec![0f32; t * n];
    matmul_q8(&wq, &a, &mut out);
    for ti in 0..t {
        for ni in 0..n {
            assert_eq!(out[ti * n + ni], dot_row(&wq, ni, &a, ti, cpu().avx2), "({ti},{ni})");
        }
    }
}

#[test]
fn attention_matches_softmax_by_hand() {
    // Two positions, head_dim 2: keys (0, 0) and (ln 3, 0) in one transposed tile, values in rows of
    // stride 4 (another head's values interleaved and ignored).
    let q = [1.0, 0.0];
    // The cache stores f16: ln 3 rounds to 1.0986328 (weights 0.249996 and 0.750004).
    use half::f16;
    let mut keys = vec![f16::from_f32(9.0); 2 * KEY_TILE];
    (keys[0], keys[1]) = (f16::ZERO, f16::from_f32((3.0f32).ln()));
    (keys[KEY_TILE], keys[KEY_TILE + 1]) = (f16::ZERO, f16::ZERO);
    let values = [1.0, 2.0, 9.0, 9.0, 5.0, 6.0, 9.0, 9.0].map(f16::from_f32);
    let mut scores = vec![0f32; KEY_TILE];
    let mut out = vec![0f32; 2];
    let kv =
        HeadKv { keys: [&[], &keys], tile_stride: 2 * KEY_TILE, values: [&[], &values], stride: 4, shared_tiles: 0 };
    attend(&q, kv, 0..2, 1.0, &mut scores, &mut out);
    // weights 1/4 and 3/4
    assert!((out[0] - 4.0).abs() < 1e-4 && (out[1] - 5.0).abs() < 1e-4, "{out:?}");
}

/// The dispatched attention (AVX-512 where present) against a plain row-major computation, for
/// head dimensions 64, 128 and 256 (Gemma 3), context lengths around tile boundaries, and sliding
/// windows starting inside, at and past the shared segment, through a real cache.
#[test]
fn attention_kernel_matches_plain_softmax_attention() {
    for hd in [64, 128, 256] {
        let (n_kv, layer) = (2, 0);
        let kv_dim = n_kv * hd;
        let mut cache = crate::KvCache::new(1, kv_dim);
        let n = 41;
        let (ks, vs) = (values(n * kv_dim, 21), values(n * kv_dim, 22));
        for p in 0..n {
            cache.write(layer, p, &ks[p * kv_dim..(p + 1) * kv_dim], &vs[p * kv_dim..(p + 1) * kv_dim]);
        }
        cache.commit(n);
        let q = values(hd, 23);
        // Private, then with the first two tiles in a shared segment (copy-on-write forks).
        let private = cache.clone();
        cache.freeze();
        assert_eq!(cache.shared_len(), 32);
        let cases = [1usize, 15, 16, 17, 32, 33, 41]
            .into_iter()
            .flat_map(|n| [0, 1, 5, 16, 17, 33, 40].into_iter().filter(move |f| *f < n).map(move |f| (f, n)));
        for (cache, (first, n_ctx)) in [&private, &cache].into_iter().flat_map(|c| cases.clone().map(move |r| (c, r))) {
            let head = 1;
            let mut scores = vec![0f32; n_ctx.next_multiple_of(KEY_TILE)];
            let mut out = vec![0f32; hd];
            attend(&q, cache.head(layer, head, hd), first..n_ctx, 0.125, &mut scores, &mut out);
            let mut plain_out = vec![0f32; hd];
            attend::attend_generic(&q, cache.head(layer, head, hd), first..n_ctx, 0.125, &mut scores, &mut plain_out);
            // The cache holds f16: the reference reads the same rounded keys and values.
            let r = |x: f32| half::f16::from_f32(x).to_f64();
            let mut s: Vec<f64> = (first..n_ctx)
                .map(|p| (0..hd).map(|d| q[d] as f64 * r(ks[p * kv_dim + head * hd + d])).sum::<f64>() * 0.125)
                .collect();
            let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            s.iter_mut().for_each(|x| *x = (*x - max).exp());
            let sum: f64 = s.iter().sum();
            for d in 0..hd {
                let want: f64 = (first..n_ctx).map(|p| s[p - first] / sum * r(vs[p * kv_dim + head * hd + d])).sum();
                assert!((out[d] as f64 - want).abs() < 1e-5, "hd {hd} n_ctx {n_ctx} d {d}: {} vs {want}", out[d]);
                assert!((plain_out[d] as f64 - want).abs() < 1e-5, "generic, hd {hd} n_ctx {n_ctx} d {d}");
            }
        }
    }
}

/// The grouped kernel (the query heads of one kv head at once) against the one-head kernel, for
/// 1 to MAX_GROUP heads, head dimensions 64, 128 and 256, private and shared segments, and
/// windows.
#[test]
fn grouped_attention_matches_one_head_at_a_time() {
    use super::{attend_group, MAX_GROUP};
    for hd in [64, 128, 256] {
        let kv_dim = 2 * hd;
        let mut cache = crate::KvCache::new(1, kv_dim);
        let n = 53;
        let (ks, vs) = (values(n * kv_dim, 31), values(n * kv_dim, 32));
        for p in 0..n {
            cache.write(0, p, &ks[p * kv_dim..(p + 1) * kv_dim], &vs[p * kv_dim..(p + 1) * kv_dim]);
        }
        cache.commit(n);
        let private = cache.clone();
        cache.freeze();
        let qs_all = values(MAX_GROUP * hd, 33);
        for c in [&private, &cache] {
            for (first, n_ctx) in [(0usize, 1usize), (0, 16), (0, 17), (3, 33), (16, 48), (40, 53), (0, 53)] {
                for heads in 1..=MAX_GROUP {
                    let qs = &qs_all[..heads * hd];
                    let span = n_ctx.next_multiple_of(KEY_TILE);
                    let mut scores = vec![0f32; heads * span];
                    let mut outs_buf = vec![0f32; heads * hd];
                    attend_group(qs, heads, c.head(0, 1, hd), first..n_ctx, 0.125, &mut scores, &mut outs_buf);
                    for (h, q) in qs.chunks_exact(hd).enumerate() {
                        let mut one = vec![0f32; hd];
                        attend(q, c.head(0, 1, hd), first..n_ctx, 0.125, &mut scores[..span], &mut one);
                        for d in 0..hd {
                            let got = outs_buf[h * hd + d];
                            assert!(
                                (got - one[d]).abs() < 1e-5,
                                "hd {hd} heads {heads} head {h} {first}..{n_ctx} d {d}: {got} vs {}",
                                one[d]
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn exp_approx_is_accurate_over_the_softmax_range() {
    // Near 0 (where softmax weight is) the polynomial dominates the error; far out, the f32
    // rounding of x * log2(e) does, and those weights are negligible anyway.
    let worst = |lo: f32| {
        (0..=100_000)
            .map(|i| lo * i as f32 / 100_000.0)
            .map(|x| ((exp_approx(x) as f64 - (x as f64).exp()) / (x as f64).exp()).abs())
            .fold(0f64, f64::max)
    };
    assert!(worst(-20.0) < 2e-6, "relative error {}", worst(-20.0));
    assert!(worst(-85.0) < 1e-5, "relative error {}", worst(-85.0));
    assert_eq!(exp_approx(0.0), 1.0);
    assert!(exp_approx(-200.0) >= 0.0 && exp_approx(-200.0) < 1e-37);
}

/// A (rows, cols) Q4_1 matrix with pseudo-random nibbles, scales and minimums, as GGUF bytes.
fn q4_bytes(rows: usize, cols: usize, seed: u32) -> Vec<u8> {
    let v = values(rows * cols / QK * 18, seed);
    let mut out = Vec::new();
    for (b, chunk) in v.chunks_exact(18).enumerate() {
        out.extend_from_slice(&half::f16::from_f32(0.01 + chunk[0].abs() * 0.05).to_le_bytes());
        out.extend_from_slice(&half::f16::from_f32(chunk[1] * 0.3).to_le_bytes());
        for j in 0..16 {
            out.push(((b * 7 + j * 13) % 256) as u8 ^ ((chunk[2 + j] * 100.0) as i32 as u8));
        }
    }
    out
}

#[test]
fn q4_matmul_matches_its_dequantised_weights_and_rows_agree() {
    let (n, k, t) = (37, 96, 3);
    let w = Q4Matrix::from_q4_1_bytes(&q4_bytes(n, k, 11), n, k).unwrap().without_lanes();
    let x = values(t * k, 12);
    let mut a = Q8Acts::default();
    a.quantize(&x, t, k);
    let mut out = vec![0f32; t * n];
    matmul(&Weights::Q4(w.clone()), &a, &mut out);
    let mut row = vec![0f32; k];
    for ni in 0..n {
        w.dequantize_row(ni, &mut row);
        for ti in 0..t {
            let exact: f32 = (0..k).map(|i| row[i] * x[ti * k + i]).sum();
            let got = out[ti * n + ni];
            assert!((got - exact).abs() < 0.02 * exact.abs().max(1.0), "({ti},{ni}): {got} vs {exact}");
            // The four-row path equals the one-row path, and the SIMD path the scalar one closely.
            let (aq, as_) = a.row(ti);
            assert_eq!(got, dot_q4_row(&w, ni, aq, as_, a.sums(ti), cpu().avx2));
            let (q, d, m) = w.row(ni);
            let scalar = q4::dot_q4_scalar(q, d, m, aq, as_, a.sums(ti));
            assert!((scalar - got).abs() <= 1e-4 * scalar.abs().max(1.0));
        }
    }
    // Stacking keeps rows intact.
    let both = Weights::vstack(vec![Weights::Q4(w.clone()), Weights::Q4(w.clone())]);
    let mut r2 = vec![0f32; k];
    both.dequantize_row(n + 5, &mut r2);
    w.dequantize_row(5, &mut row);
    assert_eq!(row, r2);
    assert!(Q4Matrix::from_q4_1_bytes(&[0u8; 19], 1, 32).is_none());
}

/// The int8 matmul on the AVX-512 VNNI paths where the CPU has them (lane-packed, any block
/// count; row tiles, even block counts), as the Q4_1 test below: close to the scalar reference,
/// batches equal to rows one at a time exactly.
#[test]
fn q8_vnni_paths_match_scalar_and_batches_equal_rows() {
    for (k, lanes) in [(64, true), (96, true), (576, true), (64, false), (576, false)] {
        let (n, t) = (37, 7);
        let wq = Q8Matrix::from_f32(&values(n * k, 15), n, k);
        let wq = if lanes { wq } else { wq.without_lanes() };
        let x = values(t * k, 16);
        let mut a = Q8Acts::default();
        a.quantize(&x, t, k);
        let mut out = vec![0f32; t * n];
        matmul_q8(&wq, &a, &mut out);
        for ti in 0..t {
            let (aq, as_) = a.row(ti);
            for ni in 0..n {
                let (q, s) = wq.row(ni);
                let scalar = q8::dot_q8_scalar(q, s, aq, as_);
                let got = out[ti * n + ni];
                assert!((scalar - got).abs() <= 1e-4 * scalar.abs().max(1.0), "k {k} ({ti},{ni}): {got} vs {scalar}");
            }
            let mut one = Q8Acts::default();
            one.quantize(&x[ti * k..(ti + 1) * k], 1, k);
            let mut single = vec![0f32; n];
            matmul_q8(&wq, &one, &mut single);
            assert_eq!(&out[ti * n..(ti + 1) * n], &single[..], "k {k} row {ti}");
        }
    }
}

/// The Q4_1 matmul on the AVX-512 VNNI paths where the CPU has them (lane-packed, any block
/// count; row tiles, even block counts): every entry close to the scalar reference, and a batch
/// equal to its rows one at a time bit for bit (37 weight rows and 13 activation rows leave
/// remainders in both tile dimensions, and a padded group of 16 rows; with 13 the tiles after a
/// group's first may read its kept unpacked bytes, `blocks_tile::kept`).
#[test]
fn q4_vnni_paths_match_scalar_and_batches_equal_rows() {
    for (k, lanes) in [(64, true), (96, true), (576, true), (64, false), (576, false)] {
        let (n, t) = (37, 13);
        let w = Q4Matrix::from_q4_1_bytes(&q4_bytes(n, k, 13), n, k).unwrap();
        let w = if lanes { w } else { w.without_lanes() };
        let x = values(t * k, 14);
        let mut a = Q8Acts::default();
        a.quantize(&x, t, k);
        let mut out = vec![0f32; t * n];
        matmul_q4(&w, &a, &mut out);
        for ti in 0..t {
            let (aq, as_) = a.row(ti);
            for ni in 0..n {
                let (q, d, m) = w.row(ni);
                let scalar = q4::dot_q4_scalar(q, d, m, aq, as_, a.sums(ti));
                let got = out[ti * n + ni];
                assert!((scalar - got).abs() <= 1e-4 * scalar.abs().max(1.0), "k {k} ({ti},{ni}): {got} vs {scalar}");
            }
            let mut one = Q8Acts::default();
            one.quantize(&x[ti * k..(ti + 1) * k], 1, k);
            let mut single = vec![0f32; n];
            matmul_q4(&w, &one, &mut single);
            assert_eq!(&out[ti * n..(ti + 1) * n], &single[..], "k {k} row {ti}");
        }
    }
}

/// The AVX-512 and AVX2 activation quantisers equal the scalar one bit for bit (ties, zeros,
/// signs).
#[test]
fn simd_quantisation_equals_scalar() {
    let (t, k) = (5, 96);
    let mut x = values(t * k, 21);
    // A zero block, exact halves after scaling, and a block of one repeated negative value.
    x[32..64].iter_mut().for_each(|v| *v = 0.0);
    for (i, v) in x[64..96].iter_mut().enumerate() {
        *v = if i == 0 { 127.0 } else { (i as f32) - 15.5 };
    }
    x[96..128].iter_mut().for_each(|v| *v = -0.25);
    let mut simd = Q8Acts::default();
    simd.quantize(&x, t, k);
    for r in 0..t {
        let mut q = vec![0i8; k];
        let mut s = vec![0f32; k / QK];
        q8::quantize_into(&x[r * k..(r + 1) * k], &mut q, &mut s);
        assert_eq!(simd.row(r), (&q[..], &s[..]), "row {r}");
        let sums: Vec<i32> = q.chunks_exact(QK).map(|b| b.iter().map(|v| *v as i32).sum()).collect();
        assert_eq!(simd.sums(r), &sums[..]);
        // The AVX2 row where the CPU has it (`quantize` took AVX-512 where present).
        #[cfg(target_arch = "x86_64")]
        if let Some(avx2) = super::cpu::cpu().avx2 {
            let b = k / QK;
            let (mut q2, mut s2, mut sums2) = (vec![0i8; k], vec![0f32; b], vec![0i32; b]);
            let (mut ss, mut ss16) = (vec![0f32; b], vec![0f32; 2 * b]);
            let x = &x[r * k..(r + 1) * k];
            let out = q8::BlockSums { s: &mut s2, sums: &mut sums2, ss: &mut ss, ss16: &mut ss16 };
            super::quantize_avx2::q8_row(avx2, x, &mut q2, out);
            assert_eq!((&q2, &s2, &sums2), (&q, &s, &sums), "row {r}");
            let half =
                |b: usize, h: usize| q[b * QK + 16 * h..b * QK + 16 * h + 16].iter().map(|v| *v as i32).sum::<i32>();
            for b in 0..b {
                assert_eq!(ss[b], sums[b] as f32 * s[b]);
                assert_eq!((ss16[2 * b], ss16[2 * b + 1]), (half(b, 0) as f32 * s[b], half(b, 1) as f32 * s[b]));
            }
        }
    }
}

/// The vectorised softmax against the plain formula, on lengths around the 16-lane split.
#[test]
fn exp_normalize_matches_the_formula() {
    for n in [1, 15, 16, 17, 100] {
        let x = values(n, 30 + n as u32);
        let mut p = x.clone();
        let (max, sum, weighted) = exp_normalize(&mut p, 0.7);
        let m = x.iter().map(|v| v * 0.7).fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = x.iter().map(|v| ((v * 0.7 - m) as f64).exp()).collect();
        let z: f64 = e.iter().sum();
        assert!((max - m).abs() < 1e-6 && ((sum as f64) - z).abs() < 1e-5 * z);
        let w: f64 = e.iter().zip(&x).map(|(e, v)| e * (v * 0.7) as f64).sum();
        assert!(((weighted as f64) - w).abs() < 1e-5 * w.abs().max(1.0));
        for (got, e) in p.iter().zip(&e) {
            assert!(((*got as f64) - e / z).abs() < 1e-6, "n {n}");
        }
    }
}

/// A matrix keeping only its lane-packed copy multiplies and dequantises rows exactly as before.
#[test]
fn lanes_only_matrices_compute_the_same() {
    if !has_avx2() {
        return; // no lane-packed copy is made: nothing to drop
    }
    let (n, k, t) = (37, 96, 5);
    let q4 = Q4Matrix::from_q4_1_bytes(&q4_bytes(n, k, 40), n, k).unwrap();
    let q8 = Q8Matrix::from_f32(&values(n * k, 41), n, k);
    let mut a = Q8Acts::default();
    a.quantize(&values(t * k, 42), t, k);
    for w in [Weights::Q4(q4), Weights::Q8(q8)] {
        let slim = w.clone().lanes_only();
        assert!(slim.bytes() < w.bytes());
        let (mut x, mut y) = (vec![0f32; t * n], vec![0f32; t * n]);
        matmul(&w, &a, &mut x);
        matmul(&slim, &a, &mut y);
        assert_eq!(x, y);
        let (mut r1, mut r2) = (vec![0f32; k], vec![0f32; k]);
        for r in [0, 15, 16, 36] {
            w.dequantize_row(r, &mut r1);
            slim.dequantize_row(r, &mut r2);
            assert_eq!(r1, r2, "row {r}");
        }
    }
}

/// The AVX2 lane kernels (Q4_1 and int8) against their arithmetic written out in scalar code:
/// per lane and activation row, each block's exact integer sum scaled by one fused multiply-add
/// (and Q4_1's minimum's term by another), blocks in order. Bit for bit, on CPUs without VNNI too
/// (where the test below cannot run), for every tile shape: rows 1, 2, 4 and what is left; with
/// AVX-VNNI's products too where the CPU has them.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_lanes_equal_their_epilogue_in_scalar() {
    let Some(avx2) = cpu().avx2 else {
        return;
    };
    let mut products = vec![None];
    match cpu().avxvnni {
        Some(v) => products.push(Some(v)),
        None => eprintln!("SKIPPED for AVX-VNNI: this CPU has none"),
    }
    for (k, t, vnni) in [(64, 1), (96, 2), (576, 4), (96, 7), (576, 11)]
        .into_iter()
        .flat_map(|(k, t)| products.iter().map(move |v| (k, t, *v)))
    {
        let n = 45;
        let q4 = Q4Matrix::from_q4_1_bytes(&q4_bytes(n, k, 46), n, k).unwrap();
        let mut a = Q8Acts::default();
        a.quantize(&values(t * k, 47), t, k);
        let mut got = vec![0f32; t * n];
        lanes_avx2::matmul(avx2, vnni, q4.lanes.as_deref().unwrap(), &a, &mut got);
        for ti in 0..t {
            let (aq, as_) = a.row(ti);
            for ni in 0..n {
                let (q, d, m) = q4.row(ni);
                let mut acc = 0f32;
                for b in 0..k / QK {
                    let isum: i32 = (0..16)
                        .map(|j| {
                            let byte = q[b * 16 + j];
                            (byte & 0x0F) as i32 * aq[b * QK + j] as i32
                                + (byte >> 4) as i32 * aq[b * QK + j + 16] as i32
                        })
                        .sum();
                    acc = (isum as f32).mul_add(d[b] * as_[b], acc);
                    acc = m[b].mul_add(a.scaled_sums(ti)[b], acc);
                }
                assert_eq!(got[ti * n + ni].to_bits(), acc.to_bits(), "k {k}, t {t}, {vnni:?}: ({ti}, {ni})");
            }
        }
        // int8, each block's largest magnitude at 127 (the sign trick's edge).
        let q8 = Q8Matrix::from_f32(&values(n * k, 48), n, k);
        lanes_avx2::matmul(avx2, vnni, q8.lanes.as_deref().unwrap(), &a, &mut got);
        for ti in 0..t {
            let (aq, as_) = a.row(ti);
            for ni in 0..n {
                let (wq, ws) = q8.row(ni);
                let mut acc = 0f32;
                for b in 0..k / QK {
                    let isum: i32 = (b * QK..(b + 1) * QK).map(|i| wq[i] as i32 * aq[i] as i32).sum();
                    acc = (isum as f32).mul_add(ws[b] * as_[b], acc);
                }
                assert_eq!(got[ti * n + ni].to_bits(), acc.to_bits(), "int8, k {k}, t {t}, {vnni:?}: ({ti}, {ni})");
            }
        }
    }
}

/// The AVX2 lane kernels (Q4_1 and int8) sum the same integers as the VNNI ones and run their
/// float epilogue instruction for instruction: on a CPU with both, equal bits. int8 weights at
/// -127 and +127 (each row's extremes) check the sign trick that replaces the +128 offset.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_lanes_equal_vnni_lanes_bit_for_bit() {
    let (Some(avx2), Some(vnni)) = (cpu().avx2, cpu().vnni) else {
        return;
    };
    for k in [64, 96, 576] {
        let (n, t) = (45, 7);
        let q4 = Q4Matrix::from_q4_1_bytes(&q4_bytes(n, k, 43), n, k).unwrap();
        let q8 = Q8Matrix::from_f32(&values(n * k, 44), n, k);
        let mut a = Q8Acts::default();
        a.quantize(&values(t * k, 45), t, k);
        for packed in [q4.lanes.as_deref().unwrap(), q8.lanes.as_deref().unwrap()] {
            let (mut x, mut y) = (vec![0f32; t * n], vec![0f32; t * n]);
            lanes_avx2::matmul(avx2, None, packed, &a, &mut x);
            lanes::matmul(vnni, packed, &a, &mut y);
            assert_eq!(x, y, "k {k}");
        }
    }
}
