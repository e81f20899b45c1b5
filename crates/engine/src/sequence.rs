//! One choice of a request as it runs: its KV cache, sampler state, text state, and the rules
//! that end it. What all choices of a request share (prompt, sampling, adapter, channel) sits
//! once behind an `Arc` ([`RequestParts`]); a [`Seq`] holds only its own choice's state.

/// KV positions a request of `n` choices needs to start: the prompt and a first token once, and a
/// tile for each further choice (forks share the prompt's whole tiles and copy the partial last
/// one, which leaves room for their first token).
pub fn start_reserve(prompt_len: usize, n: usize) -> usize {
    prompt_len + 1 + n.saturating_sub(1) * KEY_TILE
}

use crate::engine::Job;
use crate::metrics::{EngineMetrics, Timeline};
use crate::sampler::{self, History};
use crate::stop::StopStrings;
use crate::tokenizer::{IncrementalDecoder, TextTokenizer};
use llguidance::Matcher;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::time::Instant;
use tandem_core::inference::{
    FinishReason, InferEvent, LoraTag, PromptScores, PromptScoring, RankedLogprob, SamplingParams, StopReason,
    TokenLogprob, TopLogprob,
};
use tandem_model::kernels::KEY_TILE;
use tandem_model::{KvCache, LlamaConfig, Logits, LoraAdapter, SeqInput};
use tokio::sync::mpsc::UnboundedSender;

/// A sequence: its request (numbered by the loop in arrival order) and which of its choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct SeqId {
    pub request: u64,
    pub choice: usize,
}

/// What every choice of one request shares.
pub(crate) struct RequestParts {
    pub arrival: u64,
    pub priority: i64,
    /// Who asked, as the scheduler tells tenants apart.
    pub tenant: u64,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub adapter: Option<Arc<LoraAdapter>>,
    /// The adapter's name and owner, for `vllm:lora_requests_info`.
    pub lora: Option<Arc<LoraTag>>,
    pub tx: UnboundedSender<InferEvent>,
    received: Instant,
    /// When the loop admitted it (its choices forked later share this).
    admitted: Instant,
}

pub(crate) struct Seq {
    pub id: SeqId,
    pub req: Arc<RequestParts>,
    /// Choices still to fork from this one once its prompt is in the cache.
    pub n: usize,
    pub generated: Vec<u32>,
    pub cache: KvCache,
    pub prefill_left: usize,
    pub prefix_hashes: Vec<u64>,
    /// Requested prompt logprobs and those computed so far (position 0 has none).
    pub prompt_logprobs: Option<usize>,
    prompt_lp: Vec<Option<Vec<RankedLogprob>>>,
    /// Further prompt scores asked for with the prompt logprobs, and those computed so far.
    scoring: Option<Box<PromptScoring>>,
    scores: PromptScores,
    alt_rng: Option<ChaCha8Rng>,
    rng: ChaCha8Rng,
    decoder: IncrementalDecoder,
    stops: StopStrings,
    last_token_at: Option<Instant>,
    first_token_at: Option<Instant>,
    /// Structured output: masks each step's logits and follows the sampled tokens.
    matcher: Option<Matcher>,
    /// After a preemption: prompt and generated tokens, to prefill again.
    resume: Option<Vec<u32>>,
    /// The engine step it last had work in (the scheduler rotates a tenant's decodes by it).
    pub last_step: u64,
}

/// A tenant's number for the scheduler (equal names, equal numbers, within this process).
pub(crate) fn tenant_id(tenant: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(tenant)
}

fn rng_for(seed: Option<u64>, choice: usize) -> ChaCha8Rng {
    match seed {
        Some(s) => ChaCha8Rng::seed_from_u64(s.wrapping_add(choice as u64)),
        None => ChaCha8Rng::from_rng(&mut rand::rng()),
    }
}

impl Seq {
    /// A choice with nothing generated yet, whose prompt is already in `cache`.
    fn start(id: SeqId, req: Arc<RequestParts>, cache: KvCache, matcher: Option<Matcher>) -> Self {
        Seq {
            id,
            rng: rng_for(req.params.seed, id.choice),
            stops: StopStrings::new(&req.params.stop, req.params.include_stop_str_in_output),
            req,
            n: 1,
            generated: Vec::new(),
            cache,
            prefill_left: 0,
            prefix_hashes: Vec::new(),
            prompt_logprobs: None,
            prompt_lp: Vec::new(),
            scoring: None,
            scores: PromptScores::default(),
            alt_rng: None,
            decoder: IncrementalDecoder::default(),
            last_token_at: None,
            first_token_at: None,
            matcher,
            resume: None,
            last_step: 0,
        }
    }

    /// Choice 0 of an admitted request, `cached` of its prompt positions already in `cache`.
    pub fn new(request: u64, arrival: u64, job: Job, cache: KvCache, cached: usize, prefix_hashes: Vec<u64>) -> Self {
        let Job { req, adapter, tx, received, matcher, lora, .. } = job;
        let parts = RequestParts {
            arrival,
            priority: req.priority,
            tenant: tenant_id(&req.tenant),
            prompt: req.prompt,
            params: req.params,
            adapter,
            lora,
            tx,
            received,
            admitted: Instant::now(),
        };
        Seq {
            n: req.n,
            prefill_left: parts.prompt.len() - cached,
            prefix_hashes,
            prompt_logprobs: req.prompt_logprobs,
            prompt_lp: vec![None],
            scoring: req.prompt_scoring,
            ..Seq::start(SeqId { request, choice: 0 }, Arc::new(parts), cache, matcher)
        }
    }

    fn timeline(&self) -> Timeline {
        Timeline { received: self.req.received, admitted: self.req.admitted, first_token: self.first_token_at }
    }

    /// Whether the scheduler may preempt it: not while it still has choices to fork or records
    /// prompt logprobs (both happen once, at the end of its first prefill).
    pub fn preemptible(&self) -> bool {
        self.n == 1 && self.prompt_logprobs.is_none()
    }

    /// Drops the KV cache; the prompt and everything generated are prefilled again on
    /// readmission, and generation continues where it stopped (vLLM's recompute preemption).
    pub fn preempt(&mut self) {
        let mut tokens = self.req.prompt.clone();
        tokens.extend_from_slice(&self.generated);
        self.prefill_left = tokens.len();
        self.resume = Some(tokens);
        self.cache = self.cache.emptied();
    }

    /// KV positions it holds, or will once its prompt is in: its own, its part of a prompt
    /// shared with other choices, and, until they are forked, what its other choices will add.
    pub fn kv_positions(&self) -> usize {
        if self.prefill_left > 0 {
            start_reserve(self.prefill_source_len(), self.n)
        } else {
            self.cache.positions_held()
        }
    }

    /// Tokens still to prefill before it samples again.
    pub fn prefill_source_len(&self) -> usize {
        self.resume.as_ref().map_or(self.req.prompt.len(), Vec::len)
    }

    /// Choices 1..n, made when the prefill ends. Each shares this prompt's KV cache (frozen by the
    /// caller, so the clone shares its whole tiles and copies at most one tile).
    pub fn fork_choices(&mut self) -> Vec<Seq> {
        let n = std::mem::replace(&mut self.n, 1);
        (1..n)
            .map(|choice| {
                let id = SeqId { choice, ..self.id };
                Seq::start(id, self.req.clone(), self.cache.clone(), self.matcher.as_ref().map(Matcher::deep_clone))
            })
            .collect()
    }

    /// This step's model input: a chunk of the prompt, or the last generated token.
    pub fn input(&mut self, n: usize) -> SeqInput<'_> {
        let Seq { req, generated, cache, prefill_left, prompt_logprobs, resume, .. } = self;
        let adapter = req.adapter.as_deref();
        if *prefill_left > 0 {
            let source: &[u32] = resume.as_deref().unwrap_or(&req.prompt);
            let start = cache.len();
            let end = start + n;
            let logits = if prompt_logprobs.is_some() {
                Logits::All
            } else if end == source.len() {
                Logits::Last
            } else {
                Logits::None
            };
            SeqInput { tokens: &source[start..end], cache, adapter, logits }
        } else {
            let last = generated.len() - 1;
            SeqInput { tokens: &generated[last..], cache, adapter, logits: Logits::Last }
        }
    }

    /// Records prompt logprobs from a prefill chunk's rows (row j follows position `start + j`),
    /// and sends them all once the prompt is complete.
    pub fn record_prompt_logprobs<'r>(
        &mut self,
        start: usize,
        rows: impl Iterator<Item = &'r [f32]>,
        tok: &TextTokenizer,
    ) {
        let Some(k) = self.prompt_logprobs else { return };
        for (j, row) in rows.enumerate() {
            let Some(&actual) = self.req.prompt.get(start + j + 1) else { break };
            let lse = sampler::log_normalizer(row);
            let ranked = |id: u32| {
                let l = row[id as usize];
                RankedLogprob {
                    token_id: id,
                    logprob: (l - lse).max(-9999.0),
                    rank: 1 + row.iter().filter(|x| **x > l).count(),
                    decoded: tok.token_text(id),
                }
            };
            let mut entries = vec![ranked(actual)];
            entries.extend(sampler::top_k_ids(row, k).into_iter().filter(|id| *id != actual).map(ranked));
            self.prompt_lp.push(Some(entries));
            if let Some(scoring) = &self.scoring {
                let raw = |id: u32| row.get(id as usize).map_or(-9999.0, |l| (l - lse).max(-9999.0));
                let targets = scoring.targets.get(start + j).map_or(&[][..], Vec::as_slice);
                self.scores.targets.push(targets.iter().map(|id| raw(*id)).collect());
                if scoring.alt_k > 0 {
                    // Their own stream, so that asking for them leaves the sampled tokens as
                    // a seeded request would have them.
                    let rng = self.alt_rng.get_or_insert_with(|| rng_for(self.req.params.seed.map(|s| !s), 0));
                    let drawn = sampler::draws(row, scoring.alt_k, scoring.temperature, rng);
                    self.scores.alt.push(drawn.into_iter().map(|id| (id, raw(id))).collect());
                }
            }
        }
        if self.prompt_lp.len() >= self.req.prompt.len() {
            if self.scoring.take().is_some() {
                let _ = self.req.tx.send(InferEvent::PromptScores(std::mem::take(&mut self.scores)));
            }
            let _ = self.req.tx.send(InferEvent::PromptLogprobs(std::mem::take(&mut self.prompt_lp)));
        }
    }

    /// Ends this choice when the grammar engine gives up (a constraint past its per-token
    /// limits): `finish_reason` "abort" with what was generated so far, as vLLM ends a request it
    /// cannot continue; other requests are untouched.
    fn grammar_failed(&mut self, e: String, metrics: &EngineMetrics) -> bool {
        tracing::warn!(error = %e, "structured output stopped a choice");
        let mut tail = self.decoder.flush();
        tail = self.stops.push(&tail, false).emit + &self.stops.flush();
        metrics.finished(FinishReason::Abort, self.timeline(), self.req.prompt.len(), self.generated.len());
        let _ = self.req.tx.send(InferEvent::Finished {
            choice: self.id.choice,
            reason: FinishReason::Abort,
            stop_reason: None,
            text: tail,
        });
        true
    }

    /// Samples the next token from raw logits, sends its event, and reports whether it ended.
    pub fn sample_and_emit(
        &mut self,
        raw: &[f32],
        tok: &TextTokenizer,
        config: &LlamaConfig,
        metrics: &EngineMetrics,
    ) -> bool {
        let req = self.req.clone();
        let p = &req.params;
        let mut logits = raw.to_vec();
        sampler::process(&mut logits, p, &History { prompt: &req.prompt, generated: &self.generated }, tok.end_ids());
        let ends = Ends { eos: tok.eos_id, others: tok.end_ids(), stops: &p.stop_token_ids };
        if let Some(Err(e)) = self.matcher.as_mut().map(|m| constrain(m, &mut logits, &ends)) {
            return self.grammar_failed(e, metrics);
        }
        let token = sampler::sample(&logits, p, &mut self.rng);
        // EOS ends the grammar (the mask allowed it only where the output is complete).
        if !tok.is_end(token) && !p.stop_token_ids.contains(&token) {
            if let Some(Err(e)) = self.matcher.as_mut().map(|m| m.consume_token(token).map_err(|e| e.to_string())) {
                return self.grammar_failed(e, metrics);
            }
        }
        let logprob = p.logprobs.map(|k| logprob_entry(raw, token, k, tok));
        self.generated.push(token);
        let now = Instant::now();
        match self.last_token_at {
            None => {
                metrics.first_token(now - req.received);
                self.first_token_at = Some(now);
            }
            Some(t) => metrics.inter_token(now - t),
        }
        self.last_token_at = Some(now);
        metrics.generation_tokens(1);

        let may_stop = self.generated.len() > p.min_tokens;
        let is_eos = token == tok.eos_id && !p.ignore_eos;
        // The other end ids (Gemma's `<end_of_turn>`) stop as vLLM's generation-config EOS ids
        // do: as stop tokens, reported in `stop_reason`.
        let is_stop_token = p.stop_token_ids.contains(&token) || (tok.is_end(token) && !p.ignore_eos);
        let mut finish: Option<(FinishReason, Option<StopReason>)> = None;
        let mut text = String::new();
        if may_stop && (is_eos || is_stop_token) {
            // The stop token is counted and returned as an id, but its text is not content
            // (unless asked for, for stop_token_ids).
            if is_stop_token && !is_eos && p.include_stop_str_in_output {
                text.push_str(&self.stops.push(&self.decoder.push(tok, token, false), false).emit);
            }
            let reason = if is_eos { None } else { Some(StopReason::Token(token)) };
            finish = Some((FinishReason::Stop, reason));
        } else {
            let piece = self.decoder.push(tok, token, p.skip_special_tokens);
            let pushed = self.stops.push(&piece, may_stop);
            text = pushed.emit;
            if let Some(s) = pushed.matched {
                finish = Some((FinishReason::Stop, Some(StopReason::Text(s))));
            }
        }
        if finish.is_none()
            && (self.generated.len() >= p.max_tokens || req.prompt.len() + self.generated.len() >= config.context_len)
        {
            finish = Some((FinishReason::Length, None));
        }
        let _ = req.tx.send(InferEvent::Token { choice: self.id.choice, token_id: token, text, logprob });
        let Some((reason, stop_reason)) = finish else { return false };
        let mut tail = String::new();
        if !matches!(stop_reason, Some(StopReason::Text(_))) {
            let rest = self.decoder.flush();
            tail.push_str(&self.stops.push(&rest, false).emit);
            tail.push_str(&self.stops.flush());
        }
        metrics.finished(reason, self.timeline(), req.prompt.len(), self.generated.len());
        let _ = req.tx.send(InferEvent::Finished { choice: self.id.choice, reason, stop_reason, text: tail });
        true
    }
}

/// vLLM's entry: the chosen token's raw logprob, and the chosen token first among the top `k`.
fn logprob_entry(raw: &[f32], chosen: u32, k: usize, tok: &TextTokenizer) -> TokenLogprob {
    let lse = sampler::log_normalizer(raw);
    let entry = |id: u32| TopLogprob {
        token_id: id,
        token: tok.token_text(id),
        bytes: tok.token_bytes(id).to_vec(),
        logprob: (raw[id as usize] - lse).max(-9999.0),
    };
    let mut top = vec![entry(chosen)];
    for id in sampler::top_k_ids(raw, k) {
        if id != chosen {
            top.push(entry(id));
        }
    }
    top.truncate(k);
    TokenLogprob { token: entry(chosen), top }
}

/// The tokens that end a sequence: llguidance knows one EOS; the model's other end tokens
/// (Qwen's `<|im_end|>` beside `<|endoftext|>`, Llama 3's `<|eot_id|>`) and the request's stop
/// ids end it as well.
pub(crate) struct Ends<'a> {
    pub eos: u32,
    pub others: &'a [u32],
    pub stops: &'a [u32],
}

/// Masks every token the grammar does not allow next; where the output may end, every token
/// that ends it is allowed (not only llguidance's EOS: a model that ends its turn with another
/// token would otherwise be pushed on, and under `required` with parallel calls it wrote call
/// after call until `max_tokens`). If the sampler's own masks (e.g. `min_tokens` banning EOS)
/// leave nothing the grammar allows, EOS is let through so the output still conforms.
pub(crate) fn constrain(m: &mut Matcher, logits: &mut [f32], ends: &Ends) -> Result<(), String> {
    let mask = m.compute_mask_or_eos().map_err(|e| e.to_string())?;
    // The end tokens' logits, kept aside where the output may end (under `auto` that is every
    // token of free text): looking each vocabulary id up in up to 1,024 stop ids instead would
    // cost a request's whole step.
    let kept: Vec<(usize, f32)> = if mask.is_allowed(ends.eos) {
        ends.others
            .iter()
            .chain(ends.stops)
            .filter_map(|&id| logits.get(id as usize).map(|&l| (id as usize, l)))
            .collect()
    } else {
        Vec::new()
    };
    let mut any = false;
    for (id, l) in logits.iter_mut().enumerate() {
        if !mask.is_allowed(id as u32) {
            *l = f32::NEG_INFINITY;
        } else if *l > f32::NEG_INFINITY {
            any = true;
        }
    }
    for (id, l) in kept {
        logits[id] = l;
        any |= l > f32::NEG_INFINITY;
    }
    if !any {
        if let Some(l) = logits.get_mut(ends.eos as usize) {
            *l = 0.0;
        }
    }
    Ok(())
}
