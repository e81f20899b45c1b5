//! A `forward_backward` request's datums read into plain numbers, and its result encoded, as
//! the SDK's `proto/request_conv.py` and `response_conv.py` write and read them
//! (docs/research/tinker-sdk-0.38.md §5).
//!
//! Every check that needs only the request happens here, before any work is queued: a datum
//! whose inputs are of the wrong dtype, shape or length, or not finite, is a clear error naming
//! the datum and the key. Token ids against the vocabulary are the trainer's to check.

use super::pb;
use std::collections::BTreeMap;
pub use tandem_core::tinker::Datum;

/// Most elements one loss input may hold (a datum's targets are bounded by the context, far
/// below this; the bound keeps a forged shape from allocating).
const MAX_ELEMENTS: usize = 1 << 22;

/// The keys a datum's `loss_fn_inputs` may hold besides `target_tokens` (the SDK's own list).
pub const INPUT_KEYS: [&str; 6] =
    ["weights", "advantages", "logprobs", "clip_low_threshold", "clip_high_threshold", "sequence_ratio_mask"];

/// Most datums one `forward_backward` call may hold (the SDK sends at most 1,024 a call: it
/// cuts larger batches into chunks).
pub const MAX_DATUMS: usize = 4096;
/// Most messages (datums, chunks, loss inputs, spans, config entries) one call may hold. Each
/// decodes to a struct of ~100-200 bytes from as little as two bytes on the wire, so this bound,
/// checked before decoding, is what keeps an 8 MiB body from becoming gigabytes.
pub const MAX_MESSAGES: usize = 1 << 16;

/// Counts a `ForwardBackwardRequest`'s datums and inner messages by walking the wire format,
/// without decoding anything: a body past [`MAX_DATUMS`] or [`MAX_MESSAGES`] is refused before
/// it costs memory. Malformed wire data is left for the decoder to name.
pub fn check_shape(body: &[u8]) -> Result<(), String> {
    let (mut datums, mut messages) = (0usize, 0usize);
    for field in Fields(body) {
        let Ok((number, value)) = field else { return Ok(()) };
        match (number, value) {
            (3, Some(datum)) => {
                datums += 1;
                messages += 1 + Fields(datum).filter(|f| matches!(f, Ok((1..=4, Some(_))))).count();
            }
            (5 | 7, Some(_)) => messages += 1,
            _ => {}
        }
        if datums > MAX_DATUMS {
            return Err(format!("the call holds more than {MAX_DATUMS} datums; send them in several calls"));
        }
        if messages > MAX_MESSAGES {
            return Err(format!(
                "the call holds more than {MAX_MESSAGES} messages (datums, chunks, loss inputs); send them in several calls"
            ));
        }
    }
    Ok(())
}

/// The top-level fields of a protobuf message: (field number, its bytes when length-delimited).
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Option<&'a [u8]>), ()>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = (|| {
            let key = varint(&mut self.0)?;
            let value = match key & 7 {
                0 => varint(&mut self.0).map(|_| None)?,
                1 => self.skip(8).map(|_| None)?,
                2 => {
                    let len = usize::try_from(varint(&mut self.0)?).map_err(|_| ())?;
                    Some(self.skip(len)?)
                }
                5 => self.skip(4).map(|_| None)?,
                _ => return Err(()),
            };
            Ok((key >> 3, value))
        })();
        if field.is_err() {
            self.0 = &[];
        }
        Some(field)
    }
}

impl<'a> Fields<'a> {
    fn skip(&mut self, n: usize) -> Result<&'a [u8], ()> {
        if n > self.0.len() {
            return Err(());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
}

fn varint(buf: &mut &[u8]) -> Result<u64, ()> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&b, rest) = buf.split_first().ok_or(())?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err(())
}

/// The model input's tokens: its text chunks' int32 little-endian ids, concatenated. Image and
/// audio chunks are refused (no served model reads them).
pub fn model_tokens(chunks: &[pb::Chunk]) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for chunk in chunks {
        match &chunk.chunk {
            Some(pb::chunk::Chunk::EncodedText(t)) => {
                if t.tokens.len() % 4 != 0 {
                    return Err(format!(
                        "a text chunk holds {} bytes, not a whole number of int32 ids",
                        t.tokens.len()
                    ));
                }
                for b in t.tokens.chunks_exact(4) {
                    let id = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    out.push(u32::try_from(id).map_err(|_| format!("token id {id} is negative"))?);
                }
            }
            Some(pb::chunk::Chunk::Image(_)) => {
                return Err("image chunks are not served: no served model reads images".into())
            }
            Some(pb::chunk::Chunk::Dmel(_)) => {
                return Err("dmel chunks are not served: no served model reads audio".into())
            }
            None => return Err("a model input chunk is empty".into()),
        }
    }
    Ok(out)
}

/// A 1-D tensor's values as f64 (float32, bfloat16, int32, int64). Sparse and multi-dimensional
/// tensors are refused: every loss served takes one value per target.
fn values(t: &pb::Tensor) -> Result<Vec<f64>, String> {
    let dense = match &t.encoding {
        Some(pb::tensor::Encoding::Dense(d)) => d,
        Some(pb::tensor::Encoding::SparseCsr(_)) => {
            return Err("is sparse (CSR): only one value per target (a 1-D tensor) is served".into())
        }
        None => return Err("has no data".into()),
    };
    // The dtype picks the width and the decoder once, not per value.
    let (width, decode): (usize, fn(&[u8]) -> f64) = match pb::DType::try_from(t.dtype) {
        Ok(pb::DType::DtypeFloat32) => (4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64),
        Ok(pb::DType::DtypeInt32) => (4, |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64),
        Ok(pb::DType::DtypeInt64) => {
            (8, |b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f64)
        }
        // bfloat16 is the high half of a float32.
        Ok(pb::DType::DtypeBfloat16) => {
            (2, |b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16) as f64)
        }
        _ => return Err(format!("has dtype {}, not float32, bfloat16, int32 or int64", t.dtype)),
    };
    if dense.len() % width != 0 {
        return Err(format!("holds {} bytes, not a whole number of {width}-byte values", dense.len()));
    }
    let n = dense.len() / width;
    if n > MAX_ELEMENTS {
        return Err(format!("holds {n} values, more than {MAX_ELEMENTS}"));
    }
    match t.shape.as_slice() {
        [] => {}
        [len] if *len == n as i64 => {}
        shape => return Err(format!("has shape {shape:?} for {n} values: only 1-D tensors are served")),
    }
    Ok(dense.chunks_exact(width).map(decode).collect())
}

/// Reads one datum: its tokens, its `target_tokens` (integer ids, one per input token) and its
/// other loss inputs (finite, as many as the targets). `index` names it in errors.
pub fn datum(d: &pb::Datum, index: usize) -> Result<Datum, String> {
    let at = |key: &str, e: String| format!("datum {index}: loss_fn_inputs[{key:?}] {e}");
    let tokens = model_tokens(&d.model_input).map_err(|e| format!("datum {index}: {e}"))?;
    if tokens.is_empty() {
        return Err(format!("datum {index}: the model input is empty"));
    }
    let t = d
        .loss_fn_inputs
        .get("target_tokens")
        .ok_or_else(|| format!("datum {index}: loss_fn_inputs lacks \"target_tokens\""))?;
    if !matches!(pb::DType::try_from(t.dtype), Ok(pb::DType::DtypeInt64) | Ok(pb::DType::DtypeInt32)) {
        return Err(at("target_tokens", format!("has dtype {}, not an integer type", t.dtype)));
    }
    let targets: Vec<u32> = values(t)
        .map_err(|e| at("target_tokens", e))?
        .into_iter()
        .map(|v| if (0.0..=u32::MAX as f64).contains(&v) { Ok(v as u32) } else { Err(v) })
        .collect::<Result<_, f64>>()
        .map_err(|v| at("target_tokens", format!("holds the id {v}")))?;
    if targets.len() != tokens.len() {
        return Err(at(
            "target_tokens",
            format!("has {} ids for {} input tokens (position i predicts target i)", targets.len(), tokens.len()),
        ));
    }
    let mut inputs = BTreeMap::new();
    for (key, tensor) in &d.loss_fn_inputs {
        if key == "target_tokens" {
            continue;
        }
        if !INPUT_KEYS.contains(&key.as_str()) {
            return Err(at(key, format!("is not a loss input (known: target_tokens, {})", INPUT_KEYS.join(", "))));
        }
        let v = values(tensor).map_err(|e| at(key, e))?;
        if v.len() != targets.len() {
            return Err(at(key, format!("has {} values for {} targets", v.len(), targets.len())));
        }
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(at(key, format!("holds {} at position {i}", v[i])));
        }
        inputs.insert(key.clone(), v);
    }
    Ok(Datum { tokens, targets, inputs })
}

/// A call's datums and its loss settings (numbers only: the served losses take no text).
pub type Call = (Vec<Datum>, Vec<(String, f64)>);

/// A `forward_backward` body read as the route reads it: bounded ([`check_shape`]), decoded,
/// its datums read and their tokens held to `budget` (`--max-job-tokens`). The outer error is a
/// body that is not a request at all (no `seq_id` to consume); the inner one fails the call in
/// order. The request comes back without its datums (they are in the [`Call`]). Runs on a
/// blocking thread; never panics on any bytes (`the_body_reader_survives_any_bytes`).
pub fn read_request(body: &[u8], budget: u64) -> Result<(pb::ForwardBackwardRequest, Result<Call, String>), String> {
    use prost::Message;
    check_shape(body)?;
    let req = pb::ForwardBackwardRequest::decode(body)
        .map_err(|e| format!("the body is not a ForwardBackwardRequest protobuf: {e}"))?;
    let read = read_call(&req).and_then(|call| {
        let tokens: u64 = call.0.iter().map(|d| d.tokens.len() as u64).sum();
        if tokens > budget {
            return Err(format!(
                "the call holds {tokens} tokens, more than one call may train (--max-job-tokens {budget})"
            ));
        }
        Ok(call)
    });
    Ok((pb::ForwardBackwardRequest { data: Vec::new(), ..req }, read))
}

/// The datums and loss settings of a decoded request (`loss_fn_config_v2` numbers join the
/// older map's; text values are refused).
pub fn read_call(req: &pb::ForwardBackwardRequest) -> Result<Call, String> {
    let data = req.data.iter().enumerate().map(|(i, d)| datum(d, i)).collect::<Result<Vec<_>, _>>()?;
    let mut config: Vec<(String, f64)> = req.loss_fn_config.iter().map(|(k, v)| (k.clone(), *v)).collect();
    for (k, v) in &req.loss_fn_config_v2 {
        match &v.value {
            Some(pb::loss_config_value::Value::Number(n)) if !config.iter().any(|(c, _)| c == k) => {
                config.push((k.clone(), *n))
            }
            Some(pb::loss_config_value::Value::Text(_)) => {
                return Err(format!("loss_fn_config {k:?} is text; the served losses take numbers"))
            }
            _ => {}
        }
    }
    Ok((data, config))
}

/// A `forward_backward` (or `forward`) result: each datum's target logprobs as one float32
/// field `logprobs` (all datums concatenated, int64 byte offsets), and the metrics, each key
/// `name:reduction` as the SDK splits them (`loss:sum` always).
pub fn output(logprobs: &[Vec<f32>], metrics: &[(&str, f64)]) -> pb::ForwardBackwardOutput {
    let mut data = Vec::with_capacity(logprobs.iter().map(|l| l.len() * 4).sum());
    let mut offsets = Vec::with_capacity((logprobs.len() + 1) * 8);
    offsets.extend_from_slice(&0i64.to_le_bytes());
    for lp in logprobs {
        for v in lp {
            data.extend_from_slice(&v.to_le_bytes());
        }
        offsets.extend_from_slice(&(data.len() as i64).to_le_bytes());
    }
    let field = pb::BatchedTensor { data, offsets, dtype: pb::DType::DtypeFloat32 as i32, trailing_shape: vec![] };
    let record = pb::ArrayRecord {
        type_tag: "ArrayRecord".into(),
        fields: [("logprobs".to_string(), field)].into_iter().collect(),
        num_datums: logprobs.len() as i64,
    };
    pb::ForwardBackwardOutput {
        loss_fn_output_type: "ArrayRecord".into(),
        loss_fn_outputs: vec![record],
        metrics: metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn text(ids: &[i32]) -> pb::Chunk {
        let tokens = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        pb::Chunk { chunk: Some(pb::chunk::Chunk::EncodedText(pb::EncodedTextChunk { tokens })) }
    }

    fn f32s(v: &[f32]) -> pb::Tensor {
        pb::Tensor {
            encoding: Some(pb::tensor::Encoding::Dense(v.iter().flat_map(|x| x.to_le_bytes()).collect())),
            dtype: pb::DType::DtypeFloat32 as i32,
            shape: vec![v.len() as i64],
        }
    }

    fn i64s(v: &[i64]) -> pb::Tensor {
        pb::Tensor {
            encoding: Some(pb::tensor::Encoding::Dense(v.iter().flat_map(|x| x.to_le_bytes()).collect())),
            dtype: pb::DType::DtypeInt64 as i32,
            shape: vec![v.len() as i64],
        }
    }

    fn datum_of(inputs: Vec<(&str, pb::Tensor)>) -> pb::Datum {
        pb::Datum {
            model_input: vec![text(&[5, 6]), text(&[7])],
            loss_fn_inputs: inputs.into_iter().map(|(k, t)| (k.to_string(), t)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_datum_reads_its_chunks_targets_and_inputs() {
        let d = datum_of(vec![("target_tokens", i64s(&[6, 7, 8])), ("weights", f32s(&[0.0, 1.0, -0.5]))]);
        // Through the wire and back, as the SDK sends it.
        let d = pb::Datum::decode(d.encode_to_vec().as_slice()).unwrap();
        let got = datum(&d, 0).unwrap();
        assert_eq!(got.tokens, vec![5, 6, 7]);
        assert_eq!(got.targets, vec![6, 7, 8]);
        assert_eq!(got.inputs["weights"], vec![0.0, 1.0, -0.5]);
    }

    #[test]
    fn bfloat16_and_int32_values_widen_exactly() {
        let bf = pb::Tensor {
            // 1.0 and -2.5 in bfloat16: the high halves of their float32 bits.
            encoding: Some(pb::tensor::Encoding::Dense(vec![0x80, 0x3f, 0x20, 0xc0, 0, 0])),
            dtype: pb::DType::DtypeBfloat16 as i32,
            shape: vec![3],
        };
        assert_eq!(values(&bf).unwrap(), vec![1.0, -2.5, 0.0]);
        let i = pb::Tensor {
            encoding: Some(pb::tensor::Encoding::Dense([-3i32, 9].iter().flat_map(|x| x.to_le_bytes()).collect())),
            dtype: pb::DType::DtypeInt32 as i32,
            shape: vec![],
        };
        assert_eq!(values(&i).unwrap(), vec![-3.0, 9.0]);
    }

    #[test]
    fn bad_datums_are_named_errors() {
        let cases: Vec<(pb::Datum, &str)> = vec![
            (datum_of(vec![("weights", f32s(&[1.0; 3]))]), "lacks \"target_tokens\""),
            (datum_of(vec![("target_tokens", f32s(&[1.0; 3]))]), "not an integer type"),
            (datum_of(vec![("target_tokens", i64s(&[1, 2]))]), "2 ids for 3 input tokens"),
            (datum_of(vec![("target_tokens", i64s(&[1, -2, 3]))]), "holds the id -2"),
            (datum_of(vec![("target_tokens", i64s(&[1, 2, 3])), ("weights", f32s(&[1.0; 2]))]), "2 values for 3"),
            (datum_of(vec![("target_tokens", i64s(&[1, 2, 3])), ("advantages", f32s(&[1.0, f32::NAN, 0.0]))]), "NaN"),
            (datum_of(vec![("target_tokens", i64s(&[1, 2, 3])), ("rewards", f32s(&[1.0; 3]))]), "not a loss input"),
        ];
        for (d, want) in cases {
            let e = datum(&d, 4).unwrap_err();
            assert!(e.starts_with("datum 4") && e.contains(want), "{e:?} lacks {want:?}");
        }
        let mut two_d = i64s(&[1, 2, 3, 4, 5, 6]);
        two_d.shape = vec![3, 2];
        assert!(values(&two_d).unwrap_err().contains("only 1-D"));
        let sparse = pb::Tensor {
            encoding: Some(pb::tensor::Encoding::SparseCsr(pb::SparseCsr::default())),
            dtype: pb::DType::DtypeFloat32 as i32,
            shape: vec![1_000_000, 1_000_000],
        };
        assert!(values(&sparse).unwrap_err().contains("sparse"));
        let ragged = pb::Tensor { encoding: Some(pb::tensor::Encoding::Dense(vec![0; 7])), dtype: 1, shape: vec![] };
        assert!(values(&ragged).unwrap_err().contains("7 bytes"));
        assert!(model_tokens(&[text(&[-1])]).unwrap_err().contains("negative"));
        let image = pb::Chunk { chunk: Some(pb::chunk::Chunk::Image(pb::ImageChunk::default())) };
        assert!(model_tokens(&[image]).unwrap_err().contains("image"));
    }

    #[test]
    fn outputs_carry_byte_offsets_per_datum() {
        let out = output(&[vec![-1.0, -2.0, -3.0], vec![-0.5, -0.25]], &[("loss:sum", 6.75)]);
        let out = pb::ForwardBackwardOutput::decode(out.encode_to_vec().as_slice()).unwrap();
        let rec = &out.loss_fn_outputs[0];
        assert_eq!(rec.num_datums, 2);
        let f = &rec.fields["logprobs"];
        let offsets: Vec<i64> = f.offsets.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect();
        // Three float32 values, then two: byte offsets 0, 12, 20.
        assert_eq!(offsets, vec![0, 12, 20]);
        assert_eq!(f.data.len(), 20);
        assert_eq!(f32::from_le_bytes(f.data[12..16].try_into().unwrap()), -0.5);
        assert_eq!(out.metrics["loss:sum"], 6.75);
        assert_eq!(out.loss_fn_output_type, "ArrayRecord");
    }

    /// Issue 50: 4M empty datums in an 8 MiB body decoded to +768 MB; the walk refuses them
    /// before decoding, and passes what the SDK sends.
    #[test]
    fn the_shape_is_bounded_before_decoding() {
        let datum = pb::Datum {
            model_input: vec![text(&[1, 2, 3])],
            loss_fn_inputs: [("target_tokens".to_string(), i64s(&[2, 3, 4])), ("weights".into(), f32s(&[1.0; 3]))]
                .into(),
            ..Default::default()
        };
        let ok = pb::ForwardBackwardRequest {
            model_id: "m".into(),
            seq_id: 1,
            data: vec![datum.clone(); 1024],
            loss_fn: "cross_entropy".into(),
            ..Default::default()
        };
        assert_eq!(check_shape(&ok.encode_to_vec()), Ok(()));
        let many = pb::ForwardBackwardRequest { data: vec![pb::Datum::default(); MAX_DATUMS + 1], ..ok.clone() };
        assert!(check_shape(&many.encode_to_vec()).unwrap_err().contains("datums"));
        let chunks = pb::Datum { model_input: vec![text(&[]); MAX_MESSAGES], ..datum };
        let wide = pb::ForwardBackwardRequest { data: vec![chunks], ..ok };
        assert!(check_shape(&wide.encode_to_vec()).unwrap_err().contains("messages"));
        // Malformed bytes are the decoder's to name.
        assert_eq!(check_shape(&[0xff, 0xff]), Ok(()));
    }

    /// Any bytes through the route's reader: mutations of a valid request (flipped bytes, cut
    /// tails, repeated spans) decode to an error or a call, never a panic (issue 50 asks the
    /// bodies to have no panic path; `fuzz/fuzz_targets/tinker_body.rs` runs the same reader
    /// under libFuzzer with the losses' checks and math).
    #[test]
    fn the_body_reader_survives_any_bytes() {
        let datum = pb::Datum {
            model_input: vec![text(&[1, 2, 3, 4])],
            loss_fn_inputs: [
                ("target_tokens".to_string(), i64s(&[2, 3, 4, 5])),
                ("advantages".into(), f32s(&[1.0, -1.0, 0.5, 0.0])),
                ("logprobs".into(), f32s(&[-1.0; 4])),
            ]
            .into(),
            ..Default::default()
        };
        let good = pb::ForwardBackwardRequest {
            model_id: "m".into(),
            seq_id: 3,
            data: vec![datum.clone(), datum],
            loss_fn: "ppo".into(),
            loss_fn_config: [("clip_low_threshold".to_string(), 0.9)].into(),
            ..Default::default()
        }
        .encode_to_vec();
        let (head, call) = read_request(&good, 1 << 20).unwrap();
        assert_eq!((head.seq_id, call.unwrap().0.len()), (3, 2));
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let mut b = good.clone();
            match next() % 3 {
                0 => {
                    for _ in 0..1 + next() % 4 {
                        let i = (next() as usize) % b.len();
                        b[i] = next() as u8;
                    }
                }
                1 => b.truncate((next() as usize) % b.len()),
                _ => {
                    let (i, n) = ((next() as usize) % b.len(), 1 + (next() as usize) % 16);
                    let span: Vec<u8> = b[i..(i + n).min(b.len())].to_vec();
                    b.splice(i..i, span.iter().copied().cycle().take(span.len() * (1 + (next() as usize) % 64)));
                }
            }
            let _ = read_request(&b, 1 << 20);
        }
    }
}
