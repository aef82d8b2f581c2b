//! Constrained decoding's hook into sampling: a [`Constraint`] (a grammar, a JSON schema, ...)
//! says before each pick which tokens may come next and is told the token picked. The
//! grammar engine lives with its user (the server); the sampler only applies the mask.

use crate::sampling::Sampler;

/// What may come next in one sequence under a constraint.
pub trait Constraint: Send {
    /// Sets the logits of the tokens that may not come next to `-inf` (the sequence's stop
    /// tokens too, unless the text so far is complete). `Err`: the constraint cannot go on.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;

    /// Tells the constraint that `token` was picked (a stop token included).
    fn commit(&mut self, token: u32) -> Result<(), String>;
}

impl Sampler {
    /// The next token for `logits` under `constraint`: masked, picked, committed. The logits
    /// stay masked. `Ok(None)`: no token is allowed (the constrained text is complete and no
    /// stop token may end it).
    pub fn sample_constrained(
        &mut self,
        logits: &mut [f32],
        constraint: &mut dyn Constraint,
    ) -> Result<Option<u32>, String> {
        constraint.mask(logits)?;
        if !logits.iter().any(|l| *l > f32::NEG_INFINITY) {
            return Ok(None);
        }
        let token = self.sample(logits);
        constraint.commit(token)?;
        Ok(Some(token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    /// Allows only even tokens, and records what it is told.
    struct Even(Vec<u32>);

    impl Constraint for Even {
        fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
            for (i, l) in logits.iter_mut().enumerate() {
                if i % 2 == 1 || self.0.len() >= 3 {
                    *l = f32::NEG_INFINITY;
                }
            }
            Ok(())
        }

        fn commit(&mut self, token: u32) -> Result<(), String> {
            self.0.push(token);
            Ok(())
        }
    }

    #[test]
    fn the_mask_decides_and_the_pick_is_committed() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 3,
        });
        let mut c = Even(Vec::new());
        for _ in 0..3 {
            // the odd token is far likelier, but masked
            let mut logits = [0.0f32, 9.0, 0.0, 9.0];
            let t = s.sample_constrained(&mut logits, &mut c).expect("ok");
            assert!(t.is_some_and(|t| t % 2 == 0), "{t:?}");
        }
        assert_eq!(c.0.len(), 3);
        let mut logits = [0.0f32; 4];
        assert_eq!(s.sample_constrained(&mut logits, &mut c), Ok(None));
    }
}
