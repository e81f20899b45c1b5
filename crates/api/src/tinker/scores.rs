//! The scores Tinker's `asample` may ask for beyond the sampled tokens' logprobs, read from the
//! request and written into the SDK's `SampleResponse` fields:
//! - top-k logprobs of prompt positions and of sampled tokens (`TopkLogprobs`: two dense
//!   `length x k` matrices, empty cells the SDK's sentinel `(0, -99999.0)`);
//! - `target_prompt_logprobs`: an int64 `[len(prompt) - 1, K]` tensor of token ids, dense or
//!   sparse CSR, `-1` asking nothing; answered in the same shape and layout as float32, 0.0
//!   where nothing was asked;
//! - `prompt_alt_tokens`: `k` draws at every position after the first, two dense tensors.

use super::pb;
use serde::Deserialize;
use tandem_core::inference::{PromptScores, RankedLogprob, TopLogprob};

/// The SDK's mark of an empty top-k cell (`tinker.types.topk_logprobs.MASK_LOGPROB`).
const MASK_LOGPROB: f32 = -99999.0;

/// A `TensorData` as the SDK sends it in JSON.
#[derive(Deserialize, Debug)]
pub struct TensorJson {
    data: Vec<serde_json::Value>,
    dtype: String,
    #[serde(default)]
    shape: Option<Vec<i64>>,
    #[serde(default)]
    sparse_crow_indices: Option<Vec<i64>>,
    #[serde(default)]
    sparse_col_indices: Option<Vec<i64>>,
}

/// `target_prompt_logprobs` read: its cells in data order, each with its row and, when it asks
/// for an id, its place in that row's list of ids.
#[derive(Debug)]
pub struct Targets {
    rows: usize,
    width: usize,
    /// Sparse CSR row pointers and column indices, returned as they came.
    csr: Option<(Vec<i64>, Vec<i64>)>,
    /// Per data cell: (row, index into that row's ids) or `None` for a `-1`.
    cells: Vec<Option<(usize, usize)>>,
    /// The ids each row asks for (what the engine scores).
    pub ids: Vec<Vec<u32>>,
}

impl Targets {
    /// Checks the tensor against a prompt of `prompt_len` tokens: exactly one row per position
    /// after the first, ids 0 or more (or -1), at least one id.
    pub fn read(t: &TensorJson, prompt_len: usize) -> Result<Targets, String> {
        if t.dtype != "int64" {
            return Err(format!("target_prompt_logprobs: dtype {:?}, expected int64 token ids", t.dtype));
        }
        let (rows, width) = match t.shape.as_deref() {
            Some(&[r, k]) if r >= 0 && k >= 1 => (r as usize, k as usize),
            other => return Err(format!("target_prompt_logprobs: shape {other:?}, expected [len(prompt) - 1, K]")),
        };
        if rows + 1 != prompt_len {
            return Err(format!(
                "target_prompt_logprobs has {rows} rows for a prompt of {prompt_len} tokens: expected len(prompt) - 1"
            ));
        }
        let mut values = Vec::with_capacity(t.data.len());
        for v in &t.data {
            match v.as_i64() {
                Some(id) if id >= -1 && id <= u32::MAX as i64 => values.push(id),
                _ => return Err(format!("target_prompt_logprobs: {v} is not a token id or -1")),
            }
        }
        let row_of: Vec<usize> = match (&t.sparse_crow_indices, &t.sparse_col_indices) {
            (None, None) => {
                if Some(values.len()) != rows.checked_mul(width) {
                    return Err(format!("target_prompt_logprobs: {} values for shape [{rows}, {width}]", values.len()));
                }
                (0..values.len()).map(|d| d / width).collect()
            }
            (Some(crow), Some(col)) => csr_rows(crow, col, rows, width, values.len())?,
            _ => return Err("target_prompt_logprobs: sparse_crow_indices and sparse_col_indices go together".into()),
        };
        let mut ids = vec![Vec::new(); rows];
        let cells = values
            .iter()
            .zip(&row_of)
            .map(|(id, row)| {
                (*id >= 0).then(|| {
                    ids[*row].push(*id as u32);
                    (*row, ids[*row].len() - 1)
                })
            })
            .collect::<Vec<_>>();
        if cells.iter().all(Option::is_none) {
            return Err("target_prompt_logprobs names no token id (every cell is -1)".into());
        }
        let csr = t.sparse_crow_indices.clone().zip(t.sparse_col_indices.clone());
        Ok(Targets { rows, width, csr, cells, ids })
    }

    /// The answer: the tensor's layout with each cell's logprob (0.0 for a `-1`).
    pub fn answer(&self, scored: &[Vec<f32>]) -> pb::Tensor {
        let values: Vec<u8> = self
            .cells
            .iter()
            .map(|c| c.and_then(|(r, i)| scored.get(r).and_then(|row| row.get(i)).copied()).unwrap_or(0.0))
            .flat_map(f32::to_le_bytes)
            .collect();
        let bytes = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let encoding = match &self.csr {
            None => pb::tensor::Encoding::Dense(values),
            Some((crow, col)) => pb::tensor::Encoding::SparseCsr(pb::SparseCsr {
                values,
                crow_indices: bytes(crow),
                col_indices: bytes(col),
            }),
        };
        pb::Tensor {
            encoding: Some(encoding),
            dtype: pb::DType::DtypeFloat32 as i32,
            shape: vec![self.rows as i64, self.width as i64],
        }
    }
}

/// The row of each stored value of a CSR matrix, after checking it describes one.
fn csr_rows(crow: &[i64], col: &[i64], rows: usize, width: usize, nnz: usize) -> Result<Vec<usize>, String> {
    let bad = |why: &str| Err(format!("target_prompt_logprobs: {why}"));
    if crow.len() != rows + 1 || crow.first() != Some(&0) || crow.last() != Some(&(nnz as i64)) {
        return bad("sparse_crow_indices must have len(rows) + 1 entries, from 0 to the number of values");
    }
    if col.len() != nnz {
        return bad("sparse_col_indices must have one entry per value");
    }
    if col.iter().any(|c| *c < 0 || *c as usize >= width) {
        return bad("a sparse column index is outside the shape");
    }
    let mut row_of = Vec::with_capacity(nnz);
    for (r, w) in crow.windows(2).enumerate() {
        if w[1] < w[0] {
            return bad("sparse_crow_indices must not decrease");
        }
        row_of.extend(std::iter::repeat_n(r, (w[1] - w[0]) as usize));
    }
    Ok(row_of)
}

/// One `TopkLogprobs` from per-position candidates (`None`: an empty row), each row the `k`
/// most likely of its candidates, padded with the SDK's sentinel.
pub fn topk(rows: &[Option<Vec<(u32, f32)>>], k: usize) -> pb::TopkLogprobs {
    let (mut ids, mut lps) = (Vec::with_capacity(rows.len() * k * 4), Vec::with_capacity(rows.len() * k * 4));
    for row in rows {
        let mut c = row.clone().unwrap_or_default();
        c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        c.dedup_by_key(|e| e.0);
        c.resize(k, (0, MASK_LOGPROB));
        for (id, lp) in &c[..k] {
            ids.extend_from_slice(&(*id as i32).to_le_bytes());
            lps.extend_from_slice(&lp.to_le_bytes());
        }
    }
    pb::TopkLogprobs { token_ids: ids, logprobs: lps, k: k as u32, length: rows.len() as u32 }
}

/// A prompt position's candidates as [`topk`] takes them.
pub fn ranked(r: &[RankedLogprob]) -> Vec<(u32, f32)> {
    r.iter().map(|e| (e.token_id, e.logprob)).collect()
}

/// A sampled token's candidates as [`topk`] takes them.
pub fn top(r: &[TopLogprob]) -> Vec<(u32, f32)> {
    r.iter().map(|e| (e.token_id, e.logprob)).collect()
}

/// `prompt_alt_tokens`: two dense `[rows, k]` tensors.
pub fn alt_tokens(scores: &PromptScores, k: usize) -> pb::PromptAltTokens {
    let rows = scores.alt.len() as i64;
    let dense = |bytes: Vec<u8>, dtype: pb::DType| pb::Tensor {
        encoding: Some(pb::tensor::Encoding::Dense(bytes)),
        dtype: dtype as i32,
        shape: vec![rows, k as i64],
    };
    let tokens = scores.alt.iter().flatten().flat_map(|(id, _)| (*id as i64).to_le_bytes()).collect();
    let logprobs = scores.alt.iter().flatten().flat_map(|(_, lp)| lp.to_le_bytes()).collect();
    pb::PromptAltTokens {
        tokens: Some(dense(tokens, pb::DType::DtypeInt64)),
        logprobs: Some(dense(logprobs, pb::DType::DtypeFloat32)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tensor(v: serde_json::Value) -> TensorJson {
        serde_json::from_value(v).unwrap()
    }

    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn dense_targets_are_answered_in_their_layout() {
        // A 4-token prompt: rows for positions 1..3, two columns.
        let t = tensor(json!({"data": [5, -1, -1, -1, 7, 5], "dtype": "int64", "shape": [3, 2]}));
        let targets = Targets::read(&t, 4).unwrap();
        assert_eq!(targets.ids, vec![vec![5], vec![], vec![7, 5]]);
        let answer = targets.answer(&[vec![-1.5], vec![], vec![-2.0, -3.0]]);
        let Some(pb::tensor::Encoding::Dense(b)) = &answer.encoding else { panic!("dense") };
        assert_eq!(floats(b), vec![-1.5, 0.0, 0.0, 0.0, -2.0, -3.0]);
        assert_eq!((answer.shape, answer.dtype), (vec![3, 2], pb::DType::DtypeFloat32 as i32));
    }

    #[test]
    fn sparse_targets_keep_their_indices() {
        // [[-1, 9], [-1, -1], [4, -1]] as CSR: two stored cells.
        let t = tensor(json!({"data": [9, 4], "dtype": "int64", "shape": [3, 2],
                              "sparse_crow_indices": [0, 1, 1, 2], "sparse_col_indices": [1, 0]}));
        let targets = Targets::read(&t, 4).unwrap();
        assert_eq!(targets.ids, vec![vec![9], vec![], vec![4]]);
        let answer = targets.answer(&[vec![-0.5], vec![], vec![-4.0]]);
        let Some(pb::tensor::Encoding::SparseCsr(csr)) = &answer.encoding else { panic!("sparse") };
        assert_eq!(floats(&csr.values), vec![-0.5, -4.0]);
        let longs = |b: &[u8]| b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
        assert_eq!((longs(&csr.crow_indices), longs(&csr.col_indices)), (vec![0, 1, 1, 2], vec![1, 0]));
    }

    #[test]
    fn malformed_targets_are_refused() {
        let read = |v: serde_json::Value, len: usize| Targets::read(&tensor(v), len).unwrap_err();
        assert!(read(json!({"data": [1, 2], "dtype": "int64", "shape": [2, 1]}), 4).contains("2 rows"));
        assert!(read(json!({"data": [1.5], "dtype": "float32", "shape": [1, 1]}), 2).contains("int64"));
        assert!(read(json!({"data": [1, 2, 3], "dtype": "int64", "shape": [2, 2]}), 3).contains("3 values"));
        assert!(read(json!({"data": [-1, -1], "dtype": "int64", "shape": [2, 1]}), 3).contains("no token id"));
        assert!(read(json!({"data": [-2], "dtype": "int64", "shape": [1, 1]}), 2).contains("not a token id"));
        assert!(read(json!({"data": [1], "dtype": "int64", "shape": [3]}), 4).contains("shape"));
        let csr = |crow: serde_json::Value, col: serde_json::Value| {
            read(
                json!({"data": [1, 2], "dtype": "int64", "shape": [2, 2],
                        "sparse_crow_indices": crow, "sparse_col_indices": col}),
                3,
            )
        };
        assert!(csr(json!([0, 1]), json!([0, 1])).contains("crow"));
        assert!(csr(json!([0, 2, 1]), json!([0, 1])).contains("crow"));
        assert!(csr(json!([0, 1, 2]), json!([0, 2])).contains("outside"));
        assert!(csr(json!([0, 2, 1]), json!([0, 1])).contains("crow"));
        let mixed = json!({"data": [1, 2], "dtype": "int64", "shape": [2, 1], "sparse_crow_indices": [0, 1, 2]});
        assert!(read(mixed, 3).contains("together"));
    }

    #[test]
    fn topk_rows_are_ranked_and_padded() {
        // A sampled token outside the top 2 is listed first by the engine; the top 2 win.
        let rows = vec![None, Some(vec![(8, -3.0), (2, -0.5), (4, -1.0)]), Some(vec![(1, -0.1)])];
        let m = topk(&rows, 2);
        assert_eq!((m.k, m.length), (2, 3));
        let ints = m.token_ids.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
        assert_eq!(ints, vec![0, 0, 2, 4, 1, 0]);
        assert_eq!(floats(&m.logprobs), vec![MASK_LOGPROB, MASK_LOGPROB, -0.5, -1.0, -0.1, MASK_LOGPROB]);
    }

    #[test]
    fn alternative_tokens_are_two_dense_tensors() {
        let scores =
            PromptScores { targets: vec![], alt: vec![vec![(3, -0.2), (3, -0.2)], vec![(6, -1.0), (2, -2.0)]] };
        let a = alt_tokens(&scores, 2);
        let t = a.tokens.unwrap();
        assert_eq!((t.shape, t.dtype), (vec![2, 2], pb::DType::DtypeInt64 as i32));
        let Some(pb::tensor::Encoding::Dense(b)) = &a.logprobs.unwrap().encoding else { panic!("dense") };
        assert_eq!(floats(b), vec![-0.2, -0.2, -1.0, -2.0]);
    }
}
