//! The trainer's adapter: a fresh one as PEFT initialises it, or one read from a checkpoint to
//! continue from, and its files when a job ends. The files are read and written by
//! `tandem_model::peft`, the same code that serves them, in PEFT's layout.

use crate::net::{Base, Lora};
use candle_core::{Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use std::path::Path;
use tandem_model::peft::{self, AdapterConfig, PairData};

/// ART's adapter: rank 8, alpha 16.
pub const RANK: usize = 8;
pub const ALPHA: f64 = 16.0;

/// A pair as PEFT initialises it: A ~ U(-1/sqrt(in), 1/sqrt(in)) (Kaiming-uniform with
/// a = sqrt(5)), B = 0, so it adds nothing until trained.
fn fresh_pair(din: usize, dout: usize, rank: usize, rng: &mut impl Rng) -> candle_core::Result<(Var, Var)> {
    let bound = 1.0 / (din as f32).sqrt();
    let a: Vec<f32> = (0..rank * din).map(|_| rng.random_range(-bound..bound)).collect();
    let a = Var::from_tensor(&Tensor::from_vec(a, (rank, din), &Device::Cpu)?)?;
    let b = Var::from_tensor(&Tensor::zeros((dout, rank), candle_core::DType::F32, &Device::Cpu)?)?;
    Ok((a, b))
}

fn layer_of(pairs: Vec<(Var, Var)>) -> candle_core::Result<[(Var, Var); 7]> {
    pairs.try_into().map_err(|_| candle_core::Error::Msg("an adapter layer needs seven pairs".into()))
}

/// A fresh adapter of ART's shape, equal to the base model. Seeded: the same every time.
pub fn init(base: &Base, seed: u64) -> candle_core::Result<Lora> {
    init_with(base, AdapterConfig { r: RANK, lora_alpha: Some(ALPHA), use_rslora: false }, seed)
}

/// A fresh adapter of `config`'s rank and scale on every module, equal to the base model.
pub fn init_with(base: &Base, config: AdapterConfig, seed: u64) -> candle_core::Result<Lora> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut pairs = Vec::with_capacity(base.config.n_layer);
    for _ in 0..base.config.n_layer {
        let layer = (0..7).map(|m| {
            let (din, dout) = base.dims(m);
            fresh_pair(din, dout, config.r, &mut rng)
        });
        pairs.push(layer_of(layer.collect::<candle_core::Result<_>>()?)?);
    }
    Ok(Lora { config, pairs, head: None })
}

/// A fresh pair for the output head (Tinker's `train_unembed`), equal to the base model until
/// trained; seeded apart from the layers' pairs.
pub fn fresh_head(base: &Base, rank: usize, seed: u64) -> candle_core::Result<(Var, Var)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x68ea_d5ee_d000_0001);
    let (din, dout) = peft::head_dims(&base.config);
    fresh_pair(din, dout, rank, &mut rng)
}

/// Loads an adapter directory (a checkpoint, or any PEFT adapter) to continue training from it.
/// Modules the file lacks start fresh (B = 0: the adapter's function is unchanged), with its rank
/// and scale (rsLoRA included).
pub fn load(dir: &Path, base: &Base, seed: u64) -> Result<Lora, String> {
    let adapter = peft::read(dir, &base.config).map_err(|e| format!("the adapter to continue from: {e}"))?;
    let rank = adapter.config.r;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let var = |v: Vec<f32>, shape: (usize, usize)| {
        Tensor::from_vec(v, shape, &Device::Cpu).and_then(|t| Var::from_tensor(&t)).map_err(|e| e.to_string())
    };
    let mut pairs = Vec::with_capacity(adapter.layers.len());
    for layer in adapter.layers {
        let mut out = Vec::with_capacity(7);
        for (m, pair) in layer.into_iter().enumerate() {
            let (din, dout) = base.dims(m);
            out.push(match pair {
                Some(p) => (var(p.a, (rank, din))?, var(p.b, (dout, rank))?),
                None => fresh_pair(din, dout, rank, &mut rng).map_err(|e| e.to_string())?,
            });
        }
        pairs.push(layer_of(out).map_err(|e| e.to_string())?);
    }
    let (din, dout) = peft::head_dims(&base.config);
    let head = match adapter.head {
        Some(p) => Some((var(p.a, (rank, din))?, var(p.b, (dout, rank))?)),
        None => None,
    };
    Ok(Lora { config: adapter.config, pairs, head })
}

/// The adapter's files: `(name, bytes)` for `adapter_config.json` and `adapter_model.safetensors`.
pub fn save(lora: &Lora, base: &Base, base_model: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let values = |v: &Var| v.as_tensor().flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(|e| e.to_string());
    let mut layers = Vec::with_capacity(lora.pairs.len());
    for layer in &lora.pairs {
        let pairs: Vec<PairData> =
            layer.iter().map(|(a, b)| Ok(PairData { a: values(a)?, b: values(b)? })).collect::<Result<_, String>>()?;
        layers.push(<[PairData; 7]>::try_from(pairs).map_err(|_| "an adapter layer needs seven pairs".to_string())?);
    }
    let head = match &lora.head {
        Some((a, b)) => Some(PairData { a: values(a)?, b: values(b)? }),
        None => None,
    };
    peft::write(&lora.config, &layers, head.as_ref(), &base.config, base_model).map_err(|e| e.to_string())
}
