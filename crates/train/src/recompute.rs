//! Activation checkpointing, per layer: a row's forward kept as each layer's input instead of
//! its whole graph.
//!
//! A part's graph holds every activation of every layer until its backward (~1.7 MB a token on
//! SmolLM2: a part of 512 tokens ~870 MB), and a tree cut into parts keeps its prefix's graph
//! until every part has run, because the parts' backward passes feed the prefix's keys, values
//! and last hidden state (a 444-token agent prompt ~750 MB). Here the row runs forward without
//! a graph, saving only each layer's input (one hidden-size row a token and layer, ~70 KB a
//! token on SmolLM2), and the head with its graph on the last layer's output; the backward then
//! runs from the head down, recomputing one layer at a time from its saved input with its
//! graph, backpropagating `sum(y dy) + sum(K dK) + sum(V dV)` through it and dropping the graph
//! before the next. The gradient is the same by the chain rule; the price is one more forward
//! of the row's layers.

use crate::net::{Base, Lora, Pass, Prefix, RowOutput};
use crate::pack::Row;
use crate::trainer::{accumulate, failed};
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use tandem_jobs::TrainError;

/// Each layer's input, detached, and the last layer's output as the leaf the head reads.
pub struct Saved {
    inputs: Vec<Tensor>,
    top: Var,
}

/// The row's forward: its targets' logprobs and entropies and its last row's final hidden
/// state (both tracked back to [`Saved`]'s leaf), each layer's keys and values (detached: what
/// a tree's branches read), and the inputs its backward recomputes from.
pub fn forward(base: &Base, lora: &Lora, row: &Row) -> Result<(RowOutput, Prefix, Saved), TrainError> {
    let pass = Pass::new(base, lora, row, false, None).map_err(failed)?;
    let mut x = pass.embed().map_err(failed)?;
    let n_layer = base.config.n_layer;
    let (mut inputs, mut kv) = (Vec::with_capacity(n_layer), Vec::with_capacity(n_layer));
    for li in 0..n_layer {
        let (next, k, v) = pass.layer(li, &x).map_err(failed)?;
        inputs.push(x);
        kv.push((k, v));
        x = next;
    }
    let top = Var::from_tensor(&x).map_err(failed)?;
    let (out, last) = pass.head(top.as_tensor(), true).map_err(failed)?;
    Ok((out, Prefix { kv, last }, Saved { inputs, top }))
}

/// The row's backward, adding the adapter's gradients into `grads`: through the head from
/// `head_loss` (a scalar on the head's outputs, e.g. `sum(g lp)`; `None` if nothing asks of
/// them), then each layer from the top, recomputed from its saved input, with `d_kv[l]` what
/// the layer's keys and values are asked for (a tree prefix's branches; empty for a plain row).
pub fn backward(
    base: &Base,
    lora: &Lora,
    row: &Row,
    saved: Saved,
    head_loss: Option<Tensor>,
    d_kv: &[(Option<Tensor>, Option<Tensor>)],
    grads: &mut GradStore,
) -> Result<(), TrainError> {
    let vars = lora.vars();
    let Saved { mut inputs, top } = saved;
    let mut dx = through(head_loss, &top, grads, &vars)?;
    drop(top);
    let pass = Pass::new(base, lora, row, true, None).map_err(failed)?;
    for li in (0..base.config.n_layer).rev() {
        let input = Var::from_tensor(&inputs.pop().expect("a layer's input")).map_err(failed)?;
        let (dk, dv) = d_kv.get(li).map_or((None, None), |(k, v)| (k.as_ref(), v.as_ref()));
        if dx.is_none() && dk.is_none() && dv.is_none() {
            continue;
        }
        let (y, k, v) = pass.layer(li, input.as_tensor()).map_err(failed)?;
        let mut terms = Vec::new();
        for (t, d) in [(&y, dx.as_ref()), (&k, dk), (&v, dv)] {
            if let Some(d) = d {
                terms.push(dot(t, d)?);
            }
        }
        dx = through(sum(terms)?, &input, grads, &vars)?;
    }
    Ok(())
}

/// `sum(a * b)`.
pub(crate) fn dot(a: &Tensor, b: &Tensor) -> Result<Tensor, TrainError> {
    a.mul(b).and_then(|t| t.sum_all()).map_err(failed)
}

/// The sum of scalar `terms`, if there are any.
pub(crate) fn sum(terms: Vec<Tensor>) -> Result<Option<Tensor>, TrainError> {
    let mut terms = terms.into_iter();
    let Some(first) = terms.next() else { return Ok(None) };
    terms.try_fold(first, |acc, t| acc.add(&t)).map(Some).map_err(failed)
}

/// Backpropagates `loss` (if anything asks of this layer), adding the adapter's gradients into
/// `grads`; the gradient of `input` (what the layer below gets), if anything reached it.
fn through(
    loss: Option<Tensor>,
    input: &Var,
    grads: &mut GradStore,
    vars: &[Var],
) -> Result<Option<Tensor>, TrainError> {
    let Some(loss) = loss else { return Ok(None) };
    let store = loss.backward().map_err(failed)?;
    accumulate(grads, &store, vars)?;
    Ok(store.get(input.as_tensor()).cloned())
}
