//! One engine step: the planned forward pass run as ONE batch, then each sequence's logits
//! turned into its next token (or its prompt logprobs), sent to its handler, and sequences
//! ended at a stop token, `max_tokens` or the context.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::time::Instant;

use fp4forge_engine::{token_logprob, Backend, LogprobSpec, Output, TokenLogprob, Want};

use super::job::{Event, Finish};
use super::policy::{Scheduler, Seq};

impl<B: Backend> Scheduler<'_, B> {
    /// Runs one step: the planned pass, then every sequence in it advanced.
    pub(super) fn step(&mut self) {
        let plan = self.plan_within_memory();
        if plan.is_empty() {
            return;
        }
        // Sequences (decoding, or at their prompt's end) whose next token needs no logits on
        // the host have it picked in the pass (on the device where the backend samples: only
        // the token id comes back).
        let picks: Vec<bool> = plan
            .iter()
            .map(|&(i, _, w)| w == Want::Last && self.picks_without_logits(i))
            .collect();
        let rows: usize = plan.iter().map(|p| p.1).sum();
        let result = {
            let mut sessions = Vec::with_capacity(plan.len());
            let mut tokens: Vec<&[u32]> = Vec::with_capacity(plan.len());
            let mut wanted = Vec::with_capacity(plan.len());
            let mut samplers = Vec::with_capacity(plan.len());
            let mut scores = Vec::with_capacity(plan.len());
            let mut next = plan.iter().zip(&picks).peekable();
            for (i, s) in self.active.iter_mut().enumerate() {
                let Some(&(&(pi, n, w), &pick)) = next.peek() else {
                    break;
                };
                if pi != i {
                    continue;
                }
                next.next();
                let Seq {
                    session,
                    sampler,
                    job,
                    next: token,
                    prefilled,
                    decoding,
                    recompute,
                    ..
                } = s;
                let req = &job.req;
                tokens.push(if *decoding {
                    std::slice::from_ref(token)
                } else {
                    let all = recompute.as_deref().unwrap_or(&req.prompt);
                    &all[*prefilled..*prefilled + n]
                });
                // logprobs scored where the logits are: a picked token's, or the prompt's
                // next tokens' (row r predicts position prefilled + r + 1)
                scores.push(if pick {
                    req.logprobs.map(|top| LogprobSpec { targets: &[], top })
                } else if w == Want::All && recompute.is_none() {
                    req.prompt_logprobs.map(|top| LogprobSpec {
                        targets: &req.prompt[(*prefilled + 1).min(req.prompt.len())..],
                        top,
                    })
                } else {
                    None
                });
                sessions.push(session);
                wanted.push(w);
                samplers.push(pick.then_some(sampler));
            }
            let model = self.model;
            let started = Instant::now();
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                model.forward_batch_scored(&mut sessions, &tokens, &wanted, &mut samplers, &scores)
            }));
            self.metrics.forward.observe(started.elapsed());
            result
        };
        self.metrics.steps.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .step_rows
            .fetch_add(rows as u64, Ordering::Relaxed);
        let outputs = match result {
            Ok(Ok(outputs)) => outputs,
            Ok(Err(e)) => return self.fail(&plan, &e.to_string()),
            Err(_) => return self.fail(&plan, "the engine panicked on this batch"),
        };
        for (&(i, n, _), output) in plan.iter().zip(outputs) {
            let s = &mut self.active[i];
            // a token picked in the pass (with its logprobs, if asked), else logits / scores
            let (picked, logits, scored) = match output {
                Output::Token(next) => (Some((next, None)), None, None),
                Output::Scored {
                    token: Some(next),
                    mut logprobs,
                    ..
                } => (Some((next, logprobs.pop())), None, None),
                Output::Scored {
                    token: None,
                    logprobs,
                    logits,
                } => (None, logits, Some(logprobs)),
                Output::Logits(l) => (None, Some(l), None),
                Output::None => (None, None, None),
            };
            if s.decoding {
                s.fed.push(s.next);
                match (picked, logits) {
                    (Some((next, lp)), _) => self.deliver(i, next, lp),
                    (None, Some(mut l)) => self.emit(i, &mut l.data),
                    (None, None) => self.fail_one(i, "no logits for a decode step"),
                }
                continue;
            }
            if let Some(tokens) = &s.recompute {
                // a preempted sequence rebuilding its cache: then it decodes `next`
                s.prefilled += n;
                if s.prefilled == tokens.len() {
                    s.recompute = None;
                    s.decoding = true;
                }
                continue;
            }
            if let Some(lps) = scored {
                if s.prefilled == 0 {
                    s.prompt_logprobs.push(None);
                }
                s.prompt_logprobs.extend(lps.into_iter().map(Some));
            }
            s.prefilled += n;
            let prompt_len = s.job.req.prompt.len();
            if s.prefilled < prompt_len {
                continue;
            }
            self.metrics
                .prompt_tokens
                .fetch_add(prompt_len as u64, Ordering::Relaxed);
            let lps = std::mem::take(&mut s.prompt_logprobs);
            if self.prefix_cache.enabled() && s.job.req.prompt_logprobs.is_some() {
                s.cached_prompt_logprobs = Some(lps.clone());
            }
            let cached = self.prefix_cache.enabled().then_some(s.reused);
            if !s.job.send(Event::Prompt {
                logprobs: lps,
                cached,
            }) {
                s.done = true;
                continue;
            }
            if s.job.req.max_tokens == 0 {
                self.finish(i, Finish::Length, None);
                continue;
            }
            match (picked, logits) {
                (Some((next, lp)), _) => self.deliver(i, next, lp),
                (None, Some(l)) if l.rows > 0 => {
                    let mut last = l.row(l.rows - 1).to_vec();
                    self.emit(i, &mut last);
                }
                _ => self.fail_one(i, "no logits at the end of the prompt"),
            }
        }
    }

    /// Whether sequence `i`'s next token needs no logits on the host: it is decoding, or its
    /// prompt ends in this pass (`Want::Last` of a prefilling sequence: its last chunk, no
    /// prompt logprobs, not a rebuild) and it asks for a token at all; it asks for no logit
    /// adjustments, no structured-output constraint and may already sample its stop tokens
    /// (nothing to mask). Its logprobs, if asked for, are scored where the logits are, and its
    /// token is picked in the pass (on the device where the backend samples: the prompt's last
    /// logits never leave it).
    fn picks_without_logits(&self, i: usize) -> bool {
        let s = &self.active[i];
        let req = &s.job.req;
        (s.decoding || (s.recompute.is_none() && req.max_tokens > 0))
            && req.adjust.is_none()
            && s.constraint.is_none()
            && (s.generated >= req.min_tokens || req.stop_ids.is_empty())
    }

    fn fail(&mut self, plan: &[(usize, usize, Want)], message: &str) {
        for &(i, _, _) in plan {
            self.fail_one(i, message);
        }
    }

    pub(super) fn fail_one(&mut self, i: usize, message: &str) {
        self.active[i].done = true;
        self.publish_running();
        self.active[i].last_event = Some(Event::Failed(message.to_string()));
    }

    /// Publishes the sequences still running, before an ended one's last event goes out (a
    /// client that reads `/metrics` after its answer sees its sequence gone).
    pub(super) fn publish_running(&self) {
        let running = self.active.iter().filter(|s| !s.done && !s.parked);
        let kv_tokens = running.clone().map(|s| s.session.position()).sum();
        self.metrics.kv_tokens.store(kv_tokens, Ordering::Relaxed);
        self.metrics
            .running
            .store(running.count(), Ordering::Relaxed);
    }

    fn finish(
        &mut self,
        i: usize,
        reason: Finish,
        stop_token: Option<(u32, Option<TokenLogprob>)>,
    ) {
        let s = &mut self.active[i];
        s.done = true;
        s.reusable = true;
        self.metrics.e2e.observe(s.job.arrived.elapsed());
        self.metrics.success(reason.name());
        self.publish_running();
        self.active[i].last_event = Some(Event::Done { reason, stop_token });
    }

    /// Samples sequence `i`'s next token from `logits` and sends it.
    fn emit(&mut self, i: usize, logits: &mut [f32]) {
        let s = &mut self.active[i];
        let req = &s.job.req;
        // Stop tokens may not be sampled before `min_tokens`.
        let masked: Vec<(usize, f32)> = if s.generated < req.min_tokens {
            req.stop_ids
                .iter()
                .filter_map(|&t| {
                    let t = t as usize;
                    logits.get_mut(t).map(|l| {
                        let old = *l;
                        *l = f32::NEG_INFINITY;
                        (t, old)
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        // Logit adjustments (penalties, bias, ...) apply to a copy: logprobs stay the raw
        // logits', as vLLM reports them by default.
        let mut adjusted = req.adjust.as_ref().map(|adjust| {
            let mut a = logits.to_vec();
            adjust.apply(&mut a, &req.prompt, &s.fed, s.sampler.params().temperature);
            a
        });
        // A constraint masks what its grammar does not allow (without adjustments the logits
        // stay masked, and logprobs are those of the masked distribution, the one sampled from).
        let token = match &mut s.constraint {
            None => s.sampler.sample(adjusted.as_deref().unwrap_or(logits)),
            Some(c) => {
                let target: &mut [f32] = match adjusted.as_mut() {
                    Some(a) => a,
                    None => logits,
                };
                match s.sampler.sample_constrained(target, c.as_mut()) {
                    Ok(Some(token)) => token,
                    // The constrained text is complete and no stop token may end it.
                    Ok(None) => return self.finish(i, Finish::Stop, None),
                    Err(e) => return self.fail_one(i, &format!("structured output: {e}")),
                }
            }
        };
        if s.constraint.is_none() {
            for (t, old) in masked {
                logits[t] = old;
            }
        }
        let lp = req.logprobs.map(|top| token_logprob(logits, token, top));
        self.deliver(i, token, lp);
    }

    /// Sends sequence `i`'s new `token` (with its logprobs `lp`, if asked) and ends the sequence
    /// on a stop token, its `max_tokens` or the context.
    fn deliver(&mut self, i: usize, token: u32, lp: Option<TokenLogprob>) {
        let s = &mut self.active[i];
        let req = &s.job.req;
        s.generated += 1;
        let now = Instant::now();
        match s.last_token_at {
            None => self.metrics.ttft.observe(now - s.job.arrived),
            Some(t) => self.metrics.itl.observe(now - t),
        }
        s.last_token_at = Some(now);
        self.metrics
            .generation_tokens
            .fetch_add(1, Ordering::Relaxed);
        if req.stop_ids.contains(&token) {
            return self.finish(i, Finish::Stop, Some((token, lp)));
        }
        if !s.job.send(Event::Token(token, lp)) {
            s.done = true;
            // Its handler went away: after ending it on a stop string (a normal finish) or
            // because its client disconnected.
            if s.job.disconnected() {
                self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            } else {
                self.metrics.success(Finish::Stop.name());
            }
            return;
        }
        if s.generated >= s.job.req.max_tokens || s.session.position() >= self.max_context {
            return self.finish(i, Finish::Length, None);
        }
        s.next = token;
        s.decoding = true;
    }
}
