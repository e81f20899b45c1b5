//! Forward and backward over a row's parts, where a tree cut into several parts runs its prefix
//! once.
//!
//! A plain part runs as a whole: forward, the loss gradient of its targets (from the caller),
//! backward through `sum(g lp)`. Consecutive parts cut from one tree ([`Row::shared_prefix`])
//! run otherwise: the prefix's forward once, its graph kept, every layer's keys and values and
//! its last hidden state copied into leaf variables; each part then runs only its branches
//! ([`forward_branches`]), its loss gradient is taken with its prefix targets' logprobs from the
//! prefix pass, and its backward gives its adapter gradients and what its branches add to the
//! prefix's keys, values and last hidden state. The prefix's backward comes last, through
//! `sum(g lp) + sum(K dK) + sum(V dV) + sum(h dh)`: by the chain rule the same gradient as
//! running the tree whole, with the memory of the prefix plus one part and the prefix's compute
//! once instead of once per part. A part or prefix longer than the caller's limit keeps only
//! each layer's input instead of its graph and is recomputed layer by layer in its backward
//! ([`crate::recompute`]): a fraction of the memory, for one more forward.

use crate::net::{forward, forward_branches, forward_prefix, score, Base, Lora, Prefix};
use crate::pack::{Row, Target};
use crate::recompute::{dot, sum};
use crate::trainer::{accumulate, failed};
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use tandem_jobs::TrainError;

/// What one part gave: its targets' logprobs and entropies (in its target order), the tokens
/// its pass ran (a shared prefix counts in the first part of its tree), and the caller's value.
pub struct PartResult<T> {
    pub logprobs: Vec<f32>,
    pub entropy: Vec<f32>,
    pub tokens: usize,
    pub extra: T,
}

/// The loss gradient of part `k`'s targets given their logprobs, with anything else the caller
/// keeps from it.
pub type GradOf<'a, T> = dyn FnMut(usize, &[f32]) -> Result<(Vec<f64>, T), TrainError> + 'a;

/// Runs `parts` forward (and, with `backward`, backward, adding the adapter's gradients into
/// `grads`), in order.
///
/// A part, or a cut tree's prefix, longer than `recompute_above` tokens keeps only each layer's
/// input between its forward and its backward ([`crate::recompute`]).
pub fn run_parts<T>(
    base: &Base,
    lora: &Lora,
    parts: &[Row],
    backward: bool,
    recompute_above: usize,
    grads: &mut GradStore,
    grad_of: &mut GradOf<'_, T>,
) -> Result<Vec<PartResult<T>>, TrainError> {
    let vars = lora.vars();
    let mut out = Vec::with_capacity(parts.len());
    for unit in units(parts) {
        let (i, n) = (unit.start, unit.len());
        if n == 1 {
            let part = &parts[i];
            let (o, saved) = if backward && part.tokens.len() > recompute_above {
                let (o, _, saved) = crate::recompute::forward(base, lora, part)?;
                (o, Some(saved))
            } else {
                (if backward { forward(base, lora, part) } else { score(base, lora, part) }.map_err(failed)?, None)
            };
            let lp = values(&o.logprobs)?;
            let (g, extra) = grad_of(i, &lp)?;
            if backward && !lp.is_empty() {
                let loss = weighted_sum(&o.logprobs, &g)?;
                match saved {
                    Some(saved) => crate::recompute::backward(base, lora, part, saved, Some(loss), &[], grads)?,
                    None => accumulate(grads, &loss.backward().map_err(failed)?, &vars)?,
                }
            }
            out.push(PartResult { logprobs: lp, entropy: o.entropy, tokens: part.tokens.len(), extra });
        } else {
            let recompute = backward && parts[i].segments[0].1 > recompute_above;
            out.extend(tree(base, lora, &parts[unit], i, backward, recompute, grads, &vars, grad_of)?);
        }
    }
    Ok(out)
}

/// Where `parts` fall into runs that [`run_parts`] computes together: a plain part alone, the
/// parts cut from one tree as one run (their prefix runs once).
pub fn units(parts: &[Row]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < parts.len() {
        let n = match parts[i].shared_prefix {
            Some(id) => parts[i..].iter().take_while(|p| p.shared_prefix == Some(id)).count(),
            None => 1,
        };
        out.push(i..i + n);
        i += n;
    }
    out
}

/// Each part's targets' logprobs under `lora`, forward only (no graph kept), a tree's prefix
/// once: the scoring passes (old logprobs, the KL penalty's reference and learner terms).
pub fn score_parts(base: &Base, lora: &Lora, parts: &[Row]) -> Result<Vec<Vec<f32>>, TrainError> {
    let mut unused = GradStore::default();
    let results = run_parts(base, lora, parts, false, usize::MAX, &mut unused, &mut |_, _| Ok((Vec::new(), ())))?;
    Ok(results.into_iter().map(|r| r.logprobs).collect())
}

fn values(t: &Tensor) -> Result<Vec<f32>, TrainError> {
    if t.elem_count() == 0 {
        return Ok(Vec::new());
    }
    t.to_vec1::<f32>().map_err(failed)
}

/// `sum(g * lp)`.
fn weighted_sum(lp: &Tensor, g: &[f64]) -> Result<Tensor, TrainError> {
    let g: Vec<f32> = g.iter().map(|x| *x as f32).collect();
    let g = Tensor::from_vec(g, lp.elem_count(), lp.device()).map_err(failed)?;
    dot(lp, &g)
}

/// `sum` of `a`'s gradient in `grads` into `into`.
fn add_grad(into: &mut Option<Tensor>, grads: &GradStore, a: &Var) -> Result<(), TrainError> {
    if let Some(g) = grads.get(a.as_tensor()) {
        *into = Some(match into.take() {
            Some(sum) => sum.add(g).map_err(failed)?,
            None => g.clone(),
        });
    }
    Ok(())
}

/// The parts of one tree: span 0 of each is the same prefix.
#[allow(clippy::too_many_arguments)]
fn tree<T>(
    base: &Base,
    lora: &Lora,
    parts: &[Row],
    first: usize,
    backward: bool,
    recompute: bool,
    grads: &mut GradStore,
    vars: &[Var],
    grad_of: &mut GradOf<'_, T>,
) -> Result<Vec<PartResult<T>>, TrainError> {
    let p = parts[0].segments[0].1;
    // The prefix alone, with every part's targets inside it (a history's trained turns); for
    // each part's targets, where the prefix pass has them.
    let mut prefix_row = Row { tokens: parts[0].tokens[..p].to_vec(), segments: vec![(0, p)], ..Row::default() };
    let mut at_prefix: Vec<Vec<Option<usize>>> = Vec::with_capacity(parts.len());
    for part in parts {
        let mut here = Vec::with_capacity(part.targets.len());
        for t in &part.targets {
            here.push((t.pos < p).then(|| {
                prefix_row.targets.push(Target { segment: 0, ..*t });
                prefix_row.targets.len() - 1
            }));
        }
        at_prefix.push(here);
    }
    let (pre, prefix, saved) = if recompute {
        let (pre, prefix, saved) = crate::recompute::forward(base, lora, &prefix_row)?;
        (pre, prefix, Some(saved))
    } else {
        let (pre, prefix) = forward_prefix(base, lora, &prefix_row, backward).map_err(failed)?;
        (pre, prefix, None)
    };
    let pre_lp = values(&pre.logprobs)?;
    // The branches read the prefix through leaf copies, whose gradients the parts give.
    let leaf = |t: &Tensor| Var::from_tensor(&t.detach()).map_err(failed);
    let kv_leaves: Vec<(Var, Var)> =
        prefix.kv.iter().map(|(k, v)| Ok((leaf(k)?, leaf(v)?))).collect::<Result<_, _>>()?;
    let last_leaf = leaf(&prefix.last)?;
    // Without a backward the branches read the prefix as plain tensors: nothing tracks them.
    let given = if backward {
        Prefix {
            kv: kv_leaves.iter().map(|(k, v)| (k.as_tensor().clone(), v.as_tensor().clone())).collect(),
            last: last_leaf.as_tensor().clone(),
        }
    } else {
        Prefix { kv: prefix.kv.iter().map(|(k, v)| (k.detach(), v.detach())).collect(), last: prefix.last.detach() }
    };
    let mut g_prefix = vec![0f64; prefix_row.targets.len()];
    let mut d_kv: Vec<(Option<Tensor>, Option<Tensor>)> = vec![(None, None); kv_leaves.len()];
    let mut d_last = None;
    let mut out = Vec::with_capacity(parts.len());
    for (k, part) in parts.iter().enumerate() {
        let branches = Row { targets: part.targets.iter().filter(|t| t.pos >= p).copied().collect(), ..part.clone() };
        let o = forward_branches(base, lora, &branches, &given, backward).map_err(failed)?;
        let branch_lp = values(&o.logprobs)?;
        // Logprobs and entropies in the part's target order.
        let (mut lp, mut entropy) = (Vec::with_capacity(part.targets.len()), Vec::with_capacity(part.targets.len()));
        let mut next = 0;
        for at in &at_prefix[k] {
            match at {
                Some(x) => {
                    lp.push(pre_lp[*x]);
                    entropy.push(pre.entropy[*x]);
                }
                None => {
                    lp.push(branch_lp[next]);
                    entropy.push(o.entropy[next]);
                    next += 1;
                }
            }
        }
        let (g, extra) = grad_of(first + k, &lp)?;
        if backward {
            let mut g_branch = Vec::with_capacity(branch_lp.len());
            for (at, gv) in at_prefix[k].iter().zip(&g) {
                match at {
                    Some(x) => g_prefix[*x] += gv,
                    None => g_branch.push(*gv),
                }
            }
            if !g_branch.is_empty() {
                let part_grads = weighted_sum(&o.logprobs, &g_branch)?.backward().map_err(failed)?;
                accumulate(grads, &part_grads, vars)?;
                for ((dk, dv), (k, v)) in d_kv.iter_mut().zip(&kv_leaves) {
                    add_grad(dk, &part_grads, k)?;
                    add_grad(dv, &part_grads, v)?;
                }
                add_grad(&mut d_last, &part_grads, &last_leaf)?;
            }
        }
        let tokens = part.tokens.len() - if k == 0 { 0 } else { p };
        out.push(PartResult { logprobs: lp, entropy, tokens, extra });
    }
    if backward {
        // The prefix's own targets' share and what the branches added to its last hidden
        // state, through the head; what they added to its keys and values, through the layers.
        let mut head_terms = Vec::new();
        if !g_prefix.is_empty() {
            head_terms.push(weighted_sum(&pre.logprobs, &g_prefix)?);
        }
        if let Some(d) = &d_last {
            head_terms.push(dot(&prefix.last, d)?);
        }
        let head_loss = sum(head_terms)?;
        if let Some(saved) = saved {
            crate::recompute::backward(base, lora, &prefix_row, saved, head_loss, &d_kv, grads)?;
        } else {
            // The graph is whole: one backward through all of it at once.
            let mut terms: Vec<Tensor> = head_loss.into_iter().collect();
            let pairs = prefix.kv.iter().flat_map(|(k, v)| [k, v]).zip(d_kv.iter().flat_map(|(dk, dv)| [dk, dv]));
            for (x, d) in pairs {
                if let Some(d) = d {
                    terms.push(dot(x, d)?);
                }
            }
            if let Some(total) = sum(terms)? {
                accumulate(grads, &total.backward().map_err(failed)?, vars)?;
            }
        }
    }
    Ok(out)
}
