//! Kernel throughput on one thread, best of many repetitions (stable enough to compare kernel
//! variants on a noisy VM): `cargo run --release -p tandem-model --example matmul_bench`.
use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
use tandem_model::kernels::{matmul, BlockFormat, BlockMatrix, Q4Matrix, Q8Acts, Q8Matrix, Weights};

/// Deterministic values in [-1, 1) (the test fixtures' generator, doubled).
fn pseudo(n: usize, seed: u64) -> Vec<f32> {
    tandem_model::testing::weights(n, seed).into_iter().map(|v| 2.0 * v).collect()
}

fn q4(rows: usize, cols: usize) -> Weights {
    let mut raw = Vec::new();
    for (b, v) in pseudo(rows * cols / 32 * 2, 3).chunks_exact(2).enumerate() {
        raw.extend_from_slice(&half::f16::from_f32(0.01 + v[0].abs() * 0.05).to_le_bytes());
        raw.extend_from_slice(&half::f16::from_f32(v[1] * 0.3).to_le_bytes());
        raw.extend((0..16).map(|j| ((b * 7 + j * 13) % 256) as u8));
    }
    Weights::Q4(Q4Matrix::from_q4_1_bytes(&raw, rows, cols).unwrap())
}

/// A block-format matrix as candle quantises it (the K-quants and Q5_0 of the real Qwen files).
fn block(format: BlockFormat, rows: usize, cols: usize) -> Weights {
    let t = Tensor::from_vec(pseudo(rows * cols, 11), (rows, cols), &Device::Cpu).unwrap();
    let raw = QTensor::quantize(&t, format.dtype()).unwrap().data().unwrap().into_owned();
    Weights::Block(BlockMatrix::from_raw(format, raw, rows, cols).unwrap())
}

/// `matmul_bench stream [THREADS]`: decode's access pattern, one activation row against a stream
/// of Q4_K matrices (Qwen2.5-1.5B's FFN shape) ten times the size of the L3 cache, on
/// THREADS threads (2): the weight bytes read per second, what bounds decode.
fn stream(threads: usize) {
    let mats: Vec<Weights> = (0..40).map(|_| block(BlockFormat::Q4K, 8960, 1536).lanes_only()).collect();
    let bytes: usize = mats.iter().map(Weights::bytes).sum();
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(|| {
        let mut a = Q8Acts::default();
        a.k_quants = std::env::var_os("PER32").is_none();
        a.quantize(&pseudo(1536, 7), 1, 1536);
        let mut out = vec![0f32; 8960];
        let mut best = f64::MAX;
        for _ in 0..8 {
            let start = std::time::Instant::now();
            for w in &mats {
                matmul(w, &a, &mut out);
            }
            best = best.min(start.elapsed().as_secs_f64());
        }
        println!("stream {} MB of Q4_K, T=1, {threads} threads: {:.1} GB/s", bytes >> 20, bytes as f64 / best / 1e9);
    });
}

/// `matmul_bench read [THREADS] [MB]`: the read bandwidth decode is bounded by, measured the way
/// decode reads: THREADS threads (2) each stream once through their contiguous part of MB
/// megabytes (the size of the weights, far beyond the L3), loading every byte and doing nothing
/// else, best of 8. No writes: a copy's bandwidth counts write-allocate traffic, and on one core.
/// (On the session-32 VM the result moved between ~35 and ~61 GB/s from one minute to the next:
/// the host's, so compare it only with what was measured beside it.)
fn read(threads: usize, mb: usize) {
    let data: Vec<u64> = (0..(mb << 20) / 8).map(|i| i as u64).collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let part = data.len().div_ceil(threads);
    let mut best = f64::MAX;
    for _ in 0..8 {
        let start = std::time::Instant::now();
        let sums: Vec<u64> = pool.install(|| {
            use rayon::prelude::*;
            data.par_chunks(part)
                .map(|mine| {
                    // Eight independent accumulators: the loads, not an add chain, set the pace.
                    let mut acc = [0u64; 8];
                    for line in mine.chunks_exact(8) {
                        for k in 0..8 {
                            acc[k] = acc[k].wrapping_add(line[k]);
                        }
                    }
                    acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
                })
                .collect()
        });
        std::hint::black_box(sums);
        best = best.min(start.elapsed().as_secs_f64());
    }
    println!("read {mb} MB, {threads} threads: {:.1} GB/s", (data.len() * 8) as f64 / best / 1e9);
}

/// `matmul_bench layers [T] [THREADS] [REPEAT]`: every projection of Qwen2.5-1.5B's 28 layers at
/// their real shapes and formats (Q4_K, with `ffn_down` in Q6_K in every other layer, as in the
/// Q4_K_M file; `gate`/`up` fused as the model runs them), T activation rows (16), THREADS
/// threads (2): 1.3 GB of weights, so each pass streams them from memory as a 16-stream decode
/// step does. REPEAT=1 instead runs the first layer's matrices 28 times (26 MB, which a 32 MB L3
/// can hold): the gap between the two is what streaming from memory costs the tiles.
fn layers(t: usize, threads: usize, repeat: bool) {
    let layer = |i: usize| {
        let down = if i.is_multiple_of(2) { BlockFormat::Q6K } else { BlockFormat::Q4K };
        vec![
            block(BlockFormat::Q4K, 2048, 1536).lanes_only(),
            block(BlockFormat::Q4K, 1536, 1536).lanes_only(),
            block(BlockFormat::Q4K, 2 * 8960, 1536).lanes_only(),
            block(down, 1536, 8960).lanes_only(),
        ]
    };
    let mats: Vec<Weights> = (0..if repeat { 1 } else { 28 }).flat_map(layer).collect();
    let passes = if repeat { 28 } else { 1 };
    let macs: usize = mats.iter().map(|w| w.rows() * w.cols() * t).sum::<usize>() * passes;
    let bytes: usize = mats.iter().map(Weights::bytes).sum::<usize>() * passes;
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(|| {
        let acts = |k: usize| {
            let mut a = Q8Acts::default();
        a.k_quants = std::env::var_os("PER32").is_none();
            a.quantize(&pseudo(t * k, 7), t, k);
            a
        };
        let (narrow, wide) = (acts(1536), acts(8960));
        let mut out = vec![0f32; t * 2 * 8960];
        let mut best = f64::MAX;
        for _ in 0..6 {
            let start = std::time::Instant::now();
            for _ in 0..passes {
                for w in &mats {
                    let a = if w.cols() == 8960 { &wide } else { &narrow };
                    matmul(w, a, &mut out[..t * w.rows()]);
                }
            }
            best = best.min(start.elapsed().as_secs_f64());
        }
        let what = if repeat { "one layer repeated (26 MB)" } else { "28 layers streamed" };
        println!(
            "layers T={t} {threads} threads, {what}: {:.1} ms a pass, {:.1} GMAC/s a thread, weights read at {:.1} GB/s",
            best / passes as f64 * 1e3,
            macs as f64 / best / 1e9 / threads as f64,
            bytes as f64 / best / 1e9
        );
    });
}

/// `matmul_bench peak [THREADS] [MODEL]`: the tier's int8 multiply instruction alone on THREADS
/// threads (2) at once (`kernels::peak`), and with a GGUF, its matrices' multiply-adds a token
/// (every 2-D weight of its layers; the head runs for a prompt's last token only) and so the
/// compute limit of prefill and of many streams, which `bench/inference.py` prints beside them.
fn peak(threads: usize, model: Option<String>) {
    let Some(p) = tandem_model::kernels::peak::int8_peak(threads) else {
        println!("peak: the scalar tier has no int8 multiply instruction");
        return;
    };
    let rate = p.products_per_sec;
    print!("peak {}, threads={threads}: {:.1} G products/s", p.instruction, rate / 1e9);
    if let Some(path) = model {
        let mut file = std::fs::File::open(&path).expect("the model file");
        let content = candle_core::quantized::gguf_file::Content::read(&mut file).expect("a GGUF file");
        let macs: usize = content
            .tensor_infos
            .iter()
            .filter(|(name, info)| name.starts_with("blk.") && info.shape.dims().len() == 2)
            .map(|(_, info)| info.shape.elem_count())
            .sum();
        print!(", {:.3} GMAC a token -> compute limit {:.1} tok/s", macs as f64 / 1e9, rate / macs as f64);
    }
    println!();
}

fn main() {
    let arg = |i: usize, default: usize| std::env::args().nth(i).and_then(|t| t.parse().ok()).unwrap_or(default);
    let mode = std::env::args().nth(1);
    match mode.as_deref() {
        Some("read") => return read(arg(2, 2), arg(3, 1024)),
        Some("layers") => return layers(arg(2, 16), arg(3, 2), arg(4, 0) == 1),
        Some("stream") => return stream(arg(2, 2)),
        Some("peak") => return peak(arg(2, 2), std::env::args().nth(3)),
        _ => {}
    }
    rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| {
        // `matmul_bench blocks` times only the block formats at a 1024x1536 shape whose weights
        // fit the L2; `matmul_bench shapes` Qwen2.5-1.5B's real projections (most do not).
        let small_blocks = || {
            vec![
                ("q5_0 1024x1536", block(BlockFormat::Q5_0, 1024, 1536)),
                ("q4_k 1024x1536", block(BlockFormat::Q4K, 1024, 1536)),
                ("q6_k 1024x1536", block(BlockFormat::Q6K, 1024, 1536)),
            ]
        };
        let cases: Vec<(&str, Weights)> = match mode.as_deref() {
            Some("shapes") => vec![
                ("q4_k 2048x1536", block(BlockFormat::Q4K, 2048, 1536)),
                ("q4_k 17920x1536", block(BlockFormat::Q4K, 17920, 1536)),
                ("q4_k 1536x8960", block(BlockFormat::Q4K, 1536, 8960)),
                ("q6_k 1536x8960", block(BlockFormat::Q6K, 1536, 8960)),
            ],
            Some("blocks") => small_blocks(),
            _ => {
                let mut all = vec![
                    ("q4 1536x576", q4(1536, 576)),
                    ("q4 576x1536", q4(576, 1536)),
                    ("q8 4096x576", Weights::Q8(Q8Matrix::from_f32(&pseudo(4096 * 576, 5), 4096, 576))),
                ];
                all.extend(small_blocks());
                all
            }
        };
        // ONLY=q4_k (a prefix of the case's name) and ROWS=128 narrow the run, for `perf`.
        let only = std::env::var("ONLY").unwrap_or_default();
        let rows: Vec<usize> = match std::env::var("ROWS").ok().and_then(|r| r.parse().ok()) {
            Some(r) => vec![r],
            None => vec![1, 16, 128],
        };
        for (name, w) in cases.iter().filter(|(name, _)| name.starts_with(&only)) {
            for &t in &rows {
                let mut a = Q8Acts::default();
                a.k_quants = std::env::var_os("PER32").is_none();
                a.quantize(&pseudo(t * w.cols(), 7), t, w.cols());
                let mut out = vec![0f32; t * w.rows()];
                let reps = (2_000_000_000 / (w.rows() * w.cols() * t)).clamp(3, 2000);
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let start = std::time::Instant::now();
                    for _ in 0..reps {
                        matmul(w, &a, &mut out);
                    }
                    best = best.min(start.elapsed().as_secs_f64() / reps as f64);
                }
                let gmac = (w.rows() * w.cols() * t) as f64 / best / 1e9;
                println!("{name:<14} T={t:<4} {:>8.1} us  {gmac:>6.1} GMAC/s", best * 1e6);
            }
        }
    });
}
