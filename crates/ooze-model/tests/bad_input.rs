//! Bad model directories produce errors that name the file or tensor at fault — never a panic.

use ooze_model::checkpoint::{save_weights, SaveOptions};
use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::{Decoder, Family, Tokenizer};
use ooze_torch::tch::{Device, Kind, Tensor};
use std::path::Path;

fn tiny_model(dir: &Path) {
    let mut options = InitOptions::new(Family::Qwen2, Size::Tiny);
    options.tokenizer_vocab = 300;
    init_model(dir, &ooze_model::corpus::generate(0, 20_000), &options).unwrap();
}

fn load_err(dir: &Path) -> String {
    match Decoder::load(dir, Device::Cpu, Kind::Float) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

#[test]
fn missing_and_corrupt_config() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("config.json: cannot read"), "{err}");
    std::fs::write(
        dir.path().join("config.json"),
        "{\"model_type\": \"qwen2\",",
    )
    .unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains("config.json: not valid JSON for a model config"),
        "{err}"
    );
}

#[test]
fn unknown_model_type_and_bad_keys() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    edit_config(dir.path(), |v| v["model_type"] = "mamba".into());
    let err = load_err(dir.path());
    assert!(
        err.contains("unknown model_type `mamba`; ooze supports qwen2, qwen3 and llama"),
        "{err}"
    );
    edit_config(dir.path(), |v| {
        v["model_type"] = "qwen2".into();
        v["hidden_act"] = "gelu".into();
    });
    let err = load_err(dir.path());
    assert!(
        err.contains("key `hidden_act`: `gelu` is not supported; expected silu"),
        "{err}"
    );
}

#[test]
fn wrong_tensor_shape_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    edit_config(dir.path(), |v| v["intermediate_size"] = 200.into());
    let err = load_err(dir.path());
    assert!(
        err.contains(
            "tensor `model.layers.0.mlp.gate_proj.weight` has shape [176, 64]; expected [200, 64]"
        ),
        "{err}"
    );
}

#[test]
fn missing_unexpected_and_corrupt_weights() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let model = Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
    let mut params = model.named_parameters();
    params.retain(|(n, _)| n != "model.norm.weight");
    save_weights(dir.path(), &params, SaveOptions::default()).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains("tensor `model.norm.weight` is missing from the checkpoint"),
        "{err}"
    );

    let mut params = model.named_parameters();
    params.push((
        "model.layers.0.mlp.extra.weight".into(),
        Tensor::zeros([2], (Kind::Float, Device::Cpu)),
    ));
    save_weights(dir.path(), &params, SaveOptions::default()).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("unexpected tensors that this model does not use: [\"model.layers.0.mlp.extra.weight\"]"), "{err}");

    let file = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains("model.safetensors: not a valid safetensors file"),
        "{err}"
    );
    std::fs::write(&file, b"").unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains("model.safetensors: not a valid safetensors file"),
        "{err}"
    );
}

#[test]
fn unsupported_dtype_names_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let bytes = safetensors::serialize(
        [(
            "model.embed_tokens.weight",
            safetensors::tensor::TensorView::new(safetensors::Dtype::I32, vec![2], &[0u8; 8])
                .unwrap(),
        )],
        None,
    )
    .unwrap();
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains("model.safetensors: tensor `model.embed_tokens.weight` has dtype I32"),
        "{err}"
    );
}

#[test]
fn bad_tokenizer_files() {
    let dir = tempfile::tempdir().unwrap();
    let err = Tokenizer::load(dir.path()).err().unwrap().to_string();
    assert!(err.contains("tokenizer.json: missing"), "{err}");
    tiny_model(dir.path());
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        "{\"chat_template\": 5}",
    )
    .unwrap();
    let err = Tokenizer::load(dir.path()).err().unwrap().to_string();
    assert!(
        err.contains("tokenizer_config.json: not valid JSON for a tokenizer config"),
        "{err}"
    );
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        "{\"chat_template\": \"{% for m in messages %}\"}",
    )
    .unwrap();
    let err = Tokenizer::load(dir.path()).err().unwrap().to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("chat template"),
        "{err}"
    );
    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": 1}").unwrap();
    let err = Tokenizer::load(dir.path()).err().unwrap().to_string();
    assert!(err.contains("tokenizer.json:"), "{err}");
}

#[test]
fn template_exceptions_surface_with_their_message() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let tok = Tokenizer::load(dir.path()).unwrap();
    let messages = [
        serde_json::json!({"role": "user", "content": "a"}),
        serde_json::json!({"role": "system", "content": "late"}),
    ];
    let err = tok
        .chat_template(false)
        .unwrap()
        .render(&messages, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "tokenizer_config.json) raised an exception: A system message is only allowed first."
        ),
        "{err}"
    );
    let messages = [serde_json::json!({"role": "robot", "content": "a"})];
    let err = tok
        .chat_template(false)
        .unwrap()
        .render(&messages, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with("tokenizer_config.json) raised an exception: Unknown message role: robot"),
        "{err}"
    );
}

#[test]
fn scoring_rejects_out_of_vocabulary_ids() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let model = Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
    let err = ooze_model::score_sequences(
        &model,
        &[vec![1, 2, 99_999]],
        Default::default(),
        &Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "sequence 0 has token id 99999, outside the vocabulary of 300"
    );
    let err =
        ooze_model::score_sequences(&model, &[vec![]], Default::default(), &Default::default())
            .unwrap_err()
            .to_string();
    assert_eq!(err, "sequence 0 is empty");
}
