//! Times `dy W` on a real model's matrices (`kernels::matmul_through`: the transposed int8 copy
//! made per call, then the product) against the product alone on a copy made once, the trainer's
//! way before session 48. `cargo run --release -p tandem-model --example through_bench MODEL [T]`.
use tandem_model::kernels::{matmul_through, Transposed};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).map(String::as_str).unwrap_or("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let t: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let model = tandem_model::load(std::path::Path::new(path)).expect("model").model;
    let layer = &model.layers[0];
    println!("{:<8}{:>12}{:>14}{:>14}{:>14}", "matrix", "rows x cols", "copy (ms)", "product (ms)", "through (ms)");
    for (name, w) in [("qkv", &layer.qkv), ("o", &layer.o), ("gate_up", &layer.gate_up), ("down", &layer.down)]
        .into_iter()
        .chain(std::iter::once(("head", model.lm_head.as_ref().unwrap_or(&model.embed))))
    {
        let dy: Vec<f32> = (0..t * w.rows()).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let rounds = 5;
        let time = |f: &mut dyn FnMut()| {
            f();
            let s = std::time::Instant::now();
            for _ in 0..rounds {
                f();
            }
            s.elapsed().as_secs_f64() * 1e3 / rounds as f64
        };
        let copy = time(&mut || drop(Transposed::of(w)));
        let mut row = vec![0f32; w.cols()];
        let dequant = time(&mut || {
            for r in 0..w.rows() {
                w.dequantize_row(r, &mut row);
            }
        });
        let format = match w {
            tandem_model::kernels::Weights::Block(b) => format!("{:?}", b.format()),
            tandem_model::kernels::Weights::Q8(_) => "int8".into(),
            tandem_model::kernels::Weights::Q4(_) => "Q4_1".into(),
            tandem_model::kernels::Weights::F32(_) => "f32".into(),
        };
        eprintln!("{name} ({format}): dequantising every row on one thread {dequant:.2} ms");
        let made = Transposed::of(w);
        let product = time(&mut || drop(made.product(&dy, t)));
        let through = time(&mut || drop(matmul_through(w, &dy, t)));
        println!("{name:<8}{:>12}{copy:>14.2}{product:>14.2}{through:>14.2}", format!("{}x{}", w.rows(), w.cols()));
    }
}
