//! Checkpoints under damage, on a tiny CPU model: a corrupt newest checkpoint falls back to the one
//! before it; concurrent writers of one run file do not clash; failed writes say "writing" and
//! print their cause once.

use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::{Decoder, Family, Tokenizer};
use ooze_torch::tch::{Device, Kind};
use ooze_train::sft_data::load_chat_jsonl;
use ooze_train::{checkpoint, Sample, Trainer, TrainerConfig};
use std::path::Path;

fn tiny_model(dir: &Path) {
    let mut options = InitOptions::new(Family::Qwen2, Size::Tiny);
    options.tokenizer_vocab = 300;
    options.seed = 11;
    init_model(dir, &ooze_model::corpus::generate(1, 20_000), &options).unwrap();
}

fn samples(dir: &Path) -> Vec<Sample> {
    let lines: Vec<String> = (0..12)
        .map(|i| {
            serde_json::json!({"messages": [
                {"role": "user", "content": format!("{i}+{i}")},
                {"role": "assistant", "content": format!("{}", 2 * i)},
            ]})
            .to_string()
        })
        .collect();
    let path = dir.join("train.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    let tokenizer = Tokenizer::load(dir).unwrap();
    load_chat_jsonl(&path, &tokenizer, 512).unwrap().samples
}

fn trainer(dir: &Path) -> Trainer {
    let config = TrainerConfig {
        max_tokens_per_micro_batch: 200,
        ..Default::default()
    };
    Trainer::new(
        Decoder::load(dir, Device::Cpu, Kind::Float).unwrap(),
        None,
        config,
    )
    .unwrap()
}

/// The error and its causes as the binary prints them (`anyhow`'s `{:#}`).
#[cfg(target_os = "linux")] // used by the /dev/full test only
fn chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        parts.push(c.to_string());
        cause = c.source();
    }
    parts.join(": ")
}

/// Saves checkpoints after steps 1 and 2 of one run; returns the run dir and the held-out loss
/// after step 1 (what restoring the first must reproduce).
fn two_checkpoints(dir: &Path, data: &[Sample]) -> (std::path::PathBuf, f64) {
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let mut t = trainer(dir);
    t.sft_step(&data[..6]).unwrap();
    checkpoint::save(&run, dir, &t, serde_json::json!({"rollout": 1})).unwrap();
    let after_first = t.eval_loss(data).unwrap();
    t.sft_step(&data[6..]).unwrap();
    checkpoint::save(&run, dir, &t, serde_json::json!({"rollout": 2})).unwrap();
    assert_ne!(t.eval_loss(data).unwrap(), after_first);
    (run, after_first)
}

#[test]
fn a_corrupt_newest_checkpoint_falls_back_to_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let data = samples(dir.path());
    let (run, after_first) = two_checkpoints(dir.path(), &data);
    let newest = checkpoint::latest(&run).unwrap().unwrap();
    assert!(newest.ends_with("checkpoint-000002"));

    // Truncate the newest checkpoint's weights, as a crash or a full disk might.
    let weights = newest
        .join("model")
        .join(ooze_model::checkpoint::SINGLE_FILE);
    let len = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let mut resumed = trainer(dir.path());
    let restored = checkpoint::load_newest(&run, &mut resumed)
        .unwrap()
        .expect("a checkpoint loads");
    assert!(restored.dir.ends_with("checkpoint-000001"), "{restored:?}");
    assert_eq!(restored.extra["rollout"], 1);
    assert_eq!(resumed.step(), 1);
    assert_eq!(resumed.eval_loss(&data).unwrap(), after_first);
    // The warning names the damaged checkpoint and why it does not load.
    assert_eq!(restored.skipped.len(), 1);
    let (skipped, why) = &restored.skipped[0];
    assert_eq!(skipped, &newest);
    assert!(why.contains("model.safetensors"), "{why}");
}

#[test]
fn a_missing_or_unreadable_newest_checkpoint_falls_back_and_none_loading_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let data = samples(dir.path());
    let (run, after_first) = two_checkpoints(dir.path(), &data);
    // Bad JSON in the newest's trainer state.
    std::fs::write(run.join("checkpoint-000002/trainer_state.json"), "{").unwrap();
    let mut resumed = trainer(dir.path());
    let restored = checkpoint::load_newest(&run, &mut resumed)
        .unwrap()
        .unwrap();
    assert!(restored.dir.ends_with("checkpoint-000001"));
    assert!(restored.skipped[0].1.contains("not a trainer state"));
    assert_eq!(resumed.eval_loss(&data).unwrap(), after_first);

    // `latest` names a directory that is gone: the others are still tried.
    std::fs::remove_dir_all(run.join("checkpoint-000002")).unwrap();
    let mut resumed = trainer(dir.path());
    let restored = checkpoint::load_newest(&run, &mut resumed)
        .unwrap()
        .unwrap();
    assert!(restored.dir.ends_with("checkpoint-000001"));
    assert_eq!(resumed.step(), 1);

    // Nothing loads: an error naming each checkpoint tried.
    std::fs::remove_file(run.join("checkpoint-000001/optimizer/model.safetensors")).unwrap();
    let err = checkpoint::load_newest(&run, &mut trainer(dir.path())).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("no checkpoint in"), "{text}");
    assert!(text.contains("checkpoint-000002"), "{text}");
    assert!(text.contains("checkpoint-000001"), "{text}");

    // A run without checkpoints has nothing to restore.
    let empty = dir.path().join("empty-run");
    std::fs::create_dir_all(&empty).unwrap();
    assert!(checkpoint::load_newest(&empty, &mut trainer(dir.path()))
        .unwrap()
        .is_none());
}

#[test]
fn two_writers_of_one_run_file_both_succeed_and_one_wins_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latest");
    let contents = [vec![b'1'; 128 * 1024], vec![b'2'; 128 * 1024]];
    for _ in 0..20 {
        std::thread::scope(|s| {
            let writers: Vec<_> = contents
                .iter()
                .map(|c| {
                    let path = &path;
                    s.spawn(move || (0..5).try_for_each(|_| checkpoint::write_atomic(path, c)))
                })
                .collect();
            for w in writers {
                w.join().unwrap().unwrap();
            }
        });
        let now = std::fs::read(&path).unwrap();
        assert!(
            contents.contains(&now),
            "a torn file of {} bytes",
            now.len()
        );
    }
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "temporaries left behind: {names:?}");
}

#[test]
#[cfg(target_os = "linux")] // /dev/full
fn a_failed_checkpoint_write_says_what_it_was_doing_with_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let t = trainer(dir.path());
    // `/dev/full` is a device, not a directory: nothing can be created under it.
    let not_a_directory = std::io::Error::from_raw_os_error(20).to_string();
    let run = Path::new("/dev/full/run");
    let err = checkpoint::save(run, dir.path(), &t, serde_json::json!({})).unwrap_err();
    let text = chain(&err);
    assert!(
        text.starts_with("/dev/full/run/.checkpoint-000000.partial: cannot create directory: "),
        "{text}"
    );
    assert_eq!(text.matches(&not_a_directory).count(), 1, "{text}");

    let err = checkpoint::write_atomic(&run.join("latest"), b"checkpoint-000001").unwrap_err();
    let text = chain(&ooze_train::TrainError::from(err));
    assert!(text.starts_with("writing /dev/full/run/latest: "), "{text}");
    assert!(!text.contains("read"), "{text}");
    assert_eq!(text.matches(&not_a_directory).count(), 1, "{text}");
}

/// A checkpoint written in the background: training goes on while it is written, the previous
/// one stays `latest` until the next save (or `finish_pending`) completes it, and it holds the
/// same files as one written in the foreground at that step.
#[test]
fn a_background_checkpoint_is_latest_only_once_complete_and_equals_a_foreground_one() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let data = samples(dir.path());
    let (fore, back) = (dir.path().join("fore"), dir.path().join("back"));
    let mut t = trainer(dir.path());
    t.sft_step(&data[..6]).unwrap();
    checkpoint::save(&fore, dir.path(), &t, serde_json::json!({"rollout": 1})).unwrap();
    let first =
        checkpoint::save_in_background(&back, dir.path(), &t, serde_json::json!({"rollout": 1}))
            .unwrap();
    assert!(first.ends_with("checkpoint-000001"));
    // Not complete yet: nothing is latest, whatever the writer has done so far.
    assert_eq!(checkpoint::latest(&back).unwrap(), None);
    let after_first = t.eval_loss(&data).unwrap();
    t.sft_step(&data[6..]).unwrap();
    // The next save completes the first.
    checkpoint::save_in_background(&back, dir.path(), &t, serde_json::json!({"rollout": 2}))
        .unwrap();
    assert_eq!(checkpoint::latest(&back).unwrap(), Some(first.clone()));
    for file in [
        "model/model.safetensors",
        "model/config.json",
        "optimizer/model.safetensors",
        "trainer_state.json",
    ] {
        assert_eq!(
            std::fs::read(fore.join("checkpoint-000001").join(file)).unwrap(),
            std::fs::read(first.join(file)).unwrap(),
            "{file} differs from the foreground checkpoint's"
        );
    }
    let second = checkpoint::finish_pending(&t).unwrap().unwrap();
    assert_eq!(checkpoint::latest(&back).unwrap(), Some(second.clone()));
    assert!(
        checkpoint::finish_pending(&t).unwrap().is_none(),
        "nothing left"
    );
    // Restoring the first reproduces the state it was taken in, though training went on.
    let mut resumed = trainer(dir.path());
    checkpoint::load(&first, &mut resumed).unwrap();
    assert_eq!(resumed.eval_loss(&data).unwrap(), after_first);
    assert!(!back.join(".checkpoint-000002.partial").exists());
}
