//! Packing trajectory sequences into rows, one optimizer step per row (contract §3).
//!
//! A row holds whole sequences up to the row length, each attending only to itself with
//! positions starting at 0, so a row computes exactly what its sequences would alone.
//! Consecutive sequences that share a prefix (a group's prompt, a history, a system prompt with
//! tools) are laid out as a prefix tree, as ART's own packer does: the prefix once, as a span of
//! its own, then each sequence's remainder as a branch span that attends to the whole prefix and
//! causally to itself, its positions continuing from the prefix's length. The prefix's forward
//! then runs once and its gradients sum over the branches by autograd: the same loss and
//! gradients as the unshared row, with the prompt trained once instead of once per sequence. A
//! row's length counts the shared tokens (ART's `packed_sequence_length` does too).
//!
//! Trajectories with advantage 0 are dropped; the weights and advantages of all trained tokens
//! are then normalised together (see [`crate::advantage`]).

use crate::advantage::normalise;
use tandem_core::sequences::Sequence;
use tandem_model::kernels::causal::Span;

/// One trajectory ready to pack.
#[derive(Debug, Clone)]
pub struct TrajectoryInput {
    pub advantage: f64,
    pub sequences: Vec<Sequence>,
}

/// One trained token of a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// Index in the row of the trained token; it is predicted from the row index before it in
    /// its sequence ([`Row::source`]).
    pub pos: usize,
    /// The span holding the end of the target's sequence (its branch, or the sequence's own
    /// span): one per sequence, so the loss's sequence-level ratio groups by it. `pos` lies in
    /// it or in its prefix.
    pub segment: usize,
    pub old_lp: f64,
    /// The sampler's logprob once `old_lp` has been recomputed (`precalculate_logprobs`); NaN.
    pub original_lp: f64,
    /// The KL penalty's reference logprob, filled in before training; NaN without a penalty.
    pub ref_lp: f64,
    pub advantage: f64,
    pub weight: f64,
    /// The token scored here when it is not the row's token at `pos`: a Tinker datum may name
    /// any target at a position (a recipe puts token 0 with advantage 0 at prompt positions).
    pub token: Option<u32>,
}

impl Target {
    /// The token whose logprob this target is.
    pub fn token_in(&self, row: &Row) -> u32 {
        self.token.unwrap_or(row.tokens[self.pos])
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub tokens: Vec<u32>,
    /// (start, length) of each span in `tokens`: a whole sequence, or a tree's prefix or branch.
    pub segments: Vec<(usize, usize)>,
    /// The span each span continues (a branch's prefix), by index; empty when no span has one.
    pub parents: Vec<Option<usize>>,
    pub targets: Vec<Target>,
    pub trajectories: usize,
    /// Set on the parts [`split`] cuts one tree into (the same value on each, consecutive):
    /// their span 0 is the tree's prefix, computed once for all of them ([`crate::tree`]).
    pub shared_prefix: Option<usize>,
}

impl Row {
    /// The span `seg` continues, if it is a branch.
    pub fn parent(&self, seg: usize) -> Option<usize> {
        self.parents.get(seg).copied().flatten()
    }

    /// The spans `seg` attends to before itself, outermost first.
    fn context(&self, seg: usize) -> Vec<(usize, usize)> {
        let mut chain = Vec::new();
        let mut at = self.parent(seg);
        while let Some(p) = at {
            chain.push(self.segments[p]);
            at = self.parent(p);
        }
        chain.reverse();
        chain
    }

    /// The position of span `seg`'s first token: how many tokens precede it in its sequence.
    pub fn offset(&self, seg: usize) -> usize {
        self.context(seg).iter().map(|(_, l)| l).sum()
    }

    /// Every span as the attention kernel reads it.
    pub fn spans(&self) -> Vec<Span> {
        (0..self.segments.len())
            .map(|seg| Span { start: self.segments[seg].0, len: self.segments[seg].1, context: self.context(seg) })
            .collect()
    }

    /// The row index whose hidden state predicts target `t`: the token before it in its
    /// sequence (the prefix's last token for a branch's first).
    pub fn source(&self, t: &Target) -> usize {
        let mut seg = t.segment;
        while t.pos < self.segments[seg].0 {
            match self.parent(seg) {
                Some(p) => seg = p,
                None => break,
            }
        }
        match self.parent(seg) {
            Some(p) if t.pos == self.segments[seg].0 => self.segments[p].0 + self.segments[p].1 - 1,
            _ => t.pos - 1,
        }
    }
}

/// Sequences share a prefix only from this many tokens on: a shorter one saves less than the
/// branches' gathered keys cost.
pub const MIN_SHARED: usize = 8;

/// Where [`lay_out`] put a sequence: its row, the span holding its end (its targets'
/// `segment`), and the row index of each of its tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub row: usize,
    pub segment: usize,
    pub index: Vec<usize>,
}

/// A tree being formed: consecutive sequences and the prefix length they all share (unused
/// while there is one).
struct Tree {
    members: Vec<usize>,
    shared: usize,
    /// The members' tokens before sharing.
    all: usize,
}

impl Tree {
    fn tokens(&self) -> usize {
        self.all - (self.members.len() - 1) * self.shared
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Lays sequences out in rows of at most `row_len` tokens, in order: a sequence joins the
/// current row if it fits, else starts the next one. With `share`, a sequence that shares at
/// least [`MIN_SHARED`] leading tokens with the tree before it joins that tree when that
/// takes fewer tokens than starting its own (every branch keeps at least one token). The
/// rows come back with their tokens and spans, no targets; `Err(i)`: sequence `i` is longer
/// than `row_len`.
pub fn lay_out(seqs: &[&[u32]], row_len: usize, share: bool) -> Result<(Vec<Row>, Vec<Placement>), usize> {
    let mut rows: Vec<Vec<Tree>> = Vec::new();
    // Tokens of the current row, its open tree included.
    let mut used = 0usize;
    for (i, s) in seqs.iter().enumerate() {
        if s.len() > row_len {
            return Err(i);
        }
        if let Some(tree) = rows.last_mut().and_then(|r| r.last_mut()).filter(|_| share) {
            let (first, k) = (seqs[tree.members[0]], tree.members.len());
            let current = if k == 1 { first.len().saturating_sub(1) } else { tree.shared };
            let l = common_prefix(first, s).min(current).min(s.len().saturating_sub(1));
            // Joining shrinks the k members' shared prefix from `current` to `l` and saves `l`
            // of the new sequence's tokens.
            let before = tree.tokens();
            let all = tree.all + s.len();
            let after = all - k * l;
            if l >= MIN_SHARED && k * l > (k - 1) * current && used - before + after <= row_len {
                tree.members.push(i);
                (tree.shared, tree.all) = (l, all);
                used = used - before + after;
                continue;
            }
        }
        if rows.is_empty() || used + s.len() > row_len {
            rows.push(Vec::new());
            used = 0;
        }
        rows.last_mut().expect("a row").push(Tree { members: vec![i], shared: 0, all: s.len() });
        used += s.len();
    }
    let mut placements: Vec<Option<Placement>> = vec![None; seqs.len()];
    let mut out = Vec::with_capacity(rows.len());
    for (ri, trees) in rows.iter().enumerate() {
        let mut row = Row::default();
        let span = |row: &mut Row, tokens: &[u32], parent: Option<usize>| {
            let start = row.tokens.len();
            row.segments.push((start, tokens.len()));
            row.parents.push(parent);
            row.tokens.extend_from_slice(tokens);
            (row.segments.len() - 1, start)
        };
        for tree in trees {
            if let [m] = tree.members[..] {
                let (segment, start) = span(&mut row, seqs[m], None);
                placements[m] = Some(Placement { row: ri, segment, index: (start..start + seqs[m].len()).collect() });
                continue;
            }
            let l = tree.shared;
            let (root, root_start) = span(&mut row, &seqs[tree.members[0]][..l], None);
            for &m in &tree.members {
                let (segment, start) = span(&mut row, &seqs[m][l..], Some(root));
                let index = (0..seqs[m].len()).map(|i| if i < l { root_start + i } else { start + i - l }).collect();
                placements[m] = Some(Placement { row: ri, segment, index });
            }
        }
        if row.parents.iter().all(Option::is_none) {
            row.parents.clear();
        }
        out.push(row);
    }
    Ok((out, placements.into_iter().map(|p| p.expect("every sequence is placed")).collect()))
}

/// ART's default row length: the longest sequence rounded up to a multiple of 2048, capped at the
/// context; `packed_sequence_length` overrides it.
pub fn row_length(longest: usize, configured: Option<u32>, context: usize) -> usize {
    match configured {
        Some(n) => n as usize,
        None => longest.div_ceil(2048).max(1).saturating_mul(2048).min(context),
    }
}

/// Packs trajectories into rows of at most `row_len` tokens, in order, groups' shared prompts
/// as prefix trees when `share` ([`lay_out`]).
pub fn pack(trajs: &[TrajectoryInput], row_len: usize, balance: f64, share: bool) -> Result<Vec<Row>, String> {
    // (trajectory, its weight, the sequence) of every sequence with a trained token.
    let mut placed: Vec<(usize, f64, &Sequence)> = Vec::new();
    for (ti, t) in trajs.iter().enumerate() {
        if t.advantage == 0.0 {
            continue;
        }
        // Tokens at position 0 have nothing to be predicted from and are not trained.
        let trained: usize = t.sequences.iter().map(|s| s.trained.iter().skip(1).filter(|x| **x).count()).sum();
        if trained == 0 {
            continue;
        }
        let weight = 1.0 / (trained as f64 + 1e-6);
        for s in &t.sequences {
            if s.tokens.len() > row_len {
                return Err(format!(
                    "trajectory {ti} has a sequence of {} tokens, longer than the packed sequence length {row_len}",
                    s.tokens.len()
                ));
            }
            if s.trained.iter().skip(1).any(|x| *x) {
                placed.push((ti, weight, s));
            }
        }
    }
    let tokens: Vec<&[u32]> = placed.iter().map(|(_, _, s)| s.tokens.as_slice()).collect();
    let (mut rows, placements) = lay_out(&tokens, row_len, share).map_err(|i| format!("sequence {i} too long"))?;
    let mut last_traj: Vec<Option<usize>> = vec![None; rows.len()];
    for ((ti, weight, s), p) in placed.iter().zip(&placements) {
        let row = &mut rows[p.row];
        for (i, _) in s.trained.iter().enumerate().skip(1).filter(|(_, x)| **x) {
            row.targets.push(Target {
                pos: p.index[i],
                segment: p.segment,
                old_lp: s.old_lp[i],
                original_lp: f64::NAN,
                ref_lp: f64::NAN,
                advantage: trajs[*ti].advantage,
                weight: *weight,
                token: None,
            });
        }
        // A trajectory's sequences are consecutive: count it once per row it reaches.
        if last_traj[p.row] != Some(*ti) {
            row.trajectories += 1;
            last_traj[p.row] = Some(*ti);
        }
    }
    let (mut a, mut w): (Vec<f64>, Vec<f64>) =
        rows.iter().flat_map(|r| r.targets.iter().map(|t| (t.advantage, t.weight))).unzip();
    normalise(&mut a, &mut w, balance);
    for (k, t) in rows.iter_mut().flat_map(|r| r.targets.iter_mut()).enumerate() {
        (t.advantage, t.weight) = (a[k], w[k]);
    }
    Ok(rows)
}

/// Splits a row into parts of whole trees with at most `max_tokens` tokens each (a longer
/// sequence is a part of its own; a larger tree is cut into parts of its prefix and some of its
/// branches, marked [`Row::shared_prefix`] so that the prefix runs once for all of them), spans
/// and positions renumbered within each part. The trainer runs forward and backward part by part and accumulates the
/// gradients, so memory is bounded by the part, not the row.
pub fn split(row: &Row, max_tokens: usize) -> Vec<Row> {
    let n = row.segments.len();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for seg in 0..n {
        if let Some(p) = row.parent(seg) {
            children[p].push(seg);
        }
    }
    let len = |seg: usize| row.segments[seg].1;
    // Each sequence's targets (by the span holding its end), in row order.
    let mut targets: Vec<Vec<&Target>> = vec![Vec::new(); n];
    for t in &row.targets {
        targets[t.segment].push(t);
    }
    let mut parts: Vec<Row> = Vec::new();
    let mut current = Row { trajectories: row.trajectories, ..Row::default() };
    for root in (0..n).filter(|&s| row.parent(s).is_none()) {
        // The branches in groups that fit a part beside the prefix (at least one each).
        let mut chunks: Vec<Vec<usize>> = vec![Vec::new()];
        for &b in &children[root] {
            let size = len(root) + chunks.last().into_iter().flatten().map(|&c| len(c)).sum::<usize>();
            if chunks.last().is_some_and(|c| !c.is_empty()) && size + len(b) > max_tokens {
                chunks.push(Vec::new());
            }
            chunks.last_mut().expect("a chunk").push(b);
        }
        let whole = chunks.len() == 1;
        for chunk in chunks {
            let size = len(root) + chunk.iter().map(|&c| len(c)).sum::<usize>();
            if !current.tokens.is_empty() && (!whole || current.tokens.len() + size > max_tokens) {
                parts.push(std::mem::replace(&mut current, Row { trajectories: row.trajectories, ..Row::default() }));
            }
            add_tree(&mut current, row, &targets, root, &chunk);
            if !whole {
                // A chunk of a tree is a part of its own, marked so the prefix runs once.
                current.shared_prefix = Some(root);
                parts.push(std::mem::replace(&mut current, Row { trajectories: row.trajectories, ..Row::default() }));
            }
        }
    }
    if !current.tokens.is_empty() {
        parts.push(current);
    }
    for p in &mut parts {
        if p.parents.iter().all(Option::is_none) {
            p.parents.clear();
        }
    }
    parts
}

/// Copies span `root` of `row` and its branches `chunk` (none: `root` is a whole sequence) into
/// `part`, with the targets of those sequences (`targets`: by sequence end span).
fn add_tree(part: &mut Row, row: &Row, targets: &[Vec<&Target>], root: usize, chunk: &[usize]) {
    let root_new = part.segments.len();
    // The span `seg` of the tree becomes span `root_new + k` starting at `new_starts[k]`.
    let mut new_starts = Vec::with_capacity(chunk.len() + 1);
    for (k, &seg) in std::iter::once(&root).chain(chunk).enumerate() {
        let (start, l) = row.segments[seg];
        new_starts.push(part.tokens.len());
        part.segments.push((part.tokens.len(), l));
        part.parents.push((k > 0).then_some(root_new));
        part.tokens.extend_from_slice(&row.tokens[start..start + l]);
    }
    let leaves = if chunk.is_empty() { std::slice::from_ref(&root) } else { chunk };
    for (i, &leaf) in leaves.iter().enumerate() {
        // The leaf's place among the copied spans (the root is 0).
        let k = if chunk.is_empty() { 0 } else { i + 1 };
        for t in &targets[leaf] {
            let (old_start, new_start) = if t.pos >= row.segments[leaf].0 {
                (row.segments[leaf].0, new_starts[k])
            } else {
                (row.segments[root].0, new_starts[0])
            };
            part.targets.push(Target { pos: t.pos - old_start + new_start, segment: root_new + k, ..**t });
        }
    }
}

/// About how many bytes one part's forward and backward keep alive: per token and layer, the
/// activations autograd saves (~24 hidden-sized and ~8 FFN-sized f32 vectors; 3 MB per token
/// for SmolLM2-135M, an upper bound of what was measured), plus the attention's scratch: two
/// score buffers per worker thread for the largest span (s x s for a sequence of s tokens, s x
/// (o + s) for a branch after a prefix of o; no (heads, s, s) tensors are kept: the backward
/// recomputes the scores). The trainer refuses a job whose largest part would
/// not fit in the memory the system has available, instead of being killed mid-job.
pub fn part_memory_bytes(part: &Row, n_layer: usize, hidden: usize, ffn: usize, threads: usize) -> u64 {
    let per_token = (n_layer * (24 * hidden + 8 * ffn) * 4) as u64;
    // A span of s tokens after o of context scores s x (o + s).
    let scores = (0..part.segments.len()).map(|seg| part.segments[seg].1 * (part.offset(seg) + part.segments[seg].1));
    per_token * part.tokens.len() as u64 + 2 * threads.max(1) as u64 * scores.max().unwrap_or(0) as u64 * 4
}

/// `MemAvailable` of `/proc/meminfo` text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(tokens: &[u32], trained: &[bool]) -> Sequence {
        let old_lp = trained.iter().map(|t| if *t { -0.5 } else { f64::NAN }).collect();
        Sequence { tokens: tokens.to_vec(), trained: trained.to_vec(), old_lp }
    }

    #[test]
    fn rows_fill_in_order_and_skip_zero_advantage() {
        let a = TrajectoryInput { advantage: 1.0, sequences: vec![seq(&[1, 2, 3], &[false, true, true])] };
        let zero = TrajectoryInput { advantage: 0.0, sequences: vec![seq(&[4, 5], &[false, true])] };
        let b = TrajectoryInput {
            advantage: -1.0,
            sequences: vec![seq(&[6, 7], &[false, true]), seq(&[8, 9, 10], &[false, false, true])],
        };
        let rows = pack(&[a, zero, b], 5, 0.0, true).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].tokens, vec![1, 2, 3, 6, 7]);
        assert_eq!(rows[0].segments, vec![(0, 3), (3, 2)]);
        assert_eq!(
            rows[0].targets.iter().map(|t| (t.pos, t.segment)).collect::<Vec<_>>(),
            vec![(1, 0), (2, 0), (4, 1)]
        );
        assert_eq!((rows[0].trajectories, rows[1].trajectories), (2, 1));
        assert_eq!(rows[1].targets.iter().map(|t| t.pos).collect::<Vec<_>>(), vec![2]);
        // Weights: a has 2 tokens (1/2 each), b has 2 (1/2 each): all equal -> normalised to 1.
        // Advantages +1, +1, -1, -1: mean(|A| w) = 1, unchanged.
        let all: Vec<(f64, f64)> =
            rows.iter().flat_map(|r| r.targets.iter().map(|t| (t.advantage, t.weight))).collect();
        for (got, want) in all.iter().zip([(1.0, 1.0), (1.0, 1.0), (-1.0, 1.0), (-1.0, 1.0)]) {
            assert!((got.0 - want.0).abs() < 1e-5 && (got.1 - want.1).abs() < 1e-5, "{all:?}");
        }
    }

    #[test]
    fn split_keeps_segments_whole_and_renumbers() {
        let a = TrajectoryInput { advantage: 1.0, sequences: vec![seq(&[1, 2, 3], &[false, true, true])] };
        let b = TrajectoryInput {
            advantage: -1.0,
            sequences: vec![seq(&[4, 5], &[false, true]), seq(&[6, 7, 8, 9], &[false, false, true, true])],
        };
        let row = pack(&[a, b], 100, 0.0, true).unwrap().remove(0);
        let parts = split(&row, 5);
        assert_eq!(
            parts.iter().map(|p| p.tokens.clone()).collect::<Vec<_>>(),
            vec![vec![1, 2, 3, 4, 5], vec![6, 7, 8, 9]]
        );
        assert_eq!(parts[1].segments, vec![(0, 4)]);
        assert_eq!(parts[1].targets.iter().map(|t| (t.pos, t.segment)).collect::<Vec<_>>(), vec![(2, 0), (3, 0)]);
        assert_eq!(
            parts[0].targets.iter().map(|t| (t.pos, t.segment)).collect::<Vec<_>>(),
            vec![(1, 0), (2, 0), (4, 1)]
        );
        // Targets keep their advantages and weights; the parts hold all of them.
        let all: Vec<(f64, f64)> =
            parts.iter().flat_map(|p| p.targets.iter().map(|t| (t.advantage, t.weight))).collect();
        assert_eq!(all, row.targets.iter().map(|t| (t.advantage, t.weight)).collect::<Vec<_>>());
        let whole = split(&row, 1000);
        assert_eq!((whole.len(), &whole[0].tokens, &whole[0].segments), (1, &row.tokens, &row.segments));
    }

    fn target(pos: usize, segment: usize) -> Target {
        Target {
            pos,
            segment,
            old_lp: 0.0,
            original_lp: f64::NAN,
            ref_lp: f64::NAN,
            advantage: 1.0,
            weight: 1.0,
            token: None,
        }
    }

    #[test]
    fn shared_prefixes_are_laid_out_once_as_trees() {
        let p: Vec<u32> = (100..112).collect();
        let s1 = [&p[..], &[1, 2, 3]].concat();
        let s2 = [&p[..], &[4, 5]].concat();
        // Shares 10 of the 12: the tree's prefix shrinks to 10 (2 x 10 > 1 x 12 tokens saved).
        let s3 = [&p[..10], &[6, 7, 8, 9]].concat();
        let other: Vec<u32> = (200..205).collect();
        let seqs = [&s1[..], &s2, &s3, &other];
        let (rows, places) = lay_out(&seqs, 100, true).unwrap();
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(r.segments, vec![(0, 10), (10, 5), (15, 4), (19, 4), (23, 5)]);
        assert_eq!(r.parents, vec![None, Some(0), Some(0), Some(0), None]);
        for (s, pl) in seqs.iter().zip(&places) {
            assert_eq!(pl.index.iter().map(|&i| r.tokens[i]).collect::<Vec<_>>(), *s);
        }
        assert_eq!(places.iter().map(|p| p.segment).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        assert_eq!((r.offset(0), r.offset(2), r.offset(4)), (0, 10, 0));
        assert_eq!(r.spans()[2], Span { start: 15, len: 4, context: vec![(0, 10)] });
        // A branch's first token is predicted from the prefix's last; a prefix token of a
        // sequence from the one before it.
        let sources: Vec<usize> = [(10, 1), (15, 2), (16, 2), (5, 3), (19, 3), (24, 4)]
            .iter()
            .map(|&(p, s)| r.source(&target(p, s)))
            .collect();
        assert_eq!(sources, vec![9, 9, 15, 4, 9, 23]);
        // Unshared: every sequence whole, 48 tokens instead of 28.
        let (flat, flat_places) = lay_out(&seqs, 100, false).unwrap();
        assert_eq!((flat[0].tokens.len(), r.tokens.len()), (48, 28));
        assert!(flat[0].parents.is_empty());
        assert_eq!(flat_places[1].index, (15..29).collect::<Vec<_>>());
    }

    #[test]
    fn trees_form_only_where_they_save_tokens_and_fit() {
        let p: Vec<u32> = (100..120).collect();
        let a = [&p[..], &[1]].concat();
        // Seven shared tokens are too few to share.
        let short = [&p[..7], &[2, 3]].concat();
        let (rows, _) = lay_out(&[&a[..], &short], 100, true).unwrap();
        assert_eq!(rows[0].segments, vec![(0, 21), (21, 9)]);
        // A sequence equal to another keeps one token in its branch; so does a copy of a
        // prefix of it.
        let (rows, places) = lay_out(&[&a[..], &a, &p[..15]], 100, true).unwrap();
        assert_eq!(rows[0].segments, vec![(0, 14), (14, 7), (21, 7), (28, 1)]);
        assert_eq!(places[2].index[14], 28);
        // Shrinking a prefix of 20 shared by three to 8 for a fourth would cost 2 x 12 more
        // than it saves: the fourth starts a tree of its own.
        let b = [&p[..8], &[9, 9, 9]].concat();
        let (rows, _) = lay_out(&[&a[..], &a, &a, &b], 1000, true).unwrap();
        assert_eq!(rows[0].parents, vec![None, Some(0), Some(0), Some(0), None]);
        // A tree that would overflow its row leaves the sequence to the next row.
        let (rows, places) = lay_out(&[&a[..], &a], 21, true).unwrap();
        assert_eq!((rows.len(), places[1].row), (2, 1));
        assert_eq!(lay_out(&[&a[..]], 20, true).unwrap_err(), 0);
    }

    #[test]
    fn split_keeps_trees_whole_or_repeats_their_prefix() {
        let p: Vec<u32> = (100..110).collect();
        let seqs = [
            [&p[..], &[1, 2, 3, 4, 5]].concat(),
            [&p[..], &[6, 7, 8, 9]].concat(),
            [&p[..], &[10, 11, 12, 13]].concat(),
            (200..205).collect(),
        ];
        let refs: Vec<&[u32]> = seqs.iter().map(|s| s.as_slice()).collect();
        let (mut rows, places) = lay_out(&refs, 100, true).unwrap();
        let row = &mut rows[0];
        // Every token after the first of every sequence is trained, prefix tokens included.
        for (k, pl) in places.iter().enumerate() {
            for i in 1..seqs[k].len() {
                row.targets.push(Target { old_lp: k as f64, ..target(pl.index[i], pl.segment) });
            }
        }
        let parts = split(row, 20);
        // The prefix with two branches (19 tokens); the prefix again with the third; the lone
        // sequence.
        assert_eq!(
            parts.iter().map(|p| p.segments.clone()).collect::<Vec<_>>(),
            vec![vec![(0, 10), (10, 5), (15, 4)], vec![(0, 10), (10, 4)], vec![(0, 5)]]
        );
        assert_eq!(parts[1].parents, vec![None, Some(0)]);
        assert_eq!(parts.iter().map(|p| p.shared_prefix).collect::<Vec<_>>(), vec![Some(0), Some(0), None]);
        // Each sequence's targets are in one part, reading the same tokens from the same
        // sources as in the row.
        let n: usize = parts.iter().map(|p| p.targets.len()).sum();
        assert_eq!(n, row.targets.len());
        for part in &parts {
            for t in &part.targets {
                let k = t.old_lp as usize;
                let i = (1..seqs[k].len()).find(|&i| seqs[k][i] == part.tokens[t.pos]).unwrap();
                assert_eq!(part.tokens[part.source(t)], seqs[k][i - 1], "sequence {k} token {i}");
            }
        }
        assert_eq!(parts[1].targets.iter().filter(|t| t.old_lp == 2.0).count(), 13);
        // Unbounded: the row as it is.
        let whole = split(row, 1000);
        assert_eq!((whole.len(), &whole[0].segments, &whole[0].parents), (1, &row.segments, &row.parents));
    }

    #[test]
    fn memory_estimate_and_meminfo() {
        let row = Row { tokens: vec![0; 1024], segments: vec![(0, 256); 4], ..Row::default() };
        // SmolLM2-135M: 30 x (24 x 576 + 8 x 1536) x 4 = 3,133,440 bytes per token;
        // attention scratch 2 x 2 threads x 256^2 x 4 = 1,048,576.
        assert_eq!(part_memory_bytes(&row, 30, 576, 1536, 2), 3_133_440 * 1024 + 1_048_576);
        let info = "MemTotal:       24682400 kB\nMemFree:         2991236 kB\nMemAvailable:   23765236 kB\n";
        assert_eq!(mem_available(info), Some(23_765_236 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB"), None);
    }

    #[test]
    fn too_long_sequences_and_row_lengths() {
        let a = TrajectoryInput { advantage: 1.0, sequences: vec![seq(&[1, 2, 3], &[false, true, true])] };
        assert!(pack(&[a], 2, 0.0, true).unwrap_err().contains("longer than the packed sequence length 2"));
        assert_eq!(row_length(10, None, 8192), 2048);
        assert_eq!(row_length(2049, None, 8192), 4096);
        assert_eq!(row_length(8000, None, 8192), 8192);
        assert_eq!(row_length(10, Some(512), 8192), 512);
    }
}
