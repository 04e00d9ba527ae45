//! `ooze train RECIPE.toml [--set section.key=value ...]` runs an RL recipe; `ooze train --resume
//! RUN_DIR [--set ...]` continues a run from its last checkpoint (with the recipe saved in the run
//! directory). See `docs/recipes/README.md` for every recipe key.

use super::ranks::{join, launch_ranks, RankArgs};
use anyhow::{bail, Context};
use ooze_rollout::scorer::Registry;
use ooze_run::{run_dir_for, Recipe};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The recipe (TOML).
    recipe: Option<PathBuf>,
    /// Override a recipe key: `--set rollout.temperature=0.7` (the value is TOML, or a bare word).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Continue the run in this directory from its last checkpoint.
    #[arg(long, value_name = "RUN_DIR")]
    resume: Option<PathBuf>,
    #[command(flatten)]
    ranks: RankArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (recipe, run_dir, resume) = match (&args.recipe, &args.resume) {
        (Some(path), None) => {
            let recipe = Recipe::load(path, &args.sets)?;
            let dir = run_dir_for(&recipe, path);
            (recipe, dir, false)
        }
        (None, Some(dir)) => {
            let path = dir.join("recipe.toml");
            if !path.exists() {
                bail!("--resume {}: no recipe.toml there (not an ooze run directory)", dir.display());
            }
            let mut recipe = Recipe::load(&path, &args.sets)?;
            recipe.logging.run_dir = Some(dir.clone());
            (recipe, dir.clone(), true)
        }
        (Some(_), Some(_)) => bail!("give a recipe or --resume RUN_DIR, not both (a resumed run uses the recipe saved in its directory; change keys with --set)"),
        (None, None) => bail!("give a recipe (`ooze train RECIPE.toml`) or `--resume RUN_DIR`"),
    };
    if let Some(n) = ranks_to_start(&args.ranks, recipe.trainer.gpus)? {
        return launch_ranks(n, "--nproc-per-node");
    }
    let device: ooze_torch::DeviceSpec = recipe
        .model
        .device
        .parse()
        .map_err(|e| anyhow::anyhow!("model.device: {e}"))?;
    // A device this machine lacks is the recipe's key at fault, not the ranks'.
    device
        .resolve()
        .map_err(|e| anyhow::anyhow!("model.device: {e}"))?;
    let ranks = join(device, &args.ranks)?;
    let first = ranks.group.as_ref().is_none_or(|g| g.rank() == 0);
    if first {
        eprintln!("run directory: {}", run_dir.display());
    }
    let ranks = ranks.group.map(|group| ooze_run::ranks::RunRanks {
        group,
        device: ranks.device,
    });
    ooze_run::run(recipe, &run_dir, resume, &Registry::default(), ranks)
        .with_context(|| format!("run in {}", run_dir.display()))?;
    Ok(())
}

/// The ranks this command starts itself: `--nproc-per-node`, or `trainer.gpus` when the run is
/// not launched already (torchrun, Slurm); None to run here.
fn ranks_to_start(args: &RankArgs, trainer_gpus: usize) -> anyhow::Result<Option<usize>> {
    let flag = args.nproc_per_node.map(usize::from);
    match flag {
        Some(n) if trainer_gpus > 0 && n != trainer_gpus => bail!(
            "--nproc-per-node {n} and trainer.gpus = {trainer_gpus} disagree: give one (the \
             recipe's key is enough)"
        ),
        Some(n) => Ok(Some(n)),
        None if trainer_gpus > 1 && std::env::var_os("WORLD_SIZE").is_none() => {
            Ok(Some(trainer_gpus))
        }
        None => Ok(None),
    }
}
