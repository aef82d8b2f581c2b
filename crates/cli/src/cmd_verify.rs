//! `fp4forge verify SRC DST`: prove that DST was built from SRC.

use std::path::PathBuf;

use anyhow::bail;
use fp4forge_builder::verify::verify;

/// Arguments of `fp4forge verify`.
#[derive(clap::Args)]
pub struct VerifyArgs {
    /// The checkpoint DST was built from.
    src: PathBuf,
    /// The built checkpoint.
    dst: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the subcommand; exits non-zero when any check fails.
pub fn run(args: VerifyArgs) -> anyhow::Result<()> {
    let report = verify(&args.src, &args.dst)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        outln!("{report}")?;
    }
    if !report.passed() {
        bail!(
            "{} is not what {} builds to",
            args.dst.display(),
            args.src.display()
        );
    }
    Ok(())
}
