//! `ooze report RUN_DIR`: (re)writes a run's HTML report with PNG plots from its metrics, at any
//! time, also while it trains.

use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run directory.
    run_dir: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let path = ooze_run::report::write_report(&args.run_dir)?;
    println!("{}", path.display());
    Ok(())
}
