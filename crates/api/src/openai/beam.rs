//! `use_beam_search`: drives [`tandem_core::beam`] with the engine the way vLLM's OpenAI server
//! does: each step submits one single-token request per live beam (prompt + that beam's tokens,
//! greedy, with the top `2 * width` raw logprobs), so the engine batches the beams and its prefix
//! cache serves the shared prompt. The result comes back as ordinary engine events, so the JSON
//! and SSE renderers treat it like any other generation.

use super::generate::submit_error;
use crate::error::{ApiError, ErrorKind};
use tandem_core::beam::{BeamParams, BeamSearch};
use tandem_core::inference::{FinishReason, InferEvent, ModelHandle, SamplingParams, TokenLogprob, ValidRequest};

/// What the search needs beyond the request.
pub struct BeamJob {
    pub width: usize,
    pub length_penalty: f64,
    /// `top_logprobs` asked for (shown with each chosen token).
    pub top_logprobs: usize,
    pub eos: u32,
}

/// Runs the search to the end and returns its result as engine events: `Started`, then for each
/// of the `width` best beams its tokens and a `Finished`.
pub async fn run(model: &ModelHandle, valid: ValidRequest, job: BeamJob) -> Result<Vec<InferEvent>, ApiError> {
    let req = valid.request();
    let p = &req.params;
    let params = BeamParams {
        width: job.width,
        length_penalty: job.length_penalty,
        eos: job.eos,
        ignore_eos: p.ignore_eos,
        include_eos: p.include_stop_str_in_output,
        prompt_len: req.prompt.len(),
    };
    let mut search = BeamSearch::<TokenLogprob>::new(params);
    let k = search.candidates_per_beam().max(job.top_logprobs);
    let mut cached_tokens = None;
    for step in 0..p.max_tokens {
        if search.live.is_empty() {
            break;
        }
        let mut receivers = Vec::with_capacity(search.live.len());
        for (i, beam) in search.live.iter().enumerate() {
            let mut prompt = req.prompt.clone();
            prompt.extend_from_slice(&beam.tokens);
            let params = SamplingParams {
                temperature: 0.0,
                max_tokens: 1,
                ignore_eos: true,
                logprobs: Some(k),
                skip_special_tokens: p.skip_special_tokens,
                ..SamplingParams::default()
            };
            let one = valid.beam_step(format!("{}-beam{step}.{i}", req.request_id), prompt, params);
            receivers.push(model.submit(one).map_err(submit_error)?);
        }
        let mut candidates = Vec::with_capacity(receivers.len());
        for mut rx in receivers {
            let mut top = None;
            loop {
                match rx.recv().await {
                    Some(InferEvent::Started { cached_tokens: c }) => {
                        cached_tokens.get_or_insert(c);
                    }
                    Some(InferEvent::Token { logprob, .. }) => top = logprob.map(|l| l.top),
                    Some(InferEvent::Finished { .. }) => break,
                    Some(InferEvent::Error(m)) => {
                        return Err(ApiError::new(ErrorKind::Internal, format!("generation failed: {m}")))
                    }
                    Some(InferEvent::PromptLogprobs(_) | InferEvent::PromptScores(_)) => {}
                    None => {
                        return Err(ApiError::new(
                            ErrorKind::Internal,
                            "the inference engine stopped during generation",
                        ))
                    }
                }
            }
            let mut top = top.ok_or_else(|| ApiError::new(ErrorKind::Internal, "the engine returned no logprobs"))?;
            top.sort_by(|a, b| b.logprob.total_cmp(&a.logprob));
            let shown: Vec<_> = top.iter().take(job.top_logprobs).cloned().collect();
            candidates.push(
                top.iter()
                    .take(2 * job.width)
                    .map(|t| (t.token_id, t.logprob, TokenLogprob { token: t.clone(), top: shown.clone() }))
                    .collect::<Vec<_>>(),
            );
        }
        search.step(&candidates);
    }
    // Materialising the beams and their text is linear in their length, but still CPU work:
    // on a blocking thread.
    let (model, skip) = (model.clone(), req.params.skip_special_tokens);
    let cached = cached_tokens.unwrap_or(0);
    tokio::task::spawn_blocking(move || {
        let mut events = vec![InferEvent::Started { cached_tokens: cached }];
        for (choice, beam) in search.best().into_iter().enumerate() {
            // The engine's incremental decoder: each token's text once, a split character held
            // back until it completes, the rest at the end.
            let (deltas, rest) = model
                .token_texts(&beam.tokens, skip)
                .map_err(|m| ApiError::new(ErrorKind::Internal, format!("detokenize failed: {m}")))?;
            for ((id, lp), text) in beam.tokens.iter().zip(beam.payloads.to_vec()).zip(deltas) {
                events.push(InferEvent::Token { choice, token_id: *id, text, logprob: Some(lp) });
            }
            let reason = if beam.finished { FinishReason::Stop } else { FinishReason::Length };
            events.push(InferEvent::Finished { choice, reason, stop_reason: None, text: rest });
        }
        Ok(events)
    })
    .await
    .map_err(|e| ApiError::new(ErrorKind::Internal, format!("beam search task failed: {e}")))?
}
