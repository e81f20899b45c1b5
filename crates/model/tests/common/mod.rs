//! The naive f32 forward the model tests hold the optimised one to: written the slow, obvious
//! way from the architectures' definitions, reading each tensor as the file stores it (q/k rows
//! in Hugging Face's halves order for Qwen and Gemma, rotated as such), sharing none of the
//! loader's or the kernels' code.
#![allow(dead_code)]

use std::path::Path;
use tandem_model::{Arch, GgufFile};

pub fn matvec(w: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
    let cols = x.len();
    (0..rows).map(|r| w[r * cols..(r + 1) * cols].iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}

pub fn rms(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    x.iter().zip(w).map(|(v, g)| v / (ms + eps).sqrt() * g).collect()
}

/// Rotates each head of `v`: Llama's files pair (2i, 2i+1), the others (i, i + half); a file's
/// `rope_freqs` divide the frequencies.
fn rope(v: &mut [f32], hd: usize, pos: usize, base: f32, adjacent: bool, freqs: Option<&[f32]>) {
    for head in v.chunks_mut(hd) {
        for i in 0..hd / 2 {
            let factor = freqs.map_or(1.0, |f| f[i] as f64);
            let theta = pos as f64 / (base as f64).powf(2.0 * i as f64 / hd as f64) / factor;
            let (s, c) = (theta.sin() as f32, theta.cos() as f32);
            let (ia, ib) = if adjacent { (2 * i, 2 * i + 1) } else { (i, i + hd / 2) };
            let (a, b) = (head[ia], head[ib]);
            head[ia] = a * c - b * s;
            head[ib] = a * s + b * c;
        }
    }
}

fn gelu_tanh(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())) as f32
}

/// Logits after the last of `tokens`, the slow, obvious way.
pub fn naive_logits(path: &Path, tokens: &[u32]) -> Vec<f32> {
    let mut f = GgufFile::open(path).unwrap();
    let c = f.llama_config().unwrap();
    let arch = c.arch;
    let gemma = arch == Arch::Gemma3;
    let window = f.metadata().get("gemma3.attention.sliding_window").map(|v| v.to_u32().unwrap() as usize);
    let (hd, nh, nkv, h) = (c.head_dim, c.n_head, c.n_kv_head, c.hidden);
    let mut t = |name: &str| f.tensor_f32(name).ok().map(|t| t.0);
    let embed = t("token_embd.weight").unwrap();
    let freqs = t("rope_freqs.weight");
    let embed_scale = if gemma { (h as f32).sqrt() } else { 1.0 };
    let mut xs: Vec<Vec<f32>> = tokens
        .iter()
        .map(|id| embed[*id as usize * h..(*id as usize + 1) * h].iter().map(|v| v * embed_scale).collect())
        .collect();
    for l in 0..c.n_layer {
        let p = |n: &str| format!("blk.{l}.{n}");
        let mut w = |n: &str| t(&p(n)).unwrap();
        let (wq, wk, wv, wo) = (w("attn_q.weight"), w("attn_k.weight"), w("attn_v.weight"), w("attn_output.weight"));
        let (an, fnw) = (w("attn_norm.weight"), w("ffn_norm.weight"));
        let (wg, wu, wd) = (w("ffn_gate.weight"), w("ffn_up.weight"), w("ffn_down.weight"));
        let (bq, bk, bv) = (t(&p("attn_q.bias")), t(&p("attn_k.bias")), t(&p("attn_v.bias")));
        let (qn, kn) = (t(&p("attn_q_norm.weight")), t(&p("attn_k_norm.weight")));
        let (pa, pf) = (t(&p("post_attention_norm.weight")), t(&p("post_ffw_norm.weight")));
        assert_eq!(bq.is_some(), arch == Arch::Qwen2, "layer {l}: biases");
        assert_eq!(qn.is_some(), matches!(arch, Arch::Qwen3 | Arch::Gemma3), "layer {l}: q/k norms");
        assert_eq!(pa.is_some(), gemma, "layer {l}: post norms");
        // Gemma 3: five sliding layers with RoPE base 10,000, then a global one.
        let sliding = gemma && (l + 1) % 6 != 0;
        let layer_freqs = if sliding { None } else { freqs.as_deref() };
        let base = if sliding { 10_000.0 } else { c.rope_base };
        let add = |v: &mut Vec<f32>, b: &Option<Vec<f32>>| {
            if let Some(b) = b {
                v.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
        };
        let head_norm = |v: &mut Vec<f32>, w: &Option<Vec<f32>>| {
            if let Some(w) = w {
                *v = v.chunks(hd).flat_map(|head| rms(head, w, c.rms_eps)).collect();
            }
        };
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, x) in xs.iter().enumerate() {
            let n = rms(x, &an, c.rms_eps);
            let (mut q, mut k, mut v) =
                (matvec(&wq, &n, nh * hd), matvec(&wk, &n, nkv * hd), matvec(&wv, &n, nkv * hd));
            add(&mut q, &bq);
            add(&mut k, &bk);
            add(&mut v, &bv);
            head_norm(&mut q, &qn);
            head_norm(&mut k, &kn);
            rope(&mut q, hd, pos, base, arch == Arch::Llama, layer_freqs);
            rope(&mut k, hd, pos, base, arch == Arch::Llama, layer_freqs);
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        for pos in 0..xs.len() {
            let first = if sliding { (pos + 1).saturating_sub(window.unwrap()) } else { 0 };
            let mut att = vec![0f32; nh * hd];
            for head in 0..nh {
                let kh = head / (nh / nkv);
                let q = &qs[pos][head * hd..(head + 1) * hd];
                let scores: Vec<f32> = (first..=pos)
                    .map(|j| {
                        q.iter().zip(&ks[j][kh * hd..(kh + 1) * hd]).map(|(a, b)| a * b).sum::<f32>()
                            / (hd as f32).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f32::MIN, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for (j, w) in e.iter().enumerate() {
                    for d in 0..hd {
                        att[head * hd + d] += w / z * vs[first + j][kh * hd + d];
                    }
                }
            }
            let mut o = matvec(&wo, &att, h);
            if let Some(pa) = &pa {
                o = rms(&o, pa, c.rms_eps);
            }
            xs[pos].iter_mut().zip(o).for_each(|(x, o)| *x += o);
            let n = rms(&xs[pos], &fnw, c.rms_eps);
            let (g, u) = (matvec(&wg, &n, c.ffn), matvec(&wu, &n, c.ffn));
            let hid: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| if gemma { gelu_tanh(*g) * u } else { g / (1.0 + (-g).exp()) * u })
                .collect();
            let mut d = matvec(&wd, &hid, h);
            if let Some(pf) = &pf {
                d = rms(&d, pf, c.rms_eps);
            }
            xs[pos].iter_mut().zip(d).for_each(|(x, d)| *x += d);
        }
    }
    let head = t("output.weight").unwrap_or(embed);
    let n = rms(xs.last().unwrap(), &t("output_norm.weight").unwrap(), c.rms_eps);
    matvec(&head, &n, c.vocab)
}
