//! Packing trajectory sequences into rows, one optimizer step per row (contract §3).
//!
//! A row holds whole sequences (segments) up to the row length; each segment attends only to
//! itself with positions starting at 0, so a row computes exactly what its sequences would
//! alone. (ART also shares a group's prompt between its segments in a prefix tree; that saves
//! compute, not a different loss.) Trajectories with advantage 0 are dropped; the weights and
//! advantages of all trained tokens are then normalised together (see [`crate::advantage`]).

use crate::advantage::normalise;
use tandem_core::sequences::Sequence;

/// One trajectory ready to pack.
#[derive(Debug, Clone)]
pub struct TrajectoryInput {
    pub advantage: f64,
    pub sequences: Vec<Sequence>,
}

/// One trained token of a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// Index in the row of the trained token; it is predicted from position `pos - 1`.
    pub pos: usize,
    pub segment: usize,
    pub old_lp: f64,
    /// The sampler's logprob once `old_lp` has been recomputed (`precalculate_logprobs`); NaN.
    pub original_lp: f64,
    /// The KL penalty's reference logprob, filled in before training; NaN without a penalty.
    pub ref_lp: f64,
    pub advantage: f64,
    pub weight: f64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub tokens: Vec<u32>,
    /// (start, length) of each segment in `tokens`.
    pub segments: Vec<(usize, usize)>,
    pub targets: Vec<Target>,
    pub trajectories: usize,
}

/// ART's default row length: the longest sequence rounded up to a multiple of 2048, capped at the
/// context; `packed_sequence_length` overrides it.
pub fn row_length(longest: usize, configured: Option<u32>, context: usize) -> usize {
    match configured {
        Some(n) => n as usize,
        None => longest.div_ceil(2048).max(1).saturating_mul(2048).min(context),
    }
}

/// Packs trajectories into rows of at most `row_len` tokens, in order (a sequence goes into the
/// current row if it fits, else it starts a new one).
pub fn pack(trajs: &[TrajectoryInput], row_len: usize, balance: f64) -> Result<Vec<Row>, String> {
    let mut rows: Vec<Row> = Vec::new();
    let mut current = Row::default();
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
        let mut counted = false;
        for s in &t.sequences {
            if s.tokens.len() > row_len {
                return Err(format!(
                    "trajectory {ti} has a sequence of {} tokens, longer than the packed sequence length {row_len}",
                    s.tokens.len()
                ));
            }
            if s.trained.iter().skip(1).all(|x| !*x) {
                continue;
            }
            if current.tokens.len() + s.tokens.len() > row_len {
                rows.push(std::mem::take(&mut current));
                counted = false;
            }
            let start = current.tokens.len();
            let segment = current.segments.len();
            current.segments.push((start, s.tokens.len()));
            current.tokens.extend_from_slice(&s.tokens);
            for (i, _) in s.trained.iter().enumerate().skip(1).filter(|(_, x)| **x) {
                current.targets.push(Target {
                    pos: start + i,
                    segment,
                    old_lp: s.old_lp[i],
                    original_lp: f64::NAN,
                    ref_lp: f64::NAN,
                    advantage: t.advantage,
                    weight,
                });
            }
            if !counted {
                current.trajectories += 1;
                counted = true;
            }
        }
    }
    if !current.tokens.is_empty() {
        rows.push(current);
    }
    let (mut a, mut w): (Vec<f64>, Vec<f64>) =
        rows.iter().flat_map(|r| r.targets.iter().map(|t| (t.advantage, t.weight))).unzip();
    normalise(&mut a, &mut w, balance);
    for (k, t) in rows.iter_mut().flat_map(|r| r.targets.iter_mut()).enumerate() {
        (t.advantage, t.weight) = (a[k], w[k]);
    }
    Ok(rows)
}

/// Splits a row into parts of whole segments with at most `max_tokens` tokens each (a longer
/// segment is a part of its own), positions and segment ids renumbered within each part. The
/// trainer runs forward and backward part by part and accumulates the gradients, so memory is
/// bounded by the part, not the row.
pub fn split(row: &Row, max_tokens: usize) -> Vec<Row> {
    let mut parts: Vec<Row> = Vec::new();
    let mut current = Row { trajectories: row.trajectories, ..Row::default() };
    let mut targets = row.targets.iter().peekable();
    for (seg, &(start, len)) in row.segments.iter().enumerate() {
        if !current.tokens.is_empty() && current.tokens.len() + len > max_tokens {
            parts.push(std::mem::replace(&mut current, Row { trajectories: row.trajectories, ..Row::default() }));
        }
        let offset = current.tokens.len();
        let new_seg = current.segments.len();
        current.segments.push((offset, len));
        current.tokens.extend_from_slice(&row.tokens[start..start + len]);
        while let Some(t) = targets.next_if(|t| t.segment == seg) {
            current.targets.push(Target { pos: t.pos - start + offset, segment: new_seg, ..*t });
        }
    }
    if !current.tokens.is_empty() {
        parts.push(current);
    }
    parts
}

/// About how many bytes one part's forward and backward keep alive: per token and layer, the
/// activations autograd saves (~24 hidden-sized and ~8 FFN-sized f32 vectors; 3 MB per token
/// for SmolLM2-135M, an upper bound of what was measured), plus the attention's scratch: two
/// s x s score buffers per worker thread for the longest segment (no (heads, s, s) tensors are
/// kept; the backward recomputes the scores). The trainer refuses a job whose largest part would
/// not fit in the memory the system has available, instead of being killed mid-job.
pub fn part_memory_bytes(part: &Row, n_layer: usize, hidden: usize, ffn: usize, threads: usize) -> u64 {
    let per_token = (n_layer * (24 * hidden + 8 * ffn) * 4) as u64;
    let longest = part.segments.iter().map(|(_, s)| *s).max().unwrap_or(0) as u64;
    per_token * part.tokens.len() as u64 + 2 * threads.max(1) as u64 * longest * longest * 4
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
        let rows = pack(&[a, zero, b], 5, 0.0).unwrap();
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
        let row = pack(&[a, b], 100, 0.0).unwrap().remove(0);
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
        assert!(pack(&[a], 2, 0.0).unwrap_err().contains("longer than the packed sequence length 2"));
        assert_eq!(row_length(10, None, 8192), 2048);
        assert_eq!(row_length(2049, None, 8192), 4096);
        assert_eq!(row_length(8000, None, 8192), 8192);
        assert_eq!(row_length(10, Some(512), 8192), 512);
    }
}
