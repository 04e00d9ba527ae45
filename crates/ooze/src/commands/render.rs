//! `ooze render`: a conversation through the model's chat template — the text, its token ids and
//! the token span of every assistant message (what an SFT loss mask covers).

use super::{load_tokenizer, read_json_file};
use anyhow::{bail, Context};
use ooze_model::{RenderOptions, Tokenizer};
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model (or tokenizer) directory.
    #[arg(long)]
    model: PathBuf,
    /// JSON file with a list of chat messages.
    #[arg(long)]
    messages: PathBuf,
    /// JSON file with a list of tool schemas.
    #[arg(long)]
    tools: Option<PathBuf>,
    /// Extra template variables as a JSON object, e.g. '{"enable_thinking": false}'.
    #[arg(long)]
    kwargs: Option<String>,
    /// Append the assistant generation prompt.
    #[arg(long)]
    add_generation_prompt: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let tokenizer = load_tokenizer(&args.model)?;
    let messages = match read_json_file(&args.messages)? {
        serde_json::Value::Array(list) => list,
        _ => bail!(
            "{}: expected a JSON list of messages",
            args.messages.display()
        ),
    };
    for (i, m) in messages.iter().enumerate() {
        if !m.is_object() || !m.get("role").is_some_and(|r| r.is_string()) {
            bail!(
                "{}: message {i} must be an object with a string `role`",
                args.messages.display()
            );
        }
    }
    let tools = match &args.tools {
        Some(path) => match read_json_file(path)? {
            serde_json::Value::Array(list) => Some(list),
            _ => bail!("{}: expected a JSON list of tool schemas", path.display()),
        },
        None => None,
    };
    let kwargs = match &args.kwargs {
        Some(text) => match serde_json::from_str(text).context("--kwargs: not valid JSON")? {
            serde_json::Value::Object(map) => map,
            _ => bail!("--kwargs must be a JSON object"),
        },
        None => Default::default(),
    };
    let options = RenderOptions {
        add_generation_prompt: args.add_generation_prompt,
        tools,
        kwargs,
    };
    let template = tokenizer.chat_template(options.tools.is_some())?;
    let text = template.render(&messages, &options)?;
    let encoding = tokenizer.encode_with_offsets(&text, false)?;
    let spans: Vec<serde_json::Value> = template
        .assistant_spans(&messages, &options)?
        .into_iter()
        .map(|s| {
            let tokens = Tokenizer::token_range(&encoding.offsets, s.start, s.end);
            json!({"message": s.message, "start_token": tokens.start, "end_token": tokens.end, "start_byte": s.start, "end_byte": s.end})
        })
        .collect();
    println!(
        "{}",
        json!({"text": text, "token_ids": encoding.ids, "assistant_spans": spans})
    );
    Ok(())
}
