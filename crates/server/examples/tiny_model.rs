//! Writes a tiny servable checkpoint (synthetic tiny Laguna + a 512-id byte-level BPE tokenizer
//! and a ChatML template): `cargo run -p fp4forge-server --example tiny_model -- DIR [SEED]`.
//! The real-client scripts under `tools/clients/` serve it when no real model is at hand.

#[path = "../tests/common/tiny_model.rs"]
mod tiny_model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: tiny_model DIR [SEED]");
        std::process::exit(2);
    };
    let seed = args.next().map(|s| s.parse()).transpose()?.unwrap_or(7);
    tiny_model::write_tiny_model(std::path::Path::new(&dir), seed)?;
    println!("{dir}");
    Ok(())
}
