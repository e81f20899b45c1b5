//! Each fused op against the same function written in stock candle ops (whose backward is
//! trusted): equal values and equal gradients for a random upstream gradient.

use super::*;
use candle_core::{Var, D};

fn rand(shape: &[usize], seed: u64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    a.sub(b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// (value, d/dx of sum(f(x) * g)) for a function of one variable.
fn value_and_grad(x: &Tensor, g: &Tensor, f: impl Fn(&Tensor) -> Tensor) -> (Tensor, Tensor) {
    let v = Var::from_tensor(x).unwrap();
    let y = f(v.as_tensor());
    let grads = y.mul(g).unwrap().sum_all().unwrap().backward().unwrap();
    (y.detach(), grads.get(v.as_tensor()).unwrap().clone())
}

fn check(x: &Tensor, g: &Tensor, fused: impl Fn(&Tensor) -> Tensor, stock: impl Fn(&Tensor) -> Tensor) {
    let (yf, gf) = value_and_grad(x, g, fused);
    let (ys, gs) = value_and_grad(x, g, stock);
    assert!(max_diff(&yf, &ys) < 1e-5, "values differ by {}", max_diff(&yf, &ys));
    assert!(max_diff(&gf, &gs) < 1e-4, "gradients differ by {}", max_diff(&gf, &gs));
}

#[test]
fn rms_norm() {
    let (x, g, w) = (rand(&[5, 16], 1), rand(&[5, 16], 2), rand(&[16], 3));
    let wv = Arc::new(w.to_vec1::<f32>().unwrap());
    check(
        &x,
        &g,
        |x| x.apply_op1(RmsNorm { weight: wv.clone(), eps: 1e-5 }).unwrap(),
        |x| {
            let r =
                (x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap() + 1e-5).unwrap().sqrt().unwrap().recip().unwrap();
            x.broadcast_mul(&r).unwrap().broadcast_mul(&w).unwrap()
        },
    );
}

#[test]
fn rope() {
    let (t, heads, hd) = (6, 3, 8);
    let (x, g) = (rand(&[t, heads * hd], 4), rand(&[t, heads * hd], 5));
    let (cos_t, sin_t) = (rand(&[t, hd / 2], 6), rand(&[t, hd / 2], 7));
    let (cos, sin) = (Arc::new(values(&cos_t).unwrap()), Arc::new(values(&sin_t).unwrap()));
    check(
        &x,
        &g,
        |x| x.apply_op1(Rope { cos: cos.clone(), sin: sin.clone(), head_dim: hd }).unwrap(),
        |x| {
            let x = x.reshape((t, heads, hd / 2, 2)).unwrap();
            let (x0, x1) = (x.narrow(3, 0, 1).unwrap(), x.narrow(3, 1, 1).unwrap());
            let c = cos_t.reshape((t, 1, hd / 2, 1)).unwrap();
            let s = sin_t.reshape((t, 1, hd / 2, 1)).unwrap();
            let o0 = x0.broadcast_mul(&c).unwrap().sub(&x1.broadcast_mul(&s).unwrap()).unwrap();
            let o1 = x0.broadcast_mul(&s).unwrap().add(&x1.broadcast_mul(&c).unwrap()).unwrap();
            Tensor::cat(&[o0, o1], 3).unwrap().reshape((t, heads * hd)).unwrap()
        },
    );
}

#[test]
fn silu_mul() {
    act_mul(Activation::Silu, |a| a.silu().unwrap());
}

/// Against candle's `gelu`, the tanh approximation (with its own backward).
#[test]
fn gelu_mul() {
    act_mul(Activation::GeluTanh, |a| a.gelu().unwrap());
}

fn act_mul(act: Activation, stock_act: impl Fn(&Tensor) -> Tensor) {
    let (a, u, g) = (rand(&[9, 5000], 10), rand(&[9, 5000], 11), rand(&[9, 5000], 12));
    let (av, uv) = (Var::from_tensor(&a).unwrap(), Var::from_tensor(&u).unwrap());
    let gu = Tensor::cat(&[av.as_tensor(), uv.as_tensor()], 1).unwrap();
    let fused = gu.apply_op1(ActMul(act)).unwrap();
    let gf = fused.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
    let stock = stock_act(av.as_tensor()).mul(uv.as_tensor()).unwrap();
    let gs = stock.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
    assert!(max_diff(&fused, &stock) < 1e-5);
    for v in [&av, &uv] {
        let (x, y) = (gf.get(v.as_tensor()).unwrap(), gs.get(v.as_tensor()).unwrap());
        assert!(max_diff(x, y) < 1e-5, "{}", max_diff(x, y));
    }
}
