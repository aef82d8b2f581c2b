//! Writes the scripted Laguna agent: a tiny Llama whose greedy output thinks, then calls
//! `get_weather(city="Paris")`, with the real Laguna-S-2.1 chat template
//! (`cargo run -p fp4forge-server --example script_model -- DIR`). The agentic real-client check
//! (`tools/clients/run_agentic_check.sh`) serves it.

#[path = "../tests/common/script_model.rs"]
mod script_model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: script_model DIR");
        std::process::exit(2);
    };
    script_model::write_laguna_agent(std::path::Path::new(&dir))?;
    println!("{dir}");
    Ok(())
}
